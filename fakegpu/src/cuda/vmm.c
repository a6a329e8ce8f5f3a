/* Virtual memory management: address reservations, physical allocations (cuMemCreate, charged
 * to the device until released and unmapped), mapping and unmapping. A reservation is an
 * inaccessible host mapping; cuMemMap puts zero-filled memory at the mapped range. Each mapping
 * of a handle gets its own bytes (a handle mapped twice does not share data). */
#include "driver.h"

#include <stdlib.h>
#include <sys/mman.h>

struct physical {
    int device;
    uint64_t size;
    int refs; /* 1 until cuMemRelease, +1 per mapping */
    CUmemAllocationProp prop;
};

static pthread_mutex_t vmm_lock = PTHREAD_MUTEX_INITIALIZER;

struct reservation {
    uint64_t base, size;
    struct reservation *next;
};
static struct reservation *reservations;

static void physical_unref(struct physical *p)
{
    pthread_mutex_lock(&vmm_lock);
    bool last = --p->refs == 0;
    pthread_mutex_unlock(&vmm_lock);
    if (last) {
        fg_uncharge(p->device, p->size);
        free(p);
    }
}

/* CUmemAllocationHandleType's fabric bit (CUDA 12.3+). */
#define CU_MEM_HANDLE_TYPE_FABRIC 0x8

static bool prop_ok(const CUmemAllocationProp *prop)
{
    return prop && prop->type == 1 && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
           fg_valid_device(prop->location.id);
}

FG_EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity,
                                                 const CUmemAllocationProp *prop, int option)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!granularity || !prop_ok(prop))
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = FG_GRANULARITY;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                       CUdeviceptr addr, unsigned long long flags)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ptr || size == 0 || size % FG_GRANULARITY ||
        (alignment && (alignment & (alignment - 1))))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t align = alignment > FG_GRANULARITY ? alignment : FG_GRANULARITY;
    struct reservation *r = malloc(sizeof *r);
    if (!r)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* Over-reserve, then trim to an aligned range. */
    char *raw = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
    if (raw == MAP_FAILED) {
        free(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint64_t base = ((uint64_t)raw + align - 1) / align * align;
    if (base > (uint64_t)raw)
        munmap(raw, base - (uint64_t)raw);
    uint64_t tail = (uint64_t)raw + size + align - (base + size);
    if (tail)
        munmap((void *)(base + size), tail);
    r->base = base;
    r->size = size;
    pthread_mutex_lock(&vmm_lock);
    r->next = reservations;
    reservations = r;
    pthread_mutex_unlock(&vmm_lock);
    *ptr = base;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&vmm_lock);
    struct reservation **link = &reservations;
    while (*link && !((*link)->base == ptr && (*link)->size == size))
        link = &(*link)->next;
    struct reservation *r = *link;
    if (r)
        *link = r->next;
    pthread_mutex_unlock(&vmm_lock);
    if (!r)
        return CUDA_ERROR_INVALID_VALUE;
    fg_host_release(r->base, r->size); /* mappings a program left inside */
    munmap((void *)r->base, r->size);
    free(r);
    return CUDA_SUCCESS;
}

static bool reserved(uint64_t base, uint64_t size)
{
    bool inside = false;
    pthread_mutex_lock(&vmm_lock);
    for (struct reservation *r = reservations; r && !inside; r = r->next)
        inside = base >= r->base && base - r->base + size <= r->size;
    pthread_mutex_unlock(&vmm_lock);
    return inside;
}

FG_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                               const CUmemAllocationProp *prop, unsigned long long flags)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!handle || !prop_ok(prop) || size == 0 || size % FG_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    /* A fabric handle needs an IMEX channel, which a machine measured had not: the real
     * driver said CUDA_ERROR_NOT_PERMITTED (PyTorch then falls back to file descriptors). */
    if (fg_config()->fabric && (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC))
        return CUDA_ERROR_NOT_PERMITTED;
    struct physical *p = calloc(1, sizeof *p);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    int dev = prop->location.id;
    if (!fg_charge(dev, size) && !(fg_pools_trim_device(dev) && fg_charge(dev, size))) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p->device = dev;
    p->size = size;
    p->refs = 1;
    p->prop = *prop;
    *handle = (CUmemGenericAllocationHandle)p;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    physical_unref((struct physical *)handle);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                          CUmemGenericAllocationHandle handle)
{
    if (!prop || !handle)
        return CUDA_ERROR_INVALID_VALUE;
    *prop = ((struct physical *)handle)->prop;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                            CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    struct physical *p = (struct physical *)handle;
    struct fg_alloc existing;
    if (!p || size == 0 || size % FG_GRANULARITY || offset % FG_GRANULARITY ||
        offset + size > p->size || !reserved(ptr, size))
        return CUDA_ERROR_INVALID_VALUE;
    if (fg_lookup(ptr, &existing) || fg_lookup(ptr + size - 1, &existing))
        return CUDA_ERROR_ALREADY_MAPPED;
    if (mmap((void *)ptr, size, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct fg_alloc a = {.base = ptr, .size = size, .kind = FG_MAPPED, .device = p->device,
                         .pool = (CUmemoryPool)p};
    if (!fg_register(&a))
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&vmm_lock);
    p->refs++;
    pthread_mutex_unlock(&vmm_lock);
    return CUDA_SUCCESS;
}

/* Unmaps every mapping inside [ptr, ptr + size); the range must start at a mapping. */
FG_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    struct fg_alloc a;
    if (!fg_lookup(ptr, &a) || a.kind != FG_MAPPED || a.base != ptr)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t at = ptr;
    while (at < ptr + size && fg_unregister(at, FG_MAPPED, &a)) {
        fg_host_release(a.base, a.size);
        mmap((void *)a.base, a.size, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        physical_unref((struct physical *)a.pool);
        at = a.base + a.size;
    }
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                  size_t count)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    return desc && count && reserved(ptr, size) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FG_EXPORT CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location,
                                  CUdeviceptr ptr)
{
    if (!flags || !location)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = 3;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    struct fg_alloc a;
    if (!handle || !fg_lookup((uint64_t)addr, &a) || a.kind != FG_MAPPED)
        return CUDA_ERROR_INVALID_VALUE;
    struct physical *p = (struct physical *)a.pool;
    pthread_mutex_lock(&vmm_lock);
    p->refs++;
    pthread_mutex_unlock(&vmm_lock);
    *handle = (CUmemGenericAllocationHandle)p;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle h,
                                                int type, unsigned long long flags)
{
    return CUDA_ERROR_NOT_SUPPORTED; /* one process only */
}

/* Virtual memory management: address reservations, physical allocations (cuMemCreate, charged
 * to the device until released and unmapped), mapping and unmapping. A reservation is an
 * inaccessible host mapping; cuMemMap puts zero-filled memory at the mapped range. Each mapping
 * of a handle gets its own bytes (a handle mapped twice does not share data) until the handle
 * is exported as a POSIX file descriptor (cuMemExportToShareableHandle): then its bytes move
 * into a memory file (memfd, mode 0600), every mapping of it in this process and in processes
 * that import the descriptor (cuMemImportFromShareableHandle, after pidfd_getfd as PyTorch
 * does for expandable segments) maps that file, and all see the same bytes. An imported
 * handle charges nothing: the memory stays the exporter's. */
#include "driver.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

struct physical {
    int device;
    uint64_t size;
    int refs; /* 1 until cuMemRelease, +1 per mapping */
    CUmemAllocationProp prop;
    int memfd;     /* the memory file once exported or imported, else -1 */
    bool imported; /* from another process: charged there */
};
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 0x1

static pthread_mutex_t vmm_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t *fg_vmm_lock(void) { return &vmm_lock; }

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
        if (!p->imported)
            fg_uncharge(p->device, p->size);
        if (p->memfd >= 0)
            close(p->memfd);
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
    p->memfd = -1;
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
    void *mapped = p->memfd >= 0
                       ? mmap((void *)ptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                              p->memfd, (off_t)offset)
                       : mmap((void *)ptr, size, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (mapped == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct fg_alloc a = {.base = ptr, .size = size, .kind = FG_MAPPED, .device = p->device,
                         .pool = (CUmemoryPool)p, .shared = p->memfd >= 0, .offset = offset};
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

/* The memory file's name: the machine's device and 8 random bytes. */
#define VMM_FILE_PREFIX "vramshim-vmm-"

struct move_target {
    struct physical *p;
    bool failed;
};

static void copy_span(uint64_t start, uint64_t end, void *arg)
{
    const uint64_t *delta = arg; /* staging - mapping */
    memcpy((void *)(start + *delta), (const void *)start, end - start);
}

/* Moves one mapping of the handle being exported onto its memory file, bytes kept. */
static void move_mapping(struct fg_alloc *a, void *arg)
{
    struct move_target *t = arg;
    if (a->kind != FG_MAPPED || a->pool != (CUmemoryPool)t->p || a->shared)
        return;
    void *staging =
        mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_SHARED, t->p->memfd, (off_t)a->offset);
    if (staging == MAP_FAILED) {
        t->failed = true;
        return;
    }
    uint64_t delta = (uint64_t)staging - a->base;
    fg_host_each_written(a->base, a->base + a->size, copy_span, &delta);
    munmap(staging, a->size);
    if (mmap((void *)a->base, a->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
             t->p->memfd, (off_t)a->offset) == MAP_FAILED) {
        t->failed = true;
        return;
    }
    a->shared = true;
}

FG_EXPORT CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle h,
                                                int type, unsigned long long flags)
{
    struct physical *p = (struct physical *)h;
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED; /* fabric and Windows handles: not across processes */
    if (!shareable || !p || !(p->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&vmm_lock);
    if (p->memfd < 0) {
        char name[64];
        uint64_t nonce = 0;
        int physical = p->device < fg_config()->count ? fg_config()->unit[p->device] : 0;
        int fd = -1;
        if (getrandom(&nonce, sizeof nonce, 0) == sizeof nonce) {
            snprintf(name, sizeof name, VMM_FILE_PREFIX "%d-%016llx", physical,
                     (unsigned long long)nonce);
            fd = memfd_create(name, MFD_CLOEXEC);
        }
        if (fd < 0 || fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)p->size) != 0) {
            if (fd >= 0)
                close(fd);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            p->memfd = fd;
            struct move_target target = {p, false};
            fg_each_alloc(move_mapping, &target);
            if (target.failed)
                rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    int out = rc ? -1 : fcntl(p->memfd, F_DUPFD_CLOEXEC, 0);
    pthread_mutex_unlock(&vmm_lock);
    if (!rc && out < 0)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (!rc)
        *(int *)shareable = out; /* the caller's to close, as the driver's */
    return rc;
}

FG_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                  void *os_handle, int type)
{
    int dev;
    CUresult rc = fg_current_device(&dev);
    if (rc)
        return rc;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    int fd = (int)(intptr_t)os_handle;
    char path[64], link[128];
    struct stat st;
    int physical = -1;
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (!handle || n <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    link[n] = 0;
    if (sscanf(link, "/memfd:" VMM_FILE_PREFIX "%d-", &physical) != 1 || fstat(fd, &st) != 0 ||
        st.st_size <= 0 || st.st_size % FG_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE; /* not a descriptor a fake driver exported */
    struct physical *p = calloc(1, sizeof *p);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->memfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (p->memfd < 0) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p->device = dev;
    for (int i = 0; i < fg_config()->count; i++)
        if (fg_config()->unit[i] == physical)
            p->device = i;
    p->size = (uint64_t)st.st_size;
    p->refs = 1;
    p->imported = true;
    p->prop.type = 1;
    p->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p->prop.location.id = p->device;
    *handle = (CUmemGenericAllocationHandle)p;
    return CUDA_SUCCESS;
}

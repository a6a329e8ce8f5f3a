/* Stream-ordered allocation: memory pools. A pool reserves device memory block by block and
 * keeps freed blocks cached for reuse; at a synchronisation (stream, event, context) it gives
 * cached memory back to the device down to its release threshold (default 0, as in CUDA), and
 * an allocation that would fail first releases every pool's cached memory on the device.
 * Blocks are reserved at the requested size rounded up to 512 bytes and reused by any request
 * of the same rounded size.
 *
 * Pools across processes: a pool created with handleTypes = POSIX file descriptor exports as
 * a descriptor of an empty memory file named after the pool (cuMemPoolExportToShareableHandle);
 * another process imports it (cuMemPoolImportFromShareableHandle) as a pool it cannot allocate
 * from. A pointer of the pool (cuMemPoolExportPointer) shares as cuIpcGetMemHandle's memory
 * does (ipc.c: its pages move into a memory file the importer opens through /proc); its 64
 * bytes of export data name the pool, so only a pool imported from that pool takes them
 * (cuMemPoolImportPointer). The memory stays charged to the exporter; the importer frees its
 * pointer with cuMemFree or cuMemFreeAsync, before the exporter frees it (CUDA's rule; here
 * the exporter's free makes the block private again and an importer keeps the bytes it had).
 * Fabric handles are not supported (CUDA_ERROR_NOT_SUPPORTED). */
#include "driver.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

/* CUmemAllocationHandleType. */
#define HANDLE_POSIX_FD 0x1
#define HANDLE_WIN32 0x2
#define HANDLE_WIN32_KMT 0x4
#define HANDLE_FABRIC 0x8
/* The exported pool's memory file: the machine's device and the pool's random name. */
#define POOL_FILE_PREFIX "vramshim-pool-"

struct cached_block {
    uint64_t base, size;
    struct cached_block *next;
};

struct CUmemPoolHandle_st {
    int device;
    bool user; /* made by cuMemPoolCreate */
    pthread_mutex_t lock;
    uint64_t reserved, reserved_high, used, used_high, release_threshold, max_size;
    int reuse[4];
    int handle_types;  /* CUmemPoolProps.handleTypes */
    bool imported;     /* from another process: no allocations */
    uint64_t nonce;    /* an IPC-capable pool's random name (and its importers') */
    int file_fd;       /* the exported pool's memory file, or -1 */
    struct cached_block *cached;
    struct CUmemPoolHandle_st *next_pool;
};

static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static struct CUmemPoolHandle_st *all_pools;
pthread_mutex_t *fg_pools_lock(void) { return &pools_lock; }

void fg_pools_each_lock(void (*fn)(pthread_mutex_t *, void *), void *arg)
{
    for (struct CUmemPoolHandle_st *p = all_pools; p; p = p->next_pool)
        fn(&p->lock, arg);
}

static struct CUmemPoolHandle_st *pool_new(int dev, bool user)
{
    struct CUmemPoolHandle_st *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->device = dev;
    p->user = user;
    p->file_fd = -1;
    p->reuse[1] = p->reuse[2] = p->reuse[3] = 1;
    pthread_mutex_init(&p->lock, NULL);
    pthread_mutex_lock(&pools_lock);
    p->next_pool = all_pools;
    all_pools = p;
    pthread_mutex_unlock(&pools_lock);
    return p;
}

void fg_pools_init_device(int dev)
{
    fg_devices[dev].default_pool = fg_devices[dev].current_pool = pool_new(dev, false);
}

/* Gives back cached blocks while the pool reserves more than KEEP. Pool lock held. */
static void trim_locked(struct CUmemPoolHandle_st *p, uint64_t keep)
{
    struct cached_block **link = &p->cached;
    while (*link && p->reserved > keep) {
        struct cached_block *b = *link;
        *link = b->next;
        struct fg_alloc gone;
        fg_unregister(b->base, FG_POOL, &gone);
        fg_unmap((void *)b->base, b->size);
        fg_uncharge(p->device, b->size);
        p->reserved -= b->size;
        free(b);
    }
}

void fg_pools_sync(void)
{
    pthread_mutex_lock(&pools_lock);
    for (struct CUmemPoolHandle_st *p = all_pools; p; p = p->next_pool) {
        pthread_mutex_lock(&p->lock);
        trim_locked(p, p->release_threshold);
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_unlock(&pools_lock);
}

bool fg_pools_trim_device(int dev)
{
    bool released = false;
    pthread_mutex_lock(&pools_lock);
    for (struct CUmemPoolHandle_st *p = all_pools; p; p = p->next_pool) {
        if (p->device != dev)
            continue;
        pthread_mutex_lock(&p->lock);
        uint64_t before = p->reserved;
        trim_locked(p, 0);
        released |= p->reserved < before;
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_unlock(&pools_lock);
    return released;
}

static CUresult pool_alloc(struct CUmemPoolHandle_st *p, size_t size, CUdeviceptr *out)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!p || !out || p->imported) /* an imported pool has no memory of its own */
        return CUDA_ERROR_INVALID_VALUE;
    if (size == 0) {
        *out = 0;
        return CUDA_SUCCESS;
    }
    uint64_t rounded = (size + 511) / 512 * 512;
    pthread_mutex_lock(&p->lock);
    for (struct cached_block **link = &p->cached; *link; link = &(*link)->next) {
        struct cached_block *b = *link;
        if (b->size == rounded) {
            *link = b->next;
            p->used += rounded;
            if (p->used > p->used_high)
                p->used_high = p->used;
            pthread_mutex_unlock(&p->lock);
            *out = b->base;
            free(b);
            return CUDA_SUCCESS;
        }
    }
    if (p->max_size && p->reserved + rounded > p->max_size) {
        pthread_mutex_unlock(&p->lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    bool charged = fg_charge(p->device, rounded);
    if (!charged) {
        trim_locked(p, 0);
        charged = fg_charge(p->device, rounded);
    }
    pthread_mutex_unlock(&p->lock);
    if (!charged && fg_pools_trim_device(p->device))
        charged = fg_charge(p->device, rounded);
    if (!charged)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *memory = fg_map(rounded);
    struct fg_alloc a = {.base = (uint64_t)memory, .size = rounded, .kind = FG_POOL,
                         .device = p->device, .pool = p, .charged = rounded};
    if (!memory || !fg_register(&a)) {
        if (memory)
            fg_unmap(memory, rounded);
        fg_uncharge(p->device, rounded);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&p->lock);
    p->reserved += rounded;
    p->used += rounded;
    if (p->reserved > p->reserved_high)
        p->reserved_high = p->reserved;
    if (p->used > p->used_high)
        p->used_high = p->used;
    pthread_mutex_unlock(&p->lock);
    *out = (CUdeviceptr)memory;
    return CUDA_SUCCESS;
}

static CUresult current_pool(struct CUmemPoolHandle_st **p)
{
    int dev;
    CUresult rc = fg_current_device(&dev);
    if (!rc)
        *p = fg_devices[dev].current_pool;
    return rc;
}

FG_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream stream)
{
    struct CUmemPoolHandle_st *p;
    CUresult rc = current_pool(&p);
    if (!rc && fg_capture_mem_alloc(stream, size, dptr, &rc))
        return rc;
    return rc ? rc : pool_alloc(p, size, dptr);
}

FG_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                           CUstream stream)
{
    CUresult rc;
    if (pool && fg_capture_mem_alloc(stream, size, dptr, &rc))
        return rc;
    return pool_alloc(pool, size, dptr);
}

FG_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    struct fg_alloc a;
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dptr == 0)
        return CUDA_SUCCESS;
    CUresult rc;
    if (fg_capture_mem_free(stream, dptr, &rc))
        return rc;
    if (!fg_lookup(dptr, &a) || a.base != dptr)
        return CUDA_ERROR_INVALID_VALUE;
    if (a.kind == FG_GRAPH)
        return fg_graph_mem_free(dptr);
    if (a.kind == FG_IPC) {
        CUresult freed = CUDA_ERROR_INVALID_VALUE; /* an IPC handle's: cuIpcCloseMemHandle */
        fg_pool_free_imported(dptr, &freed);
        return freed;
    }
    if (a.kind != FG_POOL) {
        /* cuMemFreeAsync frees cuMemAlloc memory too (after the stream's work). */
        return a.kind == FG_DEVICE ? cuMemFree_v2(dptr) : CUDA_ERROR_INVALID_VALUE;
    }
    struct cached_block *b = malloc(sizeof *b);
    if (!b)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct CUmemPoolHandle_st *p = a.pool;
    if (a.shared) {
        /* Exported (cuMemPoolExportPointer): private pages again before the block is reused. */
        fg_ipc_unexport(a.base, a.size);
        fg_set_shared(a.base, false);
    }
    b->base = a.base;
    b->size = a.size;
    pthread_mutex_lock(&p->lock);
    b->next = p->cached;
    p->cached = b;
    p->used -= a.size;
    pthread_mutex_unlock(&p->lock);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fg_valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *pool = fg_devices[dev].default_pool;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fg_valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *pool = fg_devices[dev].current_pool;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!fg_valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!pool || pool->device != dev || pool->imported)
        return CUDA_ERROR_INVALID_VALUE;
    fg_devices[dev].current_pool = pool;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pool || !props || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !fg_valid_device(props->location.id))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t nonce = 0; /* names an IPC-capable pool across processes */
    if ((props->handleTypes & HANDLE_POSIX_FD) && getrandom(&nonce, sizeof nonce, 0) != sizeof nonce)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct CUmemPoolHandle_st *p = pool_new(props->location.id, true);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->max_size = props->maxSize;
    p->handle_types = props->handleTypes;
    p->nonce = nonce;
    *pool = p;
    return CUDA_SUCCESS;
}

/* The pool object stays allocated (out of the list's trims once empty): freed memory of a
 * destroyed pool is still in its cache until the pool is gone, then released here. */
FG_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pool || !pool->user)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool->lock);
    trim_locked(pool, 0);
    pthread_mutex_unlock(&pool->lock);
    for (int d = 0; d < fg_config()->count; d++)
        if (fg_devices[d].current_pool == pool)
            fg_devices[d].current_pool = fg_devices[d].default_pool;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool->lock);
    trim_locked(pool, keep);
    pthread_mutex_unlock(&pool->lock);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attribute, void *value)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pool || !value)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&pool->lock);
    switch (attribute) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *(int *)value = pool->reuse[attribute];
        break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(uint64_t *)value = pool->release_threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *(uint64_t *)value = pool->reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *(uint64_t *)value = pool->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(uint64_t *)value = pool->used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(uint64_t *)value = pool->used_high; break;
    default: rc = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&pool->lock);
    return rc;
}

/* The high-water marks can only be reset to 0 (which means: to the current value). */
FG_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attribute, void *value)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pool || !value)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&pool->lock);
    switch (attribute) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        pool->reuse[attribute] = *(int *)value != 0;
        break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: pool->release_threshold = *(uint64_t *)value; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        if (*(uint64_t *)value)
            rc = CUDA_ERROR_INVALID_VALUE;
        else
            pool->reserved_high = pool->reserved;
        break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (*(uint64_t *)value)
            rc = CUDA_ERROR_INVALID_VALUE;
        else
            pool->used_high = pool->used;
        break;
    default: rc = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&pool->lock);
    return rc;
}

FG_EXPORT CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count)
{
    return pool && (map || count == 0) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FG_EXPORT CUresult cuMemPoolGetAccess(int *flags, CUmemoryPool pool, CUmemLocation *location)
{
    if (!pool || !flags || !location)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = 3; /* read-write */
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- pools across processes */

/* The 64 bytes of a CUmemPoolPtrExportData. */
struct pool_ptr_export {
    uint64_t magic;
    uint64_t pool_nonce; /* the exporting pool's name */
    uint64_t nonce;      /* the memory file's name */
    uint64_t inode;      /* of the memory file */
    uint64_t size;       /* of the allocation */
    int32_t pid;         /* the exporting process */
    int32_t fd;          /* the memory file's descriptor there */
    uint32_t reserved[4];
};
_Static_assert(sizeof(struct pool_ptr_export) == 64, "CUmemPoolPtrExportData is 64 bytes");
#define POOL_PTR_MAGIC 0x3174707070706466ull /* "fdppppt1" */

static uint64_t page_size_round(uint64_t n)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    return (n ? n + page - 1 : page) / page * page;
}

/* A pointer this process imported. */
struct imported_ptr {
    uint64_t base, size;
    int32_t pid;
    uint64_t inode, nonce;
    unsigned refs;
};
static pthread_mutex_t imports_lock = PTHREAD_MUTEX_INITIALIZER;
static struct imported_ptr *imports;
static size_t import_count, import_capacity;
pthread_mutex_t *fg_imports_lock(void) { return &imports_lock; }

/* A handle type other than a POSIX descriptor: fabric and Windows handles are not supported
 * here, anything else is no handle type. */
static CUresult other_handle_type(int type)
{
    return type == HANDLE_FABRIC || type == HANDLE_WIN32 || type == HANDLE_WIN32_KMT
               ? CUDA_ERROR_NOT_SUPPORTED
               : CUDA_ERROR_INVALID_VALUE;
}

FG_EXPORT CUresult cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool, int type,
                                                    unsigned long long flags)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (type != HANDLE_POSIX_FD)
        return other_handle_type(type);
    /* Only a pool created with that handle type can be exported (not the default pool). */
    if (!handle_out || !pool || flags || pool->imported || !(pool->handle_types & HANDLE_POSIX_FD))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&pool->lock);
    if (pool->file_fd < 0) {
        char name[64];
        int physical = pool->device < fg_config()->count ? fg_config()->unit[pool->device] : 0;
        snprintf(name, sizeof name, POOL_FILE_PREFIX "%d-%016llx", physical,
                 (unsigned long long)pool->nonce);
        int fd = memfd_create(name, MFD_CLOEXEC);
        if (fd >= 0 && fchmod(fd, 0600) == 0)
            pool->file_fd = fd;
        else if (fd >= 0)
            close(fd);
    }
    int out = pool->file_fd >= 0 ? fcntl(pool->file_fd, F_DUPFD_CLOEXEC, 0) : -1;
    pthread_mutex_unlock(&pool->lock);
    if (out < 0)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    else
        *(int *)handle_out = out; /* the caller's to close, as the driver's */
    return rc;
}

FG_EXPORT CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
                                                      int type, unsigned long long flags)
{
    int dev;
    CUresult rc = fg_current_device(&dev);
    if (rc)
        return rc;
    if (type != HANDLE_POSIX_FD)
        return other_handle_type(type);
    char path[64], link[128];
    int physical = -1;
    unsigned long long nonce = 0;
    snprintf(path, sizeof path, "/proc/self/fd/%d", (int)(intptr_t)handle);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (!pool_out || flags || n <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    link[n] = 0;
    if (sscanf(link, "/memfd:" POOL_FILE_PREFIX "%d-%16llx", &physical, &nonce) != 2)
        return CUDA_ERROR_INVALID_VALUE; /* not a pool a fake driver exported */
    for (int i = 0; i < fg_config()->count; i++)
        if (fg_config()->unit[i] == physical)
            dev = i;
    struct CUmemPoolHandle_st *p = pool_new(dev, true);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->imported = true;
    p->handle_types = HANDLE_POSIX_FD;
    p->nonce = nonce;
    *pool_out = p;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *data, CUdeviceptr ptr)
{
    struct fg_alloc a;
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!data || !fg_lookup(ptr, &a) || a.kind != FG_POOL || a.base != ptr)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUmemPoolHandle_st *p = a.pool;
    if (!(p->handle_types & HANDLE_POSIX_FD))
        return CUDA_ERROR_INVALID_VALUE; /* the pool cannot be shared */
    pthread_mutex_lock(&p->lock);
    bool freed = false;
    for (struct cached_block *b = p->cached; b && !freed; b = b->next)
        freed = b->base == ptr;
    pthread_mutex_unlock(&p->lock);
    if (freed)
        return CUDA_ERROR_INVALID_VALUE;
    struct fg_ipc_file file;
    CUresult rc = fg_ipc_share(&a, &file);
    if (rc)
        return rc;
    struct pool_ptr_export e = {.magic = POOL_PTR_MAGIC, .pool_nonce = p->nonce,
                                .nonce = file.nonce, .inode = file.inode, .size = file.size,
                                .pid = file.pid, .fd = file.fd};
    memset(data, 0, sizeof *data);
    memcpy(data, &e, sizeof e);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
                                          CUmemPoolPtrExportData *data)
{
    struct pool_ptr_export e;
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ptr_out || !pool || !data)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(&e, data, sizeof e);
    /* Only into a pool imported from the pool the pointer is of. */
    if (e.magic != POOL_PTR_MAGIC || !pool->imported || e.pool_nonce != pool->nonce ||
        e.pid == (int32_t)getpid())
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&imports_lock);
    for (size_t i = 0; i < import_count; i++)
        if (imports[i].pid == e.pid && imports[i].inode == e.inode && imports[i].nonce == e.nonce) {
            imports[i].refs++; /* imported before: the same address, freed as often */
            *ptr_out = imports[i].base;
            pthread_mutex_unlock(&imports_lock);
            return CUDA_SUCCESS;
        }
    if (import_count == import_capacity) {
        size_t grown_capacity = import_capacity ? import_capacity * 2 : 16;
        struct imported_ptr *grown = realloc(imports, grown_capacity * sizeof *imports);
        if (!grown) {
            pthread_mutex_unlock(&imports_lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        imports = grown;
        import_capacity = grown_capacity;
    }
    struct fg_ipc_file file = {.pid = e.pid, .fd = e.fd, .inode = e.inode, .nonce = e.nonce,
                               .size = e.size};
    uint64_t base = 0;
    rc = fg_ipc_map(&file, &base);
    if (rc == CUDA_SUCCESS) {
        /* Charges nothing: the memory stays the exporter's. */
        struct fg_alloc a = {.base = base, .size = e.size, .kind = FG_IPC, .device = pool->device,
                             .pool = pool, .shared = true};
        if (fg_register(&a)) {
            imports[import_count++] = (struct imported_ptr){
                .base = base, .size = e.size, .pid = e.pid, .inode = e.inode, .nonce = e.nonce,
                .refs = 1};
            *ptr_out = base;
        } else {
            munmap((void *)base, page_size_round(e.size));
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&imports_lock);
    return rc;
}

bool fg_pool_free_imported(uint64_t p, CUresult *rc)
{
    uint64_t unmap_size = 0;
    bool found = false;
    pthread_mutex_lock(&imports_lock);
    for (size_t i = 0; i < import_count && !found; i++)
        if (imports[i].base == p) {
            found = true;
            if (--imports[i].refs == 0) {
                struct fg_alloc gone;
                fg_unregister(p, FG_IPC, &gone);
                unmap_size = imports[i].size;
                imports[i] = imports[--import_count];
            }
        }
    pthread_mutex_unlock(&imports_lock);
    if (unmap_size) { /* the file's pages stay the exporter's */
        fg_host_release(p, page_size_round(unmap_size));
        munmap((void *)p, page_size_round(unmap_size));
    }
    if (found)
        *rc = CUDA_SUCCESS;
    return found;
}

/* Stream-ordered allocation: memory pools. A pool reserves device memory block by block and
 * keeps freed blocks cached for reuse; at a synchronisation (stream, event, context) it gives
 * cached memory back to the device down to its release threshold (default 0, as in CUDA), and
 * an allocation that would fail first releases every pool's cached memory on the device.
 * Blocks are reserved at the requested size rounded up to 512 bytes and reused by any request
 * of the same rounded size. */
#include "driver.h"

#include <stdlib.h>
#include <string.h>

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
    struct cached_block *cached;
    struct CUmemPoolHandle_st *next_pool;
};

static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static struct CUmemPoolHandle_st *all_pools;

static struct CUmemPoolHandle_st *pool_new(int dev, bool user)
{
    struct CUmemPoolHandle_st *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->device = dev;
    p->user = user;
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
    if (!p || !out)
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
    if (a.kind != FG_POOL) {
        /* cuMemFreeAsync frees cuMemAlloc memory too (after the stream's work). */
        return a.kind == FG_DEVICE ? cuMemFree_v2(dptr) : CUDA_ERROR_INVALID_VALUE;
    }
    struct cached_block *b = malloc(sizeof *b);
    if (!b)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct CUmemPoolHandle_st *p = a.pool;
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
    if (!pool || pool->device != dev)
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
    struct CUmemPoolHandle_st *p = pool_new(props->location.id, true);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->max_size = props->maxSize;
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

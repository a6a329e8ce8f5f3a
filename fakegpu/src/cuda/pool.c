/* Stream-ordered allocation: memory pools, modelled on the real driver's default pool (measured
 * on an H200, driver 580, CUDA 13: scripts/pool_model.py reproduces those measurements).
 *
 * A pool owns one address range. Blocks are the requested size rounded up to 512 bytes (to the
 * host page in a pool that can export pointers, which shares whole pages), packed one after
 * another, next fit: an allocation takes the start of the first free range it fits in at or
 * after the end of the last block placed, else of the first one from the range's start (freed
 * neighbours merge), else goes on at the end of the range in use (taking a free tail with it). Reserved memory is physical memory in 32 MiB
 * granules: the pool holds at least as many granules as its live blocks touch (a granule no
 * block touches lends its memory to one that needs it, so the count grows only when the
 * touched ones outnumber the held ones). At a synchronisation (stream, event, context) the pool
 * gives back granules no block touches while it holds more than its release threshold (default
 * 0, as in CUDA); cuMemPoolTrimTo gives them back down to its argument; an allocation that
 * would fail first releases every pool's unused granules on the device. Used memory is the
 * exact requested bytes.
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

/* The real pool's units: physical memory comes in granules of 32 MiB, blocks in 512 bytes. */
#define POOL_GRANULE (32ull << 20)
#define POOL_BLOCK_ALIGN 512ull

/* A free part of the pool's address range, [start, end) as offsets in it. */
struct free_range {
    uint64_t start, end;
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
    /* The address range (reserved at the first allocation), its end in use so far (blocks go
     * on there when no free range fits), how much of it is accessible, the free ranges below
     * that end by address, and where the last block placed ends (the next search starts). */
    uint64_t range_base, range_size, range_top, range_open;
    struct free_range *free_ranges;
    size_t free_count, free_capacity;
    uint64_t next_fit;
    /* Per granule of the range: how many live blocks touch it; touched: how many granules
     * some block touches. reserved is at least touched * POOL_GRANULE. */
    uint32_t *granule_blocks;
    uint64_t touched;
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

/* Gives back granules no block touches while the pool reserves more than KEEP (their host
 * pages too, highest granules first). Pool lock held. */
static void trim_locked(struct CUmemPoolHandle_st *p, uint64_t keep)
{
    /* Only granules no block touches can go, whole: while more than KEEP is held. */
    uint64_t spare = (p->reserved - p->touched * POOL_GRANULE) / POOL_GRANULE;
    uint64_t over = p->reserved > keep ? (p->reserved - keep + POOL_GRANULE - 1) / POOL_GRANULE : 0;
    uint64_t granules = spare < over ? spare : over;
    if (granules == 0)
        return;
    uint64_t released = granules * POOL_GRANULE;
    fg_uncharge(p->device, released);
    p->reserved -= released;
    /* The host pages of the granules no block touches go back (the device memory is gone). */
    for (uint64_t g = (p->range_top + POOL_GRANULE - 1) / POOL_GRANULE; g-- > 0 && granules > 0;) {
        if (p->granule_blocks[g])
            continue;
        uint64_t at = p->range_base + g * POOL_GRANULE;
        fg_host_release(at, POOL_GRANULE);
        madvise((void *)at, POOL_GRANULE, MADV_DONTNEED);
        granules--;
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

/* Reserves the pool's address range (at its first allocation): twice the device's memory, so
 * fragmentation runs out of device memory before it runs out of addresses. Inaccessible (and
 * so not counted against the host's commit limit) until range_open_to opens it. Pool lock
 * held. */
static bool range_ready(struct CUmemPoolHandle_st *p)
{
    if (p->range_base)
        return true;
    uint64_t size = (2 * fg_device_capacity(p->device) + POOL_GRANULE - 1) / POOL_GRANULE *
                    POOL_GRANULE;
    uint32_t *counts = calloc(size / POOL_GRANULE, sizeof *counts);
    /* Aligned to the granule as the driver's is: map one granule more and skip to a boundary. */
    void *memory = counts ? mmap(NULL, size + POOL_GRANULE, PROT_NONE,
                                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
                          : MAP_FAILED;
    if (memory == MAP_FAILED) {
        free(counts);
        return false;
    }
    uint64_t start = (uint64_t)memory, base = (start + POOL_GRANULE - 1) / POOL_GRANULE * POOL_GRANULE;
    if (base > start)
        munmap(memory, base - start);
    munmap((void *)(base + size), start + POOL_GRANULE - base);
    p->range_base = base;
    p->range_size = size;
    p->granule_blocks = counts;
    return true;
}

/* Makes the range accessible up to END (whole granules); false when the host refuses. */
static bool range_open_to(struct CUmemPoolHandle_st *p, uint64_t end)
{
    if (end <= p->range_open)
        return true;
    uint64_t open = (end + POOL_GRANULE - 1) / POOL_GRANULE * POOL_GRANULE;
    if (mprotect((void *)(p->range_base + p->range_open), open - p->range_open,
                 PROT_READ | PROT_WRITE) != 0)
        return false;
    p->range_open = open;
    return true;
}

/* Gives the address range back (a destroyed pool with no live block). Pool lock held. */
static void range_close(struct CUmemPoolHandle_st *p)
{
    if (!p->range_base)
        return;
    fg_host_release(p->range_base, p->range_open);
    munmap((void *)p->range_base, p->range_size);
    free(p->granule_blocks);
    free(p->free_ranges);
    p->granule_blocks = NULL;
    p->free_ranges = NULL;
    p->range_base = p->range_size = p->range_top = p->range_open = p->next_fit = 0;
    p->free_count = p->free_capacity = 0;
}

/* Adds D (1 or -1) to the granules [START, START + SIZE) touches; the change in touched. */
static void touch_granules(struct CUmemPoolHandle_st *p, uint64_t start, uint64_t size, int d)
{
    for (uint64_t g = start / POOL_GRANULE; g <= (start + size - 1) / POOL_GRANULE; g++) {
        if (d > 0 && p->granule_blocks[g]++ == 0)
            p->touched++;
        else if (d < 0 && --p->granule_blocks[g] == 0)
            p->touched--;
    }
}

/* Granules of [START, START + SIZE) no block touches yet. */
static uint64_t untouched_granules(const struct CUmemPoolHandle_st *p, uint64_t start,
                                   uint64_t size)
{
    uint64_t n = 0;
    for (uint64_t g = start / POOL_GRANULE; g <= (start + size - 1) / POOL_GRANULE; g++)
        n += p->granule_blocks[g] == 0;
    return n;
}

/* Where a block of SIZE goes, next fit: the first free range it fits in at or after the end
 * of the last block placed, else the first one from the start (its index in *RANGE), else the
 * end of the range in use (*RANGE = free_count); the offset. */
static uint64_t place_block(const struct CUmemPoolHandle_st *p, uint64_t size, size_t *range)
{
    size_t best = p->free_count, wrapped = p->free_count;
    for (size_t i = 0; i < p->free_count && best == p->free_count; i++) {
        const struct free_range *f = &p->free_ranges[i];
        if (f->end - f->start < size)
            continue;
        if (f->start >= p->next_fit)
            best = i;
        else if (wrapped == p->free_count)
            wrapped = i;
    }
    if (best == p->free_count)
        best = wrapped;
    *range = best;
    if (best < p->free_count)
        return p->free_ranges[best].start;
    /* A free range at the end of the part in use is extended. */
    if (p->free_count && p->free_ranges[p->free_count - 1].end == p->range_top)
        return p->free_ranges[p->free_count - 1].start;
    return p->range_top;
}

/* Takes [AT, AT + SIZE) out of the free ranges (RANGE from place_block) and the top. */
static void take_block(struct CUmemPoolHandle_st *p, size_t range, uint64_t at, uint64_t size)
{
    if (range < p->free_count) {
        struct free_range *f = &p->free_ranges[range];
        f->start += size;
        if (f->start == f->end) {
            memmove(f, f + 1, (p->free_count - range - 1) * sizeof *f);
            p->free_count--;
        }
        return;
    }
    if (p->free_count && p->free_ranges[p->free_count - 1].start == at)
        p->free_count--; /* the free tail, extended */
    p->range_top = at + size;
}

/* Gives [AT, AT + SIZE) back to the free ranges, merged with its neighbours; false when the
 * list cannot grow. */
static bool give_block(struct CUmemPoolHandle_st *p, uint64_t at, uint64_t size)
{
    size_t i = 0;
    while (i < p->free_count && p->free_ranges[i].start < at)
        i++;
    bool after = i > 0 && p->free_ranges[i - 1].end == at;
    bool before = i < p->free_count && p->free_ranges[i].start == at + size;
    if (after && before) {
        p->free_ranges[i - 1].end = p->free_ranges[i].end;
        memmove(&p->free_ranges[i], &p->free_ranges[i + 1],
                (p->free_count - i - 1) * sizeof *p->free_ranges);
        p->free_count--;
        return true;
    }
    if (after) {
        p->free_ranges[i - 1].end = at + size;
        return true;
    }
    if (before) {
        p->free_ranges[i].start = at;
        return true;
    }
    if (p->free_count == p->free_capacity) {
        size_t capacity = p->free_capacity ? p->free_capacity * 2 : 64;
        struct free_range *grown = realloc(p->free_ranges, capacity * sizeof *grown);
        if (!grown)
            return false;
        p->free_ranges = grown;
        p->free_capacity = capacity;
    }
    memmove(&p->free_ranges[i + 1], &p->free_ranges[i],
            (p->free_count - i) * sizeof *p->free_ranges);
    p->free_ranges[i] = (struct free_range){.start = at, .end = at + size};
    p->free_count++;
    return true;
}

/* The room a block of SIZE bytes takes: 512-byte units, whole host pages in a pool that
 * exports pointers (it shares pages); the block itself is SIZE rounded to 512. */
static uint64_t block_slot(const struct CUmemPoolHandle_st *p, uint64_t size)
{
    uint64_t align = (p->handle_types & HANDLE_POSIX_FD) ? (uint64_t)sysconf(_SC_PAGESIZE)
                                                         : POOL_BLOCK_ALIGN;
    return (size + align - 1) / align * align;
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
    uint64_t rounded = block_slot(p, size);
    bool trimmed = false;
retry:
    pthread_mutex_lock(&p->lock);
    if (!range_ready(p)) {
        pthread_mutex_unlock(&p->lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    size_t range;
    uint64_t at = place_block(p, rounded, &range);
    if (at + rounded > p->range_size) {
        pthread_mutex_unlock(&p->lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* Granules the block touches first take held memory no block touches, then new memory. */
    uint64_t needed = (p->touched + untouched_granules(p, at, rounded)) * POOL_GRANULE;
    uint64_t more = needed > p->reserved ? needed - p->reserved : 0;
    if (more && p->max_size && needed > p->max_size) {
        pthread_mutex_unlock(&p->lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (more && !fg_charge(p->device, more)) {
        pthread_mutex_unlock(&p->lock);
        /* Out of memory: every pool of the device gives back what no block touches first. */
        if (!trimmed && fg_pools_trim_device(p->device)) {
            trimmed = true;
            goto retry;
        }
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!range_open_to(p, at + rounded)) {
        pthread_mutex_unlock(&p->lock);
        if (more)
            fg_uncharge(p->device, more);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct fg_alloc a = {.base = p->range_base + at,
                         .size = (size + POOL_BLOCK_ALIGN - 1) / POOL_BLOCK_ALIGN * POOL_BLOCK_ALIGN,
                         .kind = FG_POOL,
                         .device = p->device, .pool = p, .requested = size};
    if (!fg_register(&a)) {
        pthread_mutex_unlock(&p->lock);
        fg_uncharge(p->device, more);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p->reserved += more;
    take_block(p, range, at, rounded);
    p->next_fit = at + rounded;
    touch_granules(p, at, rounded, 1);
    p->used += size;
    if (p->reserved > p->reserved_high)
        p->reserved_high = p->reserved;
    if (p->used > p->used_high)
        p->used_high = p->used;
    pthread_mutex_unlock(&p->lock);
    *out = (CUdeviceptr)a.base;
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
    struct CUmemPoolHandle_st *p = a.pool;
    if (a.shared) {
        /* Exported (cuMemPoolExportPointer): private pages again before the block is reused. */
        fg_ipc_unexport(a.base, a.size);
        fg_set_shared(a.base, false);
    }
    pthread_mutex_lock(&p->lock);
    uint64_t at = a.base - p->range_base, slot = block_slot(p, a.size);
    if (!give_block(p, at, slot)) {
        pthread_mutex_unlock(&p->lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    touch_granules(p, at, slot, -1);
    p->used -= a.requested;
    struct fg_alloc gone;
    fg_unregister(a.base, FG_POOL, &gone);
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

/* The pool object stays allocated (out of the list's trims once empty): its memory no block
 * uses is released here, and its address range too when no block is live. */
FG_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pool || !pool->user)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool->lock);
    trim_locked(pool, 0);
    if (pool->touched == 0)
        range_close(pool);
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

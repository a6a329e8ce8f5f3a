/* Device accounting, the address registry and the memory API: synchronous, pitch, managed and
 * pinned/registered host memory, cuMemGetInfo, copies and sets, pointer attributes (IPC handles:
 * ipc.c). */
#include "driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct fg_device fg_devices[FG_MAX_DEVICES];

static bool reserve(int dev, unsigned long long n, bool unseen)
{
    struct fg_device *d = &fg_devices[dev];
    unsigned long long capacity = fg_device_capacity(dev);
    switch (fg_ledger_charge(fg_config()->unit[dev], n, capacity, unseen)) {
    case FG_LEDGER_FULL: return false;
    case FG_LEDGER_CHARGED: break;
    default:
        if (n > capacity - d->used)
            return false;
    }
    d->used += n;
    return true;
}

bool fg_device_reserve(int dev, unsigned long long n) { return reserve(dev, n, false); }

bool fg_device_reserve_unseen(int dev, unsigned long long n) { return reserve(dev, n, true); }

void fg_device_release(int dev, unsigned long long n)
{
    struct fg_device *d = &fg_devices[dev];
    if (n > d->used)
        n = d->used;
    d->used -= n;
    fg_ledger_uncharge(fg_config()->unit[dev], n);
}

unsigned long long fg_device_used(int dev)
{
    unsigned long long used;
    if (fg_ledger_used(fg_config()->unit[dev], &used))
        return used;
    return fg_devices[dev].used;
}

bool fg_charge(int dev, unsigned long long n)
{
    struct fg_device *d = &fg_devices[dev];
    pthread_mutex_lock(&d->lock);
    bool ok = fg_device_reserve(dev, n);
    pthread_mutex_unlock(&d->lock);
    return ok;
}

void fg_uncharge(int dev, unsigned long long n)
{
    struct fg_device *d = &fg_devices[dev];
    pthread_mutex_lock(&d->lock);
    fg_device_release(dev, n);
    pthread_mutex_unlock(&d->lock);
}

/* ---------------------------------------------------------------- registry: sorted by base */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fg_alloc *entries;
static size_t entry_count, entry_capacity;
static uint64_t next_id = 1;
pthread_mutex_t *fg_registry_lock(void) { return &registry_lock; }

/* Index of the first entry with base > addr. */
static size_t upper_bound(uint64_t addr)
{
    size_t lo = 0, hi = entry_count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (entries[mid].base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

bool fg_register(const struct fg_alloc *a)
{
    bool ok = true;
    pthread_mutex_lock(&registry_lock);
    if (entry_count == entry_capacity) {
        size_t capacity = entry_capacity ? entry_capacity * 2 : 1024;
        struct fg_alloc *grown = realloc(entries, capacity * sizeof *entries);
        if (!grown)
            ok = false;
        else {
            entries = grown;
            entry_capacity = capacity;
        }
    }
    if (ok) {
        size_t at = upper_bound(a->base);
        memmove(entries + at + 1, entries + at, (entry_count - at) * sizeof *entries);
        entries[at] = *a;
        entries[at].id = next_id++;
        entry_count++;
    }
    pthread_mutex_unlock(&registry_lock);
    return ok;
}

bool fg_lookup(uint64_t addr, struct fg_alloc *out)
{
    bool found = false;
    pthread_mutex_lock(&registry_lock);
    size_t at = upper_bound(addr);
    if (at > 0) {
        const struct fg_alloc *e = &entries[at - 1];
        if (addr - e->base < (e->size ? e->size : 1)) {
            *out = *e;
            found = true;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    return found;
}

void fg_each_alloc(void (*fn)(struct fg_alloc *, void *), void *arg)
{
    pthread_mutex_lock(&registry_lock);
    for (size_t i = 0; i < entry_count; i++)
        fn(&entries[i], arg);
    pthread_mutex_unlock(&registry_lock);
}

bool fg_set_shared(uint64_t base, bool shared)
{
    bool found = false;
    pthread_mutex_lock(&registry_lock);
    size_t at = upper_bound(base);
    if (at > 0 && entries[at - 1].base == base) {
        entries[at - 1].shared = shared;
        found = true;
    }
    pthread_mutex_unlock(&registry_lock);
    return found;
}

bool fg_unregister(uint64_t base, int kind, struct fg_alloc *out)
{
    bool found = false;
    pthread_mutex_lock(&registry_lock);
    size_t at = upper_bound(base);
    if (at > 0 && entries[at - 1].base == base && (kind < 0 || (int)entries[at - 1].kind == kind)) {
        *out = entries[at - 1];
        memmove(entries + at - 1, entries + at, (entry_count - at) * sizeof *entries);
        entry_count--;
        found = true;
    }
    pthread_mutex_unlock(&registry_lock);
    return found;
}

static uint64_t page_round(uint64_t n)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    return (n + page - 1) / page * page;
}

/* Freed mappings are kept for reuse by a request of the same page-rounded size (two system
 * calls saved per allocation/free pair): at most MAP_CACHE_ENTRIES of them, and none larger
 * than MAP_CACHE_LARGEST, so the host memory they may hold stays bounded. Like a GPU's, reused
 * memory is not cleared. */
#define MAP_CACHE_ENTRIES 64
#define MAP_CACHE_LARGEST (64ull << 20)
static pthread_mutex_t map_cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    void *p;
    uint64_t size;
} map_cache[MAP_CACHE_ENTRIES];
static int map_cache_count;
pthread_mutex_t *fg_map_cache_lock(void) { return &map_cache_lock; }

void *fg_map(uint64_t size)
{
    uint64_t rounded = page_round(size ? size : 1);
    void *p = NULL;
    if (rounded <= MAP_CACHE_LARGEST) {
        pthread_mutex_lock(&map_cache_lock);
        for (int i = map_cache_count - 1; i >= 0; i--)
            if (map_cache[i].size == rounded) {
                p = map_cache[i].p;
                map_cache[i] = map_cache[--map_cache_count];
                break;
            }
        pthread_mutex_unlock(&map_cache_lock);
        if (p)
            return p;
    }
    p = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
             -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void fg_unmap(void *p, uint64_t size)
{
    uint64_t rounded = page_round(size ? size : 1);
    if (rounded <= MAP_CACHE_LARGEST) {
        bool kept = false;
        pthread_mutex_lock(&map_cache_lock);
        if (map_cache_count < MAP_CACHE_ENTRIES) {
            map_cache[map_cache_count].p = p;
            map_cache[map_cache_count].size = rounded;
            map_cache_count++;
            kept = true;
        }
        pthread_mutex_unlock(&map_cache_lock);
        if (kept)
            return;
    }
    fg_host_release((uint64_t)p, rounded);
    munmap(p, rounded);
}

/* ---------------------------------------------------------------- host RAM of device data */
/* Device data costs host RAM only in the pages a copy or fill wrote. Those pages are kept as a
 * sorted set of disjoint, non-adjacent spans (page-aligned byte ranges; no system call on the
 * copy path), removed when the pages are given back (munmap, MADV_DONTNEED, a VMM unmap), so
 * that past VRAMSHIM_FAKEGPU_HOST_BYTES a copy is dropped rather than the program OOM-killed.
 * Pages of freed mappings kept for reuse stay in the set: they still hold host RAM. */
struct span {
    uint64_t start, end;
};
static pthread_mutex_t host_lock = PTHREAD_MUTEX_INITIALIZER;
static struct span *spans;
static size_t span_count, span_capacity;
static uint64_t host_written; /* bytes the spans cover */
static int host_warned;
pthread_mutex_t *fg_host_lock(void) { return &host_lock; }

/* Index of the first span that ends after addr. */
static size_t first_span_after(uint64_t addr)
{
    size_t lo = 0, hi = span_count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (spans[mid].end <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Bytes of [start, end) that no span covers. */
static uint64_t uncovered(uint64_t start, uint64_t end)
{
    uint64_t covered = 0;
    for (size_t i = first_span_after(start); i < span_count && spans[i].start < end; i++) {
        uint64_t lo = spans[i].start > start ? spans[i].start : start;
        uint64_t hi = spans[i].end < end ? spans[i].end : end;
        covered += hi - lo;
    }
    return end - start - covered;
}

/* Room for one more span. */
static bool span_room(void)
{
    if (span_count < span_capacity)
        return true;
    size_t capacity = span_capacity ? span_capacity * 2 : 256;
    struct span *grown = realloc(spans, capacity * sizeof *spans);
    if (!grown)
        return false;
    spans = grown;
    span_capacity = capacity;
    return true;
}

/* Adds [start, end), merging the spans it overlaps or touches. False: no memory for it. */
static bool cover(uint64_t start, uint64_t end)
{
    size_t first = first_span_after(start ? start - 1 : 0), last = first;
    while (last < span_count && spans[last].start <= end)
        last++;
    if (first == last) { /* a new span at first */
        if (!span_room())
            return false;
        memmove(spans + first + 1, spans + first, (span_count - first) * sizeof *spans);
        spans[first] = (struct span){start, end};
        span_count++;
        return true;
    }
    if (spans[first].start < start)
        start = spans[first].start;
    if (spans[last - 1].end > end)
        end = spans[last - 1].end;
    spans[first] = (struct span){start, end};
    memmove(spans + first + 1, spans + last, (span_count - last) * sizeof *spans);
    span_count -= last - first - 1;
    return true;
}

void fg_host_release(uint64_t p, uint64_t size)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t start = p / page * page, end = page_round(p + size);
    if (size == 0)
        return;
    pthread_mutex_lock(&host_lock);
    size_t i = first_span_after(start);
    while (i < span_count && spans[i].start < end) {
        if (spans[i].start < start && spans[i].end > end && !span_room())
            break; /* no memory to split the span: it stays counted (never a crash) */
        struct span *s = &spans[i];
        uint64_t lo = s->start > start ? s->start : start, hi = s->end < end ? s->end : end;
        host_written -= hi - lo;
        if (s->start < start && s->end > end) { /* split in two */
            memmove(s + 2, s + 1, (span_count - i - 1) * sizeof *spans);
            span_count++;
            spans[i + 1] = (struct span){end, s->end};
            s->end = start;
            break;
        }
        if (s->start < start) {
            s->end = start;
            i++;
        } else if (s->end > end) {
            s->start = end;
            break;
        } else {
            memmove(s, s + 1, (span_count - i - 1) * sizeof *spans);
            span_count--;
        }
    }
    pthread_mutex_unlock(&host_lock);
}

/* Whether a write of [dst, dst + n) into device memory may keep its data: the pages it adds
 * are counted if they fit under the bound. No: one warning line per process. */
static bool host_admit(uint64_t dst, size_t n)
{
    struct fg_alloc a;
    if (n == 0 || !fg_lookup(dst, &a) || a.kind == FG_HOST || a.kind == FG_REGISTERED)
        return true; /* host memory: the program's own */
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t start = dst / page * page, end = page_round(dst + n);
    uint64_t bound = fg_config()->host_bytes;
    bool fits;
    pthread_mutex_lock(&host_lock);
    uint64_t added = uncovered(start, end);
    fits = added <= bound && host_written <= bound - added;
    if (fits && added) {
        fits = cover(start, end);
        if (fits)
            host_written += added;
    }
    pthread_mutex_unlock(&host_lock);
    if (!fits && !__atomic_exchange_n(&host_warned, 1, __ATOMIC_RELAXED))
        fprintf(stderr,
                "vramshim fakegpu: device data past VRAMSHIM_FAKEGPU_HOST_BYTES=%llu bytes of host "
                "RAM is dropped: copies beyond it read back as zeros\n",
                fg_config()->host_bytes);
    return fits;
}

void fg_host_each_written(uint64_t start, uint64_t end, void (*fn)(uint64_t, uint64_t, void *),
                          void *arg)
{
    pthread_mutex_lock(&host_lock);
    for (size_t i = first_span_after(start); i < span_count && spans[i].start < end; i++)
        fn(spans[i].start > start ? spans[i].start : start, spans[i].end < end ? spans[i].end : end,
           arg);
    pthread_mutex_unlock(&host_lock);
}

/* ---------------------------------------------------------------- device memory */
static CUresult device_alloc(uint64_t size, enum fg_kind kind, CUdeviceptr *out)
{
    int dev;
    CUresult rc = fg_current_device(&dev);
    if (rc)
        return rc;
    if (!out || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fg_charge(dev, size) && !(fg_pools_trim_device(dev) && fg_charge(dev, size)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = fg_map(size);
    struct fg_alloc a = {.base = (uint64_t)p, .size = size, .kind = kind, .device = dev,
                         .charged = size};
    if (!p || !fg_register(&a)) {
        if (p)
            fg_unmap(p, size);
        fg_uncharge(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = (CUdeviceptr)p;
    return CUDA_SUCCESS;
}

static CUresult device_free(CUdeviceptr p)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (p == 0)
        return CUDA_SUCCESS;
    struct fg_alloc a;
    if (!fg_unregister(p, FG_DEVICE, &a) && !fg_unregister(p, FG_MANAGED, &a)) {
        CUresult rc;
        if (fg_pool_free_imported(p, &rc))
            return rc; /* another process's pool memory (cuMemPoolImportPointer) */
        return fg_graph_mem_free(p); /* a graph's allocation may be freed outside it */
    }
    if (a.shared)
        fg_ipc_unexport(a.base, a.size);
    fg_unmap((void *)a.base, a.size);
    fg_uncharge(a.device, a.charged);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    return device_alloc(bytesize, FG_DEVICE, dptr);
}

FG_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { return device_free(dptr); }

FG_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    return device_alloc(bytesize, FG_MANAGED, dptr);
}

FG_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                      size_t height, unsigned int element_size)
{
    if (!pitch || width == 0 || height == 0 ||
        (element_size != 4 && element_size != 8 && element_size != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t rounded = (width + 511) / 512 * 512;
    CUresult rc = device_alloc((uint64_t)rounded * height, FG_DEVICE, dptr);
    if (rc == CUDA_SUCCESS)
        *pitch = rounded;
    return rc;
}

FG_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    int dev;
    CUresult rc = fg_current_device(&dev);
    if (rc)
        return rc;
    if (!free_bytes || !total_bytes)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fg_devices[dev].lock);
    unsigned long long used = fg_device_used(dev), capacity = fg_device_capacity(dev);
    *total_bytes = capacity;
    *free_bytes = used < capacity ? capacity - used : 0;
    pthread_mutex_unlock(&fg_devices[dev].lock);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
    struct fg_alloc a;
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!fg_lookup(p, &a) || a.kind == FG_HOST || a.kind == FG_REGISTERED)
        return CUDA_ERROR_NOT_FOUND;
    if (base)
        *base = a.base;
    if (size)
        *size = a.size;
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- host memory */
static CUresult host_alloc(void **pp, size_t size)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pp)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = fg_map(size);
    int dev = 0;
    fg_current_device(&dev);
    struct fg_alloc a = {.base = (uint64_t)p, .size = size, .kind = FG_HOST, .device = dev};
    if (!p || !fg_register(&a)) {
        if (p)
            fg_unmap(p, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) { return host_alloc(pp, bytesize); }

FG_EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags)
{
    return host_alloc(pp, bytesize);
}

FG_EXPORT CUresult cuMemFreeHost(void *p)
{
    struct fg_alloc a;
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!fg_unregister((uint64_t)p, FG_HOST, &a))
        return CUDA_ERROR_INVALID_VALUE;
    fg_unmap(p, a.size);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dptr, void *p, unsigned int flags)
{
    struct fg_alloc a;
    if (!dptr || !fg_lookup((uint64_t)p, &a) || (a.kind != FG_HOST && a.kind != FG_REGISTERED))
        return CUDA_ERROR_INVALID_VALUE;
    *dptr = (CUdeviceptr)p;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemHostGetFlags(unsigned int *flags, void *p)
{
    struct fg_alloc a;
    if (!flags || !fg_lookup((uint64_t)p, &a) || (a.kind != FG_HOST && a.kind != FG_REGISTERED))
        return CUDA_ERROR_INVALID_VALUE;
    *flags = 0;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags)
{
    struct fg_alloc existing;
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!p || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (fg_lookup((uint64_t)p, &existing))
        return 712; /* CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED */
    struct fg_alloc a = {.base = (uint64_t)p, .size = bytesize, .kind = FG_REGISTERED};
    return fg_register(&a) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

FG_EXPORT CUresult cuMemHostUnregister(void *p)
{
    struct fg_alloc a;
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    return fg_unregister((uint64_t)p, FG_REGISTERED, &a) ? CUDA_SUCCESS
                                                         : 713; /* ..._NOT_REGISTERED */
}

/* ---------------------------------------------------------------- copies and sets */
/* Device addresses are host mappings, so a copy is a memcpy once both ranges are known to be
 * inside live memory (an unregistered address is taken to be pageable host memory). A range
 * in VMM memory may run on through the next mappings of a reserved range, as on a GPU:
 * PyTorch's expandable segments map one reservation chunk by chunk and place tensors across
 * the chunks' boundaries. */
static CUresult check_range(uint64_t p, size_t n)
{
    struct fg_alloc a;
    if (n == 0)
        return CUDA_SUCCESS;
    if (p == 0 || p + n < p)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fg_lookup(p, &a))
        return CUDA_SUCCESS;
    while (a.base + a.size < p + n) {
        uint64_t next = a.base + a.size;
        if (a.kind != FG_MAPPED || !fg_lookup(next, &a) || a.base != next || a.kind != FG_MAPPED)
            return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

static CUresult zero_fill(uint64_t dst, size_t n);

/* A copy into device memory past the host RAM bound becomes a zero fill of its destination. */
static CUresult copy(uint64_t dst, uint64_t src, size_t n)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = check_range(dst, n);
    if (!rc)
        rc = check_range(src, n);
    if (rc || n == 0)
        return rc;
    if (!host_admit(dst, n))
        return zero_fill(dst, n);
    memmove((void *)dst, (const void *)src, n);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) { return copy(dst, src, n); }
/* A copy on a stream: at once, or a node of the stream's capture (its ranges checked now). */
static CUresult copy_on(uint64_t dst, uint64_t src, size_t n, CUstream s)
{
    struct fg_op op = {.type = FG_OP_COPY, .dst = dst, .src = src, .bytes = n};
    CUresult rc = fg_initialized() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
    if (!rc)
        rc = check_range(dst, n);
    if (!rc)
        rc = check_range(src, n);
    if (rc || fg_capture_op(s, &op, &rc))
        return rc;
    return copy(dst, src, n);
}

CUresult fg_copy(uint64_t dst, uint64_t src, size_t n) { return copy(dst, src, n); }

FG_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    return copy_on(dst, src, n, s);
}
FG_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    return copy(dst, (uint64_t)src, n);
}
FG_EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    return copy((uint64_t)dst, src, n);
}
FG_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return copy(dst, src, n);
}
FG_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    return copy_on(dst, (uint64_t)src, n, s);
}
FG_EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    return copy_on((uint64_t)dst, src, n, s);
}
FG_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    return copy_on(dst, src, n, s);
}
FG_EXPORT CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc,
                                size_t n)
{
    return copy(dst, src, n);
}
FG_EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc,
                                     size_t n, CUstream s)
{
    return copy_on(dst, src, n, s);
}

/* Gives the pages [first, last) back, A being the entry at FIRST; the range may run on through
 * the next VMM mappings. Pages shared with another process (IPC) live in a memory file:
 * MADV_DONTNEED would only drop this mapping of them and read the old bytes back, MADV_REMOVE
 * frees them. */
static bool give_back(uint64_t first, uint64_t last, const struct fg_alloc *a)
{
    struct fg_alloc m = *a;
    for (uint64_t at = first; at < last;) {
        uint64_t end = m.kind == FG_MAPPED && m.base + m.size < last ? m.base + m.size : last;
        if (madvise((void *)at, end - at, m.shared ? MADV_REMOVE : MADV_DONTNEED) != 0)
            return false;
        at = end;
        if (at < last && !fg_lookup(at, &m))
            return false;
    }
    return true;
}

/* Zero fills of whole pages give the pages back instead of writing them, so a large memset
 * costs no host RAM. The range is known to be valid. */
static CUresult zero_fill(uint64_t dst, size_t n)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t first = (dst + page - 1) / page * page, last = (dst + n) / page * page;
    struct fg_alloc a;
    if (last > first && fg_lookup(dst, &a) && a.kind != FG_REGISTERED && a.kind != FG_HOST) {
        fg_host_release(first, last - first);
        if (give_back(first, last, &a)) {
            memset((void *)dst, 0, first - dst);
            memset((void *)last, 0, dst + n - last);
            return CUDA_SUCCESS;
        }
    }
    memset((void *)dst, 0, n);
    return CUDA_SUCCESS;
}

/* A fill with a value other than zero writes its pages, so past the host RAM bound it becomes
 * a zero fill. */
static CUresult set(uint64_t dst, unsigned value, size_t elem, size_t count)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    size_t n = elem * count;
    CUresult rc = check_range(dst, n);
    if (rc || n == 0)
        return rc;
    unsigned char *p = (unsigned char *)dst;
    if (value == 0 || !host_admit(dst, n))
        return zero_fill(dst, n);
    for (size_t i = 0; i < count; i++) {
        if (elem == 1)
            p[i] = (unsigned char)value;
        else if (elem == 2)
            ((uint16_t *)p)[i] = (uint16_t)value;
        else
            ((uint32_t *)p)[i] = value;
    }
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { return set(d, v, 1, n); }
FG_EXPORT CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) { return set(d, v, 2, n); }
FG_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) { return set(d, v, 4, n); }
CUresult fg_set(uint64_t dst, unsigned value, size_t element, size_t count)
{
    return set(dst, value, element, count);
}

/* A fill on a stream: at once, or a node of the stream's capture (its range checked now). */
static CUresult set_on(uint64_t dst, unsigned value, size_t element, size_t count, CUstream s)
{
    struct fg_op op = {.type = FG_OP_SET, .dst = dst, .value = value, .element = element,
                       .count = count};
    CUresult rc = fg_initialized() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
    if (!rc)
        rc = check_range(dst, element * count);
    if (rc || fg_capture_op(s, &op, &rc))
        return rc;
    return set(dst, value, element, count);
}

FG_EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s)
{
    return set_on(d, v, 1, n, s);
}
FG_EXPORT CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s)
{
    return set_on(d, v, 2, n, s);
}
FG_EXPORT CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s)
{
    return set_on(d, v, 4, n, s);
}

FG_EXPORT CUresult cuMemPrefetchAsync_v2(CUdeviceptr p, size_t n, CUmemLocation loc,
                                         unsigned int flags, CUstream s)
{
    return check_range(p, n);
}
FG_EXPORT CUresult cuMemAdvise_v2(CUdeviceptr p, size_t n, int advice, CUmemLocation loc)
{
    return check_range(p, n);
}

/* ---------------------------------------------------------------- pointer attributes */
static CUresult pointer_attribute(void *data, int attribute, CUdeviceptr p)
{
    struct fg_alloc a;
    bool known = fg_lookup(p, &a);
    bool device = known && a.kind != FG_HOST && a.kind != FG_REGISTERED;
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        if (!known)
            return CUDA_ERROR_INVALID_VALUE;
        *(CUcontext *)data = &fg_devices[a.device].primary;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        if (!known)
            return CUDA_ERROR_INVALID_VALUE;
        *(unsigned *)data = device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (!known)
            return CUDA_ERROR_INVALID_VALUE;
        *(CUdeviceptr *)data = p;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
        *(int *)data = 1;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        if (!known)
            return CUDA_ERROR_INVALID_VALUE;
        *(unsigned long long *)data = a.id;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(int *)data = known && a.kind == FG_MANAGED;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        if (!known)
            return CUDA_ERROR_INVALID_VALUE;
        *(int *)data = a.device;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        if (!known)
            return CUDA_ERROR_INVALID_VALUE;
        *(CUdeviceptr *)data = a.base;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        if (!known)
            return CUDA_ERROR_INVALID_VALUE;
        *(size_t *)data = a.size;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(int *)data = known;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        /* Pool memory, or another process's imported into a pool (cuMemPoolImportPointer). */
        *(CUmemoryPool *)data = known && (a.kind == FG_POOL || a.kind == FG_IPC) ? a.pool : NULL;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_NOT_SUPPORTED;
    }
}

FG_EXPORT CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr p)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    return pointer_attribute(data, attribute, p);
}

/* Unlike cuPointerGetAttribute, unknown pointers and attributes leave the value unset and
 * succeed (NVIDIA documents this for host pointers the driver does not know). */
FG_EXPORT CUresult cuPointerGetAttributes(unsigned int n, int *attributes, void **data,
                                          CUdeviceptr p)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!attributes || !data)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++) {
        if (!data[i])
            continue;
        CUresult rc = pointer_attribute(data[i], attributes[i], p);
        if (rc == CUDA_ERROR_INVALID_VALUE && attributes[i] == CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
            *(unsigned *)data[i] = 0;
        else if (rc == CUDA_ERROR_INVALID_VALUE && attributes[i] == CU_POINTER_ATTRIBUTE_CONTEXT)
            *(CUcontext *)data[i] = NULL;
        else if (rc == CUDA_ERROR_INVALID_VALUE && attributes[i] == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
            *(int *)data[i] = -2;
    }
    return CUDA_SUCCESS;
}

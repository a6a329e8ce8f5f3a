/*
 * fakecuda: a fake libcuda.so.1 for the vramshim tests (no GPU needed).
 *
 * Exports the real driver's symbol names and ABIs (cuMemAlloc_v2, the legacy
 * 32-bit cuMemAlloc, cuMemAllocAsync_ptsz, cuGetProcAddress_v2, ...), hands out
 * fake device addresses from a per-device address range, enforces a
 * configurable per-device capacity, and resolves (base name, version, flags)
 * through cuGetProcAddress like the real driver does.  Link with
 * -Wl,-Bsymbolic so that internal references and resolver results are this
 * library's own definitions even when a preload exports the same names.
 *
 * Environment:
 *   FAKECUDA_MEM        per-device capacity: bytes with optional K/M/G/T suffix
 *                       (binary), default 80G; "unlimited" disables accounting.
 *   FAKECUDA_NO_DEVICE  "1": cuInit returns CUDA_ERROR_NO_DEVICE.
 *   FAKECUDA_FAIL_SIZE  bytes (same syntax as FAKECUDA_MEM): every charged
 *                       allocation of exactly this many bytes fails with
 *                       CUDA_ERROR_OUT_OF_MEMORY whatever the free memory, like
 *                       a fragmented device or an allocator limit would; unset
 *                       or 0: off.  Also with FAKECUDA_MEM=unlimited.  An
 *                       invalid value makes cuInit return CUDA_ERROR_INVALID_VALUE.
 *   VRAMSHIM_FAKEGPU_MEMORY  `vramshim dryrun`'s name for the capacity; wins
 *                       over FAKECUDA_MEM.
 *   VRAMSHIM_FAKEGPU_COUNT  devices, 1 to NDEV (4); default 2.
 *   VRAMSHIM_FAKEGPU_CONTEXT_BYTES  device memory a context takes: charged at a
 *                       device's first cuDevicePrimaryCtxRetain (the primary
 *                       context is never destroyed) and by cuCtxCreate (given
 *                       back by cuCtxDestroy); default 0.
 *   VRAMSHIM_FAKEGPU_NAME  the name cuDeviceGetName reports.
 *                       An invalid count or size makes cuInit return
 *                       CUDA_ERROR_INVALID_VALUE.
 *   FAKECUDA_STALL_SIZE bytes (same syntax): a cuMemAlloc_v2 of exactly this many
 *                       bytes waits inside the driver until the program calls
 *                       fakecuda_stall_release() (fakecuda_stall_wait() returns
 *                       once a thread waits there), so a test can hold a thread
 *                       inside a hooked call for as long as it needs.
 *
 * The library never prints.
 */
#define _GNU_SOURCE
#define __CUDA_API_VERSION_INTERNAL 1
#include "cuda.h"

#include <ctype.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define CACHELINE 128 /* two lines: keeps the adjacent-line prefetcher out of it */

#define NDEV 4 /* devices there is room for; VRAMSHIM_FAKEGPU_COUNT picks how many exist */
#define DEFAULT_DEVICES 2
#define NSHARDS 64
#define DEV_BASE 0x700000000000ULL
#define DEV_SPAN 0x10000000000ULL /* 1 TiB per device */
#define SHARD_SPAN (DEV_SPAN / NSHARDS) /* 16 GiB per shard */
#define LEGACY_BASE 0x10000000ULL /* 32-bit addresses for the v1 entry points */
#define LEGACY_SPAN 0x20000000ULL /* 512 MiB per device: NDEV of them stay below 4 GiB */
#define VMM_BASE 0x600000000000ULL
#define VMM_LIMIT 0x700000000000ULL
#define ADDR_ALIGN 512ULL
#define GRANULARITY (2ULL << 20)
#define DEFAULT_CAPACITY (80ULL << 30)
#define DRIVER_VERSION 12080

#define CTX_MAGIC 0xC7C7C7C7u
#define STREAM_MAGIC 0x57AE57AEu
#define POOL_MAGIC 0x9001900Fu
#define ARRAY_MAGIC 0xA77A0001u
#define MIPMAP_MAGIC 0xA77A0002u
#define DEAD_MAGIC 0xDEADDEADu

/* ------------------------------------------------------------------------- */
/* Configuration (written once in cuInit, read-only afterwards)              */
/* ------------------------------------------------------------------------- */

static struct {
    CUresult init_result;
    bool unlimited;
    unsigned long long capacity;
    unsigned long long fail_size; /* FAKECUDA_FAIL_SIZE; 0 = off */
    int devices;                     /* VRAMSHIM_FAKEGPU_COUNT */
    unsigned long long context_bytes; /* VRAMSHIM_FAKEGPU_CONTEXT_BYTES */
    const char *name;                /* VRAMSHIM_FAKEGPU_NAME; NULL = "Fake CUDA Device N" */
    unsigned long long stall_size; /* FAKECUDA_STALL_SIZE; 0 = off */
} g_cfg __attribute__((aligned(CACHELINE)));

static atomic_int g_initialized __attribute__((aligned(CACHELINE)));
static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;

/* Round-robin shard assignment: touched once per thread. */
static atomic_uint g_shard_rr __attribute__((aligned(CACHELINE)));

struct devacct {
    _Atomic unsigned long long used;
} __attribute__((aligned(CACHELINE)));
static struct devacct g_acct[NDEV];

/* ------------------------------------------------------------------------- */
/* Contexts, streams, pools                                                   */
/* ------------------------------------------------------------------------- */

struct CUctx_st {
    unsigned magic;
    int dev;
    int primary;
};

/* Read-only after load: the hot path reads magic/dev of the current context. */
static struct CUctx_st g_primary[NDEV] __attribute__((aligned(CACHELINE))) = {
    {CTX_MAGIC, 0, 1},
    {CTX_MAGIC, 1, 1},
    {CTX_MAGIC, 2, 1},
    {CTX_MAGIC, 3, 1},
};
struct refcount {
    atomic_int n;
} __attribute__((aligned(CACHELINE)));
static struct refcount g_primary_refs[NDEV];
/* Whether a device's primary context has been charged its context bytes (never released). */
static atomic_int g_primary_charged[NDEV];

static __thread struct CUctx_st *t_ctx;
static __thread int t_shard = -1;

struct CUstream_st {
    unsigned magic;
    unsigned flags;
    struct CUctx_st *ctx;
};

struct CUmemPoolHandle_st {
    unsigned magic;
    int dev;
    int is_default;
};
static struct CUmemPoolHandle_st g_default_pool[NDEV] = {
    {POOL_MAGIC, 0, 1},
    {POOL_MAGIC, 1, 1},
    {POOL_MAGIC, 2, 1},
    {POOL_MAGIC, 3, 1},
};

/* ------------------------------------------------------------------------- */
/* Hash map of nodes keyed by a 64-bit value                                  */
/* ------------------------------------------------------------------------- */

struct node {
    uint64_t key;
    union {
        struct {
            uint64_t rsize;   /* live allocation: rounded size (address spacing) */
            uint64_t charged; /* live allocation: bytes charged to the device */
        };
        struct {
            struct node *stack; /* size class: LIFO of freed ranges */
            uint64_t unused;
        };
    };
    struct node *next;
};

struct map {
    struct node **b;
    unsigned bits;
    size_t n;
};

static inline size_t map_hash(uint64_t key, unsigned bits)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> (64 - bits));
}

static bool map_grow(struct map *m)
{
    unsigned nbits = m->bits ? m->bits + 1 : 10;
    size_t nb = (size_t)1 << nbits;
    size_t bytes = nb * sizeof(struct node *);
    struct node **t = aligned_alloc(CACHELINE, bytes);
    if (!t)
        return false;
    memset(t, 0, bytes);
    if (m->b) {
        for (size_t i = 0; i < ((size_t)1 << m->bits); i++) {
            struct node *e = m->b[i];
            while (e) {
                struct node *nx = e->next;
                size_t h = map_hash(e->key, nbits);
                e->next = t[h];
                t[h] = e;
                e = nx;
            }
        }
        free(m->b);
    }
    m->b = t;
    m->bits = nbits;
    return true;
}

static struct node *map_find(const struct map *m, uint64_t key)
{
    if (!m->b)
        return NULL;
    for (struct node *e = m->b[map_hash(key, m->bits)]; e; e = e->next)
        if (e->key == key)
            return e;
    return NULL;
}

/* Caller guarantees the key is not present. */
static bool map_insert(struct map *m, struct node *e)
{
    if (!m->b || m->n >= ((size_t)1 << m->bits)) {
        if (!map_grow(m) && !m->b)
            return false;
    }
    size_t h = map_hash(e->key, m->bits);
    e->next = m->b[h];
    m->b[h] = e;
    m->n++;
    return true;
}

static struct node *map_remove(struct map *m, uint64_t key)
{
    if (!m->b)
        return NULL;
    struct node **pp = &m->b[map_hash(key, m->bits)];
    for (struct node *e = *pp; e; pp = &e->next, e = e->next) {
        if (e->key == key) {
            *pp = e->next;
            e->next = NULL;
            m->n--;
            return e;
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------------- */
/* Address shards                                                             */
/* ------------------------------------------------------------------------- */

struct shard {
    pthread_mutex_t lock;
    uint64_t base, limit, bump;
    struct map live;    /* addr -> allocation node */
    struct map classes; /* rounded size -> size class (stack of freed nodes) */
    struct node *spare; /* node slab free list */
    int dev;
    bool ready;
} __attribute__((aligned(CACHELINE)));

static struct shard g_shards[NDEV][NSHARDS];
static struct shard g_legacy[NDEV];

static void shard_setup(struct shard *s, int dev, uint64_t base, uint64_t span)
{
    pthread_mutex_init(&s->lock, NULL);
    s->base = base;
    s->bump = base;
    s->limit = base + span;
    s->dev = dev;
    s->ready = true;
}

/* Nodes come from per-shard slabs so that two threads never write one line. */
static struct node *shard_node(struct shard *s)
{
    if (!s->spare) {
        enum { N = 64 };
        struct node *blk = aligned_alloc(CACHELINE, N * sizeof(struct node));
        if (!blk)
            return NULL;
        for (int i = 0; i < N; i++) {
            blk[i].next = s->spare;
            s->spare = &blk[i];
        }
    }
    struct node *n = s->spare;
    s->spare = n->next;
    memset(n, 0, sizeof *n);
    return n;
}

static void shard_unnode(struct shard *s, struct node *n)
{
    n->next = s->spare;
    s->spare = n;
}

static bool shard_alloc(struct shard *s, uint64_t rsize, uint64_t charged, CUdeviceptr *out)
{
    bool ok = false;
    pthread_mutex_lock(&s->lock);
    struct node *n = NULL;
    struct node *cls = map_find(&s->classes, rsize);
    if (cls && cls->stack) {
        n = cls->stack;
        cls->stack = n->next;
        n->next = NULL;
    } else if (s->limit - s->bump >= rsize) {
        n = shard_node(s);
        if (n) {
            n->key = s->bump;
            s->bump += rsize;
        }
    }
    if (n) {
        n->rsize = rsize;
        n->charged = charged;
        if (map_insert(&s->live, n)) {
            *out = n->key;
            ok = true;
        } else {
            /* Could not index it: give the range back to its size class. */
            if (cls || (cls = shard_node(s))) {
                if (!cls->key) {
                    cls->key = rsize;
                    if (!map_insert(&s->classes, cls)) {
                        shard_unnode(s, cls);
                        cls = NULL;
                    }
                }
            }
            if (cls) {
                n->next = cls->stack;
                cls->stack = n;
            }
        }
    }
    pthread_mutex_unlock(&s->lock);
    return ok;
}

/* Returns false if addr is not a live allocation of this shard. */
static bool shard_free(struct shard *s, uint64_t addr, uint64_t *charged)
{
    pthread_mutex_lock(&s->lock);
    struct node *n = map_remove(&s->live, addr);
    if (!n) {
        pthread_mutex_unlock(&s->lock);
        return false;
    }
    *charged = n->charged;
    struct node *cls = map_find(&s->classes, n->rsize);
    if (!cls) {
        cls = shard_node(s);
        if (cls) {
            cls->key = n->rsize;
            if (!map_insert(&s->classes, cls)) {
                shard_unnode(s, cls);
                cls = NULL;
            }
        }
    }
    if (cls) {
        n->next = cls->stack;
        cls->stack = n;
    }
    /* else: the range is lost (out of host memory); harmless for a fake. */
    pthread_mutex_unlock(&s->lock);
    return true;
}

static struct shard *owner_shard(uint64_t addr)
{
    if (addr >= DEV_BASE && addr < DEV_BASE + NDEV * DEV_SPAN) {
        uint64_t off = addr - DEV_BASE;
        return &g_shards[off / DEV_SPAN][(off % DEV_SPAN) / SHARD_SPAN];
    }
    if (addr >= LEGACY_BASE && addr < LEGACY_BASE + NDEV * LEGACY_SPAN)
        return &g_legacy[(addr - LEGACY_BASE) / LEGACY_SPAN];
    return NULL;
}

static inline int my_shard(void)
{
    int s = t_shard;
    if (s < 0) {
        s = (int)(atomic_fetch_add_explicit(&g_shard_rr, 1, memory_order_relaxed) % NSHARDS);
        t_shard = s;
    }
    return s;
}

/* ------------------------------------------------------------------------- */
/* Accounting                                                                 */
/* ------------------------------------------------------------------------- */

static bool charge(int dev, uint64_t n)
{
    if (g_cfg.fail_size && n == g_cfg.fail_size)
        return false;
    if (g_cfg.unlimited)
        return true;
    unsigned long long cap = g_cfg.capacity;
    unsigned long long cur = atomic_load_explicit(&g_acct[dev].used, memory_order_relaxed);
    do {
        if (n > cap || cur > cap - n)
            return false;
    } while (!atomic_compare_exchange_weak_explicit(&g_acct[dev].used, &cur, cur + n,
                                                    memory_order_relaxed, memory_order_relaxed));
    return true;
}

static void uncharge(int dev, uint64_t n)
{
    if (g_cfg.unlimited)
        return;
    atomic_fetch_sub_explicit(&g_acct[dev].used, n, memory_order_relaxed);
}

/* ------------------------------------------------------------------------- */
/* Misc registries (host memory, arrays, VMM): rare, one lock each            */
/* ------------------------------------------------------------------------- */

static pthread_mutex_t g_host_lock = PTHREAD_MUTEX_INITIALIZER;
static struct map g_host_allocs;     /* ptr -> size */
static struct map g_host_registered; /* ptr -> size */

static pthread_mutex_t g_array_lock = PTHREAD_MUTEX_INITIALIZER;
static struct map g_arrays; /* handle -> (node only used as registry entry) */

struct fake_array {
    unsigned magic;
    int dev;
    uint64_t bytes;
};

struct reservation {
    uint64_t base, size;
    struct reservation *next;
};
struct phys {
    CUmemGenericAllocationHandle handle;
    int dev;
    bool released;
    uint64_t size;
    unsigned long maps;
    struct phys *next;
};
struct mapping {
    uint64_t va, size;
    struct phys *phys;
    struct mapping *next;
};
static pthread_mutex_t g_vmm_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_vmm_bump = VMM_BASE;
static CUmemGenericAllocationHandle g_next_handle = 0x1000;
static struct reservation *g_reservations;
static struct phys *g_phys;
static struct mapping *g_mappings;

/* ------------------------------------------------------------------------- */
/* Initialization                                                             */
/* ------------------------------------------------------------------------- */

static void atfork_prepare(void)
{
    pthread_mutex_lock(&g_vmm_lock);
    pthread_mutex_lock(&g_array_lock);
    pthread_mutex_lock(&g_host_lock);
    for (int d = 0; d < NDEV; d++) {
        pthread_mutex_lock(&g_legacy[d].lock);
        for (int s = 0; s < NSHARDS; s++)
            pthread_mutex_lock(&g_shards[d][s].lock);
    }
}

static void atfork_release(void)
{
    for (int d = NDEV - 1; d >= 0; d--) {
        for (int s = NSHARDS - 1; s >= 0; s--)
            pthread_mutex_unlock(&g_shards[d][s].lock);
        pthread_mutex_unlock(&g_legacy[d].lock);
    }
    pthread_mutex_unlock(&g_host_lock);
    pthread_mutex_unlock(&g_array_lock);
    pthread_mutex_unlock(&g_vmm_lock);
}

/* Parses "<digits>[K|M|G|T][B|iB]" (binary multiples). */
static bool parse_size(const char *s, unsigned long long *out)
{
    if (!s || !isdigit((unsigned char)*s))
        return false;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case 'K': shift = 10; end++; break;
    case 'M': shift = 20; end++; break;
    case 'G': shift = 30; end++; break;
    case 'T': shift = 40; end++; break;
    default: break;
    }
    if (shift && (*end == 'i' || *end == 'I'))
        end++;
    if (shift && (*end == 'b' || *end == 'B'))
        end++;
    if (*end != '\0')
        return false;
    if (shift && v > (~0ULL >> shift))
        return false;
    *out = v << shift;
    return true;
}

static void init_once(void)
{
    const char *nodev = getenv("FAKECUDA_NO_DEVICE");
    if (nodev && strcmp(nodev, "1") == 0) {
        g_cfg.init_result = CUDA_ERROR_NO_DEVICE;
        return;
    }
    const char *mem = getenv("VRAMSHIM_FAKEGPU_MEMORY");
    if (!mem || !*mem)
        mem = getenv("FAKECUDA_MEM");
    g_cfg.capacity = DEFAULT_CAPACITY;
    if (mem && *mem) {
        if (strcasecmp(mem, "unlimited") == 0) {
            g_cfg.unlimited = true;
        } else if (!parse_size(mem, &g_cfg.capacity)) {
            g_cfg.init_result = CUDA_ERROR_INVALID_VALUE;
            return;
        }
    }
    const char *fail = getenv("FAKECUDA_FAIL_SIZE");
    if (fail && *fail && !parse_size(fail, &g_cfg.fail_size)) {
        g_cfg.init_result = CUDA_ERROR_INVALID_VALUE;
        return;
    }
    g_cfg.devices = DEFAULT_DEVICES;
    const char *count = getenv("VRAMSHIM_FAKEGPU_COUNT");
    if (count && *count) {
        unsigned long long n;
        if (!parse_size(count, &n) || n < 1 || n > NDEV) {
            g_cfg.init_result = CUDA_ERROR_INVALID_VALUE;
            return;
        }
        g_cfg.devices = (int)n;
    }
    const char *context = getenv("VRAMSHIM_FAKEGPU_CONTEXT_BYTES");
    if (context && *context && !parse_size(context, &g_cfg.context_bytes)) {
        g_cfg.init_result = CUDA_ERROR_INVALID_VALUE;
        return;
    }
    const char *name = getenv("VRAMSHIM_FAKEGPU_NAME");
    g_cfg.name = name && *name ? name : NULL;
    const char *stall = getenv("FAKECUDA_STALL_SIZE");
    if (stall && *stall && !parse_size(stall, &g_cfg.stall_size)) {
        g_cfg.init_result = CUDA_ERROR_INVALID_VALUE;
        return;
    }
    for (int d = 0; d < NDEV; d++) {
        for (int s = 0; s < NSHARDS; s++)
            shard_setup(&g_shards[d][s], d, DEV_BASE + d * DEV_SPAN + s * SHARD_SPAN, SHARD_SPAN);
        shard_setup(&g_legacy[d], d, LEGACY_BASE + d * LEGACY_SPAN, LEGACY_SPAN);
    }
    pthread_atfork(atfork_prepare, atfork_release, atfork_release);
    g_cfg.init_result = CUDA_SUCCESS;
    atomic_store_explicit(&g_initialized, 1, memory_order_release);
}

static inline bool initialized(void)
{
    return atomic_load_explicit(&g_initialized, memory_order_acquire) != 0;
}

/* Current context check shared by every memory call. */
static inline CUresult need_ctx(struct CUctx_st **out)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    struct CUctx_st *c = t_ctx;
    if (!c || c->magic != CTX_MAGIC)
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = c;
    return CUDA_SUCCESS;
}

static inline bool valid_dev(int d)
{
    return d >= 0 && d < g_cfg.devices;
}

/* ------------------------------------------------------------------------- */
/* Device memory core                                                         */
/* ------------------------------------------------------------------------- */

static CUresult dev_alloc(int dev, uint64_t bytes, CUdeviceptr *out)
{
    if (!out || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (bytes > DEV_SPAN)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t rsize = (bytes + ADDR_ALIGN - 1) & ~(ADDR_ALIGN - 1);
    if (!charge(dev, bytes))
        return CUDA_ERROR_OUT_OF_MEMORY;
    int s0 = my_shard();
    for (int k = 0; k < NSHARDS; k++) {
        CUdeviceptr p;
        if (shard_alloc(&g_shards[dev][(s0 + k) % NSHARDS], rsize, bytes, &p)) {
            *out = p;
            return CUDA_SUCCESS;
        }
    }
    uncharge(dev, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult dev_free(CUdeviceptr p)
{
    struct shard *s = owner_shard(p);
    uint64_t charged;
    if (!s || !s->ready || !shard_free(s, p, &charged))
        return CUDA_ERROR_INVALID_VALUE;
    uncharge(s->dev, charged);
    return CUDA_SUCCESS;
}

static CUresult legacy_alloc(int dev, uint64_t bytes, CUdeviceptr_v1 *out)
{
    if (!out || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t rsize = (bytes + ADDR_ALIGN - 1) & ~(ADDR_ALIGN - 1);
    if (!charge(dev, bytes))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUdeviceptr p;
    if (!shard_alloc(&g_legacy[dev], rsize, bytes, &p)) {
        uncharge(dev, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = (CUdeviceptr_v1)p;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------- */
/* Initialization / device / version                                         */
/* ------------------------------------------------------------------------- */

EXPORT CUresult cuInit(unsigned int Flags)
{
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&g_init_once, init_once);
    return g_cfg.init_result;
}

EXPORT CUresult cuDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = DRIVER_VERSION;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = g_cfg.devices;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    char buf[32] = "Fake CUDA Device 0";
    buf[17] = (char)('0' + dev);
    const char *text = g_cfg.name ? g_cfg.name : buf;
    size_t n = strlen(text);
    if (n >= (size_t)len)
        n = (size_t)len - 1;
    memcpy(name, text, n);
    name[n] = '\0';
    return CUDA_SUCCESS;
}

static unsigned long long reported_total(void)
{
    return g_cfg.unlimited ? DEFAULT_CAPACITY : g_cfg.capacity;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = reported_total();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    size_t b;
    CUresult r = cuDeviceTotalMem_v2(&b, dev);
    if (r == CUDA_SUCCESS)
        *bytes = b > 0xFFFFFFFFu ? 0xFFFFFFFFu : (unsigned int)b;
    return r;
}

static const struct {
    CUresult code;
    const char *name;
    const char *text;
} g_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++) {
        if (g_errors[i].code == error) {
            *pStr = g_errors[i].text;
            return CUDA_SUCCESS;
        }
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++) {
        if (g_errors[i].code == error) {
            *pStr = g_errors[i].name;
            return CUDA_SUCCESS;
        }
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ------------------------------------------------------------------------- */
/* Contexts                                                                   */
/* ------------------------------------------------------------------------- */

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    /* The first retain creates the context: it takes its device memory once. */
    if (g_cfg.context_bytes &&
        atomic_exchange_explicit(&g_primary_charged[dev], 1, memory_order_acq_rel) == 0 &&
        !charge(dev, g_cfg.context_bytes)) {
        atomic_store_explicit(&g_primary_charged[dev], 0, memory_order_release);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    atomic_fetch_add_explicit(&g_primary_refs[dev].n, 1, memory_order_relaxed);
    *pctx = &g_primary[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    int n = atomic_load_explicit(&g_primary_refs[dev].n, memory_order_relaxed);
    while (n > 0 && !atomic_compare_exchange_weak(&g_primary_refs[dev].n, &n, n - 1)) {
    }
    /* The fake never destroys a primary context. */
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return cuDevicePrimaryCtxRelease_v2(dev);
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)flags;
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (g_cfg.context_bytes && !charge(dev, g_cfg.context_bytes))
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct CUctx_st *c = malloc(sizeof *c);
    if (!c) {
        if (g_cfg.context_bytes)
            uncharge(dev, g_cfg.context_bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    c->magic = CTX_MAGIC;
    c->dev = dev;
    c->primary = 0;
    t_ctx = c; /* the new context becomes current */
    *pctx = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return cuCtxCreate_v2(pctx, flags, dev);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx || ctx->magic != CTX_MAGIC || ctx->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    ctx->magic = DEAD_MAGIC; /* never freed: stale handles stay readable */
    if (g_cfg.context_bytes)
        uncharge(ctx->dev, g_cfg.context_bytes);
    if (t_ctx == ctx)
        t_ctx = NULL;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxDestroy(CUcontext ctx)
{
    return cuCtxDestroy_v2(ctx);
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx && ctx->magic != CTX_MAGIC)
        return CUDA_ERROR_INVALID_CONTEXT;
    t_ctx = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = t_ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *device)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = c->dev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void)
{
    struct CUctx_st *c;
    return need_ctx(&c);
}

/* ------------------------------------------------------------------------- */
/* Streams, launch                                                            */
/* ------------------------------------------------------------------------- */

static CUresult stream_check(CUstream s)
{
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        return CUDA_SUCCESS;
    if (s->magic != STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (s->ctx->magic != CTX_MAGIC)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return CUDA_SUCCESS;
}

/* Device a stream-ordered call works on: the stream's context, else current. */
static int stream_dev(CUstream s, struct CUctx_st *cur)
{
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        return cur->dev;
    return s->ctx->dev;
}

EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if (!phStream || (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = malloc(sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->magic = STREAM_MAGIC;
    s->flags = Flags;
    s->ctx = c;
    *phStream = s;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream hStream)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (hStream == NULL || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD ||
        hStream->magic != STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    hStream->magic = DEAD_MAGIC; /* never freed: a stale handle reads as invalid */
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy(CUstream hStream)
{
    return cuStreamDestroy_v2(hStream);
}

EXPORT CUresult cuStreamSynchronize(CUstream hStream)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    return stream_check(hStream);
}

EXPORT CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if ((r = stream_check(hStream)))
        return r;
    if (hStream == NULL || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD)
        *pctx = c;
    else
        *pctx = hStream->ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                               unsigned int gridDimZ, unsigned int blockDimX,
                               unsigned int blockDimY, unsigned int blockDimZ,
                               unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                               void **extra)
{
    (void)f, (void)gridDimX, (void)gridDimY, (void)gridDimZ, (void)blockDimX, (void)blockDimY;
    (void)blockDimZ, (void)sharedMemBytes, (void)kernelParams, (void)extra;
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    return stream_check(hStream);
}

/* ------------------------------------------------------------------------- */
/* Device memory                                                              */
/* ------------------------------------------------------------------------- */

/* FAKECUDA_STALL_SIZE: a thread held inside the driver until the program releases it. */
static pthread_mutex_t g_stall_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_stall_cond = PTHREAD_COND_INITIALIZER;
static int g_stalled;      /* threads waiting in stall() */
static int g_stall_opened; /* fakecuda_stall_release() was called */

static void stall(void)
{
    pthread_mutex_lock(&g_stall_lock);
    g_stalled++;
    pthread_cond_broadcast(&g_stall_cond);
    while (!g_stall_opened)
        pthread_cond_wait(&g_stall_cond, &g_stall_lock);
    g_stalled--;
    pthread_mutex_unlock(&g_stall_lock);
}

/* Test control: returns once a thread waits inside a stalled cuMemAlloc_v2. */
EXPORT void fakecuda_stall_wait(void)
{
    pthread_mutex_lock(&g_stall_lock);
    while (g_stalled == 0 && !g_stall_opened)
        pthread_cond_wait(&g_stall_cond, &g_stall_lock);
    pthread_mutex_unlock(&g_stall_lock);
}

/* Test control: lets every stalled (and later) cuMemAlloc_v2 of the stall size go on. */
EXPORT void fakecuda_stall_release(void)
{
    pthread_mutex_lock(&g_stall_lock);
    g_stall_opened = 1;
    pthread_cond_broadcast(&g_stall_cond);
    pthread_mutex_unlock(&g_stall_lock);
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if (g_cfg.stall_size && bytesize == g_cfg.stall_size)
        stall();
    return dev_alloc(c->dev, bytesize, dptr);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    return dev_free(dptr);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                   size_t Height, unsigned int ElementSizeBytes)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0 ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    if (WidthInBytes > DEV_SPAN || Height > DEV_SPAN)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t pitch = (WidthInBytes + 511) & ~(size_t)511;
    size_t total;
    if (__builtin_mul_overflow(pitch, Height, &total))
        return CUDA_ERROR_OUT_OF_MEMORY;
    if ((r = dev_alloc(c->dev, total, dptr)))
        return r;
    *pPitch = pitch;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    return dev_alloc(c->dev, bytesize, dptr);
}

/* Legacy 32-bit ABI (CUDA < 3.2). */
EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    return legacy_alloc(c->dev, bytesize, dptr);
}

EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    return cuMemFree_v2((CUdeviceptr)dptr);
}

EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch,
                                unsigned int WidthInBytes, unsigned int Height,
                                unsigned int ElementSizeBytes)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0 ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t pitch = ((uint64_t)WidthInBytes + 511) & ~(uint64_t)511;
    if (pitch > 0xFFFFFFFFu)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if ((r = legacy_alloc(c->dev, pitch * Height, dptr)))
        return r;
    *pPitch = (unsigned int)pitch;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if (!free_bytes || !total_bytes)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned long long total = reported_total();
    unsigned long long used =
        g_cfg.unlimited ? 0 : atomic_load_explicit(&g_acct[c->dev].used, memory_order_relaxed);
    *total_bytes = total;
    *free_bytes = used > total ? 0 : total - used;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes)
{
    if (!free_bytes || !total_bytes) {
        struct CUctx_st *c;
        CUresult r = need_ctx(&c);
        return r ? r : CUDA_ERROR_INVALID_VALUE;
    }
    size_t f, t;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    if (r)
        return r;
    *free_bytes = f > 0xFFFFFFFFu ? 0xFFFFFFFFu : (unsigned int)f;
    *total_bytes = t > 0xFFFFFFFFu ? 0xFFFFFFFFu : (unsigned int)t;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------- */
/* Host memory (not charged)                                                  */
/* ------------------------------------------------------------------------- */

static CUresult host_alloc(void **pp, size_t bytesize)
{
    if (!pp || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (bytesize > (1ULL << 46))
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t rounded = (bytesize + 4095) & ~(size_t)4095;
    void *p = aligned_alloc(4096, rounded);
    struct node *n = malloc(sizeof *n);
    if (!p || !n) {
        free(p);
        free(n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memset(n, 0, sizeof *n);
    n->key = (uint64_t)(uintptr_t)p;
    n->rsize = rounded;
    n->charged = bytesize;
    pthread_mutex_lock(&g_host_lock);
    bool ok = map_insert(&g_host_allocs, n);
    pthread_mutex_unlock(&g_host_lock);
    if (!ok) {
        free(p);
        free(n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    return host_alloc(pp, bytesize);
}

EXPORT CUresult cuMemAllocHost(void **pp, unsigned int bytesize)
{
    return cuMemAllocHost_v2(pp, bytesize);
}

EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if (Flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                            CU_MEMHOSTALLOC_WRITECOMBINED))
        return CUDA_ERROR_INVALID_VALUE;
    return host_alloc(pp, bytesize);
}

EXPORT CUresult cuMemFreeHost(void *p)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    pthread_mutex_lock(&g_host_lock);
    struct node *n = p ? map_remove(&g_host_allocs, (uint64_t)(uintptr_t)p) : NULL;
    pthread_mutex_unlock(&g_host_lock);
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    free(n);
    free(p);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if (!p || bytesize == 0 ||
        (Flags & ~(unsigned)(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                             CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY)))
        return CUDA_ERROR_INVALID_VALUE;
    struct node *n = malloc(sizeof *n);
    if (!n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    memset(n, 0, sizeof *n);
    n->key = (uint64_t)(uintptr_t)p;
    n->rsize = bytesize;
    n->charged = 0;
    pthread_mutex_lock(&g_host_lock);
    if (map_find(&g_host_registered, n->key)) {
        r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    } else if (!map_insert(&g_host_registered, n)) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&g_host_lock);
    if (r)
        free(n);
    return r;
}

EXPORT CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    return cuMemHostRegister_v2(p, bytesize, Flags);
}

EXPORT CUresult cuMemHostUnregister(void *p)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    pthread_mutex_lock(&g_host_lock);
    struct node *n = p ? map_remove(&g_host_registered, (uint64_t)(uintptr_t)p) : NULL;
    pthread_mutex_unlock(&g_host_lock);
    if (!n)
        return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    free(n);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------- */
/* Stream-ordered allocator (freed memory goes straight back to the device)   */
/* ------------------------------------------------------------------------- */

static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if ((r = stream_check(hStream)))
        return r;
    return dev_alloc(stream_dev(hStream, c), bytesize, dptr);
}

static CUresult pool_check(CUmemoryPool pool)
{
    if (!pool || pool->magic != POOL_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

static CUresult alloc_from_pool(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                CUstream hStream)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if ((r = pool_check(pool)) || (r = stream_check(hStream)))
        return r;
    return dev_alloc(pool->dev, bytesize, dptr);
}

static CUresult free_async(CUdeviceptr dptr, CUstream hStream)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if ((r = stream_check(hStream)))
        return r;
    return dev_free(dptr);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_async(dptr, bytesize, hStream);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_async(dptr, bytesize, hStream);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                        CUstream hStream)
{
    return alloc_from_pool(dptr, bytesize, pool, hStream);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                             CUmemoryPool pool, CUstream hStream)
{
    return alloc_from_pool(dptr, bytesize, pool, hStream);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream);
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if (!pool || !poolProps || poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(poolProps->location.id))
        return CUDA_ERROR_INVALID_DEVICE;
    struct CUmemPoolHandle_st *p = malloc(sizeof *p);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->magic = POOL_MAGIC;
    p->dev = poolProps->location.id;
    p->is_default = 0;
    *pool = p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if ((r = pool_check(pool)))
        return r;
    if (pool->is_default)
        return CUDA_ERROR_INVALID_VALUE;
    pool->magic = DEAD_MAGIC; /* never freed */
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    (void)minBytesToKeep;
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    return pool_check(pool);
}

EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if ((r = pool_check(pool)))
        return r;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *(int *)value = 0;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        *(cuuint64_t *)value = 0;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pool_out)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *pool_out = &g_default_pool[dev];
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------- */
/* Virtual memory management                                                  */
/* ------------------------------------------------------------------------- */

static bool prop_ok(const CUmemAllocationProp *prop)
{
    return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
           prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && valid_dev(prop->location.id);
}

static bool overlaps(uint64_t a, uint64_t an, uint64_t b, uint64_t bn)
{
    return a < b + bn && b < a + an;
}

static bool reservation_free_at(uint64_t addr, uint64_t size)
{
    if (addr < VMM_BASE || addr > VMM_LIMIT || VMM_LIMIT - addr < size)
        return false;
    for (struct reservation *r = g_reservations; r; r = r->next)
        if (overlaps(addr, size, r->base, r->size))
            return false;
    return true;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                    CUdeviceptr addr, unsigned long long flags)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if (!ptr || size == 0 || flags != 0 || (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    if (alignment < GRANULARITY)
        alignment = GRANULARITY;
    if (size > VMM_LIMIT - VMM_BASE)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t span = (size + GRANULARITY - 1) & ~(GRANULARITY - 1);
    struct reservation *res = malloc(sizeof *res);
    if (!res)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_vmm_lock);
    uint64_t base = 0;
    if (addr && (addr & (alignment - 1)) == 0 && reservation_free_at(addr, span)) {
        base = addr; /* honour the hint when the range is free */
    } else {
        uint64_t b = (g_vmm_bump + alignment - 1) & ~(uint64_t)(alignment - 1);
        if (b >= g_vmm_bump && b <= VMM_LIMIT && VMM_LIMIT - b >= span) {
            base = b;
            g_vmm_bump = b + span;
        }
    }
    if (base) {
        res->base = base;
        res->size = size;
        res->next = g_reservations;
        g_reservations = res;
    }
    pthread_mutex_unlock(&g_vmm_lock);
    if (!base) {
        free(res);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ptr = base;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_vmm_lock);
    for (struct reservation **pp = &g_reservations; *pp; pp = &(*pp)->next) {
        struct reservation *res = *pp;
        if (res->base == ptr && res->size == size) {
            bool mapped = false;
            for (struct mapping *m = g_mappings; m; m = m->next)
                if (overlaps(m->va, m->size, res->base, res->size))
                    mapped = true;
            if (!mapped) {
                *pp = res->next;
                free(res);
                r = CUDA_SUCCESS;
            }
            break;
        }
    }
    pthread_mutex_unlock(&g_vmm_lock);
    return r;
}

static struct phys *phys_find(CUmemGenericAllocationHandle h)
{
    for (struct phys *p = g_phys; p; p = p->next)
        if (p->handle == h && !p->released)
            return p;
    return NULL;
}

/* Called with g_vmm_lock held: frees the physical memory once unreferenced. */
static void phys_maybe_drop(struct phys *p)
{
    if (!p->released || p->maps)
        return;
    for (struct phys **pp = &g_phys; *pp; pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    }
    uncharge(p->dev, p->size);
    free(p);
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if (!handle || !prop_ok(prop) || size == 0 || (size % GRANULARITY) || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = prop->location.id;
    struct phys *p = malloc(sizeof *p);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!charge(dev, size)) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&g_vmm_lock);
    p->handle = g_next_handle++;
    p->dev = dev;
    p->released = false;
    p->size = size;
    p->maps = 0;
    p->next = g_phys;
    g_phys = p;
    *handle = p->handle;
    pthread_mutex_unlock(&g_vmm_lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    pthread_mutex_lock(&g_vmm_lock);
    struct phys *p = phys_find(handle);
    if (p) {
        p->released = true;
        phys_maybe_drop(p);
    }
    pthread_mutex_unlock(&g_vmm_lock);
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if (size == 0 || flags != 0 || (ptr % GRANULARITY) || (size % GRANULARITY) ||
        (offset % GRANULARITY))
        return CUDA_ERROR_INVALID_VALUE;
    struct mapping *m = malloc(sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_vmm_lock);
    struct phys *p = phys_find(handle);
    bool inside = false, clash = false;
    if (p && offset <= p->size && size <= p->size - offset) {
        for (struct reservation *res = g_reservations; res; res = res->next)
            if (ptr >= res->base && ptr - res->base <= res->size &&
                size <= res->size - (ptr - res->base))
                inside = true;
        for (struct mapping *o = g_mappings; o; o = o->next)
            if (overlaps(o->va, o->size, ptr, size))
                clash = true;
        if (inside && !clash) {
            m->va = ptr;
            m->size = size;
            m->phys = p;
            m->next = g_mappings;
            g_mappings = m;
            p->maps++;
            r = CUDA_SUCCESS;
        } else if (inside && clash) {
            r = CUDA_ERROR_ALREADY_MAPPED;
        }
    }
    pthread_mutex_unlock(&g_vmm_lock);
    if (r)
        free(m);
    return r;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_vmm_lock);
    bool any = false, partial = false;
    for (struct mapping *m = g_mappings; m; m = m->next) {
        if (!overlaps(m->va, m->size, ptr, size))
            continue;
        if (m->va >= ptr && m->va + m->size <= ptr + size)
            any = true;
        else
            partial = true;
    }
    if (any && !partial) {
        for (struct mapping **pp = &g_mappings; *pp;) {
            struct mapping *m = *pp;
            if (overlaps(m->va, m->size, ptr, size)) {
                *pp = m->next;
                m->phys->maps--;
                phys_maybe_drop(m->phys);
                free(m);
            } else {
                pp = &m->next;
            }
        }
        r = CUDA_SUCCESS;
    } else {
        r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&g_vmm_lock);
    return r;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                               size_t count)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if (size == 0 || !desc || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
            !valid_dev(desc[i].location.id))
            return CUDA_ERROR_INVALID_DEVICE;
        if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
            desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
            desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
    }
    /* The whole range must be mapped (mappings never overlap). */
    uint64_t covered = 0;
    pthread_mutex_lock(&g_vmm_lock);
    for (struct mapping *m = g_mappings; m; m = m->next) {
        if (!overlaps(m->va, m->size, ptr, size))
            continue;
        uint64_t lo = m->va > ptr ? m->va : ptr;
        uint64_t hi = m->va + m->size < ptr + size ? m->va + m->size : ptr + size;
        covered += hi - lo;
    }
    pthread_mutex_unlock(&g_vmm_lock);
    return covered == size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity,
                                              const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags option)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!granularity || !prop_ok(prop) ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
         option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = GRANULARITY;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------- */
/* Arrays                                                                     */
/* ------------------------------------------------------------------------- */

static unsigned format_size(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4;
    default:
        return 0;
    }
}

/* Bytes of one W x H x D level; false on invalid descriptor / overflow. */
static bool level_bytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format fmt, unsigned ch,
                        uint64_t *out)
{
    unsigned es = format_size(fmt);
    if (!es || (ch != 1 && ch != 2 && ch != 4) || w == 0)
        return false;
    uint64_t v = w, t;
    if (__builtin_mul_overflow(v, h ? h : 1, &t))
        return false;
    v = t;
    if (__builtin_mul_overflow(v, d ? d : 1, &t))
        return false;
    v = t;
    if (__builtin_mul_overflow(v, (uint64_t)es * ch, &t))
        return false;
    *out = t;
    return true;
}

static CUresult array_make(CUarray *pHandle, unsigned magic, int dev, uint64_t bytes)
{
    if (bytes > DEV_SPAN)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct fake_array *a = malloc(sizeof *a);
    struct node *n = malloc(sizeof *n);
    if (!a || !n) {
        free(a);
        free(n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!charge(dev, bytes)) {
        free(a);
        free(n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->magic = magic;
    a->dev = dev;
    a->bytes = bytes;
    memset(n, 0, sizeof *n);
    n->key = (uint64_t)(uintptr_t)a;
    pthread_mutex_lock(&g_array_lock);
    bool ok = map_insert(&g_arrays, n);
    pthread_mutex_unlock(&g_array_lock);
    if (!ok) {
        uncharge(dev, bytes);
        free(a);
        free(n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pHandle = (CUarray)a;
    return CUDA_SUCCESS;
}

static CUresult array_destroy(void *h, unsigned magic)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if (!h)
        return CUDA_ERROR_INVALID_HANDLE;
    struct fake_array *a = h;
    struct node *n = NULL;
    pthread_mutex_lock(&g_array_lock);
    if (map_find(&g_arrays, (uint64_t)(uintptr_t)h) && a->magic == magic)
        n = map_remove(&g_arrays, (uint64_t)(uintptr_t)h);
    pthread_mutex_unlock(&g_array_lock);
    if (!n)
        return CUDA_ERROR_INVALID_HANDLE;
    uncharge(a->dev, a->bytes);
    free(n);
    free(a);
    return CUDA_SUCCESS;
}

static CUresult array3d_create(CUarray *pHandle, uint64_t w, uint64_t h, uint64_t d,
                               CUarray_format fmt, unsigned ch, unsigned flags)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    uint64_t bytes;
    if (!pHandle || (flags & ~0x3Fu) ||
        (h == 0 && d != 0 && !(flags & CUDA_ARRAY3D_LAYERED)) ||
        !level_bytes(w, h, d, fmt, ch, &bytes))
        return CUDA_ERROR_INVALID_VALUE;
    return array_make(pHandle, ARRAY_MAGIC, c->dev, bytes);
}

EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d)
{
    if (!d) {
        struct CUctx_st *c;
        CUresult r = need_ctx(&c);
        return r ? r : CUDA_ERROR_INVALID_VALUE;
    }
    return array3d_create(pHandle, d->Width, d->Height, 0, d->Format, d->NumChannels, 0);
}

EXPORT CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
    if (!d) {
        struct CUctx_st *c;
        CUresult r = need_ctx(&c);
        return r ? r : CUDA_ERROR_INVALID_VALUE;
    }
    return array3d_create(pHandle, d->Width, d->Height, 0, d->Format, d->NumChannels, 0);
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    if (!d) {
        struct CUctx_st *c;
        CUresult r = need_ctx(&c);
        return r ? r : CUDA_ERROR_INVALID_VALUE;
    }
    return array3d_create(pHandle, d->Width, d->Height, d->Depth, d->Format, d->NumChannels,
                          d->Flags);
}

EXPORT CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
    if (!d) {
        struct CUctx_st *c;
        CUresult r = need_ctx(&c);
        return r ? r : CUDA_ERROR_INVALID_VALUE;
    }
    return array3d_create(pHandle, d->Width, d->Height, d->Depth, d->Format, d->NumChannels,
                          d->Flags);
}

EXPORT CUresult cuArrayDestroy(CUarray hArray)
{
    return array_destroy(hArray, ARRAY_MAGIC);
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                       const CUDA_ARRAY3D_DESCRIPTOR *d,
                                       unsigned int numMipmapLevels)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r)
        return r;
    if (!pHandle || !d || numMipmapLevels == 0 || (d->Flags & ~0x3Fu) ||
        (d->Height == 0 && d->Depth != 0 && !(d->Flags & CUDA_ARRAY3D_LAYERED)))
        return CUDA_ERROR_INVALID_VALUE;
    bool fixed_depth = (d->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
    uint64_t maxdim = d->Width;
    if (d->Height > maxdim)
        maxdim = d->Height;
    if (!fixed_depth && d->Depth > maxdim)
        maxdim = d->Depth;
    unsigned maxlevels = 0;
    for (uint64_t m = maxdim; m; m >>= 1)
        maxlevels++;
    if (numMipmapLevels > maxlevels)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t total = 0;
    for (unsigned l = 0; l < numMipmapLevels; l++) {
        uint64_t w = d->Width >> l ? d->Width >> l : 1;
        uint64_t h = d->Height ? (d->Height >> l ? d->Height >> l : 1) : 0;
        uint64_t dd = d->Depth;
        if (dd && !fixed_depth)
            dd = dd >> l ? dd >> l : 1;
        uint64_t b;
        if (!level_bytes(w, h, dd, d->Format, d->NumChannels, &b) ||
            __builtin_add_overflow(total, b, &total))
            return CUDA_ERROR_INVALID_VALUE;
    }
    CUarray a;
    if ((r = array_make(&a, MIPMAP_MAGIC, c->dev, total)))
        return r;
    *pHandle = (CUmipmappedArray)(void *)a;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    return array_destroy(hMipmappedArray, MIPMAP_MAGIC);
}

/* ------------------------------------------------------------------------- */
/* Entry point access                                                         */
/* ------------------------------------------------------------------------- */

struct proc {
    const char *name; /* base name */
    void *fn;         /* exported variant (this library's own definition) */
    int minver;       /* CUDA version that introduced the variant */
    int ptsz;         /* per-thread default stream variant */
};

#define V(base, fn, ver) {base, (void *)&fn, ver, 0}
#define PTSZ(base, fn, ver) {base, (void *)&fn, ver, 1}
#define SAME(fn) {#fn, (void *)&fn, 2000, 0}

static const struct proc g_procs[] = {
    /* Versioned entry points: base name -> variant by ABI version. */
    V("cuMemAlloc", cuMemAlloc, 2000),
    V("cuMemAlloc", cuMemAlloc_v2, 3020),
    V("cuMemFree", cuMemFree, 2000),
    V("cuMemFree", cuMemFree_v2, 3020),
    V("cuMemAllocPitch", cuMemAllocPitch, 2000),
    V("cuMemAllocPitch", cuMemAllocPitch_v2, 3020),
    V("cuMemAllocHost", cuMemAllocHost, 2000),
    V("cuMemAllocHost", cuMemAllocHost_v2, 3020),
    V("cuMemGetInfo", cuMemGetInfo, 2000),
    V("cuMemGetInfo", cuMemGetInfo_v2, 3020),
    V("cuArrayCreate", cuArrayCreate, 2000),
    V("cuArrayCreate", cuArrayCreate_v2, 3020),
    V("cuArray3DCreate", cuArray3DCreate, 2000),
    V("cuArray3DCreate", cuArray3DCreate_v2, 3020),
    V("cuDeviceTotalMem", cuDeviceTotalMem, 2000),
    V("cuDeviceTotalMem", cuDeviceTotalMem_v2, 3020),
    V("cuCtxCreate", cuCtxCreate, 2000),
    V("cuCtxCreate", cuCtxCreate_v2, 3020),
    V("cuCtxDestroy", cuCtxDestroy, 2000),
    V("cuCtxDestroy", cuCtxDestroy_v2, 4000),
    V("cuStreamDestroy", cuStreamDestroy, 2000),
    V("cuStreamDestroy", cuStreamDestroy_v2, 4000),
    V("cuMemHostRegister", cuMemHostRegister, 4000),
    V("cuMemHostRegister", cuMemHostRegister_v2, 6050),
    V("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease, 7000),
    V("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2, 11000),
    V("cuGetProcAddress", cuGetProcAddress, 11030),
    V("cuGetProcAddress", cuGetProcAddress_v2, 12000),
    /* Stream-ordered allocator: default and per-thread-default-stream variants. */
    V("cuMemAllocAsync", cuMemAllocAsync, 11020),
    PTSZ("cuMemAllocAsync", cuMemAllocAsync_ptsz, 11020),
    V("cuMemFreeAsync", cuMemFreeAsync, 11020),
    PTSZ("cuMemFreeAsync", cuMemFreeAsync_ptsz, 11020),
    V("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync, 11020),
    PTSZ("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync_ptsz, 11020),
    /* Everything else under its own name. */
    SAME(cuInit),
    SAME(cuDriverGetVersion),
    SAME(cuDeviceGet),
    SAME(cuDeviceGetCount),
    SAME(cuDeviceGetName),
    SAME(cuGetErrorString),
    SAME(cuGetErrorName),
    SAME(cuDevicePrimaryCtxRetain),
    SAME(cuCtxSetCurrent),
    SAME(cuCtxGetCurrent),
    SAME(cuCtxGetDevice),
    SAME(cuCtxSynchronize),
    SAME(cuStreamCreate),
    SAME(cuStreamSynchronize),
    SAME(cuStreamGetCtx),
    SAME(cuLaunchKernel),
    SAME(cuMemAllocManaged),
    SAME(cuMemHostAlloc),
    SAME(cuMemFreeHost),
    SAME(cuMemHostUnregister),
    SAME(cuMemPoolCreate),
    SAME(cuMemPoolDestroy),
    SAME(cuMemPoolTrimTo),
    SAME(cuMemPoolGetAttribute),
    SAME(cuDeviceGetDefaultMemPool),
    SAME(cuMemAddressReserve),
    SAME(cuMemAddressFree),
    SAME(cuMemCreate),
    SAME(cuMemRelease),
    SAME(cuMemMap),
    SAME(cuMemUnmap),
    SAME(cuMemSetAccess),
    SAME(cuMemGetAllocationGranularity),
    SAME(cuArrayDestroy),
    SAME(cuMipmappedArrayCreate),
    SAME(cuMipmappedArrayDestroy),
};

/* Returns the query status; *pfn is set (NULL when not found). */
static CUdriverProcAddressQueryResult resolve(const char *symbol, void **pfn, int cudaVersion,
                                              cuuint64_t flags)
{
    bool want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    bool known = false;
    const struct proc *best = NULL;
    for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++) {
        const struct proc *p = &g_procs[i];
        if (strcmp(p->name, symbol) != 0)
            continue;
        known = true;
        if (p->minver > cudaVersion || (p->ptsz && !want_ptsz))
            continue;
        if (!best || p->minver > best->minver || (p->minver == best->minver && p->ptsz))
            best = p;
    }
    *pfn = best ? best->fn : NULL;
    if (best)
        return CU_GET_PROC_ADDRESS_SUCCESS;
    return known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                 : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
    if (!symbol || !pfn ||
        (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                               CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
        return CUDA_ERROR_INVALID_VALUE;
    CUdriverProcAddressQueryResult st = resolve(symbol, pfn, cudaVersion, flags);
    if (symbolStatus)
        *symbolStatus = st;
    return st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT ? CUDA_ERROR_NOT_FOUND
                                                            : CUDA_SUCCESS;
}

/* CUDA 11.3-11.8 ABI: no status out-parameter; any miss is CUDA_ERROR_NOT_FOUND. */
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    if (!symbol || !pfn ||
        (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                               CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
        return CUDA_ERROR_INVALID_VALUE;
    CUdriverProcAddressQueryResult st = resolve(symbol, pfn, cudaVersion, flags);
    return st == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

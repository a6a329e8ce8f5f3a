/* The fake NCCL (libnccl.so.2): communicators within a process and across processes on one
 * machine, with collectives that move the real bytes (device memory is host memory on the
 * fake GPU).
 *
 * Rendezvous: ncclGetUniqueId puts 16 random bytes into the id; every rank of a communicator
 * opens the POSIX shared-memory object they name (mode 0600), and the last rank to arrive
 * unlinks it, so nothing is left behind once all have joined. A collective goes through that
 * region in rounds of at most CHUNK bytes per rank: each rank copies its contribution into its
 * slot, all meet at a barrier, each computes its own result from the slots, all meet again.
 * Every rank computes reductions in the same order, so all get the same bits. A result is
 * written only where it differs from what the receive buffer holds, so collectives over
 * memory nothing ever wrote (kernels compute nothing) cost no host RAM.
 *
 * Never a hang: a wait gives up when a peer process has exited, when another rank gave up, or
 * after VRAMSHIM_FAKEGPU_NCCL_TIMEOUT seconds (default 600, PyTorch's own NCCL timeout); the
 * call then fails with one line on stderr, and so do the other ranks' calls. Ranks that call
 * different collectives at the same point fail the same way, naming both.
 * Point to point (ncclSend/ncclRecv, alone or between ncclGroupStart and ncclGroupEnd): each
 * ordered pair of ranks has a mailbox of P2P_CHUNK bytes in the region; a sender fills it when
 * it is empty, the receiver empties it, and a group's operations all progress together until
 * each is done, so the pairings NCCL allows (rank 0 sends then receives while rank 1 receives
 * then sends, in one group) cannot deadlock. A send and its receive must agree on the size.
 * Not supported (ncclInvalidUsage, with a message): reductions of fp8 data. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fakegpu_cuda.h"

#define FG_EXPORT __attribute__((visibility("default")))
typedef int ncclResult_t;
enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
};

/* NCCL 2.32.3: major * 10000 + minor * 100 + patch. */
#define FG_NCCL_VERSION 23203

typedef struct {
    char internal[128];
} ncclUniqueId;

/* The id: a tag, then the random name of the shared region. */
#define ID_TAG "vramshim-fakegpu"
#define ID_TAG_BYTES 16
#define ID_RANDOM_BYTES 16

#define MAX_RANKS 64
/* Bytes each rank puts through the region per round. */
#define CHUNK (1u << 20)
#define REGION_MAGIC 0x6e63636c66616b65ull /* "ncclfake" */
#define MAX_CUSTOM_OPS 64

/* Reduction operators (ncclRedOp_t) and data types (ncclDataType_t). */
enum { OP_SUM, OP_PROD, OP_MAX, OP_MIN, OP_AVG, BUILTIN_OPS };
enum {
    T_INT8, T_UINT8, T_INT32, T_UINT32, T_INT64, T_UINT64, T_HALF, T_FLOAT, T_DOUBLE, T_BF16,
    T_FP8_E4M3, T_FP8_E5M2, TYPE_COUNT
};

/* What a rank is doing, published so that the others can check they do the same. */
struct call {
    uint64_t sequence;
    int32_t kind, type, op, root;
    uint64_t count;
};

struct region {
    _Atomic uint64_t magic;
    _Atomic int32_t nranks;
    _Atomic int32_t joined;
    _Atomic int32_t failed;
    _Atomic uint32_t waiting;    /* ranks at the barrier */
    _Atomic uint32_t generation; /* barriers passed: the futex word */
    _Atomic uint32_t p2p_changes; /* mailbox fills and emptyings: the futex word of sends */
    _Atomic int32_t pids[MAX_RANKS];
    struct call calls[MAX_RANKS];
};
#define HEADER_BYTES 8192

/* One mailbox per ordered pair of ranks, after the collectives' slots. A chunk is in it when
 * filled == emptied + 1. */
struct mailbox {
    _Atomic uint32_t filled, emptied;
    uint64_t bytes;   /* of this chunk */
    uint64_t message; /* the whole message's size, which the receive must expect */
    unsigned char pad[40];
};
#define P2P_CHUNK (256u << 10)
#define MAILBOX_BYTES (sizeof(struct mailbox) + P2P_CHUNK)
_Static_assert(sizeof(struct region) <= HEADER_BYTES, "region header too large");

struct custom_op {
    int in_use, type, host;
    unsigned char scalar[8]; /* a host scalar, by value */
    const void *device_scalar;
};

struct nccl_comm {
    int rank, nranks, device;
    struct region *region; /* NULL for a communicator of one rank */
    size_t region_bytes;
    char name[128];      /* the region's name, for communicators split from this one */
    uint64_t sequence;   /* collectives called */
    uint64_t splits;     /* communicators split from this one */
    struct custom_op ops[MAX_CUSTOM_OPS];
    CUmemGenericAllocationHandle *buffers; /* the device memory this rank holds (cuMemCreate handles) */
    int buffer_count;
};
typedef struct nccl_comm *ncclComm_t;

/* From the fake driver. */
int cuCtxGetDevice(int *device);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
unsigned long long vramshim_fakegpu_nccl_bytes(void);
int vramshim_fakegpu_load_kernels(int dev, const char *name, unsigned long long bytes);

/* An NCCL rank's own device memory (VRAMSHIM_FAKEGPU_NCCL_BYTES, dryrun's presets give it).
 * Measured with NCCL 2.28.9 on an H200 and an H100 (docs/gpus.md): a one-rank communicator
 * and one all_reduce took 583,008,256 / 589,299,712 bytes, of which 195 cuMemCreate of 2 MiB
 * (408,944,640 bytes) and the rest NCCL's kernels. So each communicator makes up to 195
 * buffers of 2 MiB through cuMemCreate (the recorder sees them as on a real card), and the
 * rest is charged once per device as loaded kernels. Communicators of more ranks are charged
 * the same: not measured, an estimate. */
#define NCCL_BUFFER_BYTES (2ull << 20)
#define NCCL_BUFFERS_MEASURED 195

static __thread char last_error[512];

static ncclResult_t fail(ncclResult_t result, const char *message)
{
    snprintf(last_error, sizeof last_error, "%s", message);
    return result;
}

/* Fails with a message that also goes to stderr (one line): a failure across processes is
 * otherwise hard to place. */
static ncclResult_t fail_loudly(ncclResult_t result, const char *format, ...)
    __attribute__((format(printf, 2, 3)));
static ncclResult_t fail_loudly(ncclResult_t result, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    vsnprintf(last_error, sizeof last_error, format, args);
    va_end(args);
    char line[600];
    int n = snprintf(line, sizeof line, "vramshim fakegpu: %s\n", last_error);
    if (n > 0) {
        ssize_t ignored = write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        (void)ignored;
    }
    return result;
}

static double timeout_seconds(void)
{
    static _Atomic long cached = -1;
    long value = atomic_load(&cached);
    if (value < 0) {
        const char *text = getenv("VRAMSHIM_FAKEGPU_NCCL_TIMEOUT");
        char *end = NULL;
        value = text ? strtol(text, &end, 10) : 600;
        if (text && (!*text || *end || value < 1 || value > 86400)) {
            fprintf(stderr, "vramshim fakegpu: VRAMSHIM_FAKEGPU_NCCL_TIMEOUT=\"%s\" is invalid: "
                            "expected whole seconds from 1 to 86400; using 600\n", text);
            value = 600;
        }
        atomic_store(&cached, value);
    }
    return (double)value;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Whether process PID has exited (gone, or a zombie its parent has not reaped). */
static int exited(pid_t pid)
{
    if (pid <= 0)
        return 0;
    if (kill(pid, 0) == -1 && errno == ESRCH)
        return 1;
    char path[64], stat[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, stat, sizeof stat - 1);
    close(fd);
    if (n <= 0)
        return 0;
    stat[n] = '\0';
    const char *paren = strrchr(stat, ')');
    return paren && paren[1] == ' ' && paren[2] == 'Z';
}

/* Waits (futex, in slices of 100 ms) until *WORD differs from SEEN, or the wait must end:
 * a peer exited, another rank gave up, or the timeout passed. WHAT names the wait. */
static ncclResult_t wait_while(struct nccl_comm *c, _Atomic uint32_t *word, uint32_t seen,
                               const char *what)
{
    struct region *r = c->region;
    double start = now(), next_check = start + 1;
    while (atomic_load(word) == seen) {
        if (atomic_load(&r->failed))
            return fail_loudly(ncclRemoteError,
                               "NCCL rank %d of %d: another rank gave up %s", c->rank,
                               c->nranks, what);
        struct timespec slice = {0, 100 * 1000 * 1000};
        syscall(SYS_futex, word, FUTEX_WAIT, seen, &slice, NULL, 0);
        double t = now();
        if (t >= next_check) {
            next_check = t + 1;
            for (int i = 0; i < c->nranks; i++) {
                pid_t pid = atomic_load(&r->pids[i]);
                if (i != c->rank && exited(pid)) {
                    atomic_store(&r->failed, 1);
                    return fail_loudly(ncclRemoteError,
                                       "NCCL rank %d of %d: rank %d (pid %d) exited %s",
                                       c->rank, c->nranks, i, (int)pid, what);
                }
            }
        }
        if (t - start > timeout_seconds()) {
            atomic_store(&r->failed, 1);
            return fail_loudly(ncclSystemError,
                               "NCCL rank %d of %d: waited %.0f s for the other ranks %s; "
                               "giving up (VRAMSHIM_FAKEGPU_NCCL_TIMEOUT)",
                               c->rank, c->nranks, timeout_seconds(), what);
        }
    }
    return ncclSuccess;
}

/* All ranks of the communicator meet (a sense-reversing barrier on the region). */
static ncclResult_t barrier(struct nccl_comm *c, const char *what)
{
    struct region *r = c->region;
    uint32_t generation = atomic_load(&r->generation);
    if (atomic_fetch_add(&r->waiting, 1) + 1 == (uint32_t)c->nranks) {
        atomic_store(&r->waiting, 0);
        atomic_fetch_add(&r->generation, 1);
        syscall(SYS_futex, &r->generation, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
        return ncclSuccess;
    }
    return wait_while(c, &r->generation, generation, what);
}

static unsigned char *slot(const struct nccl_comm *c, int rank)
{
    return (unsigned char *)c->region + HEADER_BYTES + (size_t)rank * CHUNK;
}

/* The mailbox of messages from rank FROM to rank TO; its data follows it. */
static struct mailbox *mailbox(const struct nccl_comm *c, int from, int to)
{
    return (struct mailbox *)(slot(c, c->nranks) +
                              ((size_t)from * (size_t)c->nranks + (size_t)to) * MAILBOX_BYTES);
}

FG_EXPORT ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return fail(ncclInvalidArgument, "version is NULL");
    *version = FG_NCCL_VERSION;
    return ncclSuccess;
}

FG_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (!id)
        return fail(ncclInvalidArgument, "id is NULL");
    memset(id, 0, sizeof *id);
    memcpy(id->internal, ID_TAG, ID_TAG_BYTES);
    unsigned char *random = (unsigned char *)id->internal + ID_TAG_BYTES;
    size_t got = 0;
    while (got < ID_RANDOM_BYTES) {
        ssize_t n = getrandom(random + got, ID_RANDOM_BYTES - got, 0);
        if (n < 0 && errno != EINTR)
            return fail_loudly(ncclSystemError, "NCCL: getrandom failed: %s", strerror(errno));
        got += n > 0 ? (size_t)n : 0;
    }
    return ncclSuccess;
}

static int current_device(void)
{
    int device = 0;
    cuCtxGetDevice(&device);
    return device;
}

/* The region's name from an id: "/vramshim-nccl-" and the random bytes in hex. */
static int region_name(const ncclUniqueId *id, char *name, size_t size)
{
    if (memcmp(id->internal, ID_TAG, ID_TAG_BYTES) != 0)
        return -1;
    int n = snprintf(name, size, "/vramshim-nccl-");
    for (int i = 0; i < ID_RANDOM_BYTES; i++)
        n += snprintf(name + n, size - (size_t)n, "%02x",
                      (unsigned char)id->internal[ID_TAG_BYTES + i]);
    return 0;
}

/* Joins the region NAME as RANK of NRANKS; every rank waits until all have joined. */
static ncclResult_t join(struct nccl_comm *c, const char *name)
{
    size_t bytes = HEADER_BYTES + (size_t)c->nranks * CHUNK +
                   (size_t)c->nranks * (size_t)c->nranks * MAILBOX_BYTES;
    int fd = shm_open(name, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return fail_loudly(ncclSystemError, "NCCL rank %d: cannot open shared memory %s: %s",
                           c->rank, name, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) == 0 && (size_t)st.st_size < bytes && ftruncate(fd, (off_t)bytes) != 0) {
        int error = errno;
        close(fd);
        shm_unlink(name);
        return fail_loudly(ncclSystemError, "NCCL rank %d: cannot size shared memory %s: %s",
                           c->rank, name, strerror(error));
    }
    void *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        shm_unlink(name);
        return fail_loudly(ncclSystemError, "NCCL rank %d: cannot map shared memory: %s",
                           c->rank, strerror(errno));
    }
    struct region *r = map;
    c->region = r;
    c->region_bytes = bytes;
    snprintf(c->name, sizeof c->name, "%s", name);
    int32_t expected = 0;
    if (!atomic_compare_exchange_strong(&r->nranks, &expected, c->nranks) &&
        expected != c->nranks) {
        atomic_store(&r->failed, 1);
        return fail_loudly(ncclInvalidUsage, "NCCL rank %d: ranks disagree on the size of "
                           "the communicator (%d and %d)", c->rank, c->nranks, (int)expected);
    }
    int32_t none = 0;
    if (!atomic_compare_exchange_strong(&r->pids[c->rank], &none, (int32_t)getpid())) {
        atomic_store(&r->failed, 1);
        return fail_loudly(ncclInvalidUsage, "NCCL: rank %d of %d joined twice (pids %d and %d)",
                           c->rank, c->nranks, (int)none, (int)getpid());
    }
    atomic_store(&r->magic, REGION_MAGIC);
    if (atomic_fetch_add(&r->joined, 1) + 1 == c->nranks)
        shm_unlink(name); /* every rank has it mapped: the name is no longer needed */
    ncclResult_t result = barrier(c, "to join the communicator");
    if (result)
        shm_unlink(name);
    return result;
}

static void leave(struct nccl_comm *c)
{
    if (c->region)
        munmap(c->region, c->region_bytes);
    c->region = NULL;
    for (int i = 0; i < c->buffer_count; i++)
        cuMemRelease(c->buffers[i]);
    free(c->buffers);
    c->buffers = NULL;
    c->buffer_count = 0;
}

/* The communicator's own device memory; ncclUnhandledCudaError when it does not fit, as
 * real NCCL fails ("Cuda failure 'out of memory'"). */
static ncclResult_t hold_device_memory(struct nccl_comm *c)
{
    unsigned long long total = vramshim_fakegpu_nccl_bytes();
    if (total == 0)
        return ncclSuccess;
    int count = (int)(total / NCCL_BUFFER_BYTES);
    if (count > NCCL_BUFFERS_MEASURED)
        count = NCCL_BUFFERS_MEASURED;
    c->buffers = calloc((size_t)count + 1, sizeof *c->buffers);
    if (!c->buffers)
        return fail(ncclSystemError, "out of host memory");
    CUmemAllocationProp prop = {.type = 1, /* CU_MEM_ALLOCATION_TYPE_PINNED */
                                .location = {CU_MEM_LOCATION_TYPE_DEVICE, c->device}};
    for (int i = 0; i < count; i++) {
        if (cuMemCreate(&c->buffers[i], NCCL_BUFFER_BYTES, &prop, 0) != 0)
            return fail_loudly(ncclUnhandledCudaError,
                               "NCCL: Cuda failure 'out of memory' (device %d, buffer %d of %d)",
                               c->device, i + 1, count);
        c->buffer_count++;
    }
    unsigned long long kernels = total - (unsigned long long)count * NCCL_BUFFER_BYTES;
    if (vramshim_fakegpu_load_kernels(c->device, "libnccl", kernels) != 0)
        return fail_loudly(ncclUnhandledCudaError,
                           "NCCL: Cuda failure 'out of memory' (device %d, loading its kernels)",
                           c->device);
    return ncclSuccess;
}

static ncclResult_t comm_new(ncclComm_t *comm, int nranks, int rank, int device,
                             const char *name)
{
    if (!comm)
        return fail(ncclInvalidArgument, "comm is NULL");
    if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
        return fail_loudly(ncclInvalidArgument,
                           "NCCL: rank %d of %d is out of range (the fake supports 1 to %d "
                           "ranks)", rank, nranks, MAX_RANKS);
    struct nccl_comm *c = calloc(1, sizeof *c);
    if (!c)
        return fail(ncclSystemError, "out of host memory");
    c->rank = rank;
    c->nranks = nranks;
    c->device = device;
    ncclResult_t result = nranks > 1 ? join(c, name) : ncclSuccess;
    if (!result)
        result = hold_device_memory(c);
    if (result) {
        leave(c);
        free(c);
        return result;
    }
    *comm = c;
    return ncclSuccess;
}

static ncclResult_t init_rank(ncclComm_t *comm, int nranks, const ncclUniqueId *id, int rank)
{
    char name[128] = "";
    if (nranks > 1 && region_name(id, name, sizeof name) != 0)
        return fail_loudly(ncclInvalidArgument,
                           "NCCL: the unique id was not made by this fake's ncclGetUniqueId");
    return comm_new(comm, nranks, rank, current_device(), name);
}

FG_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    return init_rank(comm, nranks, &id, rank);
}

FG_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id,
                                              int rank, void *config)
{
    return init_rank(comm, nranks, &id, rank);
}

FG_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t *comm, int nranks, int rank,
                                                int id_count, ncclUniqueId *ids, void *config)
{
    if (id_count < 1 || !ids)
        return fail(ncclInvalidArgument, "no unique id");
    return init_rank(comm, nranks, &ids[0], rank);
}

/* Several devices of one process: ncclCommInitAll makes one communicator per device, rank i
 * of NDEV, without a region: collectives among them leave each rank its own data. */
FG_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devices)
{
    if (!comms || ndev <= 0)
        return fail(ncclInvalidArgument, "bad communicator list");
    for (int i = 0; i < ndev; i++) {
        ncclResult_t r = comm_new(&comms[i], 1, 0, devices ? devices[i] : i, "");
        if (r)
            return r;
        comms[i]->rank = i;
        comms[i]->nranks = ndev;
    }
    return ncclSuccess;
}

FG_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (comm) {
        leave(comm);
        free(comm);
    }
    return ncclSuccess;
}

/* An aborted rank will not come back: the other ranks' waits end at once. */
FG_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (comm && comm->region)
        atomic_store(&comm->region->failed, 1);
    return ncclCommDestroy(comm);
}

FG_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    return comm ? ncclSuccess : fail(ncclInvalidArgument, "comm is NULL");
}

FG_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm || !count)
        return fail(ncclInvalidArgument, "NULL argument");
    *count = comm->nranks;
    return ncclSuccess;
}

FG_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    if (!comm || !device)
        return fail(ncclInvalidArgument, "NULL argument");
    *device = comm->device;
    return ncclSuccess;
}

FG_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm || !rank)
        return fail(ncclInvalidArgument, "NULL argument");
    *rank = comm->rank;
    return ncclSuccess;
}

FG_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *error)
{
    if (!comm || !error)
        return fail(ncclInvalidArgument, "NULL argument");
    *error = comm->region && atomic_load(&comm->region->failed) ? ncclRemoteError : ncclSuccess;
    return ncclSuccess;
}

/* Collectives inside a group run when they are called: every rank calls them in the same
 * order, so none waits for one that comes later in its group. */

FG_EXPORT const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "unhandled system error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    default: return "unknown result code";
    }
}

FG_EXPORT const char *ncclGetLastError(ncclComm_t comm) { return last_error; }

static size_t type_size(int type)
{
    static const size_t sizes[TYPE_COUNT] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return type >= 0 && type < TYPE_COUNT ? sizes[type] : 0;
}

/* --- Reductions ---------------------------------------------------------------------------- */

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    uint32_t bits;
    if (exponent == 0x1f)
        bits = sign | 0x7f800000u | (mantissa << 13);
    else if (exponent)
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    else if (mantissa) { /* subnormal: normalise */
        int shift = 0;
        while (!(mantissa & 0x400)) {
            mantissa <<= 1;
            shift++;
        }
        bits = sign | ((uint32_t)(113 - shift) << 23) | ((mantissa & 0x3ff) << 13);
    } else
        bits = sign;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t float_to_half(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, 4);
    uint32_t sign = (bits >> 16) & 0x8000;
    int32_t exponent = (int32_t)((bits >> 23) & 0xff) - 127 + 15;
    uint32_t mantissa = bits & 0x7fffff;
    if (((bits >> 23) & 0xff) == 0xff) /* inf, nan */
        return (uint16_t)(sign | 0x7c00 | (mantissa ? 0x200 : 0));
    if (exponent >= 0x1f)
        return (uint16_t)(sign | 0x7c00);
    if (exponent <= 0) {
        if (exponent < -10)
            return (uint16_t)sign;
        mantissa |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exponent);
        uint32_t half = mantissa >> shift, rest = mantissa & ((1u << shift) - 1);
        uint32_t midpoint = 1u << (shift - 1);
        if (rest > midpoint || (rest == midpoint && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)exponent << 10) | (mantissa >> 13);
    uint32_t rest = mantissa & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (half & 1)))
        half++; /* may carry into the exponent: still right */
    return (uint16_t)half;
}

static float bf16_to_float(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t float_to_bf16(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x7fffff))
        return (uint16_t)((bits >> 16) | 0x40); /* quiet nan */
    bits += 0x7fff + ((bits >> 16) & 1);
    return (uint16_t)(bits >> 16);
}

#define COMBINE(a, b, op)                                                                        \
    ((op) == OP_PROD ? (a) * (b) : (op) == OP_MAX ? ((a) > (b) ? (a) : (b))                      \
     : (op) == OP_MIN ? ((a) < (b) ? (a) : (b)) : (a) + (b))

#define REDUCE_AS(T)                                                                             \
    do {                                                                                         \
        T *d = (T *)dst;                                                                         \
        const T *s = (const T *)src;                                                             \
        for (size_t i = 0; i < n; i++)                                                           \
            d[i] = (T)COMBINE(d[i], s[i], op);                                                   \
    } while (0)

#define REDUCE_16(to_float, from_float)                                                          \
    do {                                                                                         \
        uint16_t *d = (uint16_t *)dst;                                                           \
        const uint16_t *s = (const uint16_t *)src;                                               \
        for (size_t i = 0; i < n; i++) {                                                         \
            float a = to_float(d[i]), b = to_float(s[i]);                                        \
            d[i] = from_float(COMBINE(a, b, op));                                                \
        }                                                                                        \
    } while (0)

/* dst[i] = dst[i] OP src[i] for N elements of TYPE (OP: sum, prod, max or min). */
static void combine(int type, int op, void *dst, const void *src, size_t n)
{
    switch (type) {
    case T_INT8: REDUCE_AS(int8_t); break;
    case T_UINT8: REDUCE_AS(uint8_t); break;
    case T_INT32: REDUCE_AS(int32_t); break;
    case T_UINT32: REDUCE_AS(uint32_t); break;
    case T_INT64: REDUCE_AS(int64_t); break;
    case T_UINT64: REDUCE_AS(uint64_t); break;
    case T_FLOAT: REDUCE_AS(float); break;
    case T_DOUBLE: REDUCE_AS(double); break;
    case T_HALF: REDUCE_16(half_to_float, float_to_half); break;
    case T_BF16: REDUCE_16(bf16_to_float, float_to_bf16); break;
    default: break;
    }
}

#define SCALE_AS(T)                                                                              \
    do {                                                                                         \
        T *d = (T *)data;                                                                        \
        for (size_t i = 0; i < n; i++)                                                           \
            d[i] = (T)(multiply ? d[i] * factor : d[i] / factor);                                \
    } while (0)

#define SCALE_16(to_float, from_float)                                                           \
    do {                                                                                         \
        uint16_t *d = (uint16_t *)data;                                                          \
        for (size_t i = 0; i < n; i++) {                                                         \
            float v = to_float(d[i]);                                                            \
            d[i] = from_float((float)(multiply ? v * factor : v / factor));                      \
        }                                                                                        \
    } while (0)

/* data[i] *= factor (MULTIPLY) or /= factor (an average: integers divide as C does). */
static void scale(int type, void *data, size_t n, double factor, int multiply)
{
    switch (type) {
    case T_INT8: SCALE_AS(int8_t); break;
    case T_UINT8: SCALE_AS(uint8_t); break;
    case T_INT32: SCALE_AS(int32_t); break;
    case T_UINT32: SCALE_AS(uint32_t); break;
    case T_INT64: SCALE_AS(int64_t); break;
    case T_UINT64: SCALE_AS(uint64_t); break;
    case T_FLOAT: SCALE_AS(float); break;
    case T_DOUBLE: SCALE_AS(double); break;
    case T_HALF: SCALE_16(half_to_float, float_to_half); break;
    case T_BF16: SCALE_16(bf16_to_float, float_to_bf16); break;
    default: break;
    }
}

static double scalar_value(int type, const void *p)
{
    switch (type) {
    case T_INT8: return *(const int8_t *)p;
    case T_UINT8: return *(const uint8_t *)p;
    case T_INT32: return *(const int32_t *)p;
    case T_UINT32: return *(const uint32_t *)p;
    case T_INT64: return (double)*(const int64_t *)p;
    case T_UINT64: return (double)*(const uint64_t *)p;
    case T_HALF: return half_to_float(*(const uint16_t *)p);
    case T_BF16: return bf16_to_float(*(const uint16_t *)p);
    case T_FLOAT: return *(const float *)p;
    case T_DOUBLE: return *(const double *)p;
    default: return 1;
    }
}

/* A reduction, as the collectives apply it: op, and for a pre-multiplied sum its factor. */
struct reduction {
    int op; /* OP_SUM .. OP_AVG */
    int premultiply;
    double factor;
};

static ncclResult_t reduction_of(const struct nccl_comm *c, int op, int type,
                                 struct reduction *out)
{
    if (type == T_FP8_E4M3 || type == T_FP8_E5M2)
        return fail_loudly(ncclInvalidUsage, "NCCL: the fake does not reduce fp8 data");
    if (op >= 0 && op < BUILTIN_OPS) {
        *out = (struct reduction){op, 0, 1};
        return ncclSuccess;
    }
    int index = op - BUILTIN_OPS;
    if (index < 0 || index >= MAX_CUSTOM_OPS || !c->ops[index].in_use ||
        c->ops[index].type != type)
        return fail(ncclInvalidArgument, "unknown reduction operator");
    const struct custom_op *custom = &c->ops[index];
    *out = (struct reduction){OP_SUM, 1,
                              scalar_value(type, custom->host ? (const void *)custom->scalar
                                                              : custom->device_scalar)};
    return ncclSuccess;
}

/* --- Collectives ---------------------------------------------------------------------------- */

enum {
    K_ALLREDUCE, K_BROADCAST, K_REDUCE, K_ALLGATHER, K_REDUCESCATTER, K_ALLTOALL, K_GATHER,
    K_SCATTER, KIND_COUNT
};
static const char *const KIND_NAMES[KIND_COUNT] = {
    "ncclAllReduce", "ncclBroadcast", "ncclReduce", "ncclAllGather", "ncclReduceScatter",
    "ncclAlltoAll", "ncclGather", "ncclScatter"};

/* Copies N bytes to DST where they differ from what it holds (see the top of the file). */
static void write_changed(unsigned char *dst, const unsigned char *src, size_t n)
{
    const size_t page = 4096;
    for (size_t at = 0; at < n; at += page) {
        size_t len = n - at < page ? n - at : page;
        if (memcmp(dst + at, src + at, len) != 0)
            memcpy(dst + at, src + at, len);
    }
}

/* The per-call state a collective's rounds share. */
struct collective {
    struct nccl_comm *c;
    int kind, type, root;
    struct reduction reduction;
    size_t size;                  /* bytes per element */
    unsigned char *accumulator;   /* CHUNK bytes: a reduction's running result */
    unsigned char *scaled;        /* CHUNK bytes: a pre-multiplied contribution */
    int checked;                  /* the ranks' calls were compared */
    char what[96];
};

/* Publishes this rank's call, so that the first barrier's check can compare. */
static ncclResult_t start(struct collective *k, size_t count)
{
    struct nccl_comm *c = k->c;
    c->sequence++;
    snprintf(k->what, sizeof k->what, "in %s #%llu", KIND_NAMES[k->kind],
             (unsigned long long)c->sequence);
    c->region->calls[c->rank] = (struct call){c->sequence, k->kind, k->type,
                                              k->reduction.op, k->root, count};
    k->accumulator = malloc(2 * (size_t)CHUNK);
    if (!k->accumulator)
        return fail_loudly(ncclSystemError, "NCCL: out of host memory %s", k->what);
    k->scaled = k->accumulator + CHUNK;
    return ncclSuccess;
}

static ncclResult_t finish(struct collective *k, ncclResult_t result)
{
    free(k->accumulator);
    return result;
}

static ncclResult_t check_same(struct collective *k)
{
    struct nccl_comm *c = k->c;
    const struct call *mine = &c->region->calls[c->rank];
    for (int i = 0; i < c->nranks; i++) {
        const struct call *theirs = &c->region->calls[i];
        if (memcmp(theirs, mine, sizeof *mine) != 0) {
            atomic_store(&c->region->failed, 1);
            return fail_loudly(
                ncclInvalidUsage,
                "NCCL rank %d of %d called %s #%llu (%llu elements of type %d, root %d) while "
                "rank %d called %s #%llu (%llu elements of type %d, root %d)",
                c->rank, c->nranks, KIND_NAMES[mine->kind],
                (unsigned long long)mine->sequence, (unsigned long long)mine->count,
                mine->type, mine->root, i,
                theirs->kind >= 0 && theirs->kind < KIND_COUNT ? KIND_NAMES[theirs->kind] : "?",
                (unsigned long long)theirs->sequence, (unsigned long long)theirs->count,
                theirs->type, theirs->root);
        }
    }
    return ncclSuccess;
}

/* What a rank does with the slots in one round. */
enum { TAKE_NOTHING, TAKE_REDUCTION, TAKE_SLOT, TAKE_EVERY_SLOT };

/* One round: this rank puts N bytes from SRC (NULL: nothing) into its slot; after the
 * barrier it takes, per TAKE: the reduction of all slots' N bytes into DST, FROM's slot into
 * DST, or every rank r's slot into DST + r * STRIDE; then all meet again. */
static ncclResult_t round_trip(struct collective *k, const unsigned char *src, size_t n,
                               int take, unsigned char *dst, int from, size_t stride)
{
    struct nccl_comm *c = k->c;
    if (src && n)
        memcpy(slot(c, c->rank), src, n);
    ncclResult_t result = barrier(c, k->what);
    if (!result && !k->checked) {
        k->checked = 1;
        result = check_same(k);
    }
    if (result)
        return result;
    size_t elements = n / k->size;
    switch (take) {
    case TAKE_REDUCTION:
        for (int r = 0; r < c->nranks; r++) {
            const unsigned char *contribution = slot(c, r);
            if (k->reduction.premultiply) {
                memcpy(k->scaled, contribution, n);
                scale(k->type, k->scaled, elements, k->reduction.factor, 1);
                contribution = k->scaled;
            }
            if (r == 0)
                memcpy(k->accumulator, contribution, n);
            else
                combine(k->type, k->reduction.op, k->accumulator, contribution, elements);
        }
        if (k->reduction.op == OP_AVG)
            scale(k->type, k->accumulator, elements, c->nranks, 0);
        write_changed(dst, k->accumulator, n);
        break;
    case TAKE_SLOT:
        write_changed(dst, slot(c, from), n);
        break;
    case TAKE_EVERY_SLOT:
        for (int r = 0; r < c->nranks; r++)
            write_changed(dst + (size_t)r * stride, slot(c, r), n);
        break;
    default:
        break;
    }
    return barrier(c, k->what);
}

/* The largest round for elements of SIZE bytes. */
static size_t round_bytes(size_t size) { return CHUNK / size * size; }

/* One rank's collectives: the result is what the rank itself sent (an average of one is
 * itself, a pre-multiplied sum is scaled). */
static ncclResult_t single(const struct nccl_comm *c, int kind, const void *send, void *recv,
                           size_t count, int type, int op)
{
    size_t size = type_size(type);
    if (send && recv && send != recv && count)
        memmove(recv, send, count * size);
    if (kind == K_ALLREDUCE || kind == K_REDUCE || kind == K_REDUCESCATTER) {
        struct reduction reduction;
        ncclResult_t result = reduction_of(c, op, type, &reduction);
        if (result)
            return result;
        if (reduction.premultiply && recv)
            scale(type, recv, count, reduction.factor, 1);
    }
    return ncclSuccess;
}

/* Runs collective KIND. COUNT is per rank: the elements each rank sends (all-reduce,
 * broadcast, reduce, all-gather, gather) or receives (reduce-scatter, all-to-all and scatter
 * blocks). */
static ncclResult_t collective(int kind, const void *send, void *recv, size_t count, int type,
                               int op, int root, ncclComm_t c)
{
    if (!c)
        return fail(ncclInvalidArgument, "comm is NULL");
    size_t size = type_size(type);
    if (!size)
        return fail(ncclInvalidArgument, "unknown data type");
    if (root < 0 || root >= c->nranks)
        return fail(ncclInvalidArgument, "root out of range");
    if (!c->region)
        return single(c, kind, send, recv, count, type, op);
    struct collective k = {.c = c, .kind = kind, .type = type, .root = root, .size = size};
    int reduces = kind == K_ALLREDUCE || kind == K_REDUCE || kind == K_REDUCESCATTER;
    ncclResult_t result = reduces ? reduction_of(c, op, type, &k.reduction) : ncclSuccess;
    if (!reduces)
        k.reduction.op = -1;
    if (result || (result = start(&k, count)))
        return result;
    const unsigned char *in = send;
    unsigned char *out = recv;
    size_t total = count * size, step = round_bytes(size), block = total;
    int me = c->rank, n = c->nranks;
    /* Rounds of STEP bytes; the blocked collectives loop over the destination rank too. */
    for (int d = 0; d < n && !result; d++) {
        for (size_t at = 0; at < total && !result; at += step) {
            size_t len = total - at < step ? total - at : step;
            switch (kind) {
            case K_ALLREDUCE:
                result = round_trip(&k, in + at, len, TAKE_REDUCTION, out + at, 0, 0);
                break;
            case K_REDUCE:
                result = round_trip(&k, in + at, len, me == root ? TAKE_REDUCTION : TAKE_NOTHING,
                                    out + at, 0, 0);
                break;
            case K_BROADCAST:
                result = round_trip(&k, me == root ? in + at : NULL, len, TAKE_SLOT, out + at,
                                    root, 0);
                break;
            case K_ALLGATHER:
                result = round_trip(&k, in + at, len, TAKE_EVERY_SLOT, out + at, 0, block);
                break;
            case K_GATHER:
                result = round_trip(&k, in + at, len, me == root ? TAKE_EVERY_SLOT : TAKE_NOTHING,
                                    out + at, 0, block);
                break;
            case K_REDUCESCATTER: /* block d of every rank, reduced, to rank d */
                result = round_trip(&k, in + (size_t)d * block + at, len,
                                    me == d ? TAKE_REDUCTION : TAKE_NOTHING, out + at, 0, 0);
                break;
            case K_ALLTOALL: /* block d of every rank to rank d, in the senders' order */
                result = round_trip(&k, in + (size_t)d * block + at, len,
                                    me == d ? TAKE_EVERY_SLOT : TAKE_NOTHING, out + at, 0, block);
                break;
            case K_SCATTER: /* the root's block d to rank d */
                result = round_trip(&k, me == root ? in + (size_t)d * block + at : NULL, len,
                                    me == d ? TAKE_SLOT : TAKE_NOTHING, out + at, root, 0);
                break;
            default:
                result = fail(ncclInvalidArgument, "unknown collective");
            }
        }
        int blocked = kind == K_REDUCESCATTER || kind == K_ALLTOALL || kind == K_SCATTER;
        if (!blocked)
            break;
    }
    if (!result && total == 0) /* still a collective: the ranks meet and compare calls */
        result = round_trip(&k, NULL, 0, TAKE_NOTHING, NULL, 0, 0);
    return finish(&k, result);
}

FG_EXPORT ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, int t, int op,
                                     ncclComm_t c, void *stream)
{
    return collective(K_ALLREDUCE, s, r, n, t, op, 0, c);
}
FG_EXPORT ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, int t, int root,
                                     ncclComm_t c, void *stream)
{
    return collective(K_BROADCAST, s, r, n, t, -1, root, c);
}
FG_EXPORT ncclResult_t ncclBcast(void *b, size_t n, int t, int root, ncclComm_t c, void *stream)
{
    return collective(K_BROADCAST, b, b, n, t, -1, root, c);
}
FG_EXPORT ncclResult_t ncclReduce(const void *s, void *r, size_t n, int t, int op, int root,
                                  ncclComm_t c, void *stream)
{
    return collective(K_REDUCE, s, r, n, t, op, root, c);
}
FG_EXPORT ncclResult_t ncclAllGather(const void *s, void *r, size_t n, int t, ncclComm_t c,
                                     void *stream)
{
    return collective(K_ALLGATHER, s, r, n, t, -1, 0, c);
}
FG_EXPORT ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, int t, int op,
                                         ncclComm_t c, void *stream)
{
    return collective(K_REDUCESCATTER, s, r, n, t, op, 0, c);
}
FG_EXPORT ncclResult_t ncclAlltoAll(const void *s, void *r, size_t n, int t, ncclComm_t c,
                                    void *stream)
{
    return collective(K_ALLTOALL, s, r, n, t, -1, 0, c);
}
FG_EXPORT ncclResult_t ncclGather(const void *s, void *r, size_t n, int t, int root,
                                  ncclComm_t c, void *stream)
{
    return collective(K_GATHER, s, r, n, t, -1, root, c);
}
FG_EXPORT ncclResult_t ncclScatter(const void *s, void *r, size_t n, int t, int root,
                                   ncclComm_t c, void *stream)
{
    return collective(K_SCATTER, s, r, n, t, -1, root, c);
}

/* --- Point to point ------------------------------------------------------------------------ */

/* A send or receive waiting for its group to end (or running alone). */
struct p2p {
    ncclComm_t comm;
    int send, peer;
    unsigned char *data;
    size_t bytes, done;
    int matched; /* one-rank communicators: a receive already paired with this send */
};
#define MAX_GROUP_P2P 4096
static __thread struct p2p group_ops[MAX_GROUP_P2P];
static __thread int group_count, group_depth, group_overflow;

/* Moves one chunk of OP if its mailbox allows: 1 when it did. */
static ncclResult_t p2p_step(struct p2p *op, int *moved)
{
    struct nccl_comm *c = op->comm;
    struct region *r = c->region;
    struct mailbox *box = op->send ? mailbox(c, c->rank, op->peer) : mailbox(c, op->peer, c->rank);
    unsigned char *data = (unsigned char *)box + sizeof *box;
    uint32_t filled = atomic_load(&box->filled), emptied = atomic_load(&box->emptied);
    if (op->send && filled == emptied) {
        size_t n = op->bytes - op->done < P2P_CHUNK ? op->bytes - op->done : P2P_CHUNK;
        if (n)
            memcpy(data, op->data + op->done, n);
        box->bytes = n;
        box->message = op->bytes;
        op->done += n;
        atomic_store(&box->filled, filled + 1);
    } else if (!op->send && filled == emptied + 1) {
        if (box->message != op->bytes)
            return fail_loudly(ncclInvalidUsage,
                               "NCCL rank %d of %d: ncclRecv of %zu bytes from rank %d, which "
                               "sent %llu", c->rank, c->nranks, op->bytes, op->peer,
                               (unsigned long long)box->message);
        if (box->bytes)
            write_changed(op->data + op->done, data, box->bytes);
        op->done += box->bytes;
        atomic_store(&box->emptied, emptied + 1);
    } else
        return ncclSuccess;
    *moved = 1;
    /* A message of 0 bytes still passes one (empty) chunk. */
    if (op->done == op->bytes)
        op->done = op->bytes + 1;
    atomic_fetch_add(&r->p2p_changes, 1);
    syscall(SYS_futex, &r->p2p_changes, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    return ncclSuccess;
}

/* Runs OPS (a group) until every one is done: each moves a chunk whenever its mailbox lets
 * it; with nothing to move, the thread waits (at most 10 ms at a time) for a peer's move. */
static ncclResult_t p2p_run(struct p2p *ops, int count)
{
    /* One-rank communicators: each receive takes the next send of the same communicator. */
    for (int i = 0; i < count; i++) {
        if (ops[i].comm->region || ops[i].send)
            continue;
        int j = 0;
        while (j < count && !(ops[j].send && !ops[j].matched && ops[j].comm == ops[i].comm))
            j++;
        if (j == count)
            return fail_loudly(ncclInvalidUsage,
                               "NCCL: ncclRecv on a one-rank communicator without a send");
        ops[j].matched = 1;
        if (ops[j].bytes != ops[i].bytes)
            return fail_loudly(ncclInvalidUsage, "NCCL: ncclRecv of %zu bytes, ncclSend of %zu",
                               ops[i].bytes, ops[j].bytes);
        if (ops[i].bytes && ops[i].data != ops[j].data)
            memmove(ops[i].data, ops[j].data, ops[i].bytes);
        ops[i].done = ops[j].done = ops[i].bytes + 1;
    }
    double start = now(), next_check = start + 1;
    for (;;) {
        int pending = -1, moved = 0;
        uint32_t seen = 0;
        for (int i = 0; i < count; i++) {
            if (ops[i].done > ops[i].bytes)
                continue;
            struct region *r = ops[i].comm->region;
            if (pending < 0) {
                pending = i;
                seen = atomic_load(&r->p2p_changes);
            }
            if (atomic_load(&r->failed))
                return fail_loudly(ncclRemoteError, "NCCL rank %d of %d: another rank gave up "
                                   "(point to point)", ops[i].comm->rank, ops[i].comm->nranks);
            /* Messages between two ranks one way pass in the order they were posted. */
            int earlier = 0;
            for (int j = 0; j < i && !earlier; j++)
                earlier = ops[j].done <= ops[j].bytes && ops[j].comm == ops[i].comm &&
                          ops[j].send == ops[i].send && ops[j].peer == ops[i].peer;
            if (earlier)
                continue;
            ncclResult_t result = p2p_step(&ops[i], &moved);
            if (result)
                return result;
        }
        if (pending < 0)
            return ncclSuccess;
        if (moved)
            continue;
        struct nccl_comm *c = ops[pending].comm;
        struct timespec slice = {0, 10 * 1000 * 1000};
        syscall(SYS_futex, &c->region->p2p_changes, FUTEX_WAIT, seen, &slice, NULL, 0);
        double t = now();
        if (t >= next_check) {
            next_check = t + 1;
            pid_t pid = atomic_load(&c->region->pids[ops[pending].peer]);
            if (ops[pending].peer != c->rank && exited(pid)) {
                atomic_store(&c->region->failed, 1);
                return fail_loudly(ncclRemoteError,
                                   "NCCL rank %d of %d: rank %d (pid %d) exited (point to point)",
                                   c->rank, c->nranks, ops[pending].peer, (int)pid);
            }
        }
        if (t - start > timeout_seconds()) {
            atomic_store(&c->region->failed, 1);
            return fail_loudly(ncclSystemError,
                               "NCCL rank %d of %d: waited %.0f s for rank %d's matching %s; "
                               "giving up (VRAMSHIM_FAKEGPU_NCCL_TIMEOUT)",
                               c->rank, c->nranks, timeout_seconds(), ops[pending].peer,
                               ops[pending].send ? "ncclRecv" : "ncclSend");
        }
    }
}

static ncclResult_t point_to_point(ncclComm_t c, int send, void *data, size_t count, int type,
                                   int peer)
{
    if (!c)
        return fail(ncclInvalidArgument, "comm is NULL");
    size_t size = type_size(type);
    if (!size)
        return fail(ncclInvalidArgument, "unknown data type");
    if (peer < 0 || peer >= c->nranks)
        return fail_loudly(ncclInvalidArgument, "NCCL rank %d of %d: peer %d out of range",
                           c->rank, c->nranks, peer);
    if (count && !data)
        return fail(ncclInvalidArgument, "buffer is NULL");
    struct p2p op = {.comm = c, .send = send, .peer = peer, .data = data, .bytes = count * size};
    if (group_depth == 0)
        return p2p_run(&op, 1);
    if (group_count == MAX_GROUP_P2P) {
        group_overflow = 1;
        return fail_loudly(ncclInvalidUsage, "NCCL: more than %d sends and receives in one group",
                           MAX_GROUP_P2P);
    }
    group_ops[group_count++] = op;
    return ncclSuccess;
}

FG_EXPORT ncclResult_t ncclSend(const void *s, size_t n, int t, int peer, ncclComm_t c,
                                void *stream)
{
    return point_to_point(c, 1, (void *)s, n, t, peer);
}
FG_EXPORT ncclResult_t ncclRecv(void *r, size_t n, int t, int peer, ncclComm_t c, void *stream)
{
    return point_to_point(c, 0, r, n, t, peer);
}

/* Groups defer sends and receives to ncclGroupEnd (collectives run at once: every rank calls
 * them in the same order). */
FG_EXPORT ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

FG_EXPORT ncclResult_t ncclGroupEnd(void)
{
    if (group_depth == 0)
        return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group_depth > 0)
        return ncclSuccess;
    int count = group_count, overflow = group_overflow;
    group_count = group_overflow = 0;
    if (overflow)
        return fail(ncclInvalidUsage, "too many sends and receives in one group");
    return p2p_run(group_ops, count);
}

/* A sum of each rank's data times a scalar (host: by value now; device: read at each use). */
FG_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(int *op, void *scalar, int type, int residence,
                                                ncclComm_t c)
{
    if (!op || !scalar || !c)
        return fail(ncclInvalidArgument, "NULL argument");
    if (!type_size(type) || type == T_FP8_E4M3 || type == T_FP8_E5M2)
        return fail(ncclInvalidArgument, "unsupported data type");
    for (int i = 0; i < MAX_CUSTOM_OPS; i++) {
        struct custom_op *custom = &c->ops[i];
        if (custom->in_use)
            continue;
        *custom = (struct custom_op){.in_use = 1, .type = type, .host = residence == 1};
        if (custom->host)
            memcpy(custom->scalar, scalar, type_size(type));
        else
            custom->device_scalar = scalar;
        *op = BUILTIN_OPS + i;
        return ncclSuccess;
    }
    return fail(ncclInvalidUsage, "too many reduction operators");
}

FG_EXPORT ncclResult_t ncclRedOpDestroy(int op, ncclComm_t c)
{
    int index = op - BUILTIN_OPS;
    if (!c || index < 0 || index >= MAX_CUSTOM_OPS || !c->ops[index].in_use)
        return fail(ncclInvalidArgument, "unknown reduction operator");
    c->ops[index].in_use = 0;
    return ncclSuccess;
}

/* A new communicator of the ranks that pass the same COLOR, ordered by KEY then by rank in
 * COMM: the ranks exchange (color, key) with an all-gather on COMM, then join a region named
 * after COMM's and the split's number. */
FG_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                     void *config)
{
    if (!comm || !newcomm)
        return fail(ncclInvalidArgument, "comm is NULL");
    int64_t mine[2] = {color, key}, all[2 * MAX_RANKS];
    ncclResult_t result = comm->region
                              ? collective(K_ALLGATHER, mine, all, 2, T_INT64, -1, 0, comm)
                              : (all[0] = color, all[1] = key, ncclSuccess);
    if (result)
        return result;
    uint64_t split = ++comm->splits;
    if (color < 0) { /* NCCL_SPLIT_NOCOLOR: this rank joins no communicator */
        *newcomm = NULL;
        return ncclSuccess;
    }
    int nranks = 0, rank = 0;
    for (int r = 0; r < comm->nranks; r++) {
        if (all[2 * r] != color)
            continue;
        nranks++;
        if (all[2 * r + 1] < key || (all[2 * r + 1] == key && r < comm->rank))
            rank++;
    }
    char name[128];
    snprintf(name, sizeof name, "%.64s-%llu-%d", comm->name, (unsigned long long)split, color);
    return comm_new(newcomm, nranks, rank, comm->device, name);
}

FG_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buffer, size_t size,
                                        void **handle)
{
    if (!comm || !handle)
        return fail(ncclInvalidArgument, "NULL argument");
    *handle = buffer;
    return ncclSuccess;
}

FG_EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle)
{
    return comm ? ncclSuccess : fail(ncclInvalidArgument, "comm is NULL");
}

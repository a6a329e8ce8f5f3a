/* The fake NCCL (libnccl.so.2) for one process: communicators of one rank (ncclCommInitAll
 * makes one per listed device), collectives that complete at once. With one rank a collective
 * leaves the receive buffer holding what the rank sent, so the data moves as on a real run.
 * Communicators of several ranks (several processes) are not supported: ncclInvalidUsage. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FG_EXPORT __attribute__((visibility("default")))
typedef int ncclResult_t;
enum { ncclSuccess = 0, ncclSystemError = 2, ncclInvalidArgument = 4, ncclInvalidUsage = 5 };

/* NCCL 2.32.3: major * 10000 + minor * 100 + patch. */
#define FG_NCCL_VERSION 23203

typedef struct {
    char internal[128];
} ncclUniqueId;

struct nccl_comm {
    int rank, nranks, device;
};
typedef struct nccl_comm *ncclComm_t;

/* From the fake driver. */
int cuCtxGetDevice(int *device);

static __thread char last_error[256];

static ncclResult_t fail(ncclResult_t result, const char *message)
{
    snprintf(last_error, sizeof last_error, "%s", message);
    return result;
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
    memcpy(id->internal, "vramshim-fakegpu", 16);
    return ncclSuccess;
}

static ncclResult_t comm_new(ncclComm_t *comm, int nranks, int rank, int device)
{
    if (!comm)
        return fail(ncclInvalidArgument, "comm is NULL");
    if (nranks != 1 || rank != 0)
        return fail(ncclInvalidUsage,
                    "vramshim fakegpu: NCCL communicators of more than one rank are not supported");
    struct nccl_comm *c = calloc(1, sizeof *c);
    if (!c)
        return fail(ncclSystemError, "out of host memory");
    c->nranks = 1;
    c->device = device;
    *comm = c;
    return ncclSuccess;
}

static int current_device(void)
{
    int device = 0;
    cuCtxGetDevice(&device);
    return device;
}

FG_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    return comm_new(comm, nranks, rank, current_device());
}

FG_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id,
                                              int rank, void *config)
{
    return comm_new(comm, nranks, rank, current_device());
}

FG_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devices)
{
    if (!comms || ndev <= 0)
        return fail(ncclInvalidArgument, "bad communicator list");
    for (int i = 0; i < ndev; i++) {
        ncclResult_t r = comm_new(&comms[i], 1, 0, devices ? devices[i] : i);
        if (r)
            return r;
        comms[i]->rank = i;
        comms[i]->nranks = ndev;
    }
    return ncclSuccess;
}

FG_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                     void *config)
{
    if (!comm || !newcomm)
        return fail(ncclInvalidArgument, "comm is NULL");
    if (color < 0) { /* NCCL_SPLIT_NOCOLOR: this rank joins no communicator */
        *newcomm = NULL;
        return ncclSuccess;
    }
    return comm_new(newcomm, 1, 0, comm->device);
}

FG_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    free(comm);
    return ncclSuccess;
}

FG_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }
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
    *error = ncclSuccess;
    return ncclSuccess;
}

FG_EXPORT ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
FG_EXPORT ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

FG_EXPORT const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "unhandled system error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    default: return "unknown result code";
    }
}

FG_EXPORT const char *ncclGetLastError(ncclComm_t comm) { return last_error; }

static size_t type_size(int type)
{
    static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return type >= 0 && type < (int)(sizeof sizes / sizeof *sizes) ? sizes[type] : 0;
}

/* One rank: the result of every collective is the rank's own contribution. */
static ncclResult_t one_rank(const void *send, void *recv, size_t count, int type, ncclComm_t comm)
{
    size_t size = type_size(type);
    if (!comm)
        return fail(ncclInvalidArgument, "comm is NULL");
    if (!size)
        return fail(ncclInvalidArgument, "unknown data type");
    if (send && recv && send != recv && count)
        memmove(recv, send, count * size);
    return ncclSuccess;
}

FG_EXPORT ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, int t, int op,
                                     ncclComm_t c, void *stream)
{
    return one_rank(s, r, n, t, c);
}
FG_EXPORT ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, int t, int root,
                                     ncclComm_t c, void *stream)
{
    return one_rank(s, r, n, t, c);
}
FG_EXPORT ncclResult_t ncclBcast(void *b, size_t n, int t, int root, ncclComm_t c, void *stream)
{
    return one_rank(b, b, n, t, c);
}
FG_EXPORT ncclResult_t ncclReduce(const void *s, void *r, size_t n, int t, int op, int root,
                                  ncclComm_t c, void *stream)
{
    return one_rank(s, r, n, t, c);
}
FG_EXPORT ncclResult_t ncclAllGather(const void *s, void *r, size_t n, int t, ncclComm_t c,
                                     void *stream)
{
    return one_rank(s, r, n, t, c);
}
FG_EXPORT ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, int t, int op,
                                         ncclComm_t c, void *stream)
{
    return one_rank(s, r, n, t, c);
}
FG_EXPORT ncclResult_t ncclAlltoAll(const void *s, void *r, size_t n, int t, ncclComm_t c,
                                    void *stream)
{
    return one_rank(s, r, n, t, c);
}
FG_EXPORT ncclResult_t ncclGather(const void *s, void *r, size_t n, int t, int root,
                                  ncclComm_t c, void *stream)
{
    return one_rank(s, r, n, t, c);
}
FG_EXPORT ncclResult_t ncclScatter(const void *s, void *r, size_t n, int t, int root,
                                   ncclComm_t c, void *stream)
{
    return one_rank(s, r, n, t, c);
}
/* Point to point with one rank can only be to itself: the matching send/recv pair completes. */
FG_EXPORT ncclResult_t ncclSend(const void *s, size_t n, int t, int peer, ncclComm_t c,
                                void *stream)
{
    return c ? ncclSuccess : fail(ncclInvalidArgument, "comm is NULL");
}
FG_EXPORT ncclResult_t ncclRecv(void *r, size_t n, int t, int peer, ncclComm_t c, void *stream)
{
    return c ? ncclSuccess : fail(ncclInvalidArgument, "comm is NULL");
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

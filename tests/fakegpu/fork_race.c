/* Fork children of a program whose other threads are inside fake calls. Five threads keep making
 * one kind of call each (plain allocations with a copy and cudaMemGetInfo, stream-ordered pool
 * allocations with a synchronisation and a trim, VMM reserve/create/map/unmap, stream capture of
 * graph memory with instantiate and launch, IPC export), each kind taking its own locks of the
 * fake driver; the main thread forks FORKS times, and every child makes each kind of call once
 * and exits 0 (or with the number of the kind that failed). A child still running after 5 s is
 * counted as hung (killed), and the forking stops there (forks= says how many were made). Then
 * two forks from inside host callbacks (cudaLaunchHostFunc, cudaStreamAddCallback), the threads
 * still running: the child makes every kind of call too.
 * Prints "forks=N hung=H failed=F" and one line per callback. With "signal" after FORKS: the
 * threads run and FORKS signals make the main thread fork from its handler (signal_forks).
 * Built with -DCUDA_MAJOR=13 or 12. */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaGraph_t;
typedef void *cudaGraphExec_t;
typedef void *cudaMemPool_t;
typedef struct { char reserved[64]; } cudaIpcMemHandle_t;
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device);
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaDeviceGraphMemTrim(int device);
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *p);
cudaError_t cudaLaunchHostFunc(cudaStream_t s, void (*fn)(void *), void *data);
cudaError_t cudaStreamAddCallback(cudaStream_t s, void (*fn)(cudaStream_t, cudaError_t, void *),
                                  void *data, unsigned int flags);

/* The driver's VMM calls (libcuda.so.1 is loaded with the runtime). */
typedef struct { int type, id; } CUmemLocation;
typedef struct {
    int type, requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;
static int (*cu_granularity)(size_t *, const CUmemAllocationProp *, int);
static int (*cu_reserve)(unsigned long long *, size_t, size_t, unsigned long long,
                         unsigned long long);
static int (*cu_create)(unsigned long long *, size_t, const CUmemAllocationProp *,
                        unsigned long long);
static int (*cu_map)(unsigned long long, size_t, size_t, unsigned long long, unsigned long long);
static int (*cu_set_access)(unsigned long long, size_t, const CUmemAccessDesc *, size_t);
static int (*cu_unmap)(unsigned long long, size_t);
static int (*cu_release)(unsigned long long);
static int (*cu_address_free)(unsigned long long, size_t);

#define RELAXED 2 /* cudaStreamCaptureModeRelaxed: other threads' calls stay allowed */
#define KINDS 5
static const char *kind_names[KINDS] = {"malloc", "pool", "vmm", "capture", "ipc"};

/* One call of each kind; 0 when it all succeeded. S: a stream of the calling thread's. */
static int malloc_round(cudaStream_t s)
{
    (void)s;
    void *p;
    char bytes[4096] = {1};
    size_t free_bytes, total;
    if (cudaMalloc(&p, 4096))
        return 1;
    int rc = cudaMemcpy(p, bytes, sizeof bytes, 1) || cudaMemGetInfo(&free_bytes, &total);
    return cudaFree(p) || rc;
}

static int pool_round(cudaStream_t s)
{
    void *p;
    cudaMemPool_t pool;
    if (cudaMallocAsync(&p, 8192, s))
        return 1;
    return cudaFreeAsync(p, s) || cudaStreamSynchronize(s) ||
           cudaDeviceGetDefaultMemPool(&pool, 0) || cudaMemPoolTrimTo(pool, 0);
}

static int vmm_round(cudaStream_t s)
{
    (void)s;
    CUmemAllocationProp prop = {.type = 1, .location = {1, 0}};
    CUmemAccessDesc access = {{1, 0}, 3};
    size_t size;
    unsigned long long base, handle;
    if (cu_granularity(&size, &prop, 0) || cu_reserve(&base, size, 0, 0, 0))
        return 1;
    int rc = cu_create(&handle, size, &prop, 0);
    if (!rc) {
        rc = cu_map(base, size, 0, handle, 0) || cu_set_access(base, size, &access, 1) ||
             cu_unmap(base, size);
        rc |= cu_release(handle);
    }
    return cu_address_free(base, size) || rc;
}

static int capture_round(cudaStream_t s)
{
    void *p;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    if (cudaStreamBeginCapture(s, RELAXED))
        return 1;
    int rc = cudaMallocAsync(&p, 4096, s) || cudaFreeAsync(p, s);
    if (cudaStreamEndCapture(s, &graph) || rc)
        return 1;
    rc = cudaGraphInstantiate(&exec, graph, 0);
    if (!rc) {
        rc = cudaGraphLaunch(exec, s) || cudaStreamSynchronize(s);
        rc |= cudaGraphExecDestroy(exec);
    }
    return cudaGraphDestroy(graph) || cudaDeviceGraphMemTrim(0) || rc;
}

static int ipc_round(cudaStream_t s)
{
    (void)s;
    void *p;
    cudaIpcMemHandle_t handle;
    if (cudaMalloc(&p, 4096))
        return 1;
    int rc = cudaIpcGetMemHandle(&handle, p);
    return cudaFree(p) || rc;
}

static int (*const rounds[KINDS])(cudaStream_t) = {malloc_round, pool_round, vmm_round,
                                                   capture_round, ipc_round};

static volatile int stop;
static int thread_failed[KINDS];

static void *hammer(void *arg)
{
    int kind = (int)(long)arg;
    cudaStream_t s;
    if (cudaStreamCreate(&s)) {
        thread_failed[kind] = 1;
        return NULL;
    }
    while (!stop)
        if (rounds[kind](s))
            thread_failed[kind] = 1;
    return NULL;
}

/* In a fork child: every kind of call once, then _exit (0, or 1 + the kind that failed). */
static void child_calls(void)
{
    cudaStream_t s;
    if (cudaStreamCreate(&s))
        _exit(1 + KINDS);
    for (int k = 0; k < KINDS; k++)
        if (rounds[k](s))
            _exit(1 + k);
    _exit(0);
}

enum { CHILD_OK, CHILD_HUNG, CHILD_FAILED };

/* Waits up to 5 s for the child; a hung one is killed. */
static int wait_child(pid_t child, int *failed_kind)
{
    int status = 0;
    for (int waited = 0; waited < 5000; waited++) {
        if (waitpid(child, &status, WNOHANG) == child) {
            if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
                return CHILD_OK;
            *failed_kind = WIFEXITED(status) ? WEXITSTATUS(status) - 1 : -1;
            return CHILD_FAILED;
        }
        struct timespec pause = {0, 1000000};
        nanosleep(&pause, NULL);
    }
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    return CHILD_HUNG;
}

static const char *outcome_name(int outcome)
{
    return outcome == CHILD_OK ? "ok" : outcome == CHILD_HUNG ? "hung" : "failed";
}

static int fork_and_wait(void)
{
    int failed_kind = 0;
    pid_t child = fork();
    if (child < 0)
        return CHILD_FAILED;
    if (child == 0)
        child_calls();
    int outcome = wait_child(child, &failed_kind);
    if (outcome == CHILD_FAILED)
        fprintf(stderr, "child failed at %s\n",
                failed_kind >= 0 && failed_kind < KINDS ? kind_names[failed_kind] : "start");
    return outcome;
}

static int callback_outcome[2];
static void host_func(void *data) { *(int *)data = fork_and_wait(); }
static void stream_callback(cudaStream_t s, cudaError_t status, void *data)
{
    (void)s;
    (void)status;
    *(int *)data = fork_and_wait();
}

/* Forks from a signal handler that may interrupt the main thread inside a fake call (holding a
 * fake lock): the child ends at once (_exit is async-signal-safe; a fake call could wait on the
 * lock the interrupted call holds, as it would in the parent). The main thread's loop avoids
 * calls that allocate host memory once warm: glibc's own fork waits for malloc's locks. */
#define SIGNAL_FORKS_MAX 1000
static volatile pid_t signal_children[SIGNAL_FORKS_MAX];
static volatile int signal_child_count, signals_sent_done;
static void fork_in_handler(int sig)
{
    (void)sig;
    pid_t child = fork();
    if (child == 0)
        _exit(0);
    if (child > 0 && signal_child_count < SIGNAL_FORKS_MAX)
        signal_children[signal_child_count++] = child;
}

struct signal_target {
    pthread_t thread;
    int count;
};

static void *send_signals(void *arg)
{
    struct signal_target *t = arg;
    for (int i = 0; i < t->count; i++) {
        pthread_kill(t->thread, SIGUSR1);
        struct timespec pause = {0, 300000};
        nanosleep(&pause, NULL);
    }
    signals_sent_done = 1;
    return NULL;
}

static int signal_forks(int count)
{
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = fork_in_handler;
    action.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &action, NULL);
    struct signal_target target = {pthread_self(), count};
    pthread_t sender;
    pthread_create(&sender, NULL, send_signals, &target);
    void *p[4];
    size_t free_bytes, total;
    while (!signals_sent_done) {
        for (int i = 0; i < 4; i++)
            cudaMalloc(&p[i], 4096);
        cudaMemGetInfo(&free_bytes, &total);
        for (int i = 0; i < 4; i++)
            cudaFree(p[i]);
    }
    pthread_join(sender, NULL);
    signal(SIGUSR1, SIG_IGN);
    int hung = 0, failed = 0, failed_kind;
    for (int i = 0; i < signal_child_count; i++) {
        int outcome = wait_child(signal_children[i], &failed_kind);
        hung += outcome == CHILD_HUNG;
        failed += outcome == CHILD_FAILED;
    }
    /* Signals sent while one is being handled merge: fewer forks than signals. */
    printf("signal forks=%d hung=%d failed=%d\n", signal_child_count, hung, failed);
    return 0;
}

static void *driver(const char *name)
{
    void *fn = dlsym(RTLD_DEFAULT, name);
    if (!fn) {
        fprintf(stderr, "no %s\n", name);
        exit(2);
    }
    return fn;
}

int main(int argc, char **argv)
{
    int forks = argc > 1 ? atoi(argv[1]) : 100, hung = 0, failed = 0;
    cu_granularity = driver("cuMemGetAllocationGranularity");
    cu_reserve = driver("cuMemAddressReserve");
    cu_create = driver("cuMemCreate");
    cu_map = driver("cuMemMap");
    cu_set_access = driver("cuMemSetAccess");
    cu_unmap = driver("cuMemUnmap");
    cu_release = driver("cuMemRelease");
    cu_address_free = driver("cuMemAddressFree");
    cudaStream_t s;
    if (cudaFree(NULL) || cudaStreamCreate(&s)) {
        fprintf(stderr, "no device\n");
        return 2;
    }
    if (argc > 2 && !strcmp(argv[2], "signal")) { /* the threads run, the main one is signalled */
        pthread_t threads[KINDS];
        for (int k = 0; k < KINDS; k++)
            pthread_create(&threads[k], NULL, hammer, (void *)(long)k);
        signal_forks(forks);
        stop = 1;
        for (int k = 0; k < KINDS; k++)
            pthread_join(threads[k], NULL);
        return 0;
    }
    for (int k = 0; k < KINDS; k++) /* each kind works before any fork */
        if (rounds[k](s)) {
            fprintf(stderr, "%s fails without fork\n", kind_names[k]);
            return 2;
        }
    pthread_t threads[KINDS];
    for (int k = 0; k < KINDS; k++)
        pthread_create(&threads[k], NULL, hammer, (void *)(long)k);
    int made = 0;
    for (; made < forks && !hung; made++) {
        int outcome = fork_and_wait();
        hung += outcome == CHILD_HUNG;
        failed += outcome == CHILD_FAILED;
    }
    cudaLaunchHostFunc(s, host_func, &callback_outcome[0]);
    cudaStreamAddCallback(s, stream_callback, &callback_outcome[1], 0);
    stop = 1;
    for (int k = 0; k < KINDS; k++)
        pthread_join(threads[k], NULL);
    printf("forks=%d hung=%d failed=%d\n", made, hung, failed);
    printf("fork in cudaLaunchHostFunc callback: %s\n", outcome_name(callback_outcome[0]));
    printf("fork in cudaStreamAddCallback callback: %s\n", outcome_name(callback_outcome[1]));
    for (int k = 0; k < KINDS; k++)
        if (thread_failed[k])
            printf("thread %s: a call failed\n", kind_names[k]);
    return 0;
}

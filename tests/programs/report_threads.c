/*
 * report_threads: allocations of known sizes on named threads (linked -lcudart -lcuda), for
 * the `--by-thread` views and the recording of thread names.
 *
 * Usage: report_threads
 *
 *   thread                   function      allocations             freed
 *   main (report_threads)    weights       1 x 8 MiB cudaMalloc    at the end
 *   loader-0                 load_batch    3 x 1 MiB cudaMalloc    never
 *   loader-1                 load_batch    3 x 2 MiB cudaMalloc    never
 *   autograd                 grad_buffer   2 x 4 MiB cudaMalloc    never
 *   prefetch                 prefetch_buf  2 x 512 KiB cuMemAlloc  never
 *
 * loader-0 and loader-1 run the same code, so their allocations share one stack. The
 * autograd thread starts with the name it inherits (report_threads), makes its first
 * allocation, then names itself pt_autograd_0 (as PyTorch's autograd threads do), makes its
 * second allocation and exits. The prefetch thread names itself "prefetch", allocates,
 * renames itself "prefetch_late", sleeps 1.2 s, allocates again, tells main and stays alive
 * (blocked) until the process exits. Main frees weights only after every other allocation,
 * so the device-0 peak holds all of them (26 MiB in 11 allocations) and what leaks is the
 * threads' 18 MiB in 10.
 *
 * Each allocating call is on a line marked VIEW: <function>, each call of an allocating
 * function on a line marked CALL: <function>. Besides the operation lines, prints per thread
 *   thread role=<role> name=<final name> tid=<tid> pid=<pid>
 */
#include "common.h"
#include "cuda.h"
#include "cuda_runtime.h"

#include <pthread.h>
#include <stdint.h>
#include <time.h>

#define NOINLINE __attribute__((noinline))

/* Volatile, so that the compiler cannot unroll the loops into several call sites. */
static volatile int g_rounds = 3;
static volatile int g_grads = 2;

/* One line per operation even when threads print at once (stdio locks are recursive). */
#define LOCKED(statement)                                                                      \
    do {                                                                                       \
        flockfile(stdout);                                                                     \
        statement;                                                                             \
        funlockfile(stdout);                                                                   \
    } while (0)

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static int g_prefetch_done;

static void say_thread(const char *role, const char *name)
{
    LOCKED(out("thread role=%s name=%s tid=%d pid=%d", role, name, (int)gettid(),
               (int)getpid()));
}

static NOINLINE void *weights(size_t size)
{
    void *p = NULL;
    int rc = cudaMalloc(&p, size); /* VIEW: weights */
    LOCKED(emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)p, size, "fn=weights", rc));
    EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
    return p;
}

static NOINLINE void load_batch(size_t size, const char *role)
{
    void *p = NULL;
    int rc = cudaMalloc(&p, size); /* VIEW: load_batch */
    LOCKED(emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)p, size,
                xf("fn=load_batch thread=%s", role), rc));
    EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
}

static NOINLINE void grad_buffer(size_t size)
{
    void *p = NULL;
    int rc = cudaMalloc(&p, size); /* VIEW: grad_buffer */
    LOCKED(emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)p, size,
                "fn=grad_buffer thread=autograd", rc));
    EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
}

static NOINLINE void prefetch_buf(size_t size)
{
    CUdeviceptr p = 0;
    int rc = cuMemAlloc_v2(&p, size); /* VIEW: prefetch_buf */
    LOCKED(emit("alloc", "cuMemAlloc_v2", 0, "addr", p, size,
                "fn=prefetch_buf thread=prefetch", rc));
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAlloc_v2");
}

static NOINLINE void *loader_main(void *arg)
{
    int index = (int)(intptr_t)arg;
    char name[16];
    snprintf(name, sizeof name, "loader-%d", index);
    pthread_setname_np(pthread_self(), name);
    EXPECT_RC(cudaSetDevice(0), cudaSuccess, "cudaSetDevice");
    for (int i = 0; i < g_rounds; i++)
        load_batch((size_t)(index + 1) * MiB, name); /* CALL: load_batch */
    say_thread(name, name);
    return NULL;
}

static NOINLINE void *autograd_main(void *arg)
{
    (void)arg;
    EXPECT_RC(cudaSetDevice(0), cudaSuccess, "cudaSetDevice");
    for (int i = 0; i < g_grads; i++) {
        if (i == 1)
            pthread_setname_np(pthread_self(), "pt_autograd_0");
        grad_buffer(4 * MiB); /* CALL: grad_buffer */
    }
    say_thread("autograd", "pt_autograd_0");
    return NULL;
}

static NOINLINE void *prefetch_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "prefetch");
    EXPECT_RC(cudaSetDevice(0), cudaSuccess, "cudaSetDevice");
    for (int i = 0; i < 2; i++) {
        if (i == 1) {
            pthread_setname_np(pthread_self(), "prefetch_late");
            /* Longer than the recorder's once-a-second name check. */
            struct timespec pause = {1, 200000000};
            nanosleep(&pause, NULL);
        }
        prefetch_buf(512 * 1024); /* CALL: prefetch_buf */
    }
    say_thread("prefetch", "prefetch_late");
    pthread_mutex_lock(&g_lock);
    g_prefetch_done = 1;
    pthread_cond_signal(&g_cond);
    pthread_mutex_unlock(&g_lock);
    /* Stay alive: this thread's name must reach the log without its exit. */
    for (;;)
        pause();
    return NULL;
}

int main(void)
{
    g_prog = "report_threads";
    EXPECT_RC(cudaSetDevice(0), cudaSuccess, "cudaSetDevice");
    void *w = weights(8 * MiB); /* CALL: weights */
    say_thread("main", "report_threads");

    pthread_t loaders[2], autograd, prefetch;
    for (int i = 0; i < 2; i++)
        if (pthread_create(&loaders[i], NULL, loader_main, (void *)(intptr_t)i) != 0)
            die("pthread_create");
    if (pthread_create(&autograd, NULL, autograd_main, NULL) != 0)
        die("pthread_create");
    if (pthread_create(&prefetch, NULL, prefetch_main, NULL) != 0)
        die("pthread_create");
    for (int i = 0; i < 2; i++)
        pthread_join(loaders[i], NULL);
    pthread_join(autograd, NULL);
    pthread_mutex_lock(&g_lock);
    while (!g_prefetch_done)
        pthread_cond_wait(&g_cond, &g_lock);
    pthread_mutex_unlock(&g_lock);

    int rc = cudaFree(w);
    LOCKED(emit("free", "cudaFree", 0, "addr", (uintptr_t)w, 0, "fn=main", rc));
    EXPECT_RC(rc, cudaSuccess, "cudaFree");
    out("done report_threads");
    exit(0);
}

/*
 * bench THREADS PAIRS DEPTH (linked -lcuda, built -O2): each thread makes the
 * device-0 primary context current, recurses DEPTH non-inlined frames, waits
 * on a barrier with the others, then runs PAIRS cuMemAlloc_v2(4096) /
 * cuMemFree_v2 pairs.  The clock (CLOCK_MONOTONIC) runs from the barrier's
 * release to the last thread's end.  Prints:
 *   threads=<t> pairs=<p> depth=<d> ns_per_pair=<x> pairs_per_sec=<y>
 * pairs_per_sec = THREADS*PAIRS / wall time (aggregate throughput);
 * ns_per_pair = wall time / PAIRS, i.e. what one pair costs a thread
 * (equal to 1e9/pairs_per_sec when THREADS is 1).
 * Run with FAKECUDA_MEM=unlimited to keep the fake's accounting out of it.
 */
#include "common.h"
#include "cuda.h"

#include <pthread.h>
#include <time.h>

static long g_pairs;
static int g_depth;
static pthread_barrier_t g_start;
static CUcontext g_ctx;

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

__attribute__((noinline)) static long work(void)
{
    pthread_barrier_wait(&g_start);
    for (long i = 0; i < g_pairs; i++) {
        CUdeviceptr p;
        CUresult rc = cuMemAlloc_v2(&p, 4096);
        if (rc != CUDA_SUCCESS)
            die("cuMemAlloc_v2 returned %d", rc);
        rc = cuMemFree_v2(p);
        if (rc != CUDA_SUCCESS)
            die("cuMemFree_v2 returned %d", rc);
    }
    return g_pairs;
}

/* One real stack frame per level: no inlining, cloning or tail calls. */
__attribute__((noinline, noclone)) static long recurse(int n)
{
    volatile char frame[16];
    frame[0] = (char)n;
    long r = n > 0 ? recurse(n - 1) : work();
    __asm__ volatile("" : : "r"(frame) : "memory");
    return r + frame[0] - (char)n;
}

static void *thread_main(void *arg)
{
    (void)arg;
    if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS)
        die("cuCtxSetCurrent");
    recurse(g_depth);
    return NULL;
}

int main(int argc, char **argv)
{
    g_prog = "bench";
    if (argc != 4)
        die("usage: bench THREADS PAIRS DEPTH");
    int threads = atoi(argv[1]);
    g_pairs = atol(argv[2]);
    g_depth = atoi(argv[3]);
    if (threads < 1 || threads > 1024 || g_pairs < 1 || g_depth < 0 || g_depth > 100000)
        die("bad arguments");

    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    EXPECT_RC(cuDevicePrimaryCtxRetain(&g_ctx, 0), CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");

    pthread_barrier_init(&g_start, NULL, (unsigned)threads + 1);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 8u << 20);
    for (int t = 0; t < threads; t++)
        if (pthread_create(&th[t], &attr, thread_main, NULL) != 0)
            die("pthread_create");
    pthread_barrier_wait(&g_start);
    double t0 = now_ns();
    for (int t = 0; t < threads; t++)
        pthread_join(th[t], NULL);
    double wall = now_ns() - t0;
    free(th);

    double total = (double)threads * (double)g_pairs;
    out("threads=%d pairs=%ld depth=%d ns_per_pair=%.1f pairs_per_sec=%.0f", threads, g_pairs,
        g_depth, wall / (double)g_pairs, total / (wall / 1e9));
    return 0;
}

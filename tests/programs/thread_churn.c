/*
 * thread_churn: many short-lived threads, each making PAIRS (default 1)
 * cuMemAlloc_v2/cuMemFree_v2 pairs of 4096 bytes on device 0 and exiting, ALIVE of
 * them at once (each batch waits at a barrier before any of its threads exits), for
 * the host memory the recorder keeps per thread.
 *
 * Usage: thread_churn THREADS ALIVE [PAIRS]
 * Prints, from /proc/self/status (kB), after the main thread's own pair (the
 * recorder is started) and after every thread was joined:
 *   mem at=start hwm=<VmHWM> rss=<VmRSS>
 *   mem at=end hwm=<VmHWM> rss=<VmRSS>
 *   total threads=<n> calls=<n> rc=0
 */
#include "common.h"
#include "cuda.h"

#include <pthread.h>

static pthread_barrier_t g_barrier;
static CUcontext g_ctx;
static long g_pairs = 1;

static long status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        die("cannot open /proc/self/status");
    char line[256];
    size_t len = strlen(key);
    long value = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, len) == 0 && line[len] == ':')
            value = atol(line + len + 1);
    fclose(f);
    if (value < 0)
        die("no %s in /proc/self/status", key);
    return value;
}

static void print_mem(const char *at)
{
    out("mem at=%s hwm=%ld rss=%ld", at, status_kb("VmHWM"), status_kb("VmRSS"));
}

static int one_pair(void)
{
    CUdeviceptr p = 0;
    CUresult rc = cuMemAlloc_v2(&p, 4096);
    if (rc == CUDA_SUCCESS)
        rc = cuMemFree_v2(p);
    return rc;
}

static void *worker(void *arg)
{
    int *rc = arg;
    *rc = cuCtxSetCurrent(g_ctx);
    for (long i = 0; i < g_pairs && *rc == CUDA_SUCCESS; i++)
        *rc = one_pair();
    pthread_barrier_wait(&g_barrier);
    return NULL;
}

int main(int argc, char **argv)
{
    g_prog = "thread_churn";
    if (argc != 3 && argc != 4)
        die("usage: thread_churn THREADS ALIVE [PAIRS]");
    long threads = atol(argv[1]);
    int alive = atoi(argv[2]);
    if (argc == 4)
        g_pairs = atol(argv[3]);
    if (threads < 1 || alive < 1 || threads % alive != 0 || g_pairs < 1)
        die("THREADS must be a positive multiple of ALIVE, PAIRS positive");
    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    EXPECT_RC(cuDevicePrimaryCtxRetain(&g_ctx, 0), CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    EXPECT_RC(cuCtxSetCurrent(g_ctx), CUDA_SUCCESS, "cuCtxSetCurrent");
    EXPECT_RC(one_pair(), CUDA_SUCCESS, "main thread pair");
    print_mem("start");
    pthread_t *th = calloc((size_t)alive, sizeof *th);
    int *rcs = calloc((size_t)alive, sizeof *rcs);
    if (!th || !rcs)
        die("out of memory");
    pthread_barrier_init(&g_barrier, NULL, (unsigned)alive);
    long calls = 2;
    for (long done = 0; done < threads; done += alive) {
        for (int t = 0; t < alive; t++)
            if (pthread_create(&th[t], NULL, worker, &rcs[t]) != 0)
                die("pthread_create");
        for (int t = 0; t < alive; t++) {
            pthread_join(th[t], NULL);
            EXPECT_RC(rcs[t], CUDA_SUCCESS, "worker");
            calls += 2 * g_pairs;
        }
    }
    print_mem("end");
    out("total threads=%ld calls=%ld rc=0", threads, calls);
    return 0;
}

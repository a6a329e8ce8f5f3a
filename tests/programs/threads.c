/*
 * threads: 8 threads x 10000 cuMemAlloc_v2/cuMemFree_v2 pairs (linked -lcuda).
 * Thread t names itself "worker-<t>" first, works on device t % 2 and
 * allocates (t+1)*4096 + (i%7)*512 bytes in iteration i.  Prints one line per
 * thread and a total:
 *   thread name=worker-<t> tid=<tid> dev=<d> allocs=<n> frees=<n> bytes=<sum> rc=0
 *   total threads=8 allocs=<n> frees=<n> bytes=<sum> rc=0
 */
#include "common.h"
#include "cuda.h"

#include <pthread.h>

#define NTHREADS 8
#define PAIRS 10000

struct result {
    pid_t tid;
    int dev;
    unsigned long allocs, frees;
    unsigned long long bytes;
    int fail_rc;
    const char *fail_what;
};

static struct result results[NTHREADS];

static void *worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    struct result *r = &results[t];
    char name[16];
    snprintf(name, sizeof name, "worker-%d", t);
    pthread_setname_np(pthread_self(), name);
    r->tid = gettid();
    r->dev = t % 2;
    CUcontext ctx;
    CUresult rc = cuDevicePrimaryCtxRetain(&ctx, r->dev);
    if (rc == CUDA_SUCCESS)
        rc = cuCtxSetCurrent(ctx);
    if (rc != CUDA_SUCCESS) {
        r->fail_rc = rc;
        r->fail_what = "context";
        return NULL;
    }
    for (int i = 0; i < PAIRS; i++) {
        size_t size = (size_t)(t + 1) * 4096 + (size_t)(i % 7) * 512;
        CUdeviceptr p = 0;
        rc = cuMemAlloc_v2(&p, size);
        if (rc != CUDA_SUCCESS) {
            r->fail_rc = rc;
            r->fail_what = "cuMemAlloc_v2";
            return NULL;
        }
        r->allocs++;
        r->bytes += size;
        rc = cuMemFree_v2(p);
        if (rc != CUDA_SUCCESS) {
            r->fail_rc = rc;
            r->fail_what = "cuMemFree_v2";
            return NULL;
        }
        r->frees++;
    }
    return NULL;
}

int main(void)
{
    g_prog = "threads";
    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    pthread_t th[NTHREADS];
    for (int t = 0; t < NTHREADS; t++)
        if (pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t) != 0)
            die("pthread_create");
    unsigned long allocs = 0, frees = 0;
    unsigned long long bytes = 0;
    int failed = 0;
    for (int t = 0; t < NTHREADS; t++) {
        pthread_join(th[t], NULL);
        struct result *r = &results[t];
        out("thread name=worker-%d tid=%d dev=%d allocs=%lu frees=%lu bytes=%llu rc=%d", t,
            (int)r->tid, r->dev, r->allocs, r->frees, r->bytes, r->fail_rc);
        if (r->fail_what) {
            fprintf(stderr, "threads: worker-%d: %s returned %d\n", t, r->fail_what, r->fail_rc);
            failed = 1;
        }
        allocs += r->allocs;
        frees += r->frees;
        bytes += r->bytes;
    }
    out("total threads=%d allocs=%lu frees=%lu bytes=%llu rc=%d", NTHREADS, allocs, frees, bytes,
        failed);
    if (failed || allocs != NTHREADS * PAIRS || frees != NTHREADS * PAIRS)
        die("thread failures");
    return 0;
}

/*
 * report_retry: PyTorch's caching-allocator retry, and sequences that only look
 * like it (linked -lcudart -lcuda), for the `vramshim oom` tests.  Run with
 * FAKECUDA_MEM=1G (checked).  Every allocation is a cudaMalloc on device 0
 * unless said otherwise; "release" means cudaFree of cached segments on the
 * thread that failed.  Failures, in order (0-based, as `vramshim oom` numbers
 * them):
 *   0  320 MiB fails; release 3 x 128 MiB; 320 MiB again succeeds    (retry ok)
 *   1  448 MiB fails; release 2 x 128 MiB;                           (retry ...)
 *   2  448 MiB fails again                                 (... failed, of 1)
 *   3  512 MiB fails; release 384 MiB; 1 MiB succeeds        (other size: none)
 *   4  512 MiB fails (a new failure, not a retry of 3); another thread frees
 *      384 MiB and allocates 512 MiB                       (other thread: none)
 *   5  200 MiB fails (after a 700 MiB allocation of this thread); release it;
 *      200 MiB on device 1 succeeds                        (other device: none)
 * Prints "thread tid=<n>" for the second thread.  Everything is freed at exit.
 */
#include "common.h"
#include "cuda_runtime.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/syscall.h>

static void *alloc_ok(int dev, size_t size)
{
    void *p = NULL;
    EXPECT_RC(cudaSetDevice(dev), cudaSuccess, "cudaSetDevice");
    int rc = cudaMalloc(&p, size);
    emit("alloc", "cudaMalloc", dev, "addr", (uintptr_t)p, size, NULL, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
    return p;
}

static void alloc_fails(int dev, size_t size)
{
    void *p = NULL;
    EXPECT_RC(cudaSetDevice(dev), cudaSuccess, "cudaSetDevice");
    int rc = cudaMalloc(&p, size);
    emit("alloc", "cudaMalloc", dev, "addr", (uintptr_t)p, size, "expect_error=2", rc);
    EXPECT_RC(rc, cudaErrorMemoryAllocation, "cudaMalloc (expected to fail)");
}

static void release(void *p)
{
    int rc = cudaFree(p);
    int dev = -1;
    cudaGetDevice(&dev);
    emit("free", "cudaFree", dev, "addr", (uintptr_t)p, 0, NULL, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFree");
}

static void *g_filler2;

static void *other_thread(void *arg)
{
    (void)arg;
    out("thread tid=%ld", (long)syscall(SYS_gettid));
    release(g_filler2);
    void *big = alloc_ok(0, 512 * MiB);
    release(big);
    return NULL;
}

int main(void)
{
    g_prog = "report_retry";
    EXPECT_RC(cudaSetDevice(0), cudaSuccess, "cudaSetDevice");
    size_t free0, total;
    EXPECT_RC(cudaMemGetInfo(&free0, &total), cudaSuccess, "cudaMemGetInfo");
    if (total != 1024 * MiB)
        die("device capacity is %zu; run with FAKECUDA_MEM=1G", total);

    void *weights = alloc_ok(0, 256 * MiB);
    void *seg[5];
    for (int i = 0; i < 5; i++)
        seg[i] = alloc_ok(0, 128 * MiB); /* 896 MiB live, 128 MiB free */

    /* 0: released 384 MiB in 3 frees, then the same request succeeds. */
    alloc_fails(0, 320 * MiB);
    for (int i = 4; i >= 2; i--)
        release(seg[i]);
    void *got = alloc_ok(0, 320 * MiB);
    release(got); /* 512 MiB live */

    /* 1 and 2: released 256 MiB in 2 frees, the same request fails again. */
    void *filler = alloc_ok(0, 384 * MiB); /* 896 MiB live */
    alloc_fails(0, 448 * MiB);
    release(seg[1]);
    release(seg[0]); /* 640 MiB live, 384 MiB free */
    alloc_fails(0, 448 * MiB);

    /* 3: frees, then an allocation of another size: no retry. */
    alloc_fails(0, 512 * MiB);
    release(filler); /* 256 MiB live */
    void *small = alloc_ok(0, 1 * MiB);
    g_filler2 = alloc_ok(0, 384 * MiB); /* 641 MiB live, 383 MiB free */

    /* 4: the same size fails again, but the sequence of 3 was broken by the
     * 1 MiB allocation; another thread then frees and gets 512 MiB. */
    alloc_fails(0, 512 * MiB);
    pthread_t t;
    if (pthread_create(&t, NULL, other_thread, NULL) != 0)
        die("pthread_create");
    if (pthread_join(t, NULL) != 0)
        die("pthread_join");

    /* 5: release, then the same size on another device. */
    void *big = alloc_ok(0, 700 * MiB); /* 957 MiB live, 67 MiB free */
    alloc_fails(0, 200 * MiB);
    release(big);
    void *on1 = alloc_ok(1, 200 * MiB);
    release(on1);

    EXPECT_RC(cudaSetDevice(0), cudaSuccess, "cudaSetDevice");
    release(small);
    release(weights);
    out("done report_retry");
    return 0;
}

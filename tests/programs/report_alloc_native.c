/*
 * report_alloc_native: what PyTorch's native caching allocator looks like from
 * below (linked -lcudart -lcuda), for `vramshim allocator`.  Run with
 * FAKECUDA_MEM=256M (checked).  Device 0, one thread, cudaMalloc of segment
 * sizes only; nothing is freed at exit (PyTorch does not either).
 *   segments: 3 x 2 MiB, 2 x 20 MiB, 1 x 24 MiB                   (70 MiB)
 *   empty_cache(): cudaFree of 2 MiB, 2 MiB, 20 MiB                (burst: 24 MiB)
 *   20 MiB, 100 MiB                                                 (166 MiB)
 *   130 MiB fails; cudaFree of 100 MiB and 20 MiB; 130 MiB again     (retry: 120 MiB)
 *   peak reserved 176 MiB, at the retry
 */
#include "common.h"
#include "cuda_runtime.h"

#include <stdint.h>

static void *seg(size_t size)
{
    void *p = NULL;
    int rc = cudaMalloc(&p, size);
    emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)p, size, NULL, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
    return p;
}

static void seg_fails(size_t size)
{
    void *p = NULL;
    int rc = cudaMalloc(&p, size);
    emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)p, size, "expect_error=2", rc);
    EXPECT_RC(rc, cudaErrorMemoryAllocation, "cudaMalloc (expected to fail)");
}

static void release(void *p)
{
    int rc = cudaFree(p);
    emit("free", "cudaFree", 0, "addr", (uintptr_t)p, 0, NULL, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFree");
}

int main(void)
{
    g_prog = "report_alloc_native";
    EXPECT_RC(cudaSetDevice(0), cudaSuccess, "cudaSetDevice");
    size_t free0, total;
    EXPECT_RC(cudaMemGetInfo(&free0, &total), cudaSuccess, "cudaMemGetInfo");
    if (total != 256 * MiB)
        die("device capacity is %zu; run with FAKECUDA_MEM=256M", total);

    void *small[3], *large[2];
    for (int i = 0; i < 3; i++)
        small[i] = seg(2 * MiB);
    for (int i = 0; i < 2; i++)
        large[i] = seg(20 * MiB);
    void *big = seg(24 * MiB);
    (void)big;

    /* empty_cache(): the fully free segments go back. */
    release(small[0]);
    release(small[1]);
    release(large[0]);

    void *again = seg(20 * MiB);
    void *huge = seg(100 * MiB); /* 166 MiB reserved */

    /* OOM: release cached segments, retry the same size. */
    seg_fails(130 * MiB);
    release(huge);
    release(again);
    void *got = seg(130 * MiB); /* 176 MiB reserved */
    (void)got;
    (void)small[2];
    (void)large[1];
    out("done report_alloc_native");
    return 0;
}

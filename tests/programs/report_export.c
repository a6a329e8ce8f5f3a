/*
 * report_export: allocations of known sizes at known source lines (linked -lcudart -lcuda),
 * for the `vramshim export --pytorch-snapshot` tests.  Run with FAKECUDA_MEM=1G.
 *
 * Usage: report_export [ROUNDS [tail]]     (churn rounds, default 3)
 *
 * Each allocating call is on a line marked with a comment EXPORT: <name>; the test finds the
 * line numbers by scanning this file for the markers, so a marker must stay on the line of
 * its call.  In this order:
 *   weights    64 MiB cudaMalloc on device 0, never freed (live at exit)
 *   remote      4 MiB cudaMalloc on device 1, never freed (live at exit)
 *   stage       1 MiB cudaMallocHost, freed at the end (pinned host: not exported)
 *   scratch     8 MiB cudaMallocAsync on a stream of its own on device 0, cudaFreeAsync
 *   churn      ROUNDS x 1 MiB cudaMalloc + cudaFree on device 0
 *   physical    2 MiB cuMemCreate on device 0, never released (live at exit, no address)
 *   oversized   2 GiB cudaMalloc on device 0 that fails: more than the free memory
 * With "tail", after the failure (for flight-recorder logs, whose second dump then misses
 * what happened between its window and the first dump's):
 *   late        1 MiB cudaMalloc on device 0, never freed; ROUNDS churn rounds;
 *               weights freed; ROUNDS churn rounds
 */
#include "common.h"
#include "cuda.h"
#include "cuda_runtime.h"

#include <stdint.h>

#define NOINLINE __attribute__((noinline))

/* Volatile, so that the compiler cannot unroll the loop into several call sites. */
static volatile int g_rounds = 3;

static NOINLINE void *weights(void)
{
    void *p = NULL;
    int rc = cudaMalloc(&p, 64 * MiB); /* EXPORT: weights */
    emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)p, 64 * MiB, "fn=weights", rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
    return p;
}

static NOINLINE void *remote(void)
{
    void *p = NULL;
    EXPECT_RC(cudaSetDevice(1), cudaSuccess, "cudaSetDevice");
    int rc = cudaMalloc(&p, 4 * MiB); /* EXPORT: remote */
    emit("alloc", "cudaMalloc", 1, "addr", (uintptr_t)p, 4 * MiB, "fn=remote", rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
    EXPECT_RC(cudaSetDevice(0), cudaSuccess, "cudaSetDevice");
    return p;
}

static NOINLINE void *stage(void)
{
    void *p = NULL;
    int rc = cudaMallocHost(&p, 1 * MiB); /* EXPORT: stage */
    emit("alloc", "cudaMallocHost", -1, "addr", (uintptr_t)p, 1 * MiB, "fn=stage", rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMallocHost");
    return p;
}

static NOINLINE void scratch(void)
{
    cudaStream_t stream = NULL;
    EXPECT_RC(cudaStreamCreate(&stream), cudaSuccess, "cudaStreamCreate");
    void *p = NULL;
    int rc = cudaMallocAsync(&p, 8 * MiB, stream); /* EXPORT: scratch */
    emit("alloc", "cudaMallocAsync", 0, "addr", (uintptr_t)p, 8 * MiB,
         xf("fn=scratch stream=0x%llx", (unsigned long long)(uintptr_t)stream), rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMallocAsync");
    rc = cudaFreeAsync(p, stream);
    emit("free", "cudaFreeAsync", 0, "addr", (uintptr_t)p, 0, "fn=scratch", rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFreeAsync");
    EXPECT_RC(cudaStreamSynchronize(stream), cudaSuccess, "cudaStreamSynchronize");
    EXPECT_RC(cudaStreamDestroy(stream), cudaSuccess, "cudaStreamDestroy");
}

static NOINLINE void churn(void)
{
    for (int i = 0; i < g_rounds; i++) {
        void *p = NULL;
        int rc = cudaMalloc(&p, 1 * MiB); /* EXPORT: churn */
        emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)p, 1 * MiB, "fn=churn", rc);
        EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
        rc = cudaFree(p);
        emit("free", "cudaFree", 0, "addr", (uintptr_t)p, 0, "fn=churn", rc);
        EXPECT_RC(rc, cudaSuccess, "cudaFree");
    }
}

static NOINLINE CUmemGenericAllocationHandle physical(void)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h = 0;
    int rc = cuMemCreate(&h, 2 * MiB, &prop, 0); /* EXPORT: physical */
    emit("alloc", "cuMemCreate", 0, "handle", h, 2 * MiB, "fn=physical", rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemCreate");
    return h;
}

static NOINLINE void late(void)
{
    void *p = NULL;
    int rc = cudaMalloc(&p, 1 * MiB); /* EXPORT: late */
    emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)p, 1 * MiB, "fn=late", rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
}

static NOINLINE void oversized(void)
{
    void *p = NULL;
    int rc = cudaMalloc(&p, 2048 * MiB); /* EXPORT: oversized */
    emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)p, 2048 * MiB, "fn=oversized", rc);
    EXPECT_RC(rc, cudaErrorMemoryAllocation, "cudaMalloc(2 GiB)");
}

int main(int argc, char **argv)
{
    g_prog = "report_export";
    if (argc > 3 || (argc == 3 && strcmp(argv[2], "tail")))
        die("usage: report_export [ROUNDS [tail]]");
    if (argc >= 2)
        g_rounds = atoi(argv[1]);
    EXPECT_RC(cudaSetDevice(0), cudaSuccess, "cudaSetDevice");
    size_t free0, total;
    EXPECT_RC(cudaMemGetInfo(&free0, &total), cudaSuccess, "cudaMemGetInfo");
    if (total != 1024 * MiB)
        die("device capacity is %zu; run with FAKECUDA_MEM=1G", total);

    void *w = weights();
    remote();
    void *s = stage();
    scratch();
    churn();
    physical();
    oversized();
    if (argc == 3) {
        late();
        churn();
        int rc = cudaFree(w);
        emit("free", "cudaFree", 0, "addr", (uintptr_t)w, 0, "fn=weights", rc);
        EXPECT_RC(rc, cudaSuccess, "cudaFree");
        churn();
    }

    int rc = cudaFreeHost(s);
    emit("free", "cudaFreeHost", -1, "addr", (uintptr_t)s, 0, "fn=main", rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFreeHost");
    out("done report_export");
    return 0;
}

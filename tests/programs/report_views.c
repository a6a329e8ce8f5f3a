/*
 * report_views: allocations of known sizes at known source lines (linked -lcudart
 * -lcuda), for the `vramshim timeline`, `flamegraph` and `diff` tests.
 *
 * Usage: report_views a|b|calm
 *
 * Each allocating call is on a line marked with a comment VIEW: <name>, and each
 * call of an allocating function on a line marked CALL: <name>; the test finds
 * the line numbers by scanning this file for the markers, so the markers must
 * stay on the same line as the call.
 *
 *                  a (and calm)   b
 *   weights        64 MiB         96 MiB    cudaMalloc, freed at the end
 *   cache          24 MiB          8 MiB    cuMemAlloc_v2, never freed (leak)
 *   churn          4 x 1 MiB      10 x 1 MiB cudaMalloc + cudaFree each
 *   activations    16 MiB         16 MiB    cudaMalloc, freed: the device-0 peak is
 *                                           weights + cache + activations
 *   stage          2 MiB          2 MiB     cudaMallocHost, freed at the end
 *   oversized      1 TiB          1 TiB     cudaMalloc that fails (not in calm)
 * All on device 0, in this order: weights, cache, stage, churn, activations,
 * (free activations), oversized, free weights, free stage.
 */
#include "common.h"
#include "cuda.h"
#include "cuda_runtime.h"

#include <stdint.h>

#define NOINLINE __attribute__((noinline))

/* Volatile, so that the compiler cannot unroll the loop into several call sites. */
static volatile int g_churn_rounds;

static NOINLINE void *weights(size_t size)
{
    void *p = NULL;
    int rc = cudaMalloc(&p, size); /* VIEW: weights */
    emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)p, size, "fn=weights", rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
    return p;
}

static NOINLINE CUdeviceptr cache(size_t size)
{
    CUdeviceptr p = 0;
    int rc = cuMemAlloc_v2(&p, size); /* VIEW: cache */
    emit("alloc", "cuMemAlloc_v2", 0, "addr", p, size, "fn=cache", rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAlloc_v2");
    return p;
}

static NOINLINE void *stage(size_t size)
{
    void *p = NULL;
    int rc = cudaMallocHost(&p, size); /* VIEW: stage */
    emit("alloc", "cudaMallocHost", -1, "addr", (uintptr_t)p, size, "fn=stage", rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMallocHost");
    return p;
}

static NOINLINE void churn(void)
{
    for (int i = 0; i < g_churn_rounds; i++) {
        void *p = NULL;
        int rc = cudaMalloc(&p, 1 * MiB); /* VIEW: churn */
        emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)p, 1 * MiB, "fn=churn", rc);
        EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
        rc = cudaFree(p);
        emit("free", "cudaFree", 0, "addr", (uintptr_t)p, 0, "fn=churn", rc);
        EXPECT_RC(rc, cudaSuccess, "cudaFree");
    }
}

static NOINLINE void activations(size_t size)
{
    void *p = NULL;
    int rc = cudaMalloc(&p, size); /* VIEW: activations */
    emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)p, size, "fn=activations", rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
    rc = cudaFree(p);
    emit("free", "cudaFree", 0, "addr", (uintptr_t)p, 0, "fn=activations", rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFree");
}

static NOINLINE void oversized(void)
{
    void *p = NULL;
    size_t size = (size_t)1 << 40;
    int rc = cudaMalloc(&p, size); /* VIEW: oversized */
    emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)p, size, "fn=oversized", rc);
    EXPECT_RC(rc, cudaErrorMemoryAllocation, "cudaMalloc(1 TiB)");
}

int main(int argc, char **argv)
{
    g_prog = "report_views";
    if (argc != 2 || (strcmp(argv[1], "a") && strcmp(argv[1], "b") && strcmp(argv[1], "calm")))
        die("usage: report_views a|b|calm");
    int b = strcmp(argv[1], "b") == 0;
    EXPECT_RC(cudaSetDevice(0), cudaSuccess, "cudaSetDevice");

    void *w = weights((b ? 96 : 64) * MiB); /* CALL: weights */
    cache((b ? 8 : 24) * MiB); /* CALL: cache */
    void *s = stage(2 * MiB); /* CALL: stage */
    g_churn_rounds = b ? 10 : 4;
    churn(); /* CALL: churn */
    activations(16 * MiB); /* CALL: activations */
    if (strcmp(argv[1], "calm"))
        oversized(); /* CALL: oversized */

    int rc = cudaFree(w);
    emit("free", "cudaFree", 0, "addr", (uintptr_t)w, 0, "fn=main", rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFree");
    rc = cudaFreeHost(s);
    emit("free", "cudaFreeHost", -1, "addr", (uintptr_t)s, 0, "fn=main", rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFreeHost");
    out("done report_views %s", argv[1]);
    return 0;
}

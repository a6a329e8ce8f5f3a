/*
 * report_leaks: allocations left live at exit at known source lines (linked
 * -lcudart -lcuda), for the `vramshim leaks` tests.
 *
 * Each allocating call is on a line marked with a comment LEAK: <name>, and
 * each call of an allocating function on a line marked CALL: <name>; the test
 * finds the line numbers by scanning this file for the markers, so the
 * markers must stay on the same line as the call.
 *
 * Left live at exit:
 *   device 0: load_weights x3 (8 MiB each, cudaMalloc) called from main
 *             make_cache 4 MiB (cuMemAlloc_v2) called from main
 *             make_cache 2 MiB called from build_index, called from main
 *   device 1: load_weights 5 MiB called from main
 *   pinned host: stage 1 MiB (cudaMallocHost) called from main
 * Allocated and freed (not a leak): scratch_buffer 16 MiB on device 0.
 */
#include "common.h"
#include "cuda.h"
#include "cuda_runtime.h"

#include <stdint.h>

#define NOINLINE __attribute__((noinline))

/* Volatile, so that the compiler cannot unroll the loop into three call sites. */
static volatile int g_weight_tensors = 3;

static NOINLINE void *load_weights(int dev, size_t size)
{
    void *p = NULL;
    EXPECT_RC(cudaSetDevice(dev), cudaSuccess, "cudaSetDevice");
    int rc = cudaMalloc(&p, size); /* LEAK: weights */
    emit("alloc", "cudaMalloc", dev, "addr", (uintptr_t)p, size, "fn=load_weights", rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
    return p;
}

static NOINLINE CUdeviceptr make_cache(size_t size)
{
    CUdeviceptr p = 0;
    int rc = cuMemAlloc_v2(&p, size); /* LEAK: cache */
    emit("alloc", "cuMemAlloc_v2", 0, "addr", p, size, "fn=make_cache", rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAlloc_v2");
    return p;
}

static NOINLINE void *stage(size_t size)
{
    void *p = NULL;
    int rc = cudaMallocHost(&p, size); /* LEAK: stage */
    emit("alloc", "cudaMallocHost", -1, "addr", (uintptr_t)p, size, "fn=stage", rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMallocHost");
    return p;
}

static NOINLINE void *scratch_buffer(size_t size)
{
    void *p = NULL;
    EXPECT_RC(cudaSetDevice(0), cudaSuccess, "cudaSetDevice");
    int rc = cudaMalloc(&p, size);
    emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)p, size, "fn=scratch_buffer", rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
    return p;
}

static NOINLINE CUdeviceptr build_index(void)
{
    CUdeviceptr index = make_cache(2 * MiB); /* CALL: cache-from-build_index */
    out("built index at 0x%llx", (unsigned long long)index);
    return index;
}

int main(void)
{
    g_prog = "report_leaks";
    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    CUcontext ctx0;
    EXPECT_RC(cuDevicePrimaryCtxRetain(&ctx0, 0), CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    EXPECT_RC(cuCtxSetCurrent(ctx0), CUDA_SUCCESS, "cuCtxSetCurrent");

    for (int i = 0; i < g_weight_tensors; i++)
        load_weights(0, 8 * MiB); /* CALL: weights-from-main */
    make_cache(4 * MiB); /* CALL: cache-from-main */
    build_index(); /* CALL: build_index-from-main */

    void *s = scratch_buffer(16 * MiB);
    int rc = cudaFree(s);
    emit("free", "cudaFree", 0, "addr", (uintptr_t)s, 0, "fn=main", rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFree");

    load_weights(1, 5 * MiB); /* CALL: weights-dev1-from-main */
    stage(1 * MiB); /* CALL: stage-from-main */
    out("done report_leaks");
    return 0;
}

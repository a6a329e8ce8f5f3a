/*
 * report_oom: failed allocations with a known cause (linked -lcudart -lcuda),
 * for the `vramshim oom` tests.  Run with FAKECUDA_MEM=1G and
 * FAKECUDA_FAIL_SIZE=100M (checked: exits 1 otherwise).
 *
 * Live on device 0 when the failures happen: hold_weights 256 MiB (cudaMalloc,
 * line marked LIVE: weights) and hold_kv 3 x 64 MiB (cuMemAlloc_v2, LIVE: kv),
 * so 576 MiB are free.  Also live, elsewhere: 512 MiB on device 1
 * (LIVE: other-device) and 32 MiB of pinned host memory.  A 128 MiB buffer
 * was allocated and freed before.  Then, each on a line marked FAIL: <name>:
 *   exceeded  cudaMalloc 600 MiB on device 0: more than the free memory
 *   limit     cudaMalloc 100 MiB on device 0: fits, but FAKECUDA_FAIL_SIZE
 *   device1   cuMemAlloc_v2 600 MiB on device 1 (512 MiB free there)
 * Everything is freed before exit.
 */
#include "common.h"
#include "cuda.h"
#include "cuda_runtime.h"

#include <stdint.h>

#define NOINLINE __attribute__((noinline))

/* Volatile, so that the compiler cannot unroll the loop into three call sites. */
static volatile int g_kv_blocks = 3;

static CUcontext g_ctx[2];

static NOINLINE void *hold_weights(size_t size)
{
    void *p = NULL;
    EXPECT_RC(cudaSetDevice(0), cudaSuccess, "cudaSetDevice");
    int rc = cudaMalloc(&p, size); /* LIVE: weights */
    emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)p, size, NULL, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
    return p;
}

static NOINLINE CUdeviceptr hold_kv(size_t size)
{
    CUdeviceptr p = 0;
    EXPECT_RC(cuCtxSetCurrent(g_ctx[0]), CUDA_SUCCESS, "cuCtxSetCurrent");
    int rc = cuMemAlloc_v2(&p, size); /* LIVE: kv */
    emit("alloc", "cuMemAlloc_v2", 0, "addr", p, size, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAlloc_v2");
    return p;
}

static NOINLINE void *hold_other_device(size_t size)
{
    void *p = NULL;
    EXPECT_RC(cudaSetDevice(1), cudaSuccess, "cudaSetDevice");
    int rc = cudaMalloc(&p, size); /* LIVE: other-device */
    emit("alloc", "cudaMalloc", 1, "addr", (uintptr_t)p, size, NULL, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
    return p;
}

static void rt_free(void *p, int current)
{
    EXPECT_RC(cudaSetDevice(current), cudaSuccess, "cudaSetDevice");
    int rc = cudaFree(p);
    emit("free", "cudaFree", current, "addr", (uintptr_t)p, 0, NULL, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFree");
}

static NOINLINE void fail_exceeded(void)
{
    void *p = NULL;
    EXPECT_RC(cudaSetDevice(0), cudaSuccess, "cudaSetDevice");
    int rc = cudaMalloc(&p, 600 * MiB); /* FAIL: exceeded */
    emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)p, 600 * MiB, "expect_error=2", rc);
    EXPECT_RC(rc, cudaErrorMemoryAllocation, "cudaMalloc(600 MiB)");
}

static NOINLINE void fail_limit(void)
{
    void *p = NULL;
    EXPECT_RC(cudaSetDevice(0), cudaSuccess, "cudaSetDevice");
    int rc = cudaMalloc(&p, 100 * MiB); /* FAIL: limit */
    emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)p, 100 * MiB, "expect_error=2", rc);
    EXPECT_RC(rc, cudaErrorMemoryAllocation, "cudaMalloc(100 MiB)");
}

static NOINLINE void fail_device1(void)
{
    CUdeviceptr p = 0;
    EXPECT_RC(cuCtxSetCurrent(g_ctx[1]), CUDA_SUCCESS, "cuCtxSetCurrent");
    int rc = cuMemAlloc_v2(&p, 600 * MiB); /* FAIL: device1 */
    emit("alloc", "cuMemAlloc_v2", 1, "addr", p, 600 * MiB, "expect_error=2", rc);
    EXPECT_RC(rc, CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc_v2(600 MiB)");
}

int main(void)
{
    g_prog = "report_oom";
    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    for (int d = 0; d < 2; d++)
        EXPECT_RC(cuDevicePrimaryCtxRetain(&g_ctx[d], d), CUDA_SUCCESS,
                  "cuDevicePrimaryCtxRetain");
    EXPECT_RC(cudaSetDevice(0), cudaSuccess, "cudaSetDevice");
    size_t free0, total;
    EXPECT_RC(cudaMemGetInfo(&free0, &total), cudaSuccess, "cudaMemGetInfo");
    if (total != 1024 * MiB)
        die("device capacity is %zu; run with FAKECUDA_MEM=1G", total);

    void *temp = hold_weights(128 * MiB);
    rt_free(temp, 0);
    void *weights = hold_weights(256 * MiB);
    CUdeviceptr kv[3];
    for (int i = 0; i < g_kv_blocks; i++)
        kv[i] = hold_kv(64 * MiB);
    void *other = hold_other_device(512 * MiB);
    void *host = NULL;
    int rc = cudaMallocHost(&host, 32 * MiB);
    emit("alloc", "cudaMallocHost", -1, "addr", (uintptr_t)host, 32 * MiB, NULL, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMallocHost");

    fail_exceeded();
    fail_limit();
    fail_device1();

    rc = cudaFreeHost(host);
    emit("free", "cudaFreeHost", -1, "addr", (uintptr_t)host, 0, NULL, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFreeHost");
    rt_free(other, 1);
    for (int i = 0; i < 3; i++) {
        EXPECT_RC(cuCtxSetCurrent(g_ctx[0]), CUDA_SUCCESS, "cuCtxSetCurrent");
        rc = cuMemFree_v2(kv[i]);
        emit("free", "cuMemFree_v2", 0, "addr", kv[i], 0, NULL, rc);
        EXPECT_RC(rc, CUDA_SUCCESS, "cuMemFree_v2");
    }
    rt_free(weights, 0);
    out("done report_oom");
    return 0;
}

/*
 * report_peak: a scripted workload whose peaks are known to the byte (linked
 * -lcudart -lcuda), for the `vramshim report` / `peak` tests.
 *
 * Runtime allocations (cudaMalloc/cudaFree, device chosen with cudaSetDevice)
 * and driver allocations (cuMemAlloc_v2/cuMemFree_v2, device chosen by making
 * its primary context current with cuCtxSetCurrent) on devices 0 and 1, plus
 * one pinned host buffer (cudaMallocHost/cudaFreeHost, printed without dev=).
 * Every line carries line=<n>: the source line of the CUDA call.  A free prints
 * the device current when it was called: one device-1 buffer is freed with
 * cudaFree while device 0 is current.  The program ends with one buffer live
 * on each device.  It sleeps 1 ms after each operation, so that no two events
 * share a time.
 */
#include "common.h"
#include "cuda.h"
#include "cuda_runtime.h"

#include <stdint.h>
#include <time.h>

static CUcontext g_ctx[2];

static void pause_1ms(void)
{
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
}

static void use_runtime(int dev)
{
    EXPECT_RC(cudaSetDevice(dev), cudaSuccess, "cudaSetDevice");
}

static void use_driver(int dev)
{
    EXPECT_RC(cuCtxSetCurrent(g_ctx[dev]), CUDA_SUCCESS, "cuCtxSetCurrent");
}

/* One operation per macro; __LINE__ is the line of the macro's use, which is
 * also the line of the CUDA call inside it. */
#define RT_ALLOC(ptr, dev, size)                                                               \
    do {                                                                                       \
        use_runtime(dev);                                                                      \
        int rc_ = cudaMalloc(&(ptr), (size));                                                  \
        emit("alloc", "cudaMalloc", (dev), "addr", (uintptr_t)(ptr), (size),                   \
             xf("line=%d", __LINE__), rc_);                                                    \
        EXPECT_RC(rc_, cudaSuccess, "cudaMalloc");                                             \
        pause_1ms();                                                                           \
    } while (0)

#define RT_FREE(ptr, current)                                                                  \
    do {                                                                                       \
        use_runtime(current);                                                                  \
        int rc_ = cudaFree(ptr);                                                               \
        emit("free", "cudaFree", (current), "addr", (uintptr_t)(ptr), 0,                      \
             xf("line=%d", __LINE__), rc_);                                                    \
        EXPECT_RC(rc_, cudaSuccess, "cudaFree");                                               \
        pause_1ms();                                                                           \
    } while (0)

#define DRV_ALLOC(ptr, dev, size)                                                              \
    do {                                                                                       \
        use_driver(dev);                                                                       \
        int rc_ = cuMemAlloc_v2(&(ptr), (size));                                               \
        emit("alloc", "cuMemAlloc_v2", (dev), "addr", (ptr), (size),                           \
             xf("line=%d", __LINE__), rc_);                                                    \
        EXPECT_RC(rc_, CUDA_SUCCESS, "cuMemAlloc_v2");                                         \
        pause_1ms();                                                                           \
    } while (0)

#define DRV_FREE(ptr, current)                                                                 \
    do {                                                                                       \
        use_driver(current);                                                                   \
        int rc_ = cuMemFree_v2(ptr);                                                           \
        emit("free", "cuMemFree_v2", (current), "addr", (ptr), 0, xf("line=%d", __LINE__),    \
             rc_);                                                                             \
        EXPECT_RC(rc_, CUDA_SUCCESS, "cuMemFree_v2");                                          \
        pause_1ms();                                                                           \
    } while (0)

#define HOST_ALLOC(ptr, size)                                                                  \
    do {                                                                                       \
        int rc_ = cudaMallocHost(&(ptr), (size));                                              \
        emit("alloc", "cudaMallocHost", -1, "addr", (uintptr_t)(ptr), (size),                  \
             xf("line=%d", __LINE__), rc_);                                                    \
        EXPECT_RC(rc_, cudaSuccess, "cudaMallocHost");                                         \
        pause_1ms();                                                                           \
    } while (0)

#define HOST_FREE(ptr)                                                                         \
    do {                                                                                       \
        int rc_ = cudaFreeHost(ptr);                                                           \
        emit("free", "cudaFreeHost", -1, "addr", (uintptr_t)(ptr), 0, xf("line=%d", __LINE__), \
             rc_);                                                                             \
        EXPECT_RC(rc_, cudaSuccess, "cudaFreeHost");                                           \
        pause_1ms();                                                                           \
    } while (0)

int main(void)
{
    g_prog = "report_peak";
    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    for (int d = 0; d < 2; d++)
        EXPECT_RC(cuDevicePrimaryCtxRetain(&g_ctx[d], d), CUDA_SUCCESS,
                  "cuDevicePrimaryCtxRetain");

    void *a0 = NULL, *a1 = NULL, *c0 = NULL, *d1 = NULL, *host = NULL;
    CUdeviceptr b0 = 0, b1 = 0, c1 = 0;

    RT_ALLOC(a0, 0, 64 * MiB);
    DRV_ALLOC(b0, 0, 32 * MiB + 512);
    RT_ALLOC(a1, 1, 100 * MiB);

    HOST_ALLOC(host, 200 * MiB);
    DRV_ALLOC(b1, 1, 50 * MiB);
    RT_ALLOC(c0, 0, 128 * MiB); /* device 0 peak: 224 MiB + 512 */
    RT_FREE(a0, 0);
    RT_FREE(a1, 1);
    DRV_ALLOC(c1, 1, 30 * MiB);
    RT_ALLOC(d1, 1, 120 * MiB); /* device 1 peak: 200 MiB */

    HOST_FREE(host);
    DRV_FREE(b0, 0);
    RT_FREE(d1, 0); /* device 1 memory, freed while device 0 is current */
    DRV_FREE(b1, 1);
    out("done report_peak live: c0 on device 0, c1 on device 1");
    return 0;
}

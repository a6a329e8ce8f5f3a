/*
 * direct: reaches the driver through the PLT (linked -lcuda).
 * Device, pitch, managed and pinned host memory, host registration, a second
 * device, arrays, the legacy 32-bit cuMemAlloc/cuMemFree, and one leak of
 * 3 MiB on device 0 (the only allocation without a matching free line).
 */
#include "common.h"
#include "cuda.h"

#include <stdint.h>

/* The legacy v1 entry points (32-bit ABI), hidden by cuda.h's macros. */
#undef cuMemAlloc
#undef cuMemFree
#undef cuMemGetInfo
CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize);
CUresult cuMemFree(CUdeviceptr_v1 dptr);
CUresult cuMemGetInfo(unsigned int *free, unsigned int *total);

static int ctx_dev(void)
{
    CUdevice d = -1;
    EXPECT_RC(cuCtxGetDevice(&d), CUDA_SUCCESS, "cuCtxGetDevice");
    return d;
}

static CUcontext use_device(int ordinal)
{
    CUdevice dev;
    CUcontext ctx;
    EXPECT_RC(cuDeviceGet(&dev, ordinal), CUDA_SUCCESS, "cuDeviceGet");
    EXPECT_RC(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    CUresult rc = cuCtxSetCurrent(ctx);
    out("ctx cuCtxSetCurrent dev=%d handle=0x%llx rc=%d", ordinal,
        (unsigned long long)(uintptr_t)ctx, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuCtxSetCurrent");
    return ctx;
}

static size_t mem_free(const char *when)
{
    size_t f = 0, t = 0;
    CUresult rc = cuMemGetInfo_v2(&f, &t);
    out("info cuMemGetInfo_v2 dev=%d free=%zu total=%zu when=%s rc=%d", ctx_dev(), f, t, when,
        rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemGetInfo_v2");
    return f;
}

int main(void)
{
    g_prog = "direct";
    const char *mem = getenv("FAKECUDA_MEM");
    int accounting = !(mem && strcmp(mem, "unlimited") == 0);

    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    int ndev = 0;
    EXPECT_RC(cuDeviceGetCount(&ndev), CUDA_SUCCESS, "cuDeviceGetCount");
    if (ndev < 2)
        die("need 2 devices, have %d", ndev);

    use_device(0);
    size_t free0_start = mem_free("start");

    CUdeviceptr d_buf = 0, d_pitch = 0, d_managed = 0;
    size_t pitch = 0;
    void *h_pinned = NULL, *h_alloc = NULL;
    CUresult rc;

    rc = cuMemAlloc_v2(&d_buf, 1 * MiB);
    emit("alloc", "cuMemAlloc_v2", ctx_dev(), "addr", d_buf, 1 * MiB, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAlloc_v2");

    rc = cuMemAllocPitch_v2(&d_pitch, &pitch, 1000, 10, 4);
    emit("alloc", "cuMemAllocPitch_v2", ctx_dev(), "addr", d_pitch, (unsigned long long)pitch * 10,
         xf("pitch=%zu width=1000 height=10 elem=4", pitch), rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAllocPitch_v2");
    if (pitch != 1024)
        die("pitch %zu, expected 1024", pitch);

    rc = cuMemAllocManaged(&d_managed, 4096, CU_MEM_ATTACH_GLOBAL);
    emit("alloc", "cuMemAllocManaged", ctx_dev(), "addr", d_managed, 4096, "flags=1", rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAllocManaged");

    rc = cuMemAllocHost_v2(&h_pinned, 8192);
    emit("alloc", "cuMemAllocHost_v2", ctx_dev(), "addr", (uintptr_t)h_pinned, 8192, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAllocHost_v2");
    memset(h_pinned, 0xab, 8192); /* real host memory */

    rc = cuMemHostAlloc(&h_alloc, 4096, CU_MEMHOSTALLOC_PORTABLE);
    emit("alloc", "cuMemHostAlloc", ctx_dev(), "addr", (uintptr_t)h_alloc, 4096, "flags=1", rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemHostAlloc");
    memset(h_alloc, 0xcd, 4096);

    void *hbuf = malloc(64 * 1024);
    if (!hbuf)
        die("malloc");
    rc = cuMemHostRegister_v2(hbuf, 64 * 1024, 0);
    emit("register", "cuMemHostRegister_v2", ctx_dev(), "addr", (uintptr_t)hbuf, 64 * 1024,
         "flags=0", rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemHostRegister_v2");
    rc = cuMemHostUnregister(hbuf);
    emit("unregister", "cuMemHostUnregister", ctx_dev(), "addr", (uintptr_t)hbuf, 64 * 1024,
         NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemHostUnregister");
    free(hbuf);

    rc = cuMemFree_v2(d_buf);
    emit("free", "cuMemFree_v2", ctx_dev(), "addr", d_buf, 1 * MiB, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemFree_v2");
    rc = cuMemFree_v2(d_pitch);
    emit("free", "cuMemFree_v2", ctx_dev(), "addr", d_pitch, (unsigned long long)pitch * 10, NULL,
         rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemFree_v2");
    rc = cuMemFree_v2(d_managed);
    emit("free", "cuMemFree_v2", ctx_dev(), "addr", d_managed, 4096, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemFree_v2");
    rc = cuMemFreeHost(h_pinned);
    emit("free", "cuMemFreeHost", ctx_dev(), "addr", (uintptr_t)h_pinned, 8192, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemFreeHost");
    rc = cuMemFreeHost(h_alloc);
    emit("free", "cuMemFreeHost", ctx_dev(), "addr", (uintptr_t)h_alloc, 4096, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemFreeHost");

    /* ---- device 1 ---- */
    use_device(1);
    size_t free1_start = mem_free("start");
    CUdeviceptr d1 = 0;
    rc = cuMemAlloc_v2(&d1, 2 * MiB);
    emit("alloc", "cuMemAlloc_v2", ctx_dev(), "addr", d1, 2 * MiB, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAlloc_v2");
    if (ctx_dev() != 1 || d1 < 0x710000000000ULL)
        die("device 1 allocation 0x%llx not in device 1's range", d1);
    rc = cuMemFree_v2(d1);
    emit("free", "cuMemFree_v2", ctx_dev(), "addr", d1, 2 * MiB, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemFree_v2");

    CUDA_ARRAY_DESCRIPTOR ad = {.Width = 256, .Height = 256, .Format = CU_AD_FORMAT_FLOAT,
                                .NumChannels = 4};
    CUarray arr = NULL;
    rc = cuArrayCreate_v2(&arr, &ad);
    emit("alloc", "cuArrayCreate_v2", ctx_dev(), "handle", (uintptr_t)arr, 256ULL * 256 * 4 * 4,
         "width=256 height=256 format=0x20 channels=4", rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuArrayCreate_v2");

    CUDA_ARRAY3D_DESCRIPTOR ad3 = {.Width = 128, .Height = 64, .Depth = 8,
                                   .Format = CU_AD_FORMAT_HALF, .NumChannels = 2, .Flags = 0};
    CUarray arr3 = NULL;
    rc = cuArray3DCreate_v2(&arr3, &ad3);
    emit("alloc", "cuArray3DCreate_v2", ctx_dev(), "handle", (uintptr_t)arr3,
         128ULL * 64 * 8 * 2 * 2, "width=128 height=64 depth=8 format=0x10 channels=2", rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuArray3DCreate_v2");

    rc = cuArrayDestroy(arr);
    emit("free", "cuArrayDestroy", ctx_dev(), "handle", (uintptr_t)arr, 256ULL * 256 * 4 * 4,
         NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuArrayDestroy");
    rc = cuArrayDestroy(arr3);
    emit("free", "cuArrayDestroy", ctx_dev(), "handle", (uintptr_t)arr3, 128ULL * 64 * 8 * 2 * 2,
         NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuArrayDestroy");

    /* Legacy 32-bit ABI: must still work. */
    CUdeviceptr_v1 legacy = 0;
    rc = cuMemAlloc(&legacy, 4096);
    emit("alloc", "cuMemAlloc", ctx_dev(), "addr", legacy, 4096, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAlloc (v1)");
    if (legacy == 0)
        die("legacy cuMemAlloc returned a null pointer");
    unsigned int f32 = 0, t32 = 0;
    rc = cuMemGetInfo(&f32, &t32);
    out("info cuMemGetInfo dev=%d free=%u total=%u when=legacy rc=%d", ctx_dev(), f32, t32, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemGetInfo (v1)");
    rc = cuMemFree(legacy);
    emit("free", "cuMemFree", ctx_dev(), "addr", legacy, 4096, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemFree (v1)");

    size_t free1_end = mem_free("end");
    if (free1_end != free1_start)
        die("device 1: free %zu at end, %zu at start", free1_end, free1_start);

    /* ---- the leak ---- */
    use_device(0);
    CUdeviceptr leak = 0;
    rc = cuMemAlloc_v2(&leak, 3 * MiB);
    emit("alloc", "cuMemAlloc_v2", ctx_dev(), "addr", leak, 3 * MiB, "leaked=1", rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAlloc_v2");
    size_t free0_end = mem_free("end");
    if (accounting && free0_start - free0_end != 3 * MiB)
        die("device 0: %zu bytes used at exit, expected the 3 MiB leak", free0_start - free0_end);
    out("done direct");
    return 0;
}

/*
 * async: the stream-ordered allocator through the PLT (linked -lcuda):
 * default-stream and per-thread-default-stream (_ptsz) variants on two
 * streams, a created pool and the default pool.
 */
#include "common.h"
#include "cuda.h"

#include <stdint.h>

#define P(x) ((unsigned long long)(uintptr_t)(x))

int main(void)
{
    g_prog = "async";
    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    CUcontext ctx;
    EXPECT_RC(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    EXPECT_RC(cuCtxSetCurrent(ctx), CUDA_SUCCESS, "cuCtxSetCurrent");
    out("ctx cuCtxSetCurrent dev=0 handle=0x%llx rc=0", P(ctx));

    CUstream sa = NULL, sb = NULL;
    CUresult rc = cuStreamCreate(&sa, CU_STREAM_NON_BLOCKING);
    out("stream_create cuStreamCreate dev=0 stream=0x%llx rc=%d", P(sa), rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuStreamCreate");
    rc = cuStreamCreate(&sb, CU_STREAM_NON_BLOCKING);
    out("stream_create cuStreamCreate dev=0 stream=0x%llx rc=%d", P(sb), rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuStreamCreate");
    if (!sa || !sb || sa == sb)
        die("streams not distinct");
    const char *xa = xf("stream=0x%llx", P(sa));
    const char *xb = xf("stream=0x%llx", P(sb));

    CUdeviceptr a = 0, b = 0, c = 0, d = 0;
    rc = cuMemAllocAsync(&a, 1 * MiB, sa);
    emit("alloc", "cuMemAllocAsync", 0, "addr", a, 1 * MiB, xa, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAllocAsync");
    rc = cuMemAllocAsync_ptsz(&b, 2 * MiB, sb);
    emit("alloc", "cuMemAllocAsync_ptsz", 0, "addr", b, 2 * MiB, xb, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAllocAsync_ptsz");

    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    CUmemoryPool pool = NULL, defpool = NULL;
    rc = cuMemPoolCreate(&pool, &props);
    out("pool_create cuMemPoolCreate dev=0 pool=0x%llx rc=%d", P(pool), rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemPoolCreate");
    rc = cuDeviceGetDefaultMemPool(&defpool, 0);
    out("pool_create cuDeviceGetDefaultMemPool dev=0 pool=0x%llx rc=%d", P(defpool), rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuDeviceGetDefaultMemPool");

    rc = cuMemAllocFromPoolAsync(&c, 3 * MiB, pool, sa);
    emit("alloc", "cuMemAllocFromPoolAsync", 0, "addr", c, 3 * MiB,
         xf("stream=0x%llx pool=0x%llx", P(sa), P(pool)), rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAllocFromPoolAsync");
    rc = cuMemAllocFromPoolAsync_ptsz(&d, 4 * MiB, defpool, sb);
    emit("alloc", "cuMemAllocFromPoolAsync_ptsz", 0, "addr", d, 4 * MiB,
         xf("stream=0x%llx pool=0x%llx", P(sb), P(defpool)), rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAllocFromPoolAsync_ptsz");

    cuuint64_t used = 1;
    rc = cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used);
    out("info cuMemPoolGetAttribute dev=0 pool=0x%llx attr=7 value=%llu rc=%d", P(pool),
        (unsigned long long)used, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemPoolGetAttribute");

    rc = cuMemFreeAsync(a, sa);
    emit("free", "cuMemFreeAsync", 0, "addr", a, 1 * MiB, xa, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemFreeAsync");
    rc = cuMemFreeAsync_ptsz(b, sb);
    emit("free", "cuMemFreeAsync_ptsz", 0, "addr", b, 2 * MiB, xb, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemFreeAsync_ptsz");
    rc = cuMemFreeAsync(c, sa);
    emit("free", "cuMemFreeAsync", 0, "addr", c, 3 * MiB, xa, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemFreeAsync");
    rc = cuMemFreeAsync_ptsz(d, sb);
    emit("free", "cuMemFreeAsync_ptsz", 0, "addr", d, 4 * MiB, xb, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemFreeAsync_ptsz");

    EXPECT_RC(cuStreamSynchronize(sa), CUDA_SUCCESS, "cuStreamSynchronize");
    EXPECT_RC(cuStreamSynchronize(sb), CUDA_SUCCESS, "cuStreamSynchronize");
    rc = cuMemPoolTrimTo(pool, 0);
    out("pool_trim cuMemPoolTrimTo dev=0 pool=0x%llx keep=0 rc=%d", P(pool), rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemPoolTrimTo");
    rc = cuMemPoolDestroy(pool);
    out("pool_destroy cuMemPoolDestroy dev=0 pool=0x%llx rc=%d", P(pool), rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemPoolDestroy");
    rc = cuStreamDestroy_v2(sa);
    out("stream_destroy cuStreamDestroy_v2 dev=0 stream=0x%llx rc=%d", P(sa), rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuStreamDestroy_v2");
    rc = cuStreamDestroy_v2(sb);
    out("stream_destroy cuStreamDestroy_v2 dev=0 stream=0x%llx rc=%d", P(sb), rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuStreamDestroy_v2");
    out("done async");
    return 0;
}

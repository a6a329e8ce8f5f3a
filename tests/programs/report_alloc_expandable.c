/*
 * report_alloc_expandable: what PyTorch's expandable segments look like from
 * below (linked -lcuda): a large-pool address range with 20 MiB chunks and a
 * small-pool range with 2 MiB chunks, on device 0.
 *   reserve 1 GiB; create+map 3 x 20 MiB                          (60 MiB)
 *   reserve 64 MiB; create+map 2 x 2 MiB                          (64 MiB, the peak)
 *   empty_cache(): unmap+release 2 of the 20 MiB chunks           (burst: 40 MiB)
 *   create+map 1 x 20 MiB                                         (44 MiB)
 *   everything unmapped, released and unreserved at the end
 */
#include "common.h"
#include "cuda.h"

#include <stdint.h>

static CUmemAllocationProp g_prop;

static CUmemGenericAllocationHandle chunk(CUdeviceptr at, size_t size)
{
    CUmemGenericAllocationHandle h = 0;
    CUresult rc = cuMemCreate(&h, size, &g_prop, 0);
    emit("alloc", "cuMemCreate", 0, "handle", h, size, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemCreate");
    rc = cuMemMap(at, size, 0, h, 0);
    emit("map", "cuMemMap", 0, "addr", at, size, xf("handle=0x%llx offset=0", h), rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemMap");
    return h;
}

static void drop(CUdeviceptr at, size_t size, CUmemGenericAllocationHandle h)
{
    CUresult rc = cuMemUnmap(at, size);
    emit("unmap", "cuMemUnmap", 0, "addr", at, size, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemUnmap");
    rc = cuMemRelease(h);
    emit("free", "cuMemRelease", 0, "handle", h, size, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemRelease");
}

static CUdeviceptr reserve(size_t size)
{
    CUdeviceptr va = 0;
    CUresult rc = cuMemAddressReserve(&va, size, 2 * MiB, 0, 0);
    emit("reserve", "cuMemAddressReserve", -1, "addr", va, size, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAddressReserve");
    return va;
}

static void unreserve(CUdeviceptr va, size_t size)
{
    CUresult rc = cuMemAddressFree(va, size);
    emit("unreserve", "cuMemAddressFree", -1, "addr", va, size, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAddressFree");
}

int main(void)
{
    g_prog = "report_alloc_expandable";
    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    CUcontext ctx;
    EXPECT_RC(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    EXPECT_RC(cuCtxSetCurrent(ctx), CUDA_SUCCESS, "cuCtxSetCurrent");
    memset(&g_prop, 0, sizeof g_prop);
    g_prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    g_prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    g_prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    g_prop.location.id = 0;

    const size_t large_range = 1024 * MiB, small_range = 64 * MiB;
    const size_t L = 20 * MiB, S = 2 * MiB;
    CUdeviceptr large = reserve(large_range);
    CUmemGenericAllocationHandle h[4];
    for (int i = 0; i < 3; i++)
        h[i] = chunk(large + i * L, L);
    CUdeviceptr small = reserve(small_range);
    CUmemGenericAllocationHandle s[2];
    for (int i = 0; i < 2; i++)
        s[i] = chunk(small + i * S, S);

    /* empty_cache(): the free tail of the large segment is unmapped. */
    drop(large + 2 * L, L, h[2]);
    drop(large + 1 * L, L, h[1]);

    h[3] = chunk(large + 1 * L, L);

    drop(large + 1 * L, L, h[3]);
    drop(large, L, h[0]);
    for (int i = 1; i >= 0; i--)
        drop(small + i * S, S, s[i]);
    unreserve(small, small_range);
    unreserve(large, large_range);
    out("done report_alloc_expandable");
    return 0;
}

/*
 * vmm: virtual memory management (linked -lcuda), the way PyTorch's
 * expandable segments and NCCL use it.  The current context is device 0 while
 * the physical memory is created on device 1 (prop.location.id = 1): the
 * charge belongs to device 1.
 */
#include "common.h"
#include "cuda.h"

#include <stdint.h>

int main(void)
{
    g_prog = "vmm";
    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    CUcontext ctx;
    EXPECT_RC(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    EXPECT_RC(cuCtxSetCurrent(ctx), CUDA_SUCCESS, "cuCtxSetCurrent");
    out("ctx cuCtxSetCurrent dev=0 handle=0x%llx rc=0", (unsigned long long)(uintptr_t)ctx);

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 1;

    size_t gran = 0;
    CUresult rc = cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    out("info cuMemGetAllocationGranularity dev=1 granularity=%zu rc=%d", gran, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemGetAllocationGranularity");

    const size_t reserve = 64 * MiB, chunk = 20 * MiB;
    CUdeviceptr va = 0;
    rc = cuMemAddressReserve(&va, reserve, 2 * MiB, 0, 0);
    emit("reserve", "cuMemAddressReserve", -1, "addr", va, reserve, "align=2097152", rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAddressReserve");
    if (va % (2 * MiB))
        die("reservation 0x%llx not 2 MiB aligned", va);

    CUmemGenericAllocationHandle h[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        rc = cuMemCreate(&h[i], chunk, &prop, 0);
        emit("alloc", "cuMemCreate", 1, "handle", h[i], chunk, NULL, rc);
        EXPECT_RC(rc, CUDA_SUCCESS, "cuMemCreate");
    }
    for (int i = 0; i < 2; i++) {
        rc = cuMemMap(va + i * chunk, chunk, 0, h[i], 0);
        emit("map", "cuMemMap", 1, "addr", va + i * chunk, chunk,
             xf("handle=0x%llx offset=0", h[i]), rc);
        EXPECT_RC(rc, CUDA_SUCCESS, "cuMemMap");
    }
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 1;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    rc = cuMemSetAccess(va, 2 * chunk, &acc, 1);
    emit("access", "cuMemSetAccess", 1, "addr", va, 2 * chunk, "flags=3", rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemSetAccess");

    /* Invalid: an unknown handle must be refused. */
    rc = cuMemMap(va + 2 * chunk, chunk, 0, 0xdead, 0);
    emit("map", "cuMemMap", 1, "addr", va + 2 * chunk, chunk, "handle=0xdead expect_error=1", rc);
    EXPECT_RC(rc, CUDA_ERROR_INVALID_VALUE, "cuMemMap(unknown handle)");

    for (int i = 0; i < 2; i++) {
        rc = cuMemUnmap(va + i * chunk, chunk);
        emit("unmap", "cuMemUnmap", 1, "addr", va + i * chunk, chunk, NULL, rc);
        EXPECT_RC(rc, CUDA_SUCCESS, "cuMemUnmap");
    }
    for (int i = 0; i < 2; i++) {
        rc = cuMemRelease(h[i]);
        emit("free", "cuMemRelease", 1, "handle", h[i], chunk, NULL, rc);
        EXPECT_RC(rc, CUDA_SUCCESS, "cuMemRelease");
    }
    rc = cuMemAddressFree(va, reserve);
    emit("unreserve", "cuMemAddressFree", -1, "addr", va, reserve, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAddressFree");
    out("done vmm");
    return 0;
}

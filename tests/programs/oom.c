/*
 * oom: provoke CUDA_ERROR_OUT_OF_MEMORY (linked -lcuda).  Meant to run with
 * FAKECUDA_MEM=1G (set here when unset): 512 MiB succeeds, 768 MiB fails with
 * 2, the 512 MiB buffer is freed and the program exits 0.
 */
#include "common.h"
#include "cuda.h"

int main(void)
{
    g_prog = "oom";
    setenv("FAKECUDA_MEM", "1G", 0);
    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    CUcontext ctx;
    EXPECT_RC(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    EXPECT_RC(cuCtxSetCurrent(ctx), CUDA_SUCCESS, "cuCtxSetCurrent");

    size_t f, t;
    CUresult rc = cuMemGetInfo_v2(&f, &t);
    out("info cuMemGetInfo_v2 dev=0 free=%zu total=%zu when=start rc=%d", f, t, rc);
    if (t != 1024 * MiB)
        die("device capacity is %zu; run with FAKECUDA_MEM=1G", t);

    CUdeviceptr a = 0, b = 0;
    rc = cuMemAlloc_v2(&a, 512 * MiB);
    emit("alloc", "cuMemAlloc_v2", 0, "addr", a, 512 * MiB, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAlloc_v2(512 MiB)");

    rc = cuMemAlloc_v2(&b, 768 * MiB);
    emit("alloc", "cuMemAlloc_v2", 0, "addr", b, 768 * MiB, "expect_error=2", rc);
    EXPECT_RC(rc, CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc_v2(768 MiB)");
    if (b != 0)
        die("failed allocation touched its out-parameter");

    rc = cuMemGetInfo_v2(&f, &t);
    out("info cuMemGetInfo_v2 dev=0 free=%zu total=%zu when=after-oom rc=%d", f, t, rc);

    rc = cuMemFree_v2(a);
    emit("free", "cuMemFree_v2", 0, "addr", a, 512 * MiB, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemFree_v2");
    out("done oom");
    return 0;
}

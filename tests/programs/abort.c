/* abort: 5 allocations of 1 MiB (linked -lcuda), then abort(): dies by SIGABRT. */
#include "common.h"
#include "cuda.h"

int main(void)
{
    g_prog = "abort";
    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    CUcontext ctx;
    EXPECT_RC(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    EXPECT_RC(cuCtxSetCurrent(ctx), CUDA_SUCCESS, "cuCtxSetCurrent");
    for (int i = 0; i < 5; i++) {
        CUdeviceptr p = 0;
        CUresult rc = cuMemAlloc_v2(&p, 1 * MiB);
        emit("alloc", "cuMemAlloc_v2", 0, "addr", p, 1 * MiB, NULL, rc);
        EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAlloc_v2");
    }
    out("aborting pid=%d", getpid());
    abort();
}

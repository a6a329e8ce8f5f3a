/*
 * sigkill: 5 allocations, 500 ms sleep, 5 more (linked -lcuda), then
 * kill(getpid(), SIGKILL) at once: dies by SIGKILL with nothing run at exit.
 */
#include "common.h"
#include "cuda.h"

#include <signal.h>
#include <time.h>

static void five(unsigned long long size)
{
    for (int i = 0; i < 5; i++) {
        CUdeviceptr p = 0;
        CUresult rc = cuMemAlloc_v2(&p, size);
        emit("alloc", "cuMemAlloc_v2", 0, "addr", p, size, NULL, rc);
        EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAlloc_v2");
    }
}

int main(void)
{
    g_prog = "sigkill";
    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    CUcontext ctx;
    EXPECT_RC(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    EXPECT_RC(cuCtxSetCurrent(ctx), CUDA_SUCCESS, "cuCtxSetCurrent");
    five(1 * MiB);
    struct timespec ts = {0, 500 * 1000 * 1000};
    /* The full 500 ms even if a signal (a test's SIGUSR2) interrupts the sleep. */
    while (nanosleep(&ts, &ts) != 0)
        ;
    five(2 * MiB);
    out("killing pid=%d", getpid());
    kill(getpid(), SIGKILL);
    for (;;)
        pause();
}

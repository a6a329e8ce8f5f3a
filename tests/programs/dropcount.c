/*
 * dropcount: exact event counts under VRAMSHIM_ON_FULL=drop (run with
 * FAKECUDA_STALL_SIZE=STALL and a tiny VRAMSHIM_BUFFER_EVENTS).
 *
 * A helper thread on device 1 calls cuMemAlloc_v2(STALL) and is held inside the
 * driver (FAKECUDA_STALL_SIZE), which holds the recorder's watermark back: nothing
 * the main thread records afterwards can be written until it returns, so the main
 * thread's buffer fills and stays full. The main thread then makes PAIRS
 * cuMemAlloc_v2/cuMemFree_v2 pairs on device 0 and PAIRS on device 1 (the first
 * event on each device is where the recorder samples that device's memory), then
 * releases the helper, which frees its allocation and exits.
 *
 * Usage: dropcount PAIRS STALL
 * Prints:
 *   total calls=<every alloc/free call made, the helper's two included> rc=0
 */
#include "common.h"
#include "cuda.h"

#include <pthread.h>

void fakecuda_stall_wait(void);
void fakecuda_stall_release(void);

static size_t g_stall;
static int g_helper_rc = -1;

static CUresult use_device(int dev)
{
    CUcontext ctx;
    CUresult rc = cuDevicePrimaryCtxRetain(&ctx, dev);
    return rc == CUDA_SUCCESS ? cuCtxSetCurrent(ctx) : rc;
}

static void *helper(void *arg)
{
    (void)arg;
    CUdeviceptr p = 0;
    CUresult rc = use_device(1);
    if (rc == CUDA_SUCCESS)
        rc = cuMemAlloc_v2(&p, g_stall);
    if (rc == CUDA_SUCCESS)
        rc = cuMemFree_v2(p);
    g_helper_rc = rc;
    return NULL;
}

static void pairs(int dev, long n)
{
    EXPECT_RC(use_device(dev), CUDA_SUCCESS, "context");
    for (long i = 0; i < n; i++) {
        CUdeviceptr p = 0;
        EXPECT_RC(cuMemAlloc_v2(&p, 4096), CUDA_SUCCESS, "cuMemAlloc_v2");
        EXPECT_RC(cuMemFree_v2(p), CUDA_SUCCESS, "cuMemFree_v2");
    }
}

int main(int argc, char **argv)
{
    g_prog = "dropcount";
    if (argc != 3)
        die("usage: dropcount PAIRS STALL");
    long n = atol(argv[1]);
    g_stall = (size_t)atoll(argv[2]);
    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    pthread_t th;
    if (pthread_create(&th, NULL, helper, NULL) != 0)
        die("pthread_create");
    fakecuda_stall_wait();
    pairs(0, n);
    pairs(1, n);
    fakecuda_stall_release();
    pthread_join(th, NULL);
    EXPECT_RC(g_helper_rc, CUDA_SUCCESS, "helper thread");
    out("total calls=%ld rc=0", 4 * n + 2);
    return 0;
}

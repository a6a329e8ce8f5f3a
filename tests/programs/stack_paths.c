/*
 * stack_paths [ROUNDS]: one allocation site reached by three call paths, in turn:
 *   i % 3 == 0: main -> outer_a -> mid -> site
 *   i % 3 == 1: main -> outer_b -> mid -> site
 *   i % 3 == 2: main -> site
 * outer_a and outer_b have the same frame, so site runs at the same stack pointer (and frame
 * pointer) on both paths: only a return address further out tells them apart. Each visit
 * allocates 4 KiB and frees it (2 events). Built twice: with frame pointers (-O1, like the
 * other tests) and without (-O2 -fomit-frame-pointer, stack-pointer-relative unwind rules).
 */
#include "common.h"
#include "cuda.h"

static volatile int g_sink;

__attribute__((noinline, noclone)) static void site(void)
{
    CUdeviceptr p;
    EXPECT_RC(cuMemAlloc_v2(&p, 4096), CUDA_SUCCESS, "cuMemAlloc_v2"); /* site */
    EXPECT_RC(cuMemFree_v2(p), CUDA_SUCCESS, "cuMemFree_v2");
}

/* The `g_sink` updates after each call keep the calls from becoming tail calls. */
__attribute__((noinline, noclone)) static void mid(void)
{
    site(); /* mid */
    g_sink = g_sink + 1;
}

__attribute__((noinline, noclone)) static void outer_a(void)
{
    mid(); /* outer_a */
    g_sink = g_sink + 1;
}

__attribute__((noinline, noclone)) static void outer_b(void)
{
    mid(); /* outer_b */
    g_sink = g_sink + 2; /* not + 1: identical functions may be folded into one */
}

int main(int argc, char **argv)
{
    g_prog = "stack_paths";
    long rounds = argc > 1 ? atol(argv[1]) : 300;
    if (rounds < 1)
        die("bad ROUNDS");
    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    CUcontext ctx;
    EXPECT_RC(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    EXPECT_RC(cuCtxSetCurrent(ctx), CUDA_SUCCESS, "cuCtxSetCurrent");
    for (long i = 0; i < rounds; i++) {
        switch (i % 3) {
        case 0:
            outer_a(); /* main_a */
            break;
        case 1:
            outer_b(); /* main_b */
            break;
        default:
            site(); /* main_site */
            break;
        }
    }
    return 0;
}

/*
 * stack_joins [ROUNDS]: one allocation site reached by 20 call paths in turn (round i takes
 * path i % 20), so that a walk shares part of its stack with the walks just before it, and
 * a walk that took the rest of its frames from an earlier walk wrongly would say so:
 *   0 - 5:   main -> outer_<n> -> inner_1 -> inner_2 -> inner_3 -> site, outer_<n> called
 *            through one pointer call in main. The six outer functions have the same frame:
 *            the inner frames are at the same stack pointer on every one of these paths,
 *            and only the return address in inner_1's frame tells them apart.
 *   6, 7:    main -> bounce(0 or 1) -> inner_1 -> ...: bounce calls inner_1 from two places,
 *            so the same frame's return address slot changes between calls.
 *   8 - 11:  main -> shifted(pad) -> inner_1 -> ...: the inner frames moved down by an alloca
 *            of 0, 48, 96 or 144 bytes (a frame-pointer-based frame even without frame
 *            pointers).
 *   12 - 19: main -> rec(d) -> ... -> rec(0) -> site for d = 300, 310, 200, 250, 280, 150,
 *            40, 1: stacks deeper than the shim walks (cut at its frame limit) before and
 *            after shallower ones that share their outer frames.
 * Each visit allocates 4 KiB and frees it (2 events). Built with and without frame pointers.
 */
#include <alloca.h>

#include "common.h"
#include "cuda.h"

static volatile int g_sink;

__attribute__((noinline, noclone)) static void site(void)
{
    CUdeviceptr p;
    EXPECT_RC(cuMemAlloc_v2(&p, 4096), CUDA_SUCCESS, "cuMemAlloc_v2");
    EXPECT_RC(cuMemFree_v2(p), CUDA_SUCCESS, "cuMemFree_v2");
}

/* The `g_sink` updates after each call keep the calls from becoming tail calls; their
 * different constants keep identical functions from being folded into one. */
__attribute__((noinline, noclone)) static void inner_3(void)
{
    site();
    g_sink = g_sink + 3;
}

__attribute__((noinline, noclone)) static void inner_2(void)
{
    inner_3();
    g_sink = g_sink + 2;
}

__attribute__((noinline, noclone)) static void inner_1(void)
{
    inner_2();
    g_sink = g_sink + 1;
}

#define OUTER(n)                                                                              \
    __attribute__((noinline, noclone)) static void outer_##n(void)                            \
    {                                                                                         \
        inner_1();                                                                            \
        g_sink = g_sink + 10 + n;                                                             \
    }
OUTER(0)
OUTER(1)
OUTER(2)
OUTER(3)
OUTER(4)
OUTER(5)
static void (*const outers[6])(void) = {outer_0, outer_1, outer_2, outer_3, outer_4, outer_5};

/* The volatile stores before each call keep the two calls apart (not hoisted into one). */
__attribute__((noinline, noclone)) static void bounce(int which)
{
    if (which) {
        g_sink = 21;
        inner_1(); /* bounce_1 */
        g_sink = g_sink + 1;
    } else {
        g_sink = 22;
        inner_1(); /* bounce_0 */
        g_sink = g_sink + 2;
    }
}

__attribute__((noinline, noclone)) static void shifted(int pad)
{
    volatile char *room = alloca(pad + 1);
    room[0] = 0;
    inner_1();
    g_sink = g_sink + room[0] + 4;
}

__attribute__((noinline, noclone)) static void rec(int depth)
{
    if (depth == 0)
        site();
    else
        rec(depth - 1);
    g_sink = g_sink + depth;
}

static const int pads[4] = {0, 48, 96, 144};
static const int depths[8] = {300, 310, 200, 250, 280, 150, 40, 1};

int main(int argc, char **argv)
{
    g_prog = "stack_joins";
    long rounds = argc > 1 ? atol(argv[1]) : 60;
    if (rounds < 1)
        die("bad ROUNDS");
    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    CUcontext ctx;
    EXPECT_RC(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    EXPECT_RC(cuCtxSetCurrent(ctx), CUDA_SUCCESS, "cuCtxSetCurrent");
    for (long i = 0; i < rounds; i++) {
        int path = (int)(i % 20);
        if (path < 6)
            outers[path](); /* main_outer */
        else if (path < 8)
            bounce(path - 6); /* main_bounce */
        else if (path < 12)
            shifted(pads[path - 8]); /* main_shifted */
        else
            rec(depths[path - 12]); /* main_rec */
        g_sink = g_sink + 1;
    }
    return 0;
}

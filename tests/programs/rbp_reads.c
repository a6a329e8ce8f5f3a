/*
 * rbp_reads [ROUNDS]: one allocation site called at the same stack pointer, through the same
 * return addresses below a frame-pointer frame, from two callers whose frames differ in size,
 * in turn (round i: near_caller if i is even, far_caller if odd), both called from one call
 * site in `visit`. Built without frame pointers, except for `framed`, whose alloca makes it
 * keep its frame in rbp (its unwind rule reads rbp). So two consecutive rounds' walks start
 * from the same ip and sp and read the same words up to `framed`'s frame and from the
 * callers' return address on; only rbp tells them apart, and the words at the other round's
 * rbp are the stale ones that round left (inside far_caller's unwritten array). A walk that
 * replayed the other round's walk without comparing rbp names the wrong caller (checked: with
 * rbp never compared, the first far round already got near_caller's stack).
 *
 * Before the rounds, the callers are lined up: site() only notes its stack pointer, once
 * through each caller, and near_caller's alloca is grown by the difference; the program
 * fails if the two stack pointers still differ.
 */
#include <alloca.h>
#include <stdint.h>

#include "common.h"
#include "cuda.h"

static volatile int g_sink;
static volatile int g_measure;
static volatile uintptr_t g_site_sp;

__attribute__((noinline, noclone)) static void site(void)
{
    if (g_measure) {
        uintptr_t sp;
        __asm__ volatile("mov %%rsp, %0" : "=r"(sp));
        g_site_sp = sp;
        return;
    }
    CUdeviceptr p;
    EXPECT_RC(cuMemAlloc_v2(&p, 4096), CUDA_SUCCESS, "cuMemAlloc_v2");
    EXPECT_RC(cuMemFree_v2(p), CUDA_SUCCESS, "cuMemFree_v2");
}

/* The alloca makes rbp this frame's frame pointer (CFA = rbp + 16). */
__attribute__((noinline, noclone)) static void framed(long pad)
{
    volatile char *room = alloca(pad + 1);
    room[0] = 0;
    site();
    g_sink = g_sink + room[0] + 1;
}

__attribute__((noinline, noclone)) static void near_caller(long pad)
{
    framed(pad); /* near */
    g_sink = g_sink + 2;
}

__attribute__((noinline, noclone)) static void far_caller(long pad)
{
    volatile char big[1024];
    big[0] = 0;
    framed(pad); /* far */
    g_sink = g_sink + big[0] + 3;
}

/* Both callers are called from this one call site: the return address in their frames is
 * the same word. */
static void (*const callers[2])(long) = {near_caller, far_caller};

__attribute__((noinline, noclone)) static void visit(int which, long pad)
{
    callers[which](pad); /* visit */
    g_sink = g_sink + 5;
}

static uintptr_t site_sp(int which, long pad)
{
    g_measure = 1;
    visit(which, pad);
    g_measure = 0;
    return g_site_sp;
}

int main(int argc, char **argv)
{
    g_prog = "rbp_reads";
    long rounds = argc > 1 ? atol(argv[1]) : 40;
    if (rounds < 1)
        die("bad ROUNDS");
    uintptr_t near_sp = site_sp(0, 0), far_sp = site_sp(1, 0);
    if (near_sp <= far_sp)
        die("far_caller's frame is not below near_caller's");
    long near_pad = (long)(near_sp - far_sp);
    if (site_sp(0, near_pad) != site_sp(1, 0))
        die("could not line the two callers' site() up at one stack pointer");
    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    CUcontext ctx;
    EXPECT_RC(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    EXPECT_RC(cuCtxSetCurrent(ctx), CUDA_SUCCESS, "cuCtxSetCurrent");
    for (long i = 0; i < rounds; i++) {
        visit((int)(i % 2), i % 2 == 0 ? near_pad : 0); /* main_visit */
        g_sink = g_sink + 1;
    }
    return 0;
}

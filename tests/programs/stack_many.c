/*
 * stack_many [ROUNDS]: one allocation site called from 1,024 different functions, in turn
 * (round i from f_<i % 1024 in base 4, five digits>). Each caller's return address is its
 * own, so the walks cross 1,024 distinct return addresses one after another: more than a
 * 509-slot direct-mapped rule cache holds, which makes the shim's unwinder move the thread
 * to its larger rule cache (shim/src/unwind.rs, RuleBanks) during the first 1,024 rounds.
 * Each visit allocates 4 KiB and frees it (2 events). Built with and without frame pointers.
 */
#include "common.h"
#include "cuda.h"

static const char *volatile g_last;

__attribute__((noinline, noclone)) static void site(void)
{
    CUdeviceptr p;
    EXPECT_RC(cuMemAlloc_v2(&p, 4096), CUDA_SUCCESS, "cuMemAlloc_v2");
    EXPECT_RC(cuMemFree_v2(p), CUDA_SUCCESS, "cuMemFree_v2");
}

/* The store after the call keeps it from being a tail call, and its string (the function's
 * own) keeps the 1,024 functions from being folded into one. */
#define F(n)                                                                                  \
    __attribute__((noinline, noclone)) static void f_##n(void)                                \
    {                                                                                         \
        site();                                                                               \
        g_last = #n;                                                                          \
    }
#define F4(p) F(p##0) F(p##1) F(p##2) F(p##3)
#define F16(p) F4(p##0) F4(p##1) F4(p##2) F4(p##3)
#define F64(p) F16(p##0) F16(p##1) F16(p##2) F16(p##3)
#define F256(p) F64(p##0) F64(p##1) F64(p##2) F64(p##3)
F256(0)
F256(1)
F256(2)
F256(3)

#define T(n) f_##n,
#define T4(p) T(p##0) T(p##1) T(p##2) T(p##3)
#define T16(p) T4(p##0) T4(p##1) T4(p##2) T4(p##3)
#define T64(p) T16(p##0) T16(p##1) T16(p##2) T16(p##3)
#define T256(p) T64(p##0) T64(p##1) T64(p##2) T64(p##3)
static void (*const callers[1024])(void) = {T256(0) T256(1) T256(2) T256(3)};

int main(int argc, char **argv)
{
    g_prog = "stack_many";
    long rounds = argc > 1 ? atol(argv[1]) : 2048;
    if (rounds < 1)
        die("bad ROUNDS");
    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    CUcontext ctx;
    EXPECT_RC(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    EXPECT_RC(cuCtxSetCurrent(ctx), CUDA_SUCCESS, "cuCtxSetCurrent");
    for (long i = 0; i < rounds; i++)
        callers[i % 1024]();
    return 0;
}

/*
 * The alloc/free program of scripts/bench-peers.sh: PAIRS allocations of 4096 bytes, each freed
 * at once, from a call stack DEPTH non-inlined frames deep.  Built twice from this source:
 * -DUSE_CUDA calls the fake runtime's cudaMalloc/cudaFree (what vramshim records), without it
 * the loop calls malloc/free (what heaptrack records).  Usage: bench_peers PAIRS DEPTH
 */
#include <stdio.h>
#include <stdlib.h>
#ifdef USE_CUDA
#include "cuda_runtime.h"
#endif

static long g_pairs;

__attribute__((noinline)) static long work(void)
{
    for (long i = 0; i < g_pairs; i++) {
#ifdef USE_CUDA
        void *p = NULL;
        if (cudaMalloc(&p, 4096) != cudaSuccess || cudaFree(p) != cudaSuccess) {
            fprintf(stderr, "bench_peers: cudaMalloc/cudaFree failed\n");
            exit(1);
        }
#else
        void *volatile p = malloc(4096);
        if (p == NULL) {
            fprintf(stderr, "bench_peers: malloc failed\n");
            exit(1);
        }
        free(p);
#endif
    }
    return g_pairs;
}

/* One real stack frame per level: no inlining, cloning or tail calls. */
__attribute__((noinline, noclone)) static long recurse(int n)
{
    volatile char frame[16];
    frame[0] = (char)n;
    long r = n > 0 ? recurse(n - 1) : work();
    __asm__ volatile("" : : "r"(frame) : "memory");
    return r + frame[0] - (char)n;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: bench_peers PAIRS DEPTH\n");
        return 2;
    }
    g_pairs = atol(argv[1]);
    int depth = atoi(argv[2]);
    if (g_pairs < 1 || depth < 0 || depth > 10000) {
        fprintf(stderr, "bench_peers: bad arguments\n");
        return 2;
    }
    return recurse(depth) == g_pairs ? 0 : 1;
}

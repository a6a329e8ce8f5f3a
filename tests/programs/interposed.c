/*
 * interposed: 100 cudaMalloc(4096*(i+1)) / cudaFree pairs (linked -lcudart),
 * meant to run with LD_PRELOAD containing libinterpose.so (and vramshim).
 */
#include "common.h"
#include "cuda_runtime.h"

#include <stdint.h>

int main(void)
{
    g_prog = "interposed";
    unsigned long long bytes = 0;
    for (int i = 0; i < 100; i++) {
        size_t size = 4096 * (size_t)(i + 1);
        void *p = NULL;
        cudaError_t rc = cudaMalloc(&p, size);
        emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)p, size, NULL, rc);
        EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
        rc = cudaFree(p);
        emit("free", "cudaFree", 0, "addr", (uintptr_t)p, size, NULL, rc);
        EXPECT_RC(rc, cudaSuccess, "cudaFree");
        bytes += size;
    }
    out("total cudaMalloc=100 cudaFree=100 bytes=%llu", bytes);
    return 0;
}

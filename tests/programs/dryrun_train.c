/*
 * dryrun_train: a toy training loop for the `vramshim dryrun` tests (linked
 * -lcudart).  Usage: dryrun_train WEIGHTS_MIB ACTIVATIONS_MIB STEPS DEVICES
 *
 * Holds WEIGHTS_MIB of weights on each of the first DEVICES devices (line
 * marked ALLOC: weights), then runs STEPS steps on device 0: each step
 * allocates ACTIVATIONS_MIB of activations (ALLOC: activations) and a 1 MiB
 * gradient buffer (ALLOC: gradients), then frees both.  So device 0 peaks at
 * WEIGHTS + ACTIVATIONS + 1 MiB, the other devices at WEIGHTS.  When an
 * allocation fails, it prints "oom step=<n> size=<bytes>" and exits with
 * status 3; otherwise it frees everything and exits 0.
 */
#include "common.h"
#include "cuda_runtime.h"

#include <stdint.h>

#define NOINLINE __attribute__((noinline))
#define OOM_EXIT 3

static NOINLINE void *alloc_weights(int dev, size_t size)
{
    void *p = NULL;
    EXPECT_RC(cudaSetDevice(dev), cudaSuccess, "cudaSetDevice");
    int rc = cudaMalloc(&p, size); /* ALLOC: weights */
    if (rc != cudaSuccess) {
        out("oom step=-1 size=%zu", size);
        exit(OOM_EXIT);
    }
    return p;
}

static NOINLINE void *alloc_activations(int step, size_t size)
{
    void *p = NULL;
    int rc = cudaMalloc(&p, size); /* ALLOC: activations */
    if (rc != cudaSuccess) {
        out("oom step=%d size=%zu", step, size);
        exit(OOM_EXIT);
    }
    return p;
}

static NOINLINE void *alloc_gradients(int step, size_t size)
{
    void *p = NULL;
    int rc = cudaMalloc(&p, size); /* ALLOC: gradients */
    if (rc != cudaSuccess) {
        out("oom step=%d size=%zu", step, size);
        exit(OOM_EXIT);
    }
    return p;
}

static size_t arg_mib(const char *text, const char *what)
{
    char *end;
    unsigned long long v = strtoull(text, &end, 10);
    if (*text == '\0' || *end != '\0')
        die("bad %s: %s", what, text);
    return (size_t)v * MiB;
}

int main(int argc, char **argv)
{
    g_prog = "dryrun_train";
    if (argc != 5)
        die("usage: dryrun_train WEIGHTS_MIB ACTIVATIONS_MIB STEPS DEVICES");
    size_t weights = arg_mib(argv[1], "weights");
    size_t activations = arg_mib(argv[2], "activations");
    int steps = atoi(argv[3]);
    int devices = atoi(argv[4]);
    if (steps < 0 || devices < 1 || devices > 8)
        die("bad steps or devices");

    void *held[8] = {0};
    for (int d = 0; d < devices; d++)
        held[d] = alloc_weights(d, weights);
    EXPECT_RC(cudaSetDevice(0), cudaSuccess, "cudaSetDevice");
    for (int step = 0; step < steps; step++) {
        void *act = alloc_activations(step, activations);
        void *grad = alloc_gradients(step, MiB);
        EXPECT_RC(cudaFree(grad), cudaSuccess, "cudaFree");
        EXPECT_RC(cudaFree(act), cudaSuccess, "cudaFree");
    }
    for (int d = 0; d < devices; d++) {
        EXPECT_RC(cudaSetDevice(d), cudaSuccess, "cudaSetDevice");
        EXPECT_RC(cudaFree(held[d]), cudaSuccess, "cudaFree");
    }
    out("done steps=%d", steps);
    return 0;
}

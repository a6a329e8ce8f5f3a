/*
 * demo: a toy "training" loop for the README (linked -lcudart), run with
 * FAKECUDA_MEM=2G (set here when unset).  Loads weights, runs 5 steps that
 * allocate and free activations but leak one 16 MiB "grad cache" buffer each,
 * uses a pinned host staging buffer, and finally fails a 1200 MiB cudaMalloc
 * that would have fit without the leaks.  Prints a short story.
 */
#include "common.h"
#include "cuda_runtime.h"

#define STEPS 5

static void check(cudaError_t rc, const char *what)
{
    if (rc != cudaSuccess)
        die("%s: %s (%d)", what, cudaGetErrorString(rc), rc);
}

static void *dalloc(size_t size, const char *what)
{
    void *p = NULL;
    check(cudaMalloc(&p, size), what);
    return p;
}

int main(void)
{
    g_prog = "demo";
    setenv("FAKECUDA_MEM", "2G", 0);
    check(cudaSetDevice(0), "cudaSetDevice");
    size_t free0, total;
    check(cudaMemGetInfo(&free0, &total), "cudaMemGetInfo");
    out("[demo] GPU 0: %zu MiB total, %zu MiB free", total / MiB, free0 / MiB);

    static const struct {
        const char *name;
        size_t mib;
    } weights[] = {{"embedding", 256}, {"attention", 128}, {"mlp", 384}, {"lm_head", 64}};
    void *w[4];
    size_t wsum = 0;
    for (int i = 0; i < 4; i++) {
        w[i] = dalloc(weights[i].mib * MiB, weights[i].name);
        wsum += weights[i].mib;
    }
    out("[demo] loaded model: 4 weight tensors (embedding 256, attention 128, mlp 384, "
        "lm_head 64 MiB) = %zu MiB",
        wsum);

    void *staging = NULL;
    check(cudaMallocHost(&staging, 64 * MiB), "cudaMallocHost");
    out("[demo] pinned host staging buffer: 64 MiB");

    for (int step = 1; step <= STEPS; step++) {
        void *act[3];
        for (int i = 0; i < 3; i++)
            act[i] = dalloc(96 * MiB, "activation");
        void *grad_cache = dalloc(16 * MiB, "grad cache");
        (void)grad_cache; /* the bug: never freed */
        memset(staging, step, 4096);
        for (int i = 0; i < 3; i++)
            check(cudaFree(act[i]), "cudaFree(activation)");
        out("[demo] step %d: 3 x 96 MiB activations allocated and freed; 16 MiB grad cache kept "
            "(leak)",
            step);
    }

    size_t free1;
    check(cudaMemGetInfo(&free1, &total), "cudaMemGetInfo");
    out("[demo] after training: %zu MiB free (weights %zu MiB + %d MiB leaked)", free1 / MiB,
        wsum, STEPS * 16);

    void *eval = NULL;
    cudaError_t rc = cudaMalloc(&eval, 1200 * MiB);
    if (rc == cudaSuccess)
        die("the 1200 MiB evaluation buffer fit; run with FAKECUDA_MEM=2G");
    out("[demo] evaluation buffer of 1200 MiB: cudaMalloc failed: %s (%d); without the leaked "
        "%d MiB it would have fit",
        cudaGetErrorString(rc), (int)rc, STEPS * 16);

    for (int i = 0; i < 4; i++)
        check(cudaFree(w[i]), "cudaFree(weights)");
    check(cudaFreeHost(staging), "cudaFreeHost");
    out("[demo] freed weights and staging buffer; exiting with %d MiB still allocated",
        STEPS * 16);
    return 0;
}

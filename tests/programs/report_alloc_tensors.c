/*
 * report_alloc_tensors MODE: one allocation per tensor on device 0, the
 * request stream `vramshim whatif` replays (linked -lcudart -lcuda).
 *   MODE async: cudaMallocAsync / cudaFreeAsync on a created stream, and
 *               cudaMemPoolTrimTo(default pool, 0) where PyTorch's
 *               empty_cache() would be (backend:cudaMallocAsync); also a
 *               7 MiB cudaMalloc first and freed last, the way cuBLAS's own
 *               workspace shows up beside PyTorch's tensors (not a tensor);
 *   MODE plain: cudaMalloc / cudaFree, no trim (PYTORCH_NO_CUDA_MEMORY_CACHING=1).
 * Tensors, in order:
 *   a = 11 MiB, b = 3 MiB, c = 512000 B; free a; d = 18 MiB;
 *   free b, c, d; [async: trim]; e = 8 MiB; free e.
 * What PyTorch's native allocator would do with them (defaults): a takes a
 * 12 MiB segment whole, b a 20 MiB segment (split), c a 2 MiB small segment,
 * d fits no cached block (12, 17 MiB) and takes an 18 MiB segment: 52 MiB
 * reserved at the peak, 4 cudaMallocs; async: the trim releases everything and
 * e takes a new 20 MiB segment (5 cudaMallocs); plain: e reuses the 12 MiB block.
 */
#include "common.h"
#include "cuda_runtime.h"

#include <stdint.h>

static int g_async;
static cudaStream_t g_stream;

static void *tensor(size_t size)
{
    void *p = NULL;
    int rc;
    if (g_async) {
        rc = cudaMallocAsync(&p, size, g_stream);
        emit("alloc", "cudaMallocAsync", 0, "addr", (uintptr_t)p, size,
             xf("stream=0x%llx", (unsigned long long)(uintptr_t)g_stream), rc);
    } else {
        rc = cudaMalloc(&p, size);
        emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)p, size, NULL, rc);
    }
    EXPECT_RC(rc, cudaSuccess, "allocation");
    return p;
}

static void release(void *p)
{
    int rc;
    if (g_async) {
        rc = cudaFreeAsync(p, g_stream);
        emit("free", "cudaFreeAsync", 0, "addr", (uintptr_t)p, 0,
             xf("stream=0x%llx", (unsigned long long)(uintptr_t)g_stream), rc);
    } else {
        rc = cudaFree(p);
        emit("free", "cudaFree", 0, "addr", (uintptr_t)p, 0, NULL, rc);
    }
    EXPECT_RC(rc, cudaSuccess, "free");
}

int main(int argc, char **argv)
{
    g_prog = "report_alloc_tensors";
    if (argc != 2 || (strcmp(argv[1], "async") && strcmp(argv[1], "plain")))
        die("usage: report_alloc_tensors async|plain");
    g_async = !strcmp(argv[1], "async");
    EXPECT_RC(cudaSetDevice(0), cudaSuccess, "cudaSetDevice");
    if (g_async) {
        EXPECT_RC(cudaStreamCreate(&g_stream), cudaSuccess, "cudaStreamCreate");
        out("stream_create cudaStreamCreate dev=0 stream=0x%llx rc=0",
            (unsigned long long)(uintptr_t)g_stream);
    }

    void *workspace = NULL;
    if (g_async) {
        int rc = cudaMalloc(&workspace, 7 * MiB);
        emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)workspace, 7 * MiB, NULL, rc);
        EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
    }
    void *a = tensor(11 * MiB);
    void *b = tensor(3 * MiB);
    void *c = tensor(512000);
    release(a);
    void *d = tensor(18 * MiB);
    release(b);
    release(c);
    release(d);
    if (g_async) {
        cudaMemPool_t pool = NULL;
        EXPECT_RC(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess,
                  "cudaDeviceGetDefaultMemPool");
        int rc = cudaMemPoolTrimTo(pool, 0);
        out("pool_trim cudaMemPoolTrimTo dev=0 pool=0x%llx size=0 rc=%d",
            (unsigned long long)(uintptr_t)pool, rc);
        EXPECT_RC(rc, cudaSuccess, "cudaMemPoolTrimTo");
    }
    void *e = tensor(8 * MiB);
    release(e);
    if (g_async) {
        int rc = cudaFree(workspace);
        emit("free", "cudaFree", 0, "addr", (uintptr_t)workspace, 0, NULL, rc);
        EXPECT_RC(rc, cudaSuccess, "cudaFree");
    }
    out("done report_alloc_tensors");
    return 0;
}

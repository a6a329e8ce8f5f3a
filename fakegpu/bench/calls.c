/* Calls per second through the fake runtime and driver (scripts/bench-fakegpu.sh). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int cudaError_t;
typedef struct { unsigned x, y, z; } dim3;
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t size, void *stream);
cudaError_t cudaFreeAsync(void *p, void *stream);
cudaError_t cudaLaunchKernel(const void *f, dim3 grid, dim3 block, void **args, size_t shared,
                             void *stream);
cudaError_t cudaStreamSynchronize(void *stream);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaEventRecord(void *event, void *stream);
cudaError_t cudaEventCreate(void **event);

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void kernel(void) {}

#define BENCH(label, calls_per_iteration, body)                                           \
    do {                                                                                  \
        long n = iterations;                                                              \
        double start = now();                                                             \
        for (long i = 0; i < n; i++) {                                                    \
            body;                                                                         \
        }                                                                                 \
        double ns = (now() - start) * 1e9 / ((double)n * (calls_per_iteration));          \
        printf("%-34s %8.0f ns/call %12.0f calls/s %s\n", label, ns, 1e9 / ns,             \
               ns <= 1000.0 ? "within 1 us" : "OVER 1 us");                               \
    } while (0)

int main(int argc, char **argv)
{
    long iterations = argc > 1 ? atol(argv[1]) : 200000;
    void *p, *event;
    size_t free_bytes, total;
    int device;
    dim3 one = {1, 1, 1};
    cudaMalloc(&p, 1); /* initialise the runtime outside the timings */
    cudaFree(p);
    cudaEventCreate(&event);
    BENCH("cudaGetDevice", 1, cudaGetDevice(&device));
    BENCH("cudaMemGetInfo", 1, cudaMemGetInfo(&free_bytes, &total));
    BENCH("cudaLaunchKernel", 1, cudaLaunchKernel((const void *)kernel, one, one, NULL, 0, NULL));
    BENCH("cudaEventRecord", 1, cudaEventRecord(event, NULL));
    BENCH("cudaStreamSynchronize", 1, cudaStreamSynchronize(NULL));
    BENCH("cudaMalloc+cudaFree (2 MiB)", 2, (cudaMalloc(&p, 2 << 20), cudaFree(p)));
    BENCH("cudaMallocAsync+cudaFreeAsync (1 MiB)", 2,
          (cudaMallocAsync(&p, 1 << 20, NULL), cudaFreeAsync(p, NULL)));
    return 0;
}

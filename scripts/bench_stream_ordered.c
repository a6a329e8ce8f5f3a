/* The recorder's hot path for stream-ordered memory: PAIRS cudaMallocAsync + cudaFreeAsync
 * pairs of 1 MiB on a created (non-legacy) stream, on the fake runtime. With "capture", a
 * capture (relaxed mode) is in progress on another stream during the loop, so the recorder
 * must ask the driver whether each call's stream is captured. Counted by
 * scripts/bench-stream-ordered.sh under callgrind (instructions per pair). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaGraph_t;
cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);

int main(int argc, char **argv)
{
    long pairs = argc > 1 ? atol(argv[1]) : 1000;
    int capture = argc > 2 && !strcmp(argv[2], "capture");
    cudaStream_t s, other;
    if (cudaStreamCreate(&s) || cudaStreamCreate(&other))
        return 2;
    if (capture && cudaStreamBeginCapture(other, 2 /* relaxed */))
        return 3;
    int failed = 0;
    for (long i = 0; i < pairs; i++) {
        void *p = NULL;
        failed |= cudaMallocAsync(&p, 1 << 20, s);
        failed |= cudaFreeAsync(p, s);
    }
    cudaGraph_t graph;
    if (capture && cudaStreamEndCapture(other, &graph))
        return 4;
    failed |= cudaStreamSynchronize(s);
    printf("pairs %ld capture %d failed %d\n", pairs, capture, failed);
    return failed ? 1 : 0;
}

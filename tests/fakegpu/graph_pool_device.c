/* A graph whose memory lives on device 1, launched and destroyed while device 0 is current
 * (two fake devices): the driver takes the memory from device 1's graph pool, so that is the
 * pool whose level the recorder must read after the launch. One line per step, with each
 * device's reserved graph memory (MiB) as the driver reports it. Built with -DCUDA_MAJOR=13 or
 * 12 (the same calls). */
#include <stdio.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaGraph_t;
typedef void *cudaGraphExec_t;
cudaError_t cudaSetDevice(int device);
cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaDeviceGraphMemTrim(int device);
cudaError_t cudaDeviceGetGraphMemAttribute(int device, int attr, void *value);

#define MIB (1024ull * 1024)
enum { GLOBAL = 0, RESERVED_CURRENT = 2 };

static void pools(const char *step)
{
    printf("%s", step);
    for (int device = 0; device < 2; device++) {
        unsigned long long reserved = 0;
        cudaError_t rc = cudaDeviceGetGraphMemAttribute(device, RESERVED_CURRENT, &reserved);
        printf(rc ? " rc=%d" : "", rc);
        printf(" device%d=%llu", device, reserved / MIB);
    }
    printf("\n");
}

int main(void)
{
    cudaStream_t s;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    void *p = NULL;
    int set = cudaSetDevice(1);
    int stream = cudaStreamCreate(&s);
    int begin = cudaStreamBeginCapture(s, GLOBAL);
    int malloc_rc = cudaMallocAsync(&p, 4 * MIB, s);
    int free_rc = cudaFreeAsync(p, s);
    int end = cudaStreamEndCapture(s, &graph);
    int instantiate = cudaGraphInstantiate(&exec, graph, 0);
    printf("capture set=%d stream=%d begin=%d malloc=%d free=%d end=%d instantiate=%d\n", set,
           stream, begin, malloc_rc, free_rc, end, instantiate);
    /* Device 0 current; the stream and the graph's memory are device 1's. */
    int back = cudaSetDevice(0);
    int launch = cudaGraphLaunch(exec, s);
    int sync = cudaStreamSynchronize(s);
    printf("launch set=%d launch=%d sync=%d\n", back, launch, sync);
    pools("launched");
    printf("destroy exec=%d graph=%d\n", cudaGraphExecDestroy(exec), cudaGraphDestroy(graph));
    pools("destroyed");
    printf("trim %d\n", cudaDeviceGraphMemTrim(1));
    pools("trimmed");
    printf("teardown %d\n", cudaStreamDestroy(s));
    return 0;
}

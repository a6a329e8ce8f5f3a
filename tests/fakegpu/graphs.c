/* Stream capture and CUDA graphs on the fake runtime: work captured on a stream (and on a
 * second stream joined to the capture through an event) becomes graph nodes and is not done;
 * each launch of the instantiated graph does it, in order, with the host data of that moment.
 * Then the errors of the real API: capturing the legacy stream, capturing twice, ending on a
 * joined stream, synchronising during a capture (which invalidates it). One line per step.
 * Built with -DCUDA_MAJOR=13 or 12: the two differ in cudaStreamGetCaptureInfo's generations. */
#include <stdio.h>
#include <string.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef void *cudaGraph_t;
typedef void *cudaGraphExec_t;
typedef void *cudaGraphNode_t;
typedef struct { unsigned x, y, z; } dim3;
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, cudaStream_t s);
cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s);
cudaError_t cudaLaunchKernel(const void *f, dim3 grid, dim3 block, void **args, size_t shared,
                             cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, int *status);
cudaError_t cudaThreadExchangeStreamCaptureMode(int *mode);
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count);
cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, int *type);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
#if CUDA_MAJOR == 12
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, int *status, unsigned long long *id);
cudaError_t cudaStreamGetCaptureInfo_v2(cudaStream_t s, int *status, unsigned long long *id,
                                        cudaGraph_t *graph, const cudaGraphNode_t **deps,
                                        size_t *count);
#elif CUDA_MAJOR == 13
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, int *status, unsigned long long *id,
                                     cudaGraph_t *graph, const cudaGraphNode_t **deps,
                                     const void **edges, size_t *count);
#else
#error "build with -DCUDA_MAJOR=12 or 13"
#endif

enum { HOST_TO_DEVICE = 1, DEVICE_TO_HOST = 2, GLOBAL = 0, RELAXED = 2 };
#define N 4096

static void kernel(void) {}

/* The stream's capture: status, id, graph and dependency count, through each generation. */
static void info(const char *name, cudaStream_t s)
{
    int status = -1;
    unsigned long long id = 0;
    cudaGraph_t graph = NULL;
    const cudaGraphNode_t *deps = NULL;
    size_t count = 99;
#if CUDA_MAJOR == 12
    unsigned long long id_v1 = 0;
    int status_v1 = -1;
    cudaError_t rc1 = cudaStreamGetCaptureInfo(s, &status_v1, &id_v1);
    cudaError_t rc = cudaStreamGetCaptureInfo_v2(s, &status, &id, &graph, &deps, &count);
    int same = rc1 == rc && status_v1 == status && id_v1 == id;
#else
    const void *edges = (const void *)1;
    cudaError_t rc = cudaStreamGetCaptureInfo(s, &status, &id, &graph, &deps, &edges, &count);
    /* The edge data parallels the dependencies: a default (zero) edge for the one node. */
    static const unsigned char default_edge[8];
    int same = count ? edges && !memcmp(edges, default_edge, 8) : edges == NULL;
#endif
    printf("info %s rc=%d status=%d id=%s graph=%s deps=%zu%s same=%d\n", name, rc, status,
           id ? "set" : "0", graph ? "set" : "null", count,
           count && deps && *deps ? "+node" : "", same);
}

static void nodes(cudaGraph_t graph)
{
    cudaGraphNode_t list[8];
    size_t count = 0;
    cudaError_t rc = cudaGraphGetNodes(graph, NULL, &count);
    printf("nodes rc=%d count=%zu types=", rc, count);
    size_t room = 8;
    cudaGraphGetNodes(graph, list, &room);
    for (size_t i = 0; i < count && i < 8; i++) {
        int type = -1;
        cudaGraphNodeGetType(list[i], &type);
        printf("%s%d", i ? "," : "", type);
    }
    printf("\n");
}

/* "first last": the bytes of the host result at both ends of each quarter. */
static void show(const char *when, const unsigned char *h)
{
    printf("%s", when);
    for (int q = 0; q < 4; q++)
        printf(" %02x%02x", h[q * N / 4], h[(q + 1) * N / 4 - 1]);
    printf("\n");
}

/* Prints " NAME=RC" for one call: calls made in statement order (arguments of one call to
 * printf would be evaluated in no fixed order). */
#define RC(name, call) printf(" %s=%d", name, (int)(call))

int main(void)
{
    static unsigned char in[N], out[N], back[N];
    unsigned char *d = NULL;
    cudaStream_t s = NULL, side = NULL;
    cudaEvent_t fork = NULL, join = NULL;
    cudaGraph_t graph = NULL, none = (cudaGraph_t)1;
    cudaGraphExec_t exec = NULL;
    int status = -1;
    dim3 one = {1, 1, 1};
    printf("setup");
    RC("malloc", cudaMalloc((void **)&d, N));
    RC("streams", cudaStreamCreate(&s) | cudaStreamCreate(&side));
    RC("events", cudaEventCreate(&fork) | cudaEventCreate(&join));
    RC("zero", cudaMemcpy(d, memset(back, 0, N), N, HOST_TO_DEVICE));
    memset(in, 0xa1, N);
    memset(out, 0xee, N);
    printf("\nlegacy=%d", cudaStreamBeginCapture(NULL, GLOBAL));
    cudaStreamIsCapturing(s, &status);
    printf("\nbegin before=%d", status);
    RC("rc", cudaStreamBeginCapture(s, GLOBAL));
    RC("again", cudaStreamBeginCapture(s, GLOBAL));
    cudaStreamIsCapturing(s, &status);
    printf(" after=%d\n", status);
    info("empty", s);
    /* Fill the first half with 0x55, copy the input over the first quarter; fork a second
     * stream that fills the third quarter with 0x77; join it back; a kernel; copy all out. */
    printf("capture");
    RC("memset", cudaMemsetAsync(d, 0x55, N / 2, s));
    RC("copy", cudaMemcpyAsync(d, in, N / 4, HOST_TO_DEVICE, s));
    RC("record", cudaEventRecord(fork, s));
    printf("\n");
    info("captured", s);
    cudaStreamIsCapturing(side, &status);
    printf("fork before=%d", status);
    RC("wait", cudaStreamWaitEvent(side, fork, 0));
    cudaStreamIsCapturing(side, &status);
    printf(" after=%d", status);
    RC("memset", cudaMemsetAsync(d + N / 2, 0x77, N / 4, side));
    RC("record", cudaEventRecord(join, side));
    RC("end-on-side", cudaStreamEndCapture(side, &graph));
    RC("join", cudaStreamWaitEvent(s, join, 0));
    RC("kernel", cudaLaunchKernel((const void *)kernel, one, one, NULL, 0, s));
    RC("copy", cudaMemcpyAsync(out, d, N, DEVICE_TO_HOST, s));
    printf("\n");
    show("during", out);
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    printf("used %zu MiB + %zu\n", (total_bytes - free_bytes) >> 20,
           (total_bytes - free_bytes) & ((1 << 20) - 1));
    printf("end");
    RC("rc", cudaStreamEndCapture(s, &graph));
    printf(" graph=%s", graph ? "set" : "null");
    cudaStreamIsCapturing(s, &status);
    printf(" origin=%d", status);
    cudaStreamIsCapturing(side, &status);
    printf(" side=%d", status);
    RC("again", cudaStreamEndCapture(s, &none));
    memset(back, 0xee, N);
    printf("\ndevice=%d", cudaMemcpy(back, d, N, DEVICE_TO_HOST));
    printf("\n");
    show("device", back);
    nodes(graph);

    printf("launch");
    RC("instantiate", cudaGraphInstantiate(&exec, graph, 0));
    RC("launch", cudaGraphLaunch(exec, s));
    RC("sync", cudaStreamSynchronize(s));
    printf("\n");
    show("first", out);
    memset(in, 0xb2, N);
    printf("launch");
    RC("launch", cudaGraphLaunch(exec, s));
    RC("sync", cudaStreamSynchronize(s));
    printf("\n");
    show("second", out);
    printf("destroy");
    RC("exec", cudaGraphExecDestroy(exec));
    RC("graph", cudaGraphDestroy(graph));

    /* Synchronising the capturing stream, or the device during a global capture, fails and
     * invalidates the capture; a relaxed capture, or a thread in relaxed mode, may. */
    graph = none;
    printf("\nsync-stream");
    RC("begin", cudaStreamBeginCapture(s, GLOBAL));
    RC("sync", cudaStreamSynchronize(s));
    cudaStreamIsCapturing(s, &status);
    printf(" status=%d", status);
    RC("copy", cudaMemcpyAsync(out, d, N, DEVICE_TO_HOST, s));
    RC("end", cudaStreamEndCapture(s, &graph));
    printf(" graph=%s\n", graph ? "set" : "null");
    graph = none;
    printf("sync-device");
    RC("begin", cudaStreamBeginCapture(s, GLOBAL));
    RC("sync", cudaDeviceSynchronize());
    RC("end", cudaStreamEndCapture(s, &graph));
    printf(" graph=%s\n", graph ? "set" : "null");
    int mode = RELAXED;
    printf("relaxed-thread");
    RC("begin", cudaStreamBeginCapture(s, GLOBAL));
    RC("exchange", cudaThreadExchangeStreamCaptureMode(&mode));
    printf(" old=%d", mode);
    RC("sync", cudaDeviceSynchronize());
    RC("restore", cudaThreadExchangeStreamCaptureMode(&mode));
    RC("end", cudaStreamEndCapture(s, &graph));
    printf("\n");
    nodes(graph);
    printf("relaxed-capture");
    RC("destroy", cudaGraphDestroy(graph));
    RC("begin", cudaStreamBeginCapture(s, RELAXED));
    RC("sync", cudaDeviceSynchronize());
    RC("end", cudaStreamEndCapture(s, &graph));
    RC("destroy", cudaGraphDestroy(graph));
    /* Ending a capture while a joined stream has work no wait joined back: 904, no graph, and
     * neither stream captures any more. Work joined back, or a joined stream with none, ends
     * well. */
    graph = none;
    printf("\nunjoined");
    RC("begin", cudaStreamBeginCapture(s, GLOBAL));
    RC("record", cudaEventRecord(fork, s));
    RC("wait", cudaStreamWaitEvent(side, fork, 0));
    RC("memset", cudaMemsetAsync(d, 0x11, N, side));
    RC("end", cudaStreamEndCapture(s, &graph));
    printf(" graph=%s", graph ? "set" : "null");
    cudaStreamIsCapturing(s, &status);
    printf(" origin=%d", status);
    cudaStreamIsCapturing(side, &status);
    printf(" side=%d", status);
    graph = none;
    printf("\nwork-after-join");
    RC("begin", cudaStreamBeginCapture(s, GLOBAL));
    RC("record", cudaEventRecord(fork, s));
    RC("wait", cudaStreamWaitEvent(side, fork, 0));
    RC("memset", cudaMemsetAsync(d, 0x11, N, side));
    RC("record", cudaEventRecord(join, side));
    RC("join", cudaStreamWaitEvent(s, join, 0));
    RC("memset", cudaMemsetAsync(d, 0x22, N, side));
    RC("end", cudaStreamEndCapture(s, &graph));
    printf(" graph=%s", graph ? "set" : "null");
    graph = none;
    printf("\njoined");
    RC("begin", cudaStreamBeginCapture(s, GLOBAL));
    RC("record", cudaEventRecord(fork, s));
    RC("wait", cudaStreamWaitEvent(side, fork, 0));
    RC("memset", cudaMemsetAsync(d, 0x11, N, side));
    RC("record", cudaEventRecord(join, side));
    RC("join", cudaStreamWaitEvent(s, join, 0));
    RC("end", cudaStreamEndCapture(s, &graph));
    printf(" graph=%s", graph ? "set" : "null");
    RC("destroy", cudaGraphDestroy(graph));
    graph = none;
    printf("\nidle-fork");
    RC("begin", cudaStreamBeginCapture(s, GLOBAL));
    RC("record", cudaEventRecord(fork, s));
    RC("wait", cudaStreamWaitEvent(side, fork, 0));
    RC("end", cudaStreamEndCapture(s, &graph));
    printf(" graph=%s", graph ? "set" : "null");
    RC("destroy", cudaGraphDestroy(graph));
    memset(back, 0xee, N);
    RC("device", cudaMemcpy(back, d, N, DEVICE_TO_HOST));
    printf("\n");
    show("untouched", back);
    printf("teardown");
    RC("events", cudaEventDestroy(fork) | cudaEventDestroy(join));
    RC("streams", cudaStreamDestroy(side) | cudaStreamDestroy(s));
    RC("free", cudaFree(d));
    printf("\n");
    return 0;
}

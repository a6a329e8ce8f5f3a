/* Every entry point that begins a stream capture, each in turn, on the fake runtime: inside
 * each capture a cudaMallocAsync (+ free) of a size of its own (i MiB + i for entry i), which
 * is a graph node; after its end, one of 1 MiB, which is memory. Runtime entries are linked,
 * driver entries come from dlsym on libcuda (one through cuGetProcAddress_v2); `_ptsz`
 * entries capture the thread's default stream (stream 0) and allocate with the `_ptsz`
 * allocation calls on stream 0. Then a begin that fails, an invalidated capture, an end of a
 * stream not capturing; and across threads: a capture begun on the main thread (relaxed mode)
 * that a second thread's stream joins through an event: that thread's allocation on the joined
 * stream is a node (5 MiB), its allocation on a stream of its own is memory (7 MiB). One line
 * per step. Built with -DCUDA_MAJOR=13 or 12. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaGraph_t;
cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaMallocAsync_ptsz(void **p, size_t size, cudaStream_t s);
cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGraphCreate(cudaGraph_t *graph, unsigned flags);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode);
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s, int mode);
cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t s, cudaGraph_t graph, const void *deps,
                                          const void *edges, size_t count, int mode);
cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t s, cudaGraph_t graph,
                                               const void *deps, const void *edges,
                                               size_t count, int mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, cudaGraph_t *graph);
typedef void *cudaEvent_t;
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);

#define MIB (1024ull * 1024)
enum { GLOBAL = 0, RELAXED = 2 };

typedef int (*begin1_t)(cudaStream_t);
typedef int (*begin2_t)(cudaStream_t, int);
typedef int (*to_graph_t)(cudaStream_t, cudaGraph_t, const void *, const void *, size_t, int);
typedef int (*end_t)(cudaStream_t, cudaGraph_t *);

static void *libcuda;
static cudaStream_t s;

static void *driver(const char *name)
{
    void *f = dlsym(libcuda, name);
    if (!f)
        printf("missing %s\n", name);
    return f;
}

/* Inside the capture begun as entry I (`begin` its result): a node of I MiB + I bytes; the end
 * (`end_rt` or the driver's `end_drv`); then 1 MiB of memory on the same stream. */
static void body(int i, const char *name, int begin, int per_thread, end_t end_drv)
{
    cudaStream_t stream = per_thread ? NULL : s;
    void *p = NULL, *q = NULL;
    size_t size = i * MIB + i;
    int alloc = per_thread ? cudaMallocAsync_ptsz(&p, size, stream)
                           : cudaMallocAsync(&p, size, stream);
    int release = per_thread ? cudaFreeAsync_ptsz(p, stream) : cudaFreeAsync(p, stream);
    cudaGraph_t graph = NULL;
    int end = end_drv ? end_drv(stream, &graph)
                      : per_thread ? cudaStreamEndCapture_ptsz(stream, &graph)
                                   : cudaStreamEndCapture(stream, &graph);
    int after = per_thread ? cudaMallocAsync_ptsz(&q, MIB, stream) : cudaMallocAsync(&q, MIB, stream);
    after |= per_thread ? cudaFreeAsync_ptsz(q, stream) : cudaFreeAsync(q, stream);
    after |= cudaStreamSynchronize(stream);
    printf("%d %s begin=%d alloc=%d free=%d end=%d graph=%s after=%d destroy=%d\n", i, name, begin,
           alloc, release, end, graph ? "set" : "null", after, graph ? cudaGraphDestroy(graph) : -1);
}

/* The second thread: joins the capture on `joined`, allocates there and on `own`, joins back. */
static cudaStream_t joined, own;
static cudaEvent_t forked, back;
static int thread_rc[6];
static void *second_thread(void *unused)
{
    (void)unused;
    void *node = NULL, *memory = NULL;
    thread_rc[0] = cudaStreamWaitEvent(joined, forked, 0);
    thread_rc[1] = cudaMallocAsync(&node, 5 * MIB, joined);
    thread_rc[2] = cudaFreeAsync(node, joined);
    thread_rc[3] = cudaMallocAsync(&memory, 7 * MIB, own);
    thread_rc[3] |= cudaFreeAsync(memory, own) | cudaStreamSynchronize(own);
    thread_rc[4] = cudaEventRecord(back, joined);
    return NULL;
}

int main(void)
{
    libcuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!libcuda || cudaStreamCreate(&s)) {
        printf("setup failed\n");
        return 1;
    }
    end_t end = (end_t)driver("cuStreamEndCapture");
    end_t end_ptsz = (end_t)driver("cuStreamEndCapture_ptsz");
    cudaGraph_t into;
    int i = 0;

    /* The runtime's entries. */
    body(++i, "cudaStreamBeginCapture", cudaStreamBeginCapture(s, GLOBAL), 0, NULL);
    body(++i, "cudaStreamBeginCapture_ptsz", cudaStreamBeginCapture_ptsz(NULL, GLOBAL), 1, NULL);
    cudaGraphCreate(&into, 0);
    body(++i, "cudaStreamBeginCaptureToGraph",
         cudaStreamBeginCaptureToGraph(s, into, NULL, NULL, 0, RELAXED), 0, NULL);
    cudaGraphCreate(&into, 0);
    body(++i, "cudaStreamBeginCaptureToGraph_ptsz",
         cudaStreamBeginCaptureToGraph_ptsz(NULL, into, NULL, NULL, 0, RELAXED), 1, NULL);

    /* The driver's, as a program finds them in libcuda. */
    body(++i, "cuStreamBeginCapture", ((begin1_t)driver("cuStreamBeginCapture"))(s), 0, end);
    body(++i, "cuStreamBeginCapture_ptsz", ((begin1_t)driver("cuStreamBeginCapture_ptsz"))(NULL),
         1, end_ptsz);
    body(++i, "cuStreamBeginCapture_v2", ((begin2_t)driver("cuStreamBeginCapture_v2"))(s, GLOBAL),
         0, end);
    body(++i, "cuStreamBeginCapture_v2_ptsz",
         ((begin2_t)driver("cuStreamBeginCapture_v2_ptsz"))(NULL, GLOBAL), 1, end_ptsz);
    cudaGraphCreate(&into, 0);
    body(++i, "cuStreamBeginCaptureToGraph",
         ((to_graph_t)driver("cuStreamBeginCaptureToGraph"))(s, into, NULL, NULL, 0, GLOBAL), 0,
         end);
    cudaGraphCreate(&into, 0);
    body(++i, "cuStreamBeginCaptureToGraph_ptsz",
         ((to_graph_t)driver("cuStreamBeginCaptureToGraph_ptsz"))(NULL, into, NULL, NULL, 0,
                                                                 GLOBAL),
         1, end_ptsz);

    /* Through the driver's resolver (what cudart and PyTorch do). */
    int (*get_proc)(const char *, void **, int, unsigned long long, int *) =
        (int (*)(const char *, void **, int, unsigned long long, int *))driver(
            "cuGetProcAddress_v2");
    void *resolved = NULL;
    int found = 0;
    int rc = get_proc("cuStreamBeginCapture", &resolved, 12000, 0, &found);
    printf("resolver rc=%d found=%d\n", rc, found);
    body(++i, "cuGetProcAddress_v2(cuStreamBeginCapture)",
         resolved ? ((begin2_t)resolved)(s, GLOBAL) : -1, 0, end);

    /* A begin that fails (the legacy stream): nothing in progress after it. */
    printf("legacy begin=%d\n", cudaStreamBeginCapture(NULL, GLOBAL));
    /* An invalidated capture (a legacy-stream call during a global capture): its end fails and
     * ends it all the same. */
    cudaGraph_t graph = NULL;
    int begin = cudaStreamBeginCapture(s, GLOBAL);
    int forbidden = cudaStreamSynchronize(NULL);
    int ended = cudaStreamEndCapture(s, &graph);
    printf("invalidated begin=%d sync=%d end=%d graph=%s\n", begin, forbidden, ended,
           graph ? "set" : "null");
    /* An end with no capture. */
    printf("not-capturing end=%d\n", cudaStreamEndCapture(s, &graph));
    void *p = NULL;
    int last = cudaMallocAsync(&p, 3 * MIB, s);
    printf("last alloc=%d free=%d\n", last, cudaFreeAsync(p, s));

    /* Across threads. */
    pthread_t thread;
    int setup = cudaStreamCreate(&joined) | cudaStreamCreate(&own) | cudaEventCreate(&forked) |
                cudaEventCreate(&back);
    begin = cudaStreamBeginCapture(s, RELAXED);
    int record = cudaEventRecord(forked, s);
    int started = pthread_create(&thread, NULL, second_thread, NULL);
    pthread_join(thread, NULL);
    int rejoin = cudaStreamWaitEvent(s, back, 0);
    graph = NULL;
    ended = cudaStreamEndCapture(s, &graph);
    printf("threads setup=%d begin=%d record=%d thread=%d wait=%d node=%d,%d memory=%d "
           "record=%d rejoin=%d end=%d graph=%s\n",
           setup, begin, record, started, thread_rc[0], thread_rc[1], thread_rc[2], thread_rc[3],
           thread_rc[4], rejoin, ended, graph ? "set" : "null");
    return 0;
}

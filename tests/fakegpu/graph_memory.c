/* Graph memory nodes on the fake runtime: cudaMallocAsync / cudaFreeAsync on a capturing stream
 * become mem-alloc / mem-free nodes (the address fixed at capture, nothing allocated then); a
 * launch takes the memory from the device's graph pool, which keeps it after the free node for
 * later launches until cudaDeviceGraphMemTrim; cudaMemGetInfo and the graph memory attributes
 * follow exactly. Then a graph whose allocation outlives it: relaunching fails until the memory
 * is freed, unless instantiated with auto-free-on-launch; explicit alloc/free nodes; out of
 * memory at launch; a graph with memory nodes is neither cloned nor a child, and a child
 * graph takes no memory node. One line per step. Built with -DCUDA_MAJOR=13 or 12 (the same calls). */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaGraph_t;
typedef void *cudaGraphExec_t;
typedef void *cudaGraphNode_t;
typedef struct {
    int allocType, handleTypes;
    struct { int type, id; } location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} cudaMemPoolProps;
typedef struct {
    cudaMemPoolProps poolProps;
    const void *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    void *dptr;
} cudaMemAllocNodeParams;
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, cudaStream_t s);
cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s);
cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaGraphCreate(cudaGraph_t *graph, unsigned flags);
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count);
cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, int *type);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphClone(cudaGraph_t *clone, cudaGraph_t original);
cudaError_t cudaGraphAddChildGraphNode(cudaGraphNode_t *node, cudaGraph_t graph,
                                       const cudaGraphNode_t *deps, size_t count,
                                       cudaGraph_t child);
cudaError_t cudaGraphChildGraphNodeGetGraph(cudaGraphNode_t node, cudaGraph_t *graph);
cudaError_t cudaGraphAddMemAllocNode(cudaGraphNode_t *node, cudaGraph_t graph,
                                     const cudaGraphNode_t *deps, size_t count,
                                     cudaMemAllocNodeParams *params);
cudaError_t cudaGraphAddMemFreeNode(cudaGraphNode_t *node, cudaGraph_t graph,
                                    const cudaGraphNode_t *deps, size_t count, void *dptr);
cudaError_t cudaGraphMemAllocNodeGetParams(cudaGraphNode_t node, cudaMemAllocNodeParams *out);
cudaError_t cudaGraphMemFreeNodeGetParams(cudaGraphNode_t node, void *dptr_out);
cudaError_t cudaDeviceGraphMemTrim(int device);
cudaError_t cudaDeviceGetGraphMemAttribute(int device, int attr, void *value);
cudaError_t cudaDeviceSetGraphMemAttribute(int device, int attr, void *value);

enum { DEVICE_TO_HOST = 2, GLOBAL = 0, AUTO_FREE = 1 };
#define MIB (1024ull * 1024)
#define N 4096

static size_t free0;
static void *nvml_device;
static int (*nvml_memory)(void *device, unsigned long long out[3]); /* total, free, used */

/* The device's free memory (MiB below the start; NVML's free: "nvml" when it is the same) and
 * the graph pool's four figures, in MiB. */
static void pool(const char *name)
{
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    unsigned long long nvml[3] = {0, 0, 0};
    int nvml_rc = nvml_memory(nvml_device, nvml);
    unsigned long long v[4];
    printf("%s taken=%llu%s", name, (unsigned long long)((free0 - free_bytes) / MIB),
           !nvml_rc && nvml[1] == free_bytes ? " nvml" : " nvml-differs");
    for (int a = 0; a < 4; a++) {
        v[a] = 99;
        cudaError_t rc = cudaDeviceGetGraphMemAttribute(0, a, &v[a]);
        printf(rc ? " rc=%d" : "", rc);
        printf(" %s=%llu", (const char *[]){"used", "used-high", "reserved", "reserved-high"}[a],
               v[a] / MIB);
    }
    printf("\n");
}

static void types(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count)
{
    *count = 8;
    cudaError_t rc = cudaGraphGetNodes(graph, nodes, count);
    printf("nodes rc=%d count=%zu types=", rc, *count);
    for (size_t i = 0; i < *count; i++) {
        int type = -1;
        cudaGraphNodeGetType(nodes[i], &type);
        printf(i ? ",%d" : "%d", type);
    }
    printf("\n");
}

int main(void)
{
    cudaStream_t s;
    unsigned char host[N];
    size_t total;
    cudaError_t setup = cudaStreamCreate(&s);
    setup |= cudaMemGetInfo(&free0, &total);
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    int (*init)(void) = nvml ? (int (*)(void))dlsym(nvml, "nvmlInit_v2") : NULL;
    int (*by_index)(unsigned, void **) =
        nvml ? (int (*)(unsigned, void **))dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2") : NULL;
    nvml_memory = nvml ? (int (*)(void *, unsigned long long *))dlsym(nvml, "nvmlDeviceGetMemoryInfo")
                       : NULL;
    if (!init || !by_index || !nvml_memory || init() || by_index(0, &nvml_device)) {
        printf("no NVML\n");
        return 1;
    }
    printf("setup %d\n", setup);
    pool("start");

    /* 1. Captured: allocate 3 MiB, fill, copy out, free. */
    cudaGraph_t graph;
    void *p = NULL;
    int begin = cudaStreamBeginCapture(s, GLOBAL);
    int malloc_rc = cudaMallocAsync(&p, 3 * MIB, s);
    pool("captured");
    int memset_rc = cudaMemsetAsync(p, 0xab, N, s);
    int copy_rc = cudaMemcpyAsync(host, p, N, DEVICE_TO_HOST, s);
    int free_rc = cudaFreeAsync(p, s);
    int end = cudaStreamEndCapture(s, &graph);
    printf("capture begin=%d malloc=%d address=%s memset=%d copy=%d free=%d end=%d\n", begin,
           malloc_rc, p ? "set" : "null", memset_rc, copy_rc, free_rc, end);
    cudaGraphNode_t nodes[8];
    size_t count;
    types(graph, nodes, &count);
    cudaMemAllocNodeParams params;
    memset(&params, 0x55, sizeof params);
    void *freed = NULL;
    int get_alloc = cudaGraphMemAllocNodeGetParams(nodes[0], &params);
    int get_free = cudaGraphMemFreeNodeGetParams(nodes[3], &freed);
    int wrong = cudaGraphMemFreeNodeGetParams(nodes[0], &freed);
    printf("params alloc=%d bytes=%zu same=%d device=%d/%d free=%d same=%d wrong=%d\n", get_alloc,
           params.bytesize, params.dptr == p, params.poolProps.location.type,
           params.poolProps.location.id, get_free, freed == p, wrong);

    cudaGraphExec_t exec;
    int inst = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphExec_t second;
    int inst2 = cudaGraphInstantiate(&second, graph, 0);
    memset(host, 0, N);
    int launch = cudaGraphLaunch(exec, s);
    printf("launch instantiate=%d again=%d launch=%d data=%02x%02x sync=%d\n", inst, inst2, launch,
           host[0], host[N - 1], cudaStreamSynchronize(s));
    pool("launched");
    memset(host, 0, N);
    launch = cudaGraphLaunch(exec, s);
    printf("relaunch launch=%d data=%02x%02x\n", launch, host[0], host[N - 1]);
    pool("relaunched");
    unsigned long long zero = 0, one = 1;
    int reset = cudaDeviceSetGraphMemAttribute(0, 1, &zero);
    int bad_reset = cudaDeviceSetGraphMemAttribute(0, 2, &zero);
    int bad_value = cudaDeviceSetGraphMemAttribute(0, 3, &one);
    printf("reset used-high=%d reserved=%d nonzero=%d\n", reset, bad_reset, bad_value);
    pool("reset");
    printf("trim %d\n", cudaDeviceGraphMemTrim(0));
    pool("trimmed");
    int upload = cudaGraphUpload(exec, s);
    printf("upload %d\n", upload);
    pool("uploaded");
    printf("destroy exec=%d graph=%d trim=%d\n", cudaGraphExecDestroy(exec),
           cudaGraphDestroy(graph), cudaDeviceGraphMemTrim(0));
    pool("destroyed");

    /* 2. An allocation the graph does not free: it outlives the launch. */
    void *q = NULL;
    begin = cudaStreamBeginCapture(s, GLOBAL);
    malloc_rc = cudaMallocAsync(&q, 5 * MIB + 1, s);
    memset_rc = cudaMemsetAsync(q, 0x5a, N, s);
    end = cudaStreamEndCapture(s, &graph);
    printf("unfreed begin=%d malloc=%d memset=%d end=%d\n", begin, malloc_rc, memset_rc, end);
    types(graph, nodes, &count);
    inst = cudaGraphInstantiate(&exec, graph, 0);
    int first = cudaGraphLaunch(exec, s);
    memset(host, 0, N);
    int read = cudaMemcpy(host, q, N, DEVICE_TO_HOST);
    int again = cudaGraphLaunch(exec, s);
    printf("live instantiate=%d first=%d read=%d data=%02x again=%d\n", inst, first, read,
           host[0], again);
    pool("live");
    int free_outside = cudaFree(q);
    int twice = cudaFree(q);
    pool("freed-outside");
    int after = cudaGraphLaunch(exec, s);
    printf("freed free=%d twice=%d launch=%d\n", free_outside, twice, after);
    pool("freed");
    int destroy_exec = cudaGraphExecDestroy(exec);
    inst = cudaGraphInstantiate(&exec, graph, AUTO_FREE);
    int launches = 0;
    for (int i = 0; i < 3; i++)
        launches |= cudaGraphLaunch(exec, s);
    printf("auto-free destroy=%d instantiate=%d launches=%d\n", destroy_exec, inst, launches);
    pool("auto-free");
    printf("stream-free %d\n", cudaFreeAsync(q, s));
    pool("stream-freed");
    printf("destroy exec=%d graph=%d trim=%d\n", cudaGraphExecDestroy(exec),
           cudaGraphDestroy(graph), cudaDeviceGraphMemTrim(0));

    /* 3. Nodes added by hand; an allocation larger than the device's free memory. */
    cudaGraphCreate(&graph, 0);
    cudaGraphNode_t alloc_node, free_node;
    cudaMemAllocNodeParams big;
    memset(&big, 0, sizeof big);
    big.poolProps.allocType = 1;
    big.poolProps.location.type = 1;
    big.poolProps.location.id = 0;
    big.bytesize = 2 * MIB;
    int add = cudaGraphAddMemAllocNode(&alloc_node, graph, NULL, 0, &big);
    int add_free = cudaGraphAddMemFreeNode(&free_node, graph, &alloc_node, 1, big.dptr);
    int add_bad = cudaGraphAddMemFreeNode(&free_node, graph, NULL, 0, host);
    printf("explicit alloc=%d address=%s free=%d not-graph=%d\n", add, big.dptr ? "set" : "null",
           add_free, add_bad);
    types(graph, nodes, &count);
    inst = cudaGraphInstantiate(&exec, graph, 0);
    launch = cudaGraphLaunch(exec, s);
    printf("explicit instantiate=%d launch=%d\n", inst, launch);
    pool("explicit");
    /* The documented limits of graphs with memory nodes (cudaErrorInvalidValue each). */
    cudaGraph_t copy = NULL, parent, inner, embedded;
    cudaGraphNode_t child_node, inner_alloc;
    cudaGraphCreate(&parent, 0);
    cudaGraphCreate(&inner, 0);
    int clone = cudaGraphClone(&copy, graph);
    int child = cudaGraphAddChildGraphNode(&child_node, parent, NULL, 0, graph);
    int empty_child = cudaGraphAddChildGraphNode(&child_node, parent, NULL, 0, inner);
    cudaGraphChildGraphNodeGetGraph(child_node, &embedded);
    cudaMemAllocNodeParams small = big;
    small.dptr = NULL;
    int inner_add = cudaGraphAddMemAllocNode(&inner_alloc, embedded, NULL, 0, &small);
    printf("limits clone=%d copy=%s child=%d empty-child=%d alloc-in-child=%d address=%s "
           "destroy=%d\n",
           clone, copy ? "set" : "null", child, empty_child, inner_add,
           small.dptr ? "set" : "null", cudaGraphDestroy(parent) | cudaGraphDestroy(inner));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);

    size_t free_now;
    cudaMemGetInfo(&free_now, &total);
    cudaGraphCreate(&graph, 0);
    big.bytesize = free_now + 4 * MIB; /* more than the free memory and the pool's 2 MiB */
    add = cudaGraphAddMemAllocNode(&alloc_node, graph, NULL, 0, &big);
    inst = cudaGraphInstantiate(&exec, graph, 0);
    launch = cudaGraphLaunch(exec, s);
    printf("too-big add=%d instantiate=%d launch=%d\n", add, inst, launch);
    pool("too-big");
    printf("teardown exec=%d graph=%d trim=%d stream=%d\n", cudaGraphExecDestroy(exec),
           cudaGraphDestroy(graph), cudaDeviceGraphMemTrim(0), cudaStreamDestroy(s));
    pool("end");
    return 0;
}

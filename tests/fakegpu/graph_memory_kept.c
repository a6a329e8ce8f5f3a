/* Graph memory the recorder must place right, on the fake runtime: a captured allocation the
 * graph does not free, freed outside it after the launch (cudaFreeAsync); memory nodes added by
 * hand, by the runtime (6 MiB, freed by a free node) and by the driver (3 MiB, freed outside
 * after each launch: cudaFreeAsync, then cudaFree); a 2 MiB pair added with the generic
 * cudaGraphAddNode / cuGraphAddNode (and a kernel node type it refuses); then every exec and
 * graph destroyed with no
 * trim, so the device's graph pool keeps its 6 MiB to the end. One line per step: the device
 * memory taken since the start and the pool's used and reserved bytes, in MiB. Built with
 * -DCUDA_MAJOR=13 or 12. */
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
typedef struct {
    int type;
    int reserved0[3];
    union {
        long long reserved1[29];
        cudaMemAllocNodeParams alloc;
        void *free_dptr;
    };
    long long reserved2;
} cudaGraphNodeParams;
#if CUDA_MAJOR == 12
cudaError_t cudaGraphAddNode(cudaGraphNode_t *node, cudaGraph_t graph,
                             const cudaGraphNode_t *deps, size_t count,
                             cudaGraphNodeParams *params);
#define ADD_NODE(node, graph, params) cudaGraphAddNode(node, graph, NULL, 0, params)
#else
cudaError_t cudaGraphAddNode(cudaGraphNode_t *node, cudaGraph_t graph,
                             const cudaGraphNode_t *deps, const void *edges, size_t count,
                             cudaGraphNodeParams *params);
#define ADD_NODE(node, graph, params) cudaGraphAddNode(node, graph, NULL, NULL, 0, params)
#endif
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaGraphCreate(cudaGraph_t *graph, unsigned flags);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphAddMemAllocNode(cudaGraphNode_t *node, cudaGraph_t graph,
                                     const cudaGraphNode_t *deps, size_t count,
                                     cudaMemAllocNodeParams *params);
cudaError_t cudaGraphAddMemFreeNode(cudaGraphNode_t *node, cudaGraph_t graph,
                                    const cudaGraphNode_t *deps, size_t count, void *dptr);
cudaError_t cudaDeviceGetGraphMemAttribute(int device, int attr, void *value);

#define MIB (1024ull * 1024)

static size_t free0;

static void pool(const char *name)
{
    size_t free_bytes = 0, total = 0;
    unsigned long long used = 99, reserved = 99;
    cudaMemGetInfo(&free_bytes, &total);
    cudaDeviceGetGraphMemAttribute(0, 0, &used);
    cudaDeviceGetGraphMemAttribute(0, 2, &reserved);
    printf("%s taken=%llu used=%llu reserved=%llu\n", name,
           (unsigned long long)((free0 - free_bytes) / MIB), used / MIB, reserved / MIB);
}

static cudaMemAllocNodeParams on_device(size_t bytes)
{
    cudaMemAllocNodeParams params;
    memset(&params, 0, sizeof params);
    params.poolProps.allocType = 1;   /* pinned */
    params.poolProps.location.type = 1; /* device */
    params.poolProps.location.id = 0;
    params.bytesize = bytes;
    return params;
}

int main(void)
{
    cudaStream_t s;
    size_t total;
    void *libcuda = dlopen("libcuda.so.1", RTLD_NOW);
    int (*cu_add_alloc)(cudaGraphNode_t *, cudaGraph_t, const cudaGraphNode_t *, size_t,
                        cudaMemAllocNodeParams *) =
        libcuda ? (int (*)(cudaGraphNode_t *, cudaGraph_t, const cudaGraphNode_t *, size_t,
                           cudaMemAllocNodeParams *))dlsym(libcuda, "cuGraphAddMemAllocNode")
                : NULL;
    int (*cu_add_node)(cudaGraphNode_t *, cudaGraph_t, const cudaGraphNode_t *, size_t,
                       cudaGraphNodeParams *) =
        libcuda ? (int (*)(cudaGraphNode_t *, cudaGraph_t, const cudaGraphNode_t *, size_t,
                           cudaGraphNodeParams *))dlsym(libcuda, "cuGraphAddNode")
                : NULL;
    if (!cu_add_alloc || !cu_add_node || cudaStreamCreate(&s) || cudaMemGetInfo(&free0, &total)) {
        printf("setup failed\n");
        return 1;
    }
    pool("start");

    /* 1. Captured, not freed in the graph: freed outside after the launch. */
    cudaGraph_t captured;
    cudaGraphExec_t captured_exec;
    void *c = NULL;
    int begin = cudaStreamBeginCapture(s, 0);
    int alloc = cudaMallocAsync(&c, 4 * MIB, s);
    int end = cudaStreamEndCapture(s, &captured);
    int inst = cudaGraphInstantiate(&captured_exec, captured, 0);
    int launch = cudaGraphLaunch(captured_exec, s);
    printf("captured begin=%d alloc=%d end=%d instantiate=%d launch=%d\n", begin, alloc, end, inst,
           launch);
    pool("captured-launched");
    int free_outside = cudaFreeAsync(c, s);
    printf("captured free-outside=%d sync=%d\n", free_outside, cudaStreamSynchronize(s));
    pool("captured-freed");

    /* 2. The runtime's nodes: 6 MiB allocated and freed in the graph. */
    cudaGraph_t by_runtime;
    cudaGraphExec_t runtime_exec;
    cudaGraphNode_t alloc_node, free_node;
    cudaGraphCreate(&by_runtime, 0);
    cudaMemAllocNodeParams six = on_device(6 * MIB);
    int add = cudaGraphAddMemAllocNode(&alloc_node, by_runtime, NULL, 0, &six);
    int add_free = cudaGraphAddMemFreeNode(&free_node, by_runtime, &alloc_node, 1, six.dptr);
    inst = cudaGraphInstantiate(&runtime_exec, by_runtime, 0);
    launch = cudaGraphLaunch(runtime_exec, s);
    printf("runtime-nodes alloc=%d address=%s free=%d instantiate=%d launch=%d\n", add,
           six.dptr ? "set" : "null", add_free, inst, launch);
    pool("runtime-launched");

    /* 3. The driver's node: 3 MiB the graph does not free, freed outside after each launch. */
    cudaGraph_t by_driver;
    cudaGraphExec_t driver_exec;
    cudaGraphCreate(&by_driver, 0);
    cudaMemAllocNodeParams three = on_device(3 * MIB);
    add = cu_add_alloc(&alloc_node, by_driver, NULL, 0, &three);
    inst = cudaGraphInstantiate(&driver_exec, by_driver, 0);
    launch = cudaGraphLaunch(driver_exec, s);
    printf("driver-node alloc=%d address=%s instantiate=%d launch=%d\n", add,
           three.dptr ? "set" : "null", inst, launch);
    pool("driver-launched");
    int free_async = cudaFreeAsync(three.dptr, s);
    int sync = cudaStreamSynchronize(s);
    int again = cudaGraphLaunch(driver_exec, s);
    int free_sync = cudaFree(three.dptr);
    printf("driver-node free-async=%d sync=%d again=%d free=%d\n", free_async, sync, again,
           free_sync);
    pool("driver-freed");

    /* 4. The generic adder: a 2 MiB allocation node (the runtime's), its free node (the
     * driver's); a kernel node is not supported by the fakes. */
    cudaGraph_t generic;
    cudaGraphExec_t generic_exec;
    cudaGraphCreate(&generic, 0);
    cudaGraphNodeParams node_params;
    memset(&node_params, 0, sizeof node_params);
    node_params.type = 10; /* memory allocation */
    node_params.alloc = on_device(2 * MIB);
    add = ADD_NODE(&alloc_node, generic, &node_params);
    void *generic_dptr = node_params.alloc.dptr;
    memset(&node_params, 0, sizeof node_params);
    node_params.type = 11; /* memory free */
    node_params.free_dptr = generic_dptr;
    add_free = cu_add_node(&free_node, generic, &alloc_node, 1, &node_params);
    memset(&node_params, 0, sizeof node_params);
    node_params.type = 0; /* kernel */
    int other = ADD_NODE(&free_node, generic, &node_params);
    inst = cudaGraphInstantiate(&generic_exec, generic, 0);
    launch = cudaGraphLaunch(generic_exec, s);
    printf("generic alloc=%d address=%s free=%d kernel=%d instantiate=%d launch=%d\n", add,
           generic_dptr ? "set" : "null", add_free, other, inst, launch);
    pool("generic-launched");
    int destroy_exec = cudaGraphExecDestroy(generic_exec);
    printf("generic destroy exec=%d graph=%d\n", destroy_exec, cudaGraphDestroy(generic));

    /* 5. Everything destroyed, no trim: the pool keeps its memory. */
    printf("destroyed execs=%d,%d,%d graphs=%d,%d,%d\n", cudaGraphExecDestroy(captured_exec),
           cudaGraphExecDestroy(runtime_exec), cudaGraphExecDestroy(driver_exec),
           cudaGraphDestroy(captured), cudaGraphDestroy(by_runtime), cudaGraphDestroy(by_driver));
    pool("end");
    return 0;
}

/* Graphs inside graphs and edge data on the fake runtime. (1) An executable graph launched on a
 * capturing stream becomes one child graph node of the capture (nothing done then), its memory
 * nodes inside; the outer graph's launch runs them: the graph pool's figures and cudaMemGetInfo
 * follow exactly. (2) cudaGraphExecUpdate compares child graphs node by node: their node
 * count, node types, dependency counts and dependencies, with the documented result and error
 * nodes. (3) Edge data: validated as documented, read back (a lossy query without it refused),
 * cloned, compared by updates; a capture begun into a graph with dependencies and edge data,
 * cudaStreamUpdateCaptureDependencies, a wait that adds an event's node to the stream's own,
 * all seen through cudaStreamGetCaptureInfo. One line per step. Built with -DCUDA_MAJOR=13 or 12
 * (the edge data calls' names differ). */
#include <stdio.h>
#include <string.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef void *cudaGraph_t;
typedef void *cudaGraphExec_t;
typedef void *cudaGraphNode_t;
typedef struct { unsigned x, y, z; } dim3;
typedef struct {
    int result;
    cudaGraphNode_t errorNode, errorFromNode;
} cudaGraphExecUpdateResultInfo;
typedef struct {
    unsigned char from_port, to_port, type, reserved[5];
} cudaGraphEdgeData;
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, cudaStream_t s);
cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s);
cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaLaunchKernel(const void *f, dim3 grid, dim3 block, void **args, size_t shared,
                             cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode);
cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t s, cudaGraph_t graph,
                                          const cudaGraphNode_t *deps,
                                          const cudaGraphEdgeData *edges, size_t count, int mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaGraphCreate(cudaGraph_t *graph, unsigned flags);
cudaError_t cudaGraphAddEmptyNode(cudaGraphNode_t *node, cudaGraph_t graph,
                                  const cudaGraphNode_t *deps, size_t count);
cudaError_t cudaGraphAddChildGraphNode(cudaGraphNode_t *node, cudaGraph_t graph,
                                       const cudaGraphNode_t *deps, size_t count,
                                       cudaGraph_t child);
cudaError_t cudaGraphChildGraphNodeGetGraph(cudaGraphNode_t node, cudaGraph_t *graph);
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count);
cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, int *type);
cudaError_t cudaGraphClone(cudaGraph_t *clone, cudaGraph_t original);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph,
                                cudaGraphExecUpdateResultInfo *info);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaDeviceGraphMemTrim(int device);
cudaError_t cudaDeviceGetGraphMemAttribute(int device, int attr, void *value);
#if CUDA_MAJOR == 12
#define ADD_DEPS cudaGraphAddDependencies_v2
#define REMOVE_DEPS cudaGraphRemoveDependencies_v2
#define GET_EDGES cudaGraphGetEdges_v2
#define NODE_DEPS cudaGraphNodeGetDependencies_v2
#define NODE_DEPENDENTS cudaGraphNodeGetDependentNodes_v2
#define CAPTURE_INFO cudaStreamGetCaptureInfo_v3
#define UPDATE_CAPTURE_DEPS cudaStreamUpdateCaptureDependencies_v2
#else
#define ADD_DEPS cudaGraphAddDependencies
#define REMOVE_DEPS cudaGraphRemoveDependencies
#define GET_EDGES cudaGraphGetEdges
#define NODE_DEPS cudaGraphNodeGetDependencies
#define NODE_DEPENDENTS cudaGraphNodeGetDependentNodes
#define CAPTURE_INFO cudaStreamGetCaptureInfo
#define UPDATE_CAPTURE_DEPS cudaStreamUpdateCaptureDependencies
#endif
cudaError_t ADD_DEPS(cudaGraph_t g, const cudaGraphNode_t *from, const cudaGraphNode_t *to,
                     const cudaGraphEdgeData *edges, size_t count);
cudaError_t REMOVE_DEPS(cudaGraph_t g, const cudaGraphNode_t *from, const cudaGraphNode_t *to,
                        const cudaGraphEdgeData *edges, size_t count);
cudaError_t GET_EDGES(cudaGraph_t g, cudaGraphNode_t *from, cudaGraphNode_t *to,
                      cudaGraphEdgeData *edges, size_t *count);
cudaError_t NODE_DEPS(cudaGraphNode_t node, cudaGraphNode_t *deps, cudaGraphEdgeData *edges,
                      size_t *count);
cudaError_t NODE_DEPENDENTS(cudaGraphNode_t node, cudaGraphNode_t *dependents,
                            cudaGraphEdgeData *edges, size_t *count);
cudaError_t CAPTURE_INFO(cudaStream_t s, int *status, unsigned long long *id, cudaGraph_t *graph,
                         const cudaGraphNode_t **deps, const cudaGraphEdgeData **edges,
                         size_t *count);
cudaError_t UPDATE_CAPTURE_DEPS(cudaStream_t s, cudaGraphNode_t *deps,
                                const cudaGraphEdgeData *edges, size_t count, unsigned flags);

enum { DEVICE_TO_HOST = 2, GLOBAL = 0, ADD = 0, SET = 1 };
#define MIB (1024ull * 1024)
#define N 4096

/* Prints " NAME=RC" for one call: calls made in statement order. */
#define RC(name, call) printf(" %s=%d", name, (int)(call))

static size_t free0;
static void kernel(void) {}

/* The device memory taken since the start and the graph pool's used, used-high, reserved and
 * reserved-high, in MiB. */
static void pool(const char *name)
{
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    printf("%s taken=%llu", name, (unsigned long long)((free0 - free_bytes) / MIB));
    for (int a = 0; a < 4; a++) {
        unsigned long long v = 99;
        cudaDeviceGetGraphMemAttribute(0, a, &v);
        printf(" %s=%llu", (const char *[]){"used", "used-high", "reserved", "reserved-high"}[a],
               v / MIB);
    }
    printf("\n");
}

/* " types=T,T,..." of GRAPH's nodes (in order of addition), which land in NODES. */
static size_t types(cudaGraph_t graph, cudaGraphNode_t *nodes)
{
    size_t count = 8;
    cudaGraphGetNodes(graph, nodes, &count);
    printf(" types=");
    for (size_t i = 0; i < count; i++) {
        int type = -1;
        cudaGraphNodeGetType(nodes[i], &type);
        printf(i ? ",%d" : "%d", type);
    }
    return count;
}

/* The index of NODE in NODES (COUNT of them), or -1; "null" printed for NULL. */
static void name(const char *what, cudaGraphNode_t node, const cudaGraphNode_t *nodes,
                 size_t count)
{
    if (!node) {
        printf(" %s=null", what);
        return;
    }
    for (size_t i = 0; i < count; i++)
        if (nodes[i] == node) {
            printf(" %s=%zu", what, i);
            return;
        }
    printf(" %s=other", what);
}

static void edge(const char *what, const cudaGraphEdgeData *e)
{
    printf(" %s=%u/%u/%u", what, e->from_port, e->to_port, e->type);
}

/* A graph of one child graph node whose child has empty nodes with the dependencies DEPS
 * (DEPS[i]: the index node i depends on, -1 for none; COUNT nodes), and the child's nodes. */
static cudaGraph_t parent_of(const int *deps, size_t count, cudaGraphNode_t *child_nodes)
{
    cudaGraph_t child, parent, embedded;
    cudaGraphNode_t nodes[8], node;
    cudaGraphCreate(&child, 0);
    for (size_t i = 0; i < count; i++)
        cudaGraphAddEmptyNode(&nodes[i], child, deps[i] < 0 ? NULL : &nodes[deps[i]],
                              deps[i] < 0 ? 0 : 1);
    cudaGraphCreate(&parent, 0);
    cudaGraphAddChildGraphNode(&node, parent, NULL, 0, child);
    cudaGraphDestroy(child);
    cudaGraphChildGraphNodeGetGraph(node, &embedded);
    size_t n = 8;
    cudaGraphGetNodes(embedded, child_nodes, &n);
    return parent;
}

/* Updates EXEC with GRAPH: " NAME=RC result=R node=I from=I" (indices in NODES). */
static void update(const char *what, cudaGraphExec_t exec, cudaGraph_t graph,
                   const cudaGraphNode_t *nodes, size_t count)
{
    cudaGraphExecUpdateResultInfo info;
    memset(&info, 0x55, sizeof info);
    RC(what, cudaGraphExecUpdate(exec, graph, &info));
    printf(" result=%d", info.result);
    name("node", info.errorNode, nodes, count);
    name("from", info.errorFromNode, nodes, count);
}

/* The stream's capture dependencies with their edge data, then without (lossy or not). */
static void info(const char *what, cudaStream_t s, const cudaGraphNode_t *nodes, size_t count)
{
    int status = -1;
    const cudaGraphNode_t *deps = NULL;
    const cudaGraphEdgeData *edges = NULL;
    size_t n = 99;
    printf("%s", what);
    RC("info", CAPTURE_INFO(s, &status, NULL, NULL, &deps, &edges, &n));
    printf(" status=%d deps=%zu", status, n);
    for (size_t i = 0; i < n; i++) {
        name("dep", deps[i], nodes, count);
        edge("edge", &edges[i]);
    }
    RC("without-edges", CAPTURE_INFO(s, &status, NULL, NULL, &deps, NULL, &n));
    RC("edges-only", CAPTURE_INFO(s, &status, NULL, NULL, NULL, &edges, &n));
    printf("\n");
}

int main(void)
{
    static unsigned char out[N], out2[N];
    cudaStream_t s, side;
    cudaEvent_t fork, join;
    unsigned char *d;
    size_t total;
    dim3 one = {1, 1, 1};
    printf("setup");
    RC("streams", cudaStreamCreate(&s) | cudaStreamCreate(&side));
    RC("events", cudaEventCreate(&fork) | cudaEventCreate(&join));
    RC("malloc", cudaMalloc((void **)&d, N));
    RC("info", cudaMemGetInfo(&free0, &total));
    printf("\n");

    /* 1. A graph launched into a capture: inner allocates 4 MiB, fills it, copies it out and
     * frees it. */
    cudaGraph_t inner, outer;
    cudaGraphExec_t inner_exec, outer_exec;
    cudaGraphNode_t nodes[8], child_nodes[8];
    void *p = NULL;
    printf("inner");
    RC("begin", cudaStreamBeginCapture(s, GLOBAL));
    RC("malloc", cudaMallocAsync(&p, 4 * MIB, s));
    RC("memset", cudaMemsetAsync(p, 0x5a, N, s));
    RC("copy", cudaMemcpyAsync(out, p, N, DEVICE_TO_HOST, s));
    RC("free", cudaFreeAsync(p, s));
    RC("end", cudaStreamEndCapture(s, &inner));
    RC("instantiate", cudaGraphInstantiate(&inner_exec, inner, 0));
    types(inner, nodes);
    printf("\n");
    printf("outer");
    RC("begin", cudaStreamBeginCapture(s, GLOBAL));
    RC("memset", cudaMemsetAsync(d, 0x11, N, s));
    RC("launch", cudaGraphLaunch(inner_exec, s));
    RC("copy", cudaMemcpyAsync(out2, d, N, DEVICE_TO_HOST, s));
    RC("end", cudaStreamEndCapture(s, &outer));
    size_t count = types(outer, nodes);
    cudaGraph_t embedded = NULL;
    RC("child", cudaGraphChildGraphNodeGetGraph(nodes[1], &embedded));
    types(embedded, child_nodes);
    cudaGraphNode_t from[8], to[8];
    size_t edges = 4;
    RC("edges", GET_EDGES(outer, from, to, NULL, &edges));
    printf(" count=%zu", edges);
    for (size_t i = 0; i < edges; i++) {
        name("from", from[i], nodes, count);
        name("to", to[i], nodes, count);
    }
    printf(" done=%02x%02x\n", out[0], out2[0]);
    pool("captured");
    printf("outer");
    RC("instantiate", cudaGraphInstantiate(&outer_exec, outer, 0));
    RC("launch", cudaGraphLaunch(outer_exec, s));
    printf(" out=%02x out2=%02x\n", out[0], out2[N - 1]);
    pool("outer-launched");
    memset(out, 0, N);
    printf("inner");
    RC("launch", cudaGraphLaunch(inner_exec, s));
    printf(" out=%02x\n", out[N - 1]);
    pool("inner-launched");
    printf("trim %d\n", cudaDeviceGraphMemTrim(0));
    pool("trimmed");
    printf("destroy");
    RC("inner-exec", cudaGraphExecDestroy(inner_exec));
    RC("inner", cudaGraphDestroy(inner));
    memset(out, 0, N);
    RC("launch", cudaGraphLaunch(outer_exec, s));
    printf(" out=%02x\n", out[0]);
    pool("relaunched");

    /* 2. Updates of graphs with child graphs. */
    cudaGraph_t fill, other_fill, with_mem;
    cudaGraphExec_t fill_exec, fill_exec2;
    printf("fill");
    RC("begin", cudaStreamBeginCapture(s, GLOBAL));
    RC("memset", cudaMemsetAsync(d, 0x22, N, s));
    RC("copy", cudaMemcpyAsync(out, d, N, DEVICE_TO_HOST, s));
    RC("end", cudaStreamEndCapture(s, &fill));
    RC("instantiate", cudaGraphInstantiate(&fill_exec, fill, 0));
    RC("begin", cudaStreamBeginCapture(s, GLOBAL));
    RC("memset", cudaMemsetAsync(d, 0x33, N, s));
    RC("copy", cudaMemcpyAsync(out, d, N, DEVICE_TO_HOST, s));
    RC("end", cudaStreamEndCapture(s, &other_fill));
    RC("instantiate", cudaGraphInstantiate(&fill_exec2, other_fill, 0));
    printf("\n");
    cudaGraph_t via22, via33;
    printf("nested");
    RC("begin", cudaStreamBeginCapture(s, GLOBAL));
    RC("launch", cudaGraphLaunch(fill_exec, s));
    RC("end", cudaStreamEndCapture(s, &via22));
    RC("begin", cudaStreamBeginCapture(s, GLOBAL));
    RC("launch", cudaGraphLaunch(fill_exec2, s));
    RC("end", cudaStreamEndCapture(s, &via33));
    cudaGraphExec_t nested_exec;
    RC("instantiate", cudaGraphInstantiate(&nested_exec, via22, 0));
    RC("launch", cudaGraphLaunch(nested_exec, s));
    printf(" out=%02x", out[0]);
    count = types(via33, nodes);
    update("update", nested_exec, via33, nodes, count);
    memset(out, 0, N);
    RC("launch", cudaGraphLaunch(nested_exec, s));
    printf(" out=%02x\n", out[0]);
    /* A captured launch of a graph with memory nodes: not updated (6, the child's alloc node). */
    printf("with-memory");
    RC("begin", cudaStreamBeginCapture(s, GLOBAL));
    RC("malloc", cudaMallocAsync(&p, 2 * MIB, s));
    RC("free", cudaFreeAsync(p, s));
    RC("end", cudaStreamEndCapture(s, &inner));
    RC("instantiate", cudaGraphInstantiate(&inner_exec, inner, 0));
    RC("begin", cudaStreamBeginCapture(s, GLOBAL));
    RC("launch", cudaGraphLaunch(inner_exec, s));
    RC("end", cudaStreamEndCapture(s, &with_mem));
    cudaGraphGetNodes(with_mem, nodes, &(size_t){8});
    cudaGraphChildGraphNodeGetGraph(nodes[0], &embedded);
    count = 8;
    cudaGraphGetNodes(embedded, child_nodes, &count);
    update("update", nested_exec, with_mem, child_nodes, count);
    printf("\n");
    /* Child graphs of empty nodes, 2 depending on 0: the same shape updates; a child with
     * another node count, one where 2 has no dependency, one where it depends on 1 do not. */
    cudaGraphNode_t a_nodes[8], b_nodes[8];
    cudaGraph_t a = parent_of((const int[]){-1, -1, 0}, 3, a_nodes);
    cudaGraph_t same = parent_of((const int[]){-1, -1, 0}, 3, b_nodes);
    cudaGraphExec_t a_exec;
    printf("child-update");
    RC("instantiate", cudaGraphInstantiate(&a_exec, a, 0));
    update("same", a_exec, same, b_nodes, 3);
    cudaGraph_t more = parent_of((const int[]){-1, -1, 0, -1}, 4, b_nodes);
    cudaGraphNode_t more_parent[2];
    cudaGraphGetNodes(more, more_parent, &(size_t){2});
    update("count", a_exec, more, more_parent, 1);
    cudaGraph_t deps_count = parent_of((const int[]){-1, -1, -1}, 3, b_nodes);
    update("dependency-count", a_exec, deps_count, b_nodes, 3);
    cudaGraph_t other_dep = parent_of((const int[]){-1, -1, 1}, 3, b_nodes);
    update("dependency", a_exec, other_dep, b_nodes, 3);
    printf("\n");

    /* 3. Edge data between kernel nodes (captured launches) and an empty node. */
    cudaGraph_t k;
    cudaGraphNode_t kn[8], empty;
    const cudaGraphEdgeData programmatic = {1, 0, 1, {0}}, launch_order = {2, 0, 0, {0}},
                            zero = {0, 0, 0, {0}}, to_port = {0, 1, 0, {0}},
                            reserved = {0, 0, 0, {0, 0, 1}}, port_alone = {1, 0, 0, {0}},
                            type_alone = {0, 0, 1, {0}}, bad_type = {0, 0, 2, {0}};
    printf("kernels");
    RC("begin", cudaStreamBeginCapture(s, GLOBAL));
    for (int i = 0; i < 3; i++)
        RC("kernel", cudaLaunchKernel((const void *)kernel, one, one, NULL, 0, s));
    RC("end", cudaStreamEndCapture(s, &k));
    RC("empty", cudaGraphAddEmptyNode(&empty, k, NULL, 0));
    count = types(k, kn);
    printf("\n");
    printf("edge-data");
    RC("remove", REMOVE_DEPS(k, &kn[0], &kn[1], NULL, 1));
    RC("programmatic", ADD_DEPS(k, &kn[0], &kn[1], &programmatic, 1));
    RC("again-default", ADD_DEPS(k, &kn[0], &kn[1], NULL, 1));
    RC("launch-order", ADD_DEPS(k, &kn[0], &kn[2], &launch_order, 1));
    RC("to-empty", ADD_DEPS(k, &kn[0], &kn[3], &programmatic, 1));
    RC("from-empty", ADD_DEPS(k, &kn[3], &kn[2], &launch_order, 1));
    RC("to-port", ADD_DEPS(k, &kn[2], &kn[3], &to_port, 1));
    RC("reserved", ADD_DEPS(k, &kn[2], &kn[3], &reserved, 1));
    RC("port-alone", ADD_DEPS(k, &kn[1], &kn[0], &port_alone, 1));
    RC("type-alone", ADD_DEPS(k, &kn[1], &kn[0], &type_alone, 1));
    RC("bad-type", ADD_DEPS(k, &kn[1], &kn[0], &bad_type, 1));
    RC("default-to-empty", ADD_DEPS(k, &kn[2], &kn[3], &zero, 1));
    printf("\n");
    cudaGraphEdgeData data[8];
    printf("read");
    edges = 8;
    RC("count", GET_EDGES(k, NULL, NULL, NULL, &edges));
    printf(" edges=%zu", edges);
    RC("lossy", GET_EDGES(k, from, to, NULL, &edges));
    RC("data-only", GET_EDGES(k, NULL, NULL, data, &edges));
    edges = 8;
    RC("edges", GET_EDGES(k, from, to, data, &edges));
    for (size_t i = 0; i < edges; i++) {
        name("from", from[i], kn, count);
        name("to", to[i], kn, count);
        edge("data", &data[i]);
    }
    cudaGraphNode_t deps[4];
    size_t ndeps = 4;
    RC("deps-lossy", NODE_DEPS(kn[1], deps, NULL, &ndeps));
    RC("deps", NODE_DEPS(kn[1], deps, data, &ndeps));
    printf(" n=%zu", ndeps);
    name("dep", deps[0], kn, count);
    edge("data", &data[0]);
    ndeps = 4;
    RC("deps-default", NODE_DEPS(kn[3], deps, NULL, &ndeps));
    printf(" n=%zu", ndeps);
    ndeps = 0;
    RC("dependents-count", NODE_DEPENDENTS(kn[0], NULL, NULL, &ndeps));
    printf(" n=%zu", ndeps);
    ndeps = 4;
    RC("dependents-lossy", NODE_DEPENDENTS(kn[0], deps, NULL, &ndeps));
    RC("dependents", NODE_DEPENDENTS(kn[0], deps, data, &ndeps));
    printf(" n=%zu", ndeps);
    for (size_t i = 0; i < ndeps; i++) {
        name("dependent", deps[i], kn, count);
        edge("data", &data[i]);
    }
    printf("\n");
    cudaGraph_t k_clone;
    cudaGraphNode_t kc[8];
    printf("clone");
    RC("clone", cudaGraphClone(&k_clone, k));
    types(k_clone, kc);
    edges = 8;
    RC("edges", GET_EDGES(k_clone, from, to, data, &edges));
    for (size_t i = 0; i < edges; i++) {
        name("from", from[i], kc, count);
        name("to", to[i], kc, count);
        edge("data", &data[i]);
    }
    printf("\n");
    cudaGraphExec_t k_exec;
    printf("edge-update");
    RC("instantiate", cudaGraphInstantiate(&k_exec, k, 0));
    update("same", k_exec, k_clone, kc, count);
    RC("remove-default", REMOVE_DEPS(k_clone, &kc[0], &kc[1], NULL, 1));
    RC("remove", REMOVE_DEPS(k_clone, &kc[0], &kc[1], &programmatic, 1));
    RC("add-default", ADD_DEPS(k_clone, &kc[0], &kc[1], NULL, 1));
    update("default-now", k_exec, k_clone, kc, count);
    printf("\n");

    /* Captures: begun into K after kernel 0 with a programmatic edge; the next kernel depends
     * on it so; then the dependencies set and added by hand, and a wait's union. */
    printf("capture-to-graph");
    RC("begin", cudaStreamBeginCaptureToGraph(s, k, &kn[0], &programmatic, 1, GLOBAL));
    printf("\n");
    info("begun", s, kn, count);
    printf("kernel");
    RC("kernel", cudaLaunchKernel((const void *)kernel, one, one, NULL, 0, s));
    count = types(k, kn);
    ndeps = 4;
    RC("deps", NODE_DEPS(kn[4], deps, data, &ndeps));
    printf(" n=%zu", ndeps);
    name("dep", deps[0], kn, count);
    edge("data", &data[0]);
    printf("\n");
    info("after-kernel", s, kn, count);
    cudaGraphNode_t set[2] = {kn[1], kn[2]};
    const cudaGraphEdgeData set_edges[2] = {launch_order, zero};
    printf("update-deps");
    RC("set", UPDATE_CAPTURE_DEPS(s, set, set_edges, 2, SET));
    RC("add", UPDATE_CAPTURE_DEPS(s, &kn[3], NULL, 1, ADD));
    RC("add-again", UPDATE_CAPTURE_DEPS(s, &kn[3], NULL, 1, ADD));
    RC("other-graph", UPDATE_CAPTURE_DEPS(s, &kc[0], NULL, 1, ADD));
    RC("bad-flags", UPDATE_CAPTURE_DEPS(s, &kn[3], NULL, 1, 2));
    RC("not-capturing", UPDATE_CAPTURE_DEPS(side, &kn[3], NULL, 1, SET));
    printf("\n");
    info("updated", s, kn, count);
    /* The next kernel depends on kernel 1 through its launch-order port (a kernel into a
     * kernel: allowed) and on kernel 2 and the empty node through default edges. */
    printf("kernel");
    RC("kernel", cudaLaunchKernel((const void *)kernel, one, one, NULL, 0, s));
    count = types(k, kn);
    ndeps = 4;
    RC("deps", NODE_DEPS(kn[5], deps, data, &ndeps));
    printf(" n=%zu", ndeps);
    for (size_t i = 0; i < ndeps; i++) {
        name("dep", deps[i], kn, count);
        edge("data", &data[i]);
    }
    printf("\n");
    /* A fork and join: the origin's next node depends on its own last node and the side's. */
    printf("join");
    RC("record", cudaEventRecord(fork, s));
    RC("wait", cudaStreamWaitEvent(side, fork, 0));
    RC("side-memset", cudaMemsetAsync(d, 1, N, side));
    RC("record", cudaEventRecord(join, side));
    RC("origin-memset", cudaMemsetAsync(d, 2, N, s));
    RC("wait", cudaStreamWaitEvent(s, join, 0));
    count = types(k, kn);
    printf("\n");
    info("joined", s, kn, count);
    printf("end");
    cudaGraph_t into = NULL;
    RC("end", cudaStreamEndCapture(s, &into));
    printf(" same=%d\n", into == k);

    printf("teardown");
    RC("execs", cudaGraphExecDestroy(outer_exec) | cudaGraphExecDestroy(fill_exec) |
                    cudaGraphExecDestroy(fill_exec2) | cudaGraphExecDestroy(nested_exec) |
                    cudaGraphExecDestroy(inner_exec) | cudaGraphExecDestroy(a_exec) |
                    cudaGraphExecDestroy(k_exec));
    RC("graphs", cudaGraphDestroy(outer) | cudaGraphDestroy(fill) | cudaGraphDestroy(other_fill) |
                     cudaGraphDestroy(via22) | cudaGraphDestroy(via33) | cudaGraphDestroy(inner) |
                     cudaGraphDestroy(with_mem) | cudaGraphDestroy(a) | cudaGraphDestroy(same) |
                     cudaGraphDestroy(more) | cudaGraphDestroy(deps_count) |
                     cudaGraphDestroy(other_dep) | cudaGraphDestroy(k) |
                     cudaGraphDestroy(k_clone));
    RC("trim", cudaDeviceGraphMemTrim(0));
    printf("\n");
    pool("end");
    printf("teardown");
    RC("free", cudaFree(d));
    RC("streams", cudaStreamDestroy(s) | cudaStreamDestroy(side));
    RC("events", cudaEventDestroy(fork) | cudaEventDestroy(join));
    printf("\n");
    return 0;
}

/* Graph structure on the fake runtime: dependencies given when nodes are added, added and
 * removed later; edges, roots and a node's dependencies read back; a captured chain's edges; a
 * clone; launches in dependency order (not order of addition), a cycle refused; executable
 * graph update: same topology and node types updated, otherwise the documented failure and
 * reason; child graph nodes (a copy of the child, run in its place, cloned and updated with
 * the parent). One line per step. Built with -DCUDA_MAJOR=13 or 12 (edge data arguments differ). */
#include <stdio.h>
#include <string.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaGraph_t;
typedef void *cudaGraphExec_t;
typedef void *cudaGraphNode_t;
typedef struct { unsigned x, y, z; } dim3;
typedef struct {
    int result;
    cudaGraphNode_t errorNode, errorFromNode;
} cudaGraphExecUpdateResultInfo;
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, cudaStream_t s);
cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s);
cudaError_t cudaLaunchKernel(const void *f, dim3 grid, dim3 block, void **args, size_t shared,
                             cudaStream_t s);
cudaError_t cudaLaunchHostFunc(cudaStream_t s, void (*fn)(void *), void *data);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaGraphCreate(cudaGraph_t *graph, unsigned flags);
cudaError_t cudaGraphAddEmptyNode(cudaGraphNode_t *node, cudaGraph_t graph,
                                  const cudaGraphNode_t *deps, size_t count);
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count);
cudaError_t cudaGraphGetRootNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count);
cudaError_t cudaGraphClone(cudaGraph_t *clone, cudaGraph_t original);
cudaError_t cudaGraphAddChildGraphNode(cudaGraphNode_t *node, cudaGraph_t graph,
                                       const cudaGraphNode_t *deps, size_t count,
                                       cudaGraph_t child);
cudaError_t cudaGraphChildGraphNodeGetGraph(cudaGraphNode_t node, cudaGraph_t *graph);
cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, int *type);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph,
                                cudaGraphExecUpdateResultInfo *info);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
#if CUDA_MAJOR == 12
cudaError_t cudaGraphAddDependencies(cudaGraph_t g, const cudaGraphNode_t *from,
                                     const cudaGraphNode_t *to, size_t count);
cudaError_t cudaGraphRemoveDependencies(cudaGraph_t g, const cudaGraphNode_t *from,
                                        const cudaGraphNode_t *to, size_t count);
cudaError_t cudaGraphGetEdges(cudaGraph_t g, cudaGraphNode_t *from, cudaGraphNode_t *to,
                              size_t *count);
cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t node, cudaGraphNode_t *deps,
                                         size_t *count);
#define ADD_DEPS(g, f, t, n) cudaGraphAddDependencies(g, f, t, n)
#define REMOVE_DEPS(g, f, t, n) cudaGraphRemoveDependencies(g, f, t, n)
#define GET_EDGES(g, f, t, n) cudaGraphGetEdges(g, f, t, n)
#define NODE_DEPS(node, d, n) cudaGraphNodeGetDependencies(node, d, n)
#elif CUDA_MAJOR == 13
cudaError_t cudaGraphAddDependencies(cudaGraph_t g, const cudaGraphNode_t *from,
                                     const cudaGraphNode_t *to, const void *edges, size_t count);
cudaError_t cudaGraphRemoveDependencies(cudaGraph_t g, const cudaGraphNode_t *from,
                                        const cudaGraphNode_t *to, const void *edges,
                                        size_t count);
cudaError_t cudaGraphGetEdges(cudaGraph_t g, cudaGraphNode_t *from, cudaGraphNode_t *to,
                              void *edges, size_t *count);
cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t node, cudaGraphNode_t *deps,
                                         void *edges, size_t *count);
#define ADD_DEPS(g, f, t, n) cudaGraphAddDependencies(g, f, t, NULL, n)
#define REMOVE_DEPS(g, f, t, n) cudaGraphRemoveDependencies(g, f, t, NULL, n)
#define GET_EDGES(g, f, t, n) cudaGraphGetEdges(g, f, t, NULL, n)
#define NODE_DEPS(node, d, n) cudaGraphNodeGetDependencies(node, d, NULL, n)
#else
#error "build with -DCUDA_MAJOR=12 or 13"
#endif

enum { DEVICE_TO_HOST = 2, GLOBAL = 0 };
#define N 256
#define RC(name, call) printf(" %s=%d", name, (int)(call))

static void kernel(void) {}

/* The index of NODE among the graph's nodes (in order of addition), or -1. */
static int index_of(cudaGraph_t graph, cudaGraphNode_t node)
{
    cudaGraphNode_t nodes[16];
    size_t count = 16;
    cudaGraphGetNodes(graph, nodes, &count);
    for (size_t i = 0; i < count; i++)
        if (nodes[i] == node)
            return (int)i;
    return -1;
}

/* "edges N: f>t ..." by node index, then the roots. */
static void edges(const char *name, cudaGraph_t graph)
{
    cudaGraphNode_t from[16], to[16];
    size_t count = 0;
    cudaError_t rc = GET_EDGES(graph, NULL, NULL, &count);
    size_t wanted = 16;
    cudaError_t rc2 = GET_EDGES(graph, from, to, &wanted);
    printf("%s rc=%d/%d count=%zu/%zu:", name, rc, rc2, count, wanted);
    for (size_t i = 0; i < wanted; i++)
        printf(" %d>%d", index_of(graph, from[i]), index_of(graph, to[i]));
    cudaGraphNode_t roots[16];
    size_t nroots = 16;
    rc = cudaGraphGetRootNodes(graph, roots, &nroots);
    printf(" roots rc=%d", rc);
    for (size_t i = 0; i < nroots; i++)
        printf(" %d", index_of(graph, roots[i]));
    printf("\n");
}

static char order[8];
static int ran;
static void host_one(void *data) { order[ran++] = '1'; }
static void host_two(void *data) { order[ran++] = '2'; }
static void host_three(void *data) { order[ran++] = '3'; }

int main(void)
{
    cudaStream_t s;
    unsigned char *d = NULL;
    static unsigned char out[N];
    printf("setup %d\n", cudaStreamCreate(&s) | cudaMalloc((void **)&d, N));

    /* A diamond by hand: a; b, c after a; e after b and c. */
    cudaGraph_t g;
    cudaGraphNode_t a, b, c, e, ab[2];
    printf("diamond");
    RC("create", cudaGraphCreate(&g, 0));
    RC("a", cudaGraphAddEmptyNode(&a, g, NULL, 0));
    RC("b", cudaGraphAddEmptyNode(&b, g, &a, 1));
    RC("c", cudaGraphAddEmptyNode(&c, g, &a, 1));
    ab[0] = b;
    ab[1] = c;
    RC("e", cudaGraphAddEmptyNode(&e, g, ab, 2));
    ab[1] = b;
    RC("duplicate", cudaGraphAddEmptyNode(&e, g, ab, 2));
    printf("\n");
    edges("edges", g);
    cudaGraphNode_t deps[4] = {0, 0, 0, (cudaGraphNode_t)1};
    size_t ndeps = 0;
    cudaError_t count_rc = NODE_DEPS(e, NULL, &ndeps);
    size_t listed = 4;
    cudaError_t list_rc = NODE_DEPS(e, deps, &listed);
    printf("deps rc=%d/%d count=%zu/%zu: %d %d %s\n", count_rc, list_rc, ndeps, listed,
           index_of(g, deps[0]), index_of(g, deps[1]), deps[3] ? "set" : "null");
    printf("change");
    RC("add", ADD_DEPS(g, &a, &e, 1));
    RC("again", ADD_DEPS(g, &a, &e, 1));
    printf("\n");
    edges("added", g);
    printf("change");
    RC("remove", REMOVE_DEPS(g, &a, &e, 1));
    RC("again", REMOVE_DEPS(g, &a, &e, 1));
    RC("self", ADD_DEPS(g, &a, &a, 1));
    printf("\n");
    edges("removed", g);
    cudaGraph_t clone;
    printf("clone");
    RC("rc", cudaGraphClone(&clone, g));
    printf("\n");
    edges("cloned", clone);
    printf("destroy clone=%d graph=%d\n", cudaGraphDestroy(clone), cudaGraphDestroy(g));

    /* A captured chain: each node depends on the one before on its stream. */
    printf("capture");
    RC("begin", cudaStreamBeginCapture(s, GLOBAL));
    RC("host", cudaLaunchHostFunc(s, host_one, NULL));
    RC("host", cudaLaunchHostFunc(s, host_two, NULL));
    RC("end", cudaStreamEndCapture(s, &g));
    printf("\n");
    edges("captured", g);
    cudaGraphNode_t nodes[4];
    size_t count = 4;
    cudaGraphGetNodes(g, nodes, &count);
    /* Reverse the edge: the second host function now runs first. */
    printf("reverse");
    RC("remove", REMOVE_DEPS(g, &nodes[0], &nodes[1], 1));
    RC("add", ADD_DEPS(g, &nodes[1], &nodes[0], 1));
    cudaGraphExec_t exec;
    RC("instantiate", cudaGraphInstantiate(&exec, g, 0));
    RC("launch", cudaGraphLaunch(exec, s));
    printf(" order=%s", order);
    RC("destroy", cudaGraphExecDestroy(exec));
    RC("cycle", ADD_DEPS(g, &nodes[0], &nodes[1], 1));
    RC("instantiate", cudaGraphInstantiate(&exec, g, 0));
    RC("destroy", cudaGraphDestroy(g));
    printf("\n");

    /* Update: fill then copy out, with another value; then other shapes. */
    cudaGraph_t fill11, fill22, copy_only, kernel_first;
    cudaStreamBeginCapture(s, GLOBAL);
    cudaMemsetAsync(d, 0x11, N, s);
    cudaMemcpyAsync(out, d, N, DEVICE_TO_HOST, s);
    cudaStreamEndCapture(s, &fill11);
    cudaStreamBeginCapture(s, GLOBAL);
    cudaMemsetAsync(d, 0x22, N, s);
    cudaMemcpyAsync(out, d, N, DEVICE_TO_HOST, s);
    cudaStreamEndCapture(s, &fill22);
    cudaStreamBeginCapture(s, GLOBAL);
    cudaMemcpyAsync(out, d, N, DEVICE_TO_HOST, s);
    cudaStreamEndCapture(s, &copy_only);
    dim3 one = {1, 1, 1};
    cudaStreamBeginCapture(s, GLOBAL);
    cudaLaunchKernel((const void *)kernel, one, one, NULL, 0, s);
    cudaMemcpyAsync(out, d, N, DEVICE_TO_HOST, s);
    cudaStreamEndCapture(s, &kernel_first);
    cudaGraphExecUpdateResultInfo info;
    printf("update");
    RC("instantiate", cudaGraphInstantiate(&exec, fill11, 0));
    RC("launch", cudaGraphLaunch(exec, s));
    printf(" out=%02x", out[0]);
    memset(&info, 0x55, sizeof info);
    RC("same-shape", cudaGraphExecUpdate(exec, fill22, &info));
    printf(" result=%d node=%s", info.result, info.errorNode ? "set" : "null");
    RC("launch", cudaGraphLaunch(exec, s));
    printf(" out=%02x\n", out[N - 1]);
    printf("update");
    RC("count", cudaGraphExecUpdate(exec, copy_only, &info));
    printf(" result=%d", info.result);
    RC("type", cudaGraphExecUpdate(exec, kernel_first, &info));
    cudaGraphGetNodes(kernel_first, nodes, &count);
    printf(" result=%d node=%s", info.result, info.errorNode == nodes[0] ? "first" : "other");
    out[0] = 0;
    RC("launch", cudaGraphLaunch(exec, s));
    printf(" out=%02x\n", out[0]);

    /* A child graph node: the child (host functions 1, 2) runs after the parent's 3. */
    cudaGraph_t child, parent, embedded, again;
    cudaGraphExec_t child_exec;
    cudaGraphNode_t first, child_node, empty;
    int type = -1;
    size_t child_count = 0;
    cudaStreamBeginCapture(s, GLOBAL);
    cudaLaunchHostFunc(s, host_one, NULL);
    cudaLaunchHostFunc(s, host_two, NULL);
    cudaStreamEndCapture(s, &child);
    cudaStreamBeginCapture(s, GLOBAL);
    cudaLaunchHostFunc(s, host_three, NULL);
    cudaStreamEndCapture(s, &parent);
    count = 1;
    cudaGraphGetNodes(parent, &first, &count);
    printf("child");
    RC("add", cudaGraphAddChildGraphNode(&child_node, parent, &first, 1, child));
    RC("get-type", cudaGraphNodeGetType(child_node, &type));
    printf(" type=%d", type);
    RC("get", cudaGraphChildGraphNodeGetGraph(child_node, &embedded));
    /* A copy: a node added to the original later does not reach it. */
    RC("grow", cudaGraphAddEmptyNode(&empty, child, NULL, 0));
    cudaGraphGetNodes(embedded, NULL, &child_count);
    printf(" copy=%s nodes=%zu", embedded != child ? "yes" : "no", child_count);
    RC("not-child", cudaGraphChildGraphNodeGetGraph(first, &again));
    RC("destroy-embedded", cudaGraphDestroy(embedded));
    printf("\n");
    edges("parent", parent);
    memset(order, 0, sizeof order);
    ran = 0;
    printf("child");
    RC("instantiate", cudaGraphInstantiate(&child_exec, parent, 0));
    RC("launch", cudaGraphLaunch(child_exec, s));
    printf(" order=%s", order);
    RC("clone", cudaGraphClone(&clone, parent));
    cudaGraphNode_t cloned[4];
    count = 4;
    cudaGraphGetNodes(clone, cloned, &count);
    type = -1;
    cudaGraphNodeGetType(cloned[1], &type);
    RC("get", cudaGraphChildGraphNodeGetGraph(cloned[1], &again));
    child_count = 0;
    cudaGraphGetNodes(again, NULL, &child_count);
    printf(" cloned=%zu type=%d own=%s nodes=%zu", count, type, again != embedded ? "yes" : "no",
           child_count);
    /* The clone's child gets one more host function: the update sees a new topology. */
    cudaGraphNode_t last[4];
    count = 4;
    cudaGraphGetNodes(again, last, &count);
    memset(&info, 0x55, sizeof info);
    RC("update", cudaGraphExecUpdate(child_exec, clone, &info));
    printf(" result=%d", info.result);
    memset(order, 0, sizeof order);
    ran = 0;
    RC("launch", cudaGraphLaunch(child_exec, s));
    printf(" order=%s\n", order);
    printf("child");
    RC("grow-clone", cudaGraphAddEmptyNode(&empty, again, &last[1], 1));
    RC("update", cudaGraphExecUpdate(child_exec, clone, &info));
    printf(" result=%d", info.result);
    RC("destroy", cudaGraphExecDestroy(child_exec) | cudaGraphDestroy(clone) | cudaGraphDestroy(parent) |
                      cudaGraphDestroy(child));
    printf("\n");

    printf("teardown exec=%d graphs=%d free=%d stream=%d\n", cudaGraphExecDestroy(exec),
           cudaGraphDestroy(fill11) | cudaGraphDestroy(fill22) | cudaGraphDestroy(copy_only) |
               cudaGraphDestroy(kernel_first),
           cudaFree(d), cudaStreamDestroy(s));
    return 0;
}

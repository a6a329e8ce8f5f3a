/* Work submission, all of which completes at once (kernels do nothing): streams, events,
 * modules and libraries (loaded images are only kept as handles), launches, occupancy; stream
 * capture, where work on a capturing stream becomes graph nodes instead, done at each graph
 * launch. Synchronising calls are where stream-ordered pools give memory back (pool.c). */
#include "driver.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A capturing stream's (or a captured event's) dependency set: the nodes the next node captured
 * on it depends on, each with its edge data (CUgraphEdgeData's 8 bytes as one word, 0 the
 * default edge). */
struct capture_deps {
    CUgraphNode *nodes;
    uint64_t *edges;
    size_t count, capacity;
};

struct CUstream_st {
    int device;
    unsigned flags;
    int priority;
    unsigned long long id;
    /* The capture this stream takes part in (0: none; one that has ended is cleared at the next
     * look), and what the next node captured on it depends on: the last node captured on it, the
     * nodes of the events it waited on since, or what cuStreamUpdateCaptureDependencies set. */
    unsigned long long capture_id;
    struct capture_deps deps;
    /* Nodes captured on it in its capture, and how many of them a wait by another stream of
     * the capture has joined (a joined stream must be joined back before the capture ends). */
    unsigned long long captured, joined_upto;
};

struct CUevent_st {
    unsigned flags;
    double recorded_ms; /* the fake GPU's clock at the last record (now_ms) */
    /* Recorded on a capturing stream: waiting on it joins the waiting stream to that capture. */
    unsigned long long capture_id;
    struct capture_deps deps;
    /* The stream it was recorded on and that stream's captured count then (the stream is only
     * compared with the capture's streams, never followed). */
    const struct CUstream_st *stream;
    unsigned long long seq;
};

struct CUmod_st {
    int device;
};

struct CUfunc_st {
    CUmodule module;
    char name[];
};

/* A graph is its nodes in the order they were added (captured); an executable graph is a copy
 * of their operations, done in that order at each launch. */
struct CUgraphNode_st {
    struct fg_op op;
    CUgraph graph;
    size_t index; /* its place in the graph's order of addition */
    CUgraphNode *deps; /* the nodes it depends on (edges into it) */
    uint64_t *dep_edges; /* each edge's data (CUgraphEdgeData as one word; 0: default) */
    size_t ndeps, deps_capacity;
};

struct CUgraph_st {
    CUgraphNode *nodes;
    size_t count, capacity;
    bool embedded; /* a child graph node's graph: no memory nodes may be added */
};

struct CUgraphExec_st {
    /* In an order that runs every node after its dependencies, a child graph's operations
     * in its place. */
    struct fg_op *ops;
    size_t count;
    /* A copy of the instantiated graph (memory nodes too): the shape cuGraphExecUpdate compares
     * and what a launch on a capturing stream adds to the capture as a child graph node. */
    CUgraph graph;
    bool auto_free; /* CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH */
};

/* An allocation made by a graph's mem-alloc node. Its address is fixed when the node is made
 * (the host range behind it is mapped then, costing nothing until touched); a launch running
 * the node takes its physical memory from the device's graph pool, and running a mem-free node
 * (or freeing it outside the graph) gives it back to that pool, which keeps it for later
 * launches until cuDeviceGraphMemTrim. Every field under capture_lock. */
struct graph_mem {
    uint64_t base, size; /* size: the request rounded up to the granularity */
    int device;
    bool live;           /* taken by a launch, not freed yet */
    int refs;            /* nodes and executable graphs naming it */
    int execs;           /* executable graphs with its alloc node (at most one) */
    struct graph_mem *next;
};
static struct graph_mem *graph_mems;

static void graph_mem_put(struct graph_mem *m);
static bool deps_grow(CUgraphNode **nodes, uint64_t **edges, size_t count, size_t *capacity,
                      size_t n);
static bool deps_set(struct capture_deps *d, const CUgraphNode *nodes, const void *edges,
                     size_t n, bool add);

/* An active stream capture. Captures live in one list under capture_lock; streams and events
 * refer to them by id, so a capture that ends leaves nothing dangling. */
struct capture {
    unsigned long long id;
    CUgraph graph;
    bool owns_graph; /* false for cuStreamBeginCaptureToGraph */
    int mode;        /* CUstreamCaptureMode: 0 global, 1 thread-local, 2 relaxed */
    CUstream origin;
    pthread_t thread;
    bool invalidated;
    /* The streams joined to it through events (not the origin). */
    struct CUstream_st **joined;
    size_t joined_count, joined_capacity;
    struct capture *next;
};

static pthread_mutex_t capture_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t *fg_capture_lock(void) { return &capture_lock; }
static struct capture *captures;
CUresult cuGraphCreate(CUgraph *graph, unsigned int flags);
CUresult cuGraphDestroy(CUgraph graph);
static unsigned long long next_capture_id = 1;
/* The calling thread's capture mode (cuThreadExchangeStreamCaptureMode). */
static __thread int thread_capture_mode;
/* cudaStreamPerThread's state in each thread (the legacy stream 0/1 never captures). */
static __thread struct CUstream_st per_thread_stream;

static unsigned long long next_stream_id = 1;

static CUresult need_context(void)
{
    int dev;
    return fg_current_device(&dev);
}

/* ---------------------------------------------------------------- streams */
FG_EXPORT CUresult cuStreamCreateWithPriority(CUstream *stream, unsigned int flags, int priority)
{
    int dev;
    CUresult rc = fg_current_device(&dev);
    if (rc)
        return rc;
    if (!stream || flags > 1)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->device = dev;
    s->flags = flags;
    s->priority = priority < -5 ? -5 : priority > 0 ? 0 : priority;
    s->id = __atomic_fetch_add(&next_stream_id, 1, __ATOMIC_RELAXED) + 2;
    *stream = s;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuStreamCreate(CUstream *stream, unsigned int flags)
{
    return cuStreamCreateWithPriority(stream, flags, 0);
}

static CUresult capture_forbids_stream(CUstream stream);
static struct CUstream_st *capture_stream(CUstream stream);
static struct capture *capture_of(struct CUstream_st *stream);
static struct capture *capture_by_id(unsigned long long id);

FG_EXPORT CUresult cuStreamDestroy_v2(CUstream stream)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!stream)
        return CUDA_ERROR_INVALID_HANDLE;
    if ((uintptr_t)stream > 2 && __atomic_load_n(&stream->capture_id, __ATOMIC_ACQUIRE)) {
        /* A joined stream destroyed during the capture leaves its list. */
        pthread_mutex_lock(&capture_lock);
        struct capture *c = capture_of(stream);
        for (size_t i = 0; c && i < c->joined_count; i++)
            if (c->joined[i] == stream)
                c->joined[i] = c->joined[--c->joined_count];
        pthread_mutex_unlock(&capture_lock);
    }
    free(stream->deps.nodes);
    free(stream->deps.edges);
    free(stream);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuStreamSynchronize(CUstream stream)
{
    CUresult rc = need_context();
    if (!rc)
        rc = capture_forbids_stream(stream);
    if (!rc)
        fg_pools_sync();
    return rc;
}

FG_EXPORT CUresult cuStreamQuery(CUstream stream)
{
    CUresult rc = need_context();
    return rc ? rc : capture_forbids_stream(stream);
}

/* Adds S to C's joined streams, its counts from zero; false when out of memory. */
static bool capture_join(struct capture *c, struct CUstream_st *s)
{
    if (c->joined_count == c->joined_capacity) {
        size_t capacity = c->joined_capacity ? c->joined_capacity * 2 : 4;
        struct CUstream_st **joined = realloc(c->joined, capacity * sizeof *joined);
        if (!joined)
            return false;
        c->joined = joined;
        c->joined_capacity = capacity;
    }
    c->joined[c->joined_count++] = s;
    s->captured = s->joined_upto = 0;
    return true;
}

/* Waiting on an event recorded during a capture joins the waiting stream to that capture
 * (how work forks onto side streams), depending on the event's node. */
FG_EXPORT CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags)
{
    CUresult rc = need_context();
    if (rc)
        return rc;
    if (!event)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!__atomic_load_n(&event->capture_id, __ATOMIC_ACQUIRE))
        return CUDA_SUCCESS;
    struct CUstream_st *s = capture_stream(stream);
    pthread_mutex_lock(&capture_lock);
    struct capture *joining = capture_by_id(event->capture_id);
    struct capture *current = capture_of(s);
    if (!joining) {
        event->capture_id = 0; /* its capture has ended: an ordinary event now */
    } else if (!s) {
        joining->invalidated = true; /* the legacy stream cannot join a capture */
        rc = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    } else if (current && current != joining) {
        rc = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    } else if (!deps_grow(&s->deps.nodes, &s->deps.edges, s->deps.count, &s->deps.capacity,
                          event->deps.count) ||
               (!current && s != joining->origin && !capture_join(joining, s))) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        /* The stream's next node depends on its own work and on the event's (room made above). */
        deps_set(&s->deps, event->deps.nodes, event->deps.edges, event->deps.count, true);
        __atomic_store_n(&s->capture_id, joining->id, __ATOMIC_RELEASE);
        /* Waiting on work of a joined stream joins that work (to whichever stream of the
         * capture waits: a side stream joined back through another counts). */
        for (size_t i = 0; i < joining->joined_count; i++)
            if (joining->joined[i] == event->stream && joining->joined[i] != s &&
                joining->joined[i]->joined_upto < event->seq)
                joining->joined[i]->joined_upto = event->seq;
    }
    pthread_mutex_unlock(&capture_lock);
    return rc;
}

FG_EXPORT CUresult cuStreamGetPriority(CUstream stream, int *priority)
{
    if (!priority)
        return CUDA_ERROR_INVALID_VALUE;
    *priority = stream && (uintptr_t)stream > 2 ? stream->priority : 0;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuStreamGetFlags(CUstream stream, unsigned int *flags)
{
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = stream && (uintptr_t)stream > 2 ? stream->flags : 0;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuStreamGetId(CUstream stream, unsigned long long *id)
{
    if (!id)
        return CUDA_ERROR_INVALID_VALUE;
    *id = stream && (uintptr_t)stream > 2 ? stream->id : (uintptr_t)stream;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuStreamGetCtx(CUstream stream, CUcontext *ctx)
{
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (stream && (uintptr_t)stream > 2) {
        *ctx = &fg_devices[stream->device].primary;
        return CUDA_SUCCESS;
    }
    return cuCtxGetCurrent(ctx);
}

FG_EXPORT CUresult cuStreamGetDevice(CUstream stream, CUdevice *device)
{
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (stream && (uintptr_t)stream > 2) {
        *device = stream->device;
        return CUDA_SUCCESS;
    }
    return cuCtxGetDevice(device);
}

/* ---------------------------------------------------------------- stream capture */
/* The stream whose capture state a handle names: NULL for the legacy stream (0 or 1). */
static struct CUstream_st *capture_stream(CUstream stream)
{
    if ((uintptr_t)stream == 2) /* CU_STREAM_PER_THREAD */
        return &per_thread_stream;
    return (uintptr_t)stream > 2 ? stream : NULL;
}

/* The active capture STREAM takes part in, or NULL (clearing an ended one). capture_lock held. */
static struct capture *capture_of(struct CUstream_st *stream)
{
    if (!stream || !stream->capture_id)
        return NULL;
    for (struct capture *c = captures; c; c = c->next)
        if (c->id == stream->capture_id)
            return c;
    stream->capture_id = 0;
    stream->deps.count = 0;
    return NULL;
}

static struct capture *capture_by_id(unsigned long long id)
{
    for (struct capture *c = id ? captures : NULL; c; c = c->next)
        if (c->id == id)
            return c;
    return NULL;
}

/* Room for N more entries in the parallel arrays *NODES and *EDGES of *CAPACITY entries. */
static bool deps_grow(CUgraphNode **nodes, uint64_t **edges, size_t count, size_t *capacity,
                      size_t n)
{
    if (count + n <= *capacity)
        return true;
    size_t more = *capacity ? *capacity * 2 : 2;
    while (more < count + n)
        more *= 2;
    CUgraphNode *grown_nodes = realloc(*nodes, more * sizeof *grown_nodes);
    if (grown_nodes)
        *nodes = grown_nodes;
    uint64_t *grown_edges = grown_nodes ? realloc(*edges, more * sizeof *grown_edges) : NULL;
    if (!grown_edges)
        return false;
    *edges = grown_edges;
    *capacity = more;
    return true;
}

/* Edge data (CUgraphEdgeData: from_port, to_port, type, 5 reserved bytes) as one word: entry I
 * of EDGES, or the default edge (0) where EDGES is NULL. */
static uint64_t edge_at(const void *edges, size_t i)
{
    uint64_t word = 0;
    if (edges)
        memcpy(&word, (const unsigned char *)edges + 8 * i, 8);
    return word;
}

/* Whether an edge from FROM into a node doing TO may carry EDGE, as CUgraphEdgeData's
 * documentation says: reserved bytes and to_port zero (no node type defines input ports), type
 * default (0) or programmatic (1); only kernel nodes define output ports (1 programmatic, 2
 * launch order) and the programmatic type, which is only between kernel nodes and goes with the
 * programmatic or launch-order port, and the programmatic port only with that type. */
static bool edge_valid(CUgraphNode from, const struct fg_op *to, uint64_t edge)
{
    if (!edge)
        return true;
    unsigned from_port = edge & 0xff, to_port = (edge >> 8) & 0xff, type = (edge >> 16) & 0xff;
    if (edge >> 24 || to_port || type > 1 || from_port > 2)
        return false;
    if (from->op.type != FG_OP_KERNEL || to->type != FG_OP_KERNEL)
        return false;
    return type == 1 ? from_port != 0 : from_port != 1;
}

/* The stream's dependency set: N nodes with their edge data, duplicates dropped; ADD keeps
 * the ones it had (a union). False when out of memory (the set unchanged). */
static bool deps_set(struct capture_deps *d, const CUgraphNode *nodes, const void *edges,
                     size_t n, bool add)
{
    if (!deps_grow(&d->nodes, &d->edges, add ? d->count : 0, &d->capacity, n))
        return false;
    if (!add)
        d->count = 0;
    for (size_t i = 0; i < n; i++) {
        bool seen = false;
        for (size_t j = 0; j < d->count && !seen; j++)
            seen = d->nodes[j] == nodes[i];
        if (!seen) {
            d->nodes[d->count] = nodes[i];
            d->edges[d->count++] = edge_at(edges, i);
        }
    }
    return true;
}

static CUresult node_add_dep(CUgraphNode node, CUgraphNode dep, uint64_t edge)
{
    if (!deps_grow(&node->deps, &node->dep_edges, node->ndeps, &node->deps_capacity, 1))
        return CUDA_ERROR_OUT_OF_MEMORY;
    node->dep_edges[node->ndeps] = edge;
    node->deps[node->ndeps++] = dep;
    return CUDA_SUCCESS;
}

static bool node_depends_on(CUgraphNode node, CUgraphNode dep);
static bool node_depends_on(CUgraphNode node, CUgraphNode dep)
{
    for (size_t i = 0; i < node->ndeps; i++)
        if (node->deps[i] == dep)
            return true;
    return false;
}

/* Adds a node for OP to GRAPH depending on DEPS (nodes of GRAPH, no duplicates) with the edge
 * data EDGES (NULL: default edges). */
static CUresult graph_add(CUgraph graph, const struct fg_op *op, const CUgraphNode *deps,
                          const void *edges, size_t ndeps, CUgraphNode *added)
{
    if (graph->embedded && (op->type == FG_OP_MEM_ALLOC || op->type == FG_OP_MEM_FREE))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < ndeps; i++) {
        if (!deps[i] || deps[i]->graph != graph || !edge_valid(deps[i], op, edge_at(edges, i)))
            return CUDA_ERROR_INVALID_VALUE;
        for (size_t j = 0; j < i; j++)
            if (deps[j] == deps[i])
                return CUDA_ERROR_INVALID_VALUE;
    }
    if (graph->count == graph->capacity) {
        size_t capacity = graph->capacity ? graph->capacity * 2 : 16;
        CUgraphNode *nodes = realloc(graph->nodes, capacity * sizeof *nodes);
        if (!nodes)
            return CUDA_ERROR_OUT_OF_MEMORY;
        graph->nodes = nodes;
        graph->capacity = capacity;
    }
    CUgraphNode node = calloc(1, sizeof *node);
    if (!node)
        return CUDA_ERROR_OUT_OF_MEMORY;
    node->op = *op;
    node->graph = graph;
    node->index = graph->count;
    for (size_t i = 0; i < ndeps; i++)
        if (node_add_dep(node, deps[i], edge_at(edges, i))) {
            free(node->deps);
            free(node->dep_edges);
            free(node);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    graph->nodes[graph->count++] = node;
    if (added)
        *added = node;
    return CUDA_SUCCESS;
}

static CUresult graph_add_mem(CUgraph graph, struct fg_op *op, const CUgraphNode *deps,
                              const void *edges, size_t ndeps, CUgraphNode *added);

/* A node for OP captured on S in C, depending on the stream's dependency set, which becomes
 * the new node (capture_lock held). */
static CUresult capture_add(struct capture *c, struct CUstream_st *s, const struct fg_op *op)
{
    struct fg_op copy = *op;
    CUgraphNode added;
    if (!deps_grow(&s->deps.nodes, &s->deps.edges, 0, &s->deps.capacity, 1)) {
        if (op->type == FG_OP_MEM_ALLOC)
            graph_mem_put(op->mem);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult rc = graph_add_mem(c->graph, &copy, s->deps.nodes, s->deps.edges, s->deps.count,
                                &added);
    if (!rc) {
        s->deps.nodes[0] = added;
        s->deps.edges[0] = 0;
        s->deps.count = 1;
        s->captured++;
    }
    return rc;
}

bool fg_capture_op(CUstream stream, const struct fg_op *op, CUresult *rc)
{
    struct CUstream_st *s = capture_stream(stream);
    /* The common case, no capture on this stream, takes no lock. */
    if (!s || !__atomic_load_n(&s->capture_id, __ATOMIC_ACQUIRE))
        return false;
    pthread_mutex_lock(&capture_lock);
    struct capture *c = capture_of(s);
    if (c && c->invalidated) {
        *rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    } else if (c) {
        *rc = capture_add(c, s, op);
    }
    pthread_mutex_unlock(&capture_lock);
    return c != NULL;
}

/* A call the real driver forbids during captures ("potentially unsafe" ones, such as
 * synchronising the device): it fails, and invalidates every capture it would have broken:
 * global-mode captures of any thread and thread-local ones of the calling thread, unless the
 * calling thread's mode is relaxed. */
CUresult fg_capture_forbids(void)
{
    if (thread_capture_mode == 2 || !__atomic_load_n(&captures, __ATOMIC_ACQUIRE))
        return CUDA_SUCCESS;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&capture_lock);
    for (struct capture *c = captures; c; c = c->next)
        if (c->mode == 0 || (c->mode == 1 && pthread_equal(c->thread, pthread_self()))) {
            c->invalidated = true;
            rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    pthread_mutex_unlock(&capture_lock);
    return rc;
}

/* Synchronising a capturing stream: not allowed, and the capture is invalidated. */
static CUresult capture_forbids_stream(CUstream stream)
{
    struct CUstream_st *s = capture_stream(stream);
    if (!s) /* the legacy stream: as synchronising the device */
        return fg_capture_forbids();
    if (!__atomic_load_n(&s->capture_id, __ATOMIC_ACQUIRE))
        return CUDA_SUCCESS;
    pthread_mutex_lock(&capture_lock);
    struct capture *c = capture_of(s);
    if (c)
        c->invalidated = true;
    pthread_mutex_unlock(&capture_lock);
    return c ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

/* Starts a capture on STREAM into a new graph, or INTO (cuStreamBeginCaptureToGraph) with the
 * first node captured depending on DEPS (nodes of INTO) with edge data EDGES. */
static CUresult begin_capture(CUstream stream, CUgraph into, const CUgraphNode *deps,
                              const void *edges, size_t ndeps, int mode)
{
    CUresult rc = need_context();
    if (rc)
        return rc;
    if (mode < 0 || mode > 2 || (ndeps && (!into || !deps)))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < ndeps; i++)
        if (!deps[i] || deps[i]->graph != into)
            return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = capture_stream(stream);
    if (!s)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    struct capture *c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (into) {
        c->graph = into;
    } else if ((rc = cuGraphCreate(&c->graph, 0))) {
        free(c);
        return rc;
    }
    c->owns_graph = !into;
    c->mode = mode;
    c->origin = s;
    c->thread = pthread_self();
    pthread_mutex_lock(&capture_lock);
    rc = capture_of(s) ? CUDA_ERROR_ILLEGAL_STATE
         : !deps_set(&s->deps, deps, edges, ndeps, false) ? CUDA_ERROR_OUT_OF_MEMORY
                                                           : CUDA_SUCCESS;
    if (rc) {
        pthread_mutex_unlock(&capture_lock);
        if (c->owns_graph)
            cuGraphDestroy(c->graph);
        free(c);
        return rc;
    }
    c->id = next_capture_id++;
    c->next = captures;
    __atomic_store_n(&captures, c, __ATOMIC_RELEASE);
    __atomic_store_n(&s->capture_id, c->id, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&capture_lock);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, int mode)
{
    return begin_capture(stream, NULL, NULL, NULL, 0, mode);
}

/* CUDA 10.0's entry point had no mode argument; its captures forbade no other call. */
FG_EXPORT CUresult cuStreamBeginCapture(CUstream stream)
{
    return begin_capture(stream, NULL, NULL, NULL, 0, 2);
}

FG_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream stream, CUgraph graph,
                                               const CUgraphNode *deps, const void *edges,
                                               size_t count, int mode)
{
    if (!graph)
        return CUDA_ERROR_INVALID_VALUE;
    return begin_capture(stream, graph, deps, edges, count, mode);
}

FG_EXPORT CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph)
{
    CUresult rc = need_context();
    if (rc)
        return rc;
    if (!graph)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = capture_stream(stream);
    pthread_mutex_lock(&capture_lock);
    struct capture *c = capture_of(s);
    if (!c)
        rc = CUDA_ERROR_ILLEGAL_STATE;
    else if (c->origin != s)
        rc = CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
    else if (c->mode == 1 && !pthread_equal(c->thread, pthread_self()))
        rc = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    if (rc) {
        pthread_mutex_unlock(&capture_lock);
        return rc;
    }
    /* Ends the capture for every stream that joined it: they find its id gone. */
    for (struct capture **p = &captures; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    s->capture_id = 0;
    s->deps.count = 0;
    /* Work on a joined stream that no wait joined back: the capture fails, with no graph. */
    bool unjoined = false;
    for (size_t i = 0; i < c->joined_count; i++)
        if (c->joined[i]->capture_id == c->id && c->joined[i]->captured > c->joined[i]->joined_upto)
            unjoined = true;
    pthread_mutex_unlock(&capture_lock);
    free(c->joined);
    if (c->invalidated || unjoined) {
        *graph = NULL;
        if (c->owns_graph)
            cuGraphDestroy(c->graph);
        rc = c->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
                            : CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
    } else {
        *graph = c->graph;
    }
    free(c);
    return rc;
}

FG_EXPORT CUresult cuStreamIsCapturing(CUstream stream, int *status)
{
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = capture_stream(stream);
    pthread_mutex_lock(&capture_lock);
    struct capture *c = capture_of(s);
    *status = !c ? CU_STREAM_CAPTURE_STATUS_NONE
                 : c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                  : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    pthread_mutex_unlock(&capture_lock);
    return CUDA_SUCCESS;
}

/* The per-thread-default-stream variants (`_ptsz`, what code built with nvcc
 * --default-stream per-thread calls): stream 0 is the calling thread's default stream. */
static CUstream per_thread_default(CUstream stream)
{
    return stream ? stream : (CUstream)(uintptr_t)2;
}

FG_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream stream)
{
    return begin_capture(per_thread_default(stream), NULL, NULL, NULL, 0, 2);
}

FG_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, int mode)
{
    return begin_capture(per_thread_default(stream), NULL, NULL, NULL, 0, mode);
}

FG_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream stream, CUgraph graph,
                                                    const CUgraphNode *deps, const void *edges,
                                                    size_t count, int mode)
{
    if (!graph)
        return CUDA_ERROR_INVALID_VALUE;
    return begin_capture(per_thread_default(stream), graph, deps, edges, count, mode);
}

FG_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph *graph)
{
    return cuStreamEndCapture(per_thread_default(stream), graph);
}

FG_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream stream, int *status)
{
    return cuStreamIsCapturing(per_thread_default(stream), status);
}

/* Every generation of cuStreamGetCaptureInfo: the status, and while a capture is active its
 * id, graph and the stream's dependency set with its edge data (arrays valid until the next
 * call on the stream). Asking for the nodes without the edge data while an edge is not the
 * default one is a lossy query, as documented (CUDA_ERROR_LOSSY_QUERY); edge data without the
 * nodes is refused. */
CUresult fg_capture_info(CUstream stream, int *status, unsigned long long *id, CUgraph *graph,
                         const CUgraphNode **deps, const void **edges, size_t *count)
{
    if (!status || (edges && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = capture_stream(stream);
    pthread_mutex_lock(&capture_lock);
    struct capture *c = capture_of(s);
    *status = !c ? CU_STREAM_CAPTURE_STATUS_NONE
                 : c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                  : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    bool active = *status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
    size_t n = active ? s->deps.count : 0;
    bool lossy = false;
    for (size_t i = 0; deps && !edges && i < n; i++)
        lossy |= s->deps.edges[i] != 0;
    if (id && active)
        *id = c->id;
    if (graph)
        *graph = active ? c->graph : NULL;
    if (deps)
        *deps = n ? (const CUgraphNode *)s->deps.nodes : NULL;
    if (edges)
        *edges = n ? (const void *)s->deps.edges : NULL;
    if (count)
        *count = n;
    pthread_mutex_unlock(&capture_lock);
    return lossy ? CUDA_ERROR_LOSSY_QUERY : CUDA_SUCCESS;
}

/* Replaces (FLAGS 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES) or adds to (0) the capturing stream's
 * dependency set: nodes of its capture's graph, with edge data EDGES (NULL: default). */
static CUresult update_capture_deps(CUstream stream, const CUgraphNode *deps, const void *edges,
                                    size_t count, unsigned flags)
{
    if (flags > 1 || (count && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = capture_stream(stream);
    pthread_mutex_lock(&capture_lock);
    struct capture *c = capture_of(s);
    CUresult rc = !c ? CUDA_ERROR_ILLEGAL_STATE
                  : c->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
                                   : CUDA_SUCCESS;
    for (size_t i = 0; !rc && i < count; i++)
        if (!deps[i] || deps[i]->graph != c->graph)
            rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc && !deps_set(&s->deps, deps, edges, count, flags == 0))
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&capture_lock);
    return rc;
}

FG_EXPORT CUresult cuStreamUpdateCaptureDependencies(CUstream stream, CUgraphNode *deps,
                                                     size_t count, unsigned int flags)
{
    return update_capture_deps(stream, deps, NULL, count, flags);
}

FG_EXPORT CUresult cuStreamUpdateCaptureDependencies_v2(CUstream stream, CUgraphNode *deps,
                                                        const void *edges, size_t count,
                                                        unsigned int flags)
{
    return update_capture_deps(stream, deps, edges, count, flags);
}

FG_EXPORT CUresult cuStreamUpdateCaptureDependencies_ptsz(CUstream stream, CUgraphNode *deps,
                                                          size_t count, unsigned int flags)
{
    return update_capture_deps(per_thread_default(stream), deps, NULL, count, flags);
}

FG_EXPORT CUresult cuStreamUpdateCaptureDependencies_v2_ptsz(CUstream stream, CUgraphNode *deps,
                                                             const void *edges, size_t count,
                                                             unsigned int flags)
{
    return update_capture_deps(per_thread_default(stream), deps, edges, count, flags);
}

FG_EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream stream, int *status, unsigned long long *id,
                                             CUgraph *graph, const CUgraphNode **deps,
                                             const void **edges, size_t *count)
{
    return fg_capture_info(stream, status, id, graph, deps, edges, count);
}

FG_EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream stream, int *status, unsigned long long *id,
                                             CUgraph *graph, const CUgraphNode **deps,
                                             size_t *count)
{
    return fg_capture_info(stream, status, id, graph, deps, NULL, count);
}

FG_EXPORT CUresult cuStreamGetCaptureInfo(CUstream stream, int *status, unsigned long long *id)
{
    return fg_capture_info(stream, status, id, NULL, NULL, NULL, NULL);
}

FG_EXPORT CUresult cuThreadExchangeStreamCaptureMode(int *mode)
{
    if (!mode || *mode < 0 || *mode > 2)
        return CUDA_ERROR_INVALID_VALUE;
    int old = thread_capture_mode;
    thread_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- events */
/* The fake GPU's clock, in nanoseconds: work completes when it is issued, so the clock moves
 * only by the time the fakes give the work they model (each kernel FG_KERNEL_NS, a fake cuDNN
 * plan's execution its engine's time: see vramshim_fakegpu_device_work). Events read it: the time between two events is that work,
 * the same in every run (a wall clock would make cudnn.benchmark's choice of engine, which
 * sorts plans by their measured time, a matter of chance). */
static uint64_t device_clock_ns;

/* A kernel does nothing but takes this long on the fake GPU's clock, so that the time between
 * two events around work is never zero: programs divide by it (throughput printouts, Triton's
 * do_bench estimating its repeat count from one run). */
#define FG_KERNEL_NS 1000ull

static double now_ms(void)
{
    return (double)__atomic_load_n(&device_clock_ns, __ATOMIC_ACQUIRE) / 1e6;
}

/* For the fake libraries: NS nanoseconds of work done on the device. Not an NVIDIA symbol. */
FG_EXPORT void vramshim_fakegpu_device_work(unsigned long long ns)
{
    __atomic_add_fetch(&device_clock_ns, (uint64_t)ns, __ATOMIC_ACQ_REL);
}

FG_EXPORT CUresult cuEventCreate(CUevent *event, unsigned int flags)
{
    CUresult rc = need_context();
    if (rc)
        return rc;
    if (!event)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->flags = flags;
    *event = e;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuEventDestroy_v2(CUevent event)
{
    if (!event)
        return CUDA_ERROR_INVALID_HANDLE;
    free(event->deps.nodes);
    free(event->deps.edges);
    free(event);
    return CUDA_SUCCESS;
}

/* A record on a capturing stream marks the stream's place in the capture instead. */
FG_EXPORT CUresult cuEventRecord(CUevent event, CUstream stream)
{
    if (!event)
        return CUDA_ERROR_INVALID_HANDLE;
    struct CUstream_st *s = capture_stream(stream);
    if (s && __atomic_load_n(&s->capture_id, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&capture_lock);
        struct capture *c = capture_of(s);
        event->capture_id = c ? c->id : 0;
        event->stream = s;
        event->seq = s->captured;
        CUresult rc = c && c->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
        /* The event stands for the stream's dependency set at this point. */
        if (c && !rc && !deps_set(&event->deps, s->deps.nodes, s->deps.edges, s->deps.count, false))
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        pthread_mutex_unlock(&capture_lock);
        if (c)
            return rc;
    }
    __atomic_store_n(&event->capture_id, 0, __ATOMIC_RELEASE);
    event->recorded_ms = now_ms();
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuEventRecordWithFlags(CUevent event, CUstream stream, unsigned int flags)
{
    return cuEventRecord(event, stream);
}

FG_EXPORT CUresult cuEventQuery(CUevent event) { return event ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }

FG_EXPORT CUresult cuEventSynchronize(CUevent event)
{
    if (!event)
        return CUDA_ERROR_INVALID_HANDLE;
    fg_pools_sync();
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end)
{
    if (!ms || !start || !end)
        return CUDA_ERROR_INVALID_HANDLE;
    if ((start->flags | end->flags) & 2) /* CU_EVENT_DISABLE_TIMING */
        return CUDA_ERROR_INVALID_HANDLE;
    *ms = (float)(end->recorded_ms - start->recorded_ms);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
    return cuEventElapsedTime_v2(ms, start, end);
}

/* IPC event handles. Work on the fake GPU is done when it is issued, so an event another
 * process opens has nothing to wait for: the opener gets an event of its own (interprocess,
 * no timing) that is always complete. The handle names the exporting process, the event there
 * and the memory file the exporter keeps open while it runs (ipc.c); it opens while that
 * process runs. */
struct ipc_event_handle {
    uint64_t magic, event;
    uint64_t inode, nonce; /* of the exporter's memory file */
    int32_t pid, fd;
    uint32_t reserved[6];
};
_Static_assert(sizeof(struct ipc_event_handle) == CU_IPC_HANDLE_SIZE, "CUipcEventHandle is 64 bytes");
#define IPC_EVENT_MAGIC 0x3174766563706966ull /* "fipcevt1" */
#define CU_EVENT_DISABLE_TIMING 0x2u
#define CU_EVENT_INTERPROCESS 0x4u

FG_EXPORT CUresult cuIpcGetEventHandle(CUipcEventHandle *handle, CUevent event)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!event)
        return CUDA_ERROR_INVALID_HANDLE;
    /* The driver exports only events made for it: interprocess and without timing. */
    if (!handle || (event->flags & (CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS)) !=
                       (CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS))
        return CUDA_ERROR_INVALID_VALUE;
    struct ipc_event_handle h = {.magic = IPC_EVENT_MAGIC, .event = (uint64_t)event,
                                 .pid = (int32_t)getpid()};
    if (!fg_ipc_process_file(&h.fd, &h.inode, &h.nonce))
        return CUDA_ERROR_OUT_OF_MEMORY;
    memset(handle, 0, sizeof *handle);
    memcpy(handle, &h, sizeof h);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuIpcOpenEventHandle(CUevent *event, CUipcEventHandle handle)
{
    struct ipc_event_handle h;
    int dev;
    memcpy(&h, &handle, sizeof h);
    CUresult rc = fg_current_device(&dev);
    if (rc)
        return rc;
    if (!event || h.magic != IPC_EVENT_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    if (h.pid == (int32_t)getpid())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!fg_ipc_process_running(h.pid, h.fd, h.inode, h.nonce))
        return CUDA_ERROR_INVALID_VALUE; /* the exporter is gone, or the handle made up */
    return cuEventCreate(event, CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS);
}

/* ---------------------------------------------------------------- modules and functions */
static CUresult module_new(CUmodule *module, const void *image)
{
    int dev;
    CUresult rc = fg_current_device(&dev);
    if (rc)
        return rc;
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUmod_st *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->device = dev;
    *module = m;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    return module_new(module, image);
}

FG_EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int n,
                                      void *options, void **values)
{
    return module_new(module, image);
}

FG_EXPORT CUresult cuModuleLoadFatBinary(CUmodule *module, const void *image)
{
    return module_new(module, image);
}

FG_EXPORT CUresult cuModuleLoad(CUmodule *module, const char *path)
{
    return module_new(module, path);
}

FG_EXPORT CUresult cuModuleUnload(CUmodule module)
{
    if (!module)
        return CUDA_ERROR_INVALID_HANDLE;
    free(module);
    return CUDA_SUCCESS;
}

static CUresult function_new(CUfunction *function, CUmodule module, const char *name)
{
    if (!function || !name)
        return CUDA_ERROR_INVALID_VALUE;
    size_t n = strlen(name);
    struct CUfunc_st *f = malloc(sizeof *f + n + 1);
    if (!f)
        return CUDA_ERROR_OUT_OF_MEMORY;
    f->module = module;
    memcpy(f->name, name, n + 1);
    *function = f;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name)
{
    if (!module)
        return CUDA_ERROR_INVALID_HANDLE;
    return function_new(function, module, name);
}

/* A module's global variable: 256 zeroed bytes of host memory per look-up. */
FG_EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule module,
                                        const char *name)
{
    if (!module || !name)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = calloc(1, 256);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (dptr)
        *dptr = (CUdeviceptr)p;
    if (bytes)
        *bytes = 256;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, void *jit_options,
                                     void **jit_values, unsigned int jit_count,
                                     void *library_options, void **library_values,
                                     unsigned int library_count)
{
    return module_new((CUmodule *)library, code);
}

FG_EXPORT CUresult cuLibraryUnload(CUlibrary library) { return cuModuleUnload((CUmodule)library); }

FG_EXPORT CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary library, const char *name)
{
    if (!library)
        return CUDA_ERROR_INVALID_HANDLE;
    return function_new((CUfunction *)kernel, (CUmodule)library, name);
}

FG_EXPORT CUresult cuLibraryGetModule(CUmodule *module, CUlibrary library)
{
    if (!module || !library)
        return CUDA_ERROR_INVALID_VALUE;
    *module = (CUmodule)library;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuKernelGetFunction(CUfunction *function, CUkernel kernel)
{
    if (!function || !kernel)
        return CUDA_ERROR_INVALID_VALUE;
    *function = (CUfunction)kernel;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuKernelGetName(const char **name, CUkernel kernel)
{
    if (!name || !kernel)
        return CUDA_ERROR_INVALID_VALUE;
    *name = ((CUfunction)kernel)->name;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuFuncGetName(const char **name, CUfunction function)
{
    return cuKernelGetName(name, (CUkernel)function);
}

/* Attributes of a kernel that uses little: 1024 threads, 32 registers, no shared memory. */
FG_EXPORT CUresult cuFuncGetAttribute(int *value, int attribute, CUfunction function)
{
    if (!value || !function)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
    case 0: *value = 1024; break;                              /* max threads per block */
    case 4: *value = 32; break;                                /* registers */
    case 5: *value = fg_config()->cc_major * 10 + fg_config()->cc_minor; break; /* PTX */
    case 6: *value = fg_config()->cc_major * 10 + fg_config()->cc_minor; break; /* binary */
    case 8: *value = 232448; break;                            /* max dynamic shared */
    default: *value = 0;
    }
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuFuncSetAttribute(CUfunction function, int attribute, int value)
{
    return function ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

FG_EXPORT CUresult cuFuncSetCacheConfig(CUfunction function, int config)
{
    return function ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

FG_EXPORT CUresult cuKernelSetAttribute(int attribute, int value, CUkernel kernel, CUdevice dev)
{
    return kernel ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

FG_EXPORT CUresult cuKernelGetAttribute(int *value, int attribute, CUkernel kernel, CUdevice dev)
{
    return cuFuncGetAttribute(value, attribute, (CUfunction)kernel);
}

/* ---------------------------------------------------------------- launches */
FG_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                  unsigned int bx, unsigned int by, unsigned int bz,
                                  unsigned int shared, CUstream stream, void **params,
                                  void **extra)
{
    CUresult rc = need_context();
    if (rc)
        return rc;
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    return fg_kernel_launch_on(stream);
}

/* A launch on STREAM: loads the module now (a capture too: the real driver loads it when the
 * launch is captured) and, on a capturing stream, becomes a kernel node. */
CUresult fg_kernel_launch_on(CUstream stream)
{
    CUresult rc = fg_kernel_launch();
    if (rc)
        return rc;
    struct fg_op op = {.type = FG_OP_KERNEL};
    if (!fg_capture_op(stream, &op, &rc))
        vramshim_fakegpu_device_work(FG_KERNEL_NS);
    return rc;
}

typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

FG_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
                                    void **extra)
{
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    return cuLaunchKernel(f, config->gridDimX, config->gridDimY, config->gridDimZ,
                          config->blockDimX, config->blockDimY, config->blockDimZ,
                          config->sharedMemBytes, config->hStream, params, extra);
}

FG_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                             unsigned int gz, unsigned int bx, unsigned int by,
                                             unsigned int bz, unsigned int shared,
                                             CUstream stream, void **params)
{
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, NULL);
}

FG_EXPORT CUresult cuLaunchHostFunc(CUstream stream, void (*fn)(void *), void *data)
{
    CUresult rc = need_context();
    if (rc)
        return rc;
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    struct fg_op op = {.type = FG_OP_HOST, .host_fn = fn, .host_data = data};
    if (!fg_capture_op(stream, &op, &rc))
        fn(data);
    return rc;
}

FG_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *blocks, CUfunction f,
                                                                       int block_size,
                                                                       size_t shared,
                                                                       unsigned int flags)
{
    if (!blocks || !f || block_size <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    int by_threads = 2048 / block_size;
    *blocks = by_threads > 32 ? 32 : by_threads;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, CUfunction f,
                                                              int block_size, size_t shared)
{
    return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, f, block_size, shared, 0);
}

FG_EXPORT CUresult cuOccupancyMaxPotentialBlockSize(int *min_grid, int *block_size, CUfunction f,
                                                   void *shared_fn, size_t shared, int limit)
{
    if (!min_grid || !block_size || !f)
        return CUDA_ERROR_INVALID_VALUE;
    *block_size = limit > 0 && limit < 1024 ? limit : 1024;
    int dev = -1;
    if (fg_current_device(&dev))
        dev = -1;
    *min_grid = fg_device_sms(dev) * (2048 / *block_size);
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- graphs */
FG_EXPORT CUresult cuGraphCreate(CUgraph *graph, unsigned int flags)
{
    if (!graph || flags)
        return CUDA_ERROR_INVALID_VALUE;
    *graph = calloc(1, sizeof **graph);
    return *graph ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* Frees GRAPH, its nodes and their child graphs (capture_lock held). */
static void graph_free(CUgraph graph)
{
    for (size_t i = 0; i < graph->count; i++) {
        if (graph->nodes[i]->op.mem)
            graph_mem_put(graph->nodes[i]->op.mem);
        if (graph->nodes[i]->op.child)
            graph_free(graph->nodes[i]->op.child);
        free(graph->nodes[i]->deps);
        free(graph->nodes[i]->dep_edges);
        free(graph->nodes[i]);
    }
    free(graph->nodes);
    free(graph);
}

FG_EXPORT CUresult cuGraphDestroy(CUgraph graph)
{
    if (!graph || graph->embedded)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&capture_lock);
    graph_free(graph);
    pthread_mutex_unlock(&capture_lock);
    return CUDA_SUCCESS;
}

/* A copy of ORIGINAL's nodes and edges (with their data), child graphs copied too
 * (capture_lock held). Graphs with memory nodes are cloned only for the fake's own use
 * (WITH_MEMORY: an executable graph's copy, a graph launched into a capture), each copied
 * memory node holding its allocation too: the driver's documentation says cloning is not
 * supported for them, and of its documented errors CUDA_ERROR_INVALID_VALUE is the one that
 * fits. Nodes first, then edges: a node may depend on one added after it. */
static CUresult graph_clone(CUgraph original, CUgraph *clone, bool with_memory)
{
    CUgraph g = calloc(1, sizeof *g);
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CUDA_SUCCESS;
    for (size_t i = 0; i < original->count && !rc; i++) {
        struct fg_op op = original->nodes[i]->op;
        if (op.mem && !with_memory) {
            rc = CUDA_ERROR_INVALID_VALUE;
            break;
        }
        if (op.child) {
            rc = graph_clone(original->nodes[i]->op.child, &op.child, with_memory);
            if (rc)
                break;
            op.child->embedded = true;
        }
        rc = graph_add(g, &op, NULL, NULL, 0, NULL);
        if (rc && op.child)
            graph_free(op.child);
        if (!rc && op.mem)
            op.mem->refs++;
    }
    for (size_t i = 0; i < original->count && !rc; i++) {
        CUgraphNode node = original->nodes[i];
        for (size_t d = 0; d < node->ndeps && !rc; d++)
            rc = node_add_dep(g->nodes[i], g->nodes[node->deps[d]->index], node->dep_edges[d]);
    }
    if (rc) {
        graph_free(g);
        return rc;
    }
    *clone = g;
    return CUDA_SUCCESS;
}

/* A node that runs a copy of CHILD (which may have no memory nodes) at its place. */
FG_EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode *node, CUgraph graph,
                                            const CUgraphNode *deps, size_t count, CUgraph child)
{
    if (!node || !graph || !child || (count && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    struct fg_op op = {.type = FG_OP_GRAPH};
    pthread_mutex_lock(&capture_lock);
    CUresult rc = graph_clone(child, &op.child, false);
    if (!rc) {
        op.child->embedded = true;
        rc = graph_add(graph, &op, deps, NULL, count, node);
        if (rc)
            graph_free(op.child);
    }
    pthread_mutex_unlock(&capture_lock);
    return rc;
}

/* The node's own graph, not a copy: changes to it reach the node. */
FG_EXPORT CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode node, CUgraph *graph)
{
    if (!node || !graph || node->op.type != FG_OP_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    *graph = node->op.child;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuGraphAddEmptyNode(CUgraphNode *node, CUgraph graph,
                                       const CUgraphNode *deps, size_t count)
{
    if (!node || !graph || (count && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    struct fg_op op = {.type = FG_OP_EMPTY};
    pthread_mutex_lock(&capture_lock);
    CUresult rc = graph_add(graph, &op, deps, NULL, count, node);
    pthread_mutex_unlock(&capture_lock);
    return rc;
}

/* The graph's nodes in an order that puts every node after its dependencies (order of
 * addition where that does), or NULL for a cycle. capture_lock held; free the result. */
static size_t *graph_order(CUgraph graph)
{
    size_t n = graph->count, edges = 0;
    size_t *order = malloc((n ? n : 1) * sizeof *order);
    if (!order)
        return NULL;
    bool added_order = true;
    for (size_t i = 0; i < n; i++) {
        order[i] = i;
        edges += graph->nodes[i]->ndeps;
        for (size_t d = 0; d < graph->nodes[i]->ndeps; d++)
            added_order &= graph->nodes[i]->deps[d]->index < i;
    }
    if (added_order)
        return order;
    /* Depth first, dependencies before the node: 0 unseen, 1 on the path, 2 placed. */
    unsigned char *state = calloc(n, 1);
    size_t *stack = malloc((n + edges) * sizeof *stack), top = 0, placed = 0;
    bool cycle = !state || !stack;
    for (size_t root = 0; root < n && !cycle; root++) {
        stack[top++] = root;
        while (top && !cycle) {
            size_t t = stack[top - 1];
            if (state[t] == 0) {
                state[t] = 1;
                CUgraphNode node = graph->nodes[t];
                for (size_t d = node->ndeps; d-- > 0 && !cycle;) {
                    size_t dep = node->deps[d]->index;
                    cycle = state[dep] == 1;
                    if (state[dep] == 0)
                        stack[top++] = dep;
                }
            } else {
                if (state[t] == 1)
                    order[placed++] = t;
                state[t] = 2;
                top--;
            }
        }
    }
    free(state);
    free(stack);
    if (cycle) {
        free(order);
        return NULL;
    }
    return order;
}

/* Appends GRAPH's operations, in an order that runs each after its dependencies and a child
 * graph's in its place, to *OPS (capture_lock held); false for a cycle or no memory. */
static bool graph_flatten(CUgraph graph, struct fg_op **ops, size_t *count, size_t *capacity)
{
    size_t *order = graph_order(graph);
    if (!order)
        return false;
    bool ok = true;
    for (size_t i = 0; i < graph->count && ok; i++) {
        const struct fg_op *op = &graph->nodes[order[i]]->op;
        if (op->type == FG_OP_GRAPH) {
            ok = graph_flatten(op->child, ops, count, capacity);
            continue;
        }
        if (*count == *capacity) {
            size_t more = *capacity ? *capacity * 2 : 16;
            struct fg_op *grown = realloc(*ops, more * sizeof *grown);
            if (!grown) {
                ok = false;
                break;
            }
            *ops = grown;
            *capacity = more;
        }
        (*ops)[(*count)++] = *op;
    }
    free(order);
    return ok;
}

/* The instantiated graph copies the operations: later changes to the graph do not reach it. */
FG_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph,
                                               unsigned long long flags)
{
    if (!exec || !graph)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphExec_st *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&capture_lock);
    /* A graph with memory nodes has at most one executable graph at a time. */
    for (size_t i = 0; i < graph->count; i++)
        if (graph->nodes[i]->op.type == FG_OP_MEM_ALLOC && graph->nodes[i]->op.mem->execs) {
            pthread_mutex_unlock(&capture_lock);
            free(e);
            return CUDA_ERROR_INVALID_VALUE;
        }
    size_t capacity = 0;
    bool ok = graph_flatten(graph, &e->ops, &e->count, &capacity);
    CUresult rc = ok ? graph_clone(graph, &e->graph, true) : CUDA_ERROR_INVALID_VALUE;
    if (rc) {
        pthread_mutex_unlock(&capture_lock);
        free(e->ops);
        free(e);
        return rc; /* a cycle (or no memory) */
    }
    for (size_t i = 0; i < e->count; i++) {
        if (e->ops[i].mem)
            e->ops[i].mem->refs++;
        if (e->ops[i].type == FG_OP_MEM_ALLOC)
            e->ops[i].mem->execs++;
    }
    e->auto_free = flags & 1;
    pthread_mutex_unlock(&capture_lock);
    *exec = e;
    return CUDA_SUCCESS;
}

/* CUDA 11's entry point, with an error node and a log buffer (nothing to say here). */
FG_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node,
                                         char *log, size_t log_size)
{
    if (error_node)
        *error_node = NULL;
    if (log && log_size)
        log[0] = 0;
    return cuGraphInstantiateWithFlags(exec, graph, 0);
}

static CUresult graph_mem_take(struct graph_mem *m);
static CUresult graph_mem_give(struct graph_mem *m);

static CUresult run_op(const struct fg_op *op)
{
    switch (op->type) {
    case FG_OP_COPY: return fg_copy(op->dst, op->src, op->bytes);
    case FG_OP_SET: return fg_set(op->dst, op->value, op->element, op->count);
    case FG_OP_HOST: op->host_fn(op->host_data); return CUDA_SUCCESS;
    case FG_OP_MEM_ALLOC: return graph_mem_take(op->mem);
    case FG_OP_MEM_FREE: return graph_mem_give(op->mem);
    case FG_OP_KERNEL: vramshim_fakegpu_device_work(FG_KERNEL_NS); return CUDA_SUCCESS;
    default: return CUDA_SUCCESS;
    }
}

/* A launch does the recorded operations in order, at once; launched on a capturing stream, the
 * graph becomes one child graph node of that capture instead (as the real runtime records it),
 * holding a copy of the executable graph's graph, memory nodes included (a child graph that
 * owns them, as one moved into its parent may), which run when the capture's graph runs. */
static CUresult graph_mem_give_locked(struct graph_mem *m);

static bool capture_graph_launch(CUgraphExec exec, CUstream stream, CUresult *rc)
{
    struct CUstream_st *s = capture_stream(stream);
    if (!s || !__atomic_load_n(&s->capture_id, __ATOMIC_ACQUIRE))
        return false;
    pthread_mutex_lock(&capture_lock);
    struct capture *c = capture_of(s);
    if (c && c->invalidated) {
        *rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    } else if (c) {
        struct fg_op op = {.type = FG_OP_GRAPH};
        *rc = graph_clone(exec->graph, &op.child, true);
        if (!*rc) {
            op.child->embedded = true;
            *rc = capture_add(c, s, &op);
            if (*rc)
                graph_free(op.child);
        }
    }
    pthread_mutex_unlock(&capture_lock);
    return c != NULL;
}

FG_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream)
{
    CUresult rc = need_context();
    if (rc)
        return rc;
    if (!exec)
        return CUDA_ERROR_INVALID_VALUE;
    if (capture_graph_launch(exec, stream, &rc))
        return rc;
    /* An allocation of the graph still live from an earlier launch: freed first with
     * auto-free-on-launch, else the launch fails (before doing anything). */
    pthread_mutex_lock(&capture_lock);
    for (size_t i = 0; i < exec->count && !rc; i++)
        if (exec->ops[i].type == FG_OP_MEM_ALLOC && exec->ops[i].mem->live)
            rc = exec->auto_free ? graph_mem_give_locked(exec->ops[i].mem)
                                 : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&capture_lock);
    for (size_t i = 0; i < exec->count && !rc; i++)
        rc = run_op(&exec->ops[i]);
    return rc;
}

static CUresult graph_pool_reserve(int dev, unsigned long long bytes);

/* An upload reserves the graph pool memory the graph's allocations will take at launch. */
FG_EXPORT CUresult cuGraphUpload(CUgraphExec exec, CUstream stream)
{
    if (!exec)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned long long wanted[FG_MAX_DEVICES] = {0};
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&capture_lock);
    for (size_t i = 0; i < exec->count; i++)
        if (exec->ops[i].type == FG_OP_MEM_ALLOC && !exec->ops[i].mem->live)
            wanted[exec->ops[i].mem->device] += exec->ops[i].mem->size;
    for (int dev = 0; dev < FG_MAX_DEVICES && !rc; dev++)
        if (wanted[dev])
            rc = graph_pool_reserve(dev, wanted[dev]);
    pthread_mutex_unlock(&capture_lock);
    return rc;
}

FG_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    if (!exec)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&capture_lock);
    for (size_t i = 0; i < exec->count; i++) {
        if (exec->ops[i].type == FG_OP_MEM_ALLOC)
            exec->ops[i].mem->execs--;
        if (exec->ops[i].mem)
            graph_mem_put(exec->ops[i].mem);
    }
    graph_free(exec->graph);
    pthread_mutex_unlock(&capture_lock);
    free(exec->ops);
    free(exec);
    return CUDA_SUCCESS;
}

/* NODES NULL: the count only; else up to *COUNT nodes, the rest of the array NULL, and the
 * graph's node count. */
FG_EXPORT CUresult cuGraphGetNodes(CUgraph graph, CUgraphNode *nodes, size_t *count)
{
    if (!graph || !count)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&capture_lock);
    if (nodes)
        for (size_t i = 0; i < *count; i++)
            nodes[i] = i < graph->count ? graph->nodes[i] : NULL;
    *count = graph->count;
    pthread_mutex_unlock(&capture_lock);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuGraphNodeGetType(CUgraphNode node, int *type)
{
    if (!node || !type)
        return CUDA_ERROR_INVALID_VALUE;
    static const int types[] = {[FG_OP_KERNEL] = 0, [FG_OP_COPY] = 1, [FG_OP_SET] = 2,
                                [FG_OP_HOST] = 3, [FG_OP_GRAPH] = 4, [FG_OP_EMPTY] = 5, [FG_OP_MEM_ALLOC] = 10,
                                [FG_OP_MEM_FREE] = 11};
    *type = types[node->op.type];
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- graph memory */

/* Each device's graph memory pool: bytes in live graph allocations (used), physical bytes the
 * pool holds and has charged to the device (reserved), and their high-water marks. */
static struct {
    unsigned long long used, used_high, reserved, reserved_high;
} graph_pool[FG_MAX_DEVICES];

static struct graph_mem *graph_mem_at(uint64_t base)
{
    for (struct graph_mem *m = graph_mems; m; m = m->next)
        if (m->base == base)
            return m;
    return NULL;
}

static void graph_mem_unlink(struct graph_mem *m)
{
    for (struct graph_mem **at = &graph_mems; *at; at = &(*at)->next)
        if (*at == m) {
            *at = m->next;
            break;
        }
    fg_unmap((void *)(uintptr_t)m->base, m->size);
    free(m);
}

static void graph_mem_put(struct graph_mem *m)
{
    if (--m->refs == 0 && !m->live)
        graph_mem_unlink(m);
}

/* Makes the device's graph pool hold BYTES more than its live allocations use, charging the
 * device for the difference; out of memory when the device cannot (after trimming the
 * stream-ordered pools, as an allocation does). */
static CUresult graph_pool_reserve(int dev, unsigned long long bytes)
{
    unsigned long long need = graph_pool[dev].used + bytes;
    if (need <= graph_pool[dev].reserved)
        return CUDA_SUCCESS;
    unsigned long long more = need - graph_pool[dev].reserved;
    if (!fg_charge(dev, more) && !(fg_pools_trim_device(dev) && fg_charge(dev, more)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    graph_pool[dev].reserved = need;
    if (need > graph_pool[dev].reserved_high)
        graph_pool[dev].reserved_high = need;
    return CUDA_SUCCESS;
}

static CUresult graph_mem_take(struct graph_mem *m)
{
    pthread_mutex_lock(&capture_lock);
    CUresult rc = m->live ? CUDA_ERROR_INVALID_VALUE : graph_pool_reserve(m->device, m->size);
    if (!rc) {
        struct fg_alloc a = {.base = m->base, .size = m->size, .kind = FG_GRAPH,
                             .device = m->device};
        if (!fg_register(&a)) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            m->live = true;
            graph_pool[m->device].used += m->size;
            if (graph_pool[m->device].used > graph_pool[m->device].used_high)
                graph_pool[m->device].used_high = graph_pool[m->device].used;
        }
    }
    pthread_mutex_unlock(&capture_lock);
    return rc;
}

/* The allocation's memory goes back to the graph pool (which keeps it). */
static CUresult graph_mem_give_locked(struct graph_mem *m)
{
    if (!m->live)
        return CUDA_ERROR_INVALID_VALUE;
    struct fg_alloc a;
    fg_unregister(m->base, FG_GRAPH, &a);
    m->live = false;
    graph_pool[m->device].used -= m->size;
    if (m->refs == 0)
        graph_mem_unlink(m);
    return CUDA_SUCCESS;
}

static CUresult graph_mem_give(struct graph_mem *m)
{
    pthread_mutex_lock(&capture_lock);
    CUresult rc = graph_mem_give_locked(m);
    pthread_mutex_unlock(&capture_lock);
    return rc;
}

CUresult fg_graph_mem_free(CUdeviceptr dptr)
{
    pthread_mutex_lock(&capture_lock);
    struct graph_mem *m = graph_mem_at(dptr);
    CUresult rc = m ? graph_mem_give_locked(m) : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&capture_lock);
    return rc;
}

/* A new graph allocation of SIZE bytes on DEV, its address fixed now; one reference (its
 * alloc node's). capture_lock held. */
static struct graph_mem *graph_mem_new(int dev, size_t size)
{
    uint64_t rounded = (size + FG_GRANULARITY - 1) / FG_GRANULARITY * FG_GRANULARITY;
    struct graph_mem *m = calloc(1, sizeof *m);
    void *p = m ? fg_map(rounded) : NULL;
    if (!p) {
        free(m);
        return NULL;
    }
    m->base = (uint64_t)(uintptr_t)p;
    m->size = rounded;
    m->device = dev;
    m->refs = 1;
    m->next = graph_mems;
    graph_mems = m;
    return m;
}

/* Adds a node for OP to GRAPH (capture_lock held); the node holds a reference to OP's graph
 * allocation. */
static CUresult graph_add_mem(CUgraph graph, struct fg_op *op, const CUgraphNode *deps,
                              const void *edges, size_t ndeps, CUgraphNode *added)
{
    CUresult rc = graph_add(graph, op, deps, edges, ndeps, added);
    if (rc && op->type == FG_OP_MEM_ALLOC)
        graph_mem_put(op->mem);
    else if (!rc && op->type == FG_OP_MEM_FREE)
        op->mem->refs++;
    return rc;
}

bool fg_capture_mem_alloc(CUstream stream, size_t size, CUdeviceptr *dptr, CUresult *rc)
{
    struct CUstream_st *s = capture_stream(stream);
    if (!s || !__atomic_load_n(&s->capture_id, __ATOMIC_ACQUIRE))
        return false;
    int dev;
    pthread_mutex_lock(&capture_lock);
    struct capture *c = capture_of(s);
    if (c && c->invalidated) {
        *rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    } else if (c && (!dptr || size == 0)) {
        *rc = CUDA_ERROR_INVALID_VALUE;
    } else if (c && (*rc = fg_current_device(&dev)) == CUDA_SUCCESS) {
        struct fg_op op = {.type = FG_OP_MEM_ALLOC, .bytes = size, .mem = graph_mem_new(dev, size)};
        *rc = !op.mem ? CUDA_ERROR_OUT_OF_MEMORY : capture_add(c, s, &op);
        if (!*rc)
            *dptr = op.mem->base;
    }
    pthread_mutex_unlock(&capture_lock);
    return c != NULL;
}

/* Only graph allocations become free nodes; other memory freed during a capture is freed at
 * once, as before. */
bool fg_capture_mem_free(CUstream stream, CUdeviceptr dptr, CUresult *rc)
{
    struct CUstream_st *s = capture_stream(stream);
    if (!s || !__atomic_load_n(&s->capture_id, __ATOMIC_ACQUIRE))
        return false;
    pthread_mutex_lock(&capture_lock);
    struct capture *c = capture_of(s);
    struct graph_mem *m = c ? graph_mem_at(dptr) : NULL;
    if (m) {
        struct fg_op op = {.type = FG_OP_MEM_FREE, .dst = dptr, .mem = m};
        *rc = c->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
                             : capture_add(c, s, &op);
    }
    pthread_mutex_unlock(&capture_lock);
    return m != NULL;
}

typedef struct {
    CUmemPoolProps poolProps;
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;

/* The node's allocation is on the device the pool properties name; its address is set in
 * PARAMS->dptr. */
FG_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph,
                                          const CUgraphNode *deps, size_t count,
                                          CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
    CUresult rc = need_context();
    if (rc)
        return rc;
    if (!node || !graph || !params || (count && !deps) || params->bytesize == 0 ||
        params->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !fg_valid_device(params->poolProps.location.id))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&capture_lock);
    struct fg_op op = {.type = FG_OP_MEM_ALLOC, .bytes = params->bytesize,
                       .mem = graph_mem_new(params->poolProps.location.id, params->bytesize)};
    rc = !op.mem ? CUDA_ERROR_OUT_OF_MEMORY : graph_add_mem(graph, &op, deps, NULL, count, node);
    if (!rc)
        params->dptr = op.mem->base;
    pthread_mutex_unlock(&capture_lock);
    return rc;
}

FG_EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph graph,
                                         const CUgraphNode *deps, size_t count, CUdeviceptr dptr)
{
    if (!node || !graph || (count && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&capture_lock);
    struct graph_mem *m = graph_mem_at(dptr);
    struct fg_op op = {.type = FG_OP_MEM_FREE, .dst = dptr, .mem = m};
    CUresult rc = m ? graph_add_mem(graph, &op, deps, NULL, count, node) : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&capture_lock);
    return rc;
}

FG_EXPORT CUresult cuGraphMemAllocNodeGetParams(CUgraphNode node,
                                                CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
    if (!node || !params || node->op.type != FG_OP_MEM_ALLOC)
        return CUDA_ERROR_INVALID_VALUE;
    memset(params, 0, sizeof *params);
    params->poolProps.allocType = 1; /* pinned */
    params->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    params->poolProps.location.id = node->op.mem->device;
    params->bytesize = node->op.bytes;
    params->dptr = node->op.mem->base;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuGraphMemFreeNodeGetParams(CUgraphNode node, CUdeviceptr *dptr)
{
    if (!node || !dptr || node->op.type != FG_OP_MEM_FREE)
        return CUDA_ERROR_INVALID_VALUE;
    *dptr = node->op.dst;
    return CUDA_SUCCESS;
}

/* Gives back the graph pool's memory no live graph allocation uses. */
/* The generic cuGraphAddNode's parameters (CUgraphNodeParams): the node type, the type's
 * parameters in a union at offset 16 (232 bytes; CUDA_MEM_ALLOC_NODE_PARAMS_v2 has the v1
 * layout), a reserved word. */
typedef struct {
    int type;
    int reserved0[3];
    union {
        long long reserved1[29];
        CUDA_MEM_ALLOC_NODE_PARAMS alloc;
        CUdeviceptr free_dptr; /* CUDA_MEM_FREE_NODE_PARAMS */
    };
    long long reserved2;
} fg_graph_node_params;
_Static_assert(sizeof(fg_graph_node_params) == 256, "CUgraphNodeParams is 256 bytes");

enum { NODE_TYPE_MEM_ALLOC = 10, NODE_TYPE_MEM_FREE = 11 };
static bool default_edges(const void *edges, size_t count);

/* Memory nodes only; another type is logged as unimplemented (once per entry point) and not
 * supported, as the generated stub did. Edges into a memory node carry default data only
 * (ports and the programmatic type are kernel nodes'). */
static CUresult add_node(int *logged, const char *name, CUgraphNode *node, CUgraph graph,
                         const CUgraphNode *deps, const void *edges, size_t count,
                         fg_graph_node_params *params)
{
    if (!params || ((params->type == NODE_TYPE_MEM_ALLOC || params->type == NODE_TYPE_MEM_FREE) &&
                    !default_edges(edges, count)))
        return CUDA_ERROR_INVALID_VALUE;
    switch (params->type) {
    case NODE_TYPE_MEM_ALLOC:
        return cuGraphAddMemAllocNode(node, graph, deps, count, &params->alloc);
    case NODE_TYPE_MEM_FREE:
        return cuGraphAddMemFreeNode(node, graph, deps, count, params->free_dptr);
    default:
        fg_log_unimplemented(logged, name);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
}

FG_EXPORT CUresult cuGraphAddNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                  size_t count, fg_graph_node_params *params)
{
    static int logged;
    return add_node(&logged, "cuGraphAddNode", node, graph, deps, NULL, count, params);
}

FG_EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                     const void *edges, size_t count,
                                     fg_graph_node_params *params)
{
    static int logged;
    return add_node(&logged, "cuGraphAddNode_v2", node, graph, deps, edges, count, params);
}

FG_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!fg_valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&capture_lock);
    fg_uncharge(dev, graph_pool[dev].reserved - graph_pool[dev].used);
    graph_pool[dev].reserved = graph_pool[dev].used;
    pthread_mutex_unlock(&capture_lock);
    return CUDA_SUCCESS;
}

/* CUgraphMem_attribute: 0 used current, 1 used high, 2 reserved current, 3 reserved high. */
FG_EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, int attribute, void *value)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!fg_valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!value || attribute < 0 || attribute > 3)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&capture_lock);
    unsigned long long values[] = {graph_pool[dev].used, graph_pool[dev].used_high,
                                   graph_pool[dev].reserved, graph_pool[dev].reserved_high};
    pthread_mutex_unlock(&capture_lock);
    *(unsigned long long *)value = values[attribute];
    return CUDA_SUCCESS;
}

/* Only the high-water marks may be set, and only to 0: they restart from the current value. */
FG_EXPORT CUresult cuDeviceSetGraphMemAttribute(CUdevice dev, int attribute, void *value)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!fg_valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!value || (attribute != 1 && attribute != 3) || *(unsigned long long *)value != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&capture_lock);
    if (attribute == 1)
        graph_pool[dev].used_high = graph_pool[dev].used;
    else
        graph_pool[dev].reserved_high = graph_pool[dev].reserved;
    pthread_mutex_unlock(&capture_lock);
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- graph structure */
/* Whether every one of COUNT CUgraphEdgeData entries (NULL: none) is the default edge. */
static bool default_edges(const void *edges, size_t count)
{
    for (size_t i = 0; i < count; i++)
        if (edge_at(edges, i))
            return false;
    return true;
}

/* Adds or removes COUNT edges FROM[i] -> TO[i] with data EDGES[i] (NULL: default). An edge
 * already there (whatever its data) cannot be added again; one removed must be there with that
 * data; data a node pair cannot carry (edge_valid) is refused; and, as documented, no edge is
 * removed from a graph with memory nodes. All 1 (CUDA_ERROR_INVALID_VALUE). */
static CUresult change_dependencies(CUgraph graph, const CUgraphNode *from, const CUgraphNode *to,
                                    const void *edges, size_t count, bool add)
{
    if (!graph || (count && (!from || !to)))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&capture_lock);
    for (size_t i = 0; !add && count && i < graph->count && !rc; i++)
        if (graph->nodes[i]->op.mem)
            rc = CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count && !rc; i++) {
        CUgraphNode f = from[i], t = to[i];
        uint64_t edge = edge_at(edges, i);
        if (!f || !t || f->graph != graph || t->graph != graph || f == t ||
            node_depends_on(t, f) != !add || (add && !edge_valid(f, &t->op, edge))) {
            rc = CUDA_ERROR_INVALID_VALUE;
        } else if (add) {
            rc = node_add_dep(t, f, edge);
        } else {
            for (size_t d = 0; d < t->ndeps; d++)
                if (t->deps[d] == f) {
                    if (t->dep_edges[d] != edge) {
                        rc = CUDA_ERROR_INVALID_VALUE;
                        break;
                    }
                    memmove(&t->deps[d], &t->deps[d + 1], (t->ndeps - d - 1) * sizeof *t->deps);
                    memmove(&t->dep_edges[d], &t->dep_edges[d + 1],
                            (t->ndeps - d - 1) * sizeof *t->dep_edges);
                    t->ndeps--;
                    break;
                }
        }
    }
    pthread_mutex_unlock(&capture_lock);
    return rc;
}

FG_EXPORT CUresult cuGraphAddDependencies(CUgraph graph, const CUgraphNode *from,
                                          const CUgraphNode *to, size_t count)
{
    return change_dependencies(graph, from, to, NULL, count, true);
}

FG_EXPORT CUresult cuGraphAddDependencies_v2(CUgraph graph, const CUgraphNode *from,
                                             const CUgraphNode *to, const void *edges,
                                             size_t count)
{
    return change_dependencies(graph, from, to, edges, count, true);
}

FG_EXPORT CUresult cuGraphRemoveDependencies(CUgraph graph, const CUgraphNode *from,
                                             const CUgraphNode *to, size_t count)
{
    return change_dependencies(graph, from, to, NULL, count, false);
}

FG_EXPORT CUresult cuGraphRemoveDependencies_v2(CUgraph graph, const CUgraphNode *from,
                                                const CUgraphNode *to, const void *edges,
                                                size_t count)
{
    return change_dependencies(graph, from, to, edges, count, false);
}

/* Writes EDGE as CUgraphEdgeData entry I of EDGES. */
static void edge_put(void *edges, size_t i, uint64_t edge)
{
    memcpy((unsigned char *)edges + 8 * i, &edge, 8);
}

/* FROM and TO NULL: the edge count; else up to *COUNT edges (by node in order of addition,
 * then dependency) with their data in EDGES, the rest NULL (and default data), and *COUNT the
 * edges returned. Without EDGES, an edge to return that carries data other than the default is
 * a lossy query (CUDA_ERROR_LOSSY_QUERY, nothing written), as documented. */
static CUresult graph_edges(CUgraph graph, CUgraphNode *from, CUgraphNode *to, void *edges,
                            size_t *count)
{
    if (!graph || !count || (!from != !to) || (edges && !from))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&capture_lock);
    size_t n = 0;
    bool lossy = false;
    for (size_t i = 0; i < graph->count; i++)
        for (size_t d = 0; d < graph->nodes[i]->ndeps; d++, n++)
            if (from && n < *count)
                lossy |= !edges && graph->nodes[i]->dep_edges[d];
    for (size_t i = 0, k = 0; from && !lossy && i < graph->count; i++)
        for (size_t d = 0; d < graph->nodes[i]->ndeps && k < *count; d++, k++) {
            from[k] = graph->nodes[i]->deps[d];
            to[k] = graph->nodes[i];
            if (edges)
                edge_put(edges, k, graph->nodes[i]->dep_edges[d]);
        }
    pthread_mutex_unlock(&capture_lock);
    if (lossy)
        return CUDA_ERROR_LOSSY_QUERY;
    if (from) {
        for (size_t k = n; k < *count; k++) {
            from[k] = to[k] = NULL;
            if (edges)
                edge_put(edges, k, 0);
        }
        if (n < *count)
            *count = n;
        return CUDA_SUCCESS;
    }
    *count = n;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuGraphGetEdges(CUgraph graph, CUgraphNode *from, CUgraphNode *to,
                                   size_t *count)
{
    return graph_edges(graph, from, to, NULL, count);
}

FG_EXPORT CUresult cuGraphGetEdges_v2(CUgraph graph, CUgraphNode *from, CUgraphNode *to,
                                      void *edges, size_t *count)
{
    return graph_edges(graph, from, to, edges, count);
}

/* NODES NULL: the count of roots (nodes with no dependency); else up to *COUNT of them. */
FG_EXPORT CUresult cuGraphGetRootNodes(CUgraph graph, CUgraphNode *nodes, size_t *count)
{
    if (!graph || !count)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&capture_lock);
    size_t n = 0;
    for (size_t i = 0; i < graph->count; i++)
        if (graph->nodes[i]->ndeps == 0) {
            if (nodes && n < *count)
                nodes[n] = graph->nodes[i];
            n++;
        }
    pthread_mutex_unlock(&capture_lock);
    if (nodes) {
        for (size_t k = n; k < *count; k++)
            nodes[k] = NULL;
        if (n < *count)
            *count = n;
        return CUDA_SUCCESS;
    }
    *count = n;
    return CUDA_SUCCESS;
}

/* DEPS NULL: the dependency count; else up to *COUNT dependencies with their edge data in
 * EDGES, the rest NULL; without EDGES, one with data other than the default is a lossy query
 * (CUDA_ERROR_LOSSY_QUERY, nothing written). */
static CUresult node_dependencies(CUgraphNode node, CUgraphNode *deps, void *edges,
                                  size_t *count)
{
    if (!node || !count || (edges && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&capture_lock);
    size_t n = node->ndeps;
    bool lossy = false;
    for (size_t i = 0; deps && !edges && i < *count && i < n; i++)
        lossy |= node->dep_edges[i] != 0;
    for (size_t i = 0; deps && !lossy && i < *count; i++) {
        deps[i] = i < n ? node->deps[i] : NULL;
        if (edges)
            edge_put(edges, i, i < n ? node->dep_edges[i] : 0);
    }
    pthread_mutex_unlock(&capture_lock);
    if (lossy)
        return CUDA_ERROR_LOSSY_QUERY;
    if (!deps || n < *count)
        *count = n;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuGraphNodeGetDependencies(CUgraphNode node, CUgraphNode *deps, size_t *count)
{
    return node_dependencies(node, deps, NULL, count);
}

FG_EXPORT CUresult cuGraphNodeGetDependencies_v2(CUgraphNode node, CUgraphNode *deps,
                                                 void *edges, size_t *count)
{
    return node_dependencies(node, deps, edges, count);
}

/* DEPENDENTS NULL: the count of nodes that depend on NODE (edges out of it); else up to
 * *COUNT of them (in order of addition) with the edges' data in EDGES, the rest NULL; without
 * EDGES, one with data other than the default is a lossy query (CUDA_ERROR_LOSSY_QUERY,
 * nothing written). */
static CUresult node_dependents(CUgraphNode node, CUgraphNode *dependents, void *edges,
                                size_t *count)
{
    if (!node || !count || (edges && !dependents))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&capture_lock);
    CUgraph graph = node->graph;
    size_t n = 0;
    bool lossy = false;
    for (int pass = dependents ? 0 : 1; pass < 2 && !lossy; pass++) {
        n = 0;
        for (size_t i = 0; i < graph->count; i++)
            for (size_t d = 0; d < graph->nodes[i]->ndeps; d++) {
                if (graph->nodes[i]->deps[d] != node)
                    continue;
                uint64_t edge = graph->nodes[i]->dep_edges[d];
                if (pass == 0 && n < *count)
                    lossy |= !edges && edge;
                else if (pass == 1 && dependents && n < *count) {
                    dependents[n] = graph->nodes[i];
                    if (edges)
                        edge_put(edges, n, edge);
                }
                n++;
            }
    }
    pthread_mutex_unlock(&capture_lock);
    if (lossy)
        return CUDA_ERROR_LOSSY_QUERY;
    for (size_t k = n; dependents && k < *count; k++) {
        dependents[k] = NULL;
        if (edges)
            edge_put(edges, k, 0);
    }
    if (!dependents || n < *count)
        *count = n;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuGraphNodeGetDependentNodes(CUgraphNode node, CUgraphNode *dependents,
                                                size_t *count)
{
    return node_dependents(node, dependents, NULL, count);
}

FG_EXPORT CUresult cuGraphNodeGetDependentNodes_v2(CUgraphNode node, CUgraphNode *dependents,
                                                   void *edges, size_t *count)
{
    return node_dependents(node, dependents, edges, count);
}

/* A copy of the nodes and edges (graph_clone). */
FG_EXPORT CUresult cuGraphClone(CUgraph *clone, CUgraph original)
{
    if (!clone || !original)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&capture_lock);
    CUresult rc = graph_clone(original, clone, false);
    pthread_mutex_unlock(&capture_lock);
    return rc;
}

/* CUgraphExecUpdateResult values. */
enum { UPDATE_SUCCESS = 0, UPDATE_ERROR = 1, UPDATE_TOPOLOGY_CHANGED = 2,
       UPDATE_NODE_TYPE_CHANGED = 3, UPDATE_NOT_SUPPORTED = 6 };

typedef struct {
    int result;
    CUgraphNode errorNode, errorFromNode;
} CUgraphExecUpdateResultInfo;

/* Compares GRAPH with OLD, the executable graph's copy of the graph it was made from, as
 * cuGraphExecUpdate's documentation lists: a different count of nodes directly in the graph
 * (topology changed, no error node; inside a child graph the child graph node of GRAPH is
 * named), a memory node (not supported, the node), a node of another type (type changed, the
 * node), a node with another number of dependencies (topology changed, the node) or another
 * dependency or edge data (topology changed, the node and that dependency); nodes are paired
 * in order of addition, and child graphs compared the same way, node by node, after their
 * parents' edges. capture_lock held. */
static int update_compare(CUgraph old, CUgraph graph, CUgraphNode parent,
                          CUgraphExecUpdateResultInfo *info)
{
    if (graph->count != old->count) {
        info->errorNode = parent;
        return UPDATE_TOPOLOGY_CHANGED;
    }
    for (size_t i = 0; i < graph->count; i++) {
        CUgraphNode node = graph->nodes[i], paired = old->nodes[i];
        info->errorNode = node;
        if (node->op.mem || paired->op.mem)
            return UPDATE_NOT_SUPPORTED;
        if (node->op.type != paired->op.type)
            return UPDATE_NODE_TYPE_CHANGED;
    }
    for (size_t i = 0; i < graph->count; i++) {
        CUgraphNode node = graph->nodes[i], paired = old->nodes[i];
        info->errorNode = node;
        if (node->ndeps != paired->ndeps)
            return UPDATE_TOPOLOGY_CHANGED;
        for (size_t d = 0; d < node->ndeps; d++)
            if (node->deps[d]->index != paired->deps[d]->index ||
                node->dep_edges[d] != paired->dep_edges[d]) {
                info->errorFromNode = node->deps[d];
                return UPDATE_TOPOLOGY_CHANGED;
            }
    }
    info->errorNode = NULL;
    for (size_t i = 0; i < graph->count; i++) {
        if (graph->nodes[i]->op.type != FG_OP_GRAPH)
            continue;
        int result = update_compare(old->nodes[i]->op.child, graph->nodes[i]->op.child,
                                    graph->nodes[i], info);
        if (result)
            return result;
    }
    return UPDATE_SUCCESS;
}

/* The executable graph takes GRAPH's operations when GRAPH has the instantiated graph's shape
 * (update_compare); else CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE and the reason. */
FG_EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec exec, CUgraph graph,
                                        CUgraphExecUpdateResultInfo *info)
{
    if (!exec || !graph || !info)
        return CUDA_ERROR_INVALID_VALUE;
    info->result = UPDATE_SUCCESS;
    info->errorNode = info->errorFromNode = NULL;
    struct fg_op *ops = NULL;
    size_t nops = 0, capacity = 0;
    CUgraph copy = NULL, replaced = NULL;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&capture_lock);
    info->result = update_compare(exec->graph, graph, NULL, info);
    if (!info->result) {
        if (!graph_flatten(graph, &ops, &nops, &capacity))
            rc = CUDA_ERROR_OUT_OF_MEMORY; /* no cycle: the shape is the instantiated one */
        else
            rc = graph_clone(graph, &copy, false);
        if (!rc) {
            replaced = exec->graph;
            exec->graph = copy;
            free(exec->ops);
            exec->ops = ops;
            exec->count = nops;
            ops = NULL;
            graph_free(replaced);
        }
    }
    pthread_mutex_unlock(&capture_lock);
    free(ops);
    if (rc)
        return rc;
    return info->result ? CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE : CUDA_SUCCESS;
}

/* CUDA 11's entry point: the error node and the result apart. */
FG_EXPORT CUresult cuGraphExecUpdate(CUgraphExec exec, CUgraph graph, CUgraphNode *error_node,
                                     int *result)
{
    CUgraphExecUpdateResultInfo info = {0, NULL, NULL};
    CUresult rc = cuGraphExecUpdate_v2(exec, graph, &info);
    if (error_node)
        *error_node = info.errorNode;
    if (result)
        *result = info.result;
    return rc;
}

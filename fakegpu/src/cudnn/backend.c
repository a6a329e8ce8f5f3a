/* The fake cuDNN 9 backend API (cudnnBackend*), as cudnn-frontend and so PyTorch use it for
 * convolutions and attention. A descriptor keeps every attribute set on it; a get returns what
 * was set, or for the attributes cuDNN computes (heuristics results, engines, workspace sizes)
 * what a GPU with two engines per operation graph would say:
 *   engine 0: the workspace of an im2col lowering of one image, for a convolution (the input
 *             channels x filter window x output positions of one image, in the input's type:
 *             the buffer of cuDNN's GEMM-based algorithms), 0 for other graphs;
 *   engine 1: no workspace (what PyTorch falls back to when engine 0's workspace does not fit).
 * Executing a plan takes engine 0 1 ms of the fake GPU's clock and engine 1 2 ms (a GEMM over
 * its workspace being the faster), so that cudnn.benchmark, which times every plan and keeps
 * them fastest first, ranks them the same way in every run; engines that took the same time
 * would count as one (cudnn-frontend's time_sorted_plan keeps them in a std::set ordered by
 * time).
 * Otherwise executing a plan does nothing, like every kernel on the fake GPU. Descriptors filled by a get
 * (the caller creates them) receive a copy of the attributes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fakegpu_log.h"
#include "cudnn_status.h"

#define FG_EXPORT __attribute__((visibility("default")))

/* Descriptor types (cudnnBackendDescriptorType_t) the fake computes something for. */
enum {
    DESC_ENGINE = 2,
    DESC_ENGINECFG = 3,
    DESC_ENGINEHEUR = 4,
    DESC_EXECUTION_PLAN = 5,
    DESC_OP_CONV_FORWARD = 10,
    DESC_OP_CONV_BACKWARD_FILTER = 11,
    DESC_OP_CONV_BACKWARD_DATA = 12,
    DESC_OPERATIONGRAPH = 15,
    DESC_TENSOR = 17,
};

/* Attribute names (cudnnBackendAttributeName_t). */
enum {
    ATTR_ENGINEHEUR_OPERATION_GRAPH = 201,
    ATTR_ENGINEHEUR_RESULTS = 202,
    ATTR_ENGINECFG_ENGINE = 300,
    ATTR_ENGINECFG_INTERMEDIATE_INFO = 301,
    ATTR_ENGINECFG_KNOB_CHOICES = 302,
    ATTR_ENGINECFG_WORKSPACE_SIZE = 303,
    ATTR_ENGINECFG_SHARED_MEMORY_USED = 304,
    ATTR_EXECUTION_PLAN_ENGINE_CONFIG = 401,
    ATTR_EXECUTION_PLAN_WORKSPACE_SIZE = 402,
    ATTR_EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS = 403,
    ATTR_EXECUTION_PLAN_RUN_ONLY_INTERMEDIATE_UIDS = 404,
    ATTR_EXECUTION_PLAN_JSON_REPRESENTATION = 405,
    ATTR_CONV_FORWARD_W = 703,
    ATTR_CONV_FORWARD_X = 704,
    ATTR_CONV_FORWARD_Y = 705,
    ATTR_CONV_BWD_DATA_W = 709,
    ATTR_CONV_BWD_DATA_DX = 710,
    ATTR_CONV_BWD_DATA_DY = 711,
    ATTR_CONV_BWD_FILTER_DW = 715,
    ATTR_CONV_BWD_FILTER_X = 716,
    ATTR_CONV_BWD_FILTER_DY = 717,
    ATTR_OPERATIONGRAPH_OPS = 801,
    ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT = 802,
    ATTR_TENSOR_DATA_TYPE = 901,
    ATTR_TENSOR_DIMENSIONS = 902,
    ATTR_ENGINE_OPERATION_GRAPH = 1300,
    ATTR_ENGINE_GLOBAL_INDEX = 1301,
    ATTR_ENGINE_KNOB_INFO = 1302,
    ATTR_ENGINE_NUMERICAL_NOTE = 1303,
    ATTR_ENGINE_LAYOUT_INFO = 1304,
    ATTR_ENGINE_BEHAVIOR_NOTE = 1305,
    ATTR_ENGINE_SM_COUNT_TARGET = 1306,
};

/* Attribute value types (cudnnBackendAttributeType_t) whose elements are not 4 bytes. */
enum {
    TYPE_HANDLE = 0,
    TYPE_BOOLEAN = 2,
    TYPE_INT64 = 3,
    TYPE_DOUBLE = 5,
    TYPE_VOID_PTR = 6,
    TYPE_BACKEND_DESCRIPTOR = 15,
    TYPE_CHAR = 24,
    TYPE_FRACTION = 26,
};

/* Engines the fake offers for every operation graph. */
#define ENGINE_COUNT 2
/* The time each takes to execute (see above). */
#define ENGINE0_NS 1000000ull
#define ENGINE1_NS 2000000ull
/* Advances the fake GPU's clock (the fake driver's; not an NVIDIA symbol). */
void vramshim_fakegpu_device_work(unsigned long long ns);
/* cuDNN's kernels, charged once per device (cudnn.c). */
cudnnStatus_t fg_cudnn_load_kernels(void);
#define MAGIC 0x66616b65636e6e64ull /* "fakecnnd" */

struct attribute {
    int name, type;
    int64_t count;
    struct attribute *next;
    unsigned char bytes[];
};

struct descriptor {
    uint64_t magic;
    int kind;
    int finalized;
    struct attribute *attributes;
    /* Computed at finalize, so that nothing the caller may have destroyed since is read:
     * an operation graph's engine-0 workspace; an engine's (or config's, plan's) index and
     * workspace. */
    int64_t im2col_bytes;
    int64_t engine_index;
    int64_t workspace;
};

static size_t element_size(int type)
{
    switch (type) {
    case TYPE_HANDLE:
    case TYPE_INT64:
    case TYPE_DOUBLE:
    case TYPE_VOID_PTR:
    case TYPE_BACKEND_DESCRIPTOR: return 8;
    case TYPE_BOOLEAN:
    case TYPE_CHAR: return 1;
    case TYPE_FRACTION: return 16;
    default: return 4;
    }
}

static struct descriptor *checked(void *handle)
{
    struct descriptor *d = handle;
    return d && d->magic == MAGIC ? d : NULL;
}

static struct attribute *find(const struct descriptor *d, int name)
{
    for (struct attribute *a = d->attributes; a; a = a->next)
        if (a->name == name)
            return a;
    return NULL;
}

static void drop_attributes(struct descriptor *d)
{
    struct attribute *a = d->attributes;
    while (a) {
        struct attribute *next = a->next;
        free(a);
        a = next;
    }
    d->attributes = NULL;
}

static cudnnStatus_t store(struct descriptor *d, int name, int type, int64_t count,
                           const void *values)
{
    if (count < 0 || count > (1 << 20))
        return CUDNN_STATUS_BAD_PARAM;
    size_t bytes = element_size(type) * (size_t)count;
    struct attribute *a = malloc(sizeof *a + bytes);
    if (!a)
        return CUDNN_STATUS_ALLOC_FAILED;
    a->name = name;
    a->type = type;
    a->count = count;
    if (bytes)
        memcpy(a->bytes, values, bytes);
    /* Replace an earlier value of the same attribute. */
    struct attribute **link = &d->attributes;
    while (*link && (*link)->name != name)
        link = &(*link)->next;
    a->next = *link ? (*link)->next : NULL;
    free(*link);
    *link = a;
    return CUDNN_STATUS_SUCCESS;
}

/* Makes DST a copy of SRC (its attributes and computed figures), as cuDNN fills a descriptor
 * the caller passed to a get. */
static cudnnStatus_t copy_into(struct descriptor *dst, const struct descriptor *src)
{
    if (dst == src)
        return CUDNN_STATUS_SUCCESS;
    drop_attributes(dst);
    for (const struct attribute *a = src->attributes; a; a = a->next) {
        cudnnStatus_t status = store(dst, a->name, a->type, a->count, a->bytes);
        if (status)
            return status;
    }
    dst->finalized = src->finalized;
    dst->im2col_bytes = src->im2col_bytes;
    dst->engine_index = src->engine_index;
    dst->workspace = src->workspace;
    return CUDNN_STATUS_SUCCESS;
}

static struct descriptor *descriptor_attribute(const struct descriptor *d, int name, int64_t i)
{
    const struct attribute *a = find(d, name);
    if (!a || a->type != TYPE_BACKEND_DESCRIPTOR || i >= a->count)
        return NULL;
    void *handle;
    memcpy(&handle, a->bytes + 8 * i, 8);
    return checked(handle);
}

static int64_t data_type_size(int type)
{
    switch (type) {
    case 1: case 10: return 8;         /* double, int64 */
    case 2: case 9: return 2;          /* half, bfloat16 */
    case 3: case 6: case 11: case 12: case 13: return 1; /* int8, uint8, bool, fp8 */
    default: return 4;
    }
}

/* Dimensions of a tensor descriptor: how many (at most 8) into DIMS. */
static int tensor_dims(const struct descriptor *tensor, int64_t dims[8], int64_t *element)
{
    const struct attribute *a = tensor ? find(tensor, ATTR_TENSOR_DIMENSIONS) : NULL;
    if (!a || a->type != TYPE_INT64 || a->count < 3 || a->count > 8)
        return 0;
    memcpy(dims, a->bytes, 8 * a->count);
    const struct attribute *t = find(tensor, ATTR_TENSOR_DATA_TYPE);
    int type = 0;
    if (t && t->count == 1)
        memcpy(&type, t->bytes, 4);
    *element = data_type_size(type);
    return (int)a->count;
}

/* One image's im2col matrix for a convolution: W = [K, C/groups, R, S...], Y = [N, K, P, Q...],
 * C/groups x R x S x P x Q elements of X's type. */
static int64_t im2col_bytes(const struct descriptor *op)
{
    int x_attr, w_attr, y_attr;
    switch (op->kind) {
    case DESC_OP_CONV_FORWARD:
        x_attr = ATTR_CONV_FORWARD_X, w_attr = ATTR_CONV_FORWARD_W, y_attr = ATTR_CONV_FORWARD_Y;
        break;
    case DESC_OP_CONV_BACKWARD_DATA:
        x_attr = ATTR_CONV_BWD_DATA_DX, w_attr = ATTR_CONV_BWD_DATA_W,
        y_attr = ATTR_CONV_BWD_DATA_DY;
        break;
    case DESC_OP_CONV_BACKWARD_FILTER:
        x_attr = ATTR_CONV_BWD_FILTER_X, w_attr = ATTR_CONV_BWD_FILTER_DW,
        y_attr = ATTR_CONV_BWD_FILTER_DY;
        break;
    default: return 0;
    }
    int64_t x[8], w[8], y[8], element, ignored;
    int xn = tensor_dims(descriptor_attribute(op, x_attr, 0), x, &element);
    int wn = tensor_dims(descriptor_attribute(op, w_attr, 0), w, &ignored);
    int yn = tensor_dims(descriptor_attribute(op, y_attr, 0), y, &ignored);
    if (!xn || wn != yn)
        return 0;
    int64_t bytes = element;
    for (int i = 1; i < wn; i++)
        bytes *= w[i];
    for (int i = 2; i < yn; i++)
        bytes *= y[i];
    return bytes > 0 ? bytes : 0;
}

static int64_t graph_im2col_bytes(const struct descriptor *graph)
{
    const struct attribute *ops = find(graph, ATTR_OPERATIONGRAPH_OPS);
    int64_t largest = 0;
    for (int64_t i = 0; ops && i < ops->count; i++) {
        const struct descriptor *op = descriptor_attribute(graph, ATTR_OPERATIONGRAPH_OPS, i);
        int64_t bytes = op ? im2col_bytes(op) : 0;
        largest = bytes > largest ? bytes : largest;
    }
    return largest;
}

static int64_t engine_workspace(int64_t index, int64_t im2col)
{
    return index == 0 ? im2col : 0;
}

FG_EXPORT cudnnStatus_t cudnnBackendCreateDescriptor(int kind, void **handle)
{
    if (!handle)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    struct descriptor *d = calloc(1, sizeof *d);
    if (!d)
        return CUDNN_STATUS_ALLOC_FAILED;
    d->magic = MAGIC;
    d->kind = kind;
    *handle = d;
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnBackendDestroyDescriptor(void *handle)
{
    struct descriptor *d = checked(handle);
    if (!d)
        return CUDNN_STATUS_BAD_PARAM;
    drop_attributes(d);
    d->magic = 0;
    free(d);
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnBackendInitialize(void *handle)
{
    struct descriptor *d = checked(handle);
    if (!d)
        return CUDNN_STATUS_BAD_PARAM;
    drop_attributes(d);
    d->finalized = 0;
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnBackendSetAttribute(void *handle, int name, int type, int64_t count,
                                                 const void *values)
{
    struct descriptor *d = checked(handle);
    if (!d)
        return CUDNN_STATUS_BAD_PARAM;
    if (count > 0 && !values)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    return store(d, name, type, count, values);
}

FG_EXPORT cudnnStatus_t cudnnBackendFinalize(void *handle)
{
    struct descriptor *d = checked(handle);
    if (!d)
        return CUDNN_STATUS_BAD_PARAM;
    const struct descriptor *from;
    switch (d->kind) {
    case DESC_OPERATIONGRAPH:
        d->im2col_bytes = graph_im2col_bytes(d);
        break;
    case DESC_ENGINEHEUR:
        if (!(from = descriptor_attribute(d, ATTR_ENGINEHEUR_OPERATION_GRAPH, 0)))
            return CUDNN_STATUS_BAD_PARAM;
        d->im2col_bytes = from->im2col_bytes;
        break;
    case DESC_ENGINE: {
        const struct attribute *index = find(d, ATTR_ENGINE_GLOBAL_INDEX);
        if (!(from = descriptor_attribute(d, ATTR_ENGINE_OPERATION_GRAPH, 0)) || !index)
            return CUDNN_STATUS_BAD_PARAM;
        memcpy(&d->engine_index, index->bytes, 8);
        if (d->engine_index < 0 || d->engine_index >= ENGINE_COUNT)
            return CUDNN_STATUS_NOT_SUPPORTED;
        d->im2col_bytes = from->im2col_bytes;
        d->workspace = engine_workspace(d->engine_index, d->im2col_bytes);
        break;
    }
    case DESC_ENGINECFG:
        if (!(from = descriptor_attribute(d, ATTR_ENGINECFG_ENGINE, 0)))
            return CUDNN_STATUS_BAD_PARAM;
        d->engine_index = from->engine_index;
        d->im2col_bytes = from->im2col_bytes;
        d->workspace = from->workspace;
        break;
    case DESC_EXECUTION_PLAN:
        if (!(from = descriptor_attribute(d, ATTR_EXECUTION_PLAN_ENGINE_CONFIG, 0)))
            return CUDNN_STATUS_BAD_PARAM;
        d->engine_index = from->engine_index;
        d->im2col_bytes = from->im2col_bytes;
        d->workspace = from->workspace;
        break;
    default:
        break;
    }
    d->finalized = 1;
    return CUDNN_STATUS_SUCCESS;
}

/* The count a get reports: how many there are when the caller asks for none, else how many it
 * received (cudnn-frontend resizes its result list to that). */
static int64_t reported(int64_t available, int64_t requested)
{
    return requested > 0 && requested < available ? requested : available;
}

/* Answers a get with COUNT computed int64 values. */
static cudnnStatus_t give_int64(const int64_t *values, int64_t count, int type, int64_t requested,
                                int64_t *element_count, void *out)
{
    if (type != TYPE_INT64)
        return CUDNN_STATUS_BAD_PARAM;
    if (element_count)
        *element_count = reported(count, requested);
    if (requested > 0 && !out)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    for (int64_t i = 0; i < count && i < requested; i++)
        ((int64_t *)out)[i] = values[i];
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t give_none(int64_t *element_count)
{
    if (element_count)
        *element_count = 0;
    return CUDNN_STATUS_SUCCESS;
}

/* Fills the caller's engine descriptor OUT with engine INDEX of GRAPH's heuristics. */
static cudnnStatus_t make_engine(struct descriptor *out, const struct descriptor *source,
                                 const void *graph_handle, int64_t index)
{
    drop_attributes(out);
    cudnnStatus_t status = store(out, ATTR_ENGINE_OPERATION_GRAPH, TYPE_BACKEND_DESCRIPTOR, 1,
                                 &graph_handle);
    if (!status)
        status = store(out, ATTR_ENGINE_GLOBAL_INDEX, TYPE_INT64, 1, &index);
    out->engine_index = index;
    out->im2col_bytes = source->im2col_bytes;
    out->workspace = engine_workspace(index, source->im2col_bytes);
    out->finalized = 1;
    return status;
}

FG_EXPORT cudnnStatus_t cudnnBackendGetAttribute(void *handle, int name, int type,
                                                 int64_t requested, int64_t *element_count,
                                                 void *out)
{
    struct descriptor *d = checked(handle);
    if (!d)
        return CUDNN_STATUS_BAD_PARAM;
    if (requested < 0)
        return CUDNN_STATUS_BAD_PARAM;
    switch (name) {
    case ATTR_ENGINEHEUR_RESULTS: {
        /* Engine configs, into descriptors the caller created. */
        const struct attribute *graph = find(d, ATTR_ENGINEHEUR_OPERATION_GRAPH);
        if (d->kind != DESC_ENGINEHEUR || !d->finalized || !graph)
            return CUDNN_STATUS_NOT_INITIALIZED;
        if (requested > 0 && !out)
            return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
        void *graph_handle;
        memcpy(&graph_handle, graph->bytes, 8);
        if (element_count)
            *element_count = reported(ENGINE_COUNT, requested);
        for (int64_t i = 0; i < ENGINE_COUNT && i < requested; i++) {
            struct descriptor *config = checked(((void **)out)[i]);
            void *engine_handle;
            if (!config || cudnnBackendCreateDescriptor(DESC_ENGINE, &engine_handle))
                return CUDNN_STATUS_BAD_PARAM;
            cudnnStatus_t status = make_engine(engine_handle, d, graph_handle, i);
            drop_attributes(config);
            if (!status)
                status = store(config, ATTR_ENGINECFG_ENGINE, TYPE_BACKEND_DESCRIPTOR, 1,
                               &engine_handle);
            /* The engine made here lives as long as the process: copies of the config (a
             * plan's) may point to it after the config itself is gone. */
            config->engine_index = i;
            config->im2col_bytes = d->im2col_bytes;
            config->workspace = engine_workspace(i, d->im2col_bytes);
            config->finalized = 1;
            if (status)
                return status;
        }
        return CUDNN_STATUS_SUCCESS;
    }
    case ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT:
        if (d->kind == DESC_OPERATIONGRAPH) {
            int64_t count = ENGINE_COUNT;
            return give_int64(&count, 1, type, requested, element_count, out);
        }
        break;
    case ATTR_ENGINECFG_WORKSPACE_SIZE:
    case ATTR_EXECUTION_PLAN_WORKSPACE_SIZE:
        if (d->kind == DESC_ENGINECFG || d->kind == DESC_EXECUTION_PLAN)
            return give_int64(&d->workspace, 1, type, requested, element_count, out);
        break;
    case ATTR_ENGINECFG_SHARED_MEMORY_USED: {
        int64_t none = 0;
        return give_int64(&none, 1, type, requested, element_count, out);
    }
    case ATTR_ENGINE_GLOBAL_INDEX:
        if (d->kind == DESC_ENGINE)
            return give_int64(&d->engine_index, 1, type, requested, element_count, out);
        break;
    default:
        break;
    }
    const struct attribute *a = find(d, name);
    if (!a) {
        /* Lists the fake engines do not have: no knobs, notes, layouts or intermediates. */
        switch (name) {
        case ATTR_ENGINECFG_INTERMEDIATE_INFO:
        case ATTR_ENGINECFG_KNOB_CHOICES:
        case ATTR_EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS:
        case ATTR_EXECUTION_PLAN_RUN_ONLY_INTERMEDIATE_UIDS:
        case ATTR_ENGINE_KNOB_INFO:
        case ATTR_ENGINE_NUMERICAL_NOTE:
        case ATTR_ENGINE_LAYOUT_INFO:
        case ATTR_ENGINE_BEHAVIOR_NOTE:
            return give_none(element_count);
        case ATTR_EXECUTION_PLAN_JSON_REPRESENTATION: {
            static const char json[] = "{}";
            if (element_count)
                *element_count = sizeof json;
            if (out && requested > 0)
                memcpy(out, json, (size_t)requested < sizeof json ? (size_t)requested
                                                                    : sizeof json);
            return CUDNN_STATUS_SUCCESS;
        }
        default: {
            static int logged;
            fg_log_unimplemented(&logged, "cudnnBackendGetAttribute of an attribute not set");
            return CUDNN_STATUS_NOT_SUPPORTED;
        }
        }
    }
    if (element_count)
        *element_count = reported(a->count, requested);
    if (requested > 0 && !out)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    int64_t n = a->count < requested ? a->count : requested;
    if (a->type == TYPE_BACKEND_DESCRIPTOR && type == TYPE_BACKEND_DESCRIPTOR) {
        for (int64_t i = 0; i < n; i++) {
            struct descriptor *dst = checked(((void **)out)[i]);
            struct descriptor *src = descriptor_attribute(d, name, i);
            if (!dst || !src)
                return CUDNN_STATUS_BAD_PARAM;
            cudnnStatus_t status = copy_into(dst, src);
            if (status)
                return status;
        }
        return CUDNN_STATUS_SUCCESS;
    }
    if (element_size(type) != element_size(a->type))
        return CUDNN_STATUS_BAD_PARAM;
    if (n > 0)
        memcpy(out, a->bytes, element_size(a->type) * (size_t)n);
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnBackendExecute(void *handle, void *plan, void *variant_pack)
{
    if (!handle)
        return CUDNN_STATUS_NOT_INITIALIZED;
    struct descriptor *p = checked(plan), *v = checked(variant_pack);
    if (!p || !v || p->kind != DESC_EXECUTION_PLAN || !p->finalized)
        return CUDNN_STATUS_BAD_PARAM;
    /* At a device's first execution, not at cudnnCreate: what was measured is a convolution's
     * kernels, which a real driver loads at their first launch, and PyTorch makes handles for
     * cuDNN work that runs no graph (batch norm). Any graph's first execution is charged the
     * same (other graphs' kernels, attention's, were not measured). */
    cudnnStatus_t loaded = fg_cudnn_load_kernels();
    if (loaded)
        return loaded;
    vramshim_fakegpu_device_work(p->engine_index == 0 ? ENGINE0_NS : ENGINE1_NS);
    return CUDNN_STATUS_SUCCESS;
}

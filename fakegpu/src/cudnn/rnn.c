/* The fake cuDNN's RNN API (cuDNN 8's "v8" functions, the only RNN API cuDNN 9 has, and in
 * libcudnn.so.8 cuDNN 8's older v6/v7 functions), what PyTorch's nn.LSTM, nn.GRU and nn.RNN
 * call on CUDA: RNN, RNN data and dropout descriptors that keep what is set on them, the
 * weight space (its size and where each matrix and bias lies in it), the work and reserve
 * space sizes, and dropout's state and mask sizes. The forward and backward passes themselves
 * are in noop.txt: they complete at once, like every kernel on the fake GPU.
 *
 * The weight space is laid out as cuDNN 9.19 lays it out on an H200 (its size and every
 * matrix's and bias's place and shape measured by scripts/cudnn_rnn_probe.py for twelve
 * networks): the matrices of every pseudo-layer (layer x direction) in turn, each pseudo-layer's
 * input matrices of every gate, then its recurrent matrices, then its projection; after all of
 * them the biases, each pseudo-layer's input biases then its recurrent biases; packed. PyTorch
 * checks that each gate follows the previous one and views its parameters into this space.
 * The work and reserve spaces are estimates fitted to the same measurements (README,
 * "Fake GPU"). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "fakegpu_library_memory.h"
#include "cudnn_legacy.h"

CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice device);

#define FG_EXPORT __attribute__((visibility("default")))

/* cudnnRNNMode_t, cudnnRNNBiasMode_t, cudnnDirectionMode_t, cudnnRNNInputMode_t,
 * cudnnForwardMode_t (cudnn_adv.h). */
enum { RNN_RELU = 0, RNN_TANH = 1, LSTM = 2, GRU = 3 };
enum { NO_BIAS = 0, SINGLE_INP_BIAS = 1, DOUBLE_BIAS = 2, SINGLE_REC_BIAS = 3 };
enum { UNIDIRECTIONAL = 0, BIDIRECTIONAL = 1 };
enum { LINEAR_INPUT = 0, SKIP_INPUT = 1 };
enum { FWD_MODE_INFERENCE = 0, FWD_MODE_TRAINING = 1 };

struct rnn_descriptor {
    int set;
    int algo, cell_mode, bias_mode, direction, input_mode, data_type, math_precision;
    int input_size, hidden_size, projection_size, layers;
    float dropout; /* the probability of its dropout descriptor when set */
};

/* A dropout descriptor: what was set on it. */
struct dropout_descriptor {
    float probability;
    void *states;
    unsigned long long seed;
};

struct rnn_data_descriptor {
    int set;
    int data_type, layout, max_sequence, batch, vector_size;
};

/* Bytes of one element of cudnnDataType_t `type`; 0 for a type RNNs do not take. */
static size_t element_bytes(int type)
{
    switch (type) {
    case 0: return 4;  /* FLOAT */
    case 1: return 8;  /* DOUBLE */
    case 2: return 2;  /* HALF */
    case 3: return 1;  /* INT8 */
    case 9: return 2;  /* BFLOAT16 */
    default: return 0;
    }
}

FG_EXPORT cudnnStatus_t cudnnCreateRNNDescriptor(struct rnn_descriptor **d)
{
    if (!d)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *d = calloc(1, sizeof **d);
    return *d ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_ALLOC_FAILED;
}

FG_EXPORT cudnnStatus_t cudnnDestroyRNNDescriptor(struct rnn_descriptor *d)
{
    free(d);
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnCreateRNNDataDescriptor(struct rnn_data_descriptor **d)
{
    if (!d)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *d = calloc(1, sizeof **d);
    return *d ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_ALLOC_FAILED;
}

FG_EXPORT cudnnStatus_t cudnnDestroyRNNDataDescriptor(struct rnn_data_descriptor *d)
{
    free(d);
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnSetRNNDescriptor_v8(struct rnn_descriptor *d, int algo,
                                                 int cell_mode, int bias_mode, int direction,
                                                 int input_mode, int data_type,
                                                 int math_precision, int math_type,
                                                 int32_t input_size, int32_t hidden_size,
                                                 int32_t projection_size, int32_t layers,
                                                 void *dropout, uint32_t aux_flags)
{
    if (!d)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    /* A projection (LSTM only) is smaller than the hidden state; equal means none. */
    if (cell_mode < RNN_RELU || cell_mode > GRU || bias_mode < NO_BIAS ||
        bias_mode > SINGLE_REC_BIAS || (direction != UNIDIRECTIONAL && direction != BIDIRECTIONAL) ||
        (input_mode != LINEAR_INPUT && input_mode != SKIP_INPUT) || !element_bytes(data_type) ||
        input_size <= 0 || hidden_size <= 0 || layers <= 0 || projection_size <= 0 ||
        projection_size > hidden_size || (cell_mode != LSTM && projection_size != hidden_size))
        return CUDNN_STATUS_BAD_PARAM;
    const struct dropout_descriptor *between_layers = dropout;
    *d = (struct rnn_descriptor){1, algo, cell_mode, bias_mode, direction, input_mode,
                                 data_type, math_precision, input_size, hidden_size,
                                 projection_size, layers,
                                 between_layers ? between_layers->probability : 0.0f};
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnSetRNNDataDescriptor(struct rnn_data_descriptor *d, int data_type,
                                                  int layout, int max_sequence, int batch,
                                                  int vector_size, const int *sequence_lengths,
                                                  void *padding_fill)
{
    if (!d || !sequence_lengths)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (layout < 0 || layout > 2 || max_sequence <= 0 || batch <= 0 || vector_size <= 0 ||
        !element_bytes(data_type))
        return CUDNN_STATUS_BAD_PARAM;
    for (int i = 0; i < batch; i++)
        if (sequence_lengths[i] < 0 || sequence_lengths[i] > max_sequence)
            return CUDNN_STATUS_BAD_PARAM;
    *d = (struct rnn_data_descriptor){1, data_type, layout, max_sequence, batch, vector_size};
    return CUDNN_STATUS_SUCCESS;
}

/* Gates of a cell: the matrices (and biases) each of input and recurrent weights has. */
static int gates(const struct rnn_descriptor *d)
{
    return d->cell_mode == LSTM ? 4 : d->cell_mode == GRU ? 3 : 1;
}

static int directions(const struct rnn_descriptor *d)
{
    return d->direction == BIDIRECTIONAL ? 2 : 1;
}

/* The sizes of a pseudo-layer's parts, in elements. */
struct pseudo_layer {
    size_t input_cols;   /* columns of each input matrix: 0 where skip input drops them */
    size_t input_matrix, recurrent_matrix, projection;
    size_t matrices, biases; /* all of its matrices, all of its biases */
};

static struct pseudo_layer layout_of(const struct rnn_descriptor *d, int pseudo_layer)
{
    const size_t hidden = (size_t)d->hidden_size, output = (size_t)d->projection_size;
    const size_t g = (size_t)gates(d);
    struct pseudo_layer p;
    if (pseudo_layer < directions(d))
        p.input_cols = d->input_mode == SKIP_INPUT ? 0 : (size_t)d->input_size;
    else
        p.input_cols = output * (size_t)directions(d);
    p.input_matrix = hidden * p.input_cols;
    p.recurrent_matrix = hidden * output;
    p.projection = output < hidden ? output * hidden : 0;
    size_t bias_sets = d->bias_mode == DOUBLE_BIAS ? 2 : d->bias_mode == NO_BIAS ? 0 : 1;
    p.biases = bias_sets * g * hidden;
    p.matrices = g * (p.input_matrix + p.recurrent_matrix) + p.projection;
    return p;
}

/* Elements before pseudo-layer `until`'s matrices, and before its biases (all matrices
 * first). With `until` the number of pseudo-layers: the whole space, in `*matrices` and
 * `*biases`. */
static void offsets(const struct rnn_descriptor *d, int until, size_t *matrices, size_t *biases)
{
    size_t all_matrices = 0, matrices_before = 0, biases_before = 0;
    for (int layer = 0; layer < d->layers * directions(d); layer++) {
        struct pseudo_layer p = layout_of(d, layer);
        all_matrices += p.matrices;
        if (layer < until) {
            matrices_before += p.matrices;
            biases_before += p.biases;
        }
    }
    *matrices = matrices_before;
    *biases = all_matrices + biases_before;
}

static size_t weight_elements(const struct rnn_descriptor *d)
{
    size_t matrices, biases;
    offsets(d, d->layers * directions(d), &matrices, &biases);
    return biases;
}

FG_EXPORT cudnnStatus_t cudnnGetRNNWeightSpaceSize(void *handle, const struct rnn_descriptor *d,
                                                   size_t *bytes)
{
    if (!handle || !d || !bytes)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (!d->set)
        return CUDNN_STATUS_BAD_PARAM;
    *bytes = weight_elements(d) * element_bytes(d->data_type);
    return CUDNN_STATUS_SUCCESS;
}

/* Describes `rows` x `cols` elements at `offset` of the weight space (NULL and no elements
 * where `rows` x `cols` is 0: a part this RNN does not have), in a filter descriptor
 * (`filter`: the legacy API's) or a tensor descriptor. */
static cudnnStatus_t describe(const struct rnn_descriptor *d, const void *weights,
                              size_t offset, int rows, int cols, void *descriptor,
                              void **address, int filter)
{
    if (address)
        *address = rows && cols ? (char *)weights + offset * element_bytes(d->data_type) : NULL;
    if (!descriptor)
        return CUDNN_STATUS_SUCCESS;
    if (!rows || !cols) {
        fg_cudnn_describe_nothing((struct legacy_descriptor *)descriptor);
        return CUDNN_STATUS_SUCCESS;
    }
    const int dim[3] = {1, rows, cols};
    return filter ? cudnnSetFilterNdDescriptor(descriptor, d->data_type, 0, 3, dim)
                  : cudnnSetTensorNdDescriptor(descriptor, d->data_type, 3, dim, NULL);
}

/* The matrix and the bias of gate `id` of pseudo-layer `pseudo_layer` (ids 0 .. gates - 1 act
 * on the layer's input, gates .. 2 gates - 1 on its recurrent state, 2 gates on nothing but
 * an LSTM's projection, which has no bias), described in filter descriptors (`filter`) or
 * tensor descriptors. */
static cudnnStatus_t weight_params(const struct rnn_descriptor *d, int pseudo_layer,
                                   size_t weight_bytes, const void *weights, int id,
                                   void *matrix_descriptor, void **matrix,
                                   void *bias_descriptor, void **bias, int filter)
{
    const int g = gates(d);
    const int has_projection = d->cell_mode == LSTM && d->projection_size < d->hidden_size;
    if (!d->set || pseudo_layer < 0 || pseudo_layer >= d->layers * directions(d) || id < 0 ||
        id > 2 * g - (has_projection ? 0 : 1) ||
        weight_bytes < weight_elements(d) * element_bytes(d->data_type))
        return CUDNN_STATUS_BAD_PARAM;
    size_t matrices, biases;
    offsets(d, pseudo_layer, &matrices, &biases);
    const struct pseudo_layer p = layout_of(d, pseudo_layer);
    const int hidden = d->hidden_size;
    size_t matrix_at, bias_at;
    int rows = hidden, cols, bias_rows = hidden;
    if (id < g) {
        matrix_at = (size_t)id * p.input_matrix;
        cols = (int)p.input_cols;
        bias_at = (size_t)id * (size_t)hidden;
        bias_rows = d->bias_mode == DOUBLE_BIAS || d->bias_mode == SINGLE_INP_BIAS ? hidden : 0;
    } else if (id < 2 * g) {
        matrix_at = (size_t)g * p.input_matrix + (size_t)(id - g) * p.recurrent_matrix;
        cols = d->projection_size;
        bias_at = (size_t)(d->bias_mode == DOUBLE_BIAS ? id : id - g) * (size_t)hidden;
        bias_rows = d->bias_mode == DOUBLE_BIAS || d->bias_mode == SINGLE_REC_BIAS ? hidden : 0;
    } else {
        matrix_at = (size_t)g * (p.input_matrix + p.recurrent_matrix);
        rows = d->projection_size;
        cols = hidden;
        bias_at = 0;
        bias_rows = 0;
    }
    cudnnStatus_t rc = describe(d, weights, matrices + matrix_at, rows, cols, matrix_descriptor,
                                matrix, filter);
    if (rc)
        return rc;
    return describe(d, weights, biases + bias_at, bias_rows, 1, bias_descriptor, bias, filter);
}

FG_EXPORT cudnnStatus_t cudnnGetRNNWeightParams(void *handle, const struct rnn_descriptor *d,
                                                int32_t pseudo_layer, size_t weight_bytes,
                                                const void *weights, int32_t id,
                                                void *matrix_descriptor, void **matrix,
                                                void *bias_descriptor, void **bias)
{
    if (!handle || !d)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    return weight_params(d, pseudo_layer, weight_bytes, weights, id, matrix_descriptor, matrix,
                         bias_descriptor, bias, 0);
}

/* Estimates fitted to cuDNN 9.19 on an H200 (scripts/cudnn_rnn_probe.py, twelve networks;
 * README, "Fake GPU"), in bytes. The reserve space a training forward keeps for the backward,
 * exact for the eleven networks measured without a projection (with one, 18.5% under): per
 * direction, (k x layers - 1)
 * vectors of the hidden size for every step of every sequence (k = 6 for an LSTM, 7 for a GRU,
 * 2 for a plain RNN: the gates' activations, the states, each layer's output but the last,
 * which is y), in the data type, and 256 bytes; with dropout between layers, its mask, a bit
 * per element of every layer's input but the first (exact for the one network measured). The
 * work space: a copy of the weights, the input GEMM of one layer's every step (directions x
 * steps x sequences x gates x hidden, in the math precision), 8 MiB per pseudo-layer, and
 * with dropout one layer's dropped input: within 11% of cuDNN's for nine of the twelve
 * networks (1,024 input features: 14.7% under; the persistent small-hidden algorithm: 41% under;
 * half precision: 26% over). */
static void temp_spaces(const struct rnn_descriptor *d, size_t positions, int mode,
                        size_t *work_bytes, size_t *reserve_bytes)
{
    const size_t hidden = (size_t)d->hidden_size, g = (size_t)gates(d);
    const size_t layers = (size_t)d->layers, dirs = (size_t)directions(d);
    const size_t data = element_bytes(d->data_type);
    size_t math = element_bytes(d->math_precision);
    if (!math)
        math = data;
    const int dropout = d->dropout > 0.0f && layers > 1;
    /* Each layer's output, the input of the next: directions x the projection size wide. */
    const size_t layer_output = dirs * (size_t)d->projection_size;
    if (work_bytes)
        *work_bytes = weight_elements(d) * data + dirs * positions * g * hidden * math +
                      layers * dirs * ((size_t)8 << 20) +
                      (dropout ? positions * layer_output * data : 0);
    if (reserve_bytes) {
        const size_t k = d->cell_mode == LSTM ? 6 : d->cell_mode == GRU ? 7 : 2;
        *reserve_bytes = mode != FWD_MODE_TRAINING
                             ? 0
                             : dirs * (k * layers - 1) * positions * hidden * data + 256 +
                                   (dropout ? (layers - 1) * ((positions * layer_output + 7) / 8)
                                            : 0);
    }
}

FG_EXPORT cudnnStatus_t cudnnGetRNNTempSpaceSizes(void *handle, const struct rnn_descriptor *d,
                                                  int mode, const struct rnn_data_descriptor *x,
                                                  size_t *work_bytes, size_t *reserve_bytes)
{
    if (!handle || !d || !x)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (!d->set || !x->set || (mode != FWD_MODE_INFERENCE && mode != FWD_MODE_TRAINING))
        return CUDNN_STATUS_BAD_PARAM;
    temp_spaces(d, (size_t)x->max_sequence * (size_t)x->batch, mode, work_bytes, reserve_bytes);
    return CUDNN_STATUS_SUCCESS;
}

/* cuDNN 8's older RNN API (cudnn_adv_infer.h's v6 setter and v7 queries), what PyTorch 2.3
 * and older call: the same descriptor and the same model, the weights' data type and the
 * input size given at each query (a data type argument, the first step's tensor descriptor:
 * batch x input x 1), the steps as one tensor descriptor each (batch sizes that shrink for a
 * packed batch). Only in the fake libcudnn.so.8 (cuDNN 9 has none of them). */
#if FG_SONAME_MAJOR == 8
FG_EXPORT cudnnStatus_t cudnnSetRNNDescriptor_v6(void *handle, struct rnn_descriptor *d,
                                                 int hidden_size, int layers, void *dropout,
                                                 int input_mode, int direction, int cell_mode,
                                                 int algo, int math_precision)
{
    if (!handle)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    /* The input size and data type come with each query: float and 1 until then. */
    return cudnnSetRNNDescriptor_v8(d, algo, cell_mode, DOUBLE_BIAS, direction, input_mode, 0,
                                    math_precision, 0, 1, hidden_size, hidden_size, layers,
                                    dropout, 0);
}

FG_EXPORT cudnnStatus_t cudnnSetRNNProjectionLayers(void *handle, struct rnn_descriptor *d,
                                                    int recurrent_projection,
                                                    int output_projection)
{
    if (!handle || !d)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (!d->set || d->cell_mode != LSTM || recurrent_projection <= 0 ||
        recurrent_projection > d->hidden_size || output_projection != 0)
        return CUDNN_STATUS_BAD_PARAM;
    d->projection_size = recurrent_projection;
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnSetRNNMatrixMathType(struct rnn_descriptor *d, int math_type)
{
    return d ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
}

/* `d` with the data type `data_type` and the input size of the steps' first descriptor `x`
 * (batch x input x 1), in `*out`; the number of positions of `steps` descriptors (each its
 * batch) in `*positions` when asked. */
static cudnnStatus_t with_input(const struct rnn_descriptor *d, int data_type,
                                const struct legacy_descriptor *const *x, int steps,
                                struct rnn_descriptor *out, size_t *positions)
{
    if (!d || !x || !x[0])
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    int type = 0, dims = 0, dim[8] = {0};
    cudnnStatus_t rc = cudnnGetTensorNdDescriptor(x[0], 8, &type, &dims, dim, NULL);
    if (rc)
        return rc;
    if (!d->set || dims < 2 || steps < 1)
        return CUDNN_STATUS_BAD_PARAM;
    *out = *d;
    out->data_type = data_type < 0 ? type : data_type;
    out->input_size = dim[1];
    if (!element_bytes(out->data_type))
        return CUDNN_STATUS_BAD_PARAM;
    if (positions) {
        *positions = 0;
        for (int t = 0; t < steps; t++) {
            if (!x[t])
                return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
            rc = cudnnGetTensorNdDescriptor(x[t], 8, &type, &dims, dim, NULL);
            if (rc)
                return rc;
            *positions += (size_t)dim[0];
        }
    }
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnGetRNNParamsSize(void *handle, const struct rnn_descriptor *d,
                                              const struct legacy_descriptor *x, size_t *bytes,
                                              int data_type)
{
    struct rnn_descriptor sized;
    if (!handle || !bytes)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    cudnnStatus_t rc = with_input(d, data_type, &x, 1, &sized, NULL);
    if (rc)
        return rc;
    *bytes = weight_elements(&sized) * element_bytes(sized.data_type);
    return CUDNN_STATUS_SUCCESS;
}

/* The legacy queries' weights: `w`'s filter descriptor gives their data type and size. */
static cudnnStatus_t legacy_params(void *handle, const struct rnn_descriptor *d,
                                   int pseudo_layer, const struct legacy_descriptor *x,
                                   const struct legacy_descriptor *w, const void *weights,
                                   int id, void *matrix_descriptor, void **matrix,
                                   void *bias_descriptor, void **bias)
{
    if (!handle || !w)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    int type = 0, format = 0, dims = 0, dim[8] = {0};
    cudnnStatus_t rc = cudnnGetFilterNdDescriptor(w, 8, &type, &format, &dims, dim);
    if (rc)
        return rc;
    size_t elements = dims ? 1 : 0;
    for (int i = 0; i < dims; i++)
        elements *= (size_t)dim[i];
    struct rnn_descriptor sized;
    rc = with_input(d, type, &x, 1, &sized, NULL);
    if (rc)
        return rc;
    return weight_params(&sized, pseudo_layer, elements * element_bytes(type), weights, id,
                         matrix_descriptor, matrix, bias_descriptor, bias, 1);
}

FG_EXPORT cudnnStatus_t cudnnGetRNNLinLayerMatrixParams(
    void *handle, const struct rnn_descriptor *d, int pseudo_layer,
    const struct legacy_descriptor *x, const struct legacy_descriptor *w, const void *weights,
    int id, void *matrix_descriptor, void **matrix)
{
    if (!matrix_descriptor || !matrix)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    return legacy_params(handle, d, pseudo_layer, x, w, weights, id, matrix_descriptor, matrix,
                         NULL, NULL);
}

FG_EXPORT cudnnStatus_t cudnnGetRNNLinLayerBiasParams(
    void *handle, const struct rnn_descriptor *d, int pseudo_layer,
    const struct legacy_descriptor *x, const struct legacy_descriptor *w, const void *weights,
    int id, void *bias_descriptor, void **bias)
{
    if (!bias_descriptor || !bias)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    return legacy_params(handle, d, pseudo_layer, x, w, weights, id, NULL, NULL,
                         bias_descriptor, bias);
}

FG_EXPORT cudnnStatus_t cudnnGetRNNWorkspaceSize(void *handle, const struct rnn_descriptor *d,
                                                 int steps,
                                                 const struct legacy_descriptor *const *x,
                                                 size_t *bytes)
{
    struct rnn_descriptor sized;
    size_t positions = 0;
    if (!handle || !bytes)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    cudnnStatus_t rc = with_input(d, -1, x, steps, &sized, &positions);
    if (rc)
        return rc;
    temp_spaces(&sized, positions, FWD_MODE_INFERENCE, bytes, NULL);
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnGetRNNTrainingReserveSize(void *handle,
                                                       const struct rnn_descriptor *d, int steps,
                                                       const struct legacy_descriptor *const *x,
                                                       size_t *bytes)
{
    struct rnn_descriptor sized;
    size_t positions = 0;
    if (!handle || !bytes)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    cudnnStatus_t rc = with_input(d, -1, x, steps, &sized, &positions);
    if (rc)
        return rc;
    temp_spaces(&sized, positions, FWD_MODE_TRAINING, NULL, bytes);
    return CUDNN_STATUS_SUCCESS;
}
#endif

FG_EXPORT cudnnStatus_t cudnnCreateDropoutDescriptor(struct dropout_descriptor **d)
{
    if (!d)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *d = calloc(1, sizeof **d);
    return *d ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_ALLOC_FAILED;
}

FG_EXPORT cudnnStatus_t cudnnDestroyDropoutDescriptor(struct dropout_descriptor *d)
{
    free(d);
    return CUDNN_STATUS_SUCCESS;
}

/* Setting a dropout descriptor initialises its random state on the GPU, restoring one takes
 * the state as it is: on the fake GPU both only keep what they are given. */
static cudnnStatus_t keep_dropout(struct dropout_descriptor *d, void *handle, float probability,
                                  void *states, unsigned long long seed)
{
    if (!d || !handle)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (probability < 0.0f || probability > 1.0f)
        return CUDNN_STATUS_BAD_PARAM;
    *d = (struct dropout_descriptor){probability, states, seed};
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnSetDropoutDescriptor(struct dropout_descriptor *d, void *handle,
                                                  float probability, void *states,
                                                  size_t state_bytes, unsigned long long seed)
{
    return keep_dropout(d, handle, probability, states, seed);
}

FG_EXPORT cudnnStatus_t cudnnRestoreDropoutDescriptor(struct dropout_descriptor *d, void *handle,
                                                      float probability, void *states,
                                                      size_t state_bytes,
                                                      unsigned long long seed)
{
    return keep_dropout(d, handle, probability, states, seed);
}

FG_EXPORT cudnnStatus_t cudnnGetDropoutDescriptor(const struct dropout_descriptor *d,
                                                  void *handle, float *probability,
                                                  void **states, unsigned long long *seed)
{
    if (!d || !handle || !probability || !states || !seed)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *probability = d->probability;
    *states = d->states;
    *seed = d->seed;
    return CUDNN_STATUS_SUCCESS;
}

/* Dropout's random-number state: 49,152 bytes per multiprocessor of the calling thread's
 * device (cuDNN 9.19 on an H200, 132 of them: 6,488,064 bytes; that it scales with the
 * multiprocessors is an assumption). PyTorch allocates it once per device for the dropout
 * between an RNN's layers. */
FG_EXPORT cudnnStatus_t cudnnDropoutGetStatesSize(void *handle, size_t *bytes)
{
    if (!handle || !bytes)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    int multiprocessors = 0;
    CUresult rc = fg_library_ready();
    if (rc == CUDA_SUCCESS)
        rc = cuDeviceGetAttribute(&multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                  fakegpu_runtime_thread()->device);
    if (rc != CUDA_SUCCESS || multiprocessors <= 0)
        return CUDNN_STATUS_BAD_PARAM;
    *bytes = (size_t)multiprocessors * 49152;
    return CUDNN_STATUS_SUCCESS;
}

/* The mask a dropout forward keeps for its backward: a bit per element (cuDNN 9.19: 125,000
 * bytes for 1,000,000 floats). */
FG_EXPORT cudnnStatus_t cudnnDropoutGetReserveSpaceSize(const struct legacy_descriptor *x,
                                                        size_t *bytes)
{
    if (!x || !bytes)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    int type = 0, dims = 0, dim[8] = {0};
    cudnnStatus_t rc = cudnnGetTensorNdDescriptor(x, 8, &type, &dims, dim, NULL);
    if (rc)
        return rc;
    size_t elements = dims ? 1 : 0;
    for (int i = 0; i < dims; i++)
        elements *= (size_t)dim[i];
    *bytes = (elements + 7) / 8;
    return CUDNN_STATUS_SUCCESS;
}

/* The fake cuDNN's RNN API (cuDNN 8's "v8" functions, the only RNN API cuDNN 9 has), what
 * PyTorch's nn.LSTM, nn.GRU and nn.RNN call on CUDA: RNN and RNN data descriptors that keep
 * what is set on them, the weight space (its size and where each matrix and bias lies in it),
 * the work and reserve space sizes, and dropout's state size. The forward and backward passes
 * themselves are in noop.txt: they complete at once, like every kernel on the fake GPU.
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

CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice device);

#define FG_EXPORT __attribute__((visibility("default")))
typedef int cudnnStatus_t;
enum {
    STATUS_SUCCESS = 0,
    STATUS_BAD_PARAM = 2000,
    STATUS_BAD_PARAM_NULL_POINTER = 2002,
    STATUS_ALLOC_FAILED = 4000,
};

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

/* The tensor descriptors' setter (legacy.c): the fake's own, by its exported name; and a
 * descriptor of no dimensions. */
cudnnStatus_t cudnnSetTensorNdDescriptor(void *d, int data_type, int dims, const int *dim,
                                         const int *stride);
struct legacy_descriptor;
void fg_cudnn_describe_nothing(struct legacy_descriptor *d);
cudnnStatus_t cudnnGetTensorNdDescriptor(const struct legacy_descriptor *d, int requested,
                                         int *data_type, int *dims, int *dim, int *stride);

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
        return STATUS_BAD_PARAM_NULL_POINTER;
    *d = calloc(1, sizeof **d);
    return *d ? STATUS_SUCCESS : STATUS_ALLOC_FAILED;
}

FG_EXPORT cudnnStatus_t cudnnDestroyRNNDescriptor(struct rnn_descriptor *d)
{
    free(d);
    return STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnCreateRNNDataDescriptor(struct rnn_data_descriptor **d)
{
    if (!d)
        return STATUS_BAD_PARAM_NULL_POINTER;
    *d = calloc(1, sizeof **d);
    return *d ? STATUS_SUCCESS : STATUS_ALLOC_FAILED;
}

FG_EXPORT cudnnStatus_t cudnnDestroyRNNDataDescriptor(struct rnn_data_descriptor *d)
{
    free(d);
    return STATUS_SUCCESS;
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
        return STATUS_BAD_PARAM_NULL_POINTER;
    /* A projection (LSTM only) is smaller than the hidden state; equal means none. */
    if (cell_mode < RNN_RELU || cell_mode > GRU || bias_mode < NO_BIAS ||
        bias_mode > SINGLE_REC_BIAS || (direction != UNIDIRECTIONAL && direction != BIDIRECTIONAL) ||
        (input_mode != LINEAR_INPUT && input_mode != SKIP_INPUT) || !element_bytes(data_type) ||
        input_size <= 0 || hidden_size <= 0 || layers <= 0 || projection_size <= 0 ||
        projection_size > hidden_size || (cell_mode != LSTM && projection_size != hidden_size))
        return STATUS_BAD_PARAM;
    const struct dropout_descriptor *between_layers = dropout;
    *d = (struct rnn_descriptor){1, algo, cell_mode, bias_mode, direction, input_mode,
                                 data_type, math_precision, input_size, hidden_size,
                                 projection_size, layers,
                                 between_layers ? between_layers->probability : 0.0f};
    return STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnSetRNNDataDescriptor(struct rnn_data_descriptor *d, int data_type,
                                                  int layout, int max_sequence, int batch,
                                                  int vector_size, const int *sequence_lengths,
                                                  void *padding_fill)
{
    if (!d || !sequence_lengths)
        return STATUS_BAD_PARAM_NULL_POINTER;
    if (layout < 0 || layout > 2 || max_sequence <= 0 || batch <= 0 || vector_size <= 0 ||
        !element_bytes(data_type))
        return STATUS_BAD_PARAM;
    for (int i = 0; i < batch; i++)
        if (sequence_lengths[i] < 0 || sequence_lengths[i] > max_sequence)
            return STATUS_BAD_PARAM;
    *d = (struct rnn_data_descriptor){1, data_type, layout, max_sequence, batch, vector_size};
    return STATUS_SUCCESS;
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
        return STATUS_BAD_PARAM_NULL_POINTER;
    if (!d->set)
        return STATUS_BAD_PARAM;
    *bytes = weight_elements(d) * element_bytes(d->data_type);
    return STATUS_SUCCESS;
}

/* Describes `rows` x `cols` elements at `offset` of the weight space (NULL and no elements
 * where `rows` x `cols` is 0: a part this RNN does not have). */
static cudnnStatus_t describe(const struct rnn_descriptor *d, const void *weights,
                              size_t offset, int rows, int cols, void *descriptor,
                              void **address)
{
    if (address)
        *address = rows && cols ? (char *)weights + offset * element_bytes(d->data_type) : NULL;
    if (!descriptor)
        return STATUS_SUCCESS;
    if (!rows || !cols) {
        fg_cudnn_describe_nothing((struct legacy_descriptor *)descriptor);
        return STATUS_SUCCESS;
    }
    const int dim[3] = {1, rows, cols};
    return cudnnSetTensorNdDescriptor(descriptor, d->data_type, 3, dim, NULL);
}

/* The matrix and the bias of gate `id` of pseudo-layer `pseudo_layer` (ids 0 .. gates - 1 act
 * on the layer's input, gates .. 2 gates - 1 on its recurrent state, 2 gates on nothing but
 * an LSTM's projection, which has no bias). */
FG_EXPORT cudnnStatus_t cudnnGetRNNWeightParams(void *handle, const struct rnn_descriptor *d,
                                                int32_t pseudo_layer, size_t weight_bytes,
                                                const void *weights, int32_t id,
                                                void *matrix_descriptor, void **matrix,
                                                void *bias_descriptor, void **bias)
{
    if (!handle || !d)
        return STATUS_BAD_PARAM_NULL_POINTER;
    const int g = gates(d);
    const int has_projection = d->cell_mode == LSTM && d->projection_size < d->hidden_size;
    if (!d->set || pseudo_layer < 0 || pseudo_layer >= d->layers * directions(d) || id < 0 ||
        id > 2 * g - (has_projection ? 0 : 1) ||
        weight_bytes < weight_elements(d) * element_bytes(d->data_type))
        return STATUS_BAD_PARAM;
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
                                matrix);
    if (rc)
        return rc;
    return describe(d, weights, biases + bias_at, bias_rows, 1, bias_descriptor, bias);
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
FG_EXPORT cudnnStatus_t cudnnGetRNNTempSpaceSizes(void *handle, const struct rnn_descriptor *d,
                                                  int mode, const struct rnn_data_descriptor *x,
                                                  size_t *work_bytes, size_t *reserve_bytes)
{
    if (!handle || !d || !x)
        return STATUS_BAD_PARAM_NULL_POINTER;
    if (!d->set || !x->set || (mode != FWD_MODE_INFERENCE && mode != FWD_MODE_TRAINING))
        return STATUS_BAD_PARAM;
    const size_t positions = (size_t)x->max_sequence * (size_t)x->batch;
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
    return STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnCreateDropoutDescriptor(struct dropout_descriptor **d)
{
    if (!d)
        return STATUS_BAD_PARAM_NULL_POINTER;
    *d = calloc(1, sizeof **d);
    return *d ? STATUS_SUCCESS : STATUS_ALLOC_FAILED;
}

FG_EXPORT cudnnStatus_t cudnnDestroyDropoutDescriptor(struct dropout_descriptor *d)
{
    free(d);
    return STATUS_SUCCESS;
}

/* Setting a dropout descriptor initialises its random state on the GPU, restoring one takes
 * the state as it is: on the fake GPU both only keep what they are given. */
static cudnnStatus_t keep_dropout(struct dropout_descriptor *d, void *handle, float probability,
                                  void *states, unsigned long long seed)
{
    if (!d || !handle)
        return STATUS_BAD_PARAM_NULL_POINTER;
    if (probability < 0.0f || probability > 1.0f)
        return STATUS_BAD_PARAM;
    *d = (struct dropout_descriptor){probability, states, seed};
    return STATUS_SUCCESS;
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
        return STATUS_BAD_PARAM_NULL_POINTER;
    *probability = d->probability;
    *states = d->states;
    *seed = d->seed;
    return STATUS_SUCCESS;
}

/* Dropout's random-number state: 49,152 bytes per multiprocessor of the calling thread's
 * device (cuDNN 9.19 on an H200, 132 of them: 6,488,064 bytes; that it scales with the
 * multiprocessors is an assumption). PyTorch allocates it once per device for the dropout
 * between an RNN's layers. */
FG_EXPORT cudnnStatus_t cudnnDropoutGetStatesSize(void *handle, size_t *bytes)
{
    if (!handle || !bytes)
        return STATUS_BAD_PARAM_NULL_POINTER;
    int multiprocessors = 0;
    CUresult rc = fg_library_ready();
    if (rc == CUDA_SUCCESS)
        rc = cuDeviceGetAttribute(&multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                  fakegpu_runtime_thread()->device);
    if (rc != CUDA_SUCCESS || multiprocessors <= 0)
        return STATUS_BAD_PARAM;
    *bytes = (size_t)multiprocessors * 49152;
    return STATUS_SUCCESS;
}

/* The mask a dropout forward keeps for its backward: a bit per element (cuDNN 9.19: 125,000
 * bytes for 1,000,000 floats). */
FG_EXPORT cudnnStatus_t cudnnDropoutGetReserveSpaceSize(const struct legacy_descriptor *x,
                                                        size_t *bytes)
{
    if (!x || !bytes)
        return STATUS_BAD_PARAM_NULL_POINTER;
    int type = 0, dims = 0, dim[8] = {0};
    cudnnStatus_t rc = cudnnGetTensorNdDescriptor(x, 8, &type, &dims, dim, NULL);
    if (rc)
        return rc;
    size_t elements = dims ? 1 : 0;
    for (int i = 0; i < dims; i++)
        elements *= (size_t)dim[i];
    *bytes = (elements + 7) / 8;
    return STATUS_SUCCESS;
}

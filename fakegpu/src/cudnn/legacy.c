/* The fake cuDNN 9 "legacy" API: descriptors (tensor, filter, convolution, activation,
 * pooling, ...) that keep what is set on them, and the workspace queries PyTorch makes before a
 * batch normalisation. The compute functions themselves are in noop.txt: they complete at
 * once, like every kernel on the fake GPU. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "cudnn_legacy.h"

#define FG_EXPORT __attribute__((visibility("default")))

#define MAX_DIMS 8

/* Every kind of legacy descriptor but the RNN's and dropout's (rnn.c): what a tensor or filter descriptor
 * says of its shape. */
struct legacy_descriptor {
    int data_type, format, dims;
    int dim[MAX_DIMS], stride[MAX_DIMS];
};

static cudnnStatus_t create(void **descriptor)
{
    if (!descriptor)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *descriptor = calloc(1, sizeof(struct legacy_descriptor));
    return *descriptor ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_ALLOC_FAILED;
}

static cudnnStatus_t destroy(void *descriptor)
{
    free(descriptor);
    return CUDNN_STATUS_SUCCESS;
}

#define LEGACY_DESCRIPTOR(kind)                                                              \
    FG_EXPORT cudnnStatus_t cudnnCreate##kind##Descriptor(void **d) { return create(d); }     \
    FG_EXPORT cudnnStatus_t cudnnDestroy##kind##Descriptor(void *d) { return destroy(d); }

LEGACY_DESCRIPTOR(Activation)
LEGACY_DESCRIPTOR(Attn)
LEGACY_DESCRIPTOR(Convolution)
LEGACY_DESCRIPTOR(Filter)
LEGACY_DESCRIPTOR(LRN)
LEGACY_DESCRIPTOR(OpTensor)
LEGACY_DESCRIPTOR(Pooling)
LEGACY_DESCRIPTOR(ReduceTensor)
LEGACY_DESCRIPTOR(SeqData)
LEGACY_DESCRIPTOR(SpatialTransformer)
LEGACY_DESCRIPTOR(Tensor)
LEGACY_DESCRIPTOR(TensorTransform)

static cudnnStatus_t set_shape(struct legacy_descriptor *d, int data_type, int format, int dims,
                               const int *dim, const int *stride)
{
    if (!d || !dim)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (dims < 1 || dims > MAX_DIMS)
        return CUDNN_STATUS_BAD_PARAM;
    d->data_type = data_type;
    d->format = format;
    d->dims = dims;
    for (int i = 0; i < dims; i++) {
        d->dim[i] = dim[i];
        d->stride[i] = stride ? stride[i] : 0;
    }
    if (!stride) /* packed, NCHW order */
        for (int i = dims - 1, s = 1; i >= 0; s *= dim[i], i--)
            d->stride[i] = s;
    return CUDNN_STATUS_SUCCESS;
}

/* A tensor descriptor of no dimensions: what cuDNN describes a part an RNN does not have with
 * (rnn.c). */
__attribute__((visibility("hidden"))) void fg_cudnn_describe_nothing(struct legacy_descriptor *d)
{
    if (d)
        d->dims = 0;
}

FG_EXPORT cudnnStatus_t cudnnSetTensorNdDescriptor(void *d, int data_type, int dims,
                                                   const int *dim, const int *stride)
{
    return set_shape(d, data_type, 0, dims, dim, stride);
}

FG_EXPORT cudnnStatus_t cudnnSetTensorNdDescriptorEx(void *d, int format, int data_type,
                                                     int dims, const int *dim)
{
    return set_shape(d, data_type, format, dims, dim, NULL);
}

FG_EXPORT cudnnStatus_t cudnnSetTensor4dDescriptor(void *d, int format, int data_type, int n,
                                                   int c, int h, int w)
{
    const int dim[4] = {n, c, h, w};
    return set_shape(d, data_type, format, 4, dim, NULL);
}

FG_EXPORT cudnnStatus_t cudnnGetTensorNdDescriptor(const struct legacy_descriptor *d,
                                                   int requested, int *data_type, int *dims,
                                                   int *dim, int *stride)
{
    if (!d || !data_type || !dims)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *data_type = d->data_type;
    *dims = d->dims;
    for (int i = 0; i < requested && i < d->dims; i++) {
        if (dim)
            dim[i] = d->dim[i];
        if (stride)
            stride[i] = d->stride[i];
    }
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnSetFilterNdDescriptor(void *d, int data_type, int format, int dims,
                                                   const int *dim)
{
    return set_shape(d, data_type, format, dims, dim, NULL);
}

FG_EXPORT cudnnStatus_t cudnnGetFilterNdDescriptor(const struct legacy_descriptor *d,
                                                   int requested, int *data_type, int *format,
                                                   int *dims, int *dim)
{
    if (!d || !data_type || !format || !dims)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *data_type = d->data_type;
    *format = d->format;
    *dims = d->dims;
    for (int i = 0; i < requested && i < d->dims && dim; i++)
        dim[i] = d->dim[i];
    return CUDNN_STATUS_SUCCESS;
}

/* The batch-normalisation scale/bias/mean/variance shape: 1 x C x 1 x 1 (x 1). */
FG_EXPORT cudnnStatus_t cudnnDeriveBNTensorDescriptor(struct legacy_descriptor *derived,
                                                      const struct legacy_descriptor *x, int mode)
{
    if (!derived || !x)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    int dim[MAX_DIMS];
    for (int i = 0; i < x->dims; i++)
        dim[i] = i == 1 ? x->dim[1] : 1;
    /* Half and bfloat16 inputs keep their statistics in float. */
    int type = x->data_type == 2 || x->data_type == 9 ? 0 : x->data_type;
    return set_shape(derived, type, 0, x->dims, dim, NULL);
}

/* cuDNN's batch normalisation takes no workspace and keeps no reserve space for the modes
 * PyTorch uses without a fused activation: the fake says 0 for each. */
FG_EXPORT cudnnStatus_t cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
    void *handle, int mode, int ops, const void *x, const void *z, const void *y,
    const void *bn, const void *activation, size_t *bytes)
{
    if (!bytes)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *bytes = 0;
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnGetBatchNormalizationBackwardExWorkspaceSize(
    void *handle, int mode, int ops, const void *x, const void *y, const void *dy,
    const void *dz, const void *dx, const void *dbn, const void *activation, size_t *bytes)
{
    if (!bytes)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *bytes = 0;
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
    void *handle, int mode, int ops, const void *activation, const void *x, size_t *bytes)
{
    if (!bytes)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *bytes = 0;
    return CUDNN_STATUS_SUCCESS;
}

/* The fake cuDNN's CTC loss (cudnn_adv.h), what PyTorch's ctc_loss calls on CUDA when it picks
 * cuDNN (blank 0, int32 targets, every input length equal to T, labels of at most 256): a
 * descriptor that keeps what is set on it, the workspace size, and the loss itself, which
 * checks its arguments as cuDNN documents and then completes at once, like every kernel on the
 * fake GPU (costs and gradients keep whatever their memory held).
 *
 * The workspace is what cuDNN 9.19 asks on a real H100 (scripts/cudnn_ctc_probe.py, eight
 * shapes, both algorithms: tests/fixtures/h100-probe/ctc.jsonl, 32 of 32 queries equal): per
 * time step and sample, the forward and backward variables of the CTC algorithm (Graves et al.,
 * 2006), two floats per extended label (2 L + 1), and a float per class; then per sample
 * 12 L + 20 bytes (the legacy query, L the longest label given) or 8 L + 12 (the _v8 query, L
 * the descriptor's maxLabelLength; 256, cuDNN's limit, when it was set without one). The probe
 * gave every sample the same label length and every input length T, so whether cuDNN takes the
 * longest label or their sum per sample is not measured; and the _v8 query was measured with
 * maxLabelLength 255 only (torch's), where 8 L + 12 is 2,052: its dependence on L is a guess. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "cudnn_legacy.h"

#define FG_EXPORT __attribute__((visibility("default")))

/* cuDNN's longest label (cudnnCTCLoss: CUDNN_STATUS_BAD_PARAM beyond it). */
#define MAX_LABEL_LENGTH 256

struct ctc_descriptor {
    int compute_type, normalization, gradient_mode, max_label_length;
};


FG_EXPORT cudnnStatus_t cudnnCreateCTCLossDescriptor(struct ctc_descriptor **d)
{
    if (!d)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *d = calloc(1, sizeof **d);
    if (!*d)
        return CUDNN_STATUS_ALLOC_FAILED;
    (*d)->max_label_length = MAX_LABEL_LENGTH;
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnDestroyCTCLossDescriptor(struct ctc_descriptor *d)
{
    free(d);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t set(struct ctc_descriptor *d, int compute_type, int normalization,
                         int gradient_mode, int max_label_length)
{
    if (!d)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (max_label_length < 1)
        return CUDNN_STATUS_BAD_PARAM;
    d->compute_type = compute_type;
    d->normalization = normalization;
    d->gradient_mode = gradient_mode;
    d->max_label_length = max_label_length;
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnSetCTCLossDescriptor(struct ctc_descriptor *d, int compute_type)
{
    return set(d, compute_type, 0, 0, MAX_LABEL_LENGTH);
}

FG_EXPORT cudnnStatus_t cudnnSetCTCLossDescriptorEx(struct ctc_descriptor *d, int compute_type,
                                                    int normalization, int gradient_mode)
{
    return set(d, compute_type, normalization, gradient_mode, MAX_LABEL_LENGTH);
}

FG_EXPORT cudnnStatus_t cudnnSetCTCLossDescriptor_v8(struct ctc_descriptor *d, int compute_type,
                                                     int normalization, int gradient_mode,
                                                     int max_label_length)
{
    return set(d, compute_type, normalization, gradient_mode, max_label_length);
}

/* cuDNN 9: the last mode is cudnnCTCGradMode_t (zero or keep out-of-bounds gradients). */
FG_EXPORT cudnnStatus_t cudnnSetCTCLossDescriptor_v9(struct ctc_descriptor *d, int compute_type,
                                                     int normalization, int ctc_gradient_mode,
                                                     int max_label_length)
{
    return set(d, compute_type, normalization, ctc_gradient_mode, max_label_length);
}

static cudnnStatus_t get(const struct ctc_descriptor *d, int *compute_type, int *normalization,
                         int *gradient_mode, int *max_label_length)
{
    if (!d || !compute_type)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *compute_type = d->compute_type;
    if (normalization)
        *normalization = d->normalization;
    if (gradient_mode)
        *gradient_mode = d->gradient_mode;
    if (max_label_length)
        *max_label_length = d->max_label_length;
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnGetCTCLossDescriptor(const struct ctc_descriptor *d,
                                                  int *compute_type)
{
    return get(d, compute_type, NULL, NULL, NULL);
}

FG_EXPORT cudnnStatus_t cudnnGetCTCLossDescriptorEx(const struct ctc_descriptor *d,
                                                    int *compute_type, int *normalization,
                                                    int *gradient_mode)
{
    if (!normalization || !gradient_mode)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    return get(d, compute_type, normalization, gradient_mode, NULL);
}

FG_EXPORT cudnnStatus_t cudnnGetCTCLossDescriptor_v8(const struct ctc_descriptor *d,
                                                     int *compute_type, int *normalization,
                                                     int *gradient_mode, int *max_label_length)
{
    if (!normalization || !gradient_mode || !max_label_length)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    return get(d, compute_type, normalization, gradient_mode, max_label_length);
}

FG_EXPORT cudnnStatus_t cudnnGetCTCLossDescriptor_v9(const struct ctc_descriptor *d,
                                                     int *compute_type, int *normalization,
                                                     int *ctc_gradient_mode,
                                                     int *max_label_length)
{
    return cudnnGetCTCLossDescriptor_v8(d, compute_type, normalization, ctc_gradient_mode,
                                        max_label_length);
}

/* The probabilities' shape (T, N, A), which the gradients' must equal. */
static cudnnStatus_t shape(const struct legacy_descriptor *probs,
                           const struct legacy_descriptor *gradients, int *steps, int *batch,
                           int *classes)
{
    if (!probs || !gradients)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    int type, dims, dim[8], gradient_type, gradient_dims, gradient_dim[8];
    cudnnStatus_t rc = cudnnGetTensorNdDescriptor(probs, 8, &type, &dims, dim, NULL);
    if (rc == CUDNN_STATUS_SUCCESS)
        rc = cudnnGetTensorNdDescriptor(gradients, 8, &gradient_type, &gradient_dims,
                                        gradient_dim, NULL);
    if (rc != CUDNN_STATUS_SUCCESS)
        return rc;
    if (dims != 3 || gradient_dims != 3)
        return CUDNN_STATUS_BAD_PARAM;
    for (int i = 0; i < 3; i++)
        if (dim[i] < 1 || dim[i] != gradient_dim[i])
            return CUDNN_STATUS_BAD_PARAM;
    *steps = dim[0];
    *batch = dim[1];
    *classes = dim[2];
    return CUDNN_STATUS_SUCCESS;
}

/* What every step of every sample takes: alpha and beta over the extended label, and a float
 * per class. */
static size_t per_step(int steps, int batch, int classes, int label_length)
{
    return (size_t)steps * (size_t)batch *
           (2 * (2 * (size_t)label_length + 1) + (size_t)classes) * sizeof(float);
}

/* cudnnGetCTCLossWorkspaceSize's answer: L the longest label given. */
static size_t legacy_workspace(int steps, int batch, int classes, int longest)
{
    return per_step(steps, batch, classes, longest) +
           (size_t)batch * (12 * (size_t)longest + 20);
}

/* cudnnGetCTCLossWorkspaceSize_v8's answer: L the descriptor's maxLabelLength. */
static size_t v8_workspace(int steps, int batch, int classes, int max_label_length)
{
    return per_step(steps, batch, classes, max_label_length) +
           (size_t)batch * (8 * (size_t)max_label_length + 12);
}

/* The longest of the N labels, host arrays (the legacy functions); BAD_PARAM beyond cuDNN's
 * limit or below 0. */
static cudnnStatus_t longest_label(const int *label_lengths, int batch, int *longest)
{
    if (!label_lengths)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *longest = 0;
    for (int i = 0; i < batch; i++) {
        if (label_lengths[i] < 0 || label_lengths[i] > MAX_LABEL_LENGTH)
            return CUDNN_STATUS_BAD_PARAM;
        if (label_lengths[i] > *longest)
            *longest = label_lengths[i];
    }
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnGetCTCLossWorkspaceSize(
    void *handle, const struct legacy_descriptor *probs,
    const struct legacy_descriptor *gradients, const int *labels, const int *label_lengths,
    const int *input_lengths, int algo, const struct ctc_descriptor *d, size_t *size)
{
    int steps, batch, classes, longest;
    if (!handle || !labels || !input_lengths || !d || !size)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    cudnnStatus_t rc = shape(probs, gradients, &steps, &batch, &classes);
    if (rc == CUDNN_STATUS_SUCCESS)
        rc = longest_label(label_lengths, batch, &longest);
    if (rc != CUDNN_STATUS_SUCCESS)
        return rc;
    *size = legacy_workspace(steps, batch, classes, longest);
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnGetCTCLossWorkspaceSize_v8(void *handle, int algo,
                                                        const struct ctc_descriptor *d,
                                                        const struct legacy_descriptor *probs,
                                                        const struct legacy_descriptor *gradients,
                                                        size_t *size)
{
    int steps, batch, classes;
    if (!handle || !d || !size)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    cudnnStatus_t rc = shape(probs, gradients, &steps, &batch, &classes);
    if (rc != CUDNN_STATUS_SUCCESS)
        return rc;
    *size = v8_workspace(steps, batch, classes, d->max_label_length);
    return CUDNN_STATUS_SUCCESS;
}

/* The loss with host label arrays: every input length at most T, every label at most 256,
 * and the workspace at least what cudnnGetCTCLossWorkspaceSize asks. */
FG_EXPORT cudnnStatus_t cudnnCTCLoss(void *handle, const struct legacy_descriptor *probs_desc,
                                     const void *probs, const int *labels,
                                     const int *label_lengths, const int *input_lengths,
                                     void *costs, const struct legacy_descriptor *gradients_desc,
                                     void *gradients, int algo, const struct ctc_descriptor *d,
                                     void *work, size_t work_bytes)
{
    int steps, batch, classes, longest;
    if (!handle || !probs || !labels || !input_lengths || !costs || !d)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    cudnnStatus_t rc = shape(probs_desc, gradients_desc, &steps, &batch, &classes);
    if (rc == CUDNN_STATUS_SUCCESS)
        rc = longest_label(label_lengths, batch, &longest);
    if (rc != CUDNN_STATUS_SUCCESS)
        return rc;
    for (int i = 0; i < batch; i++)
        if (input_lengths[i] < 0 || input_lengths[i] > steps)
            return CUDNN_STATUS_BAD_PARAM;
    if (work_bytes < legacy_workspace(steps, batch, classes, longest) ||
        (work_bytes && !work))
        return CUDNN_STATUS_BAD_PARAM;
    (void)gradients;
    return CUDNN_STATUS_SUCCESS;
}

/* The loss with device label arrays (which the fake cannot read: the descriptor's
 * maxLabelLength bounds them) and the workspace last. */
FG_EXPORT cudnnStatus_t cudnnCTCLoss_v8(void *handle, int algo, const struct ctc_descriptor *d,
                                        const struct legacy_descriptor *probs_desc,
                                        const void *probs, const int *labels,
                                        const int *label_lengths, const int *input_lengths,
                                        void *costs,
                                        const struct legacy_descriptor *gradients_desc,
                                        void *gradients, size_t work_bytes, void *work)
{
    int steps, batch, classes;
    if (!handle || !d || !probs || !labels || !label_lengths || !input_lengths || !costs)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    cudnnStatus_t rc = shape(probs_desc, gradients_desc, &steps, &batch, &classes);
    if (rc != CUDNN_STATUS_SUCCESS)
        return rc;
    if (work_bytes < v8_workspace(steps, batch, classes, d->max_label_length) ||
        (work_bytes && !work))
        return CUDNN_STATUS_BAD_PARAM;
    (void)gradients;
    return CUDNN_STATUS_SUCCESS;
}

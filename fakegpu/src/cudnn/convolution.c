/* The fake cuDNN's legacy convolution queries (cuDNN 7's API, kept by cuDNN 8 and 9), what
 * PyTorch calls instead of the backend API when TORCH_CUDNN_V8_API_DISABLED=1: the algorithm
 * heuristics (cudnnGet*Algorithm_v7), the timed search (cudnnFind*AlgorithmEx), the workspace
 * of an algorithm, and the counts of algorithms. They answer as the backend's two engines do
 * (backend.c), so both of torch's paths make the same memory decisions:
 *   first: a GEMM-based algorithm whose workspace is one image's im2col matrix (the filter's
 *          C/groups x window elements for every output position, in the input's type), 1 ms;
 *   second: an algorithm without workspace (what torch falls back to when the first's
 *          workspace does not fit), 2 ms.
 * Both are reported deterministic, in the default math type. The convolutions themselves are in
 * noop.txt: they complete at once, like every kernel on the fake GPU. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cudnn_legacy.h"

#define FG_EXPORT __attribute__((visibility("default")))

/* cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t: the same layout for the three passes
 * (cudnn_cnn.h / cudnn_cnn_infer.h): 48 bytes. */
struct algo_perf {
    int algo;
    cudnnStatus_t status;
    float time;
    size_t memory;
    int determinism;
    int math_type;
    int reserved[3];
};
_Static_assert(sizeof(struct algo_perf) == 48, "cudnnConvolutionFwdAlgoPerf_t is 48 bytes");

enum { NON_DETERMINISTIC = 0, DETERMINISTIC = 1 };
enum { DEFAULT_MATH = 0 };
enum { FORWARD, BACKWARD_DATA, BACKWARD_FILTER };

/* Per pass: the algorithm with the im2col workspace and the one without (cudnn_cnn.h's
 * numbering: FWD_ALGO_GEMM 2 and IMPLICIT_GEMM 0; BWD_DATA_ALGO_1 1 and ALGO_0 0;
 * BWD_FILTER_ALGO_1 1 and ALGO_0 0), and how many algorithms the real cuDNN numbers. */
static const struct {
    int with_workspace, without, count;
} PASSES[] = {
    [FORWARD] = {2, 0, 8},
    [BACKWARD_DATA] = {1, 0, 6},
    [BACKWARD_FILTER] = {1, 0, 7},
};
#define WITH_WORKSPACE_MS 1.0f
#define WITHOUT_MS 2.0f


/* Bytes of one element of cudnnDataType_t `type` (0 for an unknown type). */
static size_t element_bytes(int type)
{
    switch (type) {
    case 0: case 4: case 5: case 7: return 4; /* FLOAT, INT32, INT8x4, UINT8x4 */
    case 1: case 10: return 8;                /* DOUBLE, INT64 */
    case 2: case 9: return 2;                 /* HALF, BFLOAT16 */
    case 3: case 6: case 11: case 12: case 13: return 1; /* INT8, UINT8, BOOLEAN, FP8 */
    case 8: return 32;                        /* INT8x32 */
    default: return 0;
    }
}

/* One image's im2col matrix: W = [K, C/groups, R, S...], Y = [N, K, P, Q...]: C/groups x R x S
 * x P x Q elements of X's type. BAD_PARAM when the shapes do not agree. */
static cudnnStatus_t im2col_bytes(const struct legacy_descriptor *x,
                                  const struct legacy_descriptor *w,
                                  const struct legacy_descriptor *y, size_t *bytes)
{
    if (!x || !w || !y)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    int x_type, x_dims, x_dim[8], w_type, w_format, w_dims, w_dim[8], y_type, y_dims, y_dim[8];
    cudnnStatus_t rc = cudnnGetTensorNdDescriptor(x, 8, &x_type, &x_dims, x_dim, NULL);
    if (rc == CUDNN_STATUS_SUCCESS)
        rc = cudnnGetFilterNdDescriptor(w, 8, &w_type, &w_format, &w_dims, w_dim);
    if (rc == CUDNN_STATUS_SUCCESS)
        rc = cudnnGetTensorNdDescriptor(y, 8, &y_type, &y_dims, y_dim, NULL);
    if (rc != CUDNN_STATUS_SUCCESS)
        return rc;
    if (x_dims < 3 || w_dims != x_dims || y_dims != x_dims || x_dim[0] != y_dim[0] ||
        w_dim[0] != y_dim[1])
        return CUDNN_STATUS_BAD_PARAM;
    size_t total = element_bytes(x_type);
    for (int i = 1; i < w_dims; i++)
        total *= (size_t)(w_dim[i] > 0 ? w_dim[i] : 0);
    for (int i = 2; i < y_dims; i++)
        total *= (size_t)(y_dim[i] > 0 ? y_dim[i] : 0);
    *bytes = total;
    return CUDNN_STATUS_SUCCESS;
}

/* The two algorithms of PASS, fastest first, at most REQUESTED of them; with a workspace
 * limit (the Find functions: the workspace the caller passed) an algorithm needing more is
 * reported as cuDNN reports one it could not run: status ALLOC_FAILED. */
static cudnnStatus_t results(int pass, const struct legacy_descriptor *x,
                             const struct legacy_descriptor *w,
                             const struct legacy_descriptor *y, int requested, int *returned,
                             struct algo_perf *perf, const size_t *limit)
{
    if (!returned || !perf)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (requested < 1)
        return CUDNN_STATUS_BAD_PARAM;
    size_t workspace;
    cudnnStatus_t rc = im2col_bytes(x, w, y, &workspace);
    if (rc != CUDNN_STATUS_SUCCESS)
        return rc;
    const struct algo_perf all[2] = {
        {PASSES[pass].with_workspace, CUDNN_STATUS_SUCCESS, WITH_WORKSPACE_MS, workspace,
         DETERMINISTIC, DEFAULT_MATH, {0}},
        {PASSES[pass].without, CUDNN_STATUS_SUCCESS, WITHOUT_MS, 0, DETERMINISTIC, DEFAULT_MATH, {0}},
    };
    int n = requested < 2 ? requested : 2;
    for (int i = 0; i < n; i++) {
        perf[i] = all[i];
        if (limit && perf[i].memory > *limit) {
            perf[i].status = CUDNN_STATUS_ALLOC_FAILED;
            perf[i].time = -1.0f;
            perf[i].memory = 0;
        }
    }
    /* The search lists what ran first, by time, as cuDNN does. */
    if (limit && n == 2 && perf[0].status != CUDNN_STATUS_SUCCESS) {
        struct algo_perf failed = perf[0];
        perf[0] = perf[1];
        perf[1] = failed;
    }
    *returned = n;
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t workspace_of(int pass, const struct legacy_descriptor *x,
                                  const struct legacy_descriptor *w,
                                  const struct legacy_descriptor *y, int algo, size_t *size)
{
    if (!size)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    size_t im2col;
    cudnnStatus_t rc = im2col_bytes(x, w, y, &im2col);
    if (rc != CUDNN_STATUS_SUCCESS)
        return rc;
    if (algo < 0 || algo >= PASSES[pass].count)
        return CUDNN_STATUS_BAD_PARAM;
    /* The other algorithms cuDNN numbers: no workspace, like the fallback. */
    *size = algo == PASSES[pass].with_workspace ? im2col : 0;
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t max_count(int pass, void *handle, int *count)
{
    if (!handle || !count)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *count = PASSES[pass].count;
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(void *handle, int *count)
{
    return max_count(FORWARD, handle, count);
}

FG_EXPORT cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithmMaxCount(void *handle,
                                                                         int *count)
{
    return max_count(BACKWARD_DATA, handle, count);
}

FG_EXPORT cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(void *handle,
                                                                           int *count)
{
    return max_count(BACKWARD_FILTER, handle, count);
}

FG_EXPORT cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    void *handle, const struct legacy_descriptor *x, const struct legacy_descriptor *w,
    const void *conv, const struct legacy_descriptor *y, int requested, int *returned,
    struct algo_perf *perf)
{
    if (!handle || !conv)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    return results(FORWARD, x, w, y, requested, returned, perf, NULL);
}

FG_EXPORT cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    void *handle, const struct legacy_descriptor *x_desc, const void *x,
    const struct legacy_descriptor *w_desc, const void *w, const void *conv,
    const struct legacy_descriptor *y_desc, void *y, int requested, int *returned,
    struct algo_perf *perf, void *work, size_t work_bytes)
{
    if (!handle || !conv || !x || !w || !y || (work_bytes && !work))
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    return results(FORWARD, x_desc, w_desc, y_desc, requested, returned, perf, &work_bytes);
}

FG_EXPORT cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(
    void *handle, const struct legacy_descriptor *x, const struct legacy_descriptor *w,
    const void *conv, const struct legacy_descriptor *y, int algo, size_t *size)
{
    if (!handle || !conv)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    return workspace_of(FORWARD, x, w, y, algo, size);
}

/* Backward data: dx is the convolution's input, dy its output. */
FG_EXPORT cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    void *handle, const struct legacy_descriptor *w, const struct legacy_descriptor *dy,
    const void *conv, const struct legacy_descriptor *dx, int requested, int *returned,
    struct algo_perf *perf)
{
    if (!handle || !conv)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    return results(BACKWARD_DATA, dx, w, dy, requested, returned, perf, NULL);
}

FG_EXPORT cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    void *handle, const struct legacy_descriptor *w_desc, const void *w,
    const struct legacy_descriptor *dy_desc, const void *dy, const void *conv,
    const struct legacy_descriptor *dx_desc, void *dx, int requested, int *returned,
    struct algo_perf *perf, void *work, size_t work_bytes)
{
    if (!handle || !conv || !w || !dy || !dx || (work_bytes && !work))
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    return results(BACKWARD_DATA, dx_desc, w_desc, dy_desc, requested, returned, perf,
                   &work_bytes);
}

FG_EXPORT cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    void *handle, const struct legacy_descriptor *w, const struct legacy_descriptor *dy,
    const void *conv, const struct legacy_descriptor *dx, int algo, size_t *size)
{
    if (!handle || !conv)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    return workspace_of(BACKWARD_DATA, dx, w, dy, algo, size);
}

/* Backward filter: x is the convolution's input, dy its output, dw the filter's gradient. */
FG_EXPORT cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    void *handle, const struct legacy_descriptor *x, const struct legacy_descriptor *dy,
    const void *conv, const struct legacy_descriptor *dw, int requested, int *returned,
    struct algo_perf *perf)
{
    if (!handle || !conv)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    return results(BACKWARD_FILTER, x, dw, dy, requested, returned, perf, NULL);
}

FG_EXPORT cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    void *handle, const struct legacy_descriptor *x_desc, const void *x,
    const struct legacy_descriptor *dy_desc, const void *dy, const void *conv,
    const struct legacy_descriptor *dw_desc, void *dw, int requested, int *returned,
    struct algo_perf *perf, void *work, size_t work_bytes)
{
    if (!handle || !conv || !x || !dy || !dw || (work_bytes && !work))
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    return results(BACKWARD_FILTER, x_desc, dw_desc, dy_desc, requested, returned, perf,
                   &work_bytes);
}

FG_EXPORT cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    void *handle, const struct legacy_descriptor *x, const struct legacy_descriptor *dy,
    const void *conv, const struct legacy_descriptor *dw, int algo, size_t *size)
{
    if (!handle || !conv)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    return workspace_of(BACKWARD_FILTER, x, dw, dy, algo, size);
}

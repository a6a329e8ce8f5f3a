/* A program linked against cuDNN's sub-libraries, as one built with their import libraries is
 * (each function bound to the sub-library that exports it, under that library's version node).
 * Built with -DCUDNN_MAJOR=8 (the default): handles and tensor descriptors from
 * libcudnn_ops_infer.so.8, convolutions and the backend API from libcudnn_cnn_infer.so.8, their
 * backward passes from libcudnn_cnn_train.so.8 and libcudnn_ops_train.so.8, RNN and CTC
 * descriptors from the adv libraries. With -DCUDNN_MAJOR=9: handles and the backend API from
 * libcudnn_graph.so.9, descriptors and batch normalisation from libcudnn_ops.so.9, convolutions
 * from libcudnn_cnn.so.9, RNN and CTC from libcudnn_adv.so.9, a version check from
 * libcudnn_ext.so.9. Built with -DSUBLIBS (linked against the sub-libraries) or without (linked
 * against libcudnn.so.N alone, which exports the whole API): both print the same lines, except
 * the sub-libraries' own functions (SUBLIBS only). One line per step: "<step> <values>". */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifndef CUDNN_MAJOR
#define CUDNN_MAJOR 8
#endif

typedef int cudnnStatus_t;
typedef void *cudnnHandle_t;
typedef void *cudnnDescriptor_t;

/* libcudart.so.12 (with cuDNN 8) or libcudart.so.13 (with cuDNN 9) */
int cudaMalloc(void **p, size_t size);
int cudaFree(void *p);
int cudaMemcpy(void *dst, const void *src, size_t n, int kind);
int cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

/* Where each function is: cuDNN 8's sub-library / cuDNN 9's. */
/* libcudnn_ops_infer.so.8 / libcudnn_graph.so.9 */
size_t cudnnGetVersion(void);
cudnnStatus_t cudnnGetProperty(int type, int *value);
cudnnStatus_t cudnnCreate(cudnnHandle_t *handle);
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle);
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, void *stream);
cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, void **stream);
const char *cudnnGetErrorString(cudnnStatus_t status);
/* libcudnn_ops_infer.so.8 / libcudnn_ops.so.9 */
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnDescriptor_t *d);
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnDescriptor_t d);
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnDescriptor_t d, int format, int type, int n, int c,
                                         int h, int w);
cudnnStatus_t cudnnGetTensorNdDescriptor(cudnnDescriptor_t d, int requested, int *type, int *dims,
                                         int *dim, int *stride);
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnDescriptor_t *d);
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnDescriptor_t d);
cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnDescriptor_t d, int type, int format, int dims,
                                         const int *dim);
/* libcudnn_ops_train.so.8 / libcudnn_ops.so.9 */
cudnnStatus_t cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
    cudnnHandle_t handle, int mode, int ops, cudnnDescriptor_t activation, cudnnDescriptor_t x,
    size_t *bytes);
/* libcudnn_cnn_infer.so.8 / libcudnn_cnn.so.9 */
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnDescriptor_t *d);
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnDescriptor_t d);
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnDescriptor_t d, int pad_h, int pad_w, int u,
                                              int v, int dilation_h, int dilation_w, int mode,
                                              int type);
cudnnStatus_t cudnnIm2Col(void); /* not implemented: called without arguments */
cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle, cudnnDescriptor_t x,
                                                      cudnnDescriptor_t w, cudnnDescriptor_t conv,
                                                      cudnnDescriptor_t y, int algo,
                                                      size_t *bytes);
cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha,
                                      cudnnDescriptor_t xd, const void *x, cudnnDescriptor_t wd,
                                      const void *w, cudnnDescriptor_t conv, int algo,
                                      void *workspace, size_t workspace_bytes, const void *beta,
                                      cudnnDescriptor_t yd, void *y);
/* libcudnn_cnn_infer.so.8 / libcudnn_graph.so.9 */
cudnnStatus_t cudnnBackendCreateDescriptor(int kind, cudnnDescriptor_t *d);
cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnDescriptor_t d);
cudnnStatus_t cudnnBackendSetAttribute(cudnnDescriptor_t d, int name, int type, int64_t count,
                                       const void *values);
cudnnStatus_t cudnnBackendGetAttribute(cudnnDescriptor_t d, int name, int type,
                                       int64_t requested, int64_t *count, void *values);
cudnnStatus_t cudnnBackendFinalize(cudnnDescriptor_t d);
cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnDescriptor_t plan,
                                  cudnnDescriptor_t variant_pack);
/* libcudnn_cnn_train.so.8 / libcudnn_cnn.so.9 */
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void *alpha,
                                             cudnnDescriptor_t xd, const void *x,
                                             cudnnDescriptor_t dyd, const void *dy,
                                             cudnnDescriptor_t conv, int algo, void *workspace,
                                             size_t workspace_bytes, const void *beta,
                                             cudnnDescriptor_t dwd, void *dw);
/* libcudnn_adv_infer.so.8 and libcudnn_adv_train.so.8 / libcudnn_adv.so.9 */
cudnnStatus_t cudnnCreateRNNDescriptor(cudnnDescriptor_t *d);
cudnnStatus_t cudnnDestroyRNNDescriptor(cudnnDescriptor_t d);
cudnnStatus_t cudnnCreateCTCLossDescriptor(cudnnDescriptor_t *d);
cudnnStatus_t cudnnDestroyCTCLossDescriptor(cudnnDescriptor_t d);
cudnnStatus_t cudnnSetCTCLossDescriptor_v8(cudnnDescriptor_t d, int compute_type,
                                          int normalization, int gradient_mode,
                                          int max_label_length);
cudnnStatus_t cudnnMultiHeadAttnForward(void); /* not implemented: called without arguments */
/* Each sub-library's check that it is libcudnn.so.N's release. */
#if CUDNN_MAJOR == 8
cudnnStatus_t cudnnOpsInferVersionCheck(void);
cudnnStatus_t cudnnOpsTrainVersionCheck(void);
cudnnStatus_t cudnnCnnInferVersionCheck(void);
cudnnStatus_t cudnnCnnTrainVersionCheck(void);
cudnnStatus_t cudnnAdvInferVersionCheck(void);
cudnnStatus_t cudnnAdvTrainVersionCheck(void);
#else
cudnnStatus_t cudnnGraphVersionCheck(void);
cudnnStatus_t cudnnOpsVersionCheck(void);
cudnnStatus_t cudnnCnnVersionCheck(void);
cudnnStatus_t cudnnAdvVersionCheck(void);
cudnnStatus_t cudnnSubquadraticOpsVersionCheck(void); /* libcudnn_ext.so.9 */
#endif
#ifdef SUBLIBS
/* Exported by the sub-libraries only (cuDNN's internal entry points; what they take is not
 * published: called without arguments, as the fake's stubs take none). */
#if CUDNN_MAJOR == 8
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSizeInternal(void);
cudnnStatus_t cudnnPooling4dBackward(void);
#define OWN_FUNCTION_1 cudnnGetConvolutionBackwardDataWorkspaceSizeInternal
#define OWN_FUNCTION_2 cudnnPooling4dBackward
#else
cudnnStatus_t cudnnGetLibConfig(void);               /* libcudnn_graph.so.9 */
cudnnStatus_t dummyBackendEnginesPreCompiledSymbol(void); /* libcudnn_engines_precompiled.so.9 */
#define OWN_FUNCTION_1 cudnnGetLibConfig
#define OWN_FUNCTION_2 dummyBackendEnginesPreCompiledSymbol
#endif
#endif

/* cudnnBackendDescriptorType_t, cudnnBackendAttributeName_t and cudnnBackendAttributeType_t
 * values (cudnn_backend.h of cuDNN 8.9). */
enum {
    ENGINECFG = 3, ENGINEHEUR = 4, EXECUTION_PLAN = 5, OPERATION_CONVOLUTION_FORWARD = 10,
    OPERATIONGRAPH = 15, TENSOR = 17, VARIANT_PACK = 18,
};
enum {
    HEUR_OPERATION_GRAPH = 201, HEUR_RESULTS = 202, ENGINECFG_WORKSPACE_SIZE = 303,
    PLAN_HANDLE = 400, PLAN_ENGINE_CONFIG = 401, PLAN_WORKSPACE_SIZE = 402, CONV_FORWARD_W = 703,
    CONV_FORWARD_X = 704, CONV_FORWARD_Y = 705, OPERATIONGRAPH_HANDLE = 800,
    OPERATIONGRAPH_OPS = 801, TENSOR_DATA_TYPE = 901, TENSOR_DIMENSIONS = 902,
};
enum { TYPE_HANDLE = 0, TYPE_DATA_TYPE = 1, TYPE_INT64 = 3, TYPE_BACKEND_DESCRIPTOR = 15 };

static size_t used_bytes(void)
{
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    return total - free_bytes;
}

static cudnnDescriptor_t backend_tensor(int64_t n, int64_t c, int64_t h, int64_t w)
{
    cudnnDescriptor_t d = NULL;
    const int64_t dims[4] = {n, c, h, w};
    const int float_type = 0;
    cudnnBackendCreateDescriptor(TENSOR, &d);
    cudnnBackendSetAttribute(d, TENSOR_DIMENSIONS, TYPE_INT64, 4, dims);
    cudnnBackendSetAttribute(d, TENSOR_DATA_TYPE, TYPE_DATA_TYPE, 1, &float_type);
    cudnnBackendFinalize(d);
    return d;
}

int main(void)
{
    int major = -1, minor = -1, patch = -1;
    cudnnGetProperty(0, &major);
    cudnnGetProperty(1, &minor);
    cudnnGetProperty(2, &patch);
    printf("version %zu property=%d.%d.%d\n", cudnnGetVersion(), major, minor, patch);
#if CUDNN_MAJOR == 8
    printf("checks ops_infer=%d ops_train=%d cnn_infer=%d cnn_train=%d adv_infer=%d "
           "adv_train=%d\n",
           cudnnOpsInferVersionCheck(), cudnnOpsTrainVersionCheck(), cudnnCnnInferVersionCheck(),
           cudnnCnnTrainVersionCheck(), cudnnAdvInferVersionCheck(), cudnnAdvTrainVersionCheck());
#else
    printf("checks graph=%d ops=%d cnn=%d adv=%d subquadratic_ops=%d\n", cudnnGraphVersionCheck(),
           cudnnOpsVersionCheck(), cudnnCnnVersionCheck(), cudnnAdvVersionCheck(),
           cudnnSubquadraticOpsVersionCheck());
#endif

    /* The context first, so that the handle's own memory is all the next difference. */
    cudaFree(NULL);
    size_t before = used_bytes();
    cudnnHandle_t handle = NULL;
    cudnnStatus_t rc = cudnnCreate(&handle);
    size_t with_handle = used_bytes();
    void *stream = (void *)1;
    cudnnStatus_t set = cudnnSetStream(handle, NULL);
    cudnnStatus_t get = cudnnGetStream(handle, &stream);
    printf("handle rc=%d bytes=%zu stream rc=%d rc=%d null=%d\n", rc, with_handle - before, set,
           get, stream == NULL);

    /* Legacy descriptors from ops_infer (ops), read back; a convolution descriptor from
     * cnn_infer (cnn). */
    cudnnDescriptor_t x = NULL, y = NULL, w = NULL, conv = NULL;
    cudnnCreateTensorDescriptor(&x);
    cudnnCreateTensorDescriptor(&y);
    cudnnCreateFilterDescriptor(&w);
    int set_x = cudnnSetTensor4dDescriptor(x, 0, 0, 1, 64, 128, 128);
    int set_y = cudnnSetTensor4dDescriptor(y, 0, 0, 1, 64, 128, 128);
    const int filter[4] = {64, 64, 3, 3};
    int set_w = cudnnSetFilterNdDescriptor(w, 0, 0, 4, filter);
    int type = -1, dims = -1, dim[4] = {0}, stride[4] = {0};
    int got = cudnnGetTensorNdDescriptor(x, 4, &type, &dims, dim, stride);
    printf("tensor rc=%d rc=%d rc=%d get rc=%d type=%d dims=%d dim=%dx%dx%dx%d "
           "stride=%d,%d,%d,%d\n",
           set_x, set_y, set_w, got, type, dims, dim[0], dim[1], dim[2], dim[3], stride[0],
           stride[1], stride[2], stride[3]);
    int created = cudnnCreateConvolutionDescriptor(&conv);
    int set_conv = cudnnSetConvolution2dDescriptor(conv, 1, 1, 1, 1, 1, 1, 1, 0);
    printf("conv descriptor rc=%d set rc=%d\n", created, set_conv);

    /* The legacy workspace query: none for IMPLICIT_GEMM (0), one image's im2col matrix for
     * GEMM (2). */
    size_t implicit = 12345, gemm = 12345;
    int ws1 = cudnnGetConvolutionForwardWorkspaceSize(handle, x, w, conv, y, 0, &implicit);
    int ws2 = cudnnGetConvolutionForwardWorkspaceSize(handle, x, w, conv, y, 2, &gemm);
    printf("legacy workspace rc=%d rc=%d bytes=%zu,%zu\n", ws1, ws2, implicit, gemm);
    /* Not implemented (in libcudnn.so.N too): NOT_SUPPORTED, twice, logged once. */
    int im1 = cudnnIm2Col(), im2 = cudnnIm2Col();
    printf("im2col rc=%d rc=%d text=%s\n", im1, im2, cudnnGetErrorString(im1));

    /* A forward and a backward-filter convolution: they complete and, like every kernel on the
     * fake GPU, leave the output as it was. */
    const size_t bytes = (size_t)64 * 128 * 128 * 4;
    void *dx = NULL, *dy = NULL, *dw = NULL;
    cudaMalloc(&dx, bytes);
    cudaMalloc(&dy, bytes);
    cudaMalloc(&dw, 64 * 64 * 9 * 4);
    static unsigned char pattern[4096], back[4096];
    for (size_t i = 0; i < sizeof pattern; i++)
        pattern[i] = (unsigned char)(i * 7 + 1);
    cudaMemcpy(dy, pattern, sizeof pattern, 1);
    const float alpha = 1.0f, beta = 0.0f;
    int fwd = cudnnConvolutionForward(handle, &alpha, x, dx, w, dw, conv, 0, NULL, 0, &beta, y, dy);
    int bwd = cudnnConvolutionBackwardFilter(handle, &alpha, x, dx, y, dy, conv, 0, NULL, 0,
                                             &beta, w, dw);
    cudaMemcpy(back, dy, sizeof back, 2);
    size_t reserve = 99;
    int bn = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, 1, 0, NULL, x, &reserve);
    printf("compute forward rc=%d backward_filter rc=%d output_unchanged=%d bn_reserve rc=%d "
           "bytes=%zu\n",
           fwd, bwd, memcmp(pattern, back, sizeof back) == 0, bn, reserve);

    /* The backend API: a convolution's operation graph, its heuristics' two engine configs
     * and their workspaces, a plan executed on the ops_infer (graph) handle. */
    cudnnDescriptor_t bx = backend_tensor(1, 64, 128, 128), bw = backend_tensor(64, 64, 3, 3),
                      by = backend_tensor(1, 64, 128, 128);
    cudnnDescriptor_t op = NULL, graph = NULL, heur = NULL, configs[2] = {NULL, NULL},
                      plan = NULL, pack = NULL;
    cudnnBackendCreateDescriptor(OPERATION_CONVOLUTION_FORWARD, &op);
    cudnnBackendSetAttribute(op, CONV_FORWARD_X, TYPE_BACKEND_DESCRIPTOR, 1, &bx);
    cudnnBackendSetAttribute(op, CONV_FORWARD_W, TYPE_BACKEND_DESCRIPTOR, 1, &bw);
    cudnnBackendSetAttribute(op, CONV_FORWARD_Y, TYPE_BACKEND_DESCRIPTOR, 1, &by);
    int op_rc = cudnnBackendFinalize(op);
    cudnnBackendCreateDescriptor(OPERATIONGRAPH, &graph);
    cudnnBackendSetAttribute(graph, OPERATIONGRAPH_HANDLE, TYPE_HANDLE, 1, &handle);
    cudnnBackendSetAttribute(graph, OPERATIONGRAPH_OPS, TYPE_BACKEND_DESCRIPTOR, 1, &op);
    int graph_rc = cudnnBackendFinalize(graph);
    cudnnBackendCreateDescriptor(ENGINEHEUR, &heur);
    cudnnBackendSetAttribute(heur, HEUR_OPERATION_GRAPH, TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    int heur_rc = cudnnBackendFinalize(heur);
    cudnnBackendCreateDescriptor(ENGINECFG, &configs[0]);
    cudnnBackendCreateDescriptor(ENGINECFG, &configs[1]);
    int64_t engines = -1, ws[2] = {-1, -1}, count = -1;
    int results = cudnnBackendGetAttribute(heur, HEUR_RESULTS, TYPE_BACKEND_DESCRIPTOR, 2,
                                           &engines, configs);
    int ws0 = cudnnBackendGetAttribute(configs[0], ENGINECFG_WORKSPACE_SIZE, TYPE_INT64, 1,
                                       &count, &ws[0]);
    int ws1b = cudnnBackendGetAttribute(configs[1], ENGINECFG_WORKSPACE_SIZE, TYPE_INT64, 1,
                                        &count, &ws[1]);
    printf("backend finalize op=%d graph=%d heur=%d results rc=%d engines=%lld workspace rc=%d "
           "rc=%d bytes=%lld,%lld\n",
           op_rc, graph_rc, heur_rc, results, (long long)engines, ws0, ws1b, (long long)ws[0],
           (long long)ws[1]);
    cudnnBackendCreateDescriptor(EXECUTION_PLAN, &plan);
    cudnnBackendSetAttribute(plan, PLAN_HANDLE, TYPE_HANDLE, 1, &handle);
    cudnnBackendSetAttribute(plan, PLAN_ENGINE_CONFIG, TYPE_BACKEND_DESCRIPTOR, 1, &configs[0]);
    int plan_rc = cudnnBackendFinalize(plan);
    int64_t plan_ws = -1;
    int plan_ws_rc = cudnnBackendGetAttribute(plan, PLAN_WORKSPACE_SIZE, TYPE_INT64, 1, &count,
                                              &plan_ws);
    cudnnBackendCreateDescriptor(VARIANT_PACK, &pack);
    cudnnBackendFinalize(pack);
    int exec = cudnnBackendExecute(handle, plan, pack);
    printf("plan rc=%d workspace rc=%d bytes=%lld execute rc=%d\n", plan_rc, plan_ws_rc,
           (long long)plan_ws, exec);
    cudnnDescriptor_t backend[] = {pack, plan, configs[0], configs[1], heur, graph, op, bx, bw, by};
    int destroyed = 0;
    for (size_t i = 0; i < sizeof backend / sizeof backend[0]; i++)
        destroyed += cudnnBackendDestroyDescriptor(backend[i]) == 0;
    printf("backend destroyed=%d\n", destroyed);

    /* The adv libraries' descriptors; an attention function that is not implemented. */
    cudnnDescriptor_t rnn = NULL, ctc = NULL;
    int rnn_rc = cudnnCreateRNNDescriptor(&rnn);
    int ctc_rc = cudnnCreateCTCLossDescriptor(&ctc);
    int ctc_set = cudnnSetCTCLossDescriptor_v8(ctc, 0, 1, 1, 255);
    int attention = cudnnMultiHeadAttnForward();
    printf("adv rnn rc=%d rc=%d ctc rc=%d set rc=%d rc=%d attention rc=%d\n", rnn_rc,
           cudnnDestroyRNNDescriptor(rnn), ctc_rc, ctc_set, cudnnDestroyCTCLossDescriptor(ctc),
           attention);

#ifdef SUBLIBS
    /* The sub-libraries' own exports, which libcudnn.so.N does not have: stubs of their own. */
    int own1 = OWN_FUNCTION_1();
    int own2 = OWN_FUNCTION_1();
    printf("sub-library only rc=%d rc=%d other rc=%d\n", own1, own2, OWN_FUNCTION_2());
#endif

    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dw);
    cudnnDestroyConvolutionDescriptor(conv);
    cudnnDestroyFilterDescriptor(w);
    cudnnDestroyTensorDescriptor(x);
    cudnnDestroyTensorDescriptor(y);
    int destroy = cudnnDestroy(handle);
    printf("destroy rc=%d used_after_minus_before=%lld\n", destroy,
           (long long)used_bytes() - (long long)before);
    return 0;
}

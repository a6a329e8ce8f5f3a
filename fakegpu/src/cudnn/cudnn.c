/* The fake cuDNN 9 (libcudnn.so.9), and cuDNN 8 (libcudnn.so.8, the same sources built with
 * FG_SONAME_MAJOR=8, for PyTorch 2.3 and older; the sub-libraries of each forward to it): version
 * queries, handles and their streams, error strings. The backend (graph) API is in backend.c, the legacy descriptors in legacy.c, the
 * compute functions that complete at once in noop.txt. */
#include <stddef.h>
#include <stdlib.h>

#include "fakegpu_library_memory.h"
#include "cudnn_status.h"

#define FG_EXPORT __attribute__((visibility("default")))

#if FG_SONAME_MAJOR == 8
/* cuDNN 8.9.2, the release PyTorch 2.3 is built with (CUDA 12.1): cuDNN 8 numbers its
 * versions major * 1000 + minor * 100 + patch. */
#define FG_CUDNN_VERSION 8902
#define FG_CUDNN_PARTS {8, 9, 2}
#define FG_CUDNN_CUDART 12010
#else
/* cuDNN 9.26.0, the release PyTorch 2.15 is built with: major * 10000 + minor * 100 + patch. */
#define FG_CUDNN_VERSION 92600
#define FG_CUDNN_PARTS {9, 26, 0}
#define FG_CUDNN_CUDART 13020
#endif

/* What a real handle allocates for itself: 25,344 and 4 bytes of device memory (cuMemAlloc_v2)
 * and 4 bytes of pinned host memory (cuMemHostAlloc). Measured with the recorder on an NVIDIA
 * H200 (driver 580.159.04) with cuDNN 9.19.0.56 under PyTorch 2.11: each of the two handles
 * (the forward's thread, the autograd thread) made exactly these (scripts/gpu_probe.py). */
static const size_t handle_allocations[] = {25344, 4};
#define HANDLE_ALLOCATIONS (sizeof handle_allocations / sizeof handle_allocations[0])
#define HANDLE_PINNED_BYTES 4

struct cudnn_handle {
    void *stream;
    CUdeviceptr own[HANDLE_ALLOCATIONS];
    void *pinned;
};

FG_EXPORT size_t cudnnGetVersion(void) { return FG_CUDNN_VERSION; }
FG_EXPORT size_t cudnnGetCudartVersion(void) { return FG_CUDNN_CUDART; }
FG_EXPORT size_t cudnnGetMaxDeviceVersion(void) { return 1200; }

#if FG_SONAME_MAJOR == 8
/* Each sub-library's check that it is the same release as libcudnn.so.8 (the real ones return
 * CUDNN_STATUS_VERSION_MISMATCH otherwise). The fake sub-libraries forward these to the fake
 * libcudnn.so.8 (fakegpu/build.py's FORWARDS), which is always their own release. */
FG_EXPORT cudnnStatus_t cudnnOpsInferVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
FG_EXPORT cudnnStatus_t cudnnOpsTrainVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
FG_EXPORT cudnnStatus_t cudnnCnnInferVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
FG_EXPORT cudnnStatus_t cudnnCnnTrainVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
FG_EXPORT cudnnStatus_t cudnnAdvInferVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
FG_EXPORT cudnnStatus_t cudnnAdvTrainVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
#else
/* cuDNN 9's checks, one per sub-library (libcudnn_{ops,cnn,adv,graph,ext}.so.9), likewise
 * forwarded to the fake libcudnn.so.9. */
FG_EXPORT cudnnStatus_t cudnnOpsVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
FG_EXPORT cudnnStatus_t cudnnCnnVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
FG_EXPORT cudnnStatus_t cudnnAdvVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
FG_EXPORT cudnnStatus_t cudnnGraphVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
FG_EXPORT cudnnStatus_t cudnnSubquadraticOpsVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
#endif

FG_EXPORT cudnnStatus_t cudnnGetProperty(int type, int *value)
{
    static const int version[] = FG_CUDNN_PARTS;
    if (!value)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (type < 0 || type > 2)
        return CUDNN_STATUS_BAD_PARAM;
    *value = version[type];
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnCreate(struct cudnn_handle **handle)
{
    if (!handle)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    struct cudnn_handle *h = calloc(1, sizeof *h);
    if (!h)
        return CUDNN_STATUS_ALLOC_FAILED;
    CUresult rc = fg_library_alloc(h->own, handle_allocations, HANDLE_ALLOCATIONS);
    if (rc == CUDA_SUCCESS) {
        rc = cuMemHostAlloc(&h->pinned, HANDLE_PINNED_BYTES, 0);
        if (rc)
            fg_library_free(h->own, HANDLE_ALLOCATIONS);
    }
    if (rc) {
        free(h);
        return rc == CUDA_ERROR_OUT_OF_MEMORY ? CUDNN_STATUS_ALLOC_FAILED
                                              : CUDNN_STATUS_NOT_INITIALIZED;
    }
    *handle = h;
    return CUDNN_STATUS_SUCCESS;
}

/* For backend.c: a device's first execution loads cuDNN's kernels, memory no hook sees
 * (VRAMSHIM_FAKEGPU_CUDNN_KERNEL_BYTES; docs/gpus.md). CUDNN_STATUS_ALLOC_FAILED when they do
 * not fit. */
cudnnStatus_t fg_cudnn_load_kernels(void)
{
    return fg_library_load_kernels("libcudnn") ? CUDNN_STATUS_ALLOC_FAILED : CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnDestroy(struct cudnn_handle *handle)
{
    if (!handle)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    fg_library_free(handle->own, HANDLE_ALLOCATIONS);
    if (handle->pinned)
        cuMemFreeHost(handle->pinned);
    free(handle);
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnSetStream(struct cudnn_handle *handle, void *stream)
{
    if (!handle)
        return CUDNN_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT cudnnStatus_t cudnnGetStream(struct cudnn_handle *handle, void **stream)
{
    if (!handle || !stream)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *stream = handle->stream;
    return CUDNN_STATUS_SUCCESS;
}

FG_EXPORT const char *cudnnGetErrorString(cudnnStatus_t status)
{
    switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_ALLOC_FAILED: return "CUDNN_STATUS_ALLOC_FAILED";
    default: return "CUDNN_STATUS_UNKNOWN";
    }
}

FG_EXPORT void cudnnGetLastErrorString(char *message, size_t max)
{
    if (message && max)
        message[0] = '\0';
}

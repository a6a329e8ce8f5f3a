/* The fake cuDNN 9 (libcudnn.so.9): version queries, handles and their streams, error
 * strings. The backend (graph) API is in backend.c, the legacy descriptors in legacy.c, the
 * compute functions that complete at once in noop.txt. */
#include <stddef.h>
#include <stdlib.h>

#define FG_EXPORT __attribute__((visibility("default")))
typedef int cudnnStatus_t;
enum {
    CUDNN_STATUS_SUCCESS = 0,
    CUDNN_STATUS_NOT_INITIALIZED = 1001,
    CUDNN_STATUS_BAD_PARAM = 2000,
    CUDNN_STATUS_BAD_PARAM_NULL_POINTER = 2002,
    CUDNN_STATUS_NOT_SUPPORTED = 3000,
    CUDNN_STATUS_ALLOC_FAILED = 4000,
};

/* cuDNN 9.26.0, the release PyTorch 2.15 is built with: major * 10000 + minor * 100 + patch. */
#define FG_CUDNN_VERSION 92600

struct cudnn_handle {
    void *stream;
};

FG_EXPORT size_t cudnnGetVersion(void) { return FG_CUDNN_VERSION; }
FG_EXPORT size_t cudnnGetCudartVersion(void) { return 13020; }
FG_EXPORT size_t cudnnGetMaxDeviceVersion(void) { return 1200; }

FG_EXPORT cudnnStatus_t cudnnGetProperty(int type, int *value)
{
    static const int version[] = {9, 26, 0};
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
    *handle = calloc(1, sizeof **handle);
    return *handle ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_ALLOC_FAILED;
}

FG_EXPORT cudnnStatus_t cudnnDestroy(struct cudnn_handle *handle)
{
    if (!handle)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
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

/* The fake cuBLAS (libcublas.so.12 and .13): handles with their stream, workspace and modes,
 * and the device memory a real handle takes. Compute functions are generated no-ops
 * (noop.txt). */
#include <stddef.h>
#include <stdlib.h>

#include "fakegpu_library_memory.h"

#define FG_EXPORT __attribute__((visibility("default")))
typedef int cublasStatus_t;
enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
};

/* What a real handle allocates at cublasCreate_v2, through the driver (cuBLAS links the CUDA
 * runtime statically, so cuMemAlloc_v2, never cudaMalloc), in this order. Measured with the
 * recorder on an NVIDIA H200 (compute capability 9.0, driver 580.159.04) with cuBLAS 13.1.0.3
 * from PyTorch 2.11's CUDA 13 wheel: every handle, one per thread that runs cuBLAS under
 * PyTorch, made exactly these three (scripts/gpu_probe.py). Other cards and releases were not
 * measured; the same sizes are used for every card. */
static const size_t handle_allocations[] = {1024, 128 << 10, 64 << 20};
#define HANDLE_ALLOCATIONS (sizeof handle_allocations / sizeof handle_allocations[0])

struct cublas_handle {
    void *stream;
    void *workspace;
    size_t workspace_bytes;
    int math_mode, pointer_mode, atomics_mode;
    CUdeviceptr own[HANDLE_ALLOCATIONS]; /* the handle's own device memory */
};
typedef struct cublas_handle *cublasHandle_t;

FG_EXPORT cublasStatus_t cublasCreate_v2(cublasHandle_t *handle)
{
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    struct cublas_handle *h = calloc(1, sizeof *h);
    if (!h)
        return CUBLAS_STATUS_ALLOC_FAILED;
    CUresult rc = fg_library_alloc(h->own, handle_allocations, HANDLE_ALLOCATIONS);
    /* A device's first handle: the memory beyond these allocations that no hook sees
     * (VRAMSHIM_FAKEGPU_CUBLAS_KERNEL_BYTES; docs/gpus.md). Charged here, not at the first
     * GEMM: PyTorch runs cuBLAS and cuBLASLt GEMMs through a handle it creates right before
     * its first one, so the growth is measured there, and an OOM has one place. */
    if (rc == CUDA_SUCCESS) {
        rc = fg_library_load_kernels("libcublas");
        if (rc)
            fg_library_free(h->own, HANDLE_ALLOCATIONS);
    }
    if (rc) {
        free(h);
        return rc == CUDA_ERROR_OUT_OF_MEMORY ? CUBLAS_STATUS_ALLOC_FAILED
                                              : CUBLAS_STATUS_NOT_INITIALIZED;
    }
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

FG_EXPORT cublasStatus_t cublasDestroy_v2(cublasHandle_t handle)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    fg_library_free(handle->own, HANDLE_ALLOCATIONS);
    free(handle);
    return CUBLAS_STATUS_SUCCESS;
}

FG_EXPORT cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int *version)
{
    if (!version)
        return CUBLAS_STATUS_INVALID_VALUE;
    *version = 130200; /* cuBLAS 13.2 */
    return CUBLAS_STATUS_SUCCESS;
}

FG_EXPORT cublasStatus_t cublasGetProperty(int type, int *value)
{
    static const int version[] = {13, 2, 0};
    if (!value || type < 0 || type > 2)
        return CUBLAS_STATUS_INVALID_VALUE;
    *value = version[type];
    return CUBLAS_STATUS_SUCCESS;
}

FG_EXPORT size_t cublasGetCudartVersion(void) { return 13020; }

#define SETTER(name, field, type)                                                         \
    FG_EXPORT cublasStatus_t name(cublasHandle_t handle, type value)                      \
    {                                                                                     \
        if (!handle)                                                                      \
            return CUBLAS_STATUS_NOT_INITIALIZED;                                         \
        handle->field = value;                                                            \
        return CUBLAS_STATUS_SUCCESS;                                                     \
    }
#define GETTER(name, field, type)                                                         \
    FG_EXPORT cublasStatus_t name(cublasHandle_t handle, type *value)                     \
    {                                                                                     \
        if (!handle)                                                                      \
            return CUBLAS_STATUS_NOT_INITIALIZED;                                         \
        if (!value)                                                                       \
            return CUBLAS_STATUS_INVALID_VALUE;                                           \
        *value = handle->field;                                                           \
        return CUBLAS_STATUS_SUCCESS;                                                     \
    }

SETTER(cublasSetStream_v2, stream, void *)
GETTER(cublasGetStream_v2, stream, void *)
SETTER(cublasSetMathMode, math_mode, int)
GETTER(cublasGetMathMode, math_mode, int)
SETTER(cublasSetPointerMode_v2, pointer_mode, int)
GETTER(cublasGetPointerMode_v2, pointer_mode, int)
SETTER(cublasSetAtomicsMode, atomics_mode, int)
GETTER(cublasGetAtomicsMode, atomics_mode, int)

FG_EXPORT cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t bytes)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes && !workspace)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->workspace = workspace;
    handle->workspace_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

FG_EXPORT const char *cublasGetStatusString(cublasStatus_t status)
{
    switch (status) {
    case 0: return "the operation completed successfully";
    case 1: return "the library was not initialized";
    case 3: return "the resource allocation failed";
    case 7: return "an invalid numeric value was used as an argument";
    case 15: return "the functionality requested is not supported";
    default: return "unknown error";
    }
}

FG_EXPORT const char *cublasGetStatusName(cublasStatus_t status)
{
    switch (status) {
    case 0: return "CUBLAS_STATUS_SUCCESS";
    case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
    case 7: return "CUBLAS_STATUS_INVALID_VALUE";
    case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN";
    }
}

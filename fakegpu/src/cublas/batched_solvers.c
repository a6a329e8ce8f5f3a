/* cuBLAS's batched solvers (getrf, getri, getrs, matinv, geqrf, gels; S, D, C and Z), which
 * torch.linalg calls for batches of small matrices: like the other compute functions they
 * complete at once and compute nothing, but they report success in their info outputs, which
 * the caller reads: the device arrays (one int per matrix: getrf, getri, matinv, gels's
 * devInfoArray) written 0 through the fake driver, and the host int of getrs, geqrf and gels
 * (parameter validity) set to 0. PyTorch asserts that host info is 0 after geqrfBatched
 * (torch.linalg.qr of a batch): left unwritten it held whatever its stack did. */
#include <stddef.h>

#include "fakegpu_cuda.h"

CUresult cuMemsetD32_v2(CUdeviceptr dptr, unsigned int value, size_t count);

#define FG_EXPORT __attribute__((visibility("default")))
typedef int cublasStatus_t;
enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
};
typedef void *H; /* cublasHandle_t */
typedef void *P; /* an array of the routine's type */

/* The call completes: COUNT device info values of 0 at DEVICE (where given), and *HOST = 0
 * (where given). */
static cublasStatus_t done(H handle, int *device, long long count, int *host)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (count < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (host)
        *host = 0;
    if (device && count && cuMemsetD32_v2((CUdeviceptr)device, 0, (size_t)count) != CUDA_SUCCESS)
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

#define BATCHED(t)                                                                        \
    FG_EXPORT cublasStatus_t cublas##t##getrfBatched(H h, int n, P *A, int lda, int *pivots, \
                                                     int *info, int batch)                \
    {                                                                                     \
        return info ? done(h, info, batch, NULL) : CUBLAS_STATUS_INVALID_VALUE;           \
    }                                                                                     \
    FG_EXPORT cublasStatus_t cublas##t##getriBatched(H h, int n, const P *A, int lda,       \
                                                     const int *pivots, P *C, int ldc,    \
                                                     int *info, int batch)                \
    {                                                                                     \
        return info ? done(h, info, batch, NULL) : CUBLAS_STATUS_INVALID_VALUE;           \
    }                                                                                     \
    FG_EXPORT cublasStatus_t cublas##t##matinvBatched(H h, int n, const P *A, int lda,      \
                                                      P *Ainv, int lda_inv, int *info,    \
                                                      int batch)                          \
    {                                                                                     \
        return info ? done(h, info, batch, NULL) : CUBLAS_STATUS_INVALID_VALUE;           \
    }                                                                                     \
    FG_EXPORT cublasStatus_t cublas##t##getrsBatched(H h, int trans, int n, int nrhs,       \
                                                     const P *A, int lda,                 \
                                                     const int *pivots, P *B, int ldb,    \
                                                     int *info, int batch)                \
    {                                                                                     \
        return info ? done(h, NULL, 0, info) : CUBLAS_STATUS_INVALID_VALUE;               \
    }                                                                                     \
    FG_EXPORT cublasStatus_t cublas##t##geqrfBatched(H h, int m, int n, P *A, int lda,      \
                                                     P *tau, int *info, int batch)        \
    {                                                                                     \
        return info ? done(h, NULL, 0, info) : CUBLAS_STATUS_INVALID_VALUE;               \
    }                                                                                     \
    /* devInfoArray may be NULL (documented). */                                          \
    FG_EXPORT cublasStatus_t cublas##t##gelsBatched(H h, int trans, int m, int n, int nrhs, \
                                                    P *A, int lda, P *C, int ldc,         \
                                                    int *info, int *dev_info, int batch)  \
    {                                                                                     \
        return info ? done(h, dev_info, batch, info) : CUBLAS_STATUS_INVALID_VALUE;       \
    }
BATCHED(S)
BATCHED(D)
BATCHED(C)
BATCHED(Z)

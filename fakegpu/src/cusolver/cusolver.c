/* The fake cuSOLVER dense API (libcusolver.so.11 and .12): handles with their stream, the
 * 64-bit API's parameter objects, the Jacobi solvers' info objects, every workspace query that
 * PyTorch's torch.linalg makes (the legacy API's `*_bufferSize`, in elements, and the 64-bit
 * API's `workspaceInBytesOnDevice` / `OnHost`), and the factorizations, solvers and eigen and
 * singular value decompositions, which complete at once like every kernel on the fake GPU (the
 * outputs keep whatever they held) but report success: each writes 0 to its `info` / `devInfo`
 * outputs (device memory, written through the fake driver; one per matrix for the batched
 * ones), which PyTorch reads back to raise on a singular or non-positive-definite matrix.
 *
 * WORKSPACE SIZES ARE AN ESTIMATE, not measured on NVIDIA's cuSOLVER (no GPU was available):
 * LAPACK's optimal workspace for the routine with a block size NB of 64 (see `estimate` below
 * for each routine); scripts/cufft_cusolver_probe.py asks a real cuSOLVER the same queries so
 * that a lent GPU can replace them. Host workspaces are 0. Not modelled: device memory a real
 * handle takes for itself (the probe reports cudaMemGetInfo around cusolverDnCreate), pivots
 * (getrf's and sytrf's stay whatever the memory held). */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

#include "fakegpu_library_memory.h"

CUresult cuMemsetD32_v2(CUdeviceptr dptr, unsigned int value, size_t count);

#define FG_EXPORT __attribute__((visibility("default")))
typedef int cusolverStatus_t;
enum {
    CUSOLVER_STATUS_SUCCESS = 0,
    CUSOLVER_STATUS_NOT_INITIALIZED = 1,
    CUSOLVER_STATUS_ALLOC_FAILED = 2,
    CUSOLVER_STATUS_INVALID_VALUE = 3,
};
enum { CUBLAS_SIDE_LEFT = 0 };
/* cudaDataType */
enum { CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16F = 2, CUDA_C_32F = 4, CUDA_C_64F = 5,
       CUDA_C_16F = 6, CUDA_R_16BF = 14, CUDA_C_16BF = 15 };

/* LAPACK's block size (ILAENV's default for the blocked factorizations): the estimates' unit. */
#define NB 64

struct cusolver_handle {
    void *stream;
    int deterministic_mode;
};
typedef struct cusolver_handle *cusolverDnHandle_t;
struct cusolver_params {
    int function, algorithm;
};
struct jacobi_info { /* gesvdjInfo_t and syevjInfo_t */
    double tolerance;
    int max_sweeps, sort;
};

FG_EXPORT cusolverStatus_t cusolverDnCreate(cusolverDnHandle_t *handle)
{
    if (!handle)
        return CUSOLVER_STATUS_INVALID_VALUE;
    /* As the real one: the driver initialised and a context current on the thread's device. */
    if (fg_library_ready() != CUDA_SUCCESS)
        return CUSOLVER_STATUS_NOT_INITIALIZED;
    struct cusolver_handle *h = calloc(1, sizeof *h);
    if (!h)
        return CUSOLVER_STATUS_ALLOC_FAILED;
    h->deterministic_mode = 1; /* CUSOLVER_DETERMINISTIC_RESULTS, the documented default */
    *handle = h;
    return CUSOLVER_STATUS_SUCCESS;
}

FG_EXPORT cusolverStatus_t cusolverDnDestroy(cusolverDnHandle_t handle)
{
    if (!handle)
        return CUSOLVER_STATUS_NOT_INITIALIZED;
    free(handle);
    return CUSOLVER_STATUS_SUCCESS;
}

FG_EXPORT cusolverStatus_t cusolverDnSetStream(cusolverDnHandle_t handle, void *stream)
{
    if (!handle)
        return CUSOLVER_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUSOLVER_STATUS_SUCCESS;
}

FG_EXPORT cusolverStatus_t cusolverDnGetStream(cusolverDnHandle_t handle, void **stream)
{
    if (!handle)
        return CUSOLVER_STATUS_NOT_INITIALIZED;
    if (!stream)
        return CUSOLVER_STATUS_INVALID_VALUE;
    *stream = handle->stream;
    return CUSOLVER_STATUS_SUCCESS;
}

FG_EXPORT cusolverStatus_t cusolverDnSetDeterministicMode(cusolverDnHandle_t handle, int mode)
{
    if (!handle)
        return CUSOLVER_STATUS_NOT_INITIALIZED;
    if (mode != 1 && mode != 2)
        return CUSOLVER_STATUS_INVALID_VALUE;
    handle->deterministic_mode = mode;
    return CUSOLVER_STATUS_SUCCESS;
}

FG_EXPORT cusolverStatus_t cusolverDnGetDeterministicMode(cusolverDnHandle_t handle, int *mode)
{
    if (!handle)
        return CUSOLVER_STATUS_NOT_INITIALIZED;
    if (!mode)
        return CUSOLVER_STATUS_INVALID_VALUE;
    *mode = handle->deterministic_mode;
    return CUSOLVER_STATUS_SUCCESS;
}

FG_EXPORT cusolverStatus_t cusolverDnCreateParams(struct cusolver_params **params)
{
    if (!params)
        return CUSOLVER_STATUS_INVALID_VALUE;
    *params = calloc(1, sizeof **params);
    return *params ? CUSOLVER_STATUS_SUCCESS : CUSOLVER_STATUS_ALLOC_FAILED;
}

FG_EXPORT cusolverStatus_t cusolverDnDestroyParams(struct cusolver_params *params)
{
    if (!params)
        return CUSOLVER_STATUS_INVALID_VALUE;
    free(params);
    return CUSOLVER_STATUS_SUCCESS;
}

FG_EXPORT cusolverStatus_t cusolverDnSetAdvOptions(struct cusolver_params *params, int function,
                                                   int algorithm)
{
    if (!params)
        return CUSOLVER_STATUS_INVALID_VALUE;
    params->function = function;
    params->algorithm = algorithm;
    return CUSOLVER_STATUS_SUCCESS;
}

/* The Jacobi solvers' configuration objects: they keep what is set; a decomposition that
 * computed nothing took no sweep and left no residual. */
static cusolverStatus_t jacobi_create(struct jacobi_info **info)
{
    if (!info)
        return CUSOLVER_STATUS_INVALID_VALUE;
    *info = calloc(1, sizeof **info);
    if (!*info)
        return CUSOLVER_STATUS_ALLOC_FAILED;
    (*info)->max_sweeps = 100; /* the documented defaults */
    (*info)->sort = 1;
    return CUSOLVER_STATUS_SUCCESS;
}

#define JACOBI_API(kind, Kind)                                                                \
    FG_EXPORT cusolverStatus_t cusolverDnCreate##Kind##Info(struct jacobi_info **info)    \
    {                                                                                     \
        return jacobi_create(info);                                                       \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDnDestroy##Kind##Info(struct jacobi_info *info)    \
    {                                                                                     \
        free(info);                                                                       \
        return CUSOLVER_STATUS_SUCCESS;                                                   \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDnX##kind##SetTolerance(struct jacobi_info *info,  \
                                                              double tolerance)           \
    {                                                                                     \
        if (!info)                                                                        \
            return CUSOLVER_STATUS_INVALID_VALUE;                                         \
        info->tolerance = tolerance;                                                      \
        return CUSOLVER_STATUS_SUCCESS;                                                   \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDnX##kind##SetMaxSweeps(struct jacobi_info *info,  \
                                                              int sweeps)                 \
    {                                                                                     \
        if (!info)                                                                        \
            return CUSOLVER_STATUS_INVALID_VALUE;                                         \
        info->max_sweeps = sweeps;                                                        \
        return CUSOLVER_STATUS_SUCCESS;                                                   \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDnX##kind##SetSortEig(struct jacobi_info *info,    \
                                                            int sort)                     \
    {                                                                                     \
        if (!info)                                                                        \
            return CUSOLVER_STATUS_INVALID_VALUE;                                         \
        info->sort = sort;                                                                \
        return CUSOLVER_STATUS_SUCCESS;                                                   \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDnX##kind##GetSweeps(                              \
        cusolverDnHandle_t handle, struct jacobi_info *info, int *sweeps)                 \
    {                                                                                     \
        if (!handle)                                                                      \
            return CUSOLVER_STATUS_NOT_INITIALIZED;                                       \
        if (!info || !sweeps)                                                             \
            return CUSOLVER_STATUS_INVALID_VALUE;                                         \
        *sweeps = 0;                                                                      \
        return CUSOLVER_STATUS_SUCCESS;                                                   \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDnX##kind##GetResidual(                            \
        cusolverDnHandle_t handle, struct jacobi_info *info, double *residual)            \
    {                                                                                     \
        if (!handle)                                                                      \
            return CUSOLVER_STATUS_NOT_INITIALIZED;                                       \
        if (!info || !residual)                                                           \
            return CUSOLVER_STATUS_INVALID_VALUE;                                         \
        *residual = 0;                                                                    \
        return CUSOLVER_STATUS_SUCCESS;                                                   \
    }
JACOBI_API(gesvdj, Gesvdj)
JACOBI_API(syevj, Syevj)

/* ------------------------------------------------------------------ workspace estimates */

/* The estimates, in elements of the matrix's type, per matrix (LAPACK's optimal LWORK with
 * NB = 64; the batched routines ask for one per matrix):
 *   potrf, getrf, geqrf, orgqr/ungqr, sytrf: NB x n (n the columns); ormqr/unmqr: NB x the
 *   order of Q's other side (n from the left, m from the right);
 *   syevd/heevd, syevj/heevj (and batched), Xsyevd, XsyevBatched: 1 + 6n + 2n^2 (?syevd with
 *   eigenvectors);
 *   gesvd: max(3 min(m,n) + max(m,n), 5 min(m,n)) + NB (m + n) (?gesvd's minimum, blocked);
 *   gesvdj (and batched), gesvdaStridedBatched: m n + n^2 (a copy of A and the accumulated
 *   rotations);
 *   Xgeev: 4n + 2n^2 (?geev with vectors: the Hessenberg form and the Schur vectors);
 *   Xsytrs, and the solves (getrs, potrs, Xpotrs): none. */
enum routine { BLOCKED, SYEVD, GESVD, JACOBI_SVD, GEEV, NO_WORK };

static unsigned __int128 estimate(enum routine routine, long long m, long long n)
{
    unsigned __int128 um = m > 0 ? (unsigned long long)m : 0, un = n > 0 ? (unsigned long long)n : 0;
    unsigned __int128 lo = um < un ? um : un, hi = um < un ? un : um;
    switch (routine) {
    case BLOCKED: return NB * un;
    case SYEVD: return 1 + 6 * un + 2 * un * un;
    case GESVD: return (3 * lo + hi > 5 * lo ? 3 * lo + hi : 5 * lo) + NB * (um + un);
    case JACOBI_SVD: return um * un + un * un;
    case GEEV: return 4 * un + 2 * un * un;
    default: return 0;
    }
}

/* A legacy query's answer: LWORK elements for BATCH matrices, as an int. */
static cusolverStatus_t lwork(cusolverDnHandle_t handle, enum routine routine, long long m,
                              long long n, long long batch, int *out)
{
    if (!handle)
        return CUSOLVER_STATUS_NOT_INITIALIZED;
    if (!out || m < 0 || n < 0 || batch < 0)
        return CUSOLVER_STATUS_INVALID_VALUE;
    unsigned __int128 elements = estimate(routine, m, n) * (unsigned long long)batch;
    if (elements > INT_MAX)
        return CUSOLVER_STATUS_INVALID_VALUE;
    *out = (int)elements;
    return CUSOLVER_STATUS_SUCCESS;
}

static unsigned data_bytes(int type)
{
    switch (type) {
    case CUDA_R_16F: case CUDA_R_16BF: return 2;
    case CUDA_R_32F: case CUDA_C_16F: case CUDA_C_16BF: return 4;
    case CUDA_R_64F: case CUDA_C_32F: return 8;
    case CUDA_C_64F: return 16;
    default: return 0;
    }
}

/* A 64-bit query's answer: bytes of TYPE on the device, none on the host. */
static cusolverStatus_t work_bytes(cusolverDnHandle_t handle, enum routine routine, long long m,
                                   long long n, long long batch, int type, size_t *device,
                                   size_t *host)
{
    if (!handle)
        return CUSOLVER_STATUS_NOT_INITIALIZED;
    if (!device || !host || m < 0 || n < 0 || batch < 0 || !data_bytes(type))
        return CUSOLVER_STATUS_INVALID_VALUE;
    unsigned __int128 bytes = estimate(routine, m, n) * (unsigned long long)batch * data_bytes(type);
    if (bytes > SIZE_MAX / 2)
        return CUSOLVER_STATUS_INVALID_VALUE;
    *device = (size_t)bytes;
    *host = 0;
    return CUSOLVER_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------ compute */

/* A routine completes: COUNT info values of 0 (success) written to device memory. */
static cusolverStatus_t done(cusolverDnHandle_t handle, int *info, long long count)
{
    if (!handle)
        return CUSOLVER_STATUS_NOT_INITIALIZED;
    if (!info || count < 0)
        return CUSOLVER_STATUS_INVALID_VALUE;
    if (count && cuMemsetD32_v2((CUdeviceptr)info, 0, (size_t)count) != CUDA_SUCCESS)
        return CUSOLVER_STATUS_INVALID_VALUE;
    return CUSOLVER_STATUS_SUCCESS;
}

typedef cusolverDnHandle_t H;
typedef void *P; /* a matrix or vector of the routine's type (S, D, C or Z) */

/* Each macro defines one routine for the prefixes given (the types differ only in pointers). */
#define EACH4(M, a, b, c, d) M(a) M(b) M(c) M(d)

/* potrf */
#define POTRF(t)                                                                          \
    FG_EXPORT cusolverStatus_t cusolverDn##t##potrf_bufferSize(H h, int uplo, int n, P A,  \
                                                               int lda, int *lw)          \
    {                                                                                     \
        return lwork(h, BLOCKED, n, n, 1, lw);                                            \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##potrf(H h, int uplo, int n, P A, int lda,    \
                                                    P work, int lw, int *info)            \
    {                                                                                     \
        return done(h, info, 1);                                                          \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##potrs(H h, int uplo, int n, int nrhs, P A,   \
                                                    int lda, P B, int ldb, int *info)     \
    {                                                                                     \
        return done(h, info, 1);                                                          \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##potrfBatched(H h, int uplo, int n, P *A,     \
                                                           int lda, int *info, int batch) \
    {                                                                                     \
        return done(h, info, batch);                                                      \
    }                                                                                     \
    /* One info for the batch, as documented. */                                        \
    FG_EXPORT cusolverStatus_t cusolverDn##t##potrsBatched(H h, int uplo, int n, int nrhs, \
                                                           P *A, int lda, P *B, int ldb,  \
                                                           int *info, int batch)          \
    {                                                                                     \
        return done(h, info, 1);                                                          \
    }
EACH4(POTRF, S, D, C, Z)

/* getrf, getrs */
#define GETRF(t)                                                                          \
    FG_EXPORT cusolverStatus_t cusolverDn##t##getrf_bufferSize(H h, int m, int n, P A,     \
                                                               int lda, int *lw)          \
    {                                                                                     \
        return lwork(h, BLOCKED, m, n, 1, lw);                                            \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##getrf(H h, int m, int n, P A, int lda,       \
                                                    P work, int *ipiv, int *info)         \
    {                                                                                     \
        return done(h, info, 1);                                                          \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##getrs(H h, int trans, int n, int nrhs, P A,  \
                                                    int lda, const int *ipiv, P B,        \
                                                    int ldb, int *info)                   \
    {                                                                                     \
        return done(h, info, 1);                                                          \
    }
EACH4(GETRF, S, D, C, Z)

/* geqrf, sytrf */
#define GEQRF(t)                                                                          \
    FG_EXPORT cusolverStatus_t cusolverDn##t##geqrf_bufferSize(H h, int m, int n, P A,     \
                                                               int lda, int *lw)          \
    {                                                                                     \
        return lwork(h, BLOCKED, m, n, 1, lw);                                            \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##geqrf(H h, int m, int n, P A, int lda,       \
                                                    P tau, P work, int lw, int *info)     \
    {                                                                                     \
        return done(h, info, 1);                                                          \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##sytrf_bufferSize(H h, int n, P A, int lda,   \
                                                               int *lw)                   \
    {                                                                                     \
        return lwork(h, BLOCKED, n, n, 1, lw);                                            \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##sytrf(H h, int uplo, int n, P A, int lda,    \
                                                    int *ipiv, P work, int lw, int *info) \
    {                                                                                     \
        return done(h, info, 1);                                                          \
    }
EACH4(GEQRF, S, D, C, Z)

/* orgqr/ungqr and ormqr/unmqr: NAME is the routine's name for the prefix. */
#define ORGQR(t, name)                                                                    \
    FG_EXPORT cusolverStatus_t cusolverDn##t##name##_bufferSize(H h, int m, int n, int k,  \
                                                                P A, int lda, P tau,      \
                                                                int *lw)                  \
    {                                                                                     \
        return lwork(h, BLOCKED, m, n, 1, lw);                                            \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##name(H h, int m, int n, int k, P A, int lda, \
                                                   P tau, P work, int lw, int *info)      \
    {                                                                                     \
        return done(h, info, 1);                                                          \
    }
ORGQR(S, orgqr)
ORGQR(D, orgqr)
ORGQR(C, ungqr)
ORGQR(Z, ungqr)

#define ORMQR(t, name)                                                                    \
    FG_EXPORT cusolverStatus_t cusolverDn##t##name##_bufferSize(                           \
        H h, int side, int trans, int m, int n, int k, P A, int lda, P tau, P C, int ldc,  \
        int *lw)                                                                          \
    {                                                                                     \
        return lwork(h, BLOCKED, 0, side == CUBLAS_SIDE_LEFT ? n : m, 1, lw);             \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##name(H h, int side, int trans, int m, int n, \
                                                   int k, P A, int lda, P tau, P C,       \
                                                   int ldc, P work, int lw, int *info)    \
    {                                                                                     \
        return done(h, info, 1);                                                          \
    }
ORMQR(S, ormqr)
ORMQR(D, ormqr)
ORMQR(C, unmqr)
ORMQR(Z, unmqr)

/* syevd/heevd, syevj/heevj and their batched form */
#define SYEV(t, name)                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##name##d_bufferSize(H h, int jobz, int uplo,  \
                                                                 int n, P A, int lda,     \
                                                                 P W, int *lw)            \
    {                                                                                     \
        return lwork(h, SYEVD, n, n, 1, lw);                                              \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##name##d(H h, int jobz, int uplo, int n, P A, \
                                                      int lda, P W, P work, int lw,       \
                                                      int *info)                          \
    {                                                                                     \
        return done(h, info, 1);                                                          \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##name##j_bufferSize(                          \
        H h, int jobz, int uplo, int n, P A, int lda, P W, int *lw, void *params)         \
    {                                                                                     \
        return lwork(h, SYEVD, n, n, 1, lw);                                              \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##name##j(H h, int jobz, int uplo, int n, P A, \
                                                      int lda, P W, P work, int lw,       \
                                                      int *info, void *params)            \
    {                                                                                     \
        return done(h, info, 1);                                                          \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##name##jBatched_bufferSize(                   \
        H h, int jobz, int uplo, int n, P A, int lda, P W, int *lw, void *params,         \
        int batch)                                                                        \
    {                                                                                     \
        return lwork(h, SYEVD, n, n, batch, lw);                                          \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##name##jBatched(                              \
        H h, int jobz, int uplo, int n, P A, int lda, P W, P work, int lw, int *info,      \
        void *params, int batch)                                                          \
    {                                                                                     \
        return done(h, info, batch);                                                      \
    }
SYEV(S, syev)
SYEV(D, syev)
SYEV(C, heev)
SYEV(Z, heev)

/* gesvd, gesvdj (and batched), gesvdaStridedBatched */
#define GESVD(t)                                                                          \
    FG_EXPORT cusolverStatus_t cusolverDn##t##gesvd_bufferSize(H h, int m, int n, int *lw) \
    {                                                                                     \
        return lwork(h, GESVD, m, n, 1, lw);                                              \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##gesvd(                                       \
        H h, signed char jobu, signed char jobvt, int m, int n, P A, int lda, P S, P U,    \
        int ldu, P VT, int ldvt, P work, int lw, P rwork, int *info)                      \
    {                                                                                     \
        return done(h, info, 1);                                                          \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##gesvdj_bufferSize(                           \
        H h, int jobz, int econ, int m, int n, P A, int lda, P S, P U, int ldu, P V,       \
        int ldv, int *lw, void *params)                                                   \
    {                                                                                     \
        return lwork(h, JACOBI_SVD, m, n, 1, lw);                                         \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##gesvdj(                                      \
        H h, int jobz, int econ, int m, int n, P A, int lda, P S, P U, int ldu, P V,       \
        int ldv, P work, int lw, int *info, void *params)                                 \
    {                                                                                     \
        return done(h, info, 1);                                                          \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##gesvdjBatched_bufferSize(                    \
        H h, int jobz, int m, int n, P A, int lda, P S, P U, int ldu, P V, int ldv,        \
        int *lw, void *params, int batch)                                                 \
    {                                                                                     \
        return lwork(h, JACOBI_SVD, m, n, batch, lw);                                     \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##gesvdjBatched(                               \
        H h, int jobz, int m, int n, P A, int lda, P S, P U, int ldu, P V, int ldv,        \
        P work, int lw, int *info, void *params, int batch)                               \
    {                                                                                     \
        return done(h, info, batch);                                                      \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##gesvdaStridedBatched_bufferSize(             \
        H h, int jobz, int rank, int m, int n, P A, int lda, long long stride_a, P S,      \
        long long stride_s, P U, int ldu, long long stride_u, P V, int ldv,                \
        long long stride_v, int *lw, int batch)                                           \
    {                                                                                     \
        return lwork(h, JACOBI_SVD, m, n, batch, lw);                                     \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##gesvdaStridedBatched(                        \
        H h, int jobz, int rank, int m, int n, P A, int lda, long long stride_a, P S,      \
        long long stride_s, P U, int ldu, long long stride_u, P V, int ldv,                \
        long long stride_v, P work, int lw, int *info, double *residual_norms, int batch)  \
    {                                                                                     \
        /* The residuals' Frobenius norms, on the host (optional): none, nothing computed. */ \
        for (int i = 0; residual_norms && i < batch; i++)                                 \
            residual_norms[i] = 0;                                                        \
        return done(h, info, batch);                                                      \
    }
EACH4(GESVD, S, D, C, Z)

/* ------------------------------------------------------------------ the 64-bit API */
typedef struct cusolver_params *Q;
typedef long long I;

FG_EXPORT cusolverStatus_t cusolverDnXpotrf_bufferSize(H h, Q q, int uplo, I n, int type_a,
                                                       const void *A, I lda, int compute,
                                                       size_t *device, size_t *host)
{
    return work_bytes(h, BLOCKED, n, n, 1, type_a, device, host);
}

FG_EXPORT cusolverStatus_t cusolverDnXpotrf(H h, Q q, int uplo, I n, int type_a, void *A, I lda,
                                            int compute, void *work, size_t device_bytes,
                                            void *host_work, size_t host_bytes, int *info)
{
    return done(h, info, 1);
}

FG_EXPORT cusolverStatus_t cusolverDnXpotrs(H h, Q q, int uplo, I n, I nrhs, int type_a,
                                            const void *A, I lda, int type_b, void *B, I ldb,
                                            int *info)
{
    return done(h, info, 1);
}

FG_EXPORT cusolverStatus_t cusolverDnXgetrf_bufferSize(H h, Q q, I m, I n, int type_a,
                                                       const void *A, I lda, int compute,
                                                       size_t *device, size_t *host)
{
    return work_bytes(h, BLOCKED, m, n, 1, type_a, device, host);
}

FG_EXPORT cusolverStatus_t cusolverDnXgetrf(H h, Q q, I m, I n, int type_a, void *A, I lda,
                                            I *ipiv, int compute, void *work,
                                            size_t device_bytes, void *host_work,
                                            size_t host_bytes, int *info)
{
    return done(h, info, 1);
}

FG_EXPORT cusolverStatus_t cusolverDnXgetrs(H h, Q q, int trans, I n, I nrhs, int type_a,
                                            const void *A, I lda, const I *ipiv, int type_b,
                                            void *B, I ldb, int *info)
{
    return done(h, info, 1);
}

FG_EXPORT cusolverStatus_t cusolverDnXgeqrf_bufferSize(H h, Q q, I m, I n, int type_a,
                                                       const void *A, I lda, int type_tau,
                                                       const void *tau, int compute,
                                                       size_t *device, size_t *host)
{
    return work_bytes(h, BLOCKED, m, n, 1, type_a, device, host);
}

FG_EXPORT cusolverStatus_t cusolverDnXgeqrf(H h, Q q, I m, I n, int type_a, void *A, I lda,
                                            int type_tau, void *tau, int compute, void *work,
                                            size_t device_bytes, void *host_work,
                                            size_t host_bytes, int *info)
{
    return done(h, info, 1);
}

FG_EXPORT cusolverStatus_t cusolverDnXsyevd_bufferSize(H h, Q q, int jobz, int uplo, I n,
                                                       int type_a, const void *A, I lda,
                                                       int type_w, const void *W, int compute,
                                                       size_t *device, size_t *host)
{
    return work_bytes(h, SYEVD, n, n, 1, type_a, device, host);
}

FG_EXPORT cusolverStatus_t cusolverDnXsyevd(H h, Q q, int jobz, int uplo, I n, int type_a,
                                            void *A, I lda, int type_w, void *W, int compute,
                                            void *work, size_t device_bytes, void *host_work,
                                            size_t host_bytes, int *info)
{
    return done(h, info, 1);
}

FG_EXPORT cusolverStatus_t cusolverDnXsyevBatched_bufferSize(H h, Q q, int jobz, int uplo, I n,
                                                             int type_a, const void *A, I lda,
                                                             int type_w, const void *W,
                                                             int compute, size_t *device,
                                                             size_t *host, I batch)
{
    return work_bytes(h, SYEVD, n, n, batch, type_a, device, host);
}

FG_EXPORT cusolverStatus_t cusolverDnXsyevBatched(H h, Q q, int jobz, int uplo, I n, int type_a,
                                                  void *A, I lda, int type_w, void *W,
                                                  int compute, void *work, size_t device_bytes,
                                                  void *host_work, size_t host_bytes, int *info,
                                                  I batch)
{
    return done(h, info, batch);
}

FG_EXPORT cusolverStatus_t cusolverDnXsytrs_bufferSize(H h, Q q, int uplo, I n, I nrhs,
                                                       int type_a, const void *A, I lda,
                                                       const I *ipiv, int type_b,
                                                       const void *B, I ldb, size_t *device,
                                                       size_t *host)
{
    return work_bytes(h, NO_WORK, n, n, 1, type_a, device, host);
}

FG_EXPORT cusolverStatus_t cusolverDnXsytrs(H h, Q q, int uplo, I n, I nrhs, int type_a,
                                            const void *A, I lda, const I *ipiv, int type_b,
                                            void *B, I ldb, void *work, size_t device_bytes,
                                            void *host_work, size_t host_bytes, int *info)
{
    return done(h, info, 1);
}

FG_EXPORT cusolverStatus_t cusolverDnXgeev_bufferSize(H h, Q q, int jobvl, int jobvr, I n,
                                                      int type_a, const void *A, I lda,
                                                      int type_w, const void *W, int type_vl,
                                                      const void *VL, I ldvl, int type_vr,
                                                      const void *VR, I ldvr, int compute,
                                                      size_t *device, size_t *host)
{
    return work_bytes(h, GEEV, n, n, 1, type_a, device, host);
}

FG_EXPORT cusolverStatus_t cusolverDnXgeev(H h, Q q, int jobvl, int jobvr, I n, int type_a,
                                           void *A, I lda, int type_w, void *W, int type_vl,
                                           void *VL, I ldvl, int type_vr, void *VR, I ldvr,
                                           int compute, void *work, size_t device_bytes,
                                           void *host_work, size_t host_bytes, int *info)
{
    return done(h, info, 1);
}

/* ------------------------------------------------------------------ version */
/* The release of the wheels the symbol lists come from: 12.4.1 (CUDA 13), 11.7.5 (CUDA 12). */
#if FG_SONAME_MAJOR >= 12
static const int version[] = {12, 4, 1};
#else
static const int version[] = {11, 7, 5};
#endif

FG_EXPORT cusolverStatus_t cusolverGetProperty(int type, int *value)
{
    if (!value || type < 0 || type > 2)
        return CUSOLVER_STATUS_INVALID_VALUE;
    *value = version[type];
    return CUSOLVER_STATUS_SUCCESS;
}

FG_EXPORT cusolverStatus_t cusolverGetVersion(int *value)
{
    if (!value)
        return CUSOLVER_STATUS_INVALID_VALUE;
    *value = version[0] * 1000 + version[1] * 100 + version[2];
    return CUSOLVER_STATUS_SUCCESS;
}

/* The fake cuSOLVER dense API (libcusolver.so.11 and .12): handles with their stream, the
 * 64-bit API's parameter objects, the Jacobi solvers' info objects, every workspace query that
 * PyTorch's torch.linalg makes (the legacy API's `*_bufferSize`, in elements, and the 64-bit
 * API's `workspaceInBytesOnDevice` / `OnHost`), and the factorizations, solvers and eigen and
 * singular value decompositions, which complete at once like every kernel on the fake GPU (the
 * outputs keep whatever they held) but report success: each writes 0 to its `info` / `devInfo`
 * outputs (device memory, written through the fake driver; one per matrix for the batched
 * ones), which PyTorch reads back to raise on a singular or non-positive-definite matrix.
 *
 * Workspace sizes follow a real H100's answers where measured and are estimates elsewhere (see
 * the workspaces section below). Host workspaces are 0. Not modelled: device memory a real
 * handle takes for itself (100,663,296 bytes for one cusolverDnCreate on the H100, which one
 * measurement cannot split into what the handle allocates; README, "Fake GPU"), pivots
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

/* ------------------------------------------------------------------ workspaces */

/* The workspaces, per matrix, as cuSOLVER 12 (CUDA 13) answers them on a real H100
 * (scripts/cufft_cusolver_probe.py: square orders 64, 96 and 512 in float and double,
 * tests/fixtures/h100-probe/fft_solver.jsonl). The legacy queries answer elements of the
 * matrix's type; the 64-bit ones device bytes, which are the legacy answer's bytes plus 128
 * for Xgeqrf, Xsyevd and XsyevBatched, minus 128 for Xgetrf, equal for Xpotrf (all 12 pairs),
 * and no host bytes. Rules, n the order (only square matrices were measured; complex types
 * take the same elements, not measured):
 *   getrf: 16 n + 256 bytes (4 of 6 queries; 256 bytes more at order 96);
 *   potrf: an estimate, 2 n + 128 bytes (exact at 512; 96 and 128 bytes over at 64 and 96);
 *   geqrf: 2,048 max(n, 384) elements (6 of 6; where the floor ends between 96 and 512 is
 *     not measured);
 *   ormqr/unmqr: 2 q^2 + 769 q + 65,792 elements, q the order of Q (6 of 6);
 *   syevd/heevd: 3 n^2 + 768 n + 65,603 elements (6 of 6);
 *   gesvd: 3 m n + 130 (m + n) + 65,792 elements (6 of 6);
 *   orgqr/ungqr and gesvdj: no rule found in three orders: linear between the measured orders'
 *     answers (exact there), the end segments' slopes beyond 512, the answer at 64 below it;
 *   XsyevBatched: an estimate, the batch's syevd workspaces (0.08% over the one measured
 *     point, four 16 x 16 matrices).
 * The quadratic rules have three coefficients for three orders, so they are exact at the
 * measured orders by construction; their integer coefficients are the evidence that they are
 * cuSOLVER's rule, and between and beyond the measured orders they are estimates.
 * Still LAPACK-style estimates, unmeasured or not matching one point: sytrf (NB n), syevj/heevj
 * and batched (1 + 6n + 2n^2; 6,280 on the H100 for four 16 x 16, the fake 2,436), gesvdjBatched
 * and gesvdaStridedBatched (m n + n^2: 992 and 17,040 / 8,520 on the H100 against 2,048), Xgeev
 * (4n + 2n^2), Xsytrs and the solves (none). */
enum routine { GETRF, POTRF, GEQRF, ORGQR, ORMQR, SYEVD, GESVD, GESVDJ, SYTRF, SYEVJ,
               JACOBI_SVD, GEEV, NO_WORK };

/* Linear through three measured (order, answer) points, the end segments' slopes beyond the
 * last, the first answer below the first. */
static unsigned __int128 through(const long long points[3][2], unsigned __int128 x)
{
    if (x <= (unsigned long long)points[0][0])
        return (unsigned long long)points[0][1];
    int i = x <= (unsigned long long)points[1][0] ? 0 : 1;
    unsigned __int128 dx = x - (unsigned long long)points[i][0];
    unsigned long long rise = (unsigned long long)(points[i + 1][1] - points[i][1]);
    unsigned long long run = (unsigned long long)(points[i + 1][0] - points[i][0]);
    return (unsigned long long)points[i][1] + (dx * rise + run - 1) / run;
}

static const long long orgqr_points[3][2] = {{64, 37120}, {96, 44288}, {512, 213248}};
static const long long gesvdj_points[3][2] = {{64, 13408}, {96, 25760}, {512, 559648}};

/* One matrix's workspace in bytes of a legacy query, ELEMENT bytes each. */
static unsigned __int128 per_matrix_bytes(enum routine routine, long long m, long long n,
                                          unsigned element)
{
    unsigned __int128 um = m > 0 ? (unsigned long long)m : 0, un = n > 0 ? (unsigned long long)n : 0;
    unsigned __int128 hi = um < un ? un : um, elements;
    switch (routine) {
    case GETRF: return 16 * un + 256;
    case POTRF: return 2 * un + 128;
    case GEQRF: elements = 2048 * (un > 384 ? un : 384); break;
    case ORGQR: elements = through(orgqr_points, un); break;
    case ORMQR: elements = 2 * un * un + 769 * un + 65792; break;
    case SYEVD: elements = 3 * un * un + 768 * un + 65603; break;
    case GESVD: elements = 3 * um * un + 130 * (um + un) + 65792; break;
    case GESVDJ: elements = through(gesvdj_points, hi); break;
    case SYTRF: elements = NB * un; break;
    case SYEVJ: elements = 1 + 6 * un + 2 * un * un; break;
    case JACOBI_SVD: elements = um * un + un * un; break;
    case GEEV: elements = 4 * un + 2 * un * un; break;
    default: return 0;
    }
    return elements * element;
}

/* A legacy query's answer: LWORK elements of ELEMENT bytes for BATCH matrices, as an int. */
static cusolverStatus_t lwork(cusolverDnHandle_t handle, enum routine routine, long long m,
                              long long n, long long batch, unsigned element, int *out)
{
    if (!handle)
        return CUSOLVER_STATUS_NOT_INITIALIZED;
    if (!out || m < 0 || n < 0 || batch < 0)
        return CUSOLVER_STATUS_INVALID_VALUE;
    unsigned __int128 bytes = per_matrix_bytes(routine, m, n, element) * (unsigned long long)batch;
    unsigned __int128 elements = (bytes + element - 1) / element;
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

/* A 64-bit query's answer: device bytes of TYPE (the legacy bytes, and the 128 more or less the
 * H100 answered; see the top of this section), none on the host. */
static cusolverStatus_t work_bytes(cusolverDnHandle_t handle, enum routine routine, long long m,
                                   long long n, long long batch, int type, size_t *device,
                                   size_t *host)
{
    if (!handle)
        return CUSOLVER_STATUS_NOT_INITIALIZED;
    if (!device || !host || m < 0 || n < 0 || batch < 0 || !data_bytes(type))
        return CUSOLVER_STATUS_INVALID_VALUE;
    unsigned __int128 bytes =
        per_matrix_bytes(routine, m, n, data_bytes(type)) * (unsigned long long)batch;
    if (routine == GEQRF || routine == SYEVD)
        bytes += 128;
    else if (routine == GETRF && bytes >= 128)
        bytes -= 128;
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

/* Each macro defines one routine for the prefixes given (the types differ only in pointers and
 * in their element's bytes, E_t). */
#define E_S 4
#define E_D 8
#define E_C 8
#define E_Z 16
#define EACH4(M, a, b, c, d) M(a) M(b) M(c) M(d)

/* potrf */
#define POTRF(t)                                                                          \
    FG_EXPORT cusolverStatus_t cusolverDn##t##potrf_bufferSize(H h, int uplo, int n, P A,  \
                                                               int lda, int *lw)          \
    {                                                                                     \
        return lwork(h, POTRF, n, n, 1, E_##t, lw);                                       \
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
        return lwork(h, GETRF, m, n, 1, E_##t, lw);                                       \
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
        return lwork(h, GEQRF, m, n, 1, E_##t, lw);                                       \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##geqrf(H h, int m, int n, P A, int lda,       \
                                                    P tau, P work, int lw, int *info)     \
    {                                                                                     \
        return done(h, info, 1);                                                          \
    }                                                                                     \
    FG_EXPORT cusolverStatus_t cusolverDn##t##sytrf_bufferSize(H h, int n, P A, int lda,   \
                                                               int *lw)                   \
    {                                                                                     \
        return lwork(h, SYTRF, n, n, 1, E_##t, lw);                                       \
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
        return lwork(h, ORGQR, m, n, 1, E_##t, lw);                                       \
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
        return lwork(h, ORMQR, 0, side == CUBLAS_SIDE_LEFT ? m : n, 1, E_##t, lw);        \
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
        return lwork(h, SYEVD, n, n, 1, E_##t, lw);                                       \
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
        return lwork(h, SYEVJ, n, n, 1, E_##t, lw);                                       \
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
        return lwork(h, SYEVJ, n, n, batch, E_##t, lw);                                   \
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
        return lwork(h, GESVD, m, n, 1, E_##t, lw);                                       \
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
        return lwork(h, GESVDJ, m, n, 1, E_##t, lw);                                      \
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
        return lwork(h, JACOBI_SVD, m, n, batch, E_##t, lw);                              \
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
        return lwork(h, JACOBI_SVD, m, n, batch, E_##t, lw);                              \
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
    return work_bytes(h, POTRF, n, n, 1, type_a, device, host);
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
    return work_bytes(h, GETRF, m, n, 1, type_a, device, host);
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
    return work_bytes(h, GEQRF, m, n, 1, type_a, device, host);
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

/* The fake cuFFT (libcufft.so.11 and .12): plans that keep their shape, type, stream and work
 * area, the workspace a plan asks for, and transforms that complete at once (like every kernel
 * on the fake GPU: the output keeps whatever it held). PyTorch's path: cufftCreate,
 * cufftSetAutoAllocation(plan, 0), cufftXtMakePlanMany (which reports the workspace), then per
 * transform cufftSetStream, a workspace tensor from its caching allocator, cufftSetWorkArea and
 * cufftXtExec. A plan left with auto-allocation (CuPy, plain C programs) allocates its
 * workspace itself, through the driver as cuFFT's static runtime does, and frees it with the
 * plan.
 *
 * Workspace sizes: a real H100's cuFFT (CUDA 13, torch 2.11's; scripts/cufft_cusolver_probe.py,
 * tests/fixtures/h100-probe/fft_solver.jsonl) asked for none for all ten transforms measured
 * (C2C, R2C, C2R, Z2Z and D2Z; 1-D to 3-D; sizes 32 to 4,096 whose prime factors are 2, 3
 * and 5; batches 1 to 202), so a plan whose every dimension is such a size answers 0. Beyond
 * them (a dimension over 4,096 or with another prime factor) the workspace is an ESTIMATE,
 * not measured: one copy of the whole batched transform in the execution type's complex
 * element (batch x product of the signal sizes x 8 bytes single, 16 double, 4 half), the
 * staging buffer of a multi-pass transform. Not modelled: device memory a real plan takes for
 * itself; the H100 showed none for nine of the ten plans and 6 MiB at the first
 * double-precision one, which we take for its kernels' module loading (the next double plan
 * took none). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "fakegpu_fork.h"
#include "fakegpu_library_memory.h"

#define FG_EXPORT __attribute__((visibility("default")))
typedef int cufftResult;
typedef int cufftHandle;
enum {
    CUFFT_SUCCESS = 0,
    CUFFT_INVALID_PLAN = 1,
    CUFFT_ALLOC_FAILED = 2,
    CUFFT_INVALID_TYPE = 3,
    CUFFT_INVALID_VALUE = 4,
    CUFFT_INTERNAL_ERROR = 5,
    CUFFT_SETUP_FAILED = 7,
    CUFFT_INVALID_SIZE = 8,
};
/* cufftType */
enum { CUFFT_R2C = 0x2a, CUFFT_C2R = 0x2c, CUFFT_C2C = 0x29, CUFFT_D2Z = 0x6a, CUFFT_Z2D = 0x6c,
       CUFFT_Z2Z = 0x69 };
/* cudaDataType */
enum { CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16F = 2, CUDA_C_32F = 4, CUDA_C_64F = 5,
       CUDA_C_16F = 6, CUDA_R_16BF = 14, CUDA_C_16BF = 15 };

#define MAX_RANK 3

struct plan {
    int in_use;
    int made;           /* a plan function succeeded */
    int auto_allocate;  /* 1 unless cufftSetAutoAllocation(plan, 0) */
    int rank;
    long long n[MAX_RANK];
    long long batch;
    int complex_bytes;  /* of the execution type */
    size_t work_size;   /* the estimate, reported by every plan and size query */
    void *work_area;    /* cufftSetWorkArea's, or the plan's own */
    CUdeviceptr own_work; /* with auto-allocation */
    void *stream;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct plan *plans;
static int plan_count, plan_room;

/* The plan table's lock across fork (fakegpu_fork.h): a child forked while another thread
 * holds it finds it free. It is never held while calling the driver, so its order among the
 * driver's locks does not matter. */
static struct fg_fork_state fork_state;
static void before_fork(void)
{
    fg_fork_begin(&fork_state);
    fg_fork_take(&fork_state, &lock);
}
static void after_fork_parent(void) { fg_fork_release_parent(&fork_state, &lock); }
static void after_fork_child(void)
{
    fg_fork_release_child(&fork_state, &lock);
    fg_fork_warn_child(&fork_state, "libcufft");
}
__attribute__((constructor)) static void register_fork_handlers(void)
{
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* The plan behind a handle (handles are 1 + an index), or NULL. Call with the lock held. */
static struct plan *find(cufftHandle handle)
{
    if (handle < 1 || handle > plan_count || !plans[handle - 1].in_use)
        return NULL;
    return &plans[handle - 1];
}

FG_EXPORT cufftResult cufftCreate(cufftHandle *handle)
{
    if (!handle)
        return CUFFT_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int index = 0;
    while (index < plan_count && plans[index].in_use)
        index++;
    if (index == plan_room) {
        int room = plan_room ? plan_room * 2 : 16;
        struct plan *grown = realloc(plans, (size_t)room * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&lock);
            return CUFFT_ALLOC_FAILED;
        }
        plans = grown;
        plan_room = room;
    }
    if (index == plan_count)
        plan_count++;
    plans[index] = (struct plan){.in_use = 1, .auto_allocate = 1};
    *handle = index + 1;
    pthread_mutex_unlock(&lock);
    return CUFFT_SUCCESS;
}

FG_EXPORT cufftResult cufftDestroy(cufftHandle handle)
{
    pthread_mutex_lock(&lock);
    struct plan *p = find(handle);
    CUdeviceptr own = 0;
    if (p) {
        own = p->own_work;
        p->in_use = 0;
    }
    pthread_mutex_unlock(&lock);
    if (own)
        fg_library_free(&own, 1);
    return p ? CUFFT_SUCCESS : CUFFT_INVALID_PLAN;
}

FG_EXPORT cufftResult cufftSetAutoAllocation(cufftHandle handle, int auto_allocate)
{
    pthread_mutex_lock(&lock);
    struct plan *p = find(handle);
    if (p)
        p->auto_allocate = auto_allocate != 0;
    pthread_mutex_unlock(&lock);
    return p ? CUFFT_SUCCESS : CUFFT_INVALID_PLAN;
}

FG_EXPORT cufftResult cufftSetWorkArea(cufftHandle handle, void *work_area)
{
    pthread_mutex_lock(&lock);
    struct plan *p = find(handle);
    if (p)
        p->work_area = work_area;
    pthread_mutex_unlock(&lock);
    return p ? CUFFT_SUCCESS : CUFFT_INVALID_PLAN;
}

FG_EXPORT cufftResult cufftSetStream(cufftHandle handle, void *stream)
{
    pthread_mutex_lock(&lock);
    struct plan *p = find(handle);
    if (p)
        p->stream = stream;
    pthread_mutex_unlock(&lock);
    return p ? CUFFT_SUCCESS : CUFFT_INVALID_PLAN;
}

FG_EXPORT cufftResult cufftGetSize(cufftHandle handle, size_t *work_size)
{
    if (!work_size)
        return CUFFT_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct plan *p = find(handle);
    if (p)
        *work_size = p->work_size;
    pthread_mutex_unlock(&lock);
    return p ? CUFFT_SUCCESS : CUFFT_INVALID_PLAN;
}

/* Complex element bytes of a cufftType, 0 for an unknown one. */
static int type_bytes(int type)
{
    switch (type) {
    case CUFFT_R2C: case CUFFT_C2R: case CUFFT_C2C: return 8;
    case CUFFT_D2Z: case CUFFT_Z2D: case CUFFT_Z2Z: return 16;
    default: return 0;
    }
}

/* Complex element bytes of an execution cudaDataType, 0 for an unsupported one. */
static int execution_bytes(int type)
{
    switch (type) {
    case CUDA_C_32F: return 8;
    case CUDA_C_64F: return 16;
    case CUDA_C_16F: case CUDA_C_16BF: return 4;
    default: return 0;
    }
}

/* Whether a dimension is one cuFFT transforms without a workspace (the top of this file): at
 * most 4,096, no prime factor but 2, 3 and 5. */
static int without_workspace(long long size)
{
    if (size > 4096)
        return 0;
    for (int factor = 2; factor <= 5; factor++)
        while (size % factor == 0)
            size /= factor;
    return size == 1;
}

/* The workspace (see the top of this file): none for measured-like shapes, else the
 * estimate, batch x prod(n) complex elements. */
static cufftResult estimate(int rank, const long long *n, long long batch, int complex_bytes,
                            size_t *work_size)
{
    if (rank < 1 || rank > MAX_RANK || !n)
        return CUFFT_INVALID_VALUE;
    if (!complex_bytes)
        return CUFFT_INVALID_TYPE;
    if (batch < 1)
        return CUFFT_INVALID_SIZE;
    unsigned __int128 elements = (unsigned long long)batch;
    for (int i = 0; i < rank; i++) {
        if (n[i] < 1)
            return CUFFT_INVALID_SIZE;
        elements *= (unsigned long long)n[i];
    }
    unsigned __int128 bytes = elements * (unsigned)complex_bytes;
    int none = 1;
    for (int i = 0; i < rank; i++)
        none = none && without_workspace(n[i]);
    if (none)
        bytes = 0;
    if (bytes > SIZE_MAX / 2)
        return CUFFT_INVALID_SIZE;
    if (work_size)
        *work_size = (size_t)bytes;
    return CUFFT_SUCCESS;
}

/* Makes HANDLE's plan: the shape, the estimate, and with auto-allocation its own workspace. */
static cufftResult make(cufftHandle handle, int rank, const long long *n, long long batch,
                        int complex_bytes, size_t *work_size)
{
    size_t bytes = 0;
    cufftResult rc = estimate(rank, n, batch, complex_bytes, &bytes);
    if (rc)
        return rc;
    pthread_mutex_lock(&lock);
    struct plan *p = find(handle);
    int allocate = p && p->auto_allocate && bytes;
    CUdeviceptr old = p ? p->own_work : 0;
    if (p)
        p->own_work = 0;
    pthread_mutex_unlock(&lock);
    if (!p)
        return CUFFT_INVALID_PLAN;
    if (old)
        fg_library_free(&old, 1);
    CUdeviceptr own = 0;
    if (allocate && fg_library_alloc(&own, &bytes, 1) != CUDA_SUCCESS)
        return CUFFT_ALLOC_FAILED;
    pthread_mutex_lock(&lock);
    p = find(handle);
    if (p) {
        p->made = 1;
        p->rank = rank;
        for (int i = 0; i < rank; i++)
            p->n[i] = n[i];
        p->batch = batch;
        p->complex_bytes = complex_bytes;
        p->work_size = bytes;
        p->own_work = own;
        p->work_area = own ? (void *)own : NULL;
    }
    pthread_mutex_unlock(&lock);
    if (!p) { /* destroyed meanwhile by another thread */
        if (own)
            fg_library_free(&own, 1);
        return CUFFT_INVALID_PLAN;
    }
    if (work_size)
        *work_size = bytes;
    return CUFFT_SUCCESS;
}

static int copy_sizes(int rank, const int *n, long long *out)
{
    if (rank < 1 || rank > MAX_RANK || !n)
        return 0;
    for (int i = 0; i < rank; i++)
        out[i] = n[i];
    return 1;
}

FG_EXPORT cufftResult cufftXtMakePlanMany(cufftHandle plan, int rank, long long *n,
                                          long long *inembed, long long istride,
                                          long long idist, int input_type,
                                          long long *onembed, long long ostride,
                                          long long odist, int output_type, long long batch,
                                          size_t *work_size, int execution_type)
{
    return make(plan, rank, n, batch, execution_bytes(execution_type), work_size);
}

FG_EXPORT cufftResult cufftMakePlanMany64(cufftHandle plan, int rank, long long *n,
                                          long long *inembed, long long istride,
                                          long long idist, long long *onembed,
                                          long long ostride, long long odist, int type,
                                          long long batch, size_t *work_size)
{
    return make(plan, rank, n, batch, type_bytes(type), work_size);
}

FG_EXPORT cufftResult cufftMakePlanMany(cufftHandle plan, int rank, int *n, int *inembed,
                                        int istride, int idist, int *onembed, int ostride,
                                        int odist, int type, int batch, size_t *work_size)
{
    long long sizes[MAX_RANK];
    if (!copy_sizes(rank, n, sizes))
        return CUFFT_INVALID_VALUE;
    return make(plan, rank, sizes, batch, type_bytes(type), work_size);
}

FG_EXPORT cufftResult cufftMakePlan1d(cufftHandle plan, int nx, int type, int batch,
                                      size_t *work_size)
{
    long long sizes[] = {nx};
    return make(plan, 1, sizes, batch, type_bytes(type), work_size);
}

FG_EXPORT cufftResult cufftMakePlan2d(cufftHandle plan, int nx, int ny, int type,
                                      size_t *work_size)
{
    long long sizes[] = {nx, ny};
    return make(plan, 2, sizes, 1, type_bytes(type), work_size);
}

FG_EXPORT cufftResult cufftMakePlan3d(cufftHandle plan, int nx, int ny, int nz, int type,
                                      size_t *work_size)
{
    long long sizes[] = {nx, ny, nz};
    return make(plan, 3, sizes, 1, type_bytes(type), work_size);
}

/* cufftPlan*: cufftCreate and cufftMakePlan* in one; no handle is left on failure. */
static cufftResult plan_new(cufftHandle *plan, int rank, const long long *n, long long batch,
                            int type)
{
    if (!plan)
        return CUFFT_INVALID_VALUE;
    cufftHandle handle;
    cufftResult rc = cufftCreate(&handle);
    if (rc)
        return rc;
    rc = make(handle, rank, n, batch, type_bytes(type), NULL);
    if (rc) {
        cufftDestroy(handle);
        return rc;
    }
    *plan = handle;
    return CUFFT_SUCCESS;
}

FG_EXPORT cufftResult cufftPlan1d(cufftHandle *plan, int nx, int type, int batch)
{
    long long sizes[] = {nx};
    return plan_new(plan, 1, sizes, batch, type);
}

FG_EXPORT cufftResult cufftPlan2d(cufftHandle *plan, int nx, int ny, int type)
{
    long long sizes[] = {nx, ny};
    return plan_new(plan, 2, sizes, 1, type);
}

FG_EXPORT cufftResult cufftPlan3d(cufftHandle *plan, int nx, int ny, int nz, int type)
{
    long long sizes[] = {nx, ny, nz};
    return plan_new(plan, 3, sizes, 1, type);
}

FG_EXPORT cufftResult cufftPlanMany(cufftHandle *plan, int rank, int *n, int *inembed,
                                    int istride, int idist, int *onembed, int ostride, int odist,
                                    int type, int batch)
{
    long long sizes[MAX_RANK];
    if (!copy_sizes(rank, n, sizes))
        return CUFFT_INVALID_VALUE;
    return plan_new(plan, rank, sizes, batch, type);
}

/* The size queries answer the same estimate without making anything. */
FG_EXPORT cufftResult cufftEstimate1d(int nx, int type, int batch, size_t *work_size)
{
    long long sizes[] = {nx};
    return work_size ? estimate(1, sizes, batch, type_bytes(type), work_size) : CUFFT_INVALID_VALUE;
}

FG_EXPORT cufftResult cufftEstimate2d(int nx, int ny, int type, size_t *work_size)
{
    long long sizes[] = {nx, ny};
    return work_size ? estimate(2, sizes, 1, type_bytes(type), work_size) : CUFFT_INVALID_VALUE;
}

FG_EXPORT cufftResult cufftEstimate3d(int nx, int ny, int nz, int type, size_t *work_size)
{
    long long sizes[] = {nx, ny, nz};
    return work_size ? estimate(3, sizes, 1, type_bytes(type), work_size) : CUFFT_INVALID_VALUE;
}

FG_EXPORT cufftResult cufftEstimateMany(int rank, int *n, int *inembed, int istride, int idist,
                                        int *onembed, int ostride, int odist, int type,
                                        int batch, size_t *work_size)
{
    long long sizes[MAX_RANK];
    if (!work_size || !copy_sizes(rank, n, sizes))
        return CUFFT_INVALID_VALUE;
    return estimate(rank, sizes, batch, type_bytes(type), work_size);
}

/* cufftGetSize*d and Many: the plan must exist; the answer is the estimate for the shape. */
static cufftResult plan_size(cufftHandle handle, int rank, const long long *n, long long batch,
                             int complex_bytes, size_t *work_size)
{
    pthread_mutex_lock(&lock);
    int known = find(handle) != NULL;
    pthread_mutex_unlock(&lock);
    if (!known)
        return CUFFT_INVALID_PLAN;
    if (!work_size)
        return CUFFT_INVALID_VALUE;
    return estimate(rank, n, batch, complex_bytes, work_size);
}

FG_EXPORT cufftResult cufftGetSize1d(cufftHandle plan, int nx, int type, int batch,
                                     size_t *work_size)
{
    long long sizes[] = {nx};
    return plan_size(plan, 1, sizes, batch, type_bytes(type), work_size);
}

FG_EXPORT cufftResult cufftGetSize2d(cufftHandle plan, int nx, int ny, int type,
                                     size_t *work_size)
{
    long long sizes[] = {nx, ny};
    return plan_size(plan, 2, sizes, 1, type_bytes(type), work_size);
}

FG_EXPORT cufftResult cufftGetSize3d(cufftHandle plan, int nx, int ny, int nz, int type,
                                     size_t *work_size)
{
    long long sizes[] = {nx, ny, nz};
    return plan_size(plan, 3, sizes, 1, type_bytes(type), work_size);
}

FG_EXPORT cufftResult cufftGetSizeMany(cufftHandle plan, int rank, int *n, int *inembed,
                                       int istride, int idist, int *onembed, int ostride,
                                       int odist, int type, int batch, size_t *work_size)
{
    long long sizes[MAX_RANK];
    if (!copy_sizes(rank, n, sizes))
        return CUFFT_INVALID_VALUE;
    return plan_size(plan, rank, sizes, batch, type_bytes(type), work_size);
}

FG_EXPORT cufftResult cufftGetSizeMany64(cufftHandle plan, int rank, long long *n,
                                         long long *inembed, long long istride,
                                         long long idist, long long *onembed, long long ostride,
                                         long long odist, int type, long long batch,
                                         size_t *work_size)
{
    return plan_size(plan, rank, n, batch, type_bytes(type), work_size);
}

FG_EXPORT cufftResult cufftXtGetSizeMany(cufftHandle plan, int rank, long long *n,
                                         long long *inembed, long long istride,
                                         long long idist, int input_type, long long *onembed,
                                         long long ostride, long long odist, int output_type,
                                         long long batch, size_t *work_size,
                                         int execution_type)
{
    return plan_size(plan, rank, n, batch, execution_bytes(execution_type), work_size);
}

/* A transform: the plan made, its workspace there (set, or its own), the data given. It
 * completes at once and computes nothing, like the fake cuBLAS's GEMMs (no kernel launch, no
 * graph node). */
static cufftResult execute(cufftHandle handle, const void *input, const void *output)
{
    pthread_mutex_lock(&lock);
    struct plan *p = find(handle);
    cufftResult rc = CUFFT_SUCCESS;
    if (!p || !p->made)
        rc = CUFFT_INVALID_PLAN;
    else if (!input || !output || (p->work_size && !p->work_area))
        rc = CUFFT_INVALID_VALUE;
    pthread_mutex_unlock(&lock);
    return rc;
}

FG_EXPORT cufftResult cufftXtExec(cufftHandle plan, void *input, void *output, int direction)
{
    return execute(plan, input, output);
}

#define EXEC(name, in_type, out_type)                                                     \
    FG_EXPORT cufftResult name(cufftHandle plan, in_type *input, out_type *output)      \
    {                                                                                     \
        return execute(plan, input, output);                                              \
    }
#define EXEC_DIRECTION(name, type)                                                        \
    FG_EXPORT cufftResult name(cufftHandle plan, type *input, type *output, int direction) \
    {                                                                                     \
        return execute(plan, input, output);                                              \
    }
EXEC_DIRECTION(cufftExecC2C, void)
EXEC_DIRECTION(cufftExecZ2Z, void)
EXEC(cufftExecR2C, float, void)
EXEC(cufftExecC2R, void, float)
EXEC(cufftExecD2Z, double, void)
EXEC(cufftExecZ2D, void, double)

/* The release of the wheels the symbol lists come from: cuFFT 12.5 (CUDA 13), 11.4 (CUDA 12). */
#if FG_SONAME_MAJOR >= 12
static const int version[] = {12, 5, 0};
#else
static const int version[] = {11, 4, 1};
#endif

FG_EXPORT cufftResult cufftGetVersion(int *value)
{
    if (!value)
        return CUFFT_INVALID_VALUE;
    *value = version[0] * 1000 + version[1] * 100 + version[2]; /* CUFFT_VERSION */
    return CUFFT_SUCCESS;
}

FG_EXPORT cufftResult cufftGetProperty(int type, int *value)
{
    if (!value || type < 0 || type > 2)
        return CUFFT_INVALID_VALUE;
    *value = version[type];
    return CUFFT_SUCCESS;
}

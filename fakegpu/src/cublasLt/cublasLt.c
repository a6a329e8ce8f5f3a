/* The fake cuBLASLt (libcublasLt.so.12 and .13): handles, descriptors that keep their
 * attributes, a heuristic that offers one algorithm, and a matmul that does nothing. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FG_EXPORT __attribute__((visibility("default")))
typedef int cublasStatus_t;
enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
};

/* Attributes are kept by number, up to 64 bytes each, so Get returns what Set stored. */
#define MAX_ATTRIBUTES 64
struct descriptor {
    unsigned char value[MAX_ATTRIBUTES][64];
    size_t size[MAX_ATTRIBUTES];
};

static cublasStatus_t create(void **out)
{
    if (!out)
        return CUBLAS_STATUS_INVALID_VALUE;
    *out = calloc(1, sizeof(struct descriptor));
    return *out ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

static cublasStatus_t destroy(void *d)
{
    free(d);
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t set(struct descriptor *d, int attribute, const void *buffer, size_t size)
{
    if (!d || attribute < 0 || attribute >= MAX_ATTRIBUTES || size > 64 || (size && !buffer))
        return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(d->value[attribute], buffer, size);
    d->size[attribute] = size;
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t get(const struct descriptor *d, int attribute, void *buffer, size_t size,
                          size_t *written)
{
    if (!d || attribute < 0 || attribute >= MAX_ATTRIBUTES)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (size == 0 && written) {
        *written = d->size[attribute] ? d->size[attribute] : 8;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!buffer)
        return CUBLAS_STATUS_INVALID_VALUE;
    size_t n = d->size[attribute] < size ? d->size[attribute] : size;
    memset(buffer, 0, size);
    memcpy(buffer, d->value[attribute], n);
    if (written)
        *written = d->size[attribute];
    return CUBLAS_STATUS_SUCCESS;
}

FG_EXPORT cublasStatus_t cublasLtCreate(void **handle) { return create(handle); }
FG_EXPORT cublasStatus_t cublasLtDestroy(void *handle) { return destroy(handle); }
FG_EXPORT size_t cublasLtGetVersion(void) { return 130200; }
FG_EXPORT size_t cublasLtGetCudartVersion(void) { return 13020; }

FG_EXPORT cublasStatus_t cublasLtMatmulDescCreate(void **desc, int compute_type, int scale_type)
{
    return create(desc);
}
FG_EXPORT cublasStatus_t cublasLtMatmulDescDestroy(void *desc) { return destroy(desc); }
FG_EXPORT cublasStatus_t cublasLtMatmulDescSetAttribute(void *d, int a, const void *b, size_t n)
{
    return set(d, a, b, n);
}
FG_EXPORT cublasStatus_t cublasLtMatmulDescGetAttribute(void *d, int a, void *b, size_t n,
                                                        size_t *w)
{
    return get(d, a, b, n, w);
}

FG_EXPORT cublasStatus_t cublasLtMatrixLayoutCreate(void **layout, int type, uint64_t rows,
                                                    uint64_t cols, int64_t ld)
{
    return create(layout);
}
FG_EXPORT cublasStatus_t cublasLtMatrixLayoutDestroy(void *layout) { return destroy(layout); }
FG_EXPORT cublasStatus_t cublasLtMatrixLayoutSetAttribute(void *d, int a, const void *b, size_t n)
{
    return set(d, a, b, n);
}
FG_EXPORT cublasStatus_t cublasLtMatrixLayoutGetAttribute(void *d, int a, void *b, size_t n,
                                                          size_t *w)
{
    return get(d, a, b, n, w);
}

FG_EXPORT cublasStatus_t cublasLtMatmulPreferenceCreate(void **pref) { return create(pref); }
FG_EXPORT cublasStatus_t cublasLtMatmulPreferenceDestroy(void *pref) { return destroy(pref); }
FG_EXPORT cublasStatus_t cublasLtMatmulPreferenceSetAttribute(void *d, int a, const void *b,
                                                              size_t n)
{
    return set(d, a, b, n);
}
FG_EXPORT cublasStatus_t cublasLtMatmulPreferenceGetAttribute(void *d, int a, void *b, size_t n,
                                                              size_t *w)
{
    return get(d, a, b, n, w);
}

/* cublasLtMatmulAlgo_t: 8 uint64; an algorithm's configuration attributes live in it. */
typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

/* One algorithm that needs no workspace (so it fits any workspace limit). */
FG_EXPORT cublasStatus_t cublasLtMatmulAlgoGetHeuristic(void *handle, void *op, void *a, void *b,
                                                        void *c, void *d, void *pref,
                                                        int requested,
                                                        cublasLtMatmulHeuristicResult_t *results,
                                                        int *returned)
{
    if (!handle || !op || !returned || requested <= 0 || !results)
        return CUBLAS_STATUS_INVALID_VALUE;
    memset(results, 0, sizeof *results);
    results->algo.data[0] = 1;
    results->workspaceSize = 0;
    results->state = CUBLAS_STATUS_SUCCESS;
    results->wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

FG_EXPORT cublasStatus_t cublasLtMatmulAlgoInit(void *handle, int compute, int scale, int a, int b,
                                                int c, int d, int id, cublasLtMatmulAlgo_t *algo)
{
    if (!handle || !algo)
        return CUBLAS_STATUS_INVALID_VALUE;
    memset(algo, 0, sizeof *algo);
    algo->data[0] = (uint64_t)id + 1;
    return CUBLAS_STATUS_SUCCESS;
}

FG_EXPORT cublasStatus_t cublasLtMatmulAlgoCheck(void *handle, void *op, void *a, void *b, void *c,
                                                 void *d, const cublasLtMatmulAlgo_t *algo,
                                                 cublasLtMatmulHeuristicResult_t *result)
{
    if (!handle || !algo || !result)
        return CUBLAS_STATUS_INVALID_VALUE;
    memset(result, 0, sizeof *result);
    result->algo = *algo;
    result->wavesCount = 1.0f;
    return CUBLAS_STATUS_SUCCESS;
}

FG_EXPORT cublasStatus_t cublasLtMatmulAlgoConfigSetAttribute(cublasLtMatmulAlgo_t *algo, int a,
                                                              const void *b, size_t n)
{
    return algo && (b || !n) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

FG_EXPORT cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t *algo,
                                                              int a, void *b, size_t n, size_t *w)
{
    if (!algo)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (n == 0 && w) {
        *w = 4;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!b)
        return CUBLAS_STATUS_INVALID_VALUE;
    memset(b, 0, n);
    if (w)
        *w = n;
    return CUBLAS_STATUS_SUCCESS;
}

/* The matrix product itself is a kernel: it completes without touching D. */
FG_EXPORT cublasStatus_t cublasLtMatmul(void *handle, void *op, const void *alpha, const void *a,
                                        void *a_layout, const void *b, void *b_layout,
                                        const void *beta, const void *c, void *c_layout, void *d,
                                        void *d_layout, const cublasLtMatmulAlgo_t *algo,
                                        void *workspace, size_t workspace_bytes, void *stream)
{
    if (!handle || !op || !a_layout || !b_layout || !c_layout || !d_layout)
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

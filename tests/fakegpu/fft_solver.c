/* The fake cuFFT's plan API and the fake cuSOLVER's handle API, as a C program sees them:
 * statuses, workspace figures, the device memory an auto-allocated plan takes (cudaMemGetInfo),
 * and the info outputs a routine writes; the info outputs of cuBLAS's batched solvers. One line per check (fakegpu_libs
 * the_fft_and_solver_apis_answer_statuses_workspaces_and_infos). */
#include <stddef.h>
#include <stdio.h>

typedef int cudaError_t;
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind);

int cufftCreate(int *plan);
int cufftDestroy(int plan);
int cufftSetAutoAllocation(int plan, int on);
int cufftSetWorkArea(int plan, void *area);
int cufftXtMakePlanMany(int plan, int rank, long long *n, long long *inembed, long long istride,
                        long long idist, int itype, long long *onembed, long long ostride,
                        long long odist, int otype, long long batch, size_t *work,
                        int exectype);
int cufftXtExec(int plan, void *in, void *out, int direction);
int cufftPlan1d(int *plan, int nx, int type, int batch);
int cufftPlanMany(int *plan, int rank, int *n, int *inembed, int istride, int idist,
                  int *onembed, int ostride, int odist, int type, int batch);
int cufftGetSize(int plan, size_t *work);
int cufftExecC2C(int plan, void *in, void *out, int direction);
int cufftGetVersion(int *version);

typedef void *cusolverDnHandle_t;
int cusolverDnCreate(cusolverDnHandle_t *handle);
int cusolverDnDestroy(cusolverDnHandle_t handle);
int cusolverDnSgetrf_bufferSize(cusolverDnHandle_t h, int m, int n, float *A, int lda, int *lw);
int cusolverDnSpotrf(cusolverDnHandle_t h, int uplo, int n, float *A, int lda, float *work,
                     int lw, int *info);
int cusolverDnSpotrfBatched(cusolverDnHandle_t h, int uplo, int n, float **A, int lda,
                            int *info, int batch);
int cusolverDnCreateParams(void **params);
int cusolverDnDestroyParams(void *params);
int cusolverDnXsyevd_bufferSize(cusolverDnHandle_t h, void *params, int jobz, int uplo,
                                long long n, int type_a, const void *A, long long lda,
                                int type_w, const void *W, int compute, size_t *device,
                                size_t *host);

int cublasCreate_v2(void **handle);
int cublasDestroy_v2(void *handle);
int cublasSgetrfBatched(void *h, int n, float **A, int lda, int *pivots, int *info, int batch);
int cublasSgetrsBatched(void *h, int trans, int n, int nrhs, float **A, int lda,
                        const int *pivots, float **B, int ldb, int *info, int batch);
int cublasSgeqrfBatched(void *h, int m, int n, float **A, int lda, float **tau, int *info,
                        int batch);

enum { C_32F = 4, R_32F = 0, CUFFT_C2C = 0x29, H2D = 1, D2H = 2 };

static size_t used(void)
{
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    return total - free_bytes;
}

int main(void)
{
    void *data = NULL, *area = NULL;
    cudaMalloc(&data, 1 << 20);
    cudaMalloc(&area, 1 << 20);

    /* A plan with auto-allocation (the default): it takes its workspace itself (1009 points, a
     * prime: a size with a workspace). */
    int plan = 0;
    long long n[] = {1009};
    size_t work = 0, before = used();
    int rc = cufftCreate(&plan);
    int made = cufftXtMakePlanMany(plan, 1, n, NULL, 1, 0, C_32F, NULL, 1, 0, C_32F, 8, &work,
                                   C_32F);
    size_t taken = used() - before;
    int exec = cufftXtExec(plan, data, data, -1);
    printf("auto: create=%d make=%d work=%zu taken=%zu exec=%d", rc, made, work, taken, exec);
    rc = cufftDestroy(plan);
    int given_back = used() == before;
    printf(" destroy=%d given_back=%d again=%d\n", rc, given_back, cufftDestroy(plan));

    /* As torch: auto-allocation off, its workspace set before each transform. */
    rc = cufftCreate(&plan);
    int off = cufftSetAutoAllocation(plan, 0);
    made = cufftXtMakePlanMany(plan, 1, n, NULL, 1, 0, R_32F, NULL, 1, 0, C_32F, 8, &work, C_32F);
    size_t size = 0;
    int got = cufftGetSize(plan, &size);
    printf("manual: create=%d off=%d make=%d work=%zu taken=%zu size=%d/%zu", rc, off, made, work,
           used() - before, got, size);
    printf(" exec_without_area=%d", cufftXtExec(plan, data, data, -1));
    printf(" set=%d", cufftSetWorkArea(plan, area));
    printf(" exec=%d", cufftXtExec(plan, data, data, -1));
    printf(" destroy=%d\n", cufftDestroy(plan));

    /* Errors: a plan never made, sizes, ranks, types; the classic plan functions. */
    rc = cufftCreate(&plan);
    printf("errors: unmade_exec=%d", cufftExecC2C(plan, data, data, -1));
    cufftDestroy(plan);
    int sizes[] = {64, 64, 64, 64};
    printf(" zero_size=%d", cufftPlan1d(&plan, 0, CUFFT_C2C, 1));
    printf(" rank4=%d", cufftPlanMany(&plan, 4, sizes, NULL, 1, 0, NULL, 1, 0, CUFFT_C2C, 1));
    printf(" bad_type=%d", cufftPlan1d(&plan, 64, 0x77, 1));
    rc = cufftPlanMany(&plan, 2, sizes, NULL, 1, 0, NULL, 1, 0, CUFFT_C2C, 3);
    got = cufftGetSize(plan, &size);
    exec = cufftExecC2C(plan, data, data, 1);
    printf(" plan_many=%d size=%d/%zu exec=%d", rc, got, size, exec);
    printf(" destroy=%d", cufftDestroy(plan));
    int version = 0;
    rc = cufftGetVersion(&version);
    printf(" version=%d/%d\n", rc, version);

    /* cuSOLVER: a handle, a query, routines that write their info outputs (-7 before). */
    cusolverDnHandle_t handle = NULL;
    rc = cusolverDnCreate(&handle);
    int lwork = -1;
    got = cusolverDnSgetrf_bufferSize(handle, 96, 96, data, 96, &lwork);
    printf("solver: create=%d getrf_buffer=%d/%d", rc, got, lwork);
    int infos[4] = {-7, -7, -7, -7};
    int *device_infos = (int *)area;
    cudaMemcpy(device_infos, infos, sizeof infos, H2D);
    printf(" potrf=%d", cusolverDnSpotrf(handle, 0, 96, data, 96, area, lwork, device_infos));
    float *matrices[3] = {data, data, data};
    printf(" batched=%d", cusolverDnSpotrfBatched(handle, 0, 16, matrices, 16, device_infos + 1, 2));
    cudaMemcpy(infos, device_infos, sizeof infos, D2H);
    printf(" infos=%d,%d,%d,%d", infos[0], infos[1], infos[2], infos[3]);
    void *params = NULL;
    size_t device = 0, host = 1;
    rc = cusolverDnCreateParams(&params);
    got = cusolverDnXsyevd_bufferSize(handle, params, 1, 0, 96, R_32F, data, 96, R_32F, area,
                                      R_32F, &device, &host);
    printf(" params=%d syevd=%d/%zu/%zu", rc, got, device, host);
    printf(" bad_type=%d", cusolverDnXsyevd_bufferSize(handle, params, 1, 0, 96, 99, data, 96, 99,
                                                      area, 99, &device, &host));
    printf(" no_handle=%d", cusolverDnSgetrf_bufferSize(NULL, 96, 96, data, 96, &lwork));
    printf(" destroy=%d", cusolverDnDestroyParams(params));
    printf("/%d\n", cusolverDnDestroy(handle));

    /* cuBLAS's batched solvers: device infos (getrf, one per matrix) and host ones. */
    void *blas = NULL;
    rc = cublasCreate_v2(&blas);
    int four[4] = {-7, -7, -7, -7};
    cudaMemcpy(device_infos, four, sizeof four, H2D);
    got = cublasSgetrfBatched(blas, 16, matrices, 16, NULL, device_infos, 3);
    cudaMemcpy(four, device_infos, sizeof four, D2H);
    printf("blas: create=%d getrf=%d infos=%d,%d,%d,%d", rc, got, four[0], four[1], four[2],
           four[3]);
    int host_info = -7;
    got = cublasSgetrsBatched(blas, 0, 16, 1, matrices, 16, NULL, matrices, 16, &host_info, 3);
    printf(" getrs=%d/%d", got, host_info);
    host_info = -7;
    got = cublasSgeqrfBatched(blas, 16, 16, matrices, 16, matrices, &host_info, 3);
    printf(" geqrf=%d/%d", got, host_info);
    printf(" destroy=%d\n", cublasDestroy_v2(blas));
    cudaFree(data);
    cudaFree(area);
    return 0;
}

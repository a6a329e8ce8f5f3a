/* A plain CUDA C program on the fake runtime, linked like an nvcc-built one against the
 * runtime: device query, allocations of each kind, a copy round trip, an OOM, and a library
 * function that is not implemented. One line per step: "<step> <values>". Built with
 * -DCUDA_MAJOR=13 (libcudart.so.13) or 12 (libcudart.so.12): the two differ in cudaDeviceProp
 * (1008 / 1032 bytes; offsets from NVIDIA's headers) and in the name CUDA 12 headers give
 * cudaGetDeviceProperties. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int cudaError_t;
cudaError_t cudaGetDeviceCount(int *count);
#if CUDA_MAJOR == 12
#define PROP_SIZE 1032
#define SM_COUNT_OFFSET 388
#define CUBLAS "libcublas.so.12"
/* cuda_runtime_api.h of CUDA 12: #define cudaGetDeviceProperties cudaGetDeviceProperties_v2 */
cudaError_t cudaGetDeviceProperties_v2(void *prop, int device);
#define cudaGetDeviceProperties cudaGetDeviceProperties_v2
cudaError_t cudaPointerGetAttributes(void *attributes, const void *p);
/* The unsuffixed name libcudart.so.12 still exports: the pre-12 structure (CUDA 11.8's
 * driver_types.h: 728 bytes, the same fields up to reservedSharedMemPerBlock). */
#define PRE12_PROP_SIZE 728
cudaError_t pre12_get_device_properties(void *prop, int device) __asm__("cudaGetDeviceProperties");
#elif CUDA_MAJOR == 13
#define PROP_SIZE 1008
#define SM_COUNT_OFFSET 384
#define CUBLAS "libcublas.so.13"
cudaError_t cudaGetDeviceProperties(void *prop, int device);
#else
#error "build with -DCUDA_MAJOR=12 or 13"
#endif
#define MAJOR_OFFSET 360
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t size);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMallocAsync(void **p, size_t size, void *stream);
cudaError_t cudaFreeAsync(void *p, void *stream);
cudaError_t cudaStreamSynchronize(void *stream);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t error);
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags, int *status);

int main(void)
{
    int count = -1;
    /* The structure with 64 marked bytes after it: the runtime must write none of them. */
    unsigned char prop[PROP_SIZE + 64];
    memset(prop, 0xab, sizeof prop);
    cudaError_t rc = cudaGetDeviceCount(&count);
    printf("count rc=%d count=%d\n", rc, count);
    rc = cudaGetDeviceProperties(prop, 0);
    size_t total_global;
    int cc_major, cc_minor, sms, untouched = 1;
    memcpy(&total_global, prop + 288, sizeof total_global);
    memcpy(&cc_major, prop + MAJOR_OFFSET, sizeof cc_major);
    memcpy(&cc_minor, prop + MAJOR_OFFSET + 4, sizeof cc_minor);
    memcpy(&sms, prop + SM_COUNT_OFFSET, sizeof sms);
    for (size_t i = PROP_SIZE; i < sizeof prop; i++)
        untouched &= prop[i] == 0xab;
    printf("props rc=%d name=%s total=%zu cc=%d.%d sms=%d after=%s\n", rc, (char *)prop,
           total_global, cc_major, cc_minor, sms, untouched ? "untouched" : "overwritten");
#if CUDA_MAJOR == 12
    unsigned char same[PROP_SIZE + 64];
    memcpy(same, prop, sizeof same);
    memset(prop, 0xab, sizeof prop);
    rc = pre12_get_device_properties(prop, 0);
    untouched = 1;
    for (size_t i = PRE12_PROP_SIZE; i < sizeof prop; i++)
        untouched &= prop[i] == 0xab;
    printf("props-pre12 rc=%d same=%d after=%s\n", rc, !memcmp(prop, same, PRE12_PROP_SIZE),
           untouched ? "untouched" : "overwritten");
#endif

    void *a = NULL, *b = NULL, *host = NULL, *pooled = NULL;
    size_t free_bytes, total;
    printf("malloc rc=%d\n", cudaMalloc(&a, 3 << 20));
    printf("malloc rc=%d\n", cudaMalloc(&b, 5 << 20));
    cudaMemGetInfo(&free_bytes, &total);
    printf("info used=%zu total=%zu\n", total - free_bytes, total);
    rc = cudaMalloc(&host, (size_t)1 << 40);
    printf("oom rc=%d last=%d text=%s\n", rc, cudaGetLastError(), cudaGetErrorString(rc));

    char message[] = "round trip", back[sizeof message] = {0};
    cudaMallocHost(&host, 4096);
    memcpy(host, message, sizeof message);
    cudaError_t to_device = cudaMemcpy(a, host, sizeof message, 1);
    cudaError_t to_host = cudaMemcpy(back, a, sizeof message, 2);
    printf("copy rc=%d rc=%d back=%s\n", to_device, to_host, back);
#if CUDA_MAJOR == 12
    /* CUDA 12's cudaPointerAttributes: type, device, devicePointer, hostPointer (24 bytes). */
    unsigned char attributes[24 + 64];
    memset(attributes, 0xab, sizeof attributes);
    rc = cudaPointerGetAttributes(attributes, a);
    int type, device;
    void *device_pointer;
    memcpy(&type, attributes, sizeof type);
    memcpy(&device, attributes + 4, sizeof device);
    memcpy(&device_pointer, attributes + 8, sizeof device_pointer);
    untouched = 1;
    for (size_t i = 24; i < sizeof attributes; i++)
        untouched &= attributes[i] == 0xab;
    printf("pointer rc=%d type=%d device=%d same=%d after=%s\n", rc, type, device,
           device_pointer == a, untouched ? "untouched" : "overwritten");
#endif
    printf("async rc=%d\n", cudaMallocAsync(&pooled, 1 << 20, NULL));
    cudaError_t freed = cudaFreeAsync(pooled, NULL);
    cudaMemGetInfo(&free_bytes, &total);
    size_t cached = total - free_bytes; /* the pool keeps the freed block until a sync */
    cudaError_t synced = cudaStreamSynchronize(NULL);
    cudaMemGetInfo(&free_bytes, &total);
    printf("freeasync rc=%d cached=%zu sync rc=%d after=%zu\n", freed, cached, synced,
           total - free_bytes);
    cudaError_t free_a = cudaFree(a), free_b = cudaFree(b), free_host = cudaFreeHost(host);
    printf("free rc=%d rc=%d rc=%d\n", free_a, free_b, free_host);
    cudaMemGetInfo(&free_bytes, &total);
    printf("info used=%zu\n", total - free_bytes);

    /* Not implemented by the fakes: NOT_SUPPORTED (15) every time, logged once. */
    void *cublas = dlopen(CUBLAS, RTLD_NOW);
    int (*xt_create)(void **) = cublas ? (int (*)(void **))dlsym(cublas, "cublasXtCreate") : NULL;
    void *xt = NULL;
    int first = xt_create ? xt_create(&xt) : -1, second = xt_create ? xt_create(&xt) : -1;
    printf("cublasXtCreate rc=%d rc=%d\n", first, second);

    /* The driver's resolver: a known function (the CUDA 12+ variant of a base name), and one
     * that does not exist (not found, logged once). */
    void *fn = NULL;
    int status = -1;
    rc = cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 12000, 0, &status);
    unsigned long long through_entry = 0;
    int alloc_rc = fn ? ((int (*)(unsigned long long *, size_t))fn)(&through_entry, 4096) : -1;
    printf("entry cuMemAlloc rc=%d status=%d alloc rc=%d free rc=%d\n", rc, status, alloc_rc,
           cudaFree((void *)through_entry));
    rc = cudaGetDriverEntryPointByVersion("cuNoSuchFunction", &fn, 13000, 0, &status);
    rc = cudaGetDriverEntryPointByVersion("cuNoSuchFunction", &fn, 13000, 0, &status);
    printf("entry cuNoSuchFunction rc=%d status=%d\n", rc, status);
    return 0;
}

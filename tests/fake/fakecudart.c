/*
 * fakecudart: a fake libcudart.so.12 for the vramshim tests.
 *
 * Reaches the driver exactly like NVIDIA's runtime does (and never links
 * against libcuda):
 *   1. dlopen("libcuda.so.1", RTLD_NOW)
 *   2. exactly one dlsym(handle, "cuGetProcAddress_v2")
 *   3. a probe call of it with an empty symbol name
 *   4. look up "cuInit" and call cuInit(0)
 *   5. ask the resolver for "cuGetProcAddress" at 11030 and 12000, and use the
 *      12000 result for every further look-up by base name at version 12000;
 *      the stream-ordered functions are looked up again with flags = 2
 *      (per-thread default stream) for the _ptsz entry points.
 * No other dlsym calls are made on the driver handle.  The library never prints.
 */
#define _GNU_SOURCE
#include "cuda.h"
#include "cuda_runtime.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define EXPORT __attribute__((visibility("default")))
#define MAXDEV 64
#define LOOKUP_VERSION 12000

_Static_assert(sizeof(struct cudaMemPoolProps) == sizeof(CUmemPoolProps), "pool props");

typedef CUresult (*gpa_v2_t)(const char *, void **, int, cuuint64_t,
                             CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa_v1_t)(const char *, void **, int, cuuint64_t);

/* Driver entry points, filled once by rt_init and read-only afterwards. */
static struct {
    gpa_v2_t gpa;    /* resolver obtained from the resolver at 12000 */
    gpa_v1_t gpa_v1; /* resolver obtained at 11030 (v1 ABI), kept like cudart does */
    CUresult (*init)(unsigned int);
    CUresult (*driverGetVersion)(int *);
    CUresult (*deviceGetCount)(int *);
    CUresult (*primaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*ctxSetCurrent)(CUcontext);
    CUresult (*ctxSynchronize)(void);
    CUresult (*memAlloc)(CUdeviceptr *, size_t);
    CUresult (*memFree)(CUdeviceptr);
    CUresult (*memAllocManaged)(CUdeviceptr *, size_t, unsigned int);
    CUresult (*memAllocHost)(void **, size_t);
    CUresult (*memHostAlloc)(void **, size_t, unsigned int);
    CUresult (*memFreeHost)(void *);
    CUresult (*memAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
    CUresult (*memGetInfo)(size_t *, size_t *);
    CUresult (*streamCreate)(CUstream *, unsigned int);
    CUresult (*streamDestroy)(CUstream);
    CUresult (*streamSynchronize)(CUstream);
    CUresult (*deviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
    CUresult (*memPoolCreate)(CUmemoryPool *, const CUmemPoolProps *);
    CUresult (*memPoolDestroy)(CUmemoryPool);
    CUresult (*memPoolTrimTo)(CUmemoryPool, size_t);
    CUresult (*memAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*memFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*memAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*memAllocAsync_ptsz)(CUdeviceptr *, size_t, CUstream);
    CUresult (*memFreeAsync_ptsz)(CUdeviceptr, CUstream);
    CUresult (*memAllocFromPoolAsync_ptsz)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
} d;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static cudaError_t g_init_err = cudaSuccess;
static int g_ndev;

static pthread_mutex_t g_ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(CUcontext) g_primary[MAXDEV];

static __thread int t_dev;
static __thread cudaError_t t_last_error;

static cudaError_t map_error(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS:
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_OUT_OF_MEMORY:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_NOT_FOUND:
        return (cudaError_t)r; /* same numeric value in both APIs */
    default:
        return cudaErrorUnknown;
    }
}

static cudaError_t ret(cudaError_t e)
{
    if (e != cudaSuccess)
        t_last_error = e;
    return e;
}

static void rt_init(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        g_init_err = cudaErrorInsufficientDriver;
        return;
    }
    gpa_v2_t boot = (gpa_v2_t)dlsym(h, "cuGetProcAddress_v2");
    if (!boot) {
        g_init_err = cudaErrorInsufficientDriver;
        return;
    }
    CUdriverProcAddressQueryResult st;
    void *p = NULL;
    /* Probe: an empty name must answer SUCCESS with status SYMBOL_NOT_FOUND. */
    if (boot("", &p, CUDART_VERSION, 0, &st) != CUDA_SUCCESS) {
        g_init_err = cudaErrorInsufficientDriver;
        return;
    }
    p = NULL;
    if (boot("cuInit", &p, LOOKUP_VERSION, 0, &st) != CUDA_SUCCESS || !p) {
        g_init_err = cudaErrorInsufficientDriver;
        return;
    }
    d.init = (CUresult(*)(unsigned int))p;
    CUresult r = d.init(0);
    if (r != CUDA_SUCCESS) {
        g_init_err = map_error(r) == cudaErrorUnknown ? cudaErrorInitializationError
                                                      : map_error(r);
        return;
    }
    p = NULL;
    boot("cuGetProcAddress", &p, 11030, 0, &st);
    d.gpa_v1 = (gpa_v1_t)p;
    p = NULL;
    if (boot("cuGetProcAddress", &p, 12000, 0, &st) != CUDA_SUCCESS || !p) {
        g_init_err = cudaErrorInsufficientDriver;
        return;
    }
    d.gpa = (gpa_v2_t)p;

    static const struct {
        const char *name;
        size_t off;
        cuuint64_t flags;
    } tbl[] = {
#define E(name, field, flags) {name, offsetof(__typeof__(d), field), flags}
        E("cuDriverGetVersion", driverGetVersion, 0),
        E("cuDeviceGetCount", deviceGetCount, 0),
        E("cuDevicePrimaryCtxRetain", primaryCtxRetain, 0),
        E("cuCtxSetCurrent", ctxSetCurrent, 0),
        E("cuCtxSynchronize", ctxSynchronize, 0),
        E("cuMemAlloc", memAlloc, 0),
        E("cuMemFree", memFree, 0),
        E("cuMemAllocManaged", memAllocManaged, 0),
        E("cuMemAllocHost", memAllocHost, 0),
        E("cuMemHostAlloc", memHostAlloc, 0),
        E("cuMemFreeHost", memFreeHost, 0),
        E("cuMemAllocPitch", memAllocPitch, 0),
        E("cuMemGetInfo", memGetInfo, 0),
        E("cuStreamCreate", streamCreate, 0),
        E("cuStreamDestroy", streamDestroy, 0),
        E("cuStreamSynchronize", streamSynchronize, 0),
        E("cuDeviceGetDefaultMemPool", deviceGetDefaultMemPool, 0),
        E("cuMemPoolCreate", memPoolCreate, 0),
        E("cuMemPoolDestroy", memPoolDestroy, 0),
        E("cuMemPoolTrimTo", memPoolTrimTo, 0),
        E("cuMemAllocAsync", memAllocAsync, 0),
        E("cuMemFreeAsync", memFreeAsync, 0),
        E("cuMemAllocFromPoolAsync", memAllocFromPoolAsync, 0),
        E("cuMemAllocAsync", memAllocAsync_ptsz, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
        E("cuMemFreeAsync", memFreeAsync_ptsz, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
        E("cuMemAllocFromPoolAsync", memAllocFromPoolAsync_ptsz,
          CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
#undef E
    };
    for (size_t i = 0; i < sizeof tbl / sizeof tbl[0]; i++) {
        void *fn = NULL;
        if (d.gpa(tbl[i].name, &fn, LOOKUP_VERSION, tbl[i].flags, &st) != CUDA_SUCCESS || !fn) {
            g_init_err = cudaErrorInsufficientDriver;
            return;
        }
        *(void **)((char *)&d + tbl[i].off) = fn;
    }
    int n = 0;
    r = d.deviceGetCount(&n);
    if (r != CUDA_SUCCESS) {
        g_init_err = map_error(r);
        return;
    }
    if (n <= 0) {
        g_init_err = cudaErrorNoDevice;
        return;
    }
    g_ndev = n > MAXDEV ? MAXDEV : n;
}

static cudaError_t lazy_init(void)
{
    pthread_once(&g_once, rt_init);
    return g_init_err;
}

static cudaError_t primary_ctx(int dev, CUcontext *out)
{
    CUcontext c = atomic_load_explicit(&g_primary[dev], memory_order_acquire);
    if (!c) {
        pthread_mutex_lock(&g_ctx_lock);
        c = atomic_load_explicit(&g_primary[dev], memory_order_relaxed);
        if (!c) {
            CUresult r = d.primaryCtxRetain(&c, dev);
            if (r != CUDA_SUCCESS) {
                pthread_mutex_unlock(&g_ctx_lock);
                return map_error(r);
            }
            atomic_store_explicit(&g_primary[dev], c, memory_order_release);
        }
        pthread_mutex_unlock(&g_ctx_lock);
    }
    *out = c;
    return cudaSuccess;
}

/* Every API call: initialize, then make the thread's device's primary context current. */
static cudaError_t enter(void)
{
    cudaError_t e = lazy_init();
    if (e)
        return e;
    CUcontext c = NULL;
    if ((e = primary_ctx(t_dev, &c)))
        return e;
    return map_error(d.ctxSetCurrent(c));
}

#define ENTER()                                                                                \
    do {                                                                                       \
        cudaError_t e_ = enter();                                                              \
        if (e_)                                                                                \
            return ret(e_);                                                                    \
    } while (0)

#define CALL(expr) return ret(map_error(expr))

/* ------------------------------------------------------------------------- */

EXPORT cudaError_t cudaSetDevice(int device)
{
    cudaError_t e = lazy_init();
    if (e)
        return ret(e);
    if (device < 0 || device >= g_ndev)
        return ret(cudaErrorInvalidDevice);
    t_dev = device;
    return ret(enter());
}

EXPORT cudaError_t cudaGetDevice(int *device)
{
    cudaError_t e = lazy_init();
    if (e)
        return ret(e);
    if (!device)
        return ret(cudaErrorInvalidValue);
    *device = t_dev;
    return cudaSuccess;
}

EXPORT cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = lazy_init();
    *count = e ? 0 : g_ndev;
    return ret(e);
}

EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    ENTER();
    CALL(d.ctxSynchronize());
}

EXPORT cudaError_t cudaDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = lazy_init();
    if (e || !d.driverGetVersion) {
        *driverVersion = 0;
        return cudaSuccess;
    }
    CALL(d.driverGetVersion(driverVersion));
}

EXPORT cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)
{
    if (!runtimeVersion)
        return ret(cudaErrorInvalidValue);
    *runtimeVersion = CUDART_VERSION;
    return cudaSuccess;
}

EXPORT const char *cudaGetErrorString(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorCudartUnloading: return "driver shutting down";
    case cudaErrorInsufficientDriver:
        return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorDeviceUninitialized: return "invalid device context";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorSymbolNotFound: return "named symbol not found";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorUnknown: return "unknown error";
    }
    return "unrecognized error code";
}

EXPORT const char *cudaGetErrorName(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorCudartUnloading: return "cudaErrorCudartUnloading";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorDeviceUninitialized: return "cudaErrorDeviceUninitialized";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorSymbolNotFound: return "cudaErrorSymbolNotFound";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorUnknown: return "cudaErrorUnknown";
    }
    return "cudaErrorUnknown";
}

EXPORT cudaError_t cudaGetLastError(void)
{
    cudaError_t e = t_last_error;
    t_last_error = cudaSuccess;
    return e;
}

EXPORT cudaError_t cudaPeekAtLastError(void)
{
    return t_last_error;
}

/* ---- Streams ---- */

EXPORT cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    ENTER();
    if (!pStream)
        return ret(cudaErrorInvalidValue);
    CALL(d.streamCreate(pStream, 0));
}

EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    ENTER();
    CALL(d.streamDestroy(stream));
}

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    ENTER();
    CALL(d.streamSynchronize(stream));
}

/* ---- Memory ---- */

EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    ENTER();
    if (!devPtr)
        return ret(cudaErrorInvalidValue);
    if (size == 0) { /* like the real runtime: success, NULL, no driver call */
        *devPtr = NULL;
        return cudaSuccess;
    }
    CUdeviceptr p;
    CUresult r = d.memAlloc(&p, size);
    if (r == CUDA_SUCCESS)
        *devPtr = (void *)(uintptr_t)p;
    CALL(r);
}

EXPORT cudaError_t cudaFree(void *devPtr)
{
    ENTER();
    if (!devPtr)
        return cudaSuccess;
    CALL(d.memFree((CUdeviceptr)(uintptr_t)devPtr));
}

EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    ENTER();
    if (!devPtr)
        return ret(cudaErrorInvalidValue);
    CUdeviceptr p;
    CUresult r = d.memAllocManaged(&p, size, flags);
    if (r == CUDA_SUCCESS)
        *devPtr = (void *)(uintptr_t)p;
    CALL(r);
}

EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    ENTER();
    CALL(d.memAllocHost(ptr, size));
}

EXPORT cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    ENTER();
    CALL(d.memHostAlloc(pHost, size, flags));
}

EXPORT cudaError_t cudaFreeHost(void *ptr)
{
    ENTER();
    if (!ptr)
        return cudaSuccess;
    CALL(d.memFreeHost(ptr));
}

EXPORT cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
    ENTER();
    if (!devPtr || !pitch)
        return ret(cudaErrorInvalidValue);
    CUdeviceptr p;
    CUresult r = d.memAllocPitch(&p, pitch, width, height, 16);
    if (r == CUDA_SUCCESS)
        *devPtr = (void *)(uintptr_t)p;
    CALL(r);
}

EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    ENTER();
    CALL(d.memGetInfo(free_bytes, total_bytes));
}

/* ---- Stream-ordered allocator ---- */

static cudaError_t malloc_async(CUresult (*fn)(CUdeviceptr *, size_t, CUstream), void **devPtr,
                                size_t size, cudaStream_t stream)
{
    ENTER();
    if (!devPtr)
        return ret(cudaErrorInvalidValue);
    if (size == 0) {
        *devPtr = NULL;
        return cudaSuccess;
    }
    CUdeviceptr p;
    CUresult r = fn(&p, size, stream);
    if (r == CUDA_SUCCESS)
        *devPtr = (void *)(uintptr_t)p;
    CALL(r);
}

static cudaError_t free_async(CUresult (*fn)(CUdeviceptr, CUstream), void *devPtr,
                              cudaStream_t stream)
{
    ENTER();
    if (!devPtr)
        return cudaSuccess;
    CALL(fn((CUdeviceptr)(uintptr_t)devPtr, stream));
}

static cudaError_t malloc_pool(CUresult (*fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream),
                               void **ptr, size_t size, cudaMemPool_t pool, cudaStream_t stream)
{
    ENTER();
    if (!ptr)
        return ret(cudaErrorInvalidValue);
    if (size == 0) {
        *ptr = NULL;
        return cudaSuccess;
    }
    CUdeviceptr p;
    CUresult r = fn(&p, size, pool, stream);
    if (r == CUDA_SUCCESS)
        *ptr = (void *)(uintptr_t)p;
    CALL(r);
}

EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
    lazy_init();
    return malloc_async(d.memAllocAsync, devPtr, size, hStream);
}

EXPORT cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream)
{
    lazy_init();
    return malloc_async(d.memAllocAsync_ptsz, devPtr, size, hStream);
}

EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
    lazy_init();
    return free_async(d.memFreeAsync, devPtr, hStream);
}

EXPORT cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream)
{
    lazy_init();
    return free_async(d.memFreeAsync_ptsz, devPtr, hStream);
}

EXPORT cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
                                           cudaStream_t stream)
{
    lazy_init();
    return malloc_pool(d.memAllocFromPoolAsync, ptr, size, memPool, stream);
}

EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
                                                cudaStream_t stream)
{
    lazy_init();
    return malloc_pool(d.memAllocFromPoolAsync_ptsz, ptr, size, memPool, stream);
}

EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device)
{
    ENTER();
    if (device < 0 || device >= g_ndev)
        return ret(cudaErrorInvalidDevice);
    CALL(d.deviceGetDefaultMemPool(memPool, device));
}

EXPORT cudaError_t cudaMemPoolCreate(cudaMemPool_t *memPool,
                                     const struct cudaMemPoolProps *poolProps)
{
    ENTER();
    CALL(d.memPoolCreate(memPool, (const CUmemPoolProps *)poolProps));
}

EXPORT cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool)
{
    ENTER();
    CALL(d.memPoolDestroy(memPool));
}

EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep)
{
    ENTER();
    CALL(d.memPoolTrimTo(memPool, minBytesToKeep));
}

/* ---- Driver entry point access ---- */

static cudaError_t entry_point(const char *symbol, void **funcPtr, int version,
                               unsigned long long flags,
                               cudaDriverEntryPointQueryResult *driverStatus)
{
    ENTER();
    if (!symbol || !funcPtr)
        return ret(cudaErrorInvalidValue);
    cuuint64_t cuflags;
    switch (flags) {
    case cudaEnableDefault: cuflags = CU_GET_PROC_ADDRESS_DEFAULT; break;
    case cudaEnableLegacyStream: cuflags = CU_GET_PROC_ADDRESS_LEGACY_STREAM; break;
    case cudaEnablePerThreadDefaultStream:
        cuflags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
        break;
    default: return ret(cudaErrorInvalidValue);
    }
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = d.gpa(symbol, funcPtr, version, cuflags, &st);
    if (driverStatus)
        *driverStatus = (cudaDriverEntryPointQueryResult)st;
    CALL(r);
}

EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr,
                                           unsigned long long flags,
                                           cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, CUDART_VERSION, flags, driverStatus);
}

EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                                    unsigned int cudaVersion,
                                                    unsigned long long flags,
                                                    cudaDriverEntryPointQueryResult *driverStatus)
{
    if (cudaVersion > 0x7FFFFFFFu)
        return ret(cudaErrorInvalidValue);
    return entry_point(symbol, funcPtr, (int)cudaVersion, flags, driverStatus);
}

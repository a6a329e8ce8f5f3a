/* The runtime's state (devices, primary contexts, last error), device queries and errors. */
#include "runtime.h"
#include "fakegpu_fork.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* The per-thread state lives in the fake driver, shared by both runtime majors. */
#define last_error (fakegpu_runtime_thread()->last_error)
#define thread_device (fakegpu_runtime_thread()->device)

cudaError_t fg_rt_status(CUresult rc)
{
    if (rc != CUDA_SUCCESS)
        last_error = rc; /* the runtime's codes equal the driver's for every code it returns */
    return rc;
}

int fg_rt_device(void)
{
    CUcontext ctx = NULL;
    int dev;
    if (cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx &&
        cuCtxGetDevice(&dev) == CUDA_SUCCESS)
        return dev;
    return thread_device;
}

/* One retain of each device's primary context, made by whichever thread needs it first. */
static CUcontext primary[64];
static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;

/* primary_lock is held while calling the driver, so it is taken before the driver's locks
 * across fork: this library's constructor runs after the driver's (it links it), and prepare
 * handlers run in reverse order of registration (fakegpu_fork.h, cuda/fork.c). Tried for a
 * bounded time only (as every lock there): a fork from a signal handler may come while this
 * thread holds a driver lock that primary_lock's holder waits for. */
static struct fg_fork_state fork_state;
static void before_fork(void)
{
    fg_fork_begin(&fork_state);
    fg_fork_take(&fork_state, &primary_lock);
}
static void after_fork_parent(void) { fg_fork_release_parent(&fork_state, &primary_lock); }
static void after_fork_child(void)
{
    fg_fork_release_child(&fork_state, &primary_lock);
    fg_fork_warn_child(&fork_state, "libcudart");
}
__attribute__((constructor)) static void register_fork_handlers(void)
{
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

static CUresult activate(int dev)
{
    CUresult rc = cuInit(0);
    if (rc)
        return rc;
    int count = 0;
    cuDeviceGetCount(&count);
    if (dev < 0 || dev >= count || dev >= 64)
        return cudaErrorInvalidDevice;
    pthread_mutex_lock(&primary_lock);
    if (!primary[dev])
        rc = cuDevicePrimaryCtxRetain(&primary[dev], dev);
    CUcontext ctx = primary[dev];
    pthread_mutex_unlock(&primary_lock);
    if (rc)
        return rc;
    CUcontext current = NULL;
    cuCtxGetCurrent(&current);
    return current == ctx ? CUDA_SUCCESS : cuCtxSetCurrent(ctx);
}

cudaError_t fg_rt_ready(void)
{
    CUcontext current = NULL;
    if (cuCtxGetCurrent(&current) == CUDA_SUCCESS && current)
        return cudaSuccess;
    return fg_rt_status(activate(thread_device));
}

FG_EXPORT cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

FG_EXPORT cudaError_t cudaPeekAtLastError(void) { return last_error; }

FG_EXPORT cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return fg_rt_status(cudaErrorInvalidValue);
    CUresult rc = cuInit(0);
    if (rc) {
        *count = 0;
        return fg_rt_status(rc == CUDA_ERROR_INVALID_VALUE ? cudaErrorInitializationError : rc);
    }
    return fg_rt_status(cuDeviceGetCount(count));
}

FG_EXPORT cudaError_t cudaSetDevice(int device)
{
    CUresult rc = activate(device);
    if (rc)
        return fg_rt_status(rc);
    thread_device = device;
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return fg_rt_status(cudaErrorInvalidValue);
    CUresult rc = cuInit(0);
    if (rc)
        return fg_rt_status(cudaErrorInitializationError);
    *device = fg_rt_device();
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaSetDeviceFlags(unsigned int flags) { return fg_rt_ready(); }

FG_EXPORT cudaError_t cudaGetDeviceFlags(unsigned int *flags)
{
    if (!flags)
        return fg_rt_status(cudaErrorInvalidValue);
    *flags = 0;
    return fg_rt_ready();
}

FG_EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    cudaError_t rc = fg_rt_ready();
    return rc ? rc : fg_rt_status(cuCtxSynchronize());
}

FG_EXPORT cudaError_t cudaDeviceReset(void) { return fg_rt_ready(); }

FG_EXPORT cudaError_t cudaDriverGetVersion(int *version)
{
    if (!version)
        return fg_rt_status(cudaErrorInvalidValue);
    return fg_rt_status(cuDriverGetVersion(version));
}

FG_EXPORT cudaError_t cudaRuntimeGetVersion(int *version)
{
    if (!version)
        return fg_rt_status(cudaErrorInvalidValue);
    *version = FG_RUNTIME_VERSION;
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaDeviceGetAttribute(int *value, int attribute, int device)
{
    CUresult rc = cuInit(0);
    return fg_rt_status(rc ? cudaErrorInitializationError
                           : cuDeviceGetAttribute(value, attribute, device));
}

static int attr(int attribute, int device)
{
    int value = 0;
    cuDeviceGetAttribute(&value, attribute, device);
    return value;
}

FG_EXPORT cudaError_t FG_GET_DEVICE_PROPERTIES(struct cudaDeviceProp *p, int device)
{
    if (!p)
        return fg_rt_status(cudaErrorInvalidValue);
    if (cuInit(0))
        return fg_rt_status(cudaErrorInitializationError);
    int count = 0;
    cuDeviceGetCount(&count);
    if (device < 0 || device >= count)
        return fg_rt_status(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    cuDeviceGetName(p->name, sizeof p->name, device);
    cuDeviceGetUuid_v2(&p->uuid, device);
    cuDeviceTotalMem_v2(&p->totalGlobalMem, device);
    p->sharedMemPerBlock = (size_t)attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, device);
    p->regsPerBlock = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, device);
    p->warpSize = attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE, device);
    p->memPitch = (size_t)attr(CU_DEVICE_ATTRIBUTE_MAX_PITCH, device);
    p->maxThreadsPerBlock = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, device);
    for (int i = 0; i < 3; i++) {
        p->maxThreadsDim[i] = attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X + i, device);
        p->maxGridSize[i] = attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X + i, device);
    }
    p->totalConstMem = (size_t)attr(CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, device);
    p->major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
    p->minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
    p->textureAlignment = (size_t)attr(CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, device);
    p->texturePitchAlignment = 32;
    p->multiProcessorCount = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
#if FG_SONAME_MAJOR == 12
    /* Fields CUDA 13 dropped from the structure (cudaDeviceGetAttribute only there). */
    p->clockRate = attr(CU_DEVICE_ATTRIBUTE_CLOCK_RATE, device);
    p->memoryClockRate = attr(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, device);
    p->deviceOverlap = 1;
#endif
    p->canMapHostMemory = 1;
    p->surfaceAlignment = 512;
    p->concurrentKernels = 1;
    p->ECCEnabled = attr(CU_DEVICE_ATTRIBUTE_ECC_ENABLED, device);
    p->pciBusID = attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, device);
    p->asyncEngineCount = attr(CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, device);
    p->unifiedAddressing = 1;
    p->memoryBusWidth = attr(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, device);
    p->l2CacheSize = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, device);
    p->maxThreadsPerMultiProcessor = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, device);
    p->streamPrioritiesSupported = 1;
    p->globalL1CacheSupported = 1;
    p->localL1CacheSupported = 1;
    p->sharedMemPerMultiprocessor =
        (size_t)attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, device);
    p->regsPerMultiprocessor = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, device);
    p->managedMemory = 1;
    p->concurrentManagedAccess = 1;
    p->computePreemptionSupported = 1;
    p->cooperativeLaunch = 1;
    p->sharedMemPerBlockOptin =
        (size_t)attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device);
    p->maxBlocksPerMultiProcessor = attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, device);
    p->reservedSharedMemPerBlock = 1024;
    p->hostRegisterSupported = 1;
    p->memoryPoolsSupported = 1;
    p->memoryPoolSupportedHandleTypes = 1;
#if FG_SONAME_MAJOR != 12
    /* In CUDA 12.4's layout these lie in the reserved tail. */
    p->deviceNumaId = -1;
    p->hostNumaId = -1;
#endif
    return cudaSuccess;
}

#if FG_SONAME_MAJOR == 12
/* The unsuffixed name of libcudart.so.12: the pre-12 structure, no byte past it. */
FG_EXPORT cudaError_t cudaGetDeviceProperties(void *p, int device)
{
    if (!p)
        return fg_rt_status(cudaErrorInvalidValue);
    struct cudaDeviceProp full;
    cudaError_t rc = FG_GET_DEVICE_PROPERTIES(&full, device);
    if (rc == cudaSuccess)
        memcpy(p, &full, FG_PRE12_DEVICE_PROP_BYTES);
    return rc;
}
#endif

FG_EXPORT cudaError_t cudaDeviceGetPCIBusId(char *bus_id, int len, int device)
{
    return fg_rt_status(cuInit(0) ? cudaErrorInitializationError
                                  : cuDeviceGetPCIBusId(bus_id, len, device));
}

FG_EXPORT cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer)
{
    return fg_rt_status(cuInit(0) ? cudaErrorInitializationError
                                  : cuDeviceCanAccessPeer(can, device, peer));
}

FG_EXPORT cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags)
{
    cudaError_t rc = fg_rt_ready();
    if (rc)
        return rc;
    int can = 0;
    CUresult check = cuDeviceCanAccessPeer(&can, fg_rt_device(), peer);
    if (check)
        return fg_rt_status(check);
    return can ? cudaSuccess : fg_rt_status(cudaErrorInvalidDevice);
}

FG_EXPORT cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    cudaError_t rc = fg_rt_ready();
    return rc ? rc : fg_rt_status(cuCtxGetStreamPriorityRange(least, greatest));
}

FG_EXPORT cudaError_t cudaDeviceGetLimit(size_t *value, int limit)
{
    cudaError_t rc = fg_rt_ready();
    return rc ? rc : fg_rt_status(cuCtxGetLimit(value, limit));
}

FG_EXPORT cudaError_t cudaDeviceSetLimit(int limit, size_t value)
{
    cudaError_t rc = fg_rt_ready();
    return rc ? rc : fg_rt_status(cuCtxSetLimit(limit, value));
}

FG_EXPORT cudaError_t cudaDeviceGetGraphMemAttribute(int device, int attribute, void *value)
{
    cudaError_t rc = fg_rt_ready();
    return rc ? rc : fg_rt_status(cuDeviceGetGraphMemAttribute(device, attribute, value));
}

FG_EXPORT cudaError_t cudaDeviceSetGraphMemAttribute(int device, int attribute, void *value)
{
    cudaError_t rc = fg_rt_ready();
    return rc ? rc : fg_rt_status(cuDeviceSetGraphMemAttribute(device, attribute, value));
}

FG_EXPORT cudaError_t cudaDeviceGraphMemTrim(int device)
{
    cudaError_t rc = fg_rt_ready();
    return rc ? rc : fg_rt_status(cuDeviceGraphMemTrim(device));
}

FG_EXPORT cudaError_t cudaProfilerStart(void) { return cudaSuccess; }
FG_EXPORT cudaError_t cudaProfilerStop(void) { return cudaSuccess; }

FG_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn,
                                                       unsigned int version,
                                                       unsigned long long flags, int *status)
{
    return fg_rt_status(cuGetProcAddress_v2(symbol, fn, (int)version, flags, status));
}

FG_EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **fn,
                                              unsigned long long flags, int *status)
{
    return fg_rt_status(cuGetProcAddress_v2(symbol, fn, FG_RUNTIME_VERSION, flags, status));
}

static const struct {
    cudaError_t code;
    const char *name, *text;
} errors[] = {
    {0, "cudaSuccess", "no error"},
    {1, "cudaErrorInvalidValue", "invalid argument"},
    {2, "cudaErrorMemoryAllocation", "out of memory"},
    {3, "cudaErrorInitializationError", "initialization error"},
    {4, "cudaErrorCudartUnloading", "driver shutting down"},
    {100, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {101, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {200, "cudaErrorInvalidKernelImage", "device kernel image is invalid"},
    {201, "cudaErrorDeviceUninitialized", "invalid device context"},
    {400, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {500, "cudaErrorSymbolNotFound", "named symbol not found"},
    {600, "cudaErrorNotReady", "device not ready"},
    {704, "cudaErrorPeerAccessAlreadyEnabled", "peer access is already enabled"},
    {712, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {713, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {801, "cudaErrorNotSupported", "operation not supported"},
    {999, "cudaErrorUnknown", "unknown error"},
};

FG_EXPORT const char *cudaGetErrorString(cudaError_t error)
{
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
        if (errors[i].code == error)
            return errors[i].text;
    return "unrecognized error code";
}

FG_EXPORT const char *cudaGetErrorName(cudaError_t error)
{
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
        if (errors[i].code == error)
            return errors[i].name;
    return "cudaErrorUnknown";
}

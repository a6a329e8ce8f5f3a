/* Work submission, all of which completes at once (kernels do nothing): streams, events,
 * modules and libraries (loaded images are only kept as handles), launches, occupancy, graphs.
 * Synchronising calls are where stream-ordered pools give memory back (pool.c). */
#include "driver.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

struct CUstream_st {
    int device;
    unsigned flags;
    int priority;
    unsigned long long id;
};

struct CUevent_st {
    unsigned flags;
    double recorded_ms; /* CLOCK_MONOTONIC at the last record */
};

struct CUmod_st {
    int device;
};

struct CUfunc_st {
    CUmodule module;
    char name[];
};

struct CUgraph_st {
    int nodes;
};

struct CUgraphExec_st {
    CUgraph graph;
};

static unsigned long long next_stream_id = 1;

static CUresult need_context(void)
{
    int dev;
    return fg_current_device(&dev);
}

/* ---------------------------------------------------------------- streams */
FG_EXPORT CUresult cuStreamCreateWithPriority(CUstream *stream, unsigned int flags, int priority)
{
    int dev;
    CUresult rc = fg_current_device(&dev);
    if (rc)
        return rc;
    if (!stream || flags > 1)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->device = dev;
    s->flags = flags;
    s->priority = priority < -5 ? -5 : priority > 0 ? 0 : priority;
    s->id = __atomic_fetch_add(&next_stream_id, 1, __ATOMIC_RELAXED) + 2;
    *stream = s;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuStreamCreate(CUstream *stream, unsigned int flags)
{
    return cuStreamCreateWithPriority(stream, flags, 0);
}

FG_EXPORT CUresult cuStreamDestroy_v2(CUstream stream)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!stream)
        return CUDA_ERROR_INVALID_HANDLE;
    free(stream);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuStreamSynchronize(CUstream stream)
{
    CUresult rc = need_context();
    if (!rc)
        fg_pools_sync();
    return rc;
}

FG_EXPORT CUresult cuStreamQuery(CUstream stream) { return need_context(); }

FG_EXPORT CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags)
{
    CUresult rc = need_context();
    return rc ? rc : event ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

FG_EXPORT CUresult cuStreamGetPriority(CUstream stream, int *priority)
{
    if (!priority)
        return CUDA_ERROR_INVALID_VALUE;
    *priority = stream && (uintptr_t)stream > 2 ? stream->priority : 0;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuStreamGetFlags(CUstream stream, unsigned int *flags)
{
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = stream && (uintptr_t)stream > 2 ? stream->flags : 0;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuStreamGetId(CUstream stream, unsigned long long *id)
{
    if (!id)
        return CUDA_ERROR_INVALID_VALUE;
    *id = stream && (uintptr_t)stream > 2 ? stream->id : (uintptr_t)stream;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuStreamGetCtx(CUstream stream, CUcontext *ctx)
{
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (stream && (uintptr_t)stream > 2) {
        *ctx = &fg_devices[stream->device].primary;
        return CUDA_SUCCESS;
    }
    return cuCtxGetCurrent(ctx);
}

FG_EXPORT CUresult cuStreamGetDevice(CUstream stream, CUdevice *device)
{
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (stream && (uintptr_t)stream > 2) {
        *device = stream->device;
        return CUDA_SUCCESS;
    }
    return cuCtxGetDevice(device);
}

FG_EXPORT CUresult cuStreamIsCapturing(CUstream stream, int *status)
{
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream stream, int *status, unsigned long long *id,
                                             CUgraph *graph, const CUgraphNode **deps,
                                             const void **edges, size_t *count)
{
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream stream, int *status, unsigned long long *id,
                                             CUgraph *graph, const CUgraphNode **deps,
                                             size_t *count)
{
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuThreadExchangeStreamCaptureMode(int *mode)
{
    if (!mode)
        return CUDA_ERROR_INVALID_VALUE;
    static __thread int thread_mode;
    int old = thread_mode;
    thread_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- events */
static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

FG_EXPORT CUresult cuEventCreate(CUevent *event, unsigned int flags)
{
    CUresult rc = need_context();
    if (rc)
        return rc;
    if (!event)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->flags = flags;
    *event = e;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuEventDestroy_v2(CUevent event)
{
    if (!event)
        return CUDA_ERROR_INVALID_HANDLE;
    free(event);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuEventRecord(CUevent event, CUstream stream)
{
    if (!event)
        return CUDA_ERROR_INVALID_HANDLE;
    event->recorded_ms = now_ms();
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuEventRecordWithFlags(CUevent event, CUstream stream, unsigned int flags)
{
    return cuEventRecord(event, stream);
}

FG_EXPORT CUresult cuEventQuery(CUevent event) { return event ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }

FG_EXPORT CUresult cuEventSynchronize(CUevent event)
{
    if (!event)
        return CUDA_ERROR_INVALID_HANDLE;
    fg_pools_sync();
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end)
{
    if (!ms || !start || !end)
        return CUDA_ERROR_INVALID_HANDLE;
    if ((start->flags | end->flags) & 2) /* CU_EVENT_DISABLE_TIMING */
        return CUDA_ERROR_INVALID_HANDLE;
    *ms = (float)(end->recorded_ms - start->recorded_ms);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
    return cuEventElapsedTime_v2(ms, start, end);
}

FG_EXPORT CUresult cuIpcGetEventHandle(CUipcEventHandle *handle, CUevent event)
{
    if (!handle || !event)
        return CUDA_ERROR_INVALID_VALUE;
    memset(handle, 0, sizeof *handle);
    memcpy(handle, &event, sizeof event);
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- modules and functions */
static CUresult module_new(CUmodule *module, const void *image)
{
    int dev;
    CUresult rc = fg_current_device(&dev);
    if (rc)
        return rc;
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUmod_st *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->device = dev;
    *module = m;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    return module_new(module, image);
}

FG_EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int n,
                                      void *options, void **values)
{
    return module_new(module, image);
}

FG_EXPORT CUresult cuModuleLoadFatBinary(CUmodule *module, const void *image)
{
    return module_new(module, image);
}

FG_EXPORT CUresult cuModuleLoad(CUmodule *module, const char *path)
{
    return module_new(module, path);
}

FG_EXPORT CUresult cuModuleUnload(CUmodule module)
{
    if (!module)
        return CUDA_ERROR_INVALID_HANDLE;
    free(module);
    return CUDA_SUCCESS;
}

static CUresult function_new(CUfunction *function, CUmodule module, const char *name)
{
    if (!function || !name)
        return CUDA_ERROR_INVALID_VALUE;
    size_t n = strlen(name);
    struct CUfunc_st *f = malloc(sizeof *f + n + 1);
    if (!f)
        return CUDA_ERROR_OUT_OF_MEMORY;
    f->module = module;
    memcpy(f->name, name, n + 1);
    *function = f;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name)
{
    if (!module)
        return CUDA_ERROR_INVALID_HANDLE;
    return function_new(function, module, name);
}

/* A module's global variable: 256 zeroed bytes of host memory per look-up. */
FG_EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule module,
                                        const char *name)
{
    if (!module || !name)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = calloc(1, 256);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (dptr)
        *dptr = (CUdeviceptr)p;
    if (bytes)
        *bytes = 256;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, void *jit_options,
                                     void **jit_values, unsigned int jit_count,
                                     void *library_options, void **library_values,
                                     unsigned int library_count)
{
    return module_new((CUmodule *)library, code);
}

FG_EXPORT CUresult cuLibraryUnload(CUlibrary library) { return cuModuleUnload((CUmodule)library); }

FG_EXPORT CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary library, const char *name)
{
    if (!library)
        return CUDA_ERROR_INVALID_HANDLE;
    return function_new((CUfunction *)kernel, (CUmodule)library, name);
}

FG_EXPORT CUresult cuLibraryGetModule(CUmodule *module, CUlibrary library)
{
    if (!module || !library)
        return CUDA_ERROR_INVALID_VALUE;
    *module = (CUmodule)library;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuKernelGetFunction(CUfunction *function, CUkernel kernel)
{
    if (!function || !kernel)
        return CUDA_ERROR_INVALID_VALUE;
    *function = (CUfunction)kernel;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuKernelGetName(const char **name, CUkernel kernel)
{
    if (!name || !kernel)
        return CUDA_ERROR_INVALID_VALUE;
    *name = ((CUfunction)kernel)->name;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuFuncGetName(const char **name, CUfunction function)
{
    return cuKernelGetName(name, (CUkernel)function);
}

/* Attributes of a kernel that uses little: 1024 threads, 32 registers, no shared memory. */
FG_EXPORT CUresult cuFuncGetAttribute(int *value, int attribute, CUfunction function)
{
    if (!value || !function)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
    case 0: *value = 1024; break;                              /* max threads per block */
    case 4: *value = 32; break;                                /* registers */
    case 5: *value = fg_config()->cc_major * 10 + fg_config()->cc_minor; break; /* PTX */
    case 6: *value = fg_config()->cc_major * 10 + fg_config()->cc_minor; break; /* binary */
    case 8: *value = 232448; break;                            /* max dynamic shared */
    default: *value = 0;
    }
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuFuncSetAttribute(CUfunction function, int attribute, int value)
{
    return function ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

FG_EXPORT CUresult cuFuncSetCacheConfig(CUfunction function, int config)
{
    return function ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

FG_EXPORT CUresult cuKernelSetAttribute(int attribute, int value, CUkernel kernel, CUdevice dev)
{
    return kernel ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

FG_EXPORT CUresult cuKernelGetAttribute(int *value, int attribute, CUkernel kernel, CUdevice dev)
{
    return cuFuncGetAttribute(value, attribute, (CUfunction)kernel);
}

/* ---------------------------------------------------------------- launches */
FG_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                  unsigned int bx, unsigned int by, unsigned int bz,
                                  unsigned int shared, CUstream stream, void **params,
                                  void **extra)
{
    CUresult rc = need_context();
    if (rc)
        return rc;
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    return fg_kernel_launch();
}

typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

FG_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
                                    void **extra)
{
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    return cuLaunchKernel(f, config->gridDimX, config->gridDimY, config->gridDimZ,
                          config->blockDimX, config->blockDimY, config->blockDimZ,
                          config->sharedMemBytes, config->hStream, params, extra);
}

FG_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                             unsigned int gz, unsigned int bx, unsigned int by,
                                             unsigned int bz, unsigned int shared,
                                             CUstream stream, void **params)
{
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, NULL);
}

FG_EXPORT CUresult cuLaunchHostFunc(CUstream stream, void (*fn)(void *), void *data)
{
    CUresult rc = need_context();
    if (rc)
        return rc;
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    fn(data);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *blocks, CUfunction f,
                                                                       int block_size,
                                                                       size_t shared,
                                                                       unsigned int flags)
{
    if (!blocks || !f || block_size <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    int by_threads = 2048 / block_size;
    *blocks = by_threads > 32 ? 32 : by_threads;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, CUfunction f,
                                                              int block_size, size_t shared)
{
    return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, f, block_size, shared, 0);
}

FG_EXPORT CUresult cuOccupancyMaxPotentialBlockSize(int *min_grid, int *block_size, CUfunction f,
                                                   void *shared_fn, size_t shared, int limit)
{
    if (!min_grid || !block_size || !f)
        return CUDA_ERROR_INVALID_VALUE;
    *block_size = limit > 0 && limit < 1024 ? limit : 1024;
    *min_grid = fg_config()->sms * (2048 / *block_size);
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- graphs (complete at once) */
FG_EXPORT CUresult cuGraphCreate(CUgraph *graph, unsigned int flags)
{
    if (!graph)
        return CUDA_ERROR_INVALID_VALUE;
    *graph = calloc(1, sizeof **graph);
    return *graph ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

FG_EXPORT CUresult cuGraphDestroy(CUgraph graph)
{
    if (!graph)
        return CUDA_ERROR_INVALID_VALUE;
    free(graph);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph,
                                               unsigned long long flags)
{
    if (!exec || !graph)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphExec_st *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->graph = graph;
    *exec = e;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream)
{
    return exec ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FG_EXPORT CUresult cuGraphUpload(CUgraphExec exec, CUstream stream)
{
    return exec ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FG_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    if (!exec)
        return CUDA_ERROR_INVALID_VALUE;
    free(exec);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuGraphGetNodes(CUgraph graph, CUgraphNode *nodes, size_t *count)
{
    if (!graph || !count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = 0;
    return CUDA_SUCCESS;
}

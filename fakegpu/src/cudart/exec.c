/* The runtime's streams, events, kernel registration and launches, graphs, libraries and
 * user objects. Kernels do nothing; work completes at once, or on a capturing stream becomes a
 * graph node (the driver's capture, exec.c of libcuda). */
#include "runtime.h"

#include <stdlib.h>
#include <string.h>

#define READY()                                                                           \
    do {                                                                                  \
        cudaError_t ready_ = fg_rt_ready();                                               \
        if (ready_)                                                                       \
            return ready_;                                                                \
    } while (0)

/* ---------------------------------------------------------------- streams */
FG_EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags,
                                                   int priority)
{
    READY();
    return fg_rt_status(cuStreamCreateWithPriority(s, flags, priority));
}

FG_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    return cudaStreamCreateWithPriority(s, flags, 0);
}

FG_EXPORT cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithPriority(s, 0, 0); }

FG_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    READY();
    return fg_rt_status(cuStreamDestroy_v2(s));
}

FG_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    READY();
    return fg_rt_status(cuStreamSynchronize(s));
}

FG_EXPORT cudaError_t cudaStreamQuery(cudaStream_t s)
{
    READY();
    return fg_rt_status(cuStreamQuery(s));
}

FG_EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    READY();
    return fg_rt_status(cuStreamWaitEvent(s, e, flags));
}

FG_EXPORT cudaError_t cudaStreamGetPriority(cudaStream_t s, int *priority)
{
    READY();
    return fg_rt_status(cuStreamGetPriority(s, priority));
}

FG_EXPORT cudaError_t cudaStreamGetId(cudaStream_t s, unsigned long long *id)
{
    READY();
    return fg_rt_status(cuStreamGetId(s, id));
}

FG_EXPORT cudaError_t cudaStreamAddCallback(cudaStream_t s,
                                            void (*callback)(cudaStream_t, cudaError_t, void *),
                                            void *data, unsigned int flags)
{
    READY();
    if (!callback)
        return fg_rt_status(cudaErrorInvalidValue);
    callback(s, cudaSuccess, data);
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t s, void (*fn)(void *), void *data)
{
    READY();
    return fg_rt_status(cuLaunchHostFunc(s, fn, data));
}

/* Stream capture: the driver's (work on a capturing stream becomes graph nodes). */
FG_EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t s, int *status)
{
    READY();
    return fg_rt_status(cuStreamIsCapturing(s, status));
}

/* CUDA 13's cudaStreamGetCaptureInfo, CUDA 12's cudaStreamGetCaptureInfo_v3 (edge data). */
static cudaError_t capture_info(cudaStream_t s, int *status, unsigned long long *id,
                                cudaGraph_t *graph, const CUgraphNode **deps, const void **edges,
                                size_t *count)
{
    READY();
    return fg_rt_status(cuStreamGetCaptureInfo_v3(s, status, id, graph, deps, edges, count));
}

#if FG_SONAME_MAJOR == 12
/* CUDA 12 keeps three generations under three names: the unsuffixed one has no graph outputs,
 * _v2 (what cuda_runtime_api.h maps the plain name to) no edge data. */
FG_EXPORT cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, int *status,
                                               unsigned long long *id)
{
    return capture_info(s, status, id, NULL, NULL, NULL, NULL);
}

FG_EXPORT cudaError_t cudaStreamGetCaptureInfo_v2(cudaStream_t s, int *status,
                                                  unsigned long long *id, cudaGraph_t *graph,
                                                  const CUgraphNode **deps, size_t *count)
{
    return capture_info(s, status, id, graph, deps, NULL, count);
}

FG_EXPORT cudaError_t cudaStreamGetCaptureInfo_v3(cudaStream_t s, int *status,
                                                  unsigned long long *id, cudaGraph_t *graph,
                                                  const CUgraphNode **deps, const void **edges,
                                                  size_t *count)
{
    return capture_info(s, status, id, graph, deps, edges, count);
}
#else
FG_EXPORT cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, int *status,
                                               unsigned long long *id, cudaGraph_t *graph,
                                               const CUgraphNode **deps, const void **edges,
                                               size_t *count)
{
    return capture_info(s, status, id, graph, deps, edges, count);
}
#endif

FG_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode)
{
    READY();
    return fg_rt_status(cuStreamBeginCapture_v2(s, mode));
}

FG_EXPORT cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t s, cudaGraph_t graph,
                                                    const CUgraphNode *deps, const void *edges,
                                                    size_t count, int mode)
{
    READY();
    return fg_rt_status(cuStreamBeginCaptureToGraph(s, graph, deps, edges, count, mode));
}

FG_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    READY();
    return fg_rt_status(cuStreamEndCapture(s, graph));
}

/* The `_ptsz` variants: stream 0 is the calling thread's default stream. */
FG_EXPORT cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s, int mode)
{
    READY();
    return fg_rt_status(cuStreamBeginCapture_v2_ptsz(s, mode));
}

FG_EXPORT cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t s, cudaGraph_t graph,
                                                         const CUgraphNode *deps,
                                                         const void *edges, size_t count,
                                                         int mode)
{
    READY();
    return fg_rt_status(cuStreamBeginCaptureToGraph_ptsz(s, graph, deps, edges, count, mode));
}

FG_EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, cudaGraph_t *graph)
{
    READY();
    return fg_rt_status(cuStreamEndCapture_ptsz(s, graph));
}

/* The capturing stream's dependency set replaced or added to (the driver's). CUDA 12: no edge
 * data in the plain name; _v2 has it; CUDA 13's plain name has it. */
#if FG_SONAME_MAJOR == 12
FG_EXPORT cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t s, CUgraphNode *deps,
                                                          size_t count, unsigned int flags)
{
    READY();
    return fg_rt_status(cuStreamUpdateCaptureDependencies_v2(s, deps, NULL, count, flags));
}

FG_EXPORT cudaError_t cudaStreamUpdateCaptureDependencies_ptsz(cudaStream_t s, CUgraphNode *deps,
                                                               size_t count, unsigned int flags)
{
    READY();
    return fg_rt_status(
        cuStreamUpdateCaptureDependencies_v2_ptsz(s, deps, NULL, count, flags));
}

FG_EXPORT cudaError_t cudaStreamUpdateCaptureDependencies_v2(cudaStream_t s, CUgraphNode *deps,
                                                             const void *edges, size_t count,
                                                             unsigned int flags)
{
    READY();
    return fg_rt_status(cuStreamUpdateCaptureDependencies_v2(s, deps, edges, count, flags));
}

FG_EXPORT cudaError_t cudaStreamUpdateCaptureDependencies_v2_ptsz(cudaStream_t s,
                                                                  CUgraphNode *deps,
                                                                  const void *edges, size_t count,
                                                                  unsigned int flags)
{
    READY();
    return fg_rt_status(
        cuStreamUpdateCaptureDependencies_v2_ptsz(s, deps, edges, count, flags));
}
#else
FG_EXPORT cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t s, CUgraphNode *deps,
                                                          const void *edges, size_t count,
                                                          unsigned int flags)
{
    READY();
    return fg_rt_status(cuStreamUpdateCaptureDependencies_v2(s, deps, edges, count, flags));
}

FG_EXPORT cudaError_t cudaStreamUpdateCaptureDependencies_ptsz(cudaStream_t s, CUgraphNode *deps,
                                                               const void *edges, size_t count,
                                                               unsigned int flags)
{
    READY();
    return fg_rt_status(
        cuStreamUpdateCaptureDependencies_v2_ptsz(s, deps, edges, count, flags));
}
#endif

FG_EXPORT cudaError_t cudaThreadExchangeStreamCaptureMode(int *mode)
{
    return fg_rt_status(cuThreadExchangeStreamCaptureMode(mode));
}

/* ---------------------------------------------------------------- events */
FG_EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    READY();
    return fg_rt_status(cuEventCreate(e, flags));
}

FG_EXPORT cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

FG_EXPORT cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    READY();
    return fg_rt_status(cuEventDestroy_v2(e));
}

FG_EXPORT cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    READY();
    return fg_rt_status(cuEventRecord(e, s));
}

FG_EXPORT cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int flags)
{
    return cudaEventRecord(e, s);
}

FG_EXPORT cudaError_t cudaEventQuery(cudaEvent_t e)
{
    READY();
    return fg_rt_status(cuEventQuery(e));
}

FG_EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    READY();
    return fg_rt_status(cuEventSynchronize(e));
}

FG_EXPORT cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    READY();
    return fg_rt_status(cuEventElapsedTime_v2(ms, start, end));
}

#if FG_SONAME_MAJOR == 12
/* CUDA 12.8 added this name, with the same arguments. */
FG_EXPORT cudaError_t cudaEventElapsedTime_v2(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    return cudaEventElapsedTime(ms, start, end);
}
#endif

FG_EXPORT cudaError_t cudaIpcGetEventHandle(CUipcEventHandle *handle, cudaEvent_t e)
{
    READY();
    return fg_rt_status(cuIpcGetEventHandle(handle, e));
}

FG_EXPORT cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *e, CUipcEventHandle handle)
{
    READY();
    return fg_rt_status(cuIpcOpenEventHandle(e, handle));
}

/* ---------------------------------------------------------------- kernels */
/* What nvcc-generated code registers: kept only as handles. */
FG_EXPORT void **__cudaRegisterFatBinary(void *fatbin)
{
    void **handle = calloc(1, sizeof *handle);
    if (handle)
        *handle = fatbin;
    return handle;
}

FG_EXPORT void __cudaRegisterFatBinaryEnd(void **handle) {}

FG_EXPORT void __cudaUnregisterFatBinary(void **handle) { free(handle); }

FG_EXPORT void __cudaRegisterFunction(void **handle, const char *host_function, char *device_function,
                                      const char *device_name, int thread_limit, void *tid,
                                      void *bid, dim3 *block, dim3 *grid, int *warp_size)
{
}

FG_EXPORT void __cudaRegisterVar(void **handle, char *host_var, char *device_address,
                                 const char *device_name, int ext, size_t size, int constant,
                                 int global)
{
}

FG_EXPORT void __cudaRegisterManagedVar(void **handle, void **host_var_ptr, char *device_address,
                                        const char *device_name, int ext, size_t size,
                                        int constant, int global)
{
}

FG_EXPORT char __cudaInitModule(void **handle) { return 1; }

static __thread struct {
    dim3 grid, block;
    size_t shared;
    void *stream;
} call_configuration;

FG_EXPORT unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared, void *stream)
{
    call_configuration.grid = grid;
    call_configuration.block = block;
    call_configuration.shared = shared;
    call_configuration.stream = stream;
    return 0;
}

FG_EXPORT cudaError_t __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shared,
                                                 void *stream)
{
    if (grid)
        *grid = call_configuration.grid;
    if (block)
        *block = call_configuration.block;
    if (shared)
        *shared = call_configuration.shared;
    if (stream)
        *(void **)stream = call_configuration.stream;
    return cudaSuccess;
}

static cudaError_t launch(const void *function, dim3 grid, dim3 block, cudaStream_t s)
{
    READY();
    if (!function)
        return fg_rt_status(cudaErrorInvalidValue);
    if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z ||
        (unsigned long long)block.x * block.y * block.z > 1024)
        return fg_rt_status(9); /* cudaErrorInvalidConfiguration */
    /* The first launch loads the module (lazily, as CUDA does): it may not fit. */
    CUresult rc = vramshim_fakegpu_kernel_launch_on(s);
    return fg_rt_status(rc == CUDA_ERROR_OUT_OF_MEMORY ? cudaErrorMemoryAllocation : rc);
}

FG_EXPORT cudaError_t cudaLaunchKernel(const void *function, dim3 grid, dim3 block, void **args,
                                       size_t shared, cudaStream_t s)
{
    return launch(function, grid, block, s);
}

FG_EXPORT cudaError_t cudaLaunchCooperativeKernel(const void *function, dim3 grid, dim3 block,
                                                  void **args, size_t shared, cudaStream_t s)
{
    return launch(function, grid, block, s);
}

FG_EXPORT cudaError_t __cudaGetKernel(void **kernel, const void *function)
{
    if (!kernel || !function)
        return fg_rt_status(cudaErrorInvalidValue);
    *kernel = (void *)function;
    return cudaSuccess;
}

FG_EXPORT cudaError_t __cudaLaunchKernel(void *kernel, dim3 grid, dim3 block, void **args,
                                         size_t shared, cudaStream_t s)
{
    return launch(kernel, grid, block, s);
}

struct launch_config {
    dim3 grid, block;
    size_t shared;
    cudaStream_t stream;
    void *attrs;
    unsigned int count;
};

FG_EXPORT cudaError_t cudaLaunchKernelExC(const struct launch_config *config, const void *function,
                                          void **args)
{
    if (!config)
        return fg_rt_status(cudaErrorInvalidValue);
    return launch(function, config->grid, config->block, config->stream);
}

FG_EXPORT cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *a, const void *function)
{
    READY();
    if (!a || !function)
        return fg_rt_status(cudaErrorInvalidValue);
    int major = 0, minor = 0, device = fg_rt_device();
    cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
    cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
    memset(a, 0, sizeof *a);
    a->maxThreadsPerBlock = 1024;
    a->numRegs = 32;
    a->ptxVersion = a->binaryVersion = major * 10 + minor;
    a->maxDynamicSharedSizeBytes = 48 * 1024;
    a->preferredShmemCarveout = -1;
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaFuncSetAttribute(const void *function, int attribute, int value)
{
    READY();
    return function ? cudaSuccess : fg_rt_status(cudaErrorInvalidValue);
}

FG_EXPORT cudaError_t cudaKernelSetAttributeForDevice(void *kernel, int attribute, int value,
                                                      int device)
{
    READY();
    return kernel ? cudaSuccess : fg_rt_status(cudaErrorInvalidValue);
}

FG_EXPORT cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int *blocks, const void *function, int block_size, size_t shared, unsigned int flags)
{
    READY();
    if (!blocks || !function || block_size <= 0)
        return fg_rt_status(cudaErrorInvalidValue);
    int by_threads = 2048 / block_size;
    *blocks = by_threads > 32 ? 32 : by_threads;
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks,
                                                                   const void *function,
                                                                   int block_size, size_t shared)
{
    return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, function, block_size,
                                                                 shared, 0);
}

/* ---------------------------------------------------------------- libraries */
FG_EXPORT cudaError_t cudaLibraryLoadData(CUlibrary *library, const void *code, void *jit_options,
                                          void **jit_values, unsigned int jit_count,
                                          void *library_options, void **library_values,
                                          unsigned int library_count)
{
    READY();
    return fg_rt_status(cuLibraryLoadData(library, code, jit_options, jit_values, jit_count,
                                          library_options, library_values, library_count));
}

FG_EXPORT cudaError_t cudaLibraryUnload(CUlibrary library)
{
    READY();
    return fg_rt_status(cuLibraryUnload(library));
}

FG_EXPORT cudaError_t cudaLibraryGetKernel(CUkernel *kernel, CUlibrary library, const char *name)
{
    READY();
    return fg_rt_status(cuLibraryGetKernel(kernel, library, name));
}

/* ---------------------------------------------------------------- graphs */
FG_EXPORT cudaError_t cudaGraphCreate(cudaGraph_t *graph, unsigned int flags)
{
    READY();
    return fg_rt_status(cuGraphCreate(graph, flags));
}

FG_EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    READY();
    return fg_rt_status(cuGraphDestroy(graph));
}

FG_EXPORT cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *exec, cudaGraph_t graph,
                                                    unsigned long long flags)
{
    READY();
    return fg_rt_status(cuGraphInstantiateWithFlags(exec, graph, flags));
}

FG_EXPORT cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                           unsigned long long flags)
{
    return cudaGraphInstantiateWithFlags(exec, graph, flags);
}

FG_EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
    READY();
    return fg_rt_status(cuGraphLaunch(exec, s));
}

FG_EXPORT cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    READY();
    return fg_rt_status(cuGraphExecDestroy(exec));
}

FG_EXPORT cudaError_t cudaGraphGetNodes(cudaGraph_t graph, CUgraphNode *nodes, size_t *count)
{
    READY();
    return fg_rt_status(cuGraphGetNodes(graph, nodes, count));
}

FG_EXPORT cudaError_t cudaGraphNodeGetType(CUgraphNode node, int *type)
{
    READY();
    return fg_rt_status(cuGraphNodeGetType(node, type));
}

FG_EXPORT cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t s)
{
    READY();
    return fg_rt_status(cuGraphUpload(exec, s));
}

FG_EXPORT cudaError_t cudaGraphAddEmptyNode(CUgraphNode *node, cudaGraph_t graph,
                                            const CUgraphNode *deps, size_t count)
{
    READY();
    return fg_rt_status(cuGraphAddEmptyNode(node, graph, deps, count));
}

FG_EXPORT cudaError_t cudaGraphAddChildGraphNode(CUgraphNode *node, cudaGraph_t graph,
                                                 const CUgraphNode *deps, size_t count,
                                                 cudaGraph_t child)
{
    READY();
    return fg_rt_status(cuGraphAddChildGraphNode(node, graph, deps, count, child));
}

FG_EXPORT cudaError_t cudaGraphChildGraphNodeGetGraph(CUgraphNode node, cudaGraph_t *graph)
{
    READY();
    return fg_rt_status(cuGraphChildGraphNodeGetGraph(node, graph));
}

/* The generic node adder (cudaGraphNodeParams has the driver's layout): memory nodes only,
 * as the driver's. CUDA 13's takes edge data; CUDA 12's has it in _v2. */
#if FG_SONAME_MAJOR == 12
FG_EXPORT cudaError_t cudaGraphAddNode(CUgraphNode *node, cudaGraph_t graph,
                                       const CUgraphNode *deps, size_t count, void *params)
{
    READY();
    return fg_rt_status(cuGraphAddNode_v2(node, graph, deps, NULL, count, params));
}

FG_EXPORT cudaError_t cudaGraphAddNode_v2(CUgraphNode *node, cudaGraph_t graph,
                                          const CUgraphNode *deps, const void *edges,
                                          size_t count, void *params)
{
    READY();
    return fg_rt_status(cuGraphAddNode_v2(node, graph, deps, edges, count, params));
}
#else
FG_EXPORT cudaError_t cudaGraphAddNode(CUgraphNode *node, cudaGraph_t graph,
                                       const CUgraphNode *deps, const void *edges, size_t count,
                                       void *params)
{
    READY();
    return fg_rt_status(cuGraphAddNode_v2(node, graph, deps, edges, count, params));
}
#endif

/* Graph memory nodes: cudaMemAllocNodeParams has the driver's layout. */
FG_EXPORT cudaError_t cudaGraphAddMemAllocNode(CUgraphNode *node, cudaGraph_t graph,
                                               const CUgraphNode *deps, size_t count,
                                               void *params)
{
    READY();
    return fg_rt_status(cuGraphAddMemAllocNode(node, graph, deps, count, params));
}

FG_EXPORT cudaError_t cudaGraphAddMemFreeNode(CUgraphNode *node, cudaGraph_t graph,
                                              const CUgraphNode *deps, size_t count, void *dptr)
{
    READY();
    return fg_rt_status(cuGraphAddMemFreeNode(node, graph, deps, count, (CUdeviceptr)dptr));
}

FG_EXPORT cudaError_t cudaGraphMemAllocNodeGetParams(CUgraphNode node, void *params)
{
    READY();
    return fg_rt_status(cuGraphMemAllocNodeGetParams(node, params));
}

FG_EXPORT cudaError_t cudaGraphMemFreeNodeGetParams(CUgraphNode node, void *dptr)
{
    READY();
    return fg_rt_status(cuGraphMemFreeNodeGetParams(node, (CUdeviceptr *)dptr));
}

/* Graph structure. CUDA 13's calls take edge data; CUDA 12's plain names do not (their _v2
 * do). */
FG_EXPORT cudaError_t cudaGraphAddDependencies_v2(cudaGraph_t graph, const CUgraphNode *from,
                                                  const CUgraphNode *to, const void *edges,
                                                  size_t count)
{
    READY();
    return fg_rt_status(cuGraphAddDependencies_v2(graph, from, to, edges, count));
}

FG_EXPORT cudaError_t cudaGraphRemoveDependencies_v2(cudaGraph_t graph, const CUgraphNode *from,
                                                     const CUgraphNode *to, const void *edges,
                                                     size_t count)
{
    READY();
    return fg_rt_status(cuGraphRemoveDependencies_v2(graph, from, to, edges, count));
}

FG_EXPORT cudaError_t cudaGraphGetEdges_v2(cudaGraph_t graph, CUgraphNode *from, CUgraphNode *to,
                                           void *edges, size_t *count)
{
    READY();
    return fg_rt_status(cuGraphGetEdges_v2(graph, from, to, edges, count));
}

FG_EXPORT cudaError_t cudaGraphNodeGetDependencies_v2(CUgraphNode node, CUgraphNode *deps,
                                                      void *edges, size_t *count)
{
    READY();
    return fg_rt_status(cuGraphNodeGetDependencies_v2(node, deps, edges, count));
}

FG_EXPORT cudaError_t cudaGraphNodeGetDependentNodes_v2(CUgraphNode node, CUgraphNode *dependents,
                                                       void *edges, size_t *count)
{
    READY();
    return fg_rt_status(cuGraphNodeGetDependentNodes_v2(node, dependents, edges, count));
}

#if FG_SONAME_MAJOR >= 13
FG_EXPORT cudaError_t cudaGraphAddDependencies(cudaGraph_t graph, const CUgraphNode *from,
                                               const CUgraphNode *to, const void *edges,
                                               size_t count)
{
    return cudaGraphAddDependencies_v2(graph, from, to, edges, count);
}

FG_EXPORT cudaError_t cudaGraphRemoveDependencies(cudaGraph_t graph, const CUgraphNode *from,
                                                  const CUgraphNode *to, const void *edges,
                                                  size_t count)
{
    return cudaGraphRemoveDependencies_v2(graph, from, to, edges, count);
}

FG_EXPORT cudaError_t cudaGraphGetEdges(cudaGraph_t graph, CUgraphNode *from, CUgraphNode *to,
                                        void *edges, size_t *count)
{
    return cudaGraphGetEdges_v2(graph, from, to, edges, count);
}

FG_EXPORT cudaError_t cudaGraphNodeGetDependencies(CUgraphNode node, CUgraphNode *deps,
                                                   void *edges, size_t *count)
{
    return cudaGraphNodeGetDependencies_v2(node, deps, edges, count);
}

FG_EXPORT cudaError_t cudaGraphNodeGetDependentNodes(CUgraphNode node, CUgraphNode *dependents,
                                                     void *edges, size_t *count)
{
    return cudaGraphNodeGetDependentNodes_v2(node, dependents, edges, count);
}
#else
FG_EXPORT cudaError_t cudaGraphAddDependencies(cudaGraph_t graph, const CUgraphNode *from,
                                               const CUgraphNode *to, size_t count)
{
    return cudaGraphAddDependencies_v2(graph, from, to, NULL, count);
}

FG_EXPORT cudaError_t cudaGraphRemoveDependencies(cudaGraph_t graph, const CUgraphNode *from,
                                                  const CUgraphNode *to, size_t count)
{
    return cudaGraphRemoveDependencies_v2(graph, from, to, NULL, count);
}

FG_EXPORT cudaError_t cudaGraphGetEdges(cudaGraph_t graph, CUgraphNode *from, CUgraphNode *to,
                                        size_t *count)
{
    return cudaGraphGetEdges_v2(graph, from, to, NULL, count);
}

FG_EXPORT cudaError_t cudaGraphNodeGetDependencies(CUgraphNode node, CUgraphNode *deps,
                                                   size_t *count)
{
    return cudaGraphNodeGetDependencies_v2(node, deps, NULL, count);
}

FG_EXPORT cudaError_t cudaGraphNodeGetDependentNodes(CUgraphNode node, CUgraphNode *dependents,
                                                     size_t *count)
{
    return cudaGraphNodeGetDependentNodes_v2(node, dependents, NULL, count);
}
#endif

FG_EXPORT cudaError_t cudaGraphGetRootNodes(cudaGraph_t graph, CUgraphNode *nodes, size_t *count)
{
    READY();
    return fg_rt_status(cuGraphGetRootNodes(graph, nodes, count));
}

FG_EXPORT cudaError_t cudaGraphClone(cudaGraph_t *clone, cudaGraph_t original)
{
    READY();
    return fg_rt_status(cuGraphClone(clone, original));
}

/* cudaGraphExecUpdateResultInfo has the driver's layout. */
FG_EXPORT cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph, void *info)
{
    READY();
    return fg_rt_status(cuGraphExecUpdate_v2(exec, graph, info));
}

/* User objects: a reference count and a destructor, run when the count reaches zero. */
struct user_object {
    void *data;
    void (*destroy)(void *);
    int refs;
};

FG_EXPORT cudaError_t cudaUserObjectCreate(struct user_object **object, void *data,
                                           void (*destroy)(void *), unsigned int refs,
                                           unsigned int flags)
{
    if (!object || !destroy || refs == 0)
        return fg_rt_status(cudaErrorInvalidValue);
    struct user_object *o = malloc(sizeof *o);
    if (!o)
        return fg_rt_status(cudaErrorMemoryAllocation);
    o->data = data;
    o->destroy = destroy;
    o->refs = (int)refs;
    *object = o;
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaUserObjectRelease(struct user_object *object, unsigned int count)
{
    if (!object || count == 0)
        return fg_rt_status(cudaErrorInvalidValue);
    if (__atomic_sub_fetch(&object->refs, (int)count, __ATOMIC_ACQ_REL) <= 0) {
        object->destroy(object->data);
        free(object);
    }
    return cudaSuccess;
}

/* Graphs keep no user objects: the references a graph would take are released at once (its
 * nodes hold nothing a destructor could free). */
FG_EXPORT cudaError_t cudaGraphRetainUserObject(cudaGraph_t graph, struct user_object *object,
                                                unsigned int count, unsigned int flags)
{
    if (!graph || !object)
        return fg_rt_status(cudaErrorInvalidValue);
    if (flags & 1) /* cudaGraphUserObjectMove: the caller's references pass to the graph */
        return cudaUserObjectRelease(object, count);
    return cudaSuccess;
}

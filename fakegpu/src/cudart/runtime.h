/* The CUDA runtime ABI the fake libcudart.so.13 and libcudart.so.12 implement (from NVIDIA's
 * public documentation of cuda_runtime_api.h / driver_types.h), and its internal helpers. The
 * build compiles these sources once per SONAME with FG_SONAME_MAJOR set to 13 or 12; where the
 * two ABIs differ (cudaDeviceProp, cudaPointerAttributes, the unsuffixed stream-capture calls)
 * the code says so. */
#pragma once
#define _GNU_SOURCE
#include <stddef.h>

#include "fakegpu_cuda.h"
#include "fakegpu_runtime_thread.h"

#define FG_EXPORT __attribute__((visibility("default")))
#if FG_SONAME_MAJOR == 12
/* What cudaRuntimeGetVersion reports: CUDA 12.9, the release whose export table
 * symbols/cu12/libcudart.so.12.syms lists. */
#define FG_RUNTIME_VERSION 12090
#elif FG_SONAME_MAJOR == 13
/* What cudaRuntimeGetVersion reports: CUDA 13.2, the line PyTorch 2.15 is built with. */
#define FG_RUNTIME_VERSION 13020
#else
#error "the fake runtime is built as libcudart.so.12 or libcudart.so.13 only"
#endif

typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotSupported = 801,
};
typedef CUstream cudaStream_t;
typedef CUevent cudaEvent_t;
typedef CUgraph cudaGraph_t;
typedef CUgraphExec cudaGraphExec_t;
typedef CUmemoryPool cudaMemPool_t;
typedef struct { unsigned x, y, z; } dim3;


/* Checks the runtime's state: initialises the driver and makes the calling thread's device's
 * primary context current (as the runtime does at its first call that needs a device). */
cudaError_t fg_rt_ready(void);
/* Records a failure as the thread's last error, and returns it. */
cudaError_t fg_rt_status(CUresult rc);
/* The device the calling thread uses. */
int fg_rt_device(void);

#if FG_SONAME_MAJOR == 12
/* struct cudaDeviceProp of CUDA 12 (1032 bytes; the layout of driver_types.h in the PyPI package
 * nvidia-cuda-runtime-cu12 12.4.127, the same through 12.9 but for the reserved tail). The
 * runtime fills it through cudaGetDeviceProperties_v2, the name CUDA 12 headers map to. */
struct cudaDeviceProp {
    char name[256];
    CUuuid uuid;
    char luid[8];
    unsigned int luidDeviceNodeMask;
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int regsPerBlock;
    int warpSize;
    size_t memPitch;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int clockRate;
    size_t totalConstMem;
    int major;
    int minor;
    size_t textureAlignment;
    size_t texturePitchAlignment;
    int deviceOverlap;
    int multiProcessorCount;
    int kernelExecTimeoutEnabled;
    int integrated;
    int canMapHostMemory;
    int computeMode;
    int maxTexture1D;
    int maxTexture1DMipmap;
    int maxTexture1DLinear;
    int maxTexture2D[2];
    int maxTexture2DMipmap[2];
    int maxTexture2DLinear[3];
    int maxTexture2DGather[2];
    int maxTexture3D[3];
    int maxTexture3DAlt[3];
    int maxTextureCubemap;
    int maxTexture1DLayered[2];
    int maxTexture2DLayered[3];
    int maxTextureCubemapLayered[2];
    int maxSurface1D;
    int maxSurface2D[2];
    int maxSurface3D[3];
    int maxSurface1DLayered[2];
    int maxSurface2DLayered[3];
    int maxSurfaceCubemap;
    int maxSurfaceCubemapLayered[2];
    size_t surfaceAlignment;
    int concurrentKernels;
    int ECCEnabled;
    int pciBusID;
    int pciDeviceID;
    int pciDomainID;
    int tccDriver;
    int asyncEngineCount;
    int unifiedAddressing;
    int memoryClockRate;
    int memoryBusWidth;
    int l2CacheSize;
    int persistingL2CacheMaxSize;
    int maxThreadsPerMultiProcessor;
    int streamPrioritiesSupported;
    int globalL1CacheSupported;
    int localL1CacheSupported;
    size_t sharedMemPerMultiprocessor;
    int regsPerMultiprocessor;
    int managedMemory;
    int isMultiGpuBoard;
    int multiGpuBoardGroupID;
    int hostNativeAtomicSupported;
    int singleToDoublePrecisionPerfRatio;
    int pageableMemoryAccess;
    int concurrentManagedAccess;
    int computePreemptionSupported;
    int canUseHostPointerForRegisteredMem;
    int cooperativeLaunch;
    int cooperativeMultiDeviceLaunch;
    size_t sharedMemPerBlockOptin;
    int pageableMemoryAccessUsesHostPageTables;
    int directManagedMemAccessFromHost;
    int maxBlocksPerMultiProcessor;
    int accessPolicyMaxWindowSize;
    size_t reservedSharedMemPerBlock;
    int hostRegisterSupported;
    int sparseCudaArraySupported;
    int hostRegisterReadOnlySupported;
    int timelineSemaphoreInteropSupported;
    int memoryPoolsSupported;
    int gpuDirectRDMASupported;
    unsigned int gpuDirectRDMAFlushWritesOptions;
    int gpuDirectRDMAWritesOrdering;
    unsigned int memoryPoolSupportedHandleTypes;
    int deferredMappingCudaArraySupported;
    int ipcEventSupported;
    int clusterLaunch;
    int unifiedFunctionPointers;
    int reserved2[2];
    int reserved1[1];
    int reserved[60];
};
/* Offsets measured with gcc on the real 12.4.127 header. */
_Static_assert(sizeof(struct cudaDeviceProp) == 1032, "CUDA 12 cudaDeviceProp is 1032 bytes");
_Static_assert(offsetof(struct cudaDeviceProp, totalGlobalMem) == 288, "totalGlobalMem at 288");
_Static_assert(offsetof(struct cudaDeviceProp, clockRate) == 348, "clockRate at 348");
_Static_assert(offsetof(struct cudaDeviceProp, major) == 360, "major at 360");
_Static_assert(offsetof(struct cudaDeviceProp, multiProcessorCount) == 388, "SM count at 388");
_Static_assert(offsetof(struct cudaDeviceProp, memoryClockRate) == 608, "memoryClockRate at 608");
_Static_assert(offsetof(struct cudaDeviceProp, l2CacheSize) == 616, "l2CacheSize at 616");
_Static_assert(offsetof(struct cudaDeviceProp, reserved) == 792, "reserved at 792");
/* CUDA 12 headers map cudaGetDeviceProperties to this name. The unsuffixed one fills the pre-12
 * structure: CUDA 11.8's driver_types.h (PyPI nvidia-cuda-runtime-cu11 11.8.89) has the same
 * fields up to reservedSharedMemPerBlock and ends there, at 728 bytes. */
#define FG_GET_DEVICE_PROPERTIES cudaGetDeviceProperties_v2
#define FG_PRE12_DEVICE_PROP_BYTES 728
_Static_assert(offsetof(struct cudaDeviceProp, hostRegisterSupported) == FG_PRE12_DEVICE_PROP_BYTES,
               "the pre-12 structure ends where CUDA 12 added hostRegisterSupported");
#else
/* struct cudaDeviceProp of CUDA 13 (1008 bytes). */
struct cudaDeviceProp {
    char name[256];
    CUuuid uuid;
    char luid[8];
    unsigned int luidDeviceNodeMask;
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int regsPerBlock;
    int warpSize;
    size_t memPitch;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    size_t totalConstMem;
    int major;
    int minor;
    size_t textureAlignment;
    size_t texturePitchAlignment;
    int multiProcessorCount;
    int integrated;
    int canMapHostMemory;
    int maxTexture1D;
    int maxTexture1DMipmap;
    int maxTexture2D[2];
    int maxTexture2DMipmap[2];
    int maxTexture2DLinear[3];
    int maxTexture2DGather[2];
    int maxTexture3D[3];
    int maxTexture3DAlt[3];
    int maxTextureCubemap;
    int maxTexture1DLayered[2];
    int maxTexture2DLayered[3];
    int maxTextureCubemapLayered[2];
    int maxSurface1D;
    int maxSurface2D[2];
    int maxSurface3D[3];
    int maxSurface1DLayered[2];
    int maxSurface2DLayered[3];
    int maxSurfaceCubemap;
    int maxSurfaceCubemapLayered[2];
    size_t surfaceAlignment;
    int concurrentKernels;
    int ECCEnabled;
    int pciBusID;
    int pciDeviceID;
    int pciDomainID;
    int tccDriver;
    int asyncEngineCount;
    int unifiedAddressing;
    int memoryBusWidth;
    int l2CacheSize;
    int persistingL2CacheMaxSize;
    int maxThreadsPerMultiProcessor;
    int streamPrioritiesSupported;
    int globalL1CacheSupported;
    int localL1CacheSupported;
    size_t sharedMemPerMultiprocessor;
    int regsPerMultiprocessor;
    int managedMemory;
    int isMultiGpuBoard;
    int multiGpuBoardGroupID;
    int hostNativeAtomicSupported;
    int pageableMemoryAccess;
    int concurrentManagedAccess;
    int computePreemptionSupported;
    int canUseHostPointerForRegisteredMem;
    int cooperativeLaunch;
    size_t sharedMemPerBlockOptin;
    int pageableMemoryAccessUsesHostPageTables;
    int directManagedMemAccessFromHost;
    int maxBlocksPerMultiProcessor;
    int accessPolicyMaxWindowSize;
    size_t reservedSharedMemPerBlock;
    int hostRegisterSupported;
    int sparseCudaArraySupported;
    int hostRegisterReadOnlySupported;
    int timelineSemaphoreInteropSupported;
    int memoryPoolsSupported;
    int gpuDirectRDMASupported;
    unsigned int gpuDirectRDMAFlushWritesOptions;
    int gpuDirectRDMAWritesOrdering;
    unsigned int memoryPoolSupportedHandleTypes;
    int deferredMappingCudaArraySupported;
    int ipcEventSupported;
    int clusterLaunch;
    int unifiedFunctionPointers;
    int deviceNumaConfig;
    int deviceNumaId;
    int mpsEnabled;
    int hostNumaId;
    unsigned int gpuPciDeviceID;
    unsigned int gpuPciSubsystemID;
    int hostNumaMultinodeIpcSupported;
    int reserved[56];
};
_Static_assert(sizeof(struct cudaDeviceProp) == 1008, "CUDA 13 cudaDeviceProp is 1008 bytes");
_Static_assert(offsetof(struct cudaDeviceProp, totalGlobalMem) == 288, "totalGlobalMem at 288");
#define FG_GET_DEVICE_PROPERTIES cudaGetDeviceProperties
#endif

struct cudaFuncAttributes {
    size_t sharedSizeBytes, constSizeBytes, localSizeBytes;
    int maxThreadsPerBlock, numRegs, ptxVersion, binaryVersion, cacheModeCA;
    int maxDynamicSharedSizeBytes, preferredShmemCarveout, clusterDimMustBeSet;
    int requiredClusterWidth, requiredClusterHeight, requiredClusterDepth;
    int clusterSchedulingPolicyPreference, nonPortableClusterSizeAllowed, deviceNodeUpdateStatus;
    int reserved[14];
};

#if FG_SONAME_MAJOR == 12
/* struct cudaPointerAttributes of CUDA 12 (24 bytes: no localityDomainOrdinal, no reserved). */
struct cudaPointerAttributes {
    int type; /* 0 unregistered, 1 host, 2 device, 3 managed */
    int device;
    void *devicePointer;
    void *hostPointer;
};
_Static_assert(sizeof(struct cudaPointerAttributes) == 24, "CUDA 12 cudaPointerAttributes");
#else
struct cudaPointerAttributes {
    int type; /* 0 unregistered, 1 host, 2 device, 3 managed */
    int device;
    void *devicePointer;
    void *hostPointer;
    long localityDomainOrdinal;
    long reserved[7];
};
#endif

/* The driver functions the runtime calls (libcuda.so.1). */
CUresult cuInit(unsigned int flags);
/* The fake driver's: the first launch on a device loads the program's module (non-zero: it
 * did not fit). */
int vramshim_fakegpu_kernel_launch(void);
/* The same for a launch on STREAM, which a capturing stream records as a graph node. */
CUresult vramshim_fakegpu_kernel_launch_on(CUstream stream);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev);
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
CUresult cuDeviceGetPCIBusId(char *bus_id, int len, CUdevice dev);
CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev);
CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev);
CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool);
CUresult cuDriverGetVersion(int *version);
CUresult cuCtxGetCurrent(CUcontext *ctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetDevice(CUdevice *dev);
CUresult cuCtxSynchronize(void);
CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags);
CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest);
CUresult cuCtxGetLimit(size_t *value, int limit);
CUresult cuCtxSetLimit(int limit, size_t value);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                            unsigned int element_size);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags);
CUresult cuMemFreeHost(void *p);
CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags);
CUresult cuMemHostUnregister(void *p);
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dptr, void *p, unsigned int flags);
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n);
CUresult cuPointerGetAttributes(unsigned int n, int *attributes, void **data, CUdeviceptr p);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream stream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                 CUstream stream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props);
CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep);
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attribute, void *value);
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attribute, void *value);
CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count);
CUresult cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool, int type,
                                          unsigned long long flags);
CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle, int type,
                                            unsigned long long flags);
CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *data, CUdeviceptr ptr);
CUresult cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
                                CUmemPoolPtrExportData *data);
CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr p);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle handle, unsigned int flags);
CUresult cuIpcCloseMemHandle(CUdeviceptr p);
CUresult cuIpcGetEventHandle(CUipcEventHandle *handle, CUevent event);
CUresult cuIpcOpenEventHandle(CUevent *event, CUipcEventHandle handle);
CUresult cuStreamCreateWithPriority(CUstream *stream, unsigned int flags, int priority);
CUresult cuStreamDestroy_v2(CUstream stream);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuStreamQuery(CUstream stream);
CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags);
CUresult cuStreamGetPriority(CUstream stream, int *priority);
CUresult cuStreamGetId(CUstream stream, unsigned long long *id);
CUresult cuThreadExchangeStreamCaptureMode(int *mode);
CUresult cuEventCreate(CUevent *event, unsigned int flags);
CUresult cuEventDestroy_v2(CUevent event);
CUresult cuEventRecord(CUevent event, CUstream stream);
CUresult cuEventQuery(CUevent event);
CUresult cuEventSynchronize(CUevent event);
CUresult cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end);
CUresult cuGraphCreate(CUgraph *graph, unsigned int flags);
CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, int attribute, void *value);
CUresult cuDeviceSetGraphMemAttribute(CUdevice dev, int attribute, void *value);
CUresult cuDeviceGraphMemTrim(CUdevice dev);
CUresult cuGraphAddDependencies_v2(CUgraph graph, const CUgraphNode *from, const CUgraphNode *to,
                                   const void *edges, size_t count);
CUresult cuGraphRemoveDependencies_v2(CUgraph graph, const CUgraphNode *from,
                                      const CUgraphNode *to, const void *edges, size_t count);
CUresult cuGraphGetEdges_v2(CUgraph graph, CUgraphNode *from, CUgraphNode *to, void *edges,
                            size_t *count);
CUresult cuGraphGetRootNodes(CUgraph graph, CUgraphNode *nodes, size_t *count);
CUresult cuGraphNodeGetDependencies_v2(CUgraphNode node, CUgraphNode *deps, void *edges,
                                       size_t *count);
CUresult cuGraphNodeGetDependentNodes_v2(CUgraphNode node, CUgraphNode *dependents, void *edges,
                                         size_t *count);
CUresult cuGraphClone(CUgraph *clone, CUgraph original);
CUresult cuGraphAddChildGraphNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                  size_t count, CUgraph child);
CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode node, CUgraph *graph);
CUresult cuGraphExecUpdate_v2(CUgraphExec exec, CUgraph graph, void *info);
CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                size_t count, void *params);
CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                               size_t count, CUdeviceptr dptr);
CUresult cuGraphMemAllocNodeGetParams(CUgraphNode node, void *params);
CUresult cuGraphMemFreeNodeGetParams(CUgraphNode node, CUdeviceptr *dptr);
CUresult cuGraphDestroy(CUgraph graph);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream);
CUresult cuGraphExecDestroy(CUgraphExec exec);
CUresult cuGraphGetNodes(CUgraph graph, CUgraphNode *nodes, size_t *count);
CUresult cuGraphNodeGetType(CUgraphNode node, int *type);
CUresult cuGraphUpload(CUgraphExec exec, CUstream stream);
CUresult cuGraphAddEmptyNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                             size_t count);
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream);
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream stream);
CUresult cuLaunchHostFunc(CUstream stream, void (*fn)(void *), void *data);
CUresult cuStreamIsCapturing(CUstream stream, int *status);
CUresult cuStreamGetCaptureInfo_v3(CUstream stream, int *status, unsigned long long *id,
                                   CUgraph *graph, const CUgraphNode **deps, const void **edges,
                                   size_t *count);
CUresult cuStreamBeginCapture_v2(CUstream stream, int mode);
CUresult cuStreamUpdateCaptureDependencies_v2(CUstream stream, CUgraphNode *deps,
                                              const void *edges, size_t count,
                                              unsigned int flags);
CUresult cuStreamUpdateCaptureDependencies_v2_ptsz(CUstream stream, CUgraphNode *deps,
                                                   const void *edges, size_t count,
                                                   unsigned int flags);
CUresult cuStreamBeginCaptureToGraph(CUstream stream, CUgraph graph, const CUgraphNode *deps,
                                     const void *edges, size_t count, int mode);
CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, int mode);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream stream, CUgraph graph,
                                          const CUgraphNode *deps, const void *edges,
                                          size_t count, int mode);
CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph *graph);
CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                           const void *edges, size_t count, void *params);
CUresult cuLibraryLoadData(CUlibrary *library, const void *code, void *jit_options,
                           void **jit_values, unsigned int jit_count, void *library_options,
                           void **library_values, unsigned int library_count);
CUresult cuLibraryUnload(CUlibrary library);
CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary library, const char *name);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags,
                             int *status);

/* The runtime's memory API, on the driver's. */
#include "runtime.h"

#include <string.h>

#define READY()                                                                           \
    do {                                                                                  \
        cudaError_t ready_ = fg_rt_ready();                                               \
        if (ready_)                                                                       \
            return ready_;                                                                \
    } while (0)

FG_EXPORT cudaError_t cudaMalloc(void **p, size_t size)
{
    READY();
    if (!p)
        return fg_rt_status(cudaErrorInvalidValue);
    if (size == 0) { /* the runtime gives NULL for 0 bytes, the driver refuses */
        *p = NULL;
        return cudaSuccess;
    }
    return fg_rt_status(cuMemAlloc_v2((CUdeviceptr *)p, size));
}

FG_EXPORT cudaError_t cudaFree(void *p)
{
    READY();
    return fg_rt_status(cuMemFree_v2((CUdeviceptr)p));
}

FG_EXPORT cudaError_t cudaMallocManaged(void **p, size_t size, unsigned int flags)
{
    READY();
    return fg_rt_status(cuMemAllocManaged((CUdeviceptr *)p, size, flags ? flags : 1));
}

FG_EXPORT cudaError_t cudaMallocPitch(void **p, size_t *pitch, size_t width, size_t height)
{
    READY();
    return fg_rt_status(cuMemAllocPitch_v2((CUdeviceptr *)p, pitch, width, height, 4));
}

FG_EXPORT cudaError_t cudaMallocHost(void **p, size_t size)
{
    READY();
    return fg_rt_status(cuMemHostAlloc(p, size, 0));
}

FG_EXPORT cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags)
{
    READY();
    return fg_rt_status(cuMemHostAlloc(p, size, flags));
}

FG_EXPORT cudaError_t cudaFreeHost(void *p)
{
    READY();
    return fg_rt_status(cuMemFreeHost(p));
}

FG_EXPORT cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags)
{
    READY();
    return fg_rt_status(cuMemHostRegister_v2(p, size, flags));
}

FG_EXPORT cudaError_t cudaHostUnregister(void *p)
{
    READY();
    return fg_rt_status(cuMemHostUnregister(p));
}

FG_EXPORT cudaError_t cudaHostGetDevicePointer(void **dp, void *p, unsigned int flags)
{
    READY();
    return fg_rt_status(cuMemHostGetDevicePointer_v2((CUdeviceptr *)dp, p, flags));
}

FG_EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    READY();
    return fg_rt_status(cuMemGetInfo_v2(free_bytes, total_bytes));
}

/* Copies: device memory is host-addressable on the fake, so every kind is one copy. */
FG_EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind)
{
    READY();
    return fg_rt_status(cuMemcpy((CUdeviceptr)dst, (CUdeviceptr)src, n));
}

FG_EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind,
                                      cudaStream_t stream)
{
    READY();
    return fg_rt_status(cuMemcpyAsync((CUdeviceptr)dst, (CUdeviceptr)src, n, stream));
}

FG_EXPORT cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_device, const void *src,
                                          int src_device, size_t n, cudaStream_t stream)
{
    return cudaMemcpyAsync(dst, src, n, 4, stream);
}

FG_EXPORT cudaError_t cudaMemcpyPeer(void *dst, int dst_device, const void *src, int src_device,
                                     size_t n)
{
    return cudaMemcpy(dst, src, n, 4);
}

FG_EXPORT cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
                                   size_t width, size_t height, int kind)
{
    READY();
    if (width > dpitch || width > spitch)
        return fg_rt_status(cudaErrorInvalidValue);
    for (size_t row = 0; row < height; row++) {
        CUresult rc = cuMemcpy((CUdeviceptr)dst + row * dpitch,
                               (CUdeviceptr)src + row * spitch, width);
        if (rc)
            return fg_rt_status(rc);
    }
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                        size_t width, size_t height, int kind,
                                        cudaStream_t stream)
{
    READY();
    if (width > dpitch || width > spitch)
        return fg_rt_status(cudaErrorInvalidValue);
    for (size_t row = 0; row < height; row++) {
        CUresult rc = cuMemcpyAsync((CUdeviceptr)dst + row * dpitch,
                                    (CUdeviceptr)src + row * spitch, width, stream);
        if (rc)
            return fg_rt_status(rc);
    }
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaMemset(void *p, int value, size_t n)
{
    READY();
    return fg_rt_status(cuMemsetD8_v2((CUdeviceptr)p, (unsigned char)value, n));
}

FG_EXPORT cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t stream)
{
    READY();
    return fg_rt_status(cuMemsetD8Async((CUdeviceptr)p, (unsigned char)value, n, stream));
}

/* __constant__ and __device__ variables: their host shadows stand for them. */
FG_EXPORT cudaError_t cudaGetSymbolAddress(void **p, const void *symbol)
{
    READY();
    if (!p || !symbol)
        return fg_rt_status(cudaErrorInvalidValue);
    *p = (void *)symbol;
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaMemcpyToSymbol(const void *symbol, const void *src, size_t n,
                                         size_t offset, int kind)
{
    READY();
    if (!symbol || (!src && n))
        return fg_rt_status(cudaErrorInvalidValue);
    memmove((char *)symbol + offset, src, n);
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
    if (!a)
        return fg_rt_status(cudaErrorInvalidValue);
    READY();
    unsigned memory_type = 0;
    int device = -2, managed = 0;
    int attributes[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                        CU_POINTER_ATTRIBUTE_IS_MANAGED};
    void *values[] = {&memory_type, &device, &managed};
    CUresult rc = cuPointerGetAttributes(3, attributes, values, (CUdeviceptr)p);
    if (rc)
        return fg_rt_status(rc);
    memset(a, 0, sizeof *a);
    a->type = managed ? 3 : memory_type == CU_MEMORYTYPE_DEVICE ? 2
                          : memory_type == CU_MEMORYTYPE_HOST   ? 1
                                                                : 0;
    a->device = a->type ? device : -2;
    a->devicePointer = a->type ? (void *)p : NULL;
    a->hostPointer = a->type == 1 || a->type == 3 ? (void *)p : NULL;
    return cudaSuccess;
}

/* ---------------------------------------------------------------- stream-ordered */
FG_EXPORT cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t stream)
{
    READY();
    return fg_rt_status(cuMemAllocAsync((CUdeviceptr *)p, size, stream));
}

FG_EXPORT cudaError_t cudaMallocFromPoolAsync(void **p, size_t size, cudaMemPool_t pool,
                                              cudaStream_t stream)
{
    READY();
    return fg_rt_status(cuMemAllocFromPoolAsync((CUdeviceptr *)p, size, pool, stream));
}

FG_EXPORT cudaError_t cudaFreeAsync(void *p, cudaStream_t stream)
{
    READY();
    return fg_rt_status(cuMemFreeAsync((CUdeviceptr)p, stream));
}

/* The `_ptsz` variants: stream 0 is the calling thread's default stream. */
FG_EXPORT cudaError_t cudaMallocAsync_ptsz(void **p, size_t size, cudaStream_t stream)
{
    READY();
    return fg_rt_status(cuMemAllocAsync((CUdeviceptr *)p, size,
                                        stream ? stream : (cudaStream_t)(uintptr_t)2));
}

FG_EXPORT cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t stream)
{
    READY();
    return fg_rt_status(cuMemFreeAsync((CUdeviceptr)p, stream ? stream : (cudaStream_t)(uintptr_t)2));
}

FG_EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device)
{
    READY();
    return fg_rt_status(cuDeviceGetDefaultMemPool(pool, device));
}

FG_EXPORT cudaError_t cudaDeviceGetMemPool(cudaMemPool_t *pool, int device)
{
    READY();
    return fg_rt_status(cuDeviceGetMemPool(pool, device));
}

FG_EXPORT cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t pool)
{
    READY();
    return fg_rt_status(cuDeviceSetMemPool(device, pool));
}

FG_EXPORT cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const CUmemPoolProps *props)
{
    READY();
    return fg_rt_status(cuMemPoolCreate(pool, props));
}

FG_EXPORT cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool)
{
    READY();
    return fg_rt_status(cuMemPoolDestroy(pool));
}

FG_EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep)
{
    READY();
    return fg_rt_status(cuMemPoolTrimTo(pool, keep));
}

FG_EXPORT cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, int attribute, void *value)
{
    READY();
    return fg_rt_status(cuMemPoolGetAttribute(pool, attribute, value));
}

FG_EXPORT cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, int attribute, void *value)
{
    READY();
    return fg_rt_status(cuMemPoolSetAttribute(pool, attribute, value));
}

FG_EXPORT cudaError_t cudaMemPoolSetAccess(cudaMemPool_t pool, const CUmemAccessDesc *map,
                                           size_t count)
{
    READY();
    return fg_rt_status(cuMemPoolSetAccess(pool, map, count));
}

/* ---------------------------------------------------------------- IPC */
/* Pools across processes (the driver's pool.c). */
FG_EXPORT cudaError_t cudaMemPoolExportToShareableHandle(void *handle_out, cudaMemPool_t pool,
                                                         int type, unsigned int flags)
{
    READY();
    return fg_rt_status(cuMemPoolExportToShareableHandle(handle_out, pool, type, flags));
}

FG_EXPORT cudaError_t cudaMemPoolImportFromShareableHandle(cudaMemPool_t *pool, void *handle,
                                                           int type, unsigned int flags)
{
    READY();
    return fg_rt_status(cuMemPoolImportFromShareableHandle(pool, handle, type, flags));
}

FG_EXPORT cudaError_t cudaMemPoolExportPointer(CUmemPoolPtrExportData *data, void *p)
{
    READY();
    return fg_rt_status(cuMemPoolExportPointer(data, (CUdeviceptr)p));
}

FG_EXPORT cudaError_t cudaMemPoolImportPointer(void **p, cudaMemPool_t pool,
                                               CUmemPoolPtrExportData *data)
{
    READY();
    return fg_rt_status(cuMemPoolImportPointer((CUdeviceptr *)p, pool, data));
}

FG_EXPORT cudaError_t cudaIpcGetMemHandle(CUipcMemHandle *handle, void *p)
{
    READY();
    return fg_rt_status(cuIpcGetMemHandle(handle, (CUdeviceptr)p));
}

FG_EXPORT cudaError_t cudaIpcOpenMemHandle(void **p, CUipcMemHandle handle, unsigned int flags)
{
    READY();
    return fg_rt_status(cuIpcOpenMemHandle_v2((CUdeviceptr *)p, handle, flags));
}

FG_EXPORT cudaError_t cudaIpcCloseMemHandle(void *p)
{
    READY();
    return fg_rt_status(cuIpcCloseMemHandle((CUdeviceptr)p));
}

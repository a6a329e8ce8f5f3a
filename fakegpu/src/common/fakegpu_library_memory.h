/* Device memory a library allocates for itself, as NVIDIA's libraries do through the runtime
 * they link statically: the driver's cuMemAlloc_v2, so the recorder sees what it sees on a real
 * GPU. Header-only; a library that includes it links the fake libcuda.so.1 (link.txt). */
#pragma once
#include <stddef.h>

#include "fakegpu_cuda.h"
#include "fakegpu_runtime_thread.h"

CUresult cuInit(unsigned int flags);
CUresult cuCtxGetCurrent(CUcontext *ctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags);
CUresult cuMemFreeHost(void *p);


/* As a static runtime does before its first allocation: the driver initialised and the calling
 * thread's device's primary context current. */
static inline CUresult fg_library_ready(void)
{
    CUcontext current = NULL;
    CUresult rc = cuInit(0);
    if (rc)
        return rc;
    if (cuCtxGetCurrent(&current) == CUDA_SUCCESS && current)
        return CUDA_SUCCESS;
    CUcontext primary = NULL;
    rc = cuDevicePrimaryCtxRetain(&primary, fakegpu_runtime_thread()->device);
    return rc ? rc : cuCtxSetCurrent(primary);
}

/* From the fake driver, not an NVIDIA symbol: charges LIBRARY's kernels ("libcublas",
 * "libcudnn") to the current device once (VRAMSHIM_FAKEGPU_*_KERNEL_BYTES, 0 unless dryrun
 * sets them). */
int vramshim_fakegpu_load_library_kernels(const char *library);

/* A real library's kernels take device memory that no hook sees when the driver loads them
 * (lazily, at their first launch): LIBRARY's, charged once per device with the calling thread's
 * device's primary context current, as for fg_library_alloc. CUDA_ERROR_OUT_OF_MEMORY when they
 * do not fit; any other failure charges nothing and is not the caller's. */
static inline CUresult fg_library_load_kernels(const char *library)
{
    if (fg_library_ready() != CUDA_SUCCESS)
        return CUDA_SUCCESS;
    CUresult rc = (CUresult)vramshim_fakegpu_load_library_kernels(library);
    return rc == CUDA_ERROR_OUT_OF_MEMORY ? rc : CUDA_SUCCESS;
}

/* Frees what fg_library_alloc allocated (zero entries are skipped). */
static inline void fg_library_free(CUdeviceptr *own, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        if (own[i])
            cuMemFree_v2(own[i]);
        own[i] = 0;
    }
}

/* Allocates sizes[i] bytes into own[i], in order; all or nothing. */
static inline CUresult fg_library_alloc(CUdeviceptr *own, const size_t *sizes, size_t count)
{
    CUresult rc = fg_library_ready();
    for (size_t i = 0; rc == CUDA_SUCCESS && i < count; i++)
        rc = cuMemAlloc_v2(&own[i], sizes[i]);
    if (rc)
        fg_library_free(own, count);
    return rc;
}

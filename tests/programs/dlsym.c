/*
 * dlsym: reaches the driver like JAX/XLA and TensorFlow do: dlopen of
 * libcuda.so.1 and dlsym of each exported variant it uses (not linked -lcuda).
 */
#include "common.h"
#include "cuda.h"

#include <dlfcn.h>
#include <stdint.h>

static void *h;

static void *sym(const char *name)
{
    void *p = dlsym(h, name);
    out("lookup dlsym symbol=%s pfn=0x%llx rc=%d", name, (unsigned long long)(uintptr_t)p,
        p ? 0 : 1);
    if (!p)
        die("dlsym(%s): %s", name, dlerror());
    return p;
}

int main(void)
{
    g_prog = "dlsym";
    h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        die("dlopen(libcuda.so.1): %s", dlerror());

    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))sym("cuInit");
    CUresult (*retain)(CUcontext *, CUdevice) =
        (CUresult(*)(CUcontext *, CUdevice))sym("cuDevicePrimaryCtxRetain");
    CUresult (*set_current)(CUcontext) = (CUresult(*)(CUcontext))sym("cuCtxSetCurrent");
    CUresult (*mem_alloc)(CUdeviceptr *, size_t) =
        (CUresult(*)(CUdeviceptr *, size_t))sym("cuMemAlloc_v2");
    CUresult (*mem_free)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))sym("cuMemFree_v2");
    CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream) =
        (CUresult(*)(CUdeviceptr *, size_t, CUstream))sym("cuMemAllocAsync");
    CUresult (*free_async)(CUdeviceptr, CUstream) =
        (CUresult(*)(CUdeviceptr, CUstream))sym("cuMemFreeAsync");
    CUresult (*get_info)(size_t *, size_t *) =
        (CUresult(*)(size_t *, size_t *))sym("cuMemGetInfo_v2");

    EXPECT_RC(init(0), CUDA_SUCCESS, "cuInit");
    CUcontext ctx;
    EXPECT_RC(retain(&ctx, 0), CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    CUresult rc = set_current(ctx);
    out("ctx cuCtxSetCurrent dev=0 handle=0x%llx rc=%d", (unsigned long long)(uintptr_t)ctx, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuCtxSetCurrent");

    size_t f0, t0;
    rc = get_info(&f0, &t0);
    out("info cuMemGetInfo_v2 dev=0 free=%zu total=%zu when=start rc=%d", f0, t0, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemGetInfo_v2");

    CUdeviceptr a = 0, b = 0, c = 0;
    rc = mem_alloc(&a, 1 * MiB);
    emit("alloc", "cuMemAlloc_v2", 0, "addr", a, 1 * MiB, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAlloc_v2");
    rc = mem_alloc(&b, 4 * MiB);
    emit("alloc", "cuMemAlloc_v2", 0, "addr", b, 4 * MiB, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAlloc_v2");
    rc = alloc_async(&c, 256 * 1024, NULL);
    emit("alloc", "cuMemAllocAsync", 0, "addr", c, 256 * 1024, "stream=0x0", rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAllocAsync");

    size_t f1, t1;
    rc = get_info(&f1, &t1);
    out("info cuMemGetInfo_v2 dev=0 free=%zu total=%zu when=peak rc=%d", f1, t1, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemGetInfo_v2");

    rc = free_async(c, NULL);
    emit("free", "cuMemFreeAsync", 0, "addr", c, 256 * 1024, "stream=0x0", rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemFreeAsync");
    rc = mem_free(b);
    emit("free", "cuMemFree_v2", 0, "addr", b, 4 * MiB, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemFree_v2");
    rc = mem_free(a);
    emit("free", "cuMemFree_v2", 0, "addr", a, 1 * MiB, NULL, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemFree_v2");

    /* Freeing it twice is an error the program expects. */
    rc = mem_free(a);
    emit("free", "cuMemFree_v2", 0, "addr", a, 0, "expect_error=1", rc);
    EXPECT_RC(rc, CUDA_ERROR_INVALID_VALUE, "cuMemFree_v2 (double free)");

    size_t f2, t2;
    rc = get_info(&f2, &t2);
    out("info cuMemGetInfo_v2 dev=0 free=%zu total=%zu when=end rc=%d", f2, t2, rc);
    if (f2 != f0)
        die("free memory %zu at end, %zu at start", f2, f0);
    out("done dlsym");
    return 0;
}

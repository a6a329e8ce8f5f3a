/*
 * resolver: reaches the driver like cudart / NCCL do: dlopen + ONE dlsym of
 * cuGetProcAddress_v2, then everything by (base name, version, flags) through
 * the resolver, including the resolver itself (v1 ABI at 11030, v2 at 12000).
 *
 * lookup lines:
 *   lookup <resolver> via=<dlsym|self11030|self12000> symbol=<s> version=<v> flags=<f>
 *          [status=<s>] pfn=0x<hex> variant=<dladdr name|none|?> rc=<rc>
 * (status is absent for the v1 resolver, which has no status out-parameter.)
 * Allocations through obtained pointers carry via=<resolver>@<version>/f<flags>.
 */
#include "common.h"
#include "cuda.h"

#include <dlfcn.h>
#include <stdint.h>

typedef CUresult (*gpa2_t)(const char *, void **, int, cuuint64_t,
                           CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa1_t)(const char *, void **, int, cuuint64_t);
typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*free_t)(CUdeviceptr);
typedef CUresult (*alloc_v1_t)(CUdeviceptr_v1 *, unsigned int);
typedef CUresult (*free_v1_t)(CUdeviceptr_v1);
typedef CUresult (*alloc_async_t)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_async_t)(CUdeviceptr, CUstream);

static gpa2_t g_boot;
static gpa1_t g_self1;
static gpa2_t g_self2;

static const char *variant(void *p)
{
    if (!p)
        return "none";
    Dl_info info;
    if (dladdr(p, &info) && info.dli_sname && info.dli_saddr == p)
        return info.dli_sname;
    return "?";
}

/* which: 0 = the dlsym'd pointer, 1 = v1 from self look-up, 2 = v2 from self look-up. */
static const char *via_name(int which)
{
    return which == 0 ? "dlsym" : which == 1 ? "self11030" : "self12000";
}

static void *lookup(int which, const char *symbol, int version, cuuint64_t flags, int want_rc,
                    int want_status)
{
    void *p = (void *)0x1; /* must be overwritten */
    CUresult rc;
    if (which == 1) {
        rc = g_self1(symbol, &p, version, flags);
        out("lookup cuGetProcAddress via=%s symbol=%s version=%d flags=%llu pfn=0x%llx "
            "variant=%s rc=%d",
            via_name(which), *symbol ? symbol : "\"\"", version, (unsigned long long)flags,
            (unsigned long long)(uintptr_t)p, variant(p), rc);
    } else {
        CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)-1;
        rc = (which == 0 ? g_boot : g_self2)(symbol, &p, version, flags, &st);
        out("lookup cuGetProcAddress_v2 via=%s symbol=%s version=%d flags=%llu status=%d "
            "pfn=0x%llx variant=%s rc=%d",
            via_name(which), *symbol ? symbol : "\"\"", version, (unsigned long long)flags,
            (int)st, (unsigned long long)(uintptr_t)p, variant(p), rc);
        if (want_status >= 0 && (int)st != want_status)
            die("%s lookup of '%s' at %d: status %d, expected %d", via_name(which), symbol,
                version, (int)st, want_status);
    }
    if ((int)rc != want_rc)
        die("%s lookup of '%s' at %d flags %llu: rc %d, expected %d", via_name(which), symbol,
            version, (unsigned long long)flags, rc, want_rc);
    if (want_rc == 0 && want_status == 0 && !p)
        die("%s lookup of '%s' at %d: NULL pointer", via_name(which), symbol, version);
    if ((want_rc != 0 || want_status > 0) && p)
        die("%s lookup of '%s' at %d: pointer not NULL on failure", via_name(which), symbol,
            version);
    return p;
}

int main(void)
{
    g_prog = "resolver";
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h)
        die("dlopen(libcuda.so.1): %s", dlerror());
    g_boot = (gpa2_t)dlsym(h, "cuGetProcAddress_v2");
    out("lookup dlsym symbol=cuGetProcAddress_v2 pfn=0x%llx rc=%d",
        (unsigned long long)(uintptr_t)g_boot, g_boot ? 0 : 1);
    if (!g_boot)
        die("dlsym(cuGetProcAddress_v2): %s", dlerror());

    /* Probe with an empty name, like cudart: SUCCESS, NULL, SYMBOL_NOT_FOUND. */
    lookup(0, "", 12000, 0, CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);

    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))lookup(0, "cuInit", 12000, 0, 0, 0);
    EXPECT_RC(init(0), CUDA_SUCCESS, "cuInit");

    /* Self look-up of the resolver: v1 ABI below 12000, v2 ABI from 12000. */
    g_self1 = (gpa1_t)lookup(0, "cuGetProcAddress", 11030, 0, 0, 0);
    g_self2 = (gpa2_t)lookup(0, "cuGetProcAddress", 12000, 0, 0, 0);

    CUresult (*retain)(CUcontext *, CUdevice) =
        (CUresult(*)(CUcontext *, CUdevice))lookup(2, "cuDevicePrimaryCtxRetain", 12000, 0, 0, 0);
    CUresult (*set_current)(CUcontext) =
        (CUresult(*)(CUcontext))lookup(2, "cuCtxSetCurrent", 12000, 0, 0, 0);
    CUcontext ctx;
    EXPECT_RC(retain(&ctx, 0), CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    CUresult rc = set_current(ctx);
    out("ctx cuCtxSetCurrent dev=0 handle=0x%llx rc=%d", (unsigned long long)(uintptr_t)ctx, rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuCtxSetCurrent");

    /* cuMemAlloc / cuMemFree at 3020, 12000 and 13000 through both resolvers. */
    static const int versions[] = {3020, 12000, 13000};
    unsigned long long size = 1 * MiB;
    for (int which = 1; which <= 2; which++) {
        for (size_t v = 0; v < sizeof versions / sizeof versions[0]; v++) {
            alloc_t a = (alloc_t)lookup(which, "cuMemAlloc", versions[v], 0, 0, 0);
            free_t f = (free_t)lookup(which, "cuMemFree", versions[v], 0, 0, 0);
            const char *via = xf("via=%s@%d/f0", via_name(which), versions[v]);
            CUdeviceptr p = 0;
            rc = a(&p, size);
            emit("alloc", "cuMemAlloc_v2", 0, "addr", p, size, via, rc);
            EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAlloc_v2 via resolver");
            rc = f(p);
            emit("free", "cuMemFree_v2", 0, "addr", p, size, via, rc);
            EXPECT_RC(rc, CUDA_SUCCESS, "cuMemFree_v2 via resolver");
            size += 1 * MiB;
        }
    }

    /* Stream-ordered, flags 0 (default stream) and 2 (per-thread default stream). */
    for (int which = 1; which <= 2; which++) {
        for (cuuint64_t flags = 0; flags <= 2; flags += 2) {
            alloc_async_t a =
                (alloc_async_t)lookup(which, "cuMemAllocAsync", 12000, flags, 0, 0);
            free_async_t f = (free_async_t)lookup(which, "cuMemFreeAsync", 12000, flags, 0, 0);
            const char *via = xf("stream=0x0 via=%s@12000/f%llu", via_name(which),
                                 (unsigned long long)flags);
            const char *an = flags ? "cuMemAllocAsync_ptsz" : "cuMemAllocAsync";
            const char *fn = flags ? "cuMemFreeAsync_ptsz" : "cuMemFreeAsync";
            CUdeviceptr p = 0;
            rc = a(&p, size, NULL);
            emit("alloc", an, 0, "addr", p, size, via, rc);
            EXPECT_RC(rc, CUDA_SUCCESS, an);
            rc = f(p, NULL);
            emit("free", fn, 0, "addr", p, size, via, rc);
            EXPECT_RC(rc, CUDA_SUCCESS, fn);
            size += 1 * MiB;
        }
    }

    /* The legacy 32-bit variant, handed out below version 3020. */
    {
        alloc_v1_t a = (alloc_v1_t)lookup(2, "cuMemAlloc", 2000, 0, 0, 0);
        free_v1_t f = (free_v1_t)lookup(2, "cuMemFree", 2000, 0, 0, 0);
        CUdeviceptr_v1 p = 0;
        rc = a(&p, 4096);
        emit("alloc", "cuMemAlloc", 0, "addr", p, 4096, "via=self12000@2000/f0", rc);
        EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAlloc (v1) via resolver");
        rc = f(p);
        emit("free", "cuMemFree", 0, "addr", p, 4096, "via=self12000@2000/f0", rc);
        EXPECT_RC(rc, CUDA_SUCCESS, "cuMemFree (v1) via resolver");
    }

    /* Misses: unknown name, and a version below the symbol's introduction. */
    lookup(2, "cuDoesNotExist", 12000, 0, CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    lookup(2, "cuMemAllocAsync", 11000, 0, CUDA_ERROR_NOT_FOUND,
           CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    lookup(0, "cuDoesNotExist", 12000, 0, CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    lookup(0, "cuMemAllocAsync", 11000, 0, CUDA_ERROR_NOT_FOUND,
           CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    lookup(1, "cuDoesNotExist", 11030, 0, CUDA_ERROR_NOT_FOUND, -1);
    lookup(1, "cuMemAllocAsync", 11000, 0, CUDA_ERROR_NOT_FOUND, -1);
    out("done resolver");
    return 0;
}

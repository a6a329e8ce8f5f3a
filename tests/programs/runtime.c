/*
 * runtime: every allocating / freeing export of the runtime (linked -lcudart),
 * device switching, and driver entry points obtained through
 * cudaGetDriverEntryPoint / cudaGetDriverEntryPointByVersion.
 */
#include "common.h"
#include "cuda.h"
#include "cuda_runtime.h"

#include <stdint.h>

#define P(x) ((unsigned long long)(uintptr_t)(x))

static int cur_dev(void)
{
    int d = -1;
    EXPECT_RC(cudaGetDevice(&d), cudaSuccess, "cudaGetDevice");
    return d;
}

static void info(const char *when)
{
    size_t f = 0, t = 0;
    cudaError_t rc = cudaMemGetInfo(&f, &t);
    out("info cudaMemGetInfo dev=%d free=%zu total=%zu when=%s rc=%d", cur_dev(), f, t, when, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMemGetInfo");
}

int main(void)
{
    g_prog = "runtime";
    cudaError_t rc;
    int n = 0;
    rc = cudaGetDeviceCount(&n);
    EXPECT_RC(rc, cudaSuccess, "cudaGetDeviceCount");
    if (n != 2)
        die("cudaGetDeviceCount = %d, expected 2", n);
    info("start");

    /* ---- plain ---- */
    void *a = NULL;
    rc = cudaMalloc(&a, 1 * MiB);
    emit("alloc", "cudaMalloc", cur_dev(), "addr", P(a), 1 * MiB, NULL, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
    rc = cudaFree(a);
    emit("free", "cudaFree", cur_dev(), "addr", P(a), 1 * MiB, NULL, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFree");

    /* size 0: success with NULL and no driver allocation (real cudart behaviour) */
    void *z = (void *)0x1;
    rc = cudaMalloc(&z, 0);
    emit("alloc", "cudaMalloc", cur_dev(), "addr", P(z), 0, "zero=1", rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMalloc(0)");
    if (z != NULL)
        die("cudaMalloc(0) returned %p", z);

    /* ---- stream-ordered on two streams ---- */
    cudaStream_t s1 = NULL, s2 = NULL;
    rc = cudaStreamCreate(&s1);
    out("stream_create cudaStreamCreate dev=%d stream=0x%llx rc=%d", cur_dev(), P(s1), rc);
    EXPECT_RC(rc, cudaSuccess, "cudaStreamCreate");
    rc = cudaStreamCreate(&s2);
    out("stream_create cudaStreamCreate dev=%d stream=0x%llx rc=%d", cur_dev(), P(s2), rc);
    EXPECT_RC(rc, cudaSuccess, "cudaStreamCreate");
    const char *x1 = xf("stream=0x%llx", P(s1));
    const char *x2 = xf("stream=0x%llx", P(s2));

    void *b = NULL, *c = NULL;
    rc = cudaMallocAsync(&b, 2 * MiB, s1);
    emit("alloc", "cudaMallocAsync", cur_dev(), "addr", P(b), 2 * MiB, x1, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMallocAsync");
    rc = cudaMallocAsync_ptsz(&c, 3 * MiB, s2);
    emit("alloc", "cudaMallocAsync_ptsz", cur_dev(), "addr", P(c), 3 * MiB, x2, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMallocAsync_ptsz");
    rc = cudaFreeAsync(b, s1);
    emit("free", "cudaFreeAsync", cur_dev(), "addr", P(b), 2 * MiB, x1, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFreeAsync");
    rc = cudaFreeAsync_ptsz(c, s2);
    emit("free", "cudaFreeAsync_ptsz", cur_dev(), "addr", P(c), 3 * MiB, x2, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFreeAsync_ptsz");

    /* ---- pools: a created one and the default one ---- */
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t pool = NULL, defpool = NULL;
    rc = cudaMemPoolCreate(&pool, &props);
    out("pool_create cudaMemPoolCreate dev=0 pool=0x%llx rc=%d", P(pool), rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMemPoolCreate");
    rc = cudaDeviceGetDefaultMemPool(&defpool, 0);
    out("pool_create cudaDeviceGetDefaultMemPool dev=0 pool=0x%llx rc=%d", P(defpool), rc);
    EXPECT_RC(rc, cudaSuccess, "cudaDeviceGetDefaultMemPool");

    void *pa = NULL, *pb = NULL;
    rc = cudaMallocFromPoolAsync(&pa, 4 * MiB, pool, s1);
    emit("alloc", "cudaMallocFromPoolAsync", 0, "addr", P(pa), 4 * MiB,
         xf("stream=0x%llx pool=0x%llx", P(s1), P(pool)), rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMallocFromPoolAsync");
    rc = cudaMallocFromPoolAsync_ptsz(&pb, 5 * MiB, defpool, s2);
    emit("alloc", "cudaMallocFromPoolAsync_ptsz", 0, "addr", P(pb), 5 * MiB,
         xf("stream=0x%llx pool=0x%llx", P(s2), P(defpool)), rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMallocFromPoolAsync_ptsz");
    rc = cudaFreeAsync(pa, s1);
    emit("free", "cudaFreeAsync", 0, "addr", P(pa), 4 * MiB, x1, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFreeAsync");
    rc = cudaFreeAsync_ptsz(pb, s2);
    emit("free", "cudaFreeAsync_ptsz", 0, "addr", P(pb), 5 * MiB, x2, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFreeAsync_ptsz");
    rc = cudaStreamSynchronize(s1);
    EXPECT_RC(rc, cudaSuccess, "cudaStreamSynchronize");
    rc = cudaMemPoolTrimTo(pool, 0);
    out("pool_trim cudaMemPoolTrimTo dev=0 pool=0x%llx keep=0 rc=%d", P(pool), rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMemPoolTrimTo");
    rc = cudaMemPoolTrimTo(defpool, 0);
    out("pool_trim cudaMemPoolTrimTo dev=0 pool=0x%llx keep=0 rc=%d", P(defpool), rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMemPoolTrimTo");
    rc = cudaMemPoolDestroy(pool);
    out("pool_destroy cudaMemPoolDestroy dev=0 pool=0x%llx rc=%d", P(pool), rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMemPoolDestroy");

    rc = cudaStreamDestroy(s1);
    out("stream_destroy cudaStreamDestroy dev=%d stream=0x%llx rc=%d", cur_dev(), P(s1), rc);
    EXPECT_RC(rc, cudaSuccess, "cudaStreamDestroy");
    rc = cudaStreamDestroy(s2);
    out("stream_destroy cudaStreamDestroy dev=%d stream=0x%llx rc=%d", cur_dev(), P(s2), rc);
    EXPECT_RC(rc, cudaSuccess, "cudaStreamDestroy");

    /* ---- managed, pinned host, pitch ---- */
    void *m = NULL;
    rc = cudaMallocManaged(&m, 64 * 1024, cudaMemAttachGlobal);
    emit("alloc", "cudaMallocManaged", cur_dev(), "addr", P(m), 64 * 1024, "flags=1", rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMallocManaged");
    rc = cudaFree(m);
    emit("free", "cudaFree", cur_dev(), "addr", P(m), 64 * 1024, NULL, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFree");

    void *h1 = NULL, *h2 = NULL;
    rc = cudaMallocHost(&h1, 8192);
    emit("alloc", "cudaMallocHost", cur_dev(), "addr", P(h1), 8192, NULL, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMallocHost");
    rc = cudaHostAlloc(&h2, 16384, cudaHostAllocPortable | cudaHostAllocMapped);
    emit("alloc", "cudaHostAlloc", cur_dev(), "addr", P(h2), 16384, "flags=3", rc);
    EXPECT_RC(rc, cudaSuccess, "cudaHostAlloc");
    memset(h1, 1, 8192);
    memset(h2, 2, 16384);
    rc = cudaFreeHost(h1);
    emit("free", "cudaFreeHost", cur_dev(), "addr", P(h1), 8192, NULL, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFreeHost");
    rc = cudaFreeHost(h2);
    emit("free", "cudaFreeHost", cur_dev(), "addr", P(h2), 16384, NULL, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFreeHost");

    void *pp = NULL;
    size_t pitch = 0;
    rc = cudaMallocPitch(&pp, &pitch, 1000, 10);
    emit("alloc", "cudaMallocPitch", cur_dev(), "addr", P(pp), (unsigned long long)pitch * 10,
         xf("pitch=%zu width=1000 height=10", pitch), rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMallocPitch");
    if (pitch != 1024)
        die("pitch %zu, expected 1024", pitch);
    rc = cudaFree(pp);
    emit("free", "cudaFree", cur_dev(), "addr", P(pp), (unsigned long long)pitch * 10, NULL, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFree");
    info("dev0-end");

    /* ---- device 1 ---- */
    rc = cudaSetDevice(1);
    out("ctx cudaSetDevice dev=1 rc=%d", rc);
    EXPECT_RC(rc, cudaSuccess, "cudaSetDevice");
    void *d1 = NULL;
    rc = cudaMalloc(&d1, 6 * MiB);
    emit("alloc", "cudaMalloc", cur_dev(), "addr", P(d1), 6 * MiB, NULL, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
    if (cur_dev() != 1 || P(d1) < 0x710000000000ULL)
        die("cudaMalloc after cudaSetDevice(1) gave 0x%llx", P(d1));
    rc = cudaFree(d1);
    emit("free", "cudaFree", cur_dev(), "addr", P(d1), 6 * MiB, NULL, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFree");

    /* ---- driver entry points through the runtime ---- */
    cudaDriverEntryPointQueryResult st = (cudaDriverEntryPointQueryResult)-1;
    void *fa = NULL, *ff = NULL;
    rc = cudaGetDriverEntryPoint("cuMemAlloc", &fa, cudaEnableDefault, &st);
    out("lookup cudaGetDriverEntryPoint symbol=cuMemAlloc flags=0 status=%d pfn=0x%llx rc=%d",
        (int)st, P(fa), rc);
    EXPECT_RC(rc, cudaSuccess, "cudaGetDriverEntryPoint(cuMemAlloc)");
    EXPECT_RC(st, cudaDriverEntryPointSuccess, "cudaGetDriverEntryPoint(cuMemAlloc) status");
    rc = cudaGetDriverEntryPoint("cuMemFree", &ff, cudaEnableDefault, &st);
    out("lookup cudaGetDriverEntryPoint symbol=cuMemFree flags=0 status=%d pfn=0x%llx rc=%d",
        (int)st, P(ff), rc);
    EXPECT_RC(rc, cudaSuccess, "cudaGetDriverEntryPoint(cuMemFree)");
    CUdeviceptr dp = 0;
    CUresult crc = ((CUresult(*)(CUdeviceptr *, size_t))fa)(&dp, 7 * MiB);
    emit("alloc", "cuMemAlloc_v2", cur_dev(), "addr", dp, 7 * MiB, "via=cudaGetDriverEntryPoint",
         crc);
    EXPECT_RC(crc, CUDA_SUCCESS, "cuMemAlloc_v2 via cudaGetDriverEntryPoint");
    crc = ((CUresult(*)(CUdeviceptr))ff)(dp);
    emit("free", "cuMemFree_v2", cur_dev(), "addr", dp, 7 * MiB, "via=cudaGetDriverEntryPoint",
         crc);
    EXPECT_RC(crc, CUDA_SUCCESS, "cuMemFree_v2 via cudaGetDriverEntryPoint");

    void *fc = NULL, *fr = NULL, *fg = NULL;
    rc = cudaGetDriverEntryPointByVersion("cuMemCreate", &fc, 12000, cudaEnableDefault, &st);
    out("lookup cudaGetDriverEntryPointByVersion symbol=cuMemCreate version=12000 flags=0 "
        "status=%d pfn=0x%llx rc=%d",
        (int)st, P(fc), rc);
    EXPECT_RC(rc, cudaSuccess, "cudaGetDriverEntryPointByVersion(cuMemCreate)");
    rc = cudaGetDriverEntryPointByVersion("cuMemRelease", &fr, 12000, cudaEnableDefault, &st);
    out("lookup cudaGetDriverEntryPointByVersion symbol=cuMemRelease version=12000 flags=0 "
        "status=%d pfn=0x%llx rc=%d",
        (int)st, P(fr), rc);
    EXPECT_RC(rc, cudaSuccess, "cudaGetDriverEntryPointByVersion(cuMemRelease)");
    rc = cudaGetDriverEntryPointByVersion("cuMemGetAllocationGranularity", &fg, 12000,
                                          cudaEnableDefault, &st);
    EXPECT_RC(rc, cudaSuccess, "cudaGetDriverEntryPointByVersion(cuMemGetAllocationGranularity)");

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t gran = 0;
    crc = ((CUresult(*)(size_t *, const CUmemAllocationProp *,
                        CUmemAllocationGranularity_flags))fg)(&gran, &prop,
                                                              CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    EXPECT_RC(crc, CUDA_SUCCESS, "cuMemGetAllocationGranularity");
    CUmemGenericAllocationHandle mh = 0;
    size_t vsize = 2 * gran;
    crc = ((CUresult(*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                        unsigned long long))fc)(&mh, vsize, &prop, 0);
    emit("alloc", "cuMemCreate", 0, "handle", mh, vsize,
         "via=cudaGetDriverEntryPointByVersion@12000", crc);
    EXPECT_RC(crc, CUDA_SUCCESS, "cuMemCreate via cudaGetDriverEntryPointByVersion");
    crc = ((CUresult(*)(CUmemGenericAllocationHandle))fr)(mh);
    emit("free", "cuMemRelease", 0, "handle", mh, vsize,
         "via=cudaGetDriverEntryPointByVersion@12000", crc);
    EXPECT_RC(crc, CUDA_SUCCESS, "cuMemRelease via cudaGetDriverEntryPointByVersion");

    /* Misses through the runtime. */
    void *fx = (void *)0x1;
    rc = cudaGetDriverEntryPoint("cuDoesNotExist", &fx, cudaEnableDefault, &st);
    out("lookup cudaGetDriverEntryPoint symbol=cuDoesNotExist flags=0 status=%d pfn=0x%llx "
        "rc=%d",
        (int)st, P(fx), rc);
    EXPECT_RC(rc, cudaSuccess, "cudaGetDriverEntryPoint(cuDoesNotExist)");
    EXPECT_RC(st, cudaDriverEntryPointSymbolNotFound, "status of cuDoesNotExist");
    if (fx)
        die("unknown symbol gave a pointer");
    void *fp = NULL;
    rc = cudaGetDriverEntryPoint("cuMemAllocAsync", &fp, cudaEnablePerThreadDefaultStream, &st);
    out("lookup cudaGetDriverEntryPoint symbol=cuMemAllocAsync flags=2 status=%d pfn=0x%llx "
        "rc=%d",
        (int)st, P(fp), rc);
    EXPECT_RC(rc, cudaSuccess, "cudaGetDriverEntryPoint(cuMemAllocAsync, ptds)");
    CUdeviceptr ap = 0;
    crc = ((CUresult(*)(CUdeviceptr *, size_t, CUstream))fp)(&ap, 1 * MiB, NULL);
    emit("alloc", "cuMemAllocAsync_ptsz", cur_dev(), "addr", ap, 1 * MiB,
         "stream=0x0 via=cudaGetDriverEntryPoint/f2", crc);
    EXPECT_RC(crc, CUDA_SUCCESS, "cuMemAllocAsync_ptsz via cudaGetDriverEntryPoint");
    rc = cudaFree((void *)(uintptr_t)ap);
    emit("free", "cudaFree", cur_dev(), "addr", ap, 1 * MiB, NULL, rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFree");

    info("dev1-end");
    rc = cudaSetDevice(0);
    EXPECT_RC(rc, cudaSuccess, "cudaSetDevice(0)");
    info("end");
    out("done runtime");
    return 0;
}

/*
 * own_zstd: a program that uses the system's libzstd (dlopen of libzstd.so.1, as no zstd
 * headers are assumed) while allocating device memory, so that the recorder compresses its
 * chunks with its own, statically linked zstd at the same time. The preloaded recorder must
 * neither export zstd symbols into the program's global scope nor change what the system
 * library does.
 *
 * Usage: own_zstd PAIRS. Exit 3 when the system has no libzstd.so.1.
 */
#include "common.h"
#include "cuda.h"

#include <dlfcn.h>
#include <stdint.h>

typedef unsigned (*version_fn)(void);
typedef size_t (*bound_fn)(size_t);
typedef size_t (*compress_fn)(void *, size_t, const void *, size_t, int);
typedef size_t (*decompress_fn)(void *, size_t, const void *, size_t);
typedef unsigned (*is_error_fn)(size_t);

static void *sym(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p)
        die("dlsym(%s): %s", name, dlerror());
    return p;
}

int main(int argc, char **argv)
{
    g_prog = "own_zstd";
    long pairs = argc > 1 ? atol(argv[1]) : 50000;

    /* Global scope: the program, its libraries and every preload. */
    out("global ZSTD_compress=%s ZSTD_versionNumber=%s",
        dlsym(RTLD_DEFAULT, "ZSTD_compress") ? "present" : "absent",
        dlsym(RTLD_DEFAULT, "ZSTD_versionNumber") ? "present" : "absent");

    void *h = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        out("no system libzstd.so.1: %s", dlerror());
        return 3;
    }
    version_fn version = (version_fn)sym(h, "ZSTD_versionNumber");
    bound_fn bound = (bound_fn)sym(h, "ZSTD_compressBound");
    compress_fn compress = (compress_fn)sym(h, "ZSTD_compress");
    decompress_fn decompress = (decompress_fn)sym(h, "ZSTD_decompress");
    is_error_fn is_error = (is_error_fn)sym(h, "ZSTD_isError");
    Dl_info info;
    if (!dladdr((void *)compress, &info) || !info.dli_fname)
        die("dladdr(ZSTD_compress) failed");
    const char *base = strrchr(info.dli_fname, '/');
    out("zstd version=%u compress_from=%s", version(), base ? base + 1 : info.dli_fname);

    /* A compressible buffer the library round-trips every 1000 pairs. */
    enum { LEN = 64 << 10 };
    static unsigned char input[LEN], output[LEN];
    for (size_t i = 0; i < LEN; i++)
        input[i] = (unsigned char)("vramshim own zstd "[i % 18] ^ (i >> 12));
    size_t cap = bound(LEN);
    unsigned char *packed = malloc(cap);
    if (!packed)
        die("malloc");

    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    CUcontext ctx;
    EXPECT_RC(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    EXPECT_RC(cuCtxSetCurrent(ctx), CUDA_SUCCESS, "cuCtxSetCurrent");

    long roundtrips = 0;
    size_t packed_len = 0;
    for (long i = 0; i < pairs; i++) {
        CUdeviceptr p = 0;
        EXPECT_RC(cuMemAlloc_v2(&p, 4096), CUDA_SUCCESS, "cuMemAlloc_v2");
        EXPECT_RC(cuMemFree_v2(p), CUDA_SUCCESS, "cuMemFree_v2");
        if (i % 1000 == 0) {
            size_t n = compress(packed, cap, input, LEN, 3);
            if (is_error(n))
                die("ZSTD_compress failed at pair %ld", i);
            size_t back = decompress(output, LEN, packed, n);
            if (is_error(back) || back != LEN || memcmp(input, output, LEN) != 0)
                die("ZSTD_decompress did not give the input back at pair %ld", i);
            if (packed_len && n != packed_len)
                die("ZSTD_compress gave %zu bytes, earlier %zu", n, packed_len);
            packed_len = n;
            roundtrips++;
        }
    }
    out("done pairs=%ld roundtrips=%ld packed=%zu", pairs, roundtrips, packed_len);
    free(packed);
    return 0;
}

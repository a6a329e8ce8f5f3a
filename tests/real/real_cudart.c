/*
 * real_cudart.c - drive the REAL libcudart.so.12 on a machine without a GPU.
 *
 * usage: real_cudart [path/to/libcudart.so.12]
 *   default: "libcudart.so.12" found through LD_LIBRARY_PATH (which must also hold
 *   libcuda.so.1; see scripts/fetch-real-cuda.sh).
 *
 * Calls cudaGetDeviceCount, cudaDriverGetVersion, cudaRuntimeGetVersion, a few memory calls,
 * and cudaGetDriverEntryPoint / cudaGetDriverEntryPointByVersion, printing every result as
 * "key: value" lines on stdout. Exit 0 when libcudart could be loaded and every symbol was
 * found (CUDA errors such as "no device" are results, not failures); 2 otherwise.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*int_ptr_fn)(int *);
typedef const char *(*err_name_fn)(int);
typedef int (*entry_fn)(const char *, void **, unsigned long long, int *);
typedef int (*entry_ver_fn)(const char *, void **, unsigned int, unsigned long long, int *);
typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);
typedef int (*meminfo_fn)(size_t *, size_t *);

static void *rt;
static err_name_fn err_name;

static void *need(const char *name)
{
    void *p = dlsym(rt, name);
    if (!p) {
        fprintf(stderr, "real_cudart: %s not found in libcudart: %s\n", name, dlerror());
        exit(2);
    }
    return p;
}

static const char *ename(int e)
{
    const char *s = err_name ? err_name(e) : NULL;
    return s ? s : "?";
}

/* Exported name and object of a function pointer. */
static void describe(const void *p, char *buf, size_t n)
{
    Dl_info di;
    if (!p) {
        snprintf(buf, n, "-");
        return;
    }
    if (!dladdr(p, &di) || !di.dli_fname) {
        snprintf(buf, n, "(not in any object)");
        return;
    }
    const char *f = strrchr(di.dli_fname, '/');
    f = f ? f + 1 : di.dli_fname;
    if (di.dli_sname && di.dli_saddr == p)
        snprintf(buf, n, "%s in %s", di.dli_sname, f);
    else if (di.dli_sname)
        snprintf(buf, n, "%s+0x%lx in %s", di.dli_sname, (unsigned long)((const char *)p - (const char *)di.dli_saddr), f);
    else
        snprintf(buf, n, "+0x%lx in %s", (unsigned long)((const char *)p - (const char *)di.dli_fbase), f);
}

static void entry(entry_fn fn, const char *sym, unsigned long long flags)
{
    void *p = (void *)0x1;
    int st = -1;
    char d[256];
    printf("# cudaGetDriverEntryPoint(\"%s\", flags=%llu)\n", sym, flags);
    fflush(stdout);
    int rc = fn(sym, &p, flags, &st);
    describe(p, d, sizeof d);
    printf("cudaGetDriverEntryPoint(%s,%llu): rc=%d (%s) status=%d pfn=%p = %s\n", sym, flags, rc, ename(rc), st, p, d);
    fflush(stdout);
}

static void entry_ver(entry_ver_fn fn, const char *sym, unsigned ver, unsigned long long flags)
{
    void *p = (void *)0x1;
    int st = -1;
    char d[256];
    printf("# cudaGetDriverEntryPointByVersion(\"%s\", %u, flags=%llu)\n", sym, ver, flags);
    fflush(stdout);
    int rc = fn(sym, &p, ver, flags, &st);
    describe(p, d, sizeof d);
    printf("cudaGetDriverEntryPointByVersion(%s,%u,%llu): rc=%d (%s) status=%d pfn=%p = %s\n", sym, ver, flags, rc,
           ename(rc), st, p, d);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "libcudart.so.12";
    setvbuf(stdout, NULL, _IOLBF, 0);
    rt = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!rt) {
        fprintf(stderr, "real_cudart: cannot load %s: %s\n", path, dlerror());
        return 2;
    }
    struct link_map *lm = NULL;
    if (dlinfo(rt, RTLD_DI_LINKMAP, &lm) == 0 && lm)
        printf("libcudart: %s\n", lm->l_name);
    err_name = (err_name_fn)need("cudaGetErrorName");
    int_ptr_fn get_count = (int_ptr_fn)need("cudaGetDeviceCount");
    int_ptr_fn drv_ver = (int_ptr_fn)need("cudaDriverGetVersion");
    int_ptr_fn rt_ver = (int_ptr_fn)need("cudaRuntimeGetVersion");
    entry_fn get_entry = (entry_fn)need("cudaGetDriverEntryPoint");
    entry_ver_fn get_entry_ver = (entry_ver_fn)need("cudaGetDriverEntryPointByVersion");
    malloc_fn cmalloc = (malloc_fn)need("cudaMalloc");
    free_fn cfree = (free_fn)need("cudaFree");
    meminfo_fn meminfo = (meminfo_fn)need("cudaMemGetInfo");

    int v = -1, rc;
    printf("# cudaRuntimeGetVersion\n");
    rc = rt_ver(&v);
    printf("cudaRuntimeGetVersion: rc=%d (%s) version=%d\n", rc, ename(rc), v);

    v = -1;
    printf("# cudaDriverGetVersion\n");
    rc = drv_ver(&v);
    printf("cudaDriverGetVersion: rc=%d (%s) version=%d\n", rc, ename(rc), v);

    v = -1;
    printf("# cudaGetDeviceCount\n");
    rc = get_count(&v);
    printf("cudaGetDeviceCount: rc=%d (%s) count=%d\n", rc, ename(rc), v);

    v = -1;
    printf("# cudaGetDeviceCount (again)\n");
    rc = get_count(&v);
    printf("cudaGetDeviceCount(again): rc=%d (%s) count=%d\n", rc, ename(rc), v);

    entry(get_entry, "cuMemAlloc", 0);
    entry(get_entry, "cuMemAllocAsync", 0);
    entry(get_entry, "cuMemAllocAsync", 2);
    entry(get_entry, "cuMemCreate", 0);
    entry(get_entry, "cuNoSuchFunction", 0);
    entry_ver(get_entry_ver, "cuMemAlloc", 3020, 0);
    entry_ver(get_entry_ver, "cuMemAlloc", 3000, 0);
    entry_ver(get_entry_ver, "cuMemAllocAsync", 10000, 0);
    entry_ver(get_entry_ver, "cuMemAllocAsync", 11020, 2);

    void *dp = (void *)0x1;
    printf("# cudaMalloc\n");
    rc = cmalloc(&dp, 1 << 20);
    printf("cudaMalloc: rc=%d (%s) ptr=%p\n", rc, ename(rc), dp);
    printf("# cudaFree(NULL)\n");
    rc = cfree(NULL);
    printf("cudaFree(NULL): rc=%d (%s)\n", rc, ename(rc));
    size_t fr = 1, tot = 1;
    printf("# cudaMemGetInfo\n");
    rc = meminfo(&fr, &tot);
    printf("cudaMemGetInfo: rc=%d (%s) free=%zu total=%zu\n", rc, ename(rc), fr, tot);

    /* Is the driver library still loaded (the runtime may dlclose it after a failed init)? */
    void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    printf("libcuda.so.1 loaded at exit: %s\n", cu ? "yes" : "no");
    if (cu)
        dlclose(cu);
    return 0;
}

/*
 * real_driver.c - call the REAL libcuda.so.1 directly on a machine without a GPU.
 *
 * usage: real_driver [path/to/libcuda.so.1]   (default "libcuda.so.1" via LD_LIBRARY_PATH)
 *
 * Prints "key: value" lines: what the resolver (cuGetProcAddress_v2) answers for an empty
 * name, an unknown name, a too-low version and a table of memory entry points; what cuInit,
 * cuMemGetInfo_v2, cuCtxGetDevice, ... return before and after cuInit. Risky calls run in a
 * forked child so a crash is reported instead of ending the run.
 * Exit 0 when libcuda could be loaded and the resolver found; 2 otherwise.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int (*gpa2_fn)(const char *, void **, int, unsigned long long, int *);
typedef int (*gpa1_fn)(const char *, void **, int, unsigned long long);
typedef int (*init_fn)(unsigned);
typedef int (*int_ptr_fn)(int *);
typedef int (*meminfo_fn)(size_t *, size_t *);
typedef int (*alloc_fn)(unsigned long long *, size_t);
typedef int (*errname_fn)(int, const char **);

static void *cu;
static gpa2_fn gpa2;
static errname_fn err_name;

static const char *ename(int e)
{
    const char *s = NULL;
    if (!err_name || err_name(e, &s) != 0 || !s)
        return "?";
    return s;
}

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
        snprintf(buf, n, "%s", di.dli_sname);
    else if (di.dli_sname)
        snprintf(buf, n, "%s+0x%lx in %s", di.dli_sname, (unsigned long)((const char *)p - (const char *)di.dli_saddr), f);
    else
        snprintf(buf, n, "+0x%lx in %s", (unsigned long)((const char *)p - (const char *)di.dli_fbase), f);
}

/* Every exported name equal to p (dladdr reports only one of several aliases). */
static const char *const alias_candidates[] = {
    "cuMemAlloc", "cuMemAlloc_v2", "cuMemFree", "cuMemFree_v2", "cuMemAllocPitch", "cuMemAllocPitch_v2",
    "cuMemAllocHost", "cuMemAllocHost_v2", "cuMemGetInfo", "cuMemGetInfo_v2", "cuArrayCreate",
    "cuArrayCreate_v2", "cuGetProcAddress", "cuGetProcAddress_v2", "cuCtxGetDevice", "cuIpcOpenMemHandle",
    "cuIpcOpenMemHandle_v2", "cuMemHostRegister", "cuMemHostRegister_v2", "cuArray3DCreate",
    "cuArray3DCreate_v2", NULL};

static void name_of(const void *p, char *buf, size_t n)
{
    describe(p, buf, n);
    if (!p)
        return;
    size_t used = strlen(buf);
    for (int i = 0; alias_candidates[i]; i++) {
        void *q = dlsym(cu, alias_candidates[i]);
        if (q == p && strcmp(alias_candidates[i], buf) != 0 && !strstr(buf, " in ")) {
            int w = snprintf(buf + used, n - used, "|%s", alias_candidates[i]);
            if (w > 0 && (size_t)w < n - used)
                used += (size_t)w;
        }
    }
}

static void q(const char *tag, const char *sym, int ver, unsigned long long flags)
{
    void *p = (void *)0x1;
    int st = -77;
    char d[256];
    int rc = gpa2(sym, &p, ver, flags, &st);
    name_of(p, d, sizeof d);
    printf("%s: gpa2(\"%s\", %d, %llu) rc=%d (%s) status=%d pfn=%p = %s\n", tag, sym ? sym : "(null)", ver, flags,
           rc, ename(rc), st, p, d);
}

/* Run fn in a child; report a crash instead of dying. */
static void guarded(const char *what, void (*fn)(void))
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        fn();
        fflush(stdout);
        _exit(0);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    if (WIFSIGNALED(ws))
        printf("%s: CRASHED with signal %d\n", what, WTERMSIG(ws));
}

static void null_symbol(void) { q("null-symbol", NULL, 12000, 0); }
static void null_pfn(void)
{
    int st = -77;
    int rc = gpa2("cuMemAlloc", NULL, 12000, 0, &st);
    printf("null-pfn: gpa2(\"cuMemAlloc\", pfn=NULL, 12000, 0) rc=%d (%s) status=%d\n", rc, ename(rc), st);
}
static void null_status(void)
{
    void *p = (void *)0x1;
    char d[256];
    int rc = gpa2("cuMemAlloc", &p, 12000, 0, NULL);
    name_of(p, d, sizeof d);
    printf("null-status: gpa2(\"cuMemAlloc\", 12000, 0, status=NULL) rc=%d (%s) pfn=%p = %s\n", rc, ename(rc), p, d);
}

static void state(const char *when)
{
    int_ptr_fn ctx_dev = (int_ptr_fn)dlsym(cu, "cuCtxGetDevice");
    meminfo_fn meminfo = (meminfo_fn)dlsym(cu, "cuMemGetInfo_v2");
    int_ptr_fn dev_count = (int_ptr_fn)dlsym(cu, "cuDeviceGetCount");
    int_ptr_fn drv_ver = (int_ptr_fn)dlsym(cu, "cuDriverGetVersion");
    alloc_fn alloc = (alloc_fn)dlsym(cu, "cuMemAlloc_v2");
    int v = -1, rc;
    rc = drv_ver(&v);
    printf("%s: cuDriverGetVersion rc=%d (%s) version=%d\n", when, rc, ename(rc), v);
    v = -1;
    rc = dev_count(&v);
    printf("%s: cuDeviceGetCount rc=%d (%s) count=%d\n", when, rc, ename(rc), v);
    v = -1;
    rc = ctx_dev(&v);
    printf("%s: cuCtxGetDevice rc=%d (%s) dev=%d\n", when, rc, ename(rc), v);
    size_t fr = 1, tot = 1;
    rc = meminfo(&fr, &tot);
    printf("%s: cuMemGetInfo_v2 rc=%d (%s) free=%zu total=%zu\n", when, rc, ename(rc), fr, tot);
    unsigned long long dp = 1;
    rc = alloc(&dp, 1 << 20);
    printf("%s: cuMemAlloc_v2 rc=%d (%s) dptr=0x%llx\n", when, rc, ename(rc), dp);
}

static const struct {
    const char *name;
} table[] = {
    {"cuMemAlloc"}, {"cuMemFree"}, {"cuMemAllocPitch"}, {"cuMemAllocHost"}, {"cuMemHostAlloc"},
    {"cuMemFreeHost"}, {"cuMemAllocManaged"}, {"cuMemGetInfo"}, {"cuMemHostRegister"}, {"cuMemHostUnregister"},
    {"cuMemAllocAsync"}, {"cuMemFreeAsync"}, {"cuMemAllocFromPoolAsync"}, {"cuMemPoolCreate"},
    {"cuMemPoolTrimTo"}, {"cuMemCreate"}, {"cuMemRelease"}, {"cuMemMap"}, {"cuMemUnmap"},
    {"cuMemAddressReserve"}, {"cuMemAddressFree"}, {"cuArrayCreate"}, {"cuArray3DCreate"}, {"cuArrayDestroy"},
    {"cuMipmappedArrayCreate"}, {"cuIpcOpenMemHandle"}, {"cuIpcCloseMemHandle"}, {"cuMulticastCreate"},
    {"cuCtxGetDevice"}, {"cuGetProcAddress"}, {"cuMemcpyAsync"}, {"cuInit"},
};
static const int versions[] = {2000, 3000, 3020, 4000, 6000, 7000, 11020, 11030, 12000, 12010, 12020, 12090, 13000};

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "libcuda.so.1";
    setvbuf(stdout, NULL, _IOLBF, 0);
    cu = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!cu) {
        fprintf(stderr, "real_driver: cannot load %s: %s\n", path, dlerror());
        return 2;
    }
    gpa2 = (gpa2_fn)dlsym(cu, "cuGetProcAddress_v2");
    gpa1_fn gpa1 = (gpa1_fn)dlsym(cu, "cuGetProcAddress");
    err_name = (errname_fn)dlsym(cu, "cuGetErrorName");
    init_fn cu_init = (init_fn)dlsym(cu, "cuInit");
    if (!gpa2 || !gpa1 || !cu_init) {
        fprintf(stderr, "real_driver: resolver/cuInit not found in %s\n", path);
        return 2;
    }

    printf("== before cuInit\n");
    state("pre-init");
    q("pre-init empty", "", 12000, 0);
    q("pre-init unknown", "cuNoSuchFunction", 12000, 0);
    q("pre-init too-low", "cuMemAllocAsync", 10000, 0);
    q("pre-init ok", "cuMemAlloc", 3020, 0);
    q("pre-init gpa", "cuGetProcAddress", 12000, 0);

    printf("== cuInit\n");
    int rc = cu_init(0);
    printf("cuInit(0): rc=%d (%s)\n", rc, ename(rc));
    rc = cu_init(0);
    printf("cuInit(0) again: rc=%d (%s)\n", rc, ename(rc));

    printf("== after cuInit\n");
    state("post-init");
    q("empty", "", 12000, 0);
    q("empty", "", 0, 0);
    q("unknown", "cuNoSuchFunction", 12000, 0);
    q("unknown-flags2", "cuNoSuchFunction", 12000, 2);
    q("too-low", "cuMemAllocAsync", 10000, 0);
    q("too-low", "cuMemAllocAsync", 11010, 0);
    q("exact-min", "cuMemAllocAsync", 11020, 0);
    q("exported-name", "cuMemAlloc_v2", 12000, 0);
    q("exported-name", "cuMemAllocAsync_ptsz", 12000, 0);
    q("flags1", "cuMemAllocAsync", 12000, 1);
    q("flags2", "cuMemAllocAsync", 12000, 2);
    q("flags3", "cuMemAllocAsync", 12000, 3);
    q("flags4", "cuMemAllocAsync", 12000, 4);
    q("version0", "cuMemAlloc", 0, 0);
    q("version-1", "cuMemAlloc", -1, 0);
    guarded("null-symbol", null_symbol);
    guarded("null-pfn", null_pfn);
    guarded("null-status", null_status);
    {
        void *p = (void *)0x1;
        char d[256];
        rc = gpa1("cuMemAlloc", &p, 3020, 0);
        name_of(p, d, sizeof d);
        printf("gpa1(\"cuMemAlloc\", 3020, 0): rc=%d (%s) pfn=%p = %s\n", rc, ename(rc), p, d);
        p = (void *)0x1;
        rc = gpa1("cuNoSuchFunction", &p, 12000, 0);
        printf("gpa1(\"cuNoSuchFunction\", 12000, 0): rc=%d (%s) pfn=%p\n", rc, ename(rc), p);
        p = (void *)0x1;
        rc = gpa1("cuMemAllocAsync", &p, 10000, 0);
        printf("gpa1(\"cuMemAllocAsync\", 10000, 0): rc=%d (%s) pfn=%p\n", rc, ename(rc), p);
    }

    printf("== table: base name x version x flags\n");
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        for (size_t j = 0; j < sizeof versions / sizeof versions[0]; j++)
            for (unsigned long long f = 0; f <= 2; f += 2)
                q("table", table[i].name, versions[j], f);
    return 0;
}

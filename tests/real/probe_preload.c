/*
 * probe_preload.c - LD_PRELOAD logger for investigating how the real libcudart reaches the
 * real libcuda. Not part of the shim; a tool for finding facts (see docs/real-cuda-probe.md).
 *
 * Exports dlopen, dlmopen, dlclose, dlsym and dlvsym as small assembly stubs that log the call
 * (through a C hook) and then TAIL-JUMP to glibc's function, so glibc still sees the original
 * caller's return address (RTLD_NEXT, $ORIGIN/RUNPATH of dlopen and namespaces stay right).
 * For dlsym/dlvsym on a real handle the hook does the look-up itself; when the name asked for is
 * cuGetProcAddress_v2 / cuGetProcAddress and the result lies in libcuda, a logging wrapper of
 * the resolver is returned instead. The wrapper logs every look-up (symbol, version, flags,
 * rc, status, pointer, and every exported libcuda name equal to that pointer), and when the
 * resolver is asked for "cuGetProcAddress" itself it hands out another logging wrapper, so
 * later look-ups through that pointer are logged too.
 *
 * A few driver functions (cuInit, cuDriverGetVersion, cuDeviceGetCount, cuCtxGetDevice,
 * cuMemGetInfo_v2, cuMemAlloc_v2, cuMemFree_v2) handed out by the resolver are replaced by call
 * loggers (PROBE_NO_CALL_LOG=1 turns that off). PROBE_FAKE_INIT=1 makes cuInit report success.
 *
 * Log lines go to stderr (or to the file named by PROBE_LOG), prefixed "[probe]".
 * x86_64 Linux, glibc >= 2.34.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HIDDEN __attribute__((visibility("hidden"), used))

/* Real glibc entry points; read by the assembly stubs. */
HIDDEN void *probe_real_dlsym;
HIDDEN void *probe_real_dlvsym;
HIDDEN void *probe_real_dlopen;
HIDDEN void *probe_real_dlmopen;
HIDDEN void *probe_real_dlclose;

typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);

static pthread_mutex_t probe_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static FILE *probe_out;
static unsigned long probe_seq;

__attribute__((format(printf, 1, 2))) static void logf_(const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&probe_lock);
    FILE *f = probe_out ? probe_out : stderr;
    fprintf(f, "[probe] %04lu ", ++probe_seq);
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fflush(f);
    pthread_mutex_unlock(&probe_lock);
}

/* Short file name of the object containing address p. */
static const char *obj_of(const void *p)
{
    Dl_info di;
    if (!p || !dladdr(p, &di) || !di.dli_fname)
        return "?";
    const char *s = strrchr(di.dli_fname, '/');
    return s ? s + 1 : (*di.dli_fname ? di.dli_fname : "main");
}

static const char *handle_name(void *h)
{
    struct link_map *lm = NULL;
    if (h == RTLD_DEFAULT)
        return "RTLD_DEFAULT";
    if (h == RTLD_NEXT)
        return "RTLD_NEXT";
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || !lm)
        return "?";
    const char *s = strrchr(lm->l_name, '/');
    return s ? s + 1 : (*lm->l_name ? lm->l_name : "main");
}

/* ---------------------------------------------------------------- exported-name table */

struct symtab {
    const struct link_map *lm;
    const ElfW(Sym) *sym;
    const char *str;
    size_t n;
};
static struct symtab cached_tab;

static uintptr_t dyn_ptr(const struct link_map *lm, ElfW(Addr) v)
{
    /* glibc relocates d_ptr in l_ld on x86_64; be tolerant if it did not. */
    return v < lm->l_addr ? lm->l_addr + v : v;
}

static int load_symtab(const struct link_map *lm, struct symtab *t)
{
    const uint32_t *hash = NULL, *gnu = NULL;
    memset(t, 0, sizeof *t);
    for (const ElfW(Dyn) *d = lm->l_ld; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: t->sym = (const ElfW(Sym) *)dyn_ptr(lm, d->d_un.d_ptr); break;
        case DT_STRTAB: t->str = (const char *)dyn_ptr(lm, d->d_un.d_ptr); break;
        case DT_HASH: hash = (const uint32_t *)dyn_ptr(lm, d->d_un.d_ptr); break;
        case DT_GNU_HASH: gnu = (const uint32_t *)dyn_ptr(lm, d->d_un.d_ptr); break;
        }
    }
    if (!t->sym || !t->str)
        return -1;
    if (hash) {
        t->n = hash[1];
    } else if (gnu) {
        uint32_t nb = gnu[0], off = gnu[1], bloom = gnu[2];
        const uint32_t *buckets = gnu + 4 + bloom * (sizeof(ElfW(Addr)) / 4);
        const uint32_t *chain = buckets + nb;
        uint32_t max = 0;
        for (uint32_t i = 0; i < nb; i++)
            if (buckets[i] > max)
                max = buckets[i];
        if (max < off) {
            t->n = off;
        } else {
            while (!(chain[max - off] & 1))
                max++;
            t->n = max + 1;
        }
    } else {
        return -1;
    }
    t->lm = lm;
    return 0;
}

/* Every exported name of the object holding p whose address equals p, joined with '|'.
 * (IFUNC symbols, e.g. in libm, are not matched: their st_value is the resolver.) */
static void names_of(const void *p, char *buf, size_t len)
{
    Dl_info di;
    struct link_map *lm = NULL;
    buf[0] = 0;
    if (!p) {
        snprintf(buf, len, "-");
        return;
    }
    if (!dladdr1(p, &di, (void **)&lm, RTLD_DL_LINKMAP) || !lm) {
        snprintf(buf, len, "(not in any object)");
        return;
    }
    pthread_mutex_lock(&probe_lock);
    if (cached_tab.lm != lm)
        load_symtab(lm, &cached_tab);
    size_t used = 0;
    if (cached_tab.lm == lm) {
        for (size_t i = 0; i < cached_tab.n; i++) {
            const ElfW(Sym) *s = &cached_tab.sym[i];
            if (s->st_shndx == SHN_UNDEF || !s->st_name)
                continue;
            if ((uintptr_t)(lm->l_addr + s->st_value) != (uintptr_t)p)
                continue;
            int w = snprintf(buf + used, len - used, "%s%s", used ? "|" : "", cached_tab.str + s->st_name);
            if (w < 0 || (size_t)w >= len - used)
                break;
            used += (size_t)w;
        }
    }
    pthread_mutex_unlock(&probe_lock);
    if (!used) {
        if (di.dli_sname)
            snprintf(buf, len, "(no exported name; inside %s+0x%lx in %s)", di.dli_sname,
                     (unsigned long)((uintptr_t)p - (uintptr_t)di.dli_saddr), obj_of(p));
        else
            snprintf(buf, len, "(no exported name; %s+0x%lx)", obj_of(p),
                     (unsigned long)((uintptr_t)p - (uintptr_t)di.dli_fbase));
    }
}

/* Address of glibc's NAME, found in libc's own dynamic symbol table. dlsym/dlvsym cannot be
 * used for this: this library exports both, so a call from here would land in our own stub. */
static void *find_glibc(const char *name)
{
    Dl_info di;
    struct link_map *lm = NULL;
    struct symtab t;
    if (!dladdr1((void *)&fputs, &di, (void **)&lm, RTLD_DL_LINKMAP) || !lm || load_symtab(lm, &t) != 0)
        return NULL;
    for (size_t i = 0; i < t.n; i++) {
        const ElfW(Sym) *s = &t.sym[i];
        if (s->st_shndx != SHN_UNDEF && s->st_name && ELF64_ST_TYPE(s->st_info) == STT_FUNC &&
            strcmp(t.str + s->st_name, name) == 0)
            return (void *)(lm->l_addr + s->st_value);
    }
    return NULL;
}

static void probe_init(void)
{
    if (__atomic_load_n(&probe_real_dlsym, __ATOMIC_ACQUIRE))
        return;
    probe_real_dlvsym = find_glibc("dlvsym");
    probe_real_dlopen = find_glibc("dlopen");
    probe_real_dlmopen = find_glibc("dlmopen");
    probe_real_dlclose = find_glibc("dlclose");
    void *s = find_glibc("dlsym");
    if (!s || !probe_real_dlvsym || !probe_real_dlopen || !probe_real_dlmopen || !probe_real_dlclose) {
        fputs("[probe] FATAL: cannot find glibc's dl* functions\n", stderr);
        abort();
    }
    __atomic_store_n(&probe_real_dlsym, s, __ATOMIC_RELEASE);
}

__attribute__((constructor)) static void probe_ctor(void)
{
    probe_init();
    const char *path = getenv("PROBE_LOG");
    if (path && *path)
        probe_out = fopen(path, "a");
}

/* ---------------------------------------------------------------- resolver wrappers */

typedef int (*gpa2_fn)(const char *, void **, int, unsigned long long, int *);
typedef int (*gpa1_fn)(const char *, void **, int, unsigned long long);

#define NSLOTS 4
static void *slot_real[2][NSLOTS]; /* [0] = v1 ABI, [1] = v2 ABI */
static const char *slot_origin[2][NSLOTS];
static void *slot_wrapper[2][NSLOTS];

static void *wrap_resolver(int v2, void *real, const char *origin);
static void *call_logger_for(void *p, const char *names);

static int gpa_common(int v2, int slot, const char *symbol, void **pfn, int version,
                      unsigned long long flags, int *status, void *caller)
{
    int st = -1;
    int rc;
    if (v2)
        rc = ((gpa2_fn)slot_real[1][slot])(symbol, pfn, version, flags, status ? status : &st);
    else
        rc = ((gpa1_fn)slot_real[0][slot])(symbol, pfn, version, flags);
    if (v2 && status)
        st = *status;
    void *p = pfn ? *pfn : NULL;
    char names[512];
    names_of(p, names, sizeof names);
    char extra[128] = "";
    if (rc == 0 && p && symbol && strcmp(symbol, "cuGetProcAddress") == 0) {
        /* Decide the ABI of the returned resolver from its exported name. */
        int abi_v2;
        if (strstr(names, "cuGetProcAddress_v2"))
            abi_v2 = 1;
        else if (strstr(names, "cuGetProcAddress"))
            abi_v2 = 0;
        else
            abi_v2 = version >= 12000;
        void *w = wrap_resolver(abi_v2, p, "resolver(\"cuGetProcAddress\")");
        if (w) {
            *pfn = w;
            snprintf(extra, sizeof extra, " => replaced by probe wrapper (%s ABI)", abi_v2 ? "v2" : "v1");
        }
    } else if (rc == 0 && p) {
        void *w = call_logger_for(p, names);
        if (w) {
            *pfn = w;
            snprintf(extra, sizeof extra, " => replaced by call logger");
        }
    }
    if (v2)
        logf_("GPA[%s] caller=%s symbol=\"%s\" version=%d flags=%llu -> rc=%d status=%d pfn=%p = %s%s",
              slot_origin[1][slot], obj_of(caller), symbol ? symbol : "(null)", version, flags, rc,
              status ? st : -99, p, names, extra);
    else
        logf_("GPA1[%s] caller=%s symbol=\"%s\" version=%d flags=%llu -> rc=%d pfn=%p = %s%s",
              slot_origin[0][slot], obj_of(caller), symbol ? symbol : "(null)", version, flags, rc, p,
              names, extra);
    return rc;
}

#define GPA_SLOT(n)                                                                                \
    static int gpa2_w##n(const char *s, void **p, int v, unsigned long long f, int *st)            \
    {                                                                                              \
        return gpa_common(1, n, s, p, v, f, st, __builtin_return_address(0));                      \
    }                                                                                              \
    static int gpa1_w##n(const char *s, void **p, int v, unsigned long long f)                     \
    {                                                                                              \
        return gpa_common(0, n, s, p, v, f, NULL, __builtin_return_address(0));                    \
    }
GPA_SLOT(0)
GPA_SLOT(1)
GPA_SLOT(2)
GPA_SLOT(3)

static void *wrap_resolver(int v2, void *real, const char *origin)
{
    static void *const w2[NSLOTS] = {(void *)gpa2_w0, (void *)gpa2_w1, (void *)gpa2_w2, (void *)gpa2_w3};
    static void *const w1[NSLOTS] = {(void *)gpa1_w0, (void *)gpa1_w1, (void *)gpa1_w2, (void *)gpa1_w3};
    void *ret = NULL;
    pthread_mutex_lock(&probe_lock);
    /* One slot per (ABI, real pointer, origin): the log then tells which pointer a caller used. */
    for (int i = 0; i < NSLOTS; i++) {
        if (slot_real[v2][i] == real && strcmp(slot_origin[v2][i], origin) == 0) {
            ret = slot_wrapper[v2][i];
            break;
        }
        if (!slot_real[v2][i]) {
            slot_real[v2][i] = real;
            slot_origin[v2][i] = origin;
            slot_wrapper[v2][i] = v2 ? w2[i] : w1[i];
            ret = slot_wrapper[v2][i];
            break;
        }
    }
    pthread_mutex_unlock(&probe_lock);
    return ret;
}

/* ---------------------------------------------------------------- call loggers
 * A few driver functions with simple signatures get a logging wrapper when the resolver hands
 * them out, so the log shows which driver calls the runtime makes and in what order. */

static void *real_cuInit, *real_cuDriverGetVersion, *real_cuDeviceGetCount, *real_cuCtxGetDevice,
    *real_cuMemGetInfo_v2, *real_cuMemAlloc_v2, *real_cuMemFree_v2;

static int log_cuInit(unsigned flags)
{
    int rc = ((int (*)(unsigned))real_cuInit)(flags);
    /* PROBE_FAKE_INIT=1: pretend cuInit succeeded, to see what the runtime does next. */
    const char *fake = getenv("PROBE_FAKE_INIT");
    if (fake && *fake == '1') {
        logf_("CALL cuInit(%u) caller=%s -> rc=%d, FAKED to 0", flags, obj_of(__builtin_return_address(0)), rc);
        return 0;
    }
    logf_("CALL cuInit(%u) caller=%s -> rc=%d", flags, obj_of(__builtin_return_address(0)), rc);
    return rc;
}
static int log_cuDriverGetVersion(int *v)
{
    int rc = ((int (*)(int *))real_cuDriverGetVersion)(v);
    logf_("CALL cuDriverGetVersion caller=%s -> rc=%d version=%d", obj_of(__builtin_return_address(0)), rc,
          v ? *v : -1);
    return rc;
}
static int log_cuDeviceGetCount(int *v)
{
    int rc = ((int (*)(int *))real_cuDeviceGetCount)(v);
    logf_("CALL cuDeviceGetCount caller=%s -> rc=%d count=%d", obj_of(__builtin_return_address(0)), rc,
          v ? *v : -1);
    return rc;
}
static int log_cuCtxGetDevice(int *v)
{
    int rc = ((int (*)(int *))real_cuCtxGetDevice)(v);
    logf_("CALL cuCtxGetDevice caller=%s -> rc=%d dev=%d", obj_of(__builtin_return_address(0)), rc, v ? *v : -1);
    return rc;
}
static int log_cuMemGetInfo_v2(size_t *f, size_t *t)
{
    int rc = ((int (*)(size_t *, size_t *))real_cuMemGetInfo_v2)(f, t);
    logf_("CALL cuMemGetInfo_v2 caller=%s -> rc=%d", obj_of(__builtin_return_address(0)), rc);
    return rc;
}
static int log_cuMemAlloc_v2(unsigned long long *d, size_t n)
{
    int rc = ((int (*)(unsigned long long *, size_t))real_cuMemAlloc_v2)(d, n);
    logf_("CALL cuMemAlloc_v2(%zu) caller=%s -> rc=%d", n, obj_of(__builtin_return_address(0)), rc);
    return rc;
}
static int log_cuMemFree_v2(unsigned long long d)
{
    int rc = ((int (*)(unsigned long long))real_cuMemFree_v2)(d);
    logf_("CALL cuMemFree_v2(0x%llx) caller=%s -> rc=%d", d, obj_of(__builtin_return_address(0)), rc);
    return rc;
}

static const struct {
    const char *name;
    void **real;
    void *wrapper;
} call_loggers[] = {
    {"cuInit", &real_cuInit, (void *)log_cuInit},
    {"cuDriverGetVersion", &real_cuDriverGetVersion, (void *)log_cuDriverGetVersion},
    {"cuDeviceGetCount", &real_cuDeviceGetCount, (void *)log_cuDeviceGetCount},
    {"cuCtxGetDevice", &real_cuCtxGetDevice, (void *)log_cuCtxGetDevice},
    {"cuMemGetInfo_v2", &real_cuMemGetInfo_v2, (void *)log_cuMemGetInfo_v2},
    {"cuMemAlloc_v2", &real_cuMemAlloc_v2, (void *)log_cuMemAlloc_v2},
    {"cuMemFree_v2", &real_cuMemFree_v2, (void *)log_cuMemFree_v2},
};

/* names: '|'-joined exported names of p. Returns a logging wrapper or NULL. */
static void *call_logger_for(void *p, const char *names)
{
    if (getenv("PROBE_NO_CALL_LOG"))
        return NULL;
    for (size_t i = 0; i < sizeof call_loggers / sizeof call_loggers[0]; i++) {
        size_t n = strlen(call_loggers[i].name);
        const char *h = names;
        while ((h = strstr(h, call_loggers[i].name)) != NULL) {
            if ((h == names || h[-1] == '|') && (h[n] == 0 || h[n] == '|')) {
                *call_loggers[i].real = p;
                return call_loggers[i].wrapper;
            }
            h += n;
        }
    }
    return NULL;
}

/* ---------------------------------------------------------------- hooks called by the stubs */

static int is_libcuda(const void *p)
{
    return strncmp(obj_of(p), "libcuda.so", 10) == 0;
}

static void *maybe_wrap(const char *name, void *r, const char *how, char *extra, size_t n)
{
    if (!r || !name || !is_libcuda(r))
        return r;
    void *w = NULL;
    if (strcmp(name, "cuGetProcAddress_v2") == 0)
        w = wrap_resolver(1, r, how[0] == 'v' ? "dlvsym(cuGetProcAddress_v2)" : "dlsym(cuGetProcAddress_v2)");
    else if (strcmp(name, "cuGetProcAddress") == 0)
        w = wrap_resolver(0, r, how[0] == 'v' ? "dlvsym(cuGetProcAddress)" : "dlsym(cuGetProcAddress)");
    if (w) {
        snprintf(extra, n, " => replaced by probe wrapper");
        return w;
    }
    return r;
}

HIDDEN void *probe_hook_dlsym(void *handle, const char *name, long a2, long a3, long *handled, void *caller)
{
    (void)a2;
    (void)a3;
    probe_init();
    if (handle == RTLD_DEFAULT || handle == RTLD_NEXT) {
        logf_("dlsym(%s, \"%s\") caller=%s [passed through]", handle_name(handle), name ? name : "(null)",
              obj_of(caller));
        return NULL;
    }
    void *r = ((dlsym_fn)probe_real_dlsym)(handle, name);
    char names[512], extra[64] = "";
    names_of(r, names, sizeof names);
    void *ret = maybe_wrap(name, r, "s", extra, sizeof extra);
    logf_("dlsym(handle=%p <%s>, \"%s\") caller=%s -> %p = %s in %s%s", handle, handle_name(handle),
          name ? name : "(null)", obj_of(caller), r, names, obj_of(r), extra);
    *handled = 1;
    return ret;
}

HIDDEN void *probe_hook_dlvsym(void *handle, const char *name, const char *ver, long a3, long *handled,
                               void *caller)
{
    (void)a3;
    probe_init();
    if (handle == RTLD_DEFAULT || handle == RTLD_NEXT) {
        logf_("dlvsym(%s, \"%s\", \"%s\") caller=%s [passed through]", handle_name(handle),
              name ? name : "(null)", ver ? ver : "(null)", obj_of(caller));
        return NULL;
    }
    void *r = ((dlvsym_fn)probe_real_dlvsym)(handle, name, ver);
    char names[512], extra[64] = "";
    names_of(r, names, sizeof names);
    void *ret = maybe_wrap(name, r, "v", extra, sizeof extra);
    logf_("dlvsym(handle=%p <%s>, \"%s\", \"%s\") caller=%s -> %p = %s%s", handle, handle_name(handle),
          name ? name : "(null)", ver ? ver : "(null)", obj_of(caller), r, names, extra);
    *handled = 1;
    return ret;
}

HIDDEN void *probe_hook_dlopen(const char *file, long mode, long a2, long a3, long *handled, void *caller)
{
    (void)a2;
    (void)a3;
    (void)handled;
    probe_init();
    logf_("dlopen(\"%s\", 0x%lx) caller=%s", file ? file : "(null)", mode, obj_of(caller));
    return NULL;
}

HIDDEN void *probe_hook_dlmopen(long lmid, const char *file, long mode, long a3, long *handled, void *caller)
{
    (void)a3;
    (void)handled;
    probe_init();
    logf_("dlmopen(lmid=%ld, \"%s\", 0x%lx) caller=%s", lmid, file ? file : "(null)", mode, obj_of(caller));
    return NULL;
}

HIDDEN void *probe_hook_dlclose(void *handle, long a1, long a2, long a3, long *handled, void *caller)
{
    (void)a1;
    (void)a2;
    (void)a3;
    (void)handled;
    probe_init();
    logf_("dlclose(handle=%p <%s>) caller=%s", handle, handle_name(handle), obj_of(caller));
    return NULL;
}

/*
 * Stub: save the argument registers, call probe_hook_NAME(a0, a1, a2, a3, &handled, caller),
 * restore; if the hook set handled, return its result, else tail-jump to glibc.
 * At entry %rsp = 8 (mod 16); after 4 pushes and "sub $8" it is 0 (mod 16) for the call.
 * (%rsp) = handled flag, 40(%rsp) = our caller's return address.
 */
#define STUB(name)                                                                                 \
    __asm__(".text\n"                                                                              \
            ".globl " #name "\n"                                                                   \
            ".type " #name ", @function\n" #name ":\n"                                             \
            "  pushq %rdi\n"                                                                       \
            "  pushq %rsi\n"                                                                       \
            "  pushq %rdx\n"                                                                       \
            "  pushq %rcx\n"                                                                       \
            "  subq $8, %rsp\n"                                                                    \
            "  movq $0, (%rsp)\n"                                                                  \
            "  movq %rsp, %r8\n"                                                                   \
            "  movq 40(%rsp), %r9\n"                                                               \
            "  call probe_hook_" #name "\n"                                                        \
            "  movq (%rsp), %r11\n"                                                                \
            "  addq $8, %rsp\n"                                                                    \
            "  popq %rcx\n"                                                                        \
            "  popq %rdx\n"                                                                        \
            "  popq %rsi\n"                                                                        \
            "  popq %rdi\n"                                                                        \
            "  testq %r11, %r11\n"                                                                 \
            "  jz 1f\n"                                                                            \
            "  ret\n"                                                                              \
            "1:\n"                                                                                 \
            "  jmp *probe_real_" #name "(%rip)\n"                                                  \
            ".size " #name ", .-" #name "\n")

STUB(dlsym);
STUB(dlvsym);
STUB(dlopen);
STUB(dlmopen);
STUB(dlclose);

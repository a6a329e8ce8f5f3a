/*
 * hostile: what a program may do that a preloaded recorder must survive (linked -lcuda).
 * argv[1] picks the scenario; each prints "<key>=<value>" lines the tests compare with the log.
 * Every allocation is 1 MiB on device 0; "pairs" count cuMemAlloc_v2 + cuMemFree_v2 pairs.
 *
 *   fork-storm THREADS FORKS   THREADS threads allocate until the end; main forks FORKS children
 *                              that only _exit(0), each waited for up to 5 s (then killed and
 *                              counted as hung; 5 hangs end the storm). Prints forks= hung=
 *                              pairs= (pairs over all threads).
 *   fork-walk THREADS FORKS    like fork-storm, but the threads also walk the loader's list
 *                              (dl_iterate_phdr) all the time, and each child makes one
 *                              allocation and one free before _exit(0): its log is opened in
 *                              the child. Prints forks= hung= pairs=.
 *   fork-map THREADS FORKS     like fork-walk, but every "pair" is a VMM cycle (reserve 2 MiB,
 *                              create, map, unmap, release, unreserve), as PyTorch's
 *                              expandable segments map, and each child waits 60 ms before its
 *                              cycle (so that its cuMemMap looks for PyTorch's allocator in
 *                              the child). Prints forks= hung= pairs=.
 *   double-free N              N allocations, then a double free that glibc aborts on with
 *                              the heap's lock held.
 *   exit-in-handler N USEC     one pair, then forever a pair and a failed 1 PiB allocation;
 *                              SIGALRM after USEC microseconds runs a handler that calls
 *                              _exit(N).
 *   sigwait N                  N pairs, then blocks SIGTERM, sends it to the process and
 *                              waits for it with sigwait. Prints got=<signal>.
 *   segv-recover N             installs a SA_SIGINFO SIGSEGV handler, then: 1 allocation, a
 *                              fault at 0x1234 recovered with siglongjmp (the handler checks
 *                              si_addr, si_code and the signal number), N pairs, a second
 *                              fault, after which the handler puts SIG_DFL back and returns:
 *                              dies by SIGSEGV. Prints recovered=1 before the second fault.
 *   segv-plain N               a plain (sa_handler) SIGSEGV handler with SA_RESETHAND: N pairs,
 *                              then a fault; the handler counts and returns, the fault repeats
 *                              with SIG_DFL: dies by SIGSEGV.
 *   segv-dfl N                 N pairs, then a fault with no handler: dies by SIGSEGV.
 *   kill-self SIG N            N pairs, then kill(getpid(), SIG) with no handler: dies by SIG.
 *   overflow N                 N pairs, then unbounded recursion: dies by SIGSEGV.
 *   dump-signal SIG N          installs a handler for SIG that counts, N pairs, sends SIG to
 *                              itself twice, prints handled=<count>, N more pairs, exits 0.
 *   vfork-exit N / vfork-exec N / spawn N
 *                              N allocations, a child by vfork()+_exit(3), vfork()+execve
 *                              ("/bin/true"), or posix_spawn("/bin/true"), then N frees.
 *   exit-thread THREADS CODE   THREADS threads allocate and free (ignoring results) until the
 *                              process ends; once each has made 100 pairs, another thread
 *                              calls exit(CODE) while they go on.
 *   exit-in-atexit N CODE      N pairs, then returns from main; an atexit handler makes one
 *                              more pair and calls exit(CODE) from inside exit.
 *   profiler-report THREADS N  PyTorch 2.1's c10::reportMemoryUsageToProfiler, which the shim
 *                              defines, called with no PyTorch loaded: once from a constructor
 *                              (before the shim records anything), then N times from each of
 *                              THREADS threads (CUDA and CPU devices) while the main thread
 *                              makes N pairs and VMM cycles and forks 4 children that call it
 *                              and make a pair. Prints found=0 when nothing defines it,
 *                              else found=1 calls=<count> children=<exited 0>.
 */
#include "common.h"
#include "cuda.h"

#include <dlfcn.h>
#include <stdint.h>
#include <link.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

static void setup(void)
{
    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    CUcontext ctx;
    EXPECT_RC(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    EXPECT_RC(cuCtxSetCurrent(ctx), CUDA_SUCCESS, "cuCtxSetCurrent");
}

static CUdeviceptr alloc1(void)
{
    CUdeviceptr p = 0;
    EXPECT_RC(cuMemAlloc_v2(&p, MiB), CUDA_SUCCESS, "cuMemAlloc_v2");
    return p;
}

static void free1(CUdeviceptr p)
{
    EXPECT_RC(cuMemFree_v2(p), CUDA_SUCCESS, "cuMemFree_v2");
}

static void pairs(long n)
{
    for (long i = 0; i < n; i++)
        free1(alloc1());
}

/* ---- fork-storm ---- */

static volatile int g_stop;
static int g_walk, g_child_allocates, g_map;

/* One VMM cycle of 2 MiB on device 0: reserve, create, map, unmap, release, unreserve. */
static void map_cycle(void)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle handle = 0;
    EXPECT_RC(cuMemAddressReserve(&va, 2 * MiB, 2 * MiB, 0, 0), CUDA_SUCCESS,
              "cuMemAddressReserve");
    EXPECT_RC(cuMemCreate(&handle, 2 * MiB, &prop, 0), CUDA_SUCCESS, "cuMemCreate");
    EXPECT_RC(cuMemMap(va, 2 * MiB, 0, handle, 0), CUDA_SUCCESS, "cuMemMap");
    EXPECT_RC(cuMemUnmap(va, 2 * MiB), CUDA_SUCCESS, "cuMemUnmap");
    EXPECT_RC(cuMemRelease(handle), CUDA_SUCCESS, "cuMemRelease");
    EXPECT_RC(cuMemAddressFree(va, 2 * MiB), CUDA_SUCCESS, "cuMemAddressFree");
}

/* One allocation and its free: a VMM cycle under fork-map. */
static void one_pair(void)
{
    if (g_map)
        map_cycle();
    else
        free1(alloc1());
}

static int count_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)info;
    (void)size;
    ++*(int *)data;
    return 0;
}

static void *allocating_thread(void *arg)
{
    long *count = arg;
    setup();
    while (!g_stop) {
        one_pair();
        (*count)++;
        if (g_walk) {
            int objects = 0;
            dl_iterate_phdr(count_object, &objects);
        }
    }
    return NULL;
}

static int fork_storm(int threads, int forks)
{
    pthread_t tids[64];
    long counts[64] = {0};
    if (threads > 64)
        die("at most 64 threads");
    for (int t = 0; t < threads; t++)
        if (pthread_create(&tids[t], NULL, allocating_thread, &counts[t]) != 0)
            die("pthread_create");
    int hung = 0, done = 0;
    for (; done < forks && hung < 5; done++) {
        pid_t child = fork();
        if (child < 0)
            die("fork");
        if (child == 0) {
            if (g_map)
                usleep(60000);
            if (g_child_allocates)
                one_pair();
            _exit(0);
        }
        int status = 0, waited = 0;
        /* Up to 5 s: a child that only calls _exit takes microseconds (fork-map: 60 ms). */
        for (int i = 0; i < 5000 && !waited; i++) {
            pid_t r = waitpid(child, &status, WNOHANG);
            if (r == child)
                waited = 1;
            else if (r < 0)
                die("waitpid");
            else
                usleep(1000);
        }
        if (!waited) {
            hung++;
            kill(child, SIGKILL);
            waitpid(child, &status, 0);
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            die("fork child status 0x%x", status);
        }
    }
    g_stop = 1;
    long total = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tids[t], NULL);
        total += counts[t];
    }
    out("forks=%d hung=%d pairs=%ld", done, hung, total);
    return 0;
}

/* ---- double-free ---- */

static int double_free(int n)
{
    for (int i = 0; i < n; i++)
        alloc1();
    out("allocated=%d", n);
    /* A block too large for the thread cache, next to the top of the heap: the first free
     * merges it into the top chunk, and the second makes glibc abort ("double free or
     * corruption (top)") with the arena's lock held. volatile: the compiler must not see
     * (and warn about) the second free. */
    char *volatile block = malloc(4096);
    free(block);
    free(block);
    out("still alive");
    return 0;
}

/* ---- exit-in-handler ---- */

static int g_exit_code;

static void exit_now(int sig)
{
    (void)sig;
    _exit(g_exit_code);
}

__attribute__((noreturn)) static int exit_in_handler(int code, long usec)
{
    g_exit_code = code;
    pairs(1); /* the log exists before the timer can fire */
    signal(SIGALRM, exit_now);
    struct itimerval timer = {{0, 0}, {usec / 1000000, usec % 1000000}};
    setitimer(ITIMER_REAL, &timer, NULL);
    for (;;) {
        free1(alloc1());
        /* A failed allocation is flushed at once, on this thread: the handler often lands
         * inside that flush. */
        CUdeviceptr p = 0;
        EXPECT_RC(cuMemAlloc_v2(&p, (size_t)1 << 50), CUDA_ERROR_OUT_OF_MEMORY, "huge alloc");
    }
}

/* ---- sigwait ---- */

static int sigwait_term(int n)
{
    pairs(n);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    kill(getpid(), SIGTERM);
    int got = 0;
    if (sigwait(&set, &got) != 0)
        die("sigwait");
    out("got=%d", got);
    return 0;
}

/* ---- segv-recover / segv-plain / segv-dfl / kill-self / overflow ---- */

#define FAULT_ADDR ((volatile int *)0x1234)
static sigjmp_buf g_recover;
static volatile int g_phase, g_handled;

static void on_segv_info(int sig, siginfo_t *info, void *context)
{
    (void)context;
    if (sig != SIGSEGV || info->si_signo != SIGSEGV || info->si_code != SEGV_MAPERR ||
        info->si_addr != (void *)FAULT_ADDR) {
        static const char bad[] = "hostile: wrong siginfo in the program's handler\n";
        write(2, bad, sizeof bad - 1);
        abort();
    }
    if (g_phase == 0)
        siglongjmp(g_recover, 1);
    /* The program's crash handler: put the default back; the fault repeats and kills. */
    signal(SIGSEGV, SIG_DFL);
}

static int segv_recover(int n)
{
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_segv_info;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, NULL);
    setup();
    alloc1();
    if (sigsetjmp(g_recover, 1) == 0)
        (void)*FAULT_ADDR;
    out("recovered=1");
    g_phase = 1;
    pairs(n);
    (void)*FAULT_ADDR;
    out("survived the second fault");
    return 1;
}

static void on_segv_plain(int sig)
{
    (void)sig;
    g_handled++;
}

static int segv_plain(int n)
{
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_segv_plain;
    action.sa_flags = SA_RESETHAND;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, NULL);
    setup();
    pairs(n);
    (void)*FAULT_ADDR;
    out("survived the fault");
    return 1;
}

static int segv_dfl(int n)
{
    setup();
    pairs(n);
    (void)*FAULT_ADDR;
    out("survived the fault");
    return 1;
}

static int kill_self(int sig, int n)
{
    setup();
    pairs(n);
    kill(getpid(), sig);
    /* The signal is delivered before kill returns when no thread blocks it; allow a moment. */
    sleep(5);
    out("survived signal %d", sig);
    return 1;
}

/* Deep enough to overflow any stack; the bound only keeps the compiler from calling it
 * infinite. */
static int recurse(long depth)
{
    volatile char pad[256];
    pad[0] = (char)depth;
    if (depth > (1L << 40))
        return pad[0];
    return recurse(depth + 1) + pad[0];
}

static int overflow(int n)
{
    setup();
    pairs(n);
    return recurse(0);
}

/* ---- dump-signal ---- */

static void on_dump_signal(int sig)
{
    (void)sig;
    g_handled++;
}

static int dump_signal(int sig, int n)
{
    signal(sig, on_dump_signal);
    setup();
    pairs(n);
    kill(getpid(), sig);
    kill(getpid(), sig);
    out("handled=%d", g_handled);
    pairs(n);
    return 0;
}

/* ---- vfork / posix_spawn ---- */

static int child_then_free(const char *how, int n)
{
    CUdeviceptr ptrs[64];
    if (n > 64)
        die("at most 64");
    for (int i = 0; i < n; i++)
        ptrs[i] = alloc1();
    char *args[] = {"/bin/true", NULL};
    pid_t child;
    if (strcmp(how, "spawn") == 0) {
        if (posix_spawn(&child, "/bin/true", NULL, NULL, args, environ) != 0)
            die("posix_spawn");
    } else {
        child = vfork();
        if (child < 0)
            die("vfork");
        if (child == 0) {
            if (strcmp(how, "vfork-exec") == 0)
                execve("/bin/true", args, environ);
            _exit(3);
        }
    }
    int status;
    if (waitpid(child, &status, 0) != child)
        die("waitpid");
    for (int i = 0; i < n; i++)
        free1(ptrs[i]);
    out("child_status=%d", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 0;
}

/* ---- exit while others allocate, exit inside exit ---- */

static volatile long g_exit_pairs[64];

static void *careless_thread(void *arg)
{
    volatile long *count = arg;
    setup();
    for (;;) {
        CUdeviceptr p = 0;
        /* Results ignored: the fake driver may already be torn down by the exiting thread. */
        if (cuMemAlloc_v2(&p, MiB) == CUDA_SUCCESS)
            cuMemFree_v2(p);
        ++*count;
    }
    return NULL;
}

static void *exiting_thread(void *arg)
{
    exit(*(int *)arg);
}

__attribute__((noreturn)) static int exit_thread(int threads, int code)
{
    static int g_code;
    pthread_t tid;
    if (threads > 64)
        die("at most 64 threads");
    g_code = code;
    for (int t = 0; t < threads; t++)
        if (pthread_create(&tid, NULL, careless_thread, (void *)&g_exit_pairs[t]) != 0)
            die("pthread_create");
    for (int t = 0; t < threads; t++)
        while (g_exit_pairs[t] < 100)
            usleep(1000);
    if (pthread_create(&tid, NULL, exiting_thread, &g_code) != 0)
        die("pthread_create");
    for (;;)
        pause();
}

static int g_atexit_code;

static void exit_again(void)
{
    pairs(1);
    exit(g_atexit_code);
}

static int exit_in_atexit(int n, int code)
{
    g_atexit_code = code;
    pairs(n);
    atexit(exit_again);
    return 0;
}

/* ---- profiler-report ---- */

typedef struct {
    signed char type, index;
} c10_device;
typedef void (*report_fn)(void *, long, size_t, size_t, c10_device);
static report_fn g_report;
static long g_report_calls[64];

__attribute__((constructor)) static void report_before_main(void)
{
    g_report = (report_fn)dlsym(RTLD_DEFAULT,
                                "_ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE");
    if (g_report) {
        c10_device cuda = {1, 0};
        g_report((void *)0x200000, 512, 512, 2 * MiB, cuda);
    }
}

struct report_args {
    int slot;
    long n;
};

static void *reporting_thread(void *arg)
{
    struct report_args *a = arg;
    for (long i = 0; i < a->n; i++) {
        c10_device device = {(signed char)(i & 1), 0}; /* CUDA (1) and CPU (0) */
        long size = (i & 2) ? -512 : 512;
        g_report((void *)(uintptr_t)(0x200000 + 512 * (i % 64)), size, 512, 2 * MiB, device);
        g_report_calls[a->slot]++;
    }
    return NULL;
}

static int profiler_report(int threads, long n)
{
    if (!g_report) {
        printf("found=0\n");
        return 0;
    }
    if (threads > 60)
        threads = 60;
    setup();
    pthread_t tids[60];
    struct report_args args[60];
    for (int t = 0; t < threads; t++) {
        args[t] = (struct report_args){t, n};
        pthread_create(&tids[t], NULL, reporting_thread, &args[t]);
    }
    int children_ok = 0;
    for (long i = 0; i < n; i++) {
        free1(alloc1());
        map_cycle();
        if (i % (n / 4 > 0 ? n / 4 : 1) == 0 && children_ok < 4) {
            pid_t child = fork();
            if (child == 0) {
                c10_device cuda = {1, 0};
                for (int k = 0; k < 1000; k++)
                    g_report((void *)0x200000, (k & 1) ? -512 : 512, 0, 2 * MiB, cuda);
                free1(alloc1());
                _exit(0);
            }
            int status = 0;
            waitpid(child, &status, 0);
            children_ok += WIFEXITED(status) && WEXITSTATUS(status) == 0;
        }
    }
    long calls = 1;
    for (int t = 0; t < threads; t++) {
        pthread_join(tids[t], NULL);
        calls += g_report_calls[t];
    }
    printf("found=1 calls=%ld children=%d\n", calls, children_ok);
    return 0;
}

int main(int argc, char **argv)
{
    g_prog = "hostile";
    if (argc < 3)
        die("usage: hostile SCENARIO ARGS...");
    const char *mode = argv[1];
    int a = atoi(argv[2]);
    int b = argc > 3 ? atoi(argv[3]) : 0;
    if (strcmp(mode, "fork-storm") == 0) {
        setup();
        return fork_storm(a, b);
    }
    if (strcmp(mode, "fork-walk") == 0) {
        setup();
        g_walk = g_child_allocates = 1;
        return fork_storm(a, b);
    }
    if (strcmp(mode, "fork-map") == 0) {
        setup();
        g_walk = g_child_allocates = g_map = 1;
        return fork_storm(a, b);
    }
    if (strcmp(mode, "double-free") == 0) {
        setup();
        return double_free(a);
    }
    if (strcmp(mode, "exit-in-handler") == 0) {
        setup();
        return exit_in_handler(a, b);
    }
    if (strcmp(mode, "sigwait") == 0) {
        setup();
        return sigwait_term(a);
    }
    if (strcmp(mode, "segv-recover") == 0)
        return segv_recover(a);
    if (strcmp(mode, "segv-plain") == 0)
        return segv_plain(a);
    if (strcmp(mode, "segv-dfl") == 0)
        return segv_dfl(a);
    if (strcmp(mode, "kill-self") == 0)
        return kill_self(a, b);
    if (strcmp(mode, "overflow") == 0)
        return overflow(a);
    if (strcmp(mode, "dump-signal") == 0)
        return dump_signal(a, b);
    if (strcmp(mode, "vfork-exit") == 0 || strcmp(mode, "vfork-exec") == 0 ||
        strcmp(mode, "spawn") == 0) {
        setup();
        return child_then_free(mode, a);
    }
    if (strcmp(mode, "exit-thread") == 0) {
        setup();
        return exit_thread(a, b);
    }
    if (strcmp(mode, "profiler-report") == 0)
        return profiler_report(a, b);
    if (strcmp(mode, "exit-in-atexit") == 0) {
        setup();
        return exit_in_atexit(a, b);
    }
    die("unknown scenario %s", mode);
}

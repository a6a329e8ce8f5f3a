/* A fork while another thread is inside an NVML MIG call that holds the fake NVML's MIG lock
 * for longer than a second (fakegpu_libs.rs): the child must find that lock usable.
 *
 * How the lock is held that long, as the fakes really do it (see fork_busy_lock.c): on the MIG
 * layout 3g.40gb[2c,1c] a victim process holds bytes on the GPU instance through the device
 * ledger (VRAMSHIM_FAKEGPU_LEDGER); a holder process takes the ledger file's byte-0 record lock
 * for HOLD_MS; the victim is killed. A thread then calls nvmlComputeInstanceDestroy on the 1c
 * compute instance: holding the MIG lock, it asks the driver whether memory is in use on the
 * GPU instance, which finds the victim gone and waits on the byte-0 lock to clear its slot.
 * The main thread, once that thread is seen blocked in fcntl, forks; the child names MIG
 * device 0 through NVML (the MIG lock again) and exits.
 *
 * Printed, one line per step, the child's before the parent's: what the child sees, how long
 * the fork took, whether the destroy call was still blocked when it returned, and the destroy
 * call's code and when it returned (the holder gone, the victim's bytes given back: 0). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int cudaError_t;
cudaError_t cudaMalloc(void **p, size_t size);

#define HOLD_MS 5000
#define VICTIM_BYTES 300000000ull

typedef int (*nvml_fn)();
static void *nvml;
static nvml_fn f(const char *name)
{
    nvml_fn found = (nvml_fn)dlsym(nvml, name);
    if (!found) {
        printf("no %s\n", name);
        _exit(1);
    }
    return found;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void send_byte(int fd) { (void)!write(fd, "x", 1); }
static void wait_byte(int fd)
{
    char c;
    if (read(fd, &c, 1) != 1)
        _exit(3);
}

/* The blocked thread: one nvmlComputeInstanceDestroy, timed. */
static struct {
    void *ci;
    pid_t tid;
    int rc;
    long long done_ms;
    int done;
} destroy;

static void *destroy_thread(void *arg)
{
    (void)arg;
    __atomic_store_n(&destroy.tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
    destroy.rc = f("nvmlComputeInstanceDestroy")(destroy.ci);
    destroy.done_ms = now_ms();
    __atomic_store_n(&destroy.done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Whether thread TID is inside fcntl (the first field of /proc/self/task/TID/syscall). */
static int in_fcntl(pid_t tid)
{
    char path[64], text[256];
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0)
        return 0;
    text[n] = 0;
    return atol(text) == SYS_fcntl;
}

int main(void)
{
    const char *ledger_path = getenv("VRAMSHIM_FAKEGPU_LEDGER");
    if (!ledger_path)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    int victim_ready[2], holder_ready[2];
    if (pipe(victim_ready) || pipe(holder_ready))
        return 5;
    pid_t victim = fork();
    if (victim == 0) {
        void *p;
        if (cudaMalloc(&p, VICTIM_BYTES) != 0)
            _exit(4);
        send_byte(victim_ready[1]);
        for (;;)
            pause();
    }
    wait_byte(victim_ready[0]);

    /* NVML's handles while the victim lives (nothing waits yet). */
    nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!nvml)
        return 8;
    void *gpu = NULL, *gi = NULL, *one = NULL;
    unsigned n = 0;
    printf("nvml init=%d", f("nvmlInit_v2")());
    printf(" gpu rc=%d", f("nvmlDeviceGetHandleByIndex_v2")(0u, &gpu));
    printf(" gi rc=%d", f("nvmlDeviceGetGpuInstanceById")(gpu, 1u, &gi));
    int rc = f("nvmlGpuInstanceGetComputeInstances")(gi, 0u, &one, &n);
    printf(" 1c rc=%d n=%u\n", rc, n);
    destroy.ci = one;

    pid_t holder = fork();
    if (holder == 0) {
        int fd = open(ledger_path, O_RDWR);
        struct flock lock = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
        if (fd < 0 || fcntl(fd, F_SETLKW, &lock) != 0)
            _exit(6);
        /* The time the lock was taken, from the holder itself: the parent may be scheduled
         * late on a loaded machine, and the destroy cannot end before HOLD_MS after this. */
        long long locked_at = now_ms();
        (void)!write(holder_ready[1], &locked_at, sizeof locked_at);
        struct timespec hold = {HOLD_MS / 1000, (HOLD_MS % 1000) * 1000000L};
        nanosleep(&hold, NULL);
        _exit(0);
    }
    long long locked_ms;
    if (read(holder_ready[0], &locked_ms, sizeof locked_ms) != (ssize_t)sizeof locked_ms)
        _exit(3);
    kill(victim, SIGKILL);
    int status;
    waitpid(victim, &status, 0);
    printf("victim killed: %s\n", WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL ? "yes" : "no");

    pthread_t thread;
    if (pthread_create(&thread, NULL, destroy_thread, NULL))
        return 7;
    pid_t tid;
    while (!(tid = __atomic_load_n(&destroy.tid, __ATOMIC_ACQUIRE)))
        sched_yield();
    int blocked = 0;
    for (int i = 0; i < 2000 && !blocked && !__atomic_load_n(&destroy.done, __ATOMIC_ACQUIRE); i++) {
        blocked = in_fcntl(tid);
        if (!blocked) {
            struct timespec pause_ts = {0, 1000000};
            nanosleep(&pause_ts, NULL);
        }
    }
    printf("destroy blocked: %s\n", blocked ? "yes" : "no");

    long long before = now_ms();
    pid_t child = fork();
    if (child == 0) {
        void *mig = NULL;
        char name[128] = "";
        rc = f("nvmlDeviceGetMigDeviceHandleByIndex")(gpu, 0u, &mig);
        int name_rc = f("nvmlDeviceGetName")(mig, name, sizeof name);
        printf("child mig 0 rc=%d name rc=%d %s\n", rc, name_rc, name);
        _exit(0);
    }
    long long fork_ms = now_ms() - before;
    int still = !__atomic_load_n(&destroy.done, __ATOMIC_ACQUIRE);
    waitpid(child, &status, 0);
    printf("child exit=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    printf("fork took %lld ms, destroy still blocked: %s\n", fork_ms, still ? "yes" : "no");
    pthread_join(thread, NULL);
    waitpid(holder, &status, 0);
    printf("destroy rc=%d after %lld ms\n", destroy.rc, destroy.done_ms - locked_ms);
    return 0;
}

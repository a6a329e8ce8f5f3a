/* How cudaMemGetInfo on a device ledger (VRAMSHIM_FAKEGPU_LEDGER) learns that another process
 * holding bytes on the card is gone: pidfds in one epoll set, one epoll_wait per query.
 * This program counts the fakes' fcntl and epoll_wait calls by defining those two functions
 * itself (the fake driver's calls bind to the program's definitions), and counts the pidfds and
 * epoll sets it holds in /proc/self/fd. Modes (argument):
 *   killed: 4 observer processes hold memory; 10 times a victim process allocates, each
 *     observer sees it, the victim is SIGKILLed (a zombie, not reaped), and each observer's
 *     next query no longer counts it; then each makes 1000 queries beside the 3 others:
 *     exactly one epoll_wait and no fcntl each (VRAMSHIM_FAKEGPU_LEDGER_SWEEP_MS set long).
 *     A second thread of each observer queries all the while (the counts are per thread); at
 *     the end each observer holds 3 pidfds (the victims' closed) and one epoll set.
 *   exec: a process that allocated exec's a program that makes no CUDA call (its record lock
 *     goes, its pid lives): after the sweep period the next query does not count it; and a
 *     second such process's bytes are taken at once by an allocation that needs them.
 *   fork: a fork child closes its copies of the parent's pidfds and epoll set, then watches
 *     with its own; a helper killed is seen gone by parent and child, the child killed by the
 *     parent.
 *   reuse: (run as pid 1 of a new pid namespace, where clone3 can choose a child's pid) a
 *     process allocates, is killed and reaped, and another process takes its pid before the
 *     observer's next query: that query does not count the dead one's bytes, and watches no
 *     process (its pidfd would be the newcomer's).
 *   recount: the ledger's "recounting" flag left set (as by a process killed while
 *     recounting): the next query recounts and clears it.
 *   cap, nopidfd: the open-file limit low (at most 3 pidfds), or pidfd_open refused (seccomp):
 *     the processes not watched are asked by fcntl, and every figure stays exact.
 * One line per step; each process flushes before it answers, so the output's order is fixed.
 * Built with -DCUDA_MAJOR=13 or 12 (the same calls). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int cudaError_t;
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

#define CONTEXT 1048576ull /* VRAMSHIM_FAKEGPU_CONTEXT_BYTES in the test */

/* The fakes' fcntl and epoll_wait calls, counted per thread, then made as system calls. */
static __thread long fcntl_calls, epoll_wait_calls;

int fcntl(int fd, int command, ...)
{
    va_list args;
    va_start(args, command);
    unsigned long arg = va_arg(args, unsigned long);
    va_end(args);
    __atomic_add_fetch(&fcntl_calls, 1, __ATOMIC_RELAXED);
    return (int)syscall(SYS_fcntl, fd, command, arg);
}

int epoll_wait(int epfd, struct epoll_event *events, int max, int timeout)
{
    __atomic_add_fetch(&epoll_wait_calls, 1, __ATOMIC_RELAXED);
    return (int)syscall(SYS_epoll_pwait, epfd, events, max, timeout, NULL, 8);
}

static unsigned long long used(void)
{
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total))
        return ~0ull;
    return total - free_bytes;
}

/* The pidfds and epoll sets this process holds. */
static void watch_fds(int *pidfds, int *epolls)
{
    *pidfds = *epolls = 0;
    DIR *dir = opendir("/proc/self/fd");
    if (!dir)
        return;
    struct dirent *entry;
    while ((entry = readdir(dir))) {
        char path[300], target[64];
        snprintf(path, sizeof path, "/proc/self/fd/%s", entry->d_name);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n <= 0)
            continue;
        target[n] = 0;
        *pidfds += strcmp(target, "anon_inode:[pidfd]") == 0;
        *epolls += strcmp(target, "anon_inode:[eventpoll]") == 0;
    }
    closedir(dir);
}

static void send_byte(int fd) { (void)!write(fd, "x", 1); }
static void wait_byte(int fd)
{
    char c;
    if (read(fd, &c, 1) != 1)
        exit(3);
}

/* Waits until PID has ended, leaving it a zombie (not reaped). */
static void wait_dead(pid_t pid)
{
    siginfo_t info;
    while (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT) != 0)
        ;
}

/* A process that allocates BYTES, says so on READY and waits to be killed. */
static pid_t holder(unsigned long long bytes, int ready)
{
    pid_t pid = fork();
    if (pid == 0) {
        void *p;
        if (cudaMalloc(&p, bytes) != 0)
            _exit(4);
        send_byte(ready);
        for (;;)
            pause();
    }
    return pid;
}

#define OBSERVERS 4
#define ROUNDS 10
#define QUERIES 1000
#define OBSERVER_BYTES(k) (10000000ull * (unsigned long long)((k) + 1))
#define VICTIM_BYTES(r) (300000000ull + (unsigned long long)(r))

struct arena {
    pthread_barrier_t barrier;
    int saw_alive, saw_gone, wrong, pidfds, epolls;
    long epoll_waits, fcntls, queries;
};

/* A second thread of each observer asks as well, all the time: the two share the set. */
static int hammering = 1;
static void *hammer(void *unused)
{
    (void)unused;
    while (__atomic_load_n(&hammering, __ATOMIC_RELAXED))
        used();
    return NULL;
}

static void observer(struct arena *arena, int me)
{
    void *p;
    if (cudaMalloc(&p, OBSERVER_BYTES(me)) != 0)
        _exit(4);
    unsigned long long observers = 0;
    for (int k = 0; k < OBSERVERS; k++)
        observers += CONTEXT + OBSERVER_BYTES(k);
    pthread_barrier_wait(&arena->barrier); /* every observer holds its bytes */
    pthread_t thread;
    if (pthread_create(&thread, NULL, hammer, NULL) != 0)
        _exit(5);
    for (int r = 0; r < ROUNDS; r++) {
        pthread_barrier_wait(&arena->barrier); /* the victim holds its bytes */
        unsigned long long before = used();
        if (before == observers + CONTEXT + VICTIM_BYTES(r))
            __atomic_add_fetch(&arena->saw_alive, 1, __ATOMIC_RELAXED);
        else
            __atomic_add_fetch(&arena->wrong, 1, __ATOMIC_RELAXED);
        pthread_barrier_wait(&arena->barrier); /* every observer has seen it */
        pthread_barrier_wait(&arena->barrier); /* the victim is dead, not reaped */
        unsigned long long after = used();
        if (after == observers)
            __atomic_add_fetch(&arena->saw_gone, 1, __ATOMIC_RELAXED);
        else
            __atomic_add_fetch(&arena->wrong, 1, __ATOMIC_RELAXED);
        long waits = epoll_wait_calls, fcntls = fcntl_calls;
        for (int q = 0; q < QUERIES; q++)
            if (used() != observers)
                __atomic_add_fetch(&arena->wrong, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&arena->epoll_waits, epoll_wait_calls - waits, __ATOMIC_RELAXED);
        __atomic_add_fetch(&arena->fcntls, fcntl_calls - fcntls, __ATOMIC_RELAXED);
        __atomic_add_fetch(&arena->queries, QUERIES, __ATOMIC_RELAXED);
        pthread_barrier_wait(&arena->barrier); /* the round is over */
    }
    __atomic_store_n(&hammering, 0, __ATOMIC_RELAXED);
    pthread_join(thread, NULL);
    int pidfds, epolls;
    watch_fds(&pidfds, &epolls); /* the 3 other observers' pidfds: the victims' are closed */
    __atomic_add_fetch(&arena->pidfds, pidfds, __ATOMIC_RELAXED);
    __atomic_add_fetch(&arena->epolls, epolls, __ATOMIC_RELAXED);
    pthread_barrier_wait(&arena->barrier); /* every observer has counted: none has ended */
}

static int killed(void)
{
    struct arena *arena = mmap(NULL, sizeof *arena, PROT_READ | PROT_WRITE,
                               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pthread_barrierattr_t shared;
    int ready[2];
    if (arena == MAP_FAILED || pthread_barrierattr_init(&shared) ||
        pthread_barrierattr_setpshared(&shared, PTHREAD_PROCESS_SHARED) ||
        pthread_barrier_init(&arena->barrier, &shared, OBSERVERS + 1) || pipe(ready))
        return 1;
    pid_t observers[OBSERVERS];
    for (int k = 0; k < OBSERVERS; k++)
        if ((observers[k] = fork()) == 0) {
            observer(arena, k);
            _exit(0);
        }
    pthread_barrier_wait(&arena->barrier);
    for (int r = 0; r < ROUNDS; r++) {
        pid_t victim = holder(VICTIM_BYTES(r), ready[1]);
        wait_byte(ready[0]);
        pthread_barrier_wait(&arena->barrier);
        pthread_barrier_wait(&arena->barrier); /* each observer has seen it */
        kill(victim, SIGKILL);
        wait_dead(victim);
        pthread_barrier_wait(&arena->barrier);
        pthread_barrier_wait(&arena->barrier);
        waitpid(victim, NULL, 0);
    }
    pthread_barrier_wait(&arena->barrier);
    int clean = 0;
    for (int k = 0; k < OBSERVERS; k++) {
        int status;
        waitpid(observers[k], &status, 0);
        clean += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    printf("killed %d victims x %d observers: counted while alive=%d gone at the next query=%d "
           "wrong=%d\n",
           ROUNDS, OBSERVERS, arena->saw_alive, arena->saw_gone, arena->wrong);
    printf("queries beside 3 processes=%ld: epoll_wait=%ld fcntl=%ld; at the end pidfds=%d "
           "epoll sets=%d; observers exited cleanly=%d\n",
           arena->queries, arena->epoll_waits, arena->fcntls, arena->pidfds, arena->epolls,
           clean);
    return 0;
}

static void sleep_ms(long ms)
{
    struct timespec pause = {ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&pause, &pause) != 0)
        ;
}

/* A process that allocates VICTIM_BYTES(0), then, told to on GO, exec's this program as a
 * "sleeper": no CUDA call, says so on READY and waits for its end. */
static pid_t exec_victim(const char *self, int ready, int go)
{
    pid_t pid = fork();
    if (pid == 0) {
        void *p;
        if (cudaMalloc(&p, VICTIM_BYTES(0)) != 0)
            _exit(4);
        send_byte(ready);
        wait_byte(go);
        char fd[16];
        snprintf(fd, sizeof fd, "%d", ready);
        execl("/proc/self/exe", self, "sleeper", fd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int exec_mode(const char *self)
{
    int ready[2], go[2];
    if (pipe(ready) || pipe(go))
        return 1;
    void *p;
    int rc = cudaMalloc(&p, OBSERVER_BYTES(0));
    unsigned long long mine = used();
    printf("exec observer malloc rc=%d used=%llu\n", rc, mine);
    pid_t victim = exec_victim(self, ready[1], go[0]);
    wait_byte(ready[0]);
    printf("exec victim allocated: used=%llu\n", used());
    send_byte(go[1]);
    wait_byte(ready[0]); /* the sleeper runs */
    sleep_ms(50);        /* past the sweep period (10 ms) */
    printf("exec victim exec'd, 50 ms later: used=%llu\n", used());
    fflush(stdout);

    pid_t second = exec_victim(self, ready[1], go[0]);
    wait_byte(ready[0]);
    unsigned long long with = used();
    send_byte(go[1]);
    wait_byte(ready[0]);
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    /* Fits only once the exec'd process's bytes are given back. */
    void *q;
    rc = cudaMalloc(&q, total - mine);
    printf("second victim allocated: used=%llu; exec'd, at once a malloc of %llu rc=%d "
           "used=%llu\n",
           with, (unsigned long long)(total - mine), rc, used());
    cudaFree(q);
    kill(victim, SIGKILL);
    kill(second, SIGKILL);
    waitpid(victim, NULL, 0);
    waitpid(second, NULL, 0);
    return 0;
}

static int fork_mode(void)
{
    int ready[2], go[2];
    if (pipe(ready) || pipe(go))
        return 1;
    void *p;
    cudaMalloc(&p, OBSERVER_BYTES(0));
    pid_t helper = holder(OBSERVER_BYTES(1), ready[1]);
    wait_byte(ready[0]);
    int pidfds, epolls;
    unsigned long long seen = used();
    watch_fds(&pidfds, &epolls);
    printf("parent beside the helper: used=%llu pidfds=%d epoll sets=%d\n", seen, pidfds, epolls);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        watch_fds(&pidfds, &epolls);
        printf("child after fork: pidfds=%d epoll sets=%d\n", pidfds, epolls);
        void *q;
        int rc = cudaMalloc(&q, OBSERVER_BYTES(2));
        seen = used();
        watch_fds(&pidfds, &epolls);
        printf("child malloc rc=%d used=%llu pidfds=%d epoll sets=%d\n", rc, seen, pidfds,
               epolls);
        fflush(stdout);
        send_byte(ready[1]);
        wait_byte(go[0]); /* the helper is dead */
        printf("child after the helper was killed: used=%llu\n", used());
        fflush(stdout);
        send_byte(ready[1]);
        for (;;)
            pause();
    }
    wait_byte(ready[0]);
    seen = used();
    watch_fds(&pidfds, &epolls);
    printf("parent beside the helper and the child: used=%llu pidfds=%d epoll sets=%d\n", seen,
           pidfds, epolls);
    kill(helper, SIGKILL);
    wait_dead(helper);
    printf("parent after the helper was killed: used=%llu\n", used());
    fflush(stdout);
    send_byte(go[1]);
    wait_byte(ready[0]);
    kill(child, SIGKILL);
    wait_dead(child);
    seen = used();
    watch_fds(&pidfds, &epolls);
    printf("parent after the child was killed: used=%llu pidfds=%d epoll sets=%d\n", seen,
           pidfds, epolls);
    waitpid(helper, NULL, 0);
    waitpid(child, NULL, 0);
    return 0;
}

/* clone3 with a chosen pid (CLONE_SET_TID; needs CAP_CHECKPOINT_RESTORE in the pid
 * namespace's user namespace): 0 in the child, its pid in the parent, -1 on failure. */
static pid_t fork_with_pid(pid_t pid)
{
    struct {
        uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls,
            set_tid, set_tid_size, cgroup;
    } args = {0};
    args.exit_signal = SIGCHLD;
    args.set_tid = (uint64_t)(uintptr_t)&pid;
    args.set_tid_size = 1;
    return (pid_t)syscall(SYS_clone3, &args, sizeof args);
}

static int reuse(void)
{
    int ready[2];
    if (pipe(ready))
        return 1;
    void *p;
    cudaMalloc(&p, OBSERVER_BYTES(0));
    unsigned long long mine = used(); /* the first query: the sweep is done now */
    pid_t victim = holder(VICTIM_BYTES(0), ready[1]);
    wait_byte(ready[0]);
    kill(victim, SIGKILL);
    waitpid(victim, NULL, 0);
    pid_t newcomer = fork_with_pid(victim);
    if (newcomer == 0) {
        for (;;)
            pause();
    }
    if (newcomer < 0) {
        printf("reuse: clone3 with the victim's pid failed\n");
        return 1;
    }
    unsigned long long seen = used();
    int pidfds, epolls;
    watch_fds(&pidfds, &epolls);
    printf("reuse: alone used=%llu; the victim's pid taken by another process=%s; then "
           "used=%llu pidfds=%d\n",
           mine, newcomer == victim ? "yes" : "no", seen, pidfds);
    kill(newcomer, SIGKILL);
    waitpid(newcomer, NULL, 0);
    return 0;
}

/* "recount": the state a process killed in the middle of a recount leaves, its flag set
 * (written here into the file as such a process would have left it): the next query waits for
 * the ledger lock, finds the flag and recounts; the flag is cleared and the figure exact. */
#define LEDGER_RECOUNTING 133688 /* struct ledger_file: machine.recounting */
static int recount(void)
{
    void *p;
    int rc = cudaMalloc(&p, OBSERVER_BYTES(0));
    int fd = open(getenv("VRAMSHIM_FAKEGPU_LEDGER"), O_RDWR);
    uint32_t *flag = NULL;
    char *map = fd < 0 ? MAP_FAILED
                       : mmap(NULL, LEDGER_RECOUNTING + 8, PROT_READ | PROT_WRITE, MAP_SHARED,
                              fd, 0);
    if (map == MAP_FAILED)
        return 1;
    flag = (uint32_t *)(map + LEDGER_RECOUNTING);
    __atomic_store_n(flag, 1, __ATOMIC_SEQ_CST);
    unsigned long long seen = used();
    printf("recount: malloc rc=%d; left flagged, a query: used=%llu flag after=%u\n", rc, seen,
           __atomic_load_n(flag, __ATOMIC_SEQ_CST));
    return 0;
}

/* "cap" and "nopidfd": this process and 5 others holding memory; first (before any CUDA call)
 * the open-file limit is set to 48 (the fakes then take at most 3 pidfds) or pidfd_open is
 * refused by a seccomp filter (ENOSYS, as on Linux before 5.3). The processes past the cap, or
 * all, are asked by one fcntl each per query; every figure stays exact, and one watched and
 * one unwatched process killed are seen gone at the next query. Nothing on stderr. */
#define OTHERS 5
static int limits(const char *mode)
{
    if (strcmp(mode, "cap") == 0) {
        struct rlimit files = {48, 48};
        if (setrlimit(RLIMIT_NOFILE, &files) != 0)
            return 1;
    } else {
        struct sock_filter filter[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_pidfd_open, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        struct sock_fprog program = {sizeof filter / sizeof filter[0], filter};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
            prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0)
            return 1;
    }
    int ready[2];
    if (pipe(ready))
        return 1;
    void *p;
    cudaMalloc(&p, OBSERVER_BYTES(0));
    pid_t others[OTHERS];
    unsigned long long expected = CONTEXT + OBSERVER_BYTES(0);
    for (int k = 0; k < OTHERS; k++) {
        others[k] = holder(OBSERVER_BYTES(k + 1), ready[1]);
        wait_byte(ready[0]);
        expected += OBSERVER_BYTES(k + 1); /* fork children: the context is the parent's */
    }
    unsigned long long seen = used();
    long waits = epoll_wait_calls, fcntls = fcntl_calls;
    int wrong = 0;
    for (int q = 0; q < 100; q++)
        wrong += used() != expected;
    waits = epoll_wait_calls - waits;
    fcntls = fcntl_calls - fcntls;
    int pidfds, epolls;
    watch_fds(&pidfds, &epolls);
    printf("%s: beside %d processes used=%llu (%s) pidfds=%d; 100 queries: epoll_wait=%ld "
           "fcntl=%ld wrong=%d\n",
           mode, OTHERS, seen, seen == expected ? "exact" : "wrong", pidfds, waits, fcntls,
           wrong);
    kill(others[0], SIGKILL);
    kill(others[OTHERS - 1], SIGKILL);
    wait_dead(others[0]);
    wait_dead(others[OTHERS - 1]);
    expected -= OBSERVER_BYTES(1) + OBSERVER_BYTES(OTHERS);
    seen = used();
    watch_fds(&pidfds, &epolls);
    printf("%s: the first and last killed: used=%llu (%s) pidfds=%d\n", mode, seen,
           seen == expected ? "exact" : "wrong", pidfds);
    for (int k = 0; k < OTHERS; k++) {
        kill(others[k], SIGKILL);
        waitpid(others[k], NULL, 0);
    }
    return 0;
}

int main(int argc, char **argv)
{
    alarm(60); /* a broken run ends instead of hanging the test */
    if (argc == 3 && strcmp(argv[1], "sleeper") == 0) {
        send_byte(atoi(argv[2]));
        for (;;)
            pause();
    }
    if (argc == 2 && strcmp(argv[1], "killed") == 0)
        return killed();
    if (argc == 2 && strcmp(argv[1], "exec") == 0)
        return exec_mode(argv[0]);
    if (argc == 2 && strcmp(argv[1], "fork") == 0)
        return fork_mode();
    if (argc == 2 && strcmp(argv[1], "reuse") == 0)
        return reuse();
    if (argc == 2 && strcmp(argv[1], "recount") == 0)
        return recount();
    if (argc == 2 && (strcmp(argv[1], "cap") == 0 || strcmp(argv[1], "nopidfd") == 0))
        return limits(argv[1]);
    fprintf(stderr, "usage: ledger_watch killed|exec|fork|reuse|recount|cap|nopidfd\n");
    return 2;
}

/* A fork while another thread holds fake locks for longer than a second: the prepare handler
 * tries each lock for about a second, then leaves it to its holder in the parent and makes it
 * anew in the child (one warning line there).
 *
 * How the locks are held that long, as the fakes really do it: this process (P) and a victim
 * process hold bytes on the device ledger (VRAMSHIM_FAKEGPU_LEDGER); a holder process takes the
 * ledger file's byte-0 record lock (the one a process clearing dead slots and recounting holds)
 * for HOLD_MS; the victim is killed. A thread of P then calls cudaMemGetInfo: it takes the
 * device's lock, finds the victim gone and, to clear its slot, takes the ledger's mutex and
 * waits on the byte-0 lock (lock_ledger in ledger.c). The main thread, once that thread is seen
 * blocked in fcntl (/proc/self/task/TID/syscall), forks.
 *
 * Printed, one line per step, the child's before the parent's (the parent prints after the child
 * exited): the figures the child sees, each process's cudaMemGetInfo in bytes in use, and how
 * long the fork took and whether the blocked call was still blocked when it returned.
 * Built with -DCUDA_MAJOR=13 or 12 (the same calls). */
#define _GNU_SOURCE
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
cudaError_t cudaFree(void *p);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

#ifndef HOLD_MS
#define HOLD_MS 3000
#endif
#define OWN_BYTES 10000000ull
#define VICTIM_BYTES 300000000ull
#define CHILD_BYTES 5000000ull

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static long long used(int *rc)
{
    size_t free_bytes = 0, total = 0;
    *rc = cudaMemGetInfo(&free_bytes, &total);
    return *rc ? -1 : (long long)(total - free_bytes);
}

static void send_byte(int fd) { (void)!write(fd, "x", 1); }
static void wait_byte(int fd)
{
    char c;
    if (read(fd, &c, 1) != 1)
        _exit(3);
}

/* The blocked thread: one cudaMemGetInfo, timed. */
static struct {
    pid_t tid;
    int rc;
    long long used, done_ms;
    int done;
} query;

static void *query_thread(void *arg)
{
    (void)arg;
    __atomic_store_n(&query.tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
    query.used = used(&query.rc);
    query.done_ms = now_ms();
    __atomic_store_n(&query.done, 1, __ATOMIC_RELEASE);
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
    int rc;
    void *own;
    if (cudaMalloc(&own, OWN_BYTES) != 0)
        return 4;
    printf("parent malloc %llu used=%lld\n", OWN_BYTES, used(&rc));

    /* The victim: bytes on the card, then killed while the holder has the ledger's lock. */
    int victim_ready[2], holder_ready[2], child_go[2];
    if (pipe(victim_ready) || pipe(holder_ready) || pipe(child_go))
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
    printf("victim malloc %llu, parent sees used=%lld\n", VICTIM_BYTES, used(&rc));

    /* The holder: the ledger file's byte-0 record lock for HOLD_MS, then exits (dropping it). */
    pid_t holder = fork();
    if (holder == 0) {
        int fd = open(ledger_path, O_RDWR);
        struct flock lock = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
        if (fd < 0 || fcntl(fd, F_SETLKW, &lock) != 0)
            _exit(6);
        /* When the lock was taken, by the holder's clock (CLOCK_MONOTONIC is system-wide):
         * the parent's own reading after the pipe wakes it can be late by its scheduling
         * delay, which made the query seem to return before HOLD_MS had passed. */
        long long taken_ms = now_ms();
        (void)!write(holder_ready[1], &taken_ms, sizeof taken_ms);
        struct timespec hold = {HOLD_MS / 1000, (HOLD_MS % 1000) * 1000000L};
        nanosleep(&hold, NULL);
        _exit(0);
    }
    long long locked_ms = 0;
    if (read(holder_ready[0], &locked_ms, sizeof locked_ms) != sizeof locked_ms)
        _exit(3);
    kill(victim, SIGKILL);
    int status;
    waitpid(victim, &status, 0);
    printf("victim killed: %s\n", WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL ? "yes" : "no");

    pthread_t thread;
    if (pthread_create(&thread, NULL, query_thread, NULL))
        return 7;
    pid_t tid;
    while (!(tid = __atomic_load_n(&query.tid, __ATOMIC_ACQUIRE)))
        sched_yield();
    int blocked = 0;
    for (int i = 0; i < 2000 && !blocked; i++) {
        blocked = in_fcntl(tid) && !__atomic_load_n(&query.done, __ATOMIC_ACQUIRE);
        if (!blocked)
            usleep(500);
    }
    printf("query thread blocked in fcntl: %s\n", blocked ? "yes" : "no");

    long long fork_start = now_ms();
    pid_t child = fork();
    if (child == 0) {
        /* One thread; the device's lock and the ledger's were held by the blocked thread. Its
         * calls start once the parent's query is done, so the figures are the same each run. */
        wait_byte(child_go[0]);
        void *p;
        int malloc_rc = cudaMalloc(&p, CHILD_BYTES);
        printf("child malloc %llu rc=%d used=%lld\n", CHILD_BYTES, malloc_rc, used(&rc));
        int free_rc = cudaFree(p);
        printf("child free rc=%d used=%lld\n", free_rc, used(&rc));
        fflush(stdout);
        _exit(malloc_rc || free_rc || rc ? 8 : 0);
    }
    long long fork_ms = now_ms() - fork_start;
    int still_blocked = !__atomic_load_n(&query.done, __ATOMIC_ACQUIRE);
    long long since_locked_ms = now_ms() - locked_ms;

    pthread_join(thread, NULL);
    send_byte(child_go[1]);
    waitpid(child, &status, 0);
    int child_exit = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    waitpid(holder, &status, 0);
    int holder_exit = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);

    printf("fork returned in %lld ms, %lld ms after the lock was taken, the query still "
           "blocked: %s\n",
           fork_ms, since_locked_ms, still_blocked ? "yes" : "no");
    printf("query rc=%d used=%lld, returned %lld ms after the lock was taken\n", query.rc,
           query.used, query.done_ms - locked_ms);
    printf("child exited %d, holder exited %d\n", child_exit, holder_exit);
    int free_rc = cudaFree(own);
    printf("parent free rc=%d used=%lld\n", free_rc, used(&rc));
    return 0;
}

/*
 * report_fork: two processes whose device-0 allocations overlap in time
 * (linked -lcudart -lcuda), for merging logs in `vramshim report`.
 *
 *   parent: cudaMalloc 32 MiB (X), fork
 *   child:  cudaMalloc 16 MiB (Y1), cudaMalloc 48 MiB (Y2) -- X + Y1 + Y2 =
 *           96 MiB live over both processes --, waits 20 ms, tells the parent
 *           through a pipe, waits for the parent's answer, frees Y1 and Y2,
 *           exits 0
 *   parent: on the child's word, allocates 8 MiB (W, inside the overlap),
 *           waits 20 ms, frees W, answers, waits for the child, frees X, then
 *           allocates and frees 80 MiB (Z) alone
 * The 20 ms pauses keep W at least 20 ms away from the child's events on
 * either side, so that merging the two logs by wall-clock time cannot get the
 * order wrong.
 * Peaks: parent alone 80 MiB (Z), child alone 64 MiB, both together 104 MiB
 * (X + Y1 + Y2 + W).  Every line carries pid=<pid>; the parent prints
 * "child pid=<n>" and "parent pid=<n>".
 */
#include "common.h"
#include "cuda_runtime.h"

#include <stdint.h>
#include <sys/wait.h>
#include <time.h>

static void pause_20ms(void)
{
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
}

static void *alloc(size_t size, const char *role)
{
    void *p = NULL;
    int rc = cudaMalloc(&p, size);
    emit("alloc", "cudaMalloc", 0, "addr", (uintptr_t)p, size,
         xf("pid=%d role=%s", getpid(), role), rc);
    EXPECT_RC(rc, cudaSuccess, "cudaMalloc");
    return p;
}

static void release(void *p, const char *role)
{
    int rc = cudaFree(p);
    emit("free", "cudaFree", 0, "addr", (uintptr_t)p, 0, xf("pid=%d role=%s", getpid(), role),
         rc);
    EXPECT_RC(rc, cudaSuccess, "cudaFree");
}

static void put(int fd)
{
    char c = 'x';
    if (write(fd, &c, 1) != 1)
        die("write to pipe");
}

static void get(int fd)
{
    char c;
    if (read(fd, &c, 1) != 1)
        die("read from pipe");
}

int main(void)
{
    g_prog = "report_fork";
    EXPECT_RC(cudaSetDevice(0), cudaSuccess, "cudaSetDevice");
    int to_parent[2], to_child[2];
    if (pipe(to_parent) != 0 || pipe(to_child) != 0)
        die("pipe");

    void *x = alloc(32 * MiB, "parent-x");
    fflush(stdout);
    pid_t child = fork();
    if (child < 0)
        die("fork");
    if (child == 0) {
        g_prog = "report_fork(child)";
        void *y1 = alloc(16 * MiB, "child-y1");
        void *y2 = alloc(48 * MiB, "child-y2");
        pause_20ms();
        put(to_parent[1]);
        get(to_child[0]);
        release(y1, "child-y1");
        release(y2, "child-y2");
        out("done child pid=%d", getpid());
        exit(0);
    }
    get(to_parent[0]);
    void *w = alloc(8 * MiB, "parent-w");
    pause_20ms();
    release(w, "parent-w");
    put(to_child[1]);

    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        die("child (pid %d) did not exit 0", (int)child);
    out("child pid=%d", (int)child);
    release(x, "parent-x");
    void *z = alloc(80 * MiB, "parent-z");
    release(z, "parent-z");
    out("parent pid=%d", getpid());
    return 0;
}

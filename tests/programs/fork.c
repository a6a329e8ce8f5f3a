/*
 * fork: allocations across fork() and fork()+exec (linked -lcuda).
 * The parent allocates 1 MiB, forks a child that allocates 2 MiB twice, frees
 * both and exits 0; then forks a child that execs this program with
 * argv[1] = "exec-child", which allocates 3 MiB once and exits without freeing.
 * Every line carries pid=<pid> of the process that printed it; the parent
 * prints "child pid=<n>" and "exec pid=<n>".
 */
#include "common.h"
#include "cuda.h"

#include <sys/wait.h>

static void setup(void)
{
    EXPECT_RC(cuInit(0), CUDA_SUCCESS, "cuInit");
    CUcontext ctx;
    EXPECT_RC(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
    EXPECT_RC(cuCtxSetCurrent(ctx), CUDA_SUCCESS, "cuCtxSetCurrent");
}

static CUdeviceptr alloc(unsigned long long size, const char *role)
{
    CUdeviceptr p = 0;
    CUresult rc = cuMemAlloc_v2(&p, size);
    emit("alloc", "cuMemAlloc_v2", 0, "addr", p, size, xf("pid=%d role=%s", getpid(), role), rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemAlloc_v2");
    return p;
}

static void release(CUdeviceptr p, unsigned long long size, const char *role)
{
    CUresult rc = cuMemFree_v2(p);
    emit("free", "cuMemFree_v2", 0, "addr", p, size, xf("pid=%d role=%s", getpid(), role), rc);
    EXPECT_RC(rc, CUDA_SUCCESS, "cuMemFree_v2");
}

static void wait_ok(pid_t pid, const char *what)
{
    int status;
    if (waitpid(pid, &status, 0) != pid)
        die("waitpid(%s)", what);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        die("%s (pid %d) did not exit 0 (status 0x%x)", what, pid, status);
}

int main(int argc, char **argv)
{
    g_prog = "fork";
    if (argc > 1 && strcmp(argv[1], "exec-child") == 0) {
        g_prog = "fork(exec-child)";
        setup();
        alloc(3 * MiB, "exec-child");
        out("done exec-child pid=%d", getpid());
        return 0;
    }

    setup();
    CUdeviceptr p = alloc(1 * MiB, "parent");

    fflush(stdout);
    pid_t child = fork();
    if (child < 0)
        die("fork");
    if (child == 0) {
        g_prog = "fork(child)";
        CUdeviceptr a = alloc(2 * MiB, "child");
        CUdeviceptr b = alloc(2 * MiB, "child");
        release(a, 2 * MiB, "child");
        release(b, 2 * MiB, "child");
        out("done child pid=%d", getpid());
        exit(0);
    }
    wait_ok(child, "fork child");
    out("child pid=%d", (int)child);

    fflush(stdout);
    pid_t ex = fork();
    if (ex < 0)
        die("fork");
    if (ex == 0) {
        char *args[] = {argv[0], "exec-child", NULL};
        execv("/proc/self/exe", args);
        fprintf(stderr, "fork: execv failed\n");
        _exit(127);
    }
    wait_ok(ex, "exec child");
    out("exec pid=%d", (int)ex);

    release(p, 1 * MiB, "parent");
    out("done fork pid=%d", getpid());
    return 0;
}

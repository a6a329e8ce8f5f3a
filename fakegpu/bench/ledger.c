/* The device ledger's cost (VRAMSHIM_FAKEGPU_LEDGER; scripts/bench-fakegpu.sh): a cudaMalloc +
 * cudaFree pair and cudaMemGetInfo, this process alone on the ledger, then beside 1, 2, 4 and 8
 * other processes (fork children each holding memory on the same card, so a slot of their
 * own), then, when the machine has 4 devices (VRAMSHIM_FAKEGPU_COUNT=4), beside three on the
 * other devices only (DDP's layout: one rank per GPU). Run it with and without the variable.
 * Arguments: iterations (default 200000), rounds of them, the fastest printed (default 1). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int cudaError_t;
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Rounds of N calls each: the fastest round is printed (ROUNDS > 1 shows the cost without the
 * preemptions of a loaded machine). */
static long rounds = 1;

static void measure(const char *beside, long n)
{
    void *p;
    size_t free_bytes, total;
    double pair = 1e30, info = 1e30;
    for (long r = 0; r < rounds; r++) {
        double start = now();
        for (long i = 0; i < n; i++) {
            cudaMalloc(&p, 2 << 20);
            cudaFree(p);
        }
        double took = (now() - start) * 1e9 / (double)n;
        pair = took < pair ? took : pair;
    }
    printf("%-24s cudaMalloc+cudaFree pair %7.0f ns\n", beside, pair);
    for (long r = 0; r < rounds; r++) {
        double start = now();
        for (long i = 0; i < n; i++)
            cudaMemGetInfo(&free_bytes, &total);
        double took = (now() - start) * 1e9 / (double)n;
        info = took < info ? took : info;
    }
    printf("%-24s cudaMemGetInfo          %7.0f ns\n", beside, info);
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 200000;
    rounds = argc > 2 && atol(argv[2]) > 0 ? atol(argv[2]) : 1;
    void *p;
    int ready[2];
    if (pipe(ready))
        return 1;
    cudaMalloc(&p, 1); /* the context and this process's slot outside the timings */
    cudaFree(p);
    measure("alone:", n);
    /* Others on the same card, added until there are 8. */
    pid_t beside[8];
    int count = 0;
    for (int want = 1; want <= 8; want *= 2) {
        for (; count < want; count++) {
            beside[count] = fork();
            if (beside[count] == 0) {
                cudaMalloc(&p, 1 << 20); /* the child's own slot */
                (void)!write(ready[1], "x", 1);
                pause();
                _exit(0);
            }
            char c;
            if (read(ready[0], &c, 1) != 1)
                return 1;
        }
        char label[32];
        snprintf(label, sizeof label, "beside %d process%s:", count, count > 1 ? "es" : "");
        measure(label, n);
    }
    for (int i = 0; i < count; i++) {
        kill(beside[i], SIGKILL);
        waitpid(beside[i], NULL, 0);
    }
    char c;
    cudaMemGetInfo(&(size_t){0}, &(size_t){0}); /* their slots cleared outside the timings */

    int devices = 0;
    if (cudaGetDeviceCount(&devices) != 0 || devices < 4)
        return 0;
    pid_t others[3];
    for (int d = 1; d < 4; d++) {
        others[d - 1] = fork();
        if (others[d - 1] == 0) {
            cudaSetDevice(d);
            cudaMalloc(&p, 1 << 20); /* a slot of its own, bytes on device d only */
            (void)!write(ready[1], "x", 1);
            pause();
            _exit(0);
        }
    }
    for (int d = 1; d < 4; d++)
        if (read(ready[0], &c, 1) != 1)
            return 1;
    measure("beside 3 on other GPUs:", n);
    for (int d = 1; d < 4; d++) {
        kill(others[d - 1], SIGKILL);
        waitpid(others[d - 1], NULL, 0);
    }
    return 0;
}

/* Two processes on one simulated card through the device ledger (VRAMSHIM_FAKEGPU_LEDGER).
 * The launcher (no argument; it makes no CUDA call) starts A and B (itself, exec'd with "a"
 * or "b" and its pipes: fresh processes, not fork copies). A allocates A_BYTES and waits.
 * B then sees A's context and allocation in cudaMemGetInfo and NVML to the byte, fails to take
 * one byte more than is free, takes exactly what is free, and lists the two processes through
 * NVML. The launcher kills A with SIGKILL; B sees A's bytes given back and takes what failed
 * before; a fork child of B allocates on top of B's bytes and gives them back when it exits.
 * After B exits the launcher reads NVML: nothing in use. Given "race": RACERS processes ask at
 * once for memory of which only one can have; one gets it. Given "rounds": the same race
 * ROUNDS times between fork children meeting at a barrier, the winner giving its bytes back
 * before the next round, then TRIES each as fast as they can; then NVML in the launcher:
 * nothing in use. Given "killed": processes SIGKILLed while they allocate and free leave
 * nothing in use. One line per step, prefixed
 * by who printed it; each process flushes before it answers, so the output's order is fixed.
 * Built with -DCUDA_MAJOR=13 or 12 (the same calls). */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int cudaError_t;
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

#define A_BYTES 700000001ull
#define LATER_BYTES 400000000ull

static struct {
    int (*init)(void);
    int (*handle)(unsigned, void **);
    int (*memory)(void *, unsigned long long *);
    int (*processes)(void *, unsigned *, void *);
} nvml;

static void find_nvml(void)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) {
        printf("no NVML: %s\n", dlerror());
        exit(1);
    }
    *(void **)&nvml.init = dlsym(lib, "nvmlInit_v2");
    *(void **)&nvml.handle = dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&nvml.memory = dlsym(lib, "nvmlDeviceGetMemoryInfo");
    *(void **)&nvml.processes = dlsym(lib, "nvmlDeviceGetComputeRunningProcesses");
    if (!nvml.init || !nvml.handle || !nvml.memory || !nvml.processes || nvml.init()) {
        printf("NVML incomplete\n");
        exit(1);
    }
}

/* NVML's used bytes of device 0. */
static unsigned long long nvml_used(void)
{
    void *device;
    unsigned long long memory[3] = {0}; /* total, free, used */
    if (nvml.handle(0, &device) || nvml.memory(device, memory))
        return ~0ull;
    return memory[2];
}

static unsigned long long used(void)
{
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total))
        return ~0ull;
    return total - free_bytes;
}


static void send_byte(int fd) { (void)!write(fd, "x", 1); }
static void wait_byte(int fd)
{
    char c;
    if (read(fd, &c, 1) != 1)
        exit(3);
}

static _Noreturn void process_a(int to_launcher)
{
    void *p;
    int rc = cudaMalloc(&p, A_BYTES);
    printf("a malloc %llu rc=%d used=%llu\n", A_BYTES, rc, used());
    fflush(stdout);
    send_byte(to_launcher);
    for (;;)
        pause(); /* until killed */
}

static int process_b(int from_launcher, int to_launcher, int pid_a)
{
    find_nvml();
    size_t free_bytes = 0, total = 0;
    int rc = cudaMemGetInfo(&free_bytes, &total);
    printf("b info rc=%d total=%zu used=%zu nvml-used=%llu\n", rc, total, total - free_bytes,
           nvml_used());
    void *p = NULL;
    rc = cudaMalloc(&p, free_bytes + 1);
    printf("b malloc free+1=%zu rc=%d\n", free_bytes + 1, rc);
    rc = cudaMalloc(&p, free_bytes);
    printf("b malloc free=%zu rc=%d used=%llu\n", free_bytes, rc, used());
    struct {
        unsigned pid, pad;
        unsigned long long used;
    } listed[4];
    unsigned count = 4;
    void *device;
    rc = nvml.handle(0, &device) || nvml.processes(device, &count, listed);
    printf("b nvml processes rc=%d count=%u", rc, count);
    for (unsigned i = 0; i < count && i < 4; i++)
        printf(" %s=%llu",
               listed[i].pid == (unsigned)pid_a        ? "a"
               : listed[i].pid == (unsigned)getpid() ? "b"
                                                     : "other",
               listed[i].used);
    printf("\n");
    rc = cudaFree(p);
    printf("b free rc=%d used=%llu\n", rc, used());
    void *later;
    rc = cudaMalloc(&later, LATER_BYTES);
    printf("b malloc %llu rc=%d\n", LATER_BYTES, rc);
    fflush(stdout);
    send_byte(to_launcher);
    wait_byte(from_launcher); /* A has been killed */
    printf("b after a killed used=%llu nvml-used=%llu\n", used(), nvml_used());
    rc = cudaMalloc(&later, LATER_BYTES);
    printf("b malloc %llu rc=%d used=%llu\n", LATER_BYTES, rc, used());
    fflush(stdout);
    /* A fork child takes a slot of its own (it does not hold B's), given back at its exit. */
    pid_t child = fork();
    if (child == 0) {
        void *q;
        rc = cudaMalloc(&q, 1000);
        printf("b's fork child malloc 1000 rc=%d used=%llu\n", rc, used());
        fflush(stdout);
        _exit(0);
    }
    waitpid(child, NULL, 0);
    printf("b after its child exited used=%llu\n", used());
    fflush(stdout);
    return 0;
}

/* A racer of "race": its context made, it waits for the start, asks for RACE_BYTES, says
 * its result and keeps what it got until the launcher ends the race. */
#define RACERS 8
#define RACE_BYTES 600000000ull
static int racer(int start, int results, int end)
{
    cudaFree(NULL); /* the context first, so that the race is between the allocations */
    send_byte(results);
    wait_byte(start);
    void *p;
    char rc = (char)cudaMalloc(&p, RACE_BYTES);
    (void)!write(results, &rc, 1);
    char c;
    (void)!read(end, &c, 1); /* until the launcher closes it */
    return 0;
}

/* RACERS processes ask at once for RACE_BYTES of a card where two do not fit: one gets it. */
static int race(const char *self)
{
    int start[2], results[2], end[2];
    if (pipe(start) || pipe(results) || pipe(end))
        return 1;
    char a1[16], a2[16], a3[16];
    snprintf(a1, sizeof a1, "%d", start[0]);
    snprintf(a2, sizeof a2, "%d", results[1]);
    snprintf(a3, sizeof a3, "%d", end[0]);
    pid_t pids[RACERS];
    for (int i = 0; i < RACERS; i++)
        if ((pids[i] = fork()) == 0) {
            close(end[1]);
            execl("/proc/self/exe", self, "racer", a1, a2, a3, (char *)NULL);
            _exit(127);
        }
    for (int i = 0; i < RACERS; i++)
        wait_byte(results[0]); /* every racer has its context */
    char go[RACERS] = {0};
    (void)!write(start[1], go, sizeof go);
    int got = 0, refused = 0, other = 0;
    for (int i = 0; i < RACERS; i++) {
        char rc;
        if (read(results[0], &rc, 1) != 1)
            return 3;
        got += rc == 0;
        refused += rc == 2;
        other += rc != 0 && rc != 2;
    }
    close(end[1]);
    for (int i = 0; i < RACERS; i++)
        waitpid(pids[i], NULL, 0);
    printf("race %d processes for %llu bytes: got=%d out-of-memory=%d other=%d\n", RACERS,
           RACE_BYTES, got, refused, other);
    return 0;
}

/* "rounds": RACERS fork children (the launcher makes no CUDA call before, so each takes a
 * slot of its own) race ROUNDS times for RACE_BYTES. Between rounds they meet at a barrier in
 * shared memory; the first of them counts the round's winners; the winner gives its bytes
 * back before the next round starts. */
#define ROUNDS 300
#define TRIES 20000
struct arena {
    pthread_barrier_t barrier;
    char result[RACERS];
    int exactly_one, none, several, other;
    int holders, held_by_two, tries_got, tries_other;
};

static void rounds_racer(struct arena *arena, int me)
{
    cudaFree(NULL); /* the context first, so that the race is between the allocations */
    for (int round = 0; round < ROUNDS; round++) {
        pthread_barrier_wait(&arena->barrier);
        void *p;
        int rc = cudaMalloc(&p, RACE_BYTES);
        arena->result[me] = (char)rc;
        pthread_barrier_wait(&arena->barrier);
        if (me == 0) {
            int got = 0, other = 0;
            for (int i = 0; i < RACERS; i++) {
                got += arena->result[i] == 0;
                other += arena->result[i] != 0 && arena->result[i] != 2;
            }
            arena->exactly_one += got == 1;
            arena->none += got == 0;
            arena->several += got > 1;
            arena->other += other;
        }
        if (rc == 0)
            cudaFree(p);
        pthread_barrier_wait(&arena->barrier);
    }
    /* Then no rounds: each asks TRIES times, as fast as it can, and gives back at once; a
     * holder counts itself in shared memory while it holds, so two holding at once is seen. */
    for (int i = 0; i < TRIES; i++) {
        void *p;
        int rc = cudaMalloc(&p, RACE_BYTES);
        if (rc == 0) {
            if (__atomic_add_fetch(&arena->holders, 1, __ATOMIC_SEQ_CST) > 1)
                __atomic_add_fetch(&arena->held_by_two, 1, __ATOMIC_RELAXED);
            __atomic_add_fetch(&arena->tries_got, 1, __ATOMIC_RELAXED);
            __atomic_sub_fetch(&arena->holders, 1, __ATOMIC_SEQ_CST);
            cudaFree(p);
        } else if (rc != 2)
            __atomic_add_fetch(&arena->tries_other, 1, __ATOMIC_RELAXED);
    }
}

static int rounds(void)
{
    struct arena *arena = mmap(NULL, sizeof *arena, PROT_READ | PROT_WRITE,
                               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pthread_barrierattr_t shared;
    if (arena == MAP_FAILED || pthread_barrierattr_init(&shared) ||
        pthread_barrierattr_setpshared(&shared, PTHREAD_PROCESS_SHARED) ||
        pthread_barrier_init(&arena->barrier, &shared, RACERS))
        return 1;
    pid_t pids[RACERS];
    for (int i = 0; i < RACERS; i++)
        if ((pids[i] = fork()) == 0) {
            rounds_racer(arena, i);
            _exit(0);
        }
    int clean = 0;
    for (int i = 0; i < RACERS; i++) {
        int status;
        waitpid(pids[i], &status, 0);
        clean += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    find_nvml();
    printf("rounds %d processes x %d rounds for %llu bytes: exactly one got them=%d none=%d "
           "several=%d other errors=%d\n",
           RACERS, ROUNDS, RACE_BYTES, arena->exactly_one, arena->none, arena->several,
           arena->other);
    printf("tries %d processes x %d: some got them=%s held by two at once=%d other errors=%d\n",
           RACERS, TRIES, arena->tries_got > 0 ? "yes" : "no", arena->held_by_two,
           arena->tries_other);
    printf("exited cleanly=%d nvml-used after=%llu\n", clean, nvml_used());
    return 0;
}

/* "killed": HAMMERERS fork children allocate and free as fast as they can until SIGKILLed,
 * KILLINGS times over; each time, after they are gone, NVML in the launcher sees nothing in
 * use (a process killed between its two updates of the ledger must not leave the machine's
 * count wrong), and at the end the launcher takes the whole card but its context. */
#define HAMMERERS 4
#define KILLINGS 20
static int killed(void)
{
    find_nvml();
    int clean = 0;
    for (int k = 0; k < KILLINGS; k++) {
        pid_t pids[HAMMERERS];
        for (int i = 0; i < HAMMERERS; i++)
            if ((pids[i] = fork()) == 0) {
                for (size_t size = 1 << 20;; size = size * 3 % (200u << 20) + 4096) {
                    void *p;
                    if (cudaMalloc(&p, size) == 0)
                        cudaFree(p);
                }
            }
        usleep(20000);
        for (int i = 0; i < HAMMERERS; i++) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
        }
        clean += nvml_used() == 0;
    }
    void *p;
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    int rc = cudaMalloc(&p, free_bytes);
    printf("killed %d hammering processes %d times: nothing in use after=%d; then the launcher "
           "free=%zu malloc free rc=%d\n",
           HAMMERERS, KILLINGS, clean, free_bytes, rc);
    return 0;
}

/* "hold X Y": two fork children of the launcher (which makes no CUDA call) hold X and Y
 * bytes of device 0 at once, then both exit: two processes, two contexts on the card. */
static int hold(unsigned long long x, unsigned long long y)
{
    int ready[2], end[2];
    if (pipe(ready) || pipe(end))
        return 1;
    unsigned long long bytes[2] = {x, y};
    pid_t pids[2];
    for (int i = 0; i < 2; i++) {
        if ((pids[i] = fork()) == 0) {
            close(end[1]);
            void *p;
            char rc = (char)cudaMalloc(&p, bytes[i]);
            (void)!write(ready[1], &rc, 1);
            char c;
            (void)!read(end[0], &c, 1); /* until the launcher closes it */
            _exit(0);
        }
        char rc;
        if (read(ready[0], &rc, 1) != 1)
            return 3;
        printf("hold process %d malloc %llu rc=%d\n", i + 1, bytes[i], rc);
        fflush(stdout);
    }
    close(end[1]);
    for (int i = 0; i < 2; i++)
        waitpid(pids[i], NULL, 0);
    return 0;
}

int main(int argc, char **argv)
{
    alarm(60); /* a broken run ends instead of hanging the test */
    if (argc == 2 && strcmp(argv[1], "race") == 0)
        return race(argv[0]);
    if (argc == 2 && strcmp(argv[1], "rounds") == 0)
        return rounds();
    if (argc == 2 && strcmp(argv[1], "killed") == 0)
        return killed();
    if (argc == 4 && strcmp(argv[1], "hold") == 0)
        return hold(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10));
    if (argc == 5 && strcmp(argv[1], "racer") == 0)
        return racer(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
    if (argc == 3 && strcmp(argv[1], "a") == 0)
        process_a(atoi(argv[2]));
    if (argc == 5 && strcmp(argv[1], "b") == 0)
        return process_b(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));

    int a_out[2], b_out[2], b_in[2];
    if (pipe(a_out) || pipe(b_out) || pipe(b_in))
        return 1;
    char arg1[16], arg2[16], arg3[16];
    pid_t a = fork();
    if (a == 0) {
        snprintf(arg1, sizeof arg1, "%d", a_out[1]);
        execl("/proc/self/exe", argv[0], "a", arg1, (char *)NULL);
        _exit(127);
    }
    wait_byte(a_out[0]);
    pid_t b = fork();
    if (b == 0) {
        snprintf(arg1, sizeof arg1, "%d", b_in[0]);
        snprintf(arg2, sizeof arg2, "%d", b_out[1]);
        snprintf(arg3, sizeof arg3, "%d", (int)a);
        execl("/proc/self/exe", argv[0], "b", arg1, arg2, arg3, (char *)NULL);
        _exit(127);
    }
    wait_byte(b_out[0]);
    int status;
    kill(a, SIGKILL);
    waitpid(a, &status, 0);
    printf("launcher a ended by signal %d\n", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    fflush(stdout);
    send_byte(b_in[1]);
    waitpid(b, &status, 0);
    printf("launcher b exited %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    find_nvml();
    printf("launcher nvml-used=%llu\n", nvml_used());
    return 0;
}

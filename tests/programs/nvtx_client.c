/* An NVTX client as NVTX 3's headers build one (nvtxDetail/nvtxInit.h): at the first call it
 * dlopens NVTX_INJECTION64_PATH, calls the library's InitializeInjectionNvtx2 with its own
 * export-table function and then calls through the core function slots the library filled.
 * For tests/tests/hostile.rs (libvramshim_nvtx.so without a GPU or PyTorch).
 *
 *   nvtx_client basic                every core call once; prints each result
 *   nvtx_client fork-storm T N       T threads push/pop and start/end ranges (in the default
 *                                    domain and in a named one) while the main thread forks N
 *                                    children that do the same and exit; prints
 *                                    `forks N`, `hung H` (children still running after 10 s),
 *                                    `failed F` (children that did not exit 0: a domain
 *                                    range's level other than 0) and `outcomes` (one
 *                                    character a child, in fork order: `.` exited 0, `F` not)
 *   nvtx_client fork-tables T N      T threads create a domain over and over (the domain
 *                                    table's lock taken and released without pause, no mark)
 *                                    while the main thread forks N children that each create
 *                                    a domain and push and pop in it; prints `forks N`,
 *                                    `hung H`, `unnamed U` (children that got no domain)
 *   nvtx_client library LIB ARGS...  the same, calling an NVTX library's exported functions
 *                                    (the fake GPU's libnvToolsExt.so.1) instead: the library
 *                                    does the initialisation, at its first call, which in
 *                                    fork-storm the threads and the first child race for;
 *                                    prints `library 1` instead of `init 1`
 */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

typedef void (*slot_t)(void);
typedef const void *(*get_export_table_t)(uint32_t);
typedef int (*init_t)(get_export_table_t);

/* NvtxCallbackIdCore: 0 invalid, 1..15 (MarkEx .. NameOsThreadW). */
enum { MARK_EX = 1, MARK_A, MARK_W, START_EX, START_A, START_W, RANGE_END, PUSH_EX, PUSH_A,
       PUSH_W, POP, CORE_SIZE = 16 };

static slot_t core_slots[CORE_SIZE];
static slot_t *core_table[CORE_SIZE];

/* NvtxCallbackIdCore2 (module 5): 1..15 (DomainMarkEx .. Initialize). */
enum { D_PUSH_EX = 4, D_POP = 5, D_CREATE_A = 12, CORE2_SIZE = 16 };
static slot_t core2_slots[CORE2_SIZE];
static slot_t *core2_table[CORE2_SIZE];

static int get_module_function_table(int module, slot_t ***out_table, unsigned *out_size) {
    if (module == 1) {
        if (out_size) *out_size = CORE_SIZE - 1;
        if (out_table) *out_table = core_table;
        return 1;
    }
    if (module == 5) {
        if (out_size) *out_size = CORE2_SIZE - 1;
        if (out_table) *out_table = core2_table;
        return 1;
    }
    return 0;
}

static struct {
    size_t struct_size;
    int (*get_module_function_table)(int, slot_t ***, unsigned *);
} callbacks = {sizeof(callbacks), get_module_function_table};

static const void *get_export_table(uint32_t id) { return id == 1 ? (const void *)&callbacks : NULL; }

/* nvtxEventAttributes_v2 */
struct attributes {
    uint16_t version, size;
    uint32_t category;
    int32_t color_type;
    uint32_t color;
    int32_t payload_type, reserved0;
    uint64_t payload;
    int32_t message_type;
    const void *message;
};

static int initialise(void) {
    for (int i = 1; i < CORE_SIZE; i++) core_table[i] = &core_slots[i];
    for (int i = 1; i < CORE2_SIZE; i++) core2_table[i] = &core2_slots[i];
    const char *path = getenv("NVTX_INJECTION64_PATH");
    if (!path) return -1;
    void *library = dlopen(path, RTLD_LAZY);
    if (!library) return -2;
    init_t init = (init_t)dlsym(library, "InitializeInjectionNvtx2");
    if (!init) return -3;
    return init(get_export_table);
}

static int slot_push_a(const char *text) {
    return core_slots[PUSH_A] ? ((int (*)(const char *))core_slots[PUSH_A])(text) : -2;
}
static int slot_pop(void) { return core_slots[POP] ? ((int (*)(void))core_slots[POP])() : -2; }
static uint64_t slot_start_a(const char *text) {
    return core_slots[START_A] ? ((uint64_t(*)(const char *))core_slots[START_A])(text) : 0;
}
static void slot_range_end(uint64_t id) {
    if (core_slots[RANGE_END]) ((void (*)(uint64_t))core_slots[RANGE_END])(id);
}
static void *slot_domain_create(const char *name) {
    return core2_slots[D_CREATE_A] ? ((void *(*)(const char *))core2_slots[D_CREATE_A])(name)
                                   : NULL;
}
static int slot_domain_push_ex(void *domain, const struct attributes *ex) {
    return core2_slots[D_PUSH_EX]
               ? ((int (*)(void *, const struct attributes *))core2_slots[D_PUSH_EX])(domain, ex)
               : -2;
}
static int slot_domain_pop(void *domain) {
    return core2_slots[D_POP] ? ((int (*)(void *))core2_slots[D_POP])(domain) : -2;
}

/* The calls the modes make: through this client's slots, or an NVTX library's functions. */
static int (*push_a)(const char *) = slot_push_a;
static int (*pop)(void) = slot_pop;
static uint64_t (*start_a)(const char *) = slot_start_a;
static void (*range_end)(uint64_t) = slot_range_end;
static void *(*domain_create)(const char *) = slot_domain_create;
static int (*domain_push_ex)(void *, const struct attributes *) = slot_domain_push_ex;
static int (*domain_pop)(void *) = slot_domain_pop;

static int use_library(const char *path) {
    void *library = dlopen(path, RTLD_NOW);
    if (!library) return 0;
    push_a = (int (*)(const char *))dlsym(library, "nvtxRangePushA");
    pop = (int (*)(void))dlsym(library, "nvtxRangePop");
    start_a = (uint64_t(*)(const char *))dlsym(library, "nvtxRangeStartA");
    range_end = (void (*)(uint64_t))dlsym(library, "nvtxRangeEnd");
    domain_create = (void *(*)(const char *))dlsym(library, "nvtxDomainCreateA");
    domain_push_ex =
        (int (*)(void *, const struct attributes *))dlsym(library, "nvtxDomainRangePushEx");
    domain_pop = (int (*)(void *))dlsym(library, "nvtxDomainRangePop");
    return push_a && pop && start_a && range_end && domain_create && domain_push_ex && domain_pop;
}

static int domain_push(void *domain, const char *text) {
    struct attributes ex = {2, sizeof(struct attributes), 0, 0, 0, 0, 0, 0, 1, text};
    return domain_push_ex(domain, &ex);
}

static void basic(void) {
    printf("push outer %d\n", push_a("outer"));
    struct attributes ex = {2, sizeof(struct attributes), 0, 0, 0, 0, 0, 0, 1, "inner ex"};
    printf("push inner %d\n", ((int (*)(const struct attributes *))core_slots[PUSH_EX])(&ex));
    printf("pop %d\n", pop());
    printf("pop %d\n", pop());
    printf("pop %d\n", pop());
    ((void (*)(const char *))core_slots[MARK_A])("here");
    ((void (*)(const wchar_t *))core_slots[MARK_W])(L"wide \u00e9");
    uint64_t first = start_a("load");
    uint64_t second = start_a("save");
    printf("ids %d\n", first != 0 && second != 0 && first != second);
    range_end(first);
    range_end(second);
    range_end(12345);
}

static volatile int stop;

static void *ranges(void *arg) {
    (void)arg;
    while (!stop) {
        push_a("worker");
        range_end(start_a("worker range"));
        pop();
        /* The domain table's lock, taken here, may be held at a fork. */
        void *domain = domain_create("workers");
        domain_push(domain, "worker");
        domain_pop(domain);
        /* Every call is a mark: unthrottled, 8 threads write millions of them. */
        usleep(200);
    }
    return NULL;
}

/* Waits for `child` (its status in *status); one still running after 10 s is killed and
 * counted as hung: returns 0 then, 1 otherwise. */
static int wait_child(pid_t child, int *status) {
    struct timespec started, now;
    clock_gettime(CLOCK_MONOTONIC, &started);
    for (;;) {
        if (waitpid(child, status, WNOHANG) == child) return 1;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - started.tv_sec > 10) {
            kill(child, SIGKILL);
            waitpid(child, status, 0);
            return 0;
        }
        usleep(100);
    }
}

static void fork_storm(int threads, int forks) {
    pthread_t tids[64];
    if (threads > 64) threads = 64;
    for (int i = 0; i < threads; i++) pthread_create(&tids[i], NULL, ranges, NULL);
    int hung = 0, failed = 0;
    char outcomes[1025];
    if (forks > 1024) forks = 1024;
    for (int i = 0; i < forks; i++) {
        pid_t child = fork();
        if (child == 0) {
            push_a("child");
            range_end(start_a("child range"));
            pop();
            void *domain = domain_create("children");
            if (domain_push(domain, "child") != 0 || domain_pop(domain) != 0) _exit(4);
            _exit(0);
        }
        int status = 0;
        if (!wait_child(child, &status)) hung++;
        int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok) failed++;
        outcomes[i] = ok ? '.' : 'F';
    }
    outcomes[forks] = '\0';
    stop = 1;
    for (int i = 0; i < threads; i++) pthread_join(tids[i], NULL);
    printf("forks %d\nhung %d\nfailed %d\noutcomes %s\n", forks, hung, failed, outcomes);
}

static void *create_domains(void *arg) {
    (void)arg;
    while (!stop) domain_create("workers");
    return NULL;
}

static void fork_tables(int threads, int forks) {
    pthread_t tids[64];
    if (threads > 64) threads = 64;
    for (int i = 0; i < threads; i++) pthread_create(&tids[i], NULL, create_domains, NULL);
    int hung = 0, unnamed = 0;
    for (int i = 0; i < forks; i++) {
        pid_t child = fork();
        if (child == 0) {
            void *domain = domain_create("children");
            if (!domain) _exit(5);
            domain_push(domain, "child");
            domain_pop(domain);
            _exit(0);
        }
        int status = 0;
        if (!wait_child(child, &status)) hung++;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 5) unnamed++;
    }
    stop = 1;
    for (int i = 0; i < threads; i++) pthread_join(tids[i], NULL);
    printf("forks %d\nhung %d\nunnamed %d\n", forks, hung, unnamed);
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "library") == 0) {
        int loaded = use_library(argv[2]);
        printf("library %d\n", loaded);
        if (!loaded) return 0;
        argc -= 2;
        argv += 2;
    } else {
        int status = initialise();
        printf("init %d\n", status);
        if (status != 1) return 0;
    }
    if (argc >= 2 && strcmp(argv[1], "basic") == 0) basic();
    else if (argc >= 4 && strcmp(argv[1], "fork-storm") == 0) fork_storm(atoi(argv[2]), atoi(argv[3]));
    else if (argc >= 4 && strcmp(argv[1], "fork-tables") == 0) fork_tables(atoi(argv[2]), atoi(argv[3]));
    fflush(stdout);
    return 0;
}

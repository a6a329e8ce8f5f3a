/* CUDA IPC between two processes on the fake runtime. The producer (no argument) allocates
 * device memory, fills it, exports a memory handle and an event handle, and starts a consumer
 * (itself, exec'd with "consumer RFD WFD": a fresh process, not a fork copy); the two talk
 * through a pipe each way. The consumer opens the handle, reads the producer's values, writes
 * its own and zeros a page range; the producer reads them back, writes again, the consumer
 * reads that; then references, closing, bad and stale handles, and the producer freeing while
 * the consumer has the memory open, a VMM handle exported as a POSIX file descriptor, and
 * handles of a process that has exited (or, given
 * "crash", been killed). One line per step, prefixed by who printed it; the
 * consumer's lines are flushed before it answers, so the output's order is fixed.
 * Built with -DCUDA_MAJOR=13 or 12 (the same calls). */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int cudaError_t;
typedef void *cudaEvent_t;
typedef void *cudaStream_t;
typedef struct {
    char reserved[64];
} cudaIpcMemHandle_t;
typedef struct {
    char reserved[64];
} cudaIpcEventHandle_t;
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind);
cudaError_t cudaMemset(void *p, int value, size_t n);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *p);
cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t handle, unsigned flags);
cudaError_t cudaIpcCloseMemHandle(void *p);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *handle, cudaEvent_t e);
cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *e, cudaIpcEventHandle_t handle);
cudaError_t cudaGetLastError(void);

/* The driver's VMM calls, looked up as a program linked with -lcuda would call them. */
typedef unsigned long long dptr_t;
typedef struct {
    int type, handle_types;
    int location_type, location_id;
    void *win32;
    unsigned char flags[8];
} alloc_prop_t;
typedef struct {
    int location_type, location_id;
    unsigned long long flags;
} access_desc_t;
static struct {
    int (*create)(unsigned long long *, size_t, const alloc_prop_t *, unsigned long long);
    int (*reserve)(dptr_t *, size_t, size_t, dptr_t, unsigned long long);
    int (*map)(dptr_t, size_t, size_t, unsigned long long, unsigned long long);
    int (*access)(dptr_t, size_t, const access_desc_t *, size_t);
    int (*export_fd)(void *, unsigned long long, int, unsigned long long);
    int (*import_fd)(unsigned long long *, void *, int);
    int (*unmap)(dptr_t, size_t);
    int (*release)(unsigned long long);
    int (*address_free)(dptr_t, size_t);
} vmm;
#define VMM_BYTES (2u << 20)
#define POSIX_FD 1
#define FABRIC 8

static void find_vmm(void)
{
    *(void **)&vmm.create = dlsym(RTLD_DEFAULT, "cuMemCreate");
    *(void **)&vmm.reserve = dlsym(RTLD_DEFAULT, "cuMemAddressReserve");
    *(void **)&vmm.map = dlsym(RTLD_DEFAULT, "cuMemMap");
    *(void **)&vmm.access = dlsym(RTLD_DEFAULT, "cuMemSetAccess");
    *(void **)&vmm.export_fd = dlsym(RTLD_DEFAULT, "cuMemExportToShareableHandle");
    *(void **)&vmm.import_fd = dlsym(RTLD_DEFAULT, "cuMemImportFromShareableHandle");
    *(void **)&vmm.unmap = dlsym(RTLD_DEFAULT, "cuMemUnmap");
    *(void **)&vmm.release = dlsym(RTLD_DEFAULT, "cuMemRelease");
    *(void **)&vmm.address_free = dlsym(RTLD_DEFAULT, "cuMemAddressFree");
    if (!vmm.create || !vmm.reserve || !vmm.map || !vmm.access || !vmm.export_fd ||
        !vmm.import_fd || !vmm.unmap || !vmm.release || !vmm.address_free) {
        fprintf(stderr, "ipc_pair: the driver's VMM calls are missing\n");
        exit(3);
    }
}

/* Reserves VMM_BYTES and maps HANDLE there, readable and writable on device 0. */
static int map_handle(unsigned long long handle, dptr_t *va)
{
    access_desc_t desc = {1, 0, 3};
    int rc = vmm.reserve(va, VMM_BYTES, 0, 0, 0);
    if (!rc)
        rc = vmm.map(*va, VMM_BYTES, 0, handle, 0);
    return rc ? rc : vmm.access(*va, VMM_BYTES, &desc, 1);
}

#define H2D 1
#define D2H 2
#define LAZY_PEER 1u
#define EVENT_DISABLE_TIMING 2u
#define EVENT_INTERPROCESS 4u
#define WORDS ((1u << 20) / 4 + 25) /* 1 MiB + 100 bytes: not a whole number of pages */
#define ZERO_FROM 65536u          /* the consumer zeros bytes [64 KiB, 192 KiB) */
#define ZERO_BYTES 131072u

static uint32_t host[WORDS];

/* The pipe's messages: a handle or a one-word step. */
static void send_bytes(int fd, const void *p, size_t n)
{
    if (write(fd, p, n) != (ssize_t)n) {
        perror("ipc_pair: write");
        exit(3);
    }
}
static void receive_bytes(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)p + got, n - got);
        if (r <= 0) {
            fprintf(stderr, "ipc_pair: the other process stopped\n");
            exit(3);
        }
        got += (size_t)r;
    }
}
static void say(int fd, char step) { send_bytes(fd, &step, 1); }
static void await(int fd, char step)
{
    char got;
    receive_bytes(fd, &got, 1);
    if (got != step) {
        fprintf(stderr, "ipc_pair: expected step %c, got %c\n", step, got);
        exit(3);
    }
}

/* Which words of the device memory at P hold EXPECT(i) ("ok" or the first one that does not). */
static void check(const char *who, const char *what, void *p, uint32_t (*expect)(uint32_t))
{
    memset(host, 0xee, sizeof host);
    int rc = cudaMemcpy(host, p, sizeof host, D2H);
    for (uint32_t i = 0; i < WORDS; i++)
        if (host[i] != expect(i)) {
            printf("%s %s rc=%d word %u is %u, not %u\n", who, what, rc, i, host[i], expect(i));
            return;
        }
    printf("%s %s rc=%d all %u words\n", who, what, rc, WORDS);
}

static void fill(void *p, uint32_t (*value)(uint32_t), const char *who, const char *what)
{
    for (uint32_t i = 0; i < WORDS; i++)
        host[i] = value(i);
    printf("%s %s rc=%d\n", who, what, cudaMemcpy(p, host, sizeof host, H2D));
}

/* The memory files this process holds for its exported allocations: how many, and their
 * modes (octal) as one would open them through /proc. */
static void memory_files(void)
{
    DIR *fds = opendir("/proc/self/fd");
    struct dirent *entry;
    char path[300], link[256];
    int count = 0;
    unsigned modes = 0;
    while (fds && (entry = readdir(fds))) {
        snprintf(path, sizeof path, "/proc/self/fd/%s", entry->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        struct stat st;
        if (n <= 0)
            continue;
        link[n] = 0;
        if (strncmp(link, "/memfd:vramshim-ipc-", 20) == 0 && stat(path, &st) == 0) {
            count++;
            modes |= st.st_mode & 07777;
        }
    }
    if (fds)
        closedir(fds);
    printf("producer memory files=%d mode=%o\n", count, modes);
}

static uint32_t produced(uint32_t i) { return i * 3 + 1; }
static uint32_t consumed(uint32_t i)
{
    if (i * 4 >= ZERO_FROM && i * 4 < ZERO_FROM + ZERO_BYTES)
        return 0;
    return i < WORDS / 2 ? i * 7 + 5 : produced(i);
}
static uint32_t reproduced(uint32_t i) { return i == 12345 ? 0xC0FFEEu : consumed(i); }

static int consumer(int rfd, int wfd)
{
    cudaIpcMemHandle_t handle, kept_handle;
    cudaIpcEventHandle_t event_handle;
    size_t free0, free1, total;
    void *p = NULL, *again = NULL, *kept = NULL;
    cudaEvent_t event = NULL;
    receive_bytes(rfd, &handle, sizeof handle);
    receive_bytes(rfd, &event_handle, sizeof event_handle);
    receive_bytes(rfd, &kept_handle, sizeof kept_handle);
    printf("consumer open-kept rc=%d\n", cudaIpcOpenMemHandle(&kept, kept_handle, LAZY_PEER));
    /* The driver's calls too, as a program linked with -lcuda makes them. */
    int (*cu_open)(unsigned long long *, cudaIpcMemHandle_t, unsigned) =
        (int (*)(unsigned long long *, cudaIpcMemHandle_t, unsigned))dlsym(RTLD_DEFAULT,
                                                                           "cuIpcOpenMemHandle_v2");
    int (*cu_close)(unsigned long long) =
        (int (*)(unsigned long long))dlsym(RTLD_DEFAULT, "cuIpcCloseMemHandle");
    unsigned long long driver_kept = 0;
    int driver_rc = cu_open ? cu_open(&driver_kept, kept_handle, LAZY_PEER) : -1;
    printf("consumer driver open-kept rc=%d same=%d close rc=%d\n", driver_rc,
           driver_kept == (unsigned long long)kept, cu_close ? cu_close(driver_kept) : -1);

    cudaMemGetInfo(&free0, &total);
    int rc = cudaIpcOpenMemHandle(&p, handle, LAZY_PEER);
    cudaMemGetInfo(&free1, &total);
    printf("consumer open rc=%d charged=%zd\n", rc, (ssize_t)(free0 - free1));
    check("consumer", "reads the producer's values", p, produced);
    rc = cudaIpcOpenEventHandle(&event, event_handle);
    int wait_rc = cudaStreamWaitEvent(NULL, event, 0);
    int query_rc = cudaEventQuery(event);
    printf("consumer open-event rc=%d wait=%d query=%d destroy=%d\n", rc, wait_rc, query_rc,
           cudaEventDestroy(event));

    /* VMM: the producer's exported descriptor, taken through /proc as pidfd_getfd would. */
    int vmm_fd_there;
    receive_bytes(rfd, &vmm_fd_there, sizeof vmm_fd_there);
    char vmm_path[64];
    snprintf(vmm_path, sizeof vmm_path, "/proc/%d/fd/%d", (int)getppid(), vmm_fd_there);
    int vmm_fd = open(vmm_path, O_RDWR | O_CLOEXEC);
    unsigned long long imported = 0, not_exported = 0;
    dptr_t vmm_va = 0;
    find_vmm();
    int import_rc = vmm.import_fd(&imported, (void *)(intptr_t)vmm_fd, POSIX_FD);
    int pipe_rc = vmm.import_fd(&not_exported, (void *)(intptr_t)rfd, POSIX_FD);
    close(vmm_fd);
    cudaMemGetInfo(&free0, &total);
    rc = map_handle(imported, &vmm_va);
    cudaMemGetInfo(&free1, &total);
    uint32_t vmm_word = 0, vmm_reply = 0x77777777;
    int read_rc = cudaMemcpy(&vmm_word, (char *)vmm_va + VMM_BYTES - 8, 4, D2H);
    int write_rc = cudaMemcpy((char *)vmm_va + 16, &vmm_reply, 4, H2D);
    printf("consumer vmm import=%d not-exported=%d map=%d charged=%zd read=%d word=%#x write=%d\n",
           import_rc, pipe_rc, rc, (ssize_t)(free0 - free1), read_rc, vmm_word, write_rc);

    for (uint32_t i = 0; i < WORDS; i++)
        host[i] = i < WORDS / 2 ? i * 7 + 5 : produced(i);
    rc = cudaMemcpy(p, host, sizeof host / 2, H2D);
    printf("consumer writes half rc=%d zeros rc=%d\n", rc,
           cudaMemset((char *)p + ZERO_FROM, 0, ZERO_BYTES));
    fflush(stdout);
    say(wfd, 'w');

    await(rfd, 'p');
    check("consumer", "reads the producer's new word", p, reproduced);

    rc = cudaIpcOpenMemHandle(&again, handle, LAZY_PEER);
    printf("consumer open-again rc=%d same=%d\n", rc, again == p);
    printf("consumer close rc=%d\n", cudaIpcCloseMemHandle(p));
    check("consumer", "still mapped after one close", p, reproduced);
    printf("consumer close rc=%d\n", cudaIpcCloseMemHandle(p));
    rc = cudaIpcCloseMemHandle(p);
    printf("consumer close-closed rc=%d last=%d\n", rc, cudaGetLastError());

    void *first = p;
    cudaIpcMemHandle_t bad;
    memset(&bad, 0, sizeof bad);
    printf("consumer open-zeros rc=%d\n", cudaIpcOpenMemHandle(&again, bad, LAZY_PEER));
    bad = handle;
    bad.reserved[8] ^= 1; /* another memory file's name */
    printf("consumer open-altered rc=%d\n", cudaIpcOpenMemHandle(&again, bad, LAZY_PEER));
    printf("consumer open-bad-flags rc=%d\n", cudaIpcOpenMemHandle(&again, handle, 2));
    cudaGetLastError();

    /* The producer frees while the memory is open here. */
    rc = cudaIpcOpenMemHandle(&p, handle, LAZY_PEER);
    printf("consumer reopen rc=%d\n", rc);
    fflush(stdout);
    say(wfd, 'o');
    await(rfd, 'f');
    check("consumer", "reads after the producer freed", p, reproduced);
    printf("consumer close rc=%d\n", cudaIpcCloseMemHandle(p));
    printf("consumer open-freed rc=%d\n", cudaIpcOpenMemHandle(&again, handle, LAZY_PEER));
    fflush(stdout);
    int unmap_rc = vmm.unmap(vmm_va, VMM_BYTES);
    int release_rc = vmm.release(imported);
    int address_free_rc = vmm.address_free(vmm_va, VMM_BYTES);
    printf("consumer vmm unmap=%d release=%d free=%d\n", unmap_rc, release_rc, address_free_rc);
    fflush(stdout);
    say(wfd, 'c');
    char end;
    if (read(rfd, &end, 1) != 0) { /* end of file: the producer has exited */
        fprintf(stderr, "ipc_pair: the producer did not exit\n");
        return 3;
    }
    uint32_t word = 0;
    rc = cudaMemcpy(&word, (char *)kept + 4092, 4, D2H);
    printf("consumer reads an exited producer's memory rc=%d word=%#x\n", rc, word);
    printf("consumer close rc=%d\n", cudaIpcCloseMemHandle(kept));
    printf("consumer open-of-exited rc=%d\n", cudaIpcOpenMemHandle(&again, kept_handle, LAZY_PEER));
    printf("consumer open-event-of-exited rc=%d\n", cudaIpcOpenEventHandle(&event, event_handle));
    printf("consumer mapped kept=%p memory=%p reopened=%p vmm=%#llx\n", kept, first, p, vmm_va);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "consumer"))
        return consumer(atoi(argv[2]), atoi(argv[3]));

    int to_consumer[2], to_producer[2];
    if (pipe(to_consumer) || pipe(to_producer)) {
        perror("ipc_pair: pipe");
        return 3;
    }
    void *p = NULL, *own = NULL;
    size_t free0, free1, total;
    cudaIpcMemHandle_t handle, interior;
    cudaIpcEventHandle_t event_handle, timed_handle;
    cudaEvent_t event, timed;

    void *kept = NULL; /* exported and never freed: the consumer uses it after this exits */
    cudaIpcMemHandle_t kept_handle;
    printf("producer malloc rc=%d\n", cudaMalloc(&p, WORDS * 4));
    cudaMalloc(&kept, 4096);
    uint32_t word = 0x42424242;
    int rc = cudaMemcpy((char *)kept + 4092, &word, 4, H2D);
    printf("producer kept rc=%d handle rc=%d\n", rc, cudaIpcGetMemHandle(&kept_handle, kept));
    fill(p, produced, "producer", "fills");
    cudaMemGetInfo(&free0, &total);
    rc = cudaIpcGetMemHandle(&handle, p);
    int rc2 = cudaIpcGetMemHandle(&interior, (char *)p + 4096);
    cudaMemGetInfo(&free1, &total);
    printf("producer handle rc=%d interior rc=%d same=%d charged=%zd\n", rc, rc2,
           !memcmp(&handle, &interior, sizeof handle), (ssize_t)(free0 - free1));
    check("producer", "reads its values after export", p, produced);
    memory_files();
    printf("producer open-own rc=%d\n", cudaIpcOpenMemHandle(&own, handle, LAZY_PEER));
    cudaGetLastError();

    cudaEventCreateWithFlags(&timed, 0);
    printf("producer event-handle-of-timed rc=%d\n", cudaIpcGetEventHandle(&timed_handle, timed));
    cudaGetLastError();
    cudaEventCreateWithFlags(&event, EVENT_DISABLE_TIMING | EVENT_INTERPROCESS);
    cudaEventRecord(event, NULL);
    printf("producer event-handle rc=%d\n", cudaIpcGetEventHandle(&event_handle, event));

    /* VMM: a handle created for POSIX descriptors, written before and read after export. */
    find_vmm();
    alloc_prop_t prop = {1, POSIX_FD, 1, 0, NULL, {0}};
    unsigned long long vmm_handle = 0, plain_handle = 0;
    dptr_t vmm_va = 0;
    int vmm_fd = -1, unrequested_fd = -1, fabric_fd = -1;
    int create_rc = vmm.create(&vmm_handle, VMM_BYTES, &prop, 0);
    int map_rc = map_handle(vmm_handle, &vmm_va);
    uint32_t vmm_word = 0x5a5a0001;
    int write_rc = cudaMemcpy((char *)vmm_va + VMM_BYTES - 8, &vmm_word, 4, H2D);
    int export_rc = vmm.export_fd(&vmm_fd, vmm_handle, POSIX_FD, 0);
    prop.handle_types = 0;
    vmm.create(&plain_handle, VMM_BYTES, &prop, 0);
    int unrequested_rc = vmm.export_fd(&unrequested_fd, plain_handle, POSIX_FD, 0);
    vmm.release(plain_handle);
    int fabric_rc = vmm.export_fd(&fabric_fd, vmm_handle, FABRIC, 0);
    vmm_word = 0;
    int read_rc = cudaMemcpy(&vmm_word, (char *)vmm_va + VMM_BYTES - 8, 4, D2H);
    printf("producer vmm create=%d map=%d write=%d export=%d unrequested=%d fabric=%d read=%d "
           "word=%#x\n",
           create_rc, map_rc, write_rc, export_rc, unrequested_rc, fabric_rc, read_rc, vmm_word);
    fflush(stdout);

    pid_t child = fork();
    if (child == 0) {
        char rfd[16], wfd[16];
        snprintf(rfd, sizeof rfd, "%d", to_consumer[0]);
        snprintf(wfd, sizeof wfd, "%d", to_producer[1]);
        close(to_consumer[1]);
        close(to_producer[0]);
        execl("/proc/self/exe", argv[0], "consumer", rfd, wfd, (char *)NULL);
        perror("ipc_pair: exec");
        _exit(3);
    }
    int wfd = to_consumer[1], rfd = to_producer[0];
    close(to_consumer[0]);
    close(to_producer[1]);
    send_bytes(wfd, &handle, sizeof handle);
    send_bytes(wfd, &event_handle, sizeof event_handle);
    send_bytes(wfd, &kept_handle, sizeof kept_handle);
    send_bytes(wfd, &vmm_fd, sizeof vmm_fd);

    await(rfd, 'w');
    check("producer", "sees the consumer's writes", p, consumed);
    vmm_word = 0;
    rc = cudaMemcpy(&vmm_word, (char *)vmm_va + 16, 4, D2H);
    printf("producer vmm sees the consumer's word rc=%d word=%#x\n", rc, vmm_word);
    host[0] = 0xC0FFEEu;
    printf("producer writes one word rc=%d\n",
           cudaMemcpy((uint32_t *)p + 12345, host, 4, H2D));
    fflush(stdout);
    say(wfd, 'p');

    await(rfd, 'o');
    cudaMemGetInfo(&free0, &total);
    rc = cudaFree(p);
    cudaMemGetInfo(&free1, &total);
    printf("producer free-while-open rc=%d gave_back=%zd\n", rc, (ssize_t)(free1 - free0));
    /* New memory at the same address gets a new handle, as the driver documents. */
    void *renewed = NULL;
    cudaIpcMemHandle_t renewed_handle;
    cudaMalloc(&renewed, WORDS * 4);
    rc = cudaIpcGetMemHandle(&renewed_handle, renewed);
    printf("producer new allocation rc=%d same-address=%d new-handle=%d\n", rc, renewed == p,
           memcmp(&renewed_handle, &handle, sizeof handle) != 0);
    fflush(stdout);
    say(wfd, 'f');
    await(rfd, 'c');
    /* Exiting ends the consumer's pipe: its last step opens the handles of a process gone.
     * "crash": killed instead, leaving what it holds to the kernel. */
    (void)child;
    if (argc == 2 && !strcmp(argv[1], "crash"))
        raise(SIGKILL);
    return 0;
}

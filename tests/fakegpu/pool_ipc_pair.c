/* Stream-ordered pool memory shared between two processes on the fake runtime. The producer (no
 * argument) creates a pool with handleTypes = POSIX file descriptor, allocates from it, fills
 * the allocation, exports the pool as a descriptor and the pointer as export data, and starts
 * a consumer (itself, exec'd with "consumer RFD WFD": a fresh process); the two talk through a
 * pipe each way. The consumer takes the pool's descriptor through /proc (as pidfd_getfd
 * would), imports the pool and the pointer, reads the producer's values and writes its own;
 * the producer reads them back. Then the error codes (a pool made without the handle type,
 * the default pool, a fabric handle, flags, a freed pointer, a pipe as a pool, the wrong pool,
 * altered data, allocating from an imported pool), a second import through the driver, the
 * importer's frees (cudaFree, cuMemFree, cudaFreeAsync), and the producer freeing and
 * allocating again at the same address with new data. One line per step, prefixed by who
 * printed it; the consumer flushes before it answers, so the output's order is fixed; the
 * last line gives the consumer's addresses. Built with -DCUDA_MAJOR=13 or 12 (the same calls). */
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaMemPool_t;
typedef struct {
    unsigned char reserved[64];
} cudaMemPoolPtrExportData;
typedef struct {
    int allocType, handleTypes;
    int location_type, location_id;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} cudaMemPoolProps;
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s);
cudaError_t cudaMallocFromPoolAsync(void **p, size_t size, cudaMemPool_t pool, cudaStream_t s);
cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const cudaMemPoolProps *props);
cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device);
cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t pool);
cudaError_t cudaMemPoolExportToShareableHandle(void *handle, cudaMemPool_t pool, int type,
                                               unsigned flags);
cudaError_t cudaMemPoolImportFromShareableHandle(cudaMemPool_t *pool, void *handle, int type,
                                                 unsigned flags);
cudaError_t cudaMemPoolExportPointer(cudaMemPoolPtrExportData *data, void *p);
cudaError_t cudaMemPoolImportPointer(void **p, cudaMemPool_t pool, cudaMemPoolPtrExportData *data);
cudaError_t cudaPointerGetAttributes(void *attributes, const void *p);
cudaError_t cudaGetLastError(void);

/* The driver's calls, looked up as a program linked with -lcuda would call them. */
typedef unsigned long long dptr_t;
static struct {
    int (*import_pointer)(dptr_t *, void *, cudaMemPoolPtrExportData *);
    int (*free)(dptr_t);
    int (*pool_of)(void *, int, dptr_t);
} driver;

#define H2D 1
#define D2H 2
#define POSIX_FD 1
#define FABRIC 8
#define POINTER_ATTRIBUTE_MEMPOOL_HANDLE 17
#define WORDS ((1u << 20) / 4 + 25) /* 1 MiB + 100 bytes: rounded by the pool to 512 */
static uint32_t host[WORDS];

static void send_bytes(int fd, const void *p, size_t n)
{
    if (write(fd, p, n) != (ssize_t)n) {
        perror("pool_ipc_pair: write");
        exit(3);
    }
}
static void receive_bytes(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)p + got, n - got);
        if (r <= 0) {
            fprintf(stderr, "pool_ipc_pair: the other process stopped\n");
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
        fprintf(stderr, "pool_ipc_pair: expected step %c, got %c\n", step, got);
        exit(3);
    }
}

static uint32_t produced(uint32_t i) { return i * 3 + 1; }
static uint32_t consumed(uint32_t i) { return i < WORDS / 2 ? i * 7 + 5 : produced(i); }
static uint32_t renewed(uint32_t i) { return i ^ 0x5a5a5a5au; }

/* Whether the device memory at P holds EXPECT(i) in every word. */
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

static int fill(void *p, uint32_t (*value)(uint32_t), size_t words)
{
    for (uint32_t i = 0; i < words; i++)
        host[i] = value(i);
    return cudaMemcpy(p, host, words * 4, H2D);
}

static size_t used_bytes(void)
{
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    return total - free_bytes;
}

static void find_driver(void)
{
    *(void **)&driver.import_pointer = dlsym(RTLD_DEFAULT, "cuMemPoolImportPointer");
    *(void **)&driver.free = dlsym(RTLD_DEFAULT, "cuMemFree_v2");
    *(void **)&driver.pool_of = dlsym(RTLD_DEFAULT, "cuPointerGetAttribute");
    if (!driver.import_pointer || !driver.free || !driver.pool_of) {
        fprintf(stderr, "pool_ipc_pair: the driver's calls are missing\n");
        exit(3);
    }
}

static int consumer(int rfd, int wfd)
{
    int pool_fd_there;
    cudaMemPoolPtrExportData data, altered;
    receive_bytes(rfd, &pool_fd_there, sizeof pool_fd_there);
    receive_bytes(rfd, &data, sizeof data);
    find_driver();
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)getppid(), pool_fd_there);
    int pool_fd = open(path, O_RDWR | O_CLOEXEC);
    cudaMemPool_t pool = NULL, not_pool = NULL, own = NULL;
    size_t used0 = used_bytes();
    int rc = cudaMemPoolImportFromShareableHandle(&pool, (void *)(intptr_t)pool_fd, POSIX_FD, 0);
    int pipe_rc = cudaMemPoolImportFromShareableHandle(&not_pool, (void *)(intptr_t)rfd, POSIX_FD, 0);
    int flags_rc = cudaMemPoolImportFromShareableHandle(&not_pool, (void *)(intptr_t)pool_fd,
                                                        POSIX_FD, 1);
    int fabric_rc = cudaMemPoolImportFromShareableHandle(&not_pool, (void *)(intptr_t)pool_fd,
                                                         FABRIC, 0);
    close(pool_fd);
    printf("consumer import-pool rc=%d pipe=%d flags=%d fabric=%d\n", rc, pipe_rc, flags_rc,
           fabric_rc);

    void *p = NULL, *again = NULL, *wrong = NULL, *from_imported = NULL;
    cudaDeviceGetDefaultMemPool(&own, 0);
    int wrong_pool = cudaMemPoolImportPointer(&wrong, own, &data);
    memcpy(&altered, &data, sizeof altered);
    altered.reserved[8] ^= 1; /* the pool's name */
    int altered_rc = cudaMemPoolImportPointer(&wrong, pool, &altered);
    memset(&altered, 0, sizeof altered);
    int zeros_rc = cudaMemPoolImportPointer(&wrong, pool, &altered);
    rc = cudaMemPoolImportPointer(&p, pool, &data);
    printf("consumer import rc=%d charged=%zd wrong-pool=%d altered=%d zeros=%d\n", rc,
           (ssize_t)(used_bytes() - used0), wrong_pool, altered_rc, zeros_rc);
    void *attributed = NULL;
    int attribute_rc = driver.pool_of(&attributed, POINTER_ATTRIBUTE_MEMPOOL_HANDLE, (dptr_t)p);
    printf("consumer pointer's pool rc=%d imported=%d\n", attribute_rc, attributed == pool);
    int alloc_rc = cudaMallocFromPoolAsync(&from_imported, 4096, pool, NULL);
    int set_rc = cudaDeviceSetMemPool(0, pool);
    printf("consumer alloc-from-imported rc=%d set-device-pool rc=%d last=%d\n", alloc_rc, set_rc,
           cudaGetLastError());
    check("consumer", "reads the producer's values", p, produced);
    fflush(stdout);
    say(wfd, 'R');

    await(rfd, 'W');
    printf("consumer writes half rc=%d\n", fill(p, consumed, WORDS / 2));
    fflush(stdout);
    say(wfd, 'w');

    await(rfd, 'D');
    dptr_t driver_p = 0;
    rc = driver.import_pointer(&driver_p, pool, &data);
    printf("consumer driver import rc=%d same=%d\n", rc, driver_p == (dptr_t)p);
    rc = cudaFree(p);
    check("consumer", "still mapped after one free", p, consumed);
    int driver_free = driver.free(driver_p);
    int again_rc = cudaFree(p);
    printf("consumer free rc=%d driver-free rc=%d again rc=%d last=%d\n", rc, driver_free,
           again_rc, cudaGetLastError());
    rc = cudaMemPoolImportPointer(&again, pool, &data);
    int async_rc = cudaFreeAsync(again, NULL);
    printf("consumer reimport rc=%d free-async rc=%d sync rc=%d\n", rc, async_rc,
           cudaStreamSynchronize(NULL));
    fflush(stdout);
    say(wfd, 'd');

    /* The producer freed the pointer and made a new one at the same address. */
    await(rfd, 'N');
    cudaMemPoolPtrExportData renewed_data;
    receive_bytes(rfd, &renewed_data, sizeof renewed_data);
    void *renewed_p = NULL;
    int stale_rc = cudaMemPoolImportPointer(&wrong, pool, &data);
    rc = cudaMemPoolImportPointer(&renewed_p, pool, &renewed_data);
    printf("consumer import-freed rc=%d import-new rc=%d\n", stale_rc, rc);
    check("consumer", "reads the new values", renewed_p, renewed);
    rc = cudaFree(renewed_p);
    printf("consumer free rc=%d destroy rc=%d\n", rc, cudaMemPoolDestroy(pool));
    fflush(stdout);
    say(wfd, 'n');
    printf("consumer addresses p=%p again=%p renewed=%p\n", p, again, renewed_p);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 4 && strcmp(argv[1], "consumer") == 0)
        return consumer(atoi(argv[2]), atoi(argv[3]));

    cudaMemPoolProps props = {0};
    props.allocType = 1; /* pinned */
    props.handleTypes = POSIX_FD;
    props.location_type = 1; /* device */
    props.location_id = 0;
    cudaMemPool_t pool = NULL, plain = NULL, default_pool = NULL;
    int rc = cudaMemPoolCreate(&pool, &props);
    props.handleTypes = 0;
    int plain_rc = cudaMemPoolCreate(&plain, &props);
    printf("producer pools rc=%d plain=%d\n", rc, plain_rc);

    void *p = NULL, *q = NULL, *r = NULL;
    size_t used0 = used_bytes();
    rc = cudaMallocFromPoolAsync(&p, sizeof host, pool, NULL);
    int q_rc = cudaMallocFromPoolAsync(&q, 4096, plain, NULL);
    int r_rc = cudaMallocAsync(&r, 4096, NULL);
    printf("producer allocs rc=%d rc=%d rc=%d charged=%zu fill rc=%d\n", rc, q_rc, r_rc,
           used_bytes() - used0, fill(p, produced, WORDS));

    int pool_fd = -1, other_fd = -1;
    cudaDeviceGetDefaultMemPool(&default_pool, 0);
    rc = cudaMemPoolExportToShareableHandle(&pool_fd, pool, POSIX_FD, 0);
    int plain_export = cudaMemPoolExportToShareableHandle(&other_fd, plain, POSIX_FD, 0);
    int default_export = cudaMemPoolExportToShareableHandle(&other_fd, default_pool, POSIX_FD, 0);
    int fabric_export = cudaMemPoolExportToShareableHandle(&other_fd, pool, FABRIC, 0);
    int flags_export = cudaMemPoolExportToShareableHandle(&other_fd, pool, POSIX_FD, 1);
    printf("producer export-pool rc=%d plain=%d default=%d fabric=%d flags=%d last=%d\n", rc,
           plain_export, default_export, fabric_export, flags_export, cudaGetLastError());

    cudaMemPoolPtrExportData data, again, other;
    rc = cudaMemPoolExportPointer(&data, p);
    int again_rc = cudaMemPoolExportPointer(&again, p);
    int plain_ptr = cudaMemPoolExportPointer(&other, q);
    int default_ptr = cudaMemPoolExportPointer(&other, r);
    int interior = cudaMemPoolExportPointer(&other, (char *)p + 512);
    printf("producer export rc=%d same=%d plain=%d default=%d interior=%d charged=%zu\n", rc,
           again_rc == 0 && memcmp(&data, &again, sizeof data) == 0, plain_ptr, default_ptr,
           interior, used_bytes() - used0);
    check("producer", "reads its values after export", p, produced);

    int to_consumer[2], to_producer[2];
    if (pipe(to_consumer) || pipe(to_producer)) {
        perror("pool_ipc_pair: pipe");
        return 3;
    }
    pid_t child = fork();
    if (child == 0) {
        char rfd[16], wfd[16];
        close(to_consumer[1]);
        close(to_producer[0]);
        snprintf(rfd, sizeof rfd, "%d", to_consumer[0]);
        snprintf(wfd, sizeof wfd, "%d", to_producer[1]);
        execl("/proc/self/exe", argv[0], "consumer", rfd, wfd, (char *)NULL);
        _exit(4);
    }
    close(to_consumer[0]);
    close(to_producer[1]);
    int rfd = to_producer[0], wfd = to_consumer[1];
    send_bytes(wfd, &pool_fd, sizeof pool_fd);
    send_bytes(wfd, &data, sizeof data);
    await(rfd, 'R');
    say(wfd, 'W');
    await(rfd, 'w');
    check("producer", "sees the consumer's writes", p, consumed);
    say(wfd, 'D');
    await(rfd, 'd');

    /* Freed after every importer freed it (CUDA's rule), then new memory at that address. */
    void *renewed_p = NULL;
    size_t before_free = used_bytes();
    rc = cudaFreeAsync(p, NULL);
    cudaMemPoolPtrExportData freed_data, renewed_data;
    int freed_export = cudaMemPoolExportPointer(&freed_data, p);
    int alloc_rc = cudaMallocFromPoolAsync(&renewed_p, sizeof host, pool, NULL);
    printf("producer free rc=%d export-freed rc=%d realloc rc=%d same-address=%d charged=%zd\n", rc,
           freed_export, alloc_rc, renewed_p == p, (ssize_t)(used_bytes() - before_free));
    int fill_rc = fill(renewed_p, renewed, WORDS);
    rc = cudaMemPoolExportPointer(&renewed_data, renewed_p);
    printf("producer new export rc=%d fill rc=%d differs=%d\n", rc, fill_rc,
           memcmp(&renewed_data, &data, sizeof data) != 0);
    say(wfd, 'N');
    send_bytes(wfd, &renewed_data, sizeof renewed_data);
    await(rfd, 'n');
    int status = 0;
    waitpid(child, &status, 0);
    close(pool_fd);
    int frees[3] = {cudaFreeAsync(renewed_p, NULL), 0, 0};
    frees[1] = cudaFreeAsync(q, NULL);
    frees[2] = cudaFreeAsync(r, NULL);
    int destroy = cudaMemPoolDestroy(pool);
    printf("producer frees rc=%d rc=%d rc=%d destroy rc=%d rc=%d consumer exit=%d\n", frees[0],
           frees[1], frees[2], destroy, cudaMemPoolDestroy(plain),
           WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 0;
}

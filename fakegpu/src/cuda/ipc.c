/* CUDA IPC memory handles across processes of one user on one machine.
 *
 * Device memory is a host mapping, private to its process. cuIpcGetMemHandle turns the
 * allocation's pages into a memory file (memfd, mode 0600) mapped at the same address, with the
 * bytes written so far copied in, and keeps the file open; the handle names the exporting
 * process, the file's descriptor there, its inode and a random name. cuIpcOpenMemHandle in
 * another process opens /proc/<pid>/fd/<fd> (the kernel lets only the same user, with the right
 * to read the exporter's memory, do so), checks that the descriptor still is that file, and
 * maps it: both processes then read and write the same bytes. Nothing is named in a file
 * system, so nothing outlives the processes: when the exporter frees the allocation or exits,
 * the descriptor goes, later opens fail, and openers keep the pages they mapped until they
 * close them.
 *
 * Accounting as on a real card: the memory stays the exporter's (charged to its device there);
 * opening charges nothing to the opener's device. Opening a handle in the process that made it
 * fails with CUDA_ERROR_INVALID_CONTEXT, as the driver does; a second open of the same handle
 * in a process returns the same address and counts a reference, which cuIpcCloseMemHandle
 * gives back, unmapping at the last. Freeing an exported allocation while another process has
 * it open is undefined in CUDA; here the opener keeps the last bytes and the exporter's device
 * gets the memory back. */
#include "driver.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

/* The 64 bytes of a CUipcMemHandle. */
struct ipc_mem_handle {
    uint64_t magic;
    uint64_t nonce;   /* random: the memory file's name */
    uint64_t inode;   /* of the memory file */
    uint64_t size;    /* of the allocation */
    int32_t pid;      /* the exporting process */
    int32_t fd;       /* the memory file's descriptor there */
    int32_t physical; /* the memory unit it is on (the machine's device, or a MIG device) */
    uint32_t reserved[5];
};
_Static_assert(sizeof(struct ipc_mem_handle) == CU_IPC_HANDLE_SIZE, "CUipcMemHandle is 64 bytes");
#define IPC_MEM_MAGIC 0x316d656d63706966ull /* "fipcmem1" */
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 1u

/* An allocation this process exported. */
struct exported {
    uint64_t base, alloc_id;
    int fd;
    struct ipc_mem_handle handle;
};
/* A handle this process opened. */
struct opened {
    uint64_t base, size;
    int32_t pid;
    uint64_t inode, nonce;
    unsigned refs;
};
static pthread_mutex_t ipc_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t *fg_ipc_lock(void) { return &ipc_lock; }
static struct exported *exports;
static size_t export_count, export_capacity;
static struct opened *opens;
static size_t open_count, open_capacity;

static uint64_t page_round(uint64_t n)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    return (n + page - 1) / page * page;
}

/* Room for one more element of an array (ipc_lock held). */
static bool room(void **items, size_t *capacity, size_t count, size_t item)
{
    if (count < *capacity)
        return true;
    size_t grown_capacity = *capacity ? *capacity * 2 : 16;
    void *grown = realloc(*items, grown_capacity * item);
    if (!grown)
        return false;
    *items = grown;
    *capacity = grown_capacity;
    return true;
}

static void memory_file_name(char *out, size_t n, uint64_t nonce)
{
    snprintf(out, n, "vramshim-ipc-%016llx", (unsigned long long)nonce);
}

struct copy_target {
    uint64_t from, to; /* the allocation's address, the memory file's temporary mapping */
};

static void copy_written(uint64_t start, uint64_t end, void *arg)
{
    const struct copy_target *t = arg;
    memcpy((void *)(t->to + (start - t->from)), (const void *)start, end - start);
}

/* Puts the pages of the allocation A into a new memory file mapped in their place. */
static CUresult share_allocation(const struct fg_alloc *a, struct exported *out)
{
    uint64_t rounded = page_round(a->size ? a->size : 1), nonce;
    char name[64];
    if (getrandom(&nonce, sizeof nonce, 0) != sizeof nonce)
        return CUDA_ERROR_OUT_OF_MEMORY;
    memory_file_name(name, sizeof name, nonce);
    int fd = memfd_create(name, MFD_CLOEXEC);
    struct stat st;
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)rounded) != 0 || fstat(fd, &st) != 0) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    void *staging = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (staging == MAP_FAILED) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* Only the pages copies and fills wrote hold data; the rest reads as zeros either way. */
    struct copy_target target = {a->base, (uint64_t)staging};
    fg_host_each_written(a->base, a->base + rounded, copy_written, &target);
    munmap(staging, rounded);
    if (mmap((void *)a->base, rounded, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) ==
        MAP_FAILED) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    int physical = a->device;
    if (a->device >= 0 && a->device < fg_config()->count)
        physical = fg_config()->unit[a->device];
    out->base = a->base;
    out->alloc_id = a->id;
    out->fd = fd;
    out->handle = (struct ipc_mem_handle){.magic = IPC_MEM_MAGIC, .nonce = nonce,
                                          .inode = (uint64_t)st.st_ino, .size = a->size,
                                          .pid = (int32_t)getpid(), .fd = fd,
                                          .physical = physical};
    return CUDA_SUCCESS;
}

/* The export record of the allocation A, made at its first export (ipc_lock held). */
static CUresult export_of(const struct fg_alloc *a, struct exported **out)
{
    for (size_t i = 0; i < export_count; i++)
        if (exports[i].base == a->base && exports[i].alloc_id == a->id) {
            *out = &exports[i]; /* exported before: the same handle, as the driver gives */
            return CUDA_SUCCESS;
        }
    struct exported made;
    CUresult rc = CUDA_SUCCESS;
    if (!room((void **)&exports, &export_capacity, export_count, sizeof *exports))
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    else if (!(rc = share_allocation(a, &made))) {
        exports[export_count] = made;
        *out = &exports[export_count++];
        fg_set_shared(a->base, true);
    }
    return rc;
}

FG_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr p)
{
    struct fg_alloc a;
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    /* cudaMalloc memory only: pool, managed and VMM memory have their own export calls. */
    if (!handle || !fg_lookup(p, &a) || a.kind != FG_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&ipc_lock);
    struct exported *e = NULL;
    CUresult rc = export_of(&a, &e);
    if (!rc) {
        memset(handle, 0, sizeof *handle);
        memcpy(handle, &e->handle, sizeof e->handle);
    }
    pthread_mutex_unlock(&ipc_lock);
    return rc;
}

CUresult fg_ipc_share(const struct fg_alloc *a, struct fg_ipc_file *out)
{
    pthread_mutex_lock(&ipc_lock);
    struct exported *e = NULL;
    CUresult rc = export_of(a, &e);
    if (!rc)
        *out = (struct fg_ipc_file){.pid = e->handle.pid, .fd = e->handle.fd,
                                    .inode = e->handle.inode, .nonce = e->handle.nonce,
                                    .size = e->handle.size};
    pthread_mutex_unlock(&ipc_lock);
    return rc;
}

void fg_ipc_unexport(uint64_t base, uint64_t size)
{
    uint64_t rounded = page_round(size ? size : 1);
    pthread_mutex_lock(&ipc_lock);
    for (size_t i = 0; i < export_count; i++)
        if (exports[i].base == base) {
            close(exports[i].fd);
            exports[i] = exports[--export_count];
            break;
        }
    pthread_mutex_unlock(&ipc_lock);
    /* Fresh private pages in place, so the mapping can be reused like any other. */
    fg_host_release(base, rounded);
    mmap((void *)base, rounded, PROT_READ | PROT_WRITE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}

/* Whether /proc/PID/fd/FD is still the memory file named by NONCE: once the process has
 * exited (or been killed) its descriptors are gone from /proc before anything it held (a pipe
 * end) is closed, so a peer that saw it go never finds them. */
static bool names_memory_file(int32_t pid, int32_t fd, uint64_t nonce, char *path, size_t n)
{
    char link[128], expected[96], name[64];
    snprintf(path, n, "/proc/%d/fd/%d", pid, fd);
    ssize_t got = readlink(path, link, sizeof link - 1);
    if (got <= 0)
        return false;
    link[got] = 0;
    memory_file_name(name, sizeof name, nonce);
    snprintf(expected, sizeof expected, "/memfd:%s (deleted)", name);
    return strcmp(link, expected) == 0;
}

/* The exporter's memory file, opened through /proc, or -1 when F no longer names it (the
 * allocation freed, the process gone, the descriptor reused). */
static int open_memory_file(const struct fg_ipc_file *f)
{
    char path[64];
    if (!names_memory_file(f->pid, f->fd, f->nonce, path, sizeof path))
        return -1;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    struct stat st;
    if (fd < 0)
        return -1;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_ino != f->inode ||
        (uint64_t)st.st_size != page_round(f->size ? f->size : 1)) {
        close(fd);
        return -1;
    }
    return fd;
}

CUresult fg_ipc_map(const struct fg_ipc_file *f, uint64_t *base)
{
    int fd = open_memory_file(f);
    if (fd < 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t rounded = page_round(f->size ? f->size : 1);
    void *mapped = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    close(fd);
    if (mapped == MAP_FAILED)
        return CUDA_ERROR_MAP_FAILED;
    *base = (uint64_t)mapped;
    return CUDA_SUCCESS;
}

/* The process's own empty memory file, made at its first event export and kept open until it
 * exits: an event handle names it, so a peer can tell whether the exporter still runs. */
static struct {
    bool made;
    int fd;
    uint64_t inode, nonce;
} process_file;

bool fg_ipc_process_file(int32_t *fd, uint64_t *inode, uint64_t *nonce)
{
    bool ok;
    pthread_mutex_lock(&ipc_lock);
    if (!process_file.made) {
        char name[64];
        struct stat st;
        uint64_t made_nonce;
        int made_fd = -1;
        if (getrandom(&made_nonce, sizeof made_nonce, 0) == sizeof made_nonce) {
            memory_file_name(name, sizeof name, made_nonce);
            made_fd = memfd_create(name, MFD_CLOEXEC);
        }
        if (made_fd >= 0 && fchmod(made_fd, 0600) == 0 && fstat(made_fd, &st) == 0) {
            process_file.made = true;
            process_file.fd = made_fd;
            process_file.inode = (uint64_t)st.st_ino;
            process_file.nonce = made_nonce;
        } else if (made_fd >= 0) {
            close(made_fd);
        }
    }
    ok = process_file.made;
    if (ok) {
        *fd = process_file.fd;
        *inode = process_file.inode;
        *nonce = process_file.nonce;
    }
    pthread_mutex_unlock(&ipc_lock);
    return ok;
}

bool fg_ipc_process_running(int32_t pid, int32_t fd, uint64_t inode, uint64_t nonce)
{
    char path[64];
    struct stat st;
    return names_memory_file(pid, fd, nonce, path, sizeof path) && stat(path, &st) == 0 &&
           (uint64_t)st.st_ino == inode;
}

/* The ordinal this process sees the machine's device PHYSICAL as, or FALLBACK. */
static int visible_ordinal(int physical, int fallback)
{
    for (int i = 0; i < fg_config()->count; i++)
        if (fg_config()->unit[i] == physical)
            return i;
    return fallback;
}

FG_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle handle, unsigned int flags)
{
    struct ipc_mem_handle h;
    int dev;
    memcpy(&h, &handle, sizeof h);
    CUresult rc = fg_current_device(&dev);
    if (rc)
        return rc;
    if (!p || h.magic != IPC_MEM_MAGIC || (flags & ~CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
        return CUDA_ERROR_INVALID_VALUE;
    if (h.pid == (int32_t)getpid())
        return CUDA_ERROR_INVALID_CONTEXT; /* the driver refuses a process its own handles */
    pthread_mutex_lock(&ipc_lock);
    for (size_t i = 0; i < open_count; i++)
        if (opens[i].pid == h.pid && opens[i].inode == h.inode && opens[i].nonce == h.nonce) {
            opens[i].refs++;
            *p = opens[i].base;
            pthread_mutex_unlock(&ipc_lock);
            return CUDA_SUCCESS;
        }
    struct fg_ipc_file file = {.pid = h.pid, .fd = h.fd, .inode = h.inode, .nonce = h.nonce,
                               .size = h.size};
    uint64_t base = 0;
    rc = fg_ipc_map(&file, &base);
    if (rc) {
        pthread_mutex_unlock(&ipc_lock);
        return rc == CUDA_ERROR_MAP_FAILED ? rc : CUDA_ERROR_INVALID_VALUE;
    }
    uint64_t rounded = page_round(h.size ? h.size : 1);
    void *mapped = (void *)base;
    /* The mapping charges nothing: the memory stays the exporter's. */
    struct fg_alloc a = {.base = (uint64_t)mapped, .size = h.size, .kind = FG_IPC,
                         .device = visible_ordinal(h.physical, dev), .shared = true};
    if (!room((void **)&opens, &open_capacity, open_count, sizeof *opens) || !fg_register(&a)) {
        munmap(mapped, rounded);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        opens[open_count++] = (struct opened){.base = a.base, .size = h.size, .pid = h.pid,
                                              .inode = h.inode, .nonce = h.nonce, .refs = 1};
        *p = a.base;
    }
    pthread_mutex_unlock(&ipc_lock);
    return rc;
}

/* CUDA 4.1's name, kept by the driver for old binaries: the same call. */
FG_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle handle, unsigned int flags)
{
    return cuIpcOpenMemHandle_v2(p, handle, flags);
}

FG_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    uint64_t unmap_size = 0;
    pthread_mutex_lock(&ipc_lock);
    for (size_t i = 0; i < open_count; i++)
        if (opens[i].base == p) {
            rc = CUDA_SUCCESS;
            if (--opens[i].refs == 0) {
                struct fg_alloc a;
                fg_unregister(p, FG_IPC, &a);
                unmap_size = page_round(opens[i].size ? opens[i].size : 1);
                opens[i] = opens[--open_count];
            }
            break;
        }
    pthread_mutex_unlock(&ipc_lock);
    if (unmap_size) {
        fg_host_release(p, unmap_size);
        munmap((void *)p, unmap_size);
    }
    return rc;
}

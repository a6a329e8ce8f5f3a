/* The fake driver's internal interface (libcuda.so.1). Device memory is exact bookkeeping of
 * a card of the configured size; the bytes themselves live in lazily backed host mappings
 * (MAP_NORESERVE), so data copied in reads back and untouched memory costs no host RAM. */
#pragma once
#define _GNU_SOURCE
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "fakegpu_cuda.h"
#include "fakegpu_log.h"

#define FG_EXPORT __attribute__((visibility("default")))
#define FG_MAX_DEVICES 64
/* What cuDriverGetVersion reports: a CUDA 13.2 driver. */
#define FG_DRIVER_VERSION 13020
/* VMM granularity, also the rounding of default-pool reservations. */
#define FG_GRANULARITY (2ull << 20)

/* The most MIG devices one card holds (A100, H100, H200: 7 compute slices, so seven 1g
 * instances or seven 1c compute instances). */
#define FG_MAX_MIG 7
/* A MIG device: one compute instance of a GPU instance (CUDA and NVML's MIG device handles
 * show compute instances). Its GPU instance's profile ("3g.40gb", "1g.10gb+me"), compute
 * slices, memory eighths, first memory slice (its placement), GPU instance id, media
 * extensions and bytes (shared by the GPU instance's compute instances), then the compute
 * instance's: the profile it is named after ("1c.3g.40gb", or "3g.40gb" when it fills its GPU
 * instance), compute slices, first compute slice within the GPU instance, id and SMs; unit:
 * the GPU instance's memory unit. */
struct fg_mig_device {
    char profile[32];
    int slices, eighths, start, gi_id;
    bool media;
    unsigned long long memory;
    char ci_profile[40];
    int ci_slices, ci_start, ci_id;
    int sms, unit;
};
/* A card of the machine: mig_count 0 when it is out of MIG mode, else its MIG devices by
 * index (NVML's nvmlDeviceGetMigDeviceHandleByIndex order: by GPU instance id, then compute
 * instance id; a GPU instance's compute instances are neighbours); unit: the
 * memory unit of the whole card (out of MIG mode). */
struct fg_card {
    int mig_count;
    struct fg_mig_device mig[FG_MAX_MIG];
    int unit;
};

/* The simulated machine, read once from VRAMSHIM_FAKEGPU_* (config.c). */
struct fg_config {
    int count;          /* devices the program sees: CUDA_VISIBLE_DEVICES applied */
    int physical_count; /* devices the machine has (VRAMSHIM_FAKEGPU_COUNT) */
    int physical[FG_MAX_DEVICES]; /* the machine's device behind each visible ordinal */
    unsigned long long memory;
    char name[256];
    int cc_major, cc_minor;
    int sms;
    unsigned long long context_bytes;
    unsigned long long module_bytes; /* charged at the first kernel launch on a device */
    /* cuBLAS's and cuDNN's own kernels, charged once per device by the fake libraries through
     * vramshim_fakegpu_load_library_kernels (context.c) */
    unsigned long long cublas_kernel_bytes, cudnn_kernel_bytes;
    unsigned long long nccl_bytes;   /* an NCCL rank's own memory (read by the fake NCCL) */
    bool fabric; /* an NVLink fabric NVML reports, without the IMEX channel fabric handles need */
    unsigned long long host_bytes; /* host RAM that device data copied in may hold */
    /* How often cuMemGetInfo asks the record locks of the processes it watches by pidfd
     * (VRAMSHIM_FAKEGPU_LEDGER_SWEEP_MS, default 10 ms): an exec'd one is seen then (ledger.c). */
    long long ledger_sweep_ns;
    /* MIG (VRAMSHIM_FAKEGPU_MIG, config.c): the cards in MIG mode and their MIG devices;
     * mig: at least one card is. card_* describe a whole card (NVML's GPU, a card out of MIG
     * mode beside MIG ones); memory, sms and name above the layout's first MIG device. */
    bool mig;
    struct fg_card cards[FG_MAX_DEVICES];
    unsigned long long card_memory;
    int card_sms;
    unsigned long long mig_eighth; /* bytes of one memory slice (an eighth of a card) */
    int mig_slice_sms;             /* SMs of one compute slice */
    char card_name[256];
    /* Per visible ordinal: the MIG device of card physical[v] it is (-1: the whole card), and
     * its memory unit: the key of its bytes in the device ledger, and of IPC and pools (a card
     * out of MIG mode or a MIG device; the card's index without a layout of several MIG
     * devices on a card). */
    int mig_index[FG_MAX_DEVICES];
    int unit[FG_MAX_DEVICES];
    bool valid; /* false: a variable was invalid (already said on stderr); cuInit fails */
};
const struct fg_config *fg_config(void);
/* The UUID of the machine's device PHYSICAL: "FAKEGPU", zeros, the index in the last byte. */
void fg_physical_uuid(int physical, unsigned char out[16]);
/* The UUID of MIG device INDEX of the machine's device PHYSICAL: "FAKEMIG", zeros, the index
 * in byte 14 and the card in the last byte (printed "MIG-46414b45-4d49-4700-0000-00000000MMNN"). */
void fg_mig_uuid(int physical, int index, unsigned char out[16]);
/* What the visible ordinal V is: its bytes, SMs and name (a MIG device's or a card's). */
unsigned long long fg_device_capacity(int v);
int fg_device_sms(int v);
void fg_device_name(int v, char *out, size_t n);
/* The name of MIG device INDEX of the machine's device PHYSICAL. */
void fg_mig_name(int physical, int index, char *out, size_t n);

struct CUctx_st {
    int device;
    unsigned flags;
    bool primary;
    bool destroyed;
};

/* Per-device state. */
struct fg_device {
    pthread_mutex_t lock;
    unsigned long long used; /* bytes charged (allocations, pools' reservations, context) */
    struct CUctx_st primary;
    int primary_refs;
    bool primary_charged;
    /* Kernel code loaded into the device (the program's first module, libraries' kernels):
     * charged on top of the context and given back with it. */
    unsigned long long loaded;
    char loaded_names[8][32];
    int loaded_count;
    CUmemoryPool default_pool, current_pool;
};
extern struct fg_device fg_devices[FG_MAX_DEVICES];

bool fg_initialized(void);
/* The calling thread's current context, or NULL. */
CUcontext fg_current(void);
/* CUDA_SUCCESS and *dev = the current context's device, or the error to return. */
CUresult fg_current_device(int *dev);
bool fg_valid_device(int dev);

/* Charges / uncharges N bytes of device DEV; false when the device would be over capacity. */
bool fg_charge(int dev, unsigned long long n);
/* The same with fg_devices[DEV].lock held: the machine's ledger (when there is one) and this
 * process's count. */
bool fg_device_reserve(int dev, unsigned long long n);
/* The same for memory no recorder hook sees (a context, kernel code): a refusal is noted in the
 * ledger for the dry run's verdict. */
bool fg_device_reserve_unseen(int dev, unsigned long long n);
void fg_device_release(int dev, unsigned long long n);
/* Bytes in use on DEV as cuMemGetInfo reports them (every process's with a ledger), lock held. */
unsigned long long fg_device_used(int dev);

/* The device ledger shared by the processes of one machine (ledger.c). Devices are the
 * machine's (physical) ones. */
enum { FG_LEDGER_OFF, FG_LEDGER_FULL, FG_LEDGER_CHARGED };
/* Charges N bytes to this process when the machine's total stays within CAPACITY:
 * FG_LEDGER_CHARGED, FG_LEDGER_FULL, or FG_LEDGER_OFF (no ledger: count alone). UNSEEN: no
 * recorder hook sees this memory (a refusal is noted). */
int fg_ledger_charge(int physical, unsigned long long n, unsigned long long capacity,
                     bool unseen);
void fg_ledger_uncharge(int physical, unsigned long long n);
/* The machine's bytes in use on PHYSICAL; false when there is no ledger. */
bool fg_ledger_used(int physical, unsigned long long *used);
/* The processes holding memory on PHYSICAL (up to MAX pids and their bytes); their number,
 * or -1 when there is no ledger. */
int fg_ledger_processes(int physical, int max, int32_t *pids, unsigned long long *used);
/* Charges BYTES of kernel code for NAME ("" for the program's own kernels) on DEV, once per
 * primary context; CUDA_ERROR_OUT_OF_MEMORY when it does not fit. */
CUresult fg_load_kernels(int dev, const char *name, unsigned long long bytes);
/* A kernel launch in the current context: the first one loads the program's module. */
CUresult fg_kernel_launch(void);
void fg_uncharge(int dev, unsigned long long n);

/* The registry of everything with an address: device, pool, managed and VMM-mapped memory,
 * pinned and registered host memory (memory.c). */
enum fg_kind { FG_DEVICE, FG_MANAGED, FG_POOL, FG_MAPPED, FG_HOST, FG_REGISTERED, FG_GRAPH, FG_IPC };
struct fg_alloc {
    uint64_t base, size;
    enum fg_kind kind;
    int device;
    CUmemoryPool pool;      /* FG_POOL */
    uint64_t charged;       /* bytes charged to the device for this entry */
    uint64_t id;
    bool shared; /* its pages are a memory file other processes may map (IPC, ipc.c) */
    uint64_t offset; /* FG_MAPPED: where in the physical allocation the mapping starts */
    uint64_t requested; /* FG_POOL: the bytes asked for (size is the block, rounded) */
};
bool fg_register(const struct fg_alloc *a);
/* Copies out the entry containing ADDR; false when none does. */
bool fg_lookup(uint64_t addr, struct fg_alloc *out);
/* Calls FN on every entry, the registry locked (FN may change the entry's flags, not add or
 * remove entries, nor look entries up). */
void fg_each_alloc(void (*fn)(struct fg_alloc *, void *), void *arg);
/* Marks the entry starting exactly at BASE as shared with other processes, or not. */
bool fg_set_shared(uint64_t base, bool shared);
/* Removes the entry starting exactly at BASE (of KIND when kind >= 0), copying it out. */
bool fg_unregister(uint64_t base, int kind, struct fg_alloc *out);

/* Host backing for device memory: zero-filled, lazily backed, page aligned. */
void *fg_map(uint64_t size);
void fg_unmap(void *p, uint64_t size);
/* Uncounts the resident pages of [p, p + size) from the host RAM device data holds; called
 * just before those pages are given back (munmap, MADV_DONTNEED, a fixed remap). */
void fg_host_release(uint64_t p, uint64_t size);
/* Calls FN(from, to, ARG) for each part of [start, end) that copies or fills wrote. */
void fg_host_each_written(uint64_t start, uint64_t end, void (*fn)(uint64_t, uint64_t, void *),
                          void *arg);

/* IPC (ipc.c): the exported allocation at BASE is being freed; its pages stop being shared
 * (openers keep what they mapped) and become private again before the mapping is reused. */
void fg_ipc_unexport(uint64_t base, uint64_t size);
/* The memory file this process keeps open while it runs, for event handles to name (made at
 * the first call); false when none could be made. */
bool fg_ipc_process_file(int32_t *fd, uint64_t *inode, uint64_t *nonce);
/* Whether process PID still holds the memory file FD, INODE, NONCE named (so still runs). */
bool fg_ipc_process_running(int32_t pid, int32_t fd, uint64_t inode, uint64_t nonce);
/* Where another process may find the allocation A's bytes: its pages moved into a memory
 * file at the first call (as cuIpcGetMemHandle does), the same file after. */
struct fg_ipc_file {
    int32_t pid, fd;
    uint64_t inode, nonce, size;
};
CUresult fg_ipc_share(const struct fg_alloc *a, struct fg_ipc_file *out);
/* Maps another process's memory file F here (shared, page-rounded size): *BASE; nothing is
 * registered. CUDA_ERROR_INVALID_VALUE when F no longer names a live file. */
CUresult fg_ipc_map(const struct fg_ipc_file *f, uint64_t *base);
/* The importer's cuMemFree/cuMemFreeAsync of a pointer cuMemPoolImportPointer gave (pool.c):
 * true when P is one (*RC the result), false otherwise. */
bool fg_pool_free_imported(uint64_t p, CUresult *rc);

/* Stream-ordered pools (pool.c). */
void fg_pools_init_device(int dev);
/* Releases cached pool memory above each pool's release threshold (a synchronisation). */
void fg_pools_sync(void);
/* Releases every pool's memory on DEV no block uses (before an allocation fails). */
bool fg_pools_trim_device(int dev);

/* Exported functions other files call. */
CUresult cuCtxGetCurrent(CUcontext *ctx);
CUresult cuCtxGetDevice(CUdevice *dev);
CUresult cuMemFree_v2(CUdeviceptr dptr);

/* Copies and fills as the memory API does them (memory.c): what a graph launch runs. */
CUresult fg_copy(uint64_t dst, uint64_t src, size_t n);
CUresult fg_set(uint64_t dst, unsigned value, size_t element, size_t count);

/* Stream capture (exec.c). An operation work on a stream stands for: done at once, or recorded
 * as a graph node while the stream captures. */
enum fg_op_type {
    FG_OP_KERNEL, FG_OP_COPY, FG_OP_SET, FG_OP_HOST, FG_OP_EMPTY, FG_OP_MEM_ALLOC, FG_OP_MEM_FREE,
    FG_OP_GRAPH
};
struct graph_mem;
struct fg_op {
    enum fg_op_type type;
    uint64_t dst, src;
    size_t bytes;             /* FG_OP_COPY */
    unsigned value;           /* FG_OP_SET: COUNT elements of ELEMENT bytes */
    size_t element, count;
    void (*host_fn)(void *);  /* FG_OP_HOST */
    void *host_data;
    struct graph_mem *mem;    /* FG_OP_MEM_ALLOC / FG_OP_MEM_FREE: the graph allocation */
    struct CUgraph_st *child; /* FG_OP_GRAPH: the embedded graph, owned by the node */
};
/* True when STREAM is capturing: OP became a node (or *RC says why not); false: do it now. */
bool fg_capture_op(CUstream stream, const struct fg_op *op, CUresult *rc);
/* CUDA_SUCCESS, or the error a call the driver forbids during captures (synchronising the
 * device) gets, invalidating the captures it would break. */
CUresult fg_capture_forbids(void);
/* Graph memory (exec.c). On a capturing STREAM, an allocation becomes a mem-alloc node at a
 * fixed address (*DPTR) and the free of a graph allocation a mem-free node: true then, with *RC
 * the result; false: not capturing, do it now. */
bool fg_capture_mem_alloc(CUstream stream, size_t size, CUdeviceptr *dptr, CUresult *rc);
bool fg_capture_mem_free(CUstream stream, CUdeviceptr dptr, CUresult *rc);
/* Frees the live graph allocation at DPTR outside any graph (cuMemFree, cuMemFreeAsync):
 * CUDA_ERROR_INVALID_VALUE when DPTR is none. */
CUresult fg_graph_mem_free(CUdeviceptr dptr);
/* A kernel launch on STREAM (fg_kernel_launch, then a node if STREAM captures). */
CUresult fg_kernel_launch_on(CUstream stream);

/* The locks fork.c takes across fork (its pthread_atfork handlers hold the order), each
 * module's own. */
pthread_mutex_t *fg_init_lock(void);          /* context.c: cuInit */
pthread_mutex_t *fg_capture_lock(void);       /* exec.c: captures, graphs, graph memory */
pthread_mutex_t *fg_imports_lock(void);       /* pool.c: pointers imported from other pools */
pthread_mutex_t *fg_pools_lock(void);         /* pool.c: the list of pools */
/* Calls FN on every pool's lock; the caller holds fg_pools_lock (or is a fork child). */
void fg_pools_each_lock(void (*fn)(pthread_mutex_t *, void *), void *arg);
pthread_mutex_t *fg_ipc_lock(void);           /* ipc.c */
pthread_mutex_t *fg_vmm_lock(void);           /* vmm.c */
pthread_mutex_t *fg_ledger_lock(void);        /* ledger.c: this process's side of the ledger */
pthread_mutex_t *fg_ledger_watch_lock(void);  /* ledger.c: cuMemGetInfo's watch of the others */
void fg_ledger_after_fork_child(void);        /* ledger.c: the child is a process of its own */
pthread_mutex_t *fg_registry_lock(void);      /* memory.c: the registry */
pthread_mutex_t *fg_host_lock(void);          /* memory.c: host RAM of device data */
pthread_mutex_t *fg_map_cache_lock(void);     /* memory.c: freed mappings kept */
pthread_mutex_t *fg_unknown_names_lock(void); /* resolver.c: names logged as unimplemented */

/* In a Python process, once, on a thread holding the GIL: an atexit callback that sleeps
 * 20 ms, the time a real GPU's last kernels would have given torch's autograd threads before
 * the interpreter finalizes (python_exit.c). */
void fg_python_exit_grace(void);

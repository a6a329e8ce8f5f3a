/* The fake libnvToolsExt.so.1 (NVTX 2; torch 2.4 and older link it): an NVTX library that
 * attaches a tool as NVIDIA's does. At the first NVTX call it dlopens NVTX_INJECTION64_PATH
 * (`vramshim run` and `dryrun` set it to libvramshim_nvtx.so) and calls the tool's
 * InitializeInjectionNvtx2 with nvtxGetExportTable; the tool asks that for the callback
 * export table and fills this library's function slots, one table per NVTX module. Every
 * exported call then goes to its slot, or returns NVTX's "no tool" value when the slot is
 * empty (no variable, the library does not load or declines): 0 / NULL, and -2 (no push/pop
 * tracking) for the range push and pop calls.
 *
 * Initialisation runs once. A thread that calls while another initialises waits for it; a
 * call the tool makes from inside its own initialisation, and every call in a fork child
 * whose parent was initialising in another thread (that thread does not exist in the child),
 * gets the "no tool" value instead of waiting forever. */
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <wchar.h>

#define FG_EXPORT __attribute__((visibility("default")))

typedef void (*nvtx_slot)(void);

/* NvtxCallbackModule, and each module's callback ids run from 1 to its size - 1. */
enum { MODULE_CORE = 1, MODULE_CUDA, MODULE_OPENCL, MODULE_CUDART, MODULE_CORE2, MODULE_SYNC,
       MODULE_COUNT };
static const unsigned module_size[MODULE_COUNT] = {0, 16, 9, 15, 7, 16, 7};
#define MAX_SLOTS 16

static nvtx_slot slots[MODULE_COUNT][MAX_SLOTS];
/* The tables the tool is given: entry i points at slots[module][i] (entry 0 none). */
static nvtx_slot *slot_pointers[MODULE_COUNT][MAX_SLOTS];

static int get_module_function_table(int module, nvtx_slot ***out_table, unsigned *out_size)
{
    if (module <= 0 || module >= MODULE_COUNT || !out_table)
        return 0;
    *out_table = slot_pointers[module];
    if (out_size)
        *out_size = module_size[module] - 1;
    return 1;
}

/* Export table ids: 1 callbacks, 3 version information. */
static const struct {
    size_t struct_size;
    int (*get_module_function_table)(int, nvtx_slot ***, unsigned *);
} callbacks_table = {sizeof(callbacks_table), get_module_function_table};

static const struct {
    size_t struct_size;
    uint32_t version;
    uint32_t reserved0;
} version_table = {sizeof(version_table), 2, 0};

FG_EXPORT const void *nvtxGetExportTable(uint32_t export_table_id)
{
    switch (export_table_id) {
    case 1: return &callbacks_table;
    case 3: return &version_table;
    default: return NULL;
    }
}

enum { FRESH, STARTING, DONE };
static int state = FRESH;
static pthread_t initialiser;
static __thread int initialising;

static void load_tool(void)
{
    for (int module = 1; module < MODULE_COUNT; module++)
        for (unsigned id = 1; id < module_size[module]; id++)
            slot_pointers[module][id] = &slots[module][id];
    const char *path = getenv("NVTX_INJECTION64_PATH");
    if (!path || !*path)
        return;
    void *tool = dlopen(path, RTLD_LAZY);
    if (!tool)
        return;
    int (*initialise)(const void *(*)(uint32_t)) =
        (int (*)(const void *(*)(uint32_t)))dlsym(tool, "InitializeInjectionNvtx2");
    /* A tool that declines leaves no handler behind (it may have filled some first). */
    if (!initialise || initialise(nvtxGetExportTable) == 0)
        memset(slots, 0, sizeof(slots));
}

/* Whether the slots may be read: initialisation is over (in this thread's view). */
static int ready(void)
{
    int now = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (now == DONE)
        return 1;
    if (initialising)
        return 0;
    int expected = FRESH;
    if (__atomic_compare_exchange_n(&state, &expected, STARTING, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        initialiser = pthread_self();
        initialising = 1;
        load_tool();
        initialising = 0;
        __atomic_store_n(&state, DONE, __ATOMIC_RELEASE);
        return 1;
    }
    while (__atomic_load_n(&state, __ATOMIC_ACQUIRE) != DONE)
        sched_yield();
    return 1;
}

/* In a fork child, an initialisation another thread was running never finishes: the child
 * goes on with no tool. */
static void after_fork_in_child(void)
{
    if (__atomic_load_n(&state, __ATOMIC_ACQUIRE) == STARTING && !initialising) {
        memset(slots, 0, sizeof(slots));
        __atomic_store_n(&state, DONE, __ATOMIC_RELEASE);
    }
}

__attribute__((constructor)) static void register_fork_handler(void)
{
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

static nvtx_slot slot_of(int module, int id)
{
    return ready() ? __atomic_load_n(&slots[module][id], __ATOMIC_RELAXED) : NULL;
}

/* FORWARD(return type, no-tool value, module, id, name, (parameters), (arguments)) */
#define FORWARD(type, none, module, id, name, params, args)                                  \
    FG_EXPORT type name params                                                               \
    {                                                                                        \
        nvtx_slot handler = slot_of(module, id);                                             \
        return handler ? ((type(*) params)handler) args : (none);                            \
    }
#define FORWARD_VOID(module, id, name, params, args)                                         \
    FG_EXPORT void name params                                                               \
    {                                                                                        \
        nvtx_slot handler = slot_of(module, id);                                             \
        if (handler)                                                                         \
            ((void(*) params)handler) args;                                                  \
    }

typedef const void *attributes_t; /* nvtxEventAttributes_t *, and the other attribute structs */
typedef void *handle_t;           /* domains, registered strings, resources, sync objects */
typedef uint64_t range_id_t;
#define NO_PUSH_POP_TRACKING (-2)

/* Core (NvtxCallbackIdCore). */
FORWARD_VOID(MODULE_CORE, 1, nvtxMarkEx, (attributes_t a), (a))
FORWARD_VOID(MODULE_CORE, 2, nvtxMarkA, (const char *m), (m))
FORWARD_VOID(MODULE_CORE, 3, nvtxMarkW, (const wchar_t *m), (m))
FORWARD(range_id_t, 0, MODULE_CORE, 4, nvtxRangeStartEx, (attributes_t a), (a))
FORWARD(range_id_t, 0, MODULE_CORE, 5, nvtxRangeStartA, (const char *m), (m))
FORWARD(range_id_t, 0, MODULE_CORE, 6, nvtxRangeStartW, (const wchar_t *m), (m))
FORWARD_VOID(MODULE_CORE, 7, nvtxRangeEnd, (range_id_t id), (id))
FORWARD(int, NO_PUSH_POP_TRACKING, MODULE_CORE, 8, nvtxRangePushEx, (attributes_t a), (a))
FORWARD(int, NO_PUSH_POP_TRACKING, MODULE_CORE, 9, nvtxRangePushA, (const char *m), (m))
FORWARD(int, NO_PUSH_POP_TRACKING, MODULE_CORE, 10, nvtxRangePushW, (const wchar_t *m), (m))
FORWARD(int, NO_PUSH_POP_TRACKING, MODULE_CORE, 11, nvtxRangePop, (void), ())
FORWARD_VOID(MODULE_CORE, 12, nvtxNameCategoryA, (uint32_t c, const char *n), (c, n))
FORWARD_VOID(MODULE_CORE, 13, nvtxNameCategoryW, (uint32_t c, const wchar_t *n), (c, n))
FORWARD_VOID(MODULE_CORE, 14, nvtxNameOsThreadA, (uint32_t t, const char *n), (t, n))
FORWARD_VOID(MODULE_CORE, 15, nvtxNameOsThreadW, (uint32_t t, const wchar_t *n), (t, n))

/* CUDA driver objects (NvtxCallbackIdCuda); CUdevice is an int. */
FORWARD_VOID(MODULE_CUDA, 1, nvtxNameCuDeviceA, (int d, const char *n), (d, n))
FORWARD_VOID(MODULE_CUDA, 2, nvtxNameCuDeviceW, (int d, const wchar_t *n), (d, n))
FORWARD_VOID(MODULE_CUDA, 3, nvtxNameCuContextA, (handle_t h, const char *n), (h, n))
FORWARD_VOID(MODULE_CUDA, 4, nvtxNameCuContextW, (handle_t h, const wchar_t *n), (h, n))
FORWARD_VOID(MODULE_CUDA, 5, nvtxNameCuStreamA, (handle_t h, const char *n), (h, n))
FORWARD_VOID(MODULE_CUDA, 6, nvtxNameCuStreamW, (handle_t h, const wchar_t *n), (h, n))
FORWARD_VOID(MODULE_CUDA, 7, nvtxNameCuEventA, (handle_t h, const char *n), (h, n))
FORWARD_VOID(MODULE_CUDA, 8, nvtxNameCuEventW, (handle_t h, const wchar_t *n), (h, n))

/* OpenCL objects (NvtxCallbackIdOpenCL). */
FORWARD_VOID(MODULE_OPENCL, 1, nvtxNameClDeviceA, (handle_t h, const char *n), (h, n))
FORWARD_VOID(MODULE_OPENCL, 2, nvtxNameClDeviceW, (handle_t h, const wchar_t *n), (h, n))
FORWARD_VOID(MODULE_OPENCL, 3, nvtxNameClContextA, (handle_t h, const char *n), (h, n))
FORWARD_VOID(MODULE_OPENCL, 4, nvtxNameClContextW, (handle_t h, const wchar_t *n), (h, n))
FORWARD_VOID(MODULE_OPENCL, 5, nvtxNameClCommandQueueA, (handle_t h, const char *n), (h, n))
FORWARD_VOID(MODULE_OPENCL, 6, nvtxNameClCommandQueueW, (handle_t h, const wchar_t *n), (h, n))
FORWARD_VOID(MODULE_OPENCL, 7, nvtxNameClMemObjectA, (handle_t h, const char *n), (h, n))
FORWARD_VOID(MODULE_OPENCL, 8, nvtxNameClMemObjectW, (handle_t h, const wchar_t *n), (h, n))
FORWARD_VOID(MODULE_OPENCL, 9, nvtxNameClSamplerA, (handle_t h, const char *n), (h, n))
FORWARD_VOID(MODULE_OPENCL, 10, nvtxNameClSamplerW, (handle_t h, const wchar_t *n), (h, n))
FORWARD_VOID(MODULE_OPENCL, 11, nvtxNameClProgramA, (handle_t h, const char *n), (h, n))
FORWARD_VOID(MODULE_OPENCL, 12, nvtxNameClProgramW, (handle_t h, const wchar_t *n), (h, n))
FORWARD_VOID(MODULE_OPENCL, 13, nvtxNameClEventA, (handle_t h, const char *n), (h, n))
FORWARD_VOID(MODULE_OPENCL, 14, nvtxNameClEventW, (handle_t h, const wchar_t *n), (h, n))

/* CUDA runtime objects (NvtxCallbackIdCudaRt); a device is an int. */
FORWARD_VOID(MODULE_CUDART, 1, nvtxNameCudaDeviceA, (int d, const char *n), (d, n))
FORWARD_VOID(MODULE_CUDART, 2, nvtxNameCudaDeviceW, (int d, const wchar_t *n), (d, n))
FORWARD_VOID(MODULE_CUDART, 3, nvtxNameCudaStreamA, (handle_t h, const char *n), (h, n))
FORWARD_VOID(MODULE_CUDART, 4, nvtxNameCudaStreamW, (handle_t h, const wchar_t *n), (h, n))
FORWARD_VOID(MODULE_CUDART, 5, nvtxNameCudaEventA, (handle_t h, const char *n), (h, n))
FORWARD_VOID(MODULE_CUDART, 6, nvtxNameCudaEventW, (handle_t h, const wchar_t *n), (h, n))

/* Domains (NvtxCallbackIdCore2). */
FORWARD_VOID(MODULE_CORE2, 1, nvtxDomainMarkEx, (handle_t d, attributes_t a), (d, a))
FORWARD(range_id_t, 0, MODULE_CORE2, 2, nvtxDomainRangeStartEx, (handle_t d, attributes_t a),
        (d, a))
FORWARD_VOID(MODULE_CORE2, 3, nvtxDomainRangeEnd, (handle_t d, range_id_t id), (d, id))
FORWARD(int, NO_PUSH_POP_TRACKING, MODULE_CORE2, 4, nvtxDomainRangePushEx,
        (handle_t d, attributes_t a), (d, a))
FORWARD(int, NO_PUSH_POP_TRACKING, MODULE_CORE2, 5, nvtxDomainRangePop, (handle_t d), (d))
FORWARD(handle_t, NULL, MODULE_CORE2, 6, nvtxDomainResourceCreate, (handle_t d, attributes_t a),
        (d, a))
FORWARD_VOID(MODULE_CORE2, 7, nvtxDomainResourceDestroy, (handle_t r), (r))
FORWARD_VOID(MODULE_CORE2, 8, nvtxDomainNameCategoryA, (handle_t d, uint32_t c, const char *n),
             (d, c, n))
FORWARD_VOID(MODULE_CORE2, 9, nvtxDomainNameCategoryW,
             (handle_t d, uint32_t c, const wchar_t *n), (d, c, n))
FORWARD(handle_t, NULL, MODULE_CORE2, 10, nvtxDomainRegisterStringA, (handle_t d, const char *s),
        (d, s))
FORWARD(handle_t, NULL, MODULE_CORE2, 11, nvtxDomainRegisterStringW,
        (handle_t d, const wchar_t *s), (d, s))
FORWARD(handle_t, NULL, MODULE_CORE2, 12, nvtxDomainCreateA, (const char *n), (n))
FORWARD(handle_t, NULL, MODULE_CORE2, 13, nvtxDomainCreateW, (const wchar_t *n), (n))
FORWARD_VOID(MODULE_CORE2, 14, nvtxDomainDestroy, (handle_t d), (d))

/* User synchronisation objects (NvtxCallbackIdSync). */
FORWARD(handle_t, NULL, MODULE_SYNC, 1, nvtxDomainSyncUserCreate, (handle_t d, attributes_t a),
        (d, a))
FORWARD_VOID(MODULE_SYNC, 2, nvtxDomainSyncUserDestroy, (handle_t s), (s))
FORWARD_VOID(MODULE_SYNC, 3, nvtxDomainSyncUserAcquireStart, (handle_t s), (s))
FORWARD_VOID(MODULE_SYNC, 4, nvtxDomainSyncUserAcquireFailed, (handle_t s), (s))
FORWARD_VOID(MODULE_SYNC, 5, nvtxDomainSyncUserAcquireSuccess, (handle_t s), (s))
FORWARD_VOID(MODULE_SYNC, 6, nvtxDomainSyncUserReleasing, (handle_t s), (s))

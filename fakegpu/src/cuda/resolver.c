/* The driver's resolver (cuGetProcAddress) and error strings. The table of every exported
 * function, hand-written or stub, is generated at build time (procs.c, from the export list:
 * see build.py); the library is linked -Bsymbolic, so like the real driver the resolver hands
 * out its own functions, never an interposer's. */
#include "driver.h"
#include "fakegpu_mig.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fg_proc {
    const char *name;
    void *address;
};
extern const struct fg_proc fg_procs[];
extern const size_t fg_proc_count;

static int compare_proc(const void *key, const void *entry)
{
    return strcmp(key, ((const struct fg_proc *)entry)->name);
}

static void *find(const char *name)
{
    const struct fg_proc *p =
        bsearch(name, fg_procs, fg_proc_count, sizeof *fg_procs, compare_proc);
    return p ? p->address : NULL;
}

/* The CUDA version from which cuda.h maps a base name to each suffixed variant. A base name
 * with a `_v2` variant not listed here maps to it from 3020 (CUDA 3.2's 64-bit API). */
static const struct {
    const char *variant;
    int since;
} variant_versions[] = {
    {"cuCtxCreate_v3", 11040},          {"cuCtxCreate_v4", 12050},
    {"cuCtxDestroy_v2", 4000},          {"cuCtxPopCurrent_v2", 4000},
    {"cuCtxPushCurrent_v2", 4000},      {"cuDevicePrimaryCtxRelease_v2", 11000},
    {"cuDevicePrimaryCtxReset_v2", 11000}, {"cuDevicePrimaryCtxSetFlags_v2", 11000},
    {"cuDeviceGetUuid_v2", 11040},      {"cuEventDestroy_v2", 4000},
    {"cuEventElapsedTime_v2", 12080},   {"cuGetProcAddress_v2", 12000},
    {"cuGraphAddKernelNode_v2", 12000}, {"cuGraphExecUpdate_v2", 12000},
    {"cuGraphKernelNodeGetParams_v2", 12000}, {"cuGraphKernelNodeSetParams_v2", 12000},
    {"cuGraphExecKernelNodeSetParams_v2", 12000}, {"cuIpcOpenMemHandle_v2", 11000},
    {"cuLinkAddData_v2", 6050},         {"cuLinkAddFile_v2", 6050},
    {"cuLinkCreate_v2", 6050},          {"cuMemAdvise_v2", 12020},
    {"cuMemHostRegister_v2", 6050},     {"cuMemPrefetchAsync_v2", 12020},
    {"cuStreamBeginCapture_v2", 10010}, {"cuStreamDestroy_v2", 4000},
    {"cuStreamGetCaptureInfo_v2", 11030}, {"cuStreamGetCaptureInfo_v3", 12030},
    {"cuStreamUpdateCaptureDependencies_v2", 12030}, {"cuStreamWaitValue32_v2", 11070},
    {"cuStreamWaitValue64_v2", 11070},  {"cuStreamWriteValue32_v2", 11070},
    {"cuStreamWriteValue64_v2", 11070}, {"cuStreamBatchMemOp_v2", 11070},
    {"cuGraphGetEdges_v2", 12030},      {"cuGraphAddDependencies_v2", 12030},
    {"cuGraphRemoveDependencies_v2", 12030}, {"cuGraphNodeGetDependencies_v2", 12030},
    {"cuGraphNodeGetDependentNodes_v2", 12030}, {"cuGraphAddNode_v2", 12030},
};

static int since(const char *variant)
{
    for (size_t i = 0; i < sizeof variant_versions / sizeof *variant_versions; i++)
        if (!strcmp(variant_versions[i].variant, variant))
            return variant_versions[i].since;
    return strstr(variant, "_v2") ? 3020 : 1 << 30;
}

/* A name the resolver does not know is a function the fake does not implement: it goes to the
 * log of unimplemented functions once (up to 256 distinct names; later ones are not logged). */
static pthread_mutex_t unknown_names_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t *fg_unknown_names_lock(void) { return &unknown_names_lock; }

static void log_unknown(const char *name)
{
    static char seen[256][96];
    static int seen_count;
    int logged = 1;
    pthread_mutex_lock(&unknown_names_lock);
    int known = 0;
    for (int i = 0; i < seen_count && !known; i++)
        known = !strncmp(seen[i], name, sizeof seen[i] - 1);
    if (!known && seen_count < 256) {
        snprintf(seen[seen_count++], sizeof seen[0], "%s", name);
        logged = 0;
    }
    pthread_mutex_unlock(&unknown_names_lock);
    if (!known)
        fg_log_unimplemented(&logged, name);
}

static CUresult get_proc(const char *symbol, void **pfn, int version, int *status)
{
    int ignored;
    if (!status)
        status = &ignored;
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    char name[256];
    /* The newest variant the requested version knows, else the base name. */
    for (int v = 4; v >= 2; v--) {
        if ((size_t)snprintf(name, sizeof name, "%s_v%d", symbol, v) >= sizeof name)
            return CUDA_ERROR_INVALID_VALUE;
        void *address = find(name);
        if (address && version >= since(name)) {
            *pfn = address;
            *status = CU_GET_PROC_ADDRESS_SUCCESS;
            return CUDA_SUCCESS;
        }
    }
    /* cuda.h maps cuGraphInstantiate to cuGraphInstantiateWithFlags from CUDA 12. */
    if (!strcmp(symbol, "cuGraphInstantiate") && version >= 12000)
        symbol = "cuGraphInstantiateWithFlags";
    *pfn = find(symbol);
    if (!*pfn) {
        log_unknown(symbol);
        *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                       unsigned long long flags, int *status)
{
    return get_proc(symbol, pfn, version, status);
}

FG_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                    unsigned long long flags)
{
    return get_proc(symbol, pfn, version, NULL);
}

static const struct {
    CUresult code;
    const char *name, *text;
} errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {208, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {211, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"},
    {705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access has not been enabled"},
    {708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "primary context active"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult error_text(CUresult code, const char **out, bool name)
{
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
        if (errors[i].code == code) {
            *out = name ? errors[i].name : errors[i].text;
            return CUDA_SUCCESS;
        }
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

FG_EXPORT CUresult cuGetErrorString(CUresult code, const char **text)
{
    return error_text(code, text, false);
}

FG_EXPORT CUresult cuGetErrorName(CUresult code, const char **name)
{
    return error_text(code, name, true);
}

/* For the fake NVML (libnvidia-ml.so.1), which sees the machine's devices whatever
 * CUDA_VISIBLE_DEVICES hides, and reports the driver's bookkeeping. Not NVIDIA symbols. */

/* The machine's device count; -1 when a VRAMSHIM_FAKEGPU_* variable is invalid. */
FG_EXPORT int vramshim_fakegpu_physical_count(void)
{
    const struct fg_config *config = fg_config();
    return config->valid ? config->physical_count : -1;
}

/* The name and compute capability of the machine's device PHYSICAL (a whole card's name). */
FG_EXPORT int vramshim_fakegpu_physical_device(int physical, char *name, int len, int *cc_major,
                                               int *cc_minor)
{
    const struct fg_config *config = fg_config();
    if (physical < 0 || physical >= config->physical_count || !name || len <= 0 || !cc_major ||
        !cc_minor)
        return -1;
    snprintf(name, (size_t)len, "%s", config->mig ? config->card_name : config->name);
    *cc_major = config->cc_major;
    *cc_minor = config->cc_minor;
    return 0;
}

/* The bytes in use on memory UNIT: every process's with a device ledger, else this process's
 * (0 when it does not see it). */
static unsigned long long unit_used(int unit)
{
    const struct fg_config *config = fg_config();
    unsigned long long used = 0;
    if (fg_ledger_used(unit, &used) || !fg_initialized())
        return used;
    for (int v = 0; v < config->count; v++)
        if (config->unit[v] == unit) {
            pthread_mutex_lock(&fg_devices[v].lock);
            used = fg_devices[v].used;
            pthread_mutex_unlock(&fg_devices[v].lock);
        }
    return used;
}

/* The machine's device PHYSICAL as NVML's GPU handle shows it: its MIG devices (0 when it is
 * out of MIG mode), its capacity and the bytes in use on it (in MIG mode the sum over its GPU
 * instances); -1 when there is no such device. */
FG_EXPORT int vramshim_fakegpu_card(int physical, unsigned long long *total,
                                    unsigned long long *used)
{
    const struct fg_config *config = fg_config();
    if (physical < 0 || physical >= config->physical_count || !used || !total)
        return -1;
    const struct fg_card *card = &config->cards[physical];
    *total = config->mig ? config->card_memory : config->memory;
    *used = 0;
    if (card->mig_count == 0)
        *used = unit_used(card->unit);
    for (int k = 0; k < card->mig_count; k++)
        if (k == 0 || card->mig[k].unit != card->mig[k - 1].unit) /* once per GPU instance */
            *used += unit_used(card->mig[k].unit);
    return card->mig_count;
}

/* MIG device INDEX of the machine's device PHYSICAL; -1 when there is none. */
FG_EXPORT int vramshim_fakegpu_mig_device(int physical, int index,
                                          struct vramshim_fakegpu_mig_info *out)
{
    const struct fg_config *config = fg_config();
    if (physical < 0 || physical >= config->physical_count || !out || index < 0 ||
        index >= config->cards[physical].mig_count)
        return -1;
    const struct fg_mig_device *m = &config->cards[physical].mig[index];
    memset(out, 0, sizeof *out);
    snprintf(out->profile, sizeof out->profile, "%s", m->profile);
    fg_mig_name(physical, index, out->name, sizeof out->name);
    out->total = m->memory;
    out->used = unit_used(m->unit);
    out->gpu_instance_id = m->gi_id;
    out->start = m->start;
    out->eighths = m->eighths;
    out->slices = m->slices;
    out->sms = m->sms;
    out->unit = m->unit;
    out->media = m->media;
    out->ci_id = m->ci_id;
    out->ci_slices = m->ci_slices;
    out->ci_start = m->ci_start;
    return 0;
}

/* The processes holding memory on memory UNIT (a card out of MIG mode or a MIG device), from
 * the device ledger: up to MAX pids and their bytes, and their number; -1 without a ledger. */
FG_EXPORT int vramshim_fakegpu_unit_processes(int unit, int max, int *pids,
                                              unsigned long long *used)
{
    if (unit < 0 || unit >= FG_MAX_DEVICES || max < 0 || (max && (!pids || !used)))
        return -1;
    return fg_ledger_processes(unit, max, pids, used);
}

/* The memory unit of the machine's device PHYSICAL out of MIG mode; -1 when there is none. */
FG_EXPORT int vramshim_fakegpu_card_unit(int physical)
{
    const struct fg_config *config = fg_config();
    if (physical < 0 || physical >= config->physical_count || config->cards[physical].mig_count)
        return -1;
    return config->cards[physical].unit;
}

/* With cards in MIG mode: the bytes of one memory slice (an eighth of a card) and the SMs of
 * one compute slice, as the MIG devices have them; 0 when no card is in MIG mode. */
FG_EXPORT int vramshim_fakegpu_mig_slices(unsigned long long *eighth, int *slice_sms)
{
    const struct fg_config *config = fg_config();
    if (!config->mig || !eighth || !slice_sms)
        return 0;
    *eighth = config->mig_eighth;
    *slice_sms = config->mig_slice_sms;
    return 1;
}

/* This process's bytes on memory UNIT (NVML lists it alone without a ledger). */
FG_EXPORT unsigned long long vramshim_fakegpu_unit_used(int unit)
{
    return unit >= 0 && unit < FG_MAX_DEVICES ? unit_used(unit) : 0;
}

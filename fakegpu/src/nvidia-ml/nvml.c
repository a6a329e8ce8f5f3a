/* The fake NVML (libnvidia-ml.so.1): the devices of the fake driver, with memory figures from
 * its bookkeeping. With a device ledger (VRAMSHIM_FAKEGPU_LEDGER) the figures are the machine's
 * and each process holding memory is listed; without one this process is the only one on each
 * device and holds everything in use (PyTorch's out-of-memory message reads "this process has
 * ... in use" from here). In MIG mode (VRAMSHIM_FAKEGPU_MIG) each GPU has one MIG device, the
 * driver's CUDA device: MIG device handles (nvmlDeviceGetMigDeviceHandleByIndex) answer for it
 * (its name, "MIG-" UUID, memory), GPU handles for the whole card (its name and memory). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FG_EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_UNKNOWN = 999,
};

/* From the fake driver (libcuda.so.1). NVML indexes the machine's devices, like the real one:
 * CUDA_VISIBLE_DEVICES does not apply to it. */
int vramshim_fakegpu_physical_count(void);
int vramshim_fakegpu_fabric(void);
int vramshim_fakegpu_physical_device(int physical, char *name, int len, int *cc_major,
                                     int *cc_minor);
int vramshim_fakegpu_device_memory(int physical, unsigned long long *used,
                                   unsigned long long *total);
int vramshim_fakegpu_mig(char *profile, int profile_len, char *name, int len,
                         unsigned long long *card_memory);
int vramshim_fakegpu_device_processes(int physical, int max, int *pids, unsigned long long *used);

struct nvml_device {
    int index;
    int mig; /* a MIG device handle */
};
typedef struct nvml_device *nvmlDevice_t;
static struct nvml_device devices[64], mig_devices[64];
static int initialized;
/* The most MIG devices one GPU can hold (A100, H100, H200: seven 1g instances). */
#define MAX_MIG_DEVICES 7

static int device_count(void)
{
    int count = vramshim_fakegpu_physical_count();
    return count > 0 ? count : 0;
}

static nvmlReturn_t check(nvmlDevice_t device)
{
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return NVML_ERROR_UNINITIALIZED;
    if (!device || device < devices || device >= devices + device_count())
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

static int mig_mode(void) { return vramshim_fakegpu_mig(NULL, 0, NULL, 0, NULL); }

/* A GPU handle or, in MIG mode, a MIG device handle. */
static nvmlReturn_t check_any(nvmlDevice_t device)
{
    if (device && mig_mode() && device >= mig_devices && device < mig_devices + device_count())
        return __atomic_load_n(&initialized, __ATOMIC_ACQUIRE) ? NVML_SUCCESS
                                                               : NVML_ERROR_UNINITIALIZED;
    return check(device);
}

FG_EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    if (vramshim_fakegpu_physical_count() < 0)
        return NVML_ERROR_DRIVER_NOT_LOADED; /* an invalid VRAMSHIM_FAKEGPU_* (already said) */
    for (int i = 0; i < 64; i++) {
        devices[i].index = mig_devices[i].index = i;
        mig_devices[i].mig = 1;
    }
    __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
FG_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { return nvmlInit_v2(); }
FG_EXPORT nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

FG_EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t text(char *out, unsigned int length, const char *value)
{
    if (!out || length == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) >= length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, value);
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    return text(version, length, "580.95.05");
}

FG_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    return text(version, length, "13.580.95.05");
}

FG_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version)
{
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    *version = 13020;
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version)
{
    return nvmlSystemGetCudaDriverVersion_v2(version);
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return NVML_ERROR_UNINITIALIZED;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned)device_count();
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned)device_count())
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

/* The fake driver's bus ids are 00000000:<0x10 + ordinal>:00.0. */
FG_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device)
{
    unsigned domain, bus, slot, function;
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return NVML_ERROR_UNINITIALIZED;
    if (!bus_id || !device || sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &slot, &function) != 4)
        return NVML_ERROR_INVALID_ARGUMENT;
    int index = (int)bus - 0x10;
    if (domain != 0 || slot != 0 || function != 0 || index < 0 || index >= device_count())
        return NVML_ERROR_NOT_FOUND;
    *device = &devices[index];
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    nvmlReturn_t rc = check(device);
    if (rc || !index)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)device->index;
    return NVML_SUCCESS;
}

/* The driver's device name is the MIG device's in MIG mode; a GPU handle names the card. */
FG_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    nvmlReturn_t rc = check_any(device);
    char value[256];
    int major, minor;
    if (rc)
        return rc;
    vramshim_fakegpu_physical_device(device->index, value, sizeof value, &major, &minor);
    if (!device->mig)
        vramshim_fakegpu_mig(NULL, 0, value, sizeof value, NULL);
    return text(name, length, value);
}

/* GPU-46414b45-4750-5500-... ("FAKEGPU") for a GPU, MIG-46414b45-4d49-4700-... ("FAKEMIG")
 * for its MIG device, the machine's device index in the last byte: the driver's bytes. */
static void uuid_text(int index, int mig, char *out, size_t n)
{
    snprintf(out, n, mig ? "MIG-46414b45-4d49-4700-0000-0000000000%02x"
                         : "GPU-46414b45-4750-5500-0000-0000000000%02x",
             index);
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    nvmlReturn_t rc = check_any(device);
    char value[64];
    if (rc)
        return rc;
    uuid_text(device->index, device->mig, value, sizeof value);
    return text(uuid, length, value);
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < device_count(); i++)
        for (int mig = 0; mig <= mig_mode(); mig++) {
            char value[64];
            uuid_text(i, mig, value, sizeof value);
            if (strcmp(value, uuid) == 0) {
                *device = mig ? &mig_devices[i] : &devices[i];
                return NVML_SUCCESS;
            }
        }
    return NVML_ERROR_NOT_FOUND;
}

/* NVML_DEVICE_MIG_ENABLE (1) now and after a reset in MIG mode, else DISABLE (0). */
FG_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current,
                                            unsigned int *pending)
{
    nvmlReturn_t rc = check(device);
    if (rc || !current || !pending)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    *current = *pending = (unsigned)mig_mode();
    return NVML_SUCCESS;
}

/* As NVIDIA documents: zero when MIG is not enabled. */
FG_EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    nvmlReturn_t rc = check(device);
    if (rc || !count)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    *count = mig_mode() ? MAX_MIG_DEVICES : 0;
    return NVML_SUCCESS;
}

/* The GPU's one MIG device is index 0; the other indices a GPU could hold have none. */
FG_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                           nvmlDevice_t *mig)
{
    nvmlReturn_t rc = check(device);
    if (rc || !mig || index >= MAX_MIG_DEVICES)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    if (!mig_mode())
        return NVML_ERROR_NOT_SUPPORTED;
    if (index != 0)
        return NVML_ERROR_NOT_FOUND;
    *mig = &mig_devices[device->index];
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig,
                                                                    nvmlDevice_t *device)
{
    nvmlReturn_t rc = check_any(mig);
    if (rc || !device || !mig->mig)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[mig->index];
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *is_mig)
{
    nvmlReturn_t rc = check_any(device);
    if (rc || !is_mig)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = (unsigned)device->mig;
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major,
                                                           int *minor)
{
    nvmlReturn_t rc = check_any(device);
    if (rc || !major || !minor)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    char name[256];
    vramshim_fakegpu_physical_device(device->index, name, sizeof name, major, minor);
    return NVML_SUCCESS;
}

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

/* The device's capacity and this process's use of it: in MIG mode a MIG device handle gives
 * the MIG device's capacity, a GPU handle the whole card's. */
static void device_memory(nvmlDevice_t device, unsigned long long *used, unsigned long long *total)
{
    vramshim_fakegpu_device_memory(device->index, used, total);
    if (!device->mig)
        vramshim_fakegpu_mig(NULL, 0, NULL, 0, total);
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    unsigned long long used, total;
    nvmlReturn_t rc = check_any(device);
    if (rc || !memory)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    device_memory(device, &used, &total);
    memory->total = total;
    memory->used = used;
    memory->free = total - used;
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    unsigned long long used, total;
    nvmlReturn_t rc = check_any(device);
    if (rc || !memory)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    device_memory(device, &used, &total);
    memory->total = total;
    memory->reserved = 0;
    memory->used = used;
    memory->free = total - used;
    return NVML_SUCCESS;
}

/* The processes holding memory on DEVICE: from the device ledger, or this one holding every
 * byte in use. ENTRY_SIZE is the size of the caller's nvmlProcessInfo structure (16 bytes for
 * v1, 24 for v2 and v3); pid and usedGpuMemory are at offsets 0 and 8 in each. */
static nvmlReturn_t processes(nvmlDevice_t device, unsigned int *count, void *infos,
                              size_t entry_size)
{
    enum { MAX_LISTED = 256 };
    static __thread int pids[MAX_LISTED];
    static __thread unsigned long long bytes[MAX_LISTED];
    unsigned long long used, total;
    nvmlReturn_t rc = check_any(device);
    if (rc || !count)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    int listed = vramshim_fakegpu_device_processes(device->index, MAX_LISTED, pids, bytes);
    if (listed < 0) {
        vramshim_fakegpu_device_memory(device->index, &used, &total);
        listed = used > 0 ? 1 : 0;
        pids[0] = getpid();
        bytes[0] = used;
    } else if (listed > MAX_LISTED)
        listed = MAX_LISTED;
    unsigned wanted = (unsigned)listed;
    if (*count < wanted || (wanted && !infos)) {
        *count = wanted;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = wanted;
    for (unsigned i = 0; i < wanted; i++) {
        unsigned char *entry = (unsigned char *)infos + i * entry_size;
        memset(entry, 0, entry_size);
        *(unsigned *)entry = (unsigned)pids[i];
        *(unsigned long long *)(entry + 8) = bytes[i];
        if (entry_size >= 24) {
            /* The GPU and compute instance ids: none without MIG; with it the one MIG
             * device's, numbered 0 here (a real GPU numbers instances by placement). */
            unsigned id = mig_mode() ? 0 : 0xFFFFFFFFu;
            ((unsigned *)(entry + 16))[0] = id;
            ((unsigned *)(entry + 16))[1] = id;
        }
    }
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                            unsigned int *count, void *infos)
{
    return processes(device, count, infos, 16);
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                               unsigned int *count, void *infos)
{
    return processes(device, count, infos, 24);
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                               unsigned int *count, void *infos)
{
    return processes(device, count, infos, 24);
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                           int *type)
{
    nvmlReturn_t rc = check(device);
    return rc ? rc : NVML_ERROR_NOT_SUPPORTED; /* no NVLink */
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                           void *pci)
{
    nvmlReturn_t rc = check(device);
    return rc ? rc : NVML_ERROR_NOT_SUPPORTED;
}

/* No fabric (NVLink switch) memory: the call succeeds and says the state is "not supported",
 * which is what a card outside an NVLink domain reports. With VRAMSHIM_FAKEGPU_FABRIC=1 (the
 * H100/H200 presets) the fabric is there, registered ("completed"), as on the HGX machines
 * measured; PyTorch then tries a fabric handle, which the driver refuses (800).
 * nvmlGpuFabricInfoV_t: version, clusterUuid[16], status (at 20), cliqueId (24), state (28),
 * healthMask (32). */
FG_EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, void *info)
{
    nvmlReturn_t rc = check(device);
    if (rc || !info)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    unsigned char *p = info;
    memset(p + 4, 0, 32);
    if (vramshim_fakegpu_fabric()) {
        *(int *)(p + 20) = NVML_SUCCESS;
        p[28] = 3; /* NVML_GPU_FABRIC_STATE_COMPLETED */
    } else {
        *(int *)(p + 20) = NVML_ERROR_NOT_SUPPORTED;
        p[28] = 0; /* NVML_GPU_FABRIC_STATE_NOT_SUPPORTED */
    }
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, unsigned int *rates)
{
    nvmlReturn_t rc = check(device);
    if (rc || !rates)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    rates[0] = rates[1] = 0;
    return NVML_SUCCESS;
}

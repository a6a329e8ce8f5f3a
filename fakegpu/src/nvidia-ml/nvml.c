/* The fake NVML (libnvidia-ml.so.1): the devices of the fake driver, with memory figures from
 * its bookkeeping. With a device ledger (VRAMSHIM_FAKEGPU_LEDGER) the figures are the machine's
 * and each process holding memory is listed; without one this process is the only one on each
 * device and holds everything in use (PyTorch's out-of-memory message reads "this process has
 * ... in use" from here). A card in MIG mode (VRAMSHIM_FAKEGPU_MIG) has the MIG devices the
 * driver's layout gives it: MIG device handles (nvmlDeviceGetMigDeviceHandleByIndex) answer for
 * each (its name, "MIG-" UUID, memory, GPU and compute instance ids, processes), GPU handles for
 * the whole card (its name and memory, the bytes in use over its MIG devices). */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fakegpu_mig.h"

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
int vramshim_fakegpu_card(int physical, unsigned long long *total, unsigned long long *used);
int vramshim_fakegpu_mig_device(int physical, int index, struct vramshim_fakegpu_mig_info *out);
int vramshim_fakegpu_unit_processes(int unit, int max, int *pids, unsigned long long *used);
unsigned long long vramshim_fakegpu_unit_used(int unit);
int vramshim_fakegpu_card_unit(int physical);
int vramshim_fakegpu_mig_slices(unsigned long long *eighth, int *slice_sms);

struct nvml_device {
    int index; /* the machine's device */
    int mig;   /* a MIG device handle: its MIG index + 1; 0: the GPU */
};
typedef struct nvml_device *nvmlDevice_t;
#define MAX_MIG_DEVICES 7
static struct nvml_device devices[64], mig_devices[64][MAX_MIG_DEVICES];
static int initialized;
/* MAX_MIG_DEVICES: the most MIG devices one GPU can hold (A100, H100, H200: seven 1g). */

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

/* The MIG devices of GPU INDEX; 0 when it is out of MIG mode. */
static int mig_count(int index)
{
    unsigned long long total, used;
    int count = vramshim_fakegpu_card(index, &total, &used);
    return count > 0 ? count : 0;
}

/* A GPU handle or a MIG device handle of a card in MIG mode. */
static nvmlReturn_t check_any(nvmlDevice_t device)
{
    struct nvml_device *first = &mig_devices[0][0];
    if (device && device >= first && device < first + 64 * MAX_MIG_DEVICES) {
        if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
            return NVML_ERROR_UNINITIALIZED;
        return device->index < device_count() && device->mig <= mig_count(device->index)
                   ? NVML_SUCCESS
                   : NVML_ERROR_INVALID_ARGUMENT;
    }
    return check(device);
}

/* What the driver says of the MIG device behind handle DEVICE (a MIG device handle). */
static struct vramshim_fakegpu_mig_info mig_info(nvmlDevice_t device)
{
    struct vramshim_fakegpu_mig_info info;
    memset(&info, 0, sizeof info);
    vramshim_fakegpu_mig_device(device->index, device->mig - 1, &info);
    return info;
}

FG_EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    if (vramshim_fakegpu_physical_count() < 0)
        return NVML_ERROR_DRIVER_NOT_LOADED; /* an invalid VRAMSHIM_FAKEGPU_* (already said) */
    for (int i = 0; i < 64; i++) {
        devices[i].index = i;
        for (int k = 0; k < MAX_MIG_DEVICES; k++) {
            mig_devices[i][k].index = i;
            mig_devices[i][k].mig = k + 1;
        }
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
    if (device->mig)
        return text(name, length, mig_info(device).name);
    vramshim_fakegpu_physical_device(device->index, value, sizeof value, &major, &minor);
    return text(name, length, value);
}

/* GPU-46414b45-4750-5500-... ("FAKEGPU") for a GPU, MIG-46414b45-4d49-4700-... ("FAKEMIG")
 * for its MIG devices, the MIG index in the byte before the last and the machine's device index
 * in the last: the driver's bytes. MIG is the MIG index + 1, or 0 for the GPU. */
static void uuid_text(int index, int mig, char *out, size_t n)
{
    if (mig)
        snprintf(out, n, "MIG-46414b45-4d49-4700-0000-00000000%02x%02x", mig - 1, index);
    else
        snprintf(out, n, "GPU-46414b45-4750-5500-0000-0000000000%02x", index);
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
        for (int mig = 0; mig <= mig_count(i); mig++) {
            char value[64];
            uuid_text(i, mig, value, sizeof value);
            if (strcmp(value, uuid) == 0) {
                *device = mig ? &mig_devices[i][mig - 1] : &devices[i];
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
    *current = *pending = mig_count(device->index) > 0;
    return NVML_SUCCESS;
}

/* As NVIDIA documents: zero when MIG is not enabled. */
FG_EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    nvmlReturn_t rc = check(device);
    if (rc || !count)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    *count = mig_count(device->index) ? MAX_MIG_DEVICES : 0;
    return NVML_SUCCESS;
}

/* The GPU's MIG devices by index (by GPU instance id); the other indices a GPU could hold have
 * none. */
FG_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                           nvmlDevice_t *mig)
{
    nvmlReturn_t rc = check(device);
    if (rc || !mig || index >= MAX_MIG_DEVICES)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    int count = mig_count(device->index);
    if (!count)
        return NVML_ERROR_NOT_SUPPORTED;
    if ((int)index >= count)
        return NVML_ERROR_NOT_FOUND;
    *mig = &mig_devices[device->index][index];
    return NVML_SUCCESS;
}

/* A MIG device's GPU instance id (by placement) and compute instance id (0: the one compute
 * instance of its GPU instance); a GPU handle has none. */
FG_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    nvmlReturn_t rc = check_any(device);
    if (rc || !id)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    if (!device->mig)
        return NVML_ERROR_NOT_SUPPORTED;
    *id = (unsigned)mig_info(device).gpu_instance_id;
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    nvmlReturn_t rc = check_any(device);
    if (rc || !id)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    if (!device->mig)
        return NVML_ERROR_NOT_SUPPORTED;
    *id = 0;
    return NVML_SUCCESS;
}

/* GPU-instance profiles (NVML_GPU_INSTANCE_PROFILE_*: 1_SLICE 0, 2_SLICE 1, 3_SLICE 2, 4_SLICE
 * 3, 7_SLICE 4, 1_SLICE_REV2 9, the 1g instance with 2/8 of the memory) on the cards the fakes
 * put in MIG mode (A100, H100, H200): compute slices, memory eighths, the driver's profile id
 * (as `nvidia-smi mig -lgip` lists it: 19, 14, 9, 5, 0, 15) and the placements a card has (the
 * MIG user guide's). Others (+me, 6 and 8 slices): not supported. */
static const struct {
    unsigned profile, slices, eighths, id, placements;
} gi_profiles[] = {
    {0, 1, 1, 19, 7}, {1, 2, 2, 14, 3}, {2, 3, 4, 9, 2},
    {3, 4, 4, 5, 1},  {4, 7, 8, 0, 1},  {9, 1, 2, 15, 4},
};

/* The entry of gi_profiles for PROFILE, or -1. */
static int gi_profile(unsigned profile)
{
    for (int i = 0; i < (int)(sizeof gi_profiles / sizeof *gi_profiles); i++)
        if (gi_profiles[i].profile == profile)
            return i;
    return -1;
}

/* nvmlGpuInstanceProfileInfo_t: id, isP2pSupported, sliceCount, instanceCount,
 * multiprocessorCount, copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount (the
 * engines are not modelled: 0), memorySizeMB. */
typedef struct {
    unsigned id, p2p, slices, instances, sms, copy_engines, decoders, encoders, jpegs, ofas;
    unsigned long long memory_mb;
} nvmlGpuInstanceProfileInfo_t;

FG_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                           nvmlGpuInstanceProfileInfo_t *info)
{
    nvmlReturn_t rc = check(device);
    if (rc || !info)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long eighth;
    int slice_sms, p = gi_profile(profile);
    if (!mig_count(device->index) || !vramshim_fakegpu_mig_slices(&eighth, &slice_sms))
        return NVML_ERROR_NOT_SUPPORTED;
    if (p < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    memset(info, 0, sizeof *info);
    info->id = gi_profiles[p].id;
    info->slices = gi_profiles[p].slices;
    info->instances = gi_profiles[p].placements;
    info->sms = gi_profiles[p].slices * (unsigned)slice_sms;
    info->memory_mb = (eighth * gi_profiles[p].eighths) >> 20;
    return NVML_SUCCESS;
}

/* A GPU instance handle: the GPU and the MIG device (its one compute instance) it holds. */
struct nvml_gpu_instance {
    int index, mig;
};
static struct nvml_gpu_instance gpu_instances[64][MAX_MIG_DEVICES];

/* nvmlGpuInstanceInfo_t: the GPU's handle, the instance id, the profile id (the driver's, as in
 * nvmlGpuInstanceProfileInfo_t), its placement (first memory slice, slices). */
typedef struct {
    nvmlDevice_t device;
    unsigned id, profile_id, start, size;
} nvmlGpuInstanceInfo_t;

/* The GPU instance with id ID on the GPU DEVICE (the real call needs privileges; the fake's
 * does not). */
FG_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                                    struct nvml_gpu_instance **instance)
{
    nvmlReturn_t rc = check(device);
    if (rc || !instance)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    int count = mig_count(device->index);
    if (!count)
        return NVML_ERROR_NOT_SUPPORTED;
    for (int k = 0; k < count; k++) {
        struct vramshim_fakegpu_mig_info info;
        vramshim_fakegpu_mig_device(device->index, k, &info);
        if ((unsigned)info.gpu_instance_id == id) {
            gpu_instances[device->index][k] = (struct nvml_gpu_instance){device->index, k};
            *instance = &gpu_instances[device->index][k];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* The GPU instances of PROFILE (an NVML_GPU_INSTANCE_PROFILE_* value) on DEVICE, by id. */
FG_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profile,
                                                 struct nvml_gpu_instance **instances,
                                                 unsigned int *count)
{
    nvmlReturn_t rc = check(device);
    if (rc || !count || !instances)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    int migs = mig_count(device->index), p = gi_profile(profile);
    if (!migs || p < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned n = 0;
    for (int k = 0; k < migs; k++) {
        struct vramshim_fakegpu_mig_info info;
        vramshim_fakegpu_mig_device(device->index, k, &info);
        if ((unsigned)info.slices == gi_profiles[p].slices &&
            (unsigned)info.eighths == gi_profiles[p].eighths) {
            gpu_instances[device->index][k] = (struct nvml_gpu_instance){device->index, k};
            instances[n++] = &gpu_instances[device->index][k];
        }
    }
    *count = n;
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(struct nvml_gpu_instance *instance,
                                              nvmlGpuInstanceInfo_t *info)
{
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return NVML_ERROR_UNINITIALIZED;
    struct nvml_gpu_instance *first = &gpu_instances[0][0];
    if (!instance || !info || instance < first || instance >= first + 64 * MAX_MIG_DEVICES ||
        instance->mig >= mig_count(instance->index))
        return NVML_ERROR_INVALID_ARGUMENT;
    struct vramshim_fakegpu_mig_info mig;
    vramshim_fakegpu_mig_device(instance->index, instance->mig, &mig);
    memset(info, 0, sizeof *info);
    info->device = &devices[instance->index];
    info->id = (unsigned)mig.gpu_instance_id;
    for (size_t p = 0; p < sizeof gi_profiles / sizeof *gi_profiles; p++)
        if (gi_profiles[p].slices == (unsigned)mig.slices &&
            gi_profiles[p].eighths == (unsigned)mig.eighths)
            info->profile_id = gi_profiles[p].id;
    info->start = (unsigned)mig.start;
    info->size = (unsigned)mig.eighths;
    return NVML_SUCCESS;
}

/* nvmlDeviceAttributes_t: multiprocessorCount, the shared engines (copy, decoder, encoder,
 * JPEG, OFA: not modelled, 0), gpuInstanceSliceCount, computeInstanceSliceCount, memorySizeMB.
 * A MIG device handle's are its instance's; a GPU handle's the whole card's (7 slices). */
typedef struct {
    unsigned sms, copy_engines, decoders, encoders, jpegs, ofas, gpu_instance_slices,
        compute_instance_slices;
    unsigned long long memory_mb;
} nvmlDeviceAttributes_t;

FG_EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device,
                                                  nvmlDeviceAttributes_t *attributes)
{
    nvmlReturn_t rc = check_any(device);
    if (rc || !attributes)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    if (!device->mig)
        return NVML_ERROR_NOT_SUPPORTED; /* the whole card's: not modelled */
    struct vramshim_fakegpu_mig_info info = mig_info(device);
    memset(attributes, 0, sizeof *attributes);
    attributes->sms = (unsigned)info.sms;
    attributes->gpu_instance_slices = (unsigned)info.slices;
    attributes->compute_instance_slices = (unsigned)info.slices;
    attributes->memory_mb = info.total >> 20;
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device,
                                               nvmlDeviceAttributes_t *attributes)
{
    return nvmlDeviceGetAttributes_v2(device, attributes);
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
    *is_mig = device->mig > 0;
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

/* The device's capacity and the bytes in use on it: a MIG device handle's are the MIG
 * device's, a GPU handle's the whole card's (in MIG mode the sum over its MIG devices). */
static void device_memory(nvmlDevice_t device, unsigned long long *used, unsigned long long *total)
{
    if (device->mig) {
        struct vramshim_fakegpu_mig_info info = mig_info(device);
        *total = info.total;
        *used = info.used;
    } else
        vramshim_fakegpu_card(device->index, total, used);
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
 * byte it has in use; for a GPU in MIG mode those of each of its MIG devices, for a MIG device
 * handle its own, each entry with the MIG device's GPU and compute instance ids (none, 0xFFFFFFFF,
 * out of MIG mode). ENTRY_SIZE is the size of the caller's nvmlProcessInfo structure (16 bytes
 * for v1, 24 for v2 and v3); pid and usedGpuMemory are at offsets 0 and 8 in each, the GPU and
 * compute instance ids at 16 and 20. */
static nvmlReturn_t processes(nvmlDevice_t device, unsigned int *count, void *infos,
                              size_t entry_size)
{
    enum { MAX_LISTED = 256 };
    static __thread int pids[MAX_LISTED];
    static __thread unsigned long long bytes[MAX_LISTED];
    static __thread unsigned gpu_instance[MAX_LISTED];
    nvmlReturn_t rc = check_any(device);
    if (rc || !count)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    /* The memory units to list: the card's, or its MIG devices' (with their instance ids). */
    int units[MAX_MIG_DEVICES], ids[MAX_MIG_DEVICES], unit_count = 0;
    unsigned long long total, used;
    int migs = vramshim_fakegpu_card(device->index, &total, &used);
    for (int k = 0; k < (migs > 0 ? migs : 0); k++)
        if (!device->mig || device->mig == k + 1) {
            struct vramshim_fakegpu_mig_info info;
            vramshim_fakegpu_mig_device(device->index, k, &info);
            units[unit_count] = info.unit;
            ids[unit_count++] = info.gpu_instance_id;
        }
    if (migs <= 0) {
        /* Out of MIG mode: the card's own memory unit. */
        units[unit_count] = -1;
        ids[unit_count++] = -1;
    }
    int listed = 0;
    for (int u = 0; u < unit_count; u++) {
        int unit = units[u] >= 0 ? units[u] : vramshim_fakegpu_card_unit(device->index);
        int n = vramshim_fakegpu_unit_processes(unit, MAX_LISTED - listed, pids + listed,
                                                bytes + listed);
        if (n < 0) {
            unsigned long long mine = vramshim_fakegpu_unit_used(unit);
            n = mine > 0 && listed < MAX_LISTED ? 1 : 0;
            if (n) {
                pids[listed] = getpid();
                bytes[listed] = mine;
            }
        } else if (n > MAX_LISTED - listed)
            n = MAX_LISTED - listed;
        for (int i = 0; i < n; i++)
            gpu_instance[listed + i] = (unsigned)ids[u];
        listed += n;
    }
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
            bool none = gpu_instance[i] == 0xFFFFFFFFu;
            ((unsigned *)(entry + 16))[0] = gpu_instance[i];
            ((unsigned *)(entry + 16))[1] = none ? 0xFFFFFFFFu : 0; /* one compute instance */
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

/* The fake NVML (libnvidia-ml.so.1): the devices of the fake driver, with memory figures from
 * its bookkeeping. With a device ledger (VRAMSHIM_FAKEGPU_LEDGER) the figures are the machine's
 * and each process holding memory is listed; without one this process is the only one on each
 * device and holds everything in use (PyTorch's out-of-memory message reads "this process has
 * ... in use" from here). A card in MIG mode (VRAMSHIM_FAKEGPU_MIG) has the MIG devices the
 * driver's layout gives it: MIG device handles (nvmlDeviceGetMigDeviceHandleByIndex, one per
 * compute instance) answer for each (its name, "MIG-" UUID, its GPU instance's memory, GPU and
 * compute instance ids, processes), GPU handles for the whole card (its name and memory, the
 * bytes in use over its GPU instances). GPU and compute instances can be created and destroyed
 * here, in this process's view only (see the MIG state below). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fakegpu_fork.h"
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
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
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

struct nvml_ci;
struct nvml_device {
    int index;          /* the machine's device */
    int mig;            /* 1: a MIG device handle (a compute instance); 0: the GPU */
    struct nvml_ci *ci; /* a MIG device handle's compute instance */
};
typedef struct nvml_device *nvmlDevice_t;
#define MAX_MIG_DEVICES 7
/* GPU instance ids by placement: 0 (the whole card) to 14 (an eighth at memory slice 7). */
#define MAX_GI_IDS 15
/* Compute instance ids within a GPU instance: 0 to 7. */
#define MAX_CI_IDS 8

/* The MIG state as this process's NVML sees it: the driver's layout (VRAMSHIM_FAKEGPU_MIG),
 * then what this process created and destroyed. A GPU instance is slot [card][its id]; its
 * compute instances are slots by their id; a MIG device handle is its compute instance's.
 * Changes stay in this process (the driver's layout, CUDA's devices and other processes do not
 * see them), as the fakes model no shared driver state but the device ledger. */
struct nvml_gi;
struct nvml_ci {
    bool live;
    int id, slices, start; /* its placement within the GPU instance's compute slices */
    int uuid_index;        /* the MIG UUID's index byte: the driver's MIG device, or next free */
    struct nvml_device handle;
    struct nvml_gi *gi;
};
struct nvml_gi {
    bool live;
    int card, id, profile, start; /* profile: the gi_profiles entry; start: first memory slice */
    int unit;                     /* the driver's memory unit; -1: created here (no memory use) */
    char name[32];                /* its profile's name: "3g.40gb", "1g.10gb+me" */
    struct nvml_ci ci[MAX_CI_IDS];
};
static struct nvml_gi gpu_instances[64][MAX_GI_IDS];
static bool card_in_mig[64];
static int next_uuid[64];
static pthread_mutex_t mig_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t mig_once = PTHREAD_ONCE_INIT;
static struct nvml_device devices[64];
static int initialized;

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

/* GPU-instance profiles (NVML_GPU_INSTANCE_PROFILE_*: 1_SLICE 0, 2_SLICE 1, 3_SLICE 2, 4_SLICE
 * 3, 7_SLICE 4, 1_SLICE_REV1 7 (the 1g instance with media extensions, +me), 1_SLICE_REV2 9
 * (the 1g instance with 2/8 of the memory)) on the cards the fakes put in MIG mode (A100, H100,
 * H200): compute slices, memory eighths, media extensions, the driver's profile id (as
 * `nvidia-smi mig -lgip` lists it: 19, 14, 9, 5, 0, 20, 15) and how many instances a card
 * holds (the MIG user guide's "Supported MIG Profiles": 7 placements of 1g, 3 of 2g, ...; +me
 * "a single 1g profile can include media extensions": 1, at any 1g placement). Others (6 and 8
 * slices, 2g+me, the Blackwell profiles): not supported. */
static const struct {
    unsigned profile, slices, eighths, media, id, instances;
} gi_profiles[] = {
    {0, 1, 1, 0, 19, 7}, {1, 2, 2, 0, 14, 3}, {2, 3, 4, 0, 9, 2}, {3, 4, 4, 0, 5, 1},
    {4, 7, 8, 0, 0, 1},  {7, 1, 1, 1, 20, 1}, {9, 1, 2, 0, 15, 4},
};
#define GI_PROFILES ((int)(sizeof gi_profiles / sizeof *gi_profiles))

/* Where each GPU-instance shape may start on a card's 8 memory slices (the guide's
 * placements, as the driver's layout uses them: fakegpu/src/cuda/config.c). */
static int gi_starts(int p, int *starts)
{
    int n = 0, eighths = (int)gi_profiles[p].eighths;
    if (eighths == 1)
        for (int s = 0; s < 7; s++)
            starts[n++] = s;
    else if (eighths == 2)
        for (int s = 0; s < (gi_profiles[p].slices == 1 ? 8 : 6); s += 2)
            starts[n++] = s;
    else if (gi_profiles[p].slices == 3)
        starts[n++] = 0, starts[n++] = 4;
    else
        starts[n++] = 0;
    return n;
}

/* The entry of gi_profiles for the NVML_GPU_INSTANCE_PROFILE_* value PROFILE, or -1. */
static int gi_profile(unsigned profile)
{
    for (int i = 0; i < GI_PROFILES; i++)
        if (gi_profiles[i].profile == profile)
            return i;
    return -1;
}

/* The entry of gi_profiles whose driver id is ID, or -1. */
static int gi_profile_by_id(unsigned id)
{
    for (int i = 0; i < GI_PROFILES; i++)
        if (gi_profiles[i].id == id)
            return i;
    return -1;
}

/* A GPU instance's id by placement, as the driver's layout numbers them. */
static int gi_id_of(int eighths, int start)
{
    return eighths == 8 ? 0 : eighths == 4 ? 1 + start / 4 : eighths == 2 ? 3 + start / 2 : 7 + start;
}

/* The name of GPU-instance profile P on card CARD (mig_lock held): the layout's for it where
 * the card has or had an instance of it, else the MIG user guide's, by the card's memory (its
 * A100 40GB, A100 80GB/H100 and H200 tables: 1g.5gb ... 7g.40gb, 1g.10gb ... 7g.80gb, 1g.18gb
 * ... 7g.141gb), "+me" after it for the media extensions. */
static void profile_name(int card, int p, char *out, size_t n)
{
    for (int g = 0; g < MAX_GI_IDS; g++)
        if (gpu_instances[card][g].profile == p && gpu_instances[card][g].name[0]) {
            snprintf(out, n, "%s", gpu_instances[card][g].name);
            return;
        }
    /* GB figures by shape: 1g of 1/8, 1g of 2/8, 2g, 3g, 4g, 7g. */
    static const unsigned gb[3][6] = {
        {5, 10, 10, 20, 20, 40}, {10, 20, 20, 40, 40, 80}, {18, 35, 35, 71, 71, 141}};
    unsigned long long total = 0, used = 0;
    vramshim_fakegpu_card(card, &total, &used);
    int size = total < (48ull << 30) ? 0 : total < (100ull << 30) ? 1 : 2;
    unsigned slices = gi_profiles[p].slices, eighths = gi_profiles[p].eighths;
    int shape = slices == 1 ? (eighths == 1 ? 0 : 1) : slices == 2 ? 2 : slices == 3 ? 3
                : slices == 4 ? 4 : 5;
    snprintf(out, n, "%ug.%ugb%s", slices, gb[size][shape], gi_profiles[p].media ? "+me" : "");
}

/* Compute-instance profiles (NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE 0 .. 4_SLICE 3, 7_SLICE 4;
 * their id is the same number, as `nvidia-smi mig -lcip` lists them): compute slices. */
static const int ci_slices_of[] = {1, 2, 3, 4, 7};

static int ci_profile_of(int slices)
{
    for (int p = 0; p < 5; p++)
        if (ci_slices_of[p] == slices)
            return p;
    return -1;
}

/* Loads the driver's layout into the MIG state, once. */
static void load_mig(void)
{
    for (int p = 0; p < device_count() && p < 64; p++) {
        unsigned long long total, used;
        int count = vramshim_fakegpu_card(p, &total, &used);
        card_in_mig[p] = count > 0;
        next_uuid[p] = count > 0 ? count : 0;
        for (int k = 0; k < count; k++) {
            struct vramshim_fakegpu_mig_info info;
            if (vramshim_fakegpu_mig_device(p, k, &info) || info.gpu_instance_id < 0 ||
                info.gpu_instance_id >= MAX_GI_IDS || info.ci_id < 0 || info.ci_id >= MAX_CI_IDS)
                continue;
            struct nvml_gi *gi = &gpu_instances[p][info.gpu_instance_id];
            if (!gi->live) {
                gi->live = true;
                gi->card = p;
                gi->id = info.gpu_instance_id;
                gi->start = info.start;
                gi->unit = info.unit;
                gi->profile = -1;
                for (int i = 0; i < GI_PROFILES; i++)
                    if (gi_profiles[i].slices == (unsigned)info.slices &&
                        gi_profiles[i].eighths == (unsigned)info.eighths &&
                        gi_profiles[i].media == (unsigned)info.media)
                        gi->profile = i;
                snprintf(gi->name, sizeof gi->name, "%s", info.profile);
            }
            struct nvml_ci *ci = &gi->ci[info.ci_id];
            ci->live = true;
            ci->id = info.ci_id;
            ci->slices = info.ci_slices;
            ci->start = info.ci_start;
            ci->uuid_index = k;
            ci->gi = gi;
            ci->handle = (struct nvml_device){p, 1, ci};
        }
    }
}

/* mig_lock is held while calling the driver (the bytes in use on a GPU instance), so it is
 * taken before the driver's locks across fork, as libcudart's is: this library's constructor
 * runs after the driver's (it links it), and prepare handlers run in reverse order of
 * registration (fakegpu_fork.h). */
static struct fg_fork_state fork_state;
static void before_fork(void)
{
    fg_fork_begin(&fork_state);
    fg_fork_take(&fork_state, &mig_lock);
}
static void after_fork_parent(void) { fg_fork_release_parent(&fork_state, &mig_lock); }
static void after_fork_child(void)
{
    fg_fork_release_child(&fork_state, &mig_lock);
    fg_fork_warn_child(&fork_state, "libnvidia-ml.so.1");
}
__attribute__((constructor)) static void register_fork_handlers(void)
{
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

static void lock_mig(void)
{
    pthread_once(&mig_once, load_mig);
    pthread_mutex_lock(&mig_lock);
}

static void unlock_mig(void) { pthread_mutex_unlock(&mig_lock); }

/* The MIG devices of GPU INDEX now (its compute instances, by GPU and compute instance id); 0
 * when it is out of MIG mode or has none. With OUT, the INDEX-th one (mig_lock held). */
static int mig_devices_of(int index, int at, struct nvml_ci **out)
{
    int n = 0;
    if (index < 0 || index >= 64)
        return 0;
    for (int g = 0; g < MAX_GI_IDS; g++) {
        struct nvml_gi *gi = &gpu_instances[index][g];
        for (int c = 0; gi->live && c < MAX_CI_IDS; c++)
            if (gi->ci[c].live) {
                if (out && n == at)
                    *out = &gi->ci[c];
                n++;
            }
    }
    return n;
}

static bool in_mig_mode(int index)
{
    pthread_once(&mig_once, load_mig);
    return index >= 0 && index < 64 && card_in_mig[index];
}

/* A MIG device handle: a compute instance's handle field, live or not. */
static bool is_mig_handle(nvmlDevice_t device)
{
    const char *p = (const char *)device, *first = (const char *)gpu_instances;
    if (!device || p < first || p >= first + sizeof gpu_instances)
        return false;
    size_t in_gi = (size_t)(p - first) % sizeof(struct nvml_gi);
    size_t offset = offsetof(struct nvml_gi, ci) + offsetof(struct nvml_ci, handle);
    return in_gi >= offset && (in_gi - offset) % sizeof(struct nvml_ci) == 0 &&
           (in_gi - offset) / sizeof(struct nvml_ci) < MAX_CI_IDS;
}

/* A GPU handle or a MIG device handle of a live compute instance (any other pointer into the
 * MIG state, such as a GPU instance handle: invalid). */
static nvmlReturn_t check_any(nvmlDevice_t device)
{
    const char *p = (const char *)device, *first = (const char *)gpu_instances;
    if (p >= first && p < first + sizeof gpu_instances && !is_mig_handle(device))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (is_mig_handle(device)) {
        if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
            return NVML_ERROR_UNINITIALIZED;
        lock_mig();
        bool live = device->ci && &device->ci->handle == device && device->ci->live &&
                    device->ci->gi->live;
        unlock_mig();
        return live ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
    }
    return check(device);
}

/* What a MIG device handle's compute instance is: its GPU instance's shape and memory unit,
 * its own slices and SMs, and its name ("NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb"). */
struct mig_view {
    int card, gi_id, ci_id, profile, gi_slices, eighths, start, ci_slices, unit, uuid_index;
    unsigned long long total;
    int sms;
    char name[256];
};

static struct mig_view mig_view(nvmlDevice_t device)
{
    struct mig_view v;
    memset(&v, 0, sizeof v);
    unsigned long long eighth = 0;
    int slice_sms = 0, major, minor;
    vramshim_fakegpu_mig_slices(&eighth, &slice_sms);
    lock_mig();
    const struct nvml_ci *ci = device->ci;
    const struct nvml_gi *gi = ci->gi;
    v.card = gi->card;
    v.gi_id = gi->id;
    v.ci_id = ci->id;
    v.profile = gi->profile;
    v.gi_slices = gi->profile >= 0 ? (int)gi_profiles[gi->profile].slices : 0;
    v.eighths = gi->profile >= 0 ? (int)gi_profiles[gi->profile].eighths : 0;
    v.start = gi->start;
    v.ci_slices = ci->slices;
    v.unit = gi->unit;
    v.uuid_index = ci->uuid_index;
    char profile[48];
    if (ci->slices == v.gi_slices)
        snprintf(profile, sizeof profile, "%s", gi->name);
    else
        snprintf(profile, sizeof profile, "%dc.%s", ci->slices, gi->name);
    unlock_mig();
    char card_name[200] = "";
    vramshim_fakegpu_physical_device(v.card, card_name, sizeof card_name, &major, &minor);
    snprintf(v.name, sizeof v.name, "%s MIG %s", card_name, profile);
    v.total = eighth * (unsigned long long)v.eighths;
    v.sms = slice_sms * v.ci_slices;
    return v;
}

FG_EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    if (vramshim_fakegpu_physical_count() < 0)
        return NVML_ERROR_DRIVER_NOT_LOADED; /* an invalid VRAMSHIM_FAKEGPU_* (already said) */
    for (int i = 0; i < 64; i++)
        devices[i].index = i;
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
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
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
        return text(name, length, mig_view(device).name);
    vramshim_fakegpu_physical_device(device->index, value, sizeof value, &major, &minor);
    return text(name, length, value);
}

/* GPU-46414b45-4750-5500-... ("FAKEGPU") for a GPU, MIG-46414b45-4d49-4700-... ("FAKEMIG")
 * for its MIG devices, the MIG index in the byte before the last and the machine's device index
 * in the last: the driver's bytes (a MIG device created here takes the next index free). MIG
 * is the UUID's MIG index + 1, or 0 for the GPU. */
static void uuid_text(int index, int mig, char *out, size_t n)
{
    if (mig)
        snprintf(out, n, "MIG-46414b45-4d49-4700-0000-00000000%02x%02x", (mig - 1) & 0xff, index);
    else
        snprintf(out, n, "GPU-46414b45-4750-5500-0000-0000000000%02x", index);
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    nvmlReturn_t rc = check_any(device);
    char value[64];
    if (rc)
        return rc;
    uuid_text(device->index, device->mig ? mig_view(device).uuid_index + 1 : 0, value,
              sizeof value);
    return text(uuid, length, value);
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < device_count(); i++) {
        char value[64];
        uuid_text(i, 0, value, sizeof value);
        if (strcmp(value, uuid) == 0) {
            *device = &devices[i];
            return NVML_SUCCESS;
        }
        lock_mig();
        int n = mig_devices_of(i, -1, NULL);
        for (int k = 0; k < n; k++) {
            struct nvml_ci *ci = NULL;
            mig_devices_of(i, k, &ci);
            uuid_text(i, ci->uuid_index + 1, value, sizeof value);
            if (strcmp(value, uuid) == 0) {
                *device = &ci->handle;
                unlock_mig();
                return NVML_SUCCESS;
            }
        }
        unlock_mig();
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
    *current = *pending = in_mig_mode(device->index);
    return NVML_SUCCESS;
}

/* As NVIDIA documents: zero when MIG is not enabled. */
FG_EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    nvmlReturn_t rc = check(device);
    if (rc || !count)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    *count = in_mig_mode(device->index) ? MAX_MIG_DEVICES : 0;
    return NVML_SUCCESS;
}

/* The GPU's MIG devices by index (by GPU instance id, then compute instance id); the other
 * indices a GPU could hold have none. */
FG_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                           nvmlDevice_t *mig)
{
    nvmlReturn_t rc = check(device);
    if (rc || !mig || index >= MAX_MIG_DEVICES)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    if (!in_mig_mode(device->index))
        return NVML_ERROR_NOT_SUPPORTED;
    struct nvml_ci *ci = NULL;
    lock_mig();
    int count = mig_devices_of(device->index, (int)index, &ci);
    unlock_mig();
    if ((int)index >= count)
        return NVML_ERROR_NOT_FOUND;
    *mig = &ci->handle;
    return NVML_SUCCESS;
}

/* A MIG device's GPU instance id (by placement) and compute instance id; a GPU handle has
 * none. */
FG_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    nvmlReturn_t rc = check_any(device);
    if (rc || !id)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    if (!device->mig)
        return NVML_ERROR_NOT_SUPPORTED;
    *id = (unsigned)mig_view(device).gi_id;
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    nvmlReturn_t rc = check_any(device);
    if (rc || !id)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    if (!device->mig)
        return NVML_ERROR_NOT_SUPPORTED;
    *id = (unsigned)mig_view(device).ci_id;
    return NVML_SUCCESS;
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
    if (!in_mig_mode(device->index) || !vramshim_fakegpu_mig_slices(&eighth, &slice_sms))
        return NVML_ERROR_NOT_SUPPORTED;
    if (p < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    memset(info, 0, sizeof *info);
    info->id = gi_profiles[p].id;
    info->slices = gi_profiles[p].slices;
    info->instances = gi_profiles[p].instances;
    info->sms = gi_profiles[p].slices * (unsigned)slice_sms;
    info->memory_mb = (eighth * gi_profiles[p].eighths) >> 20;
    return NVML_SUCCESS;
}

/* nvmlGpuInstanceProfileInfo_v2_t (a version first, then v1's fields, a name of 96 bytes
 * last) and _v3_t (v1's without isP2pSupported, the name, then capabilities). */
typedef struct {
    unsigned version, id, p2p, slices, instances, sms, copy_engines, decoders, encoders, jpegs,
        ofas;
    unsigned long long memory_mb;
    char name[96];
} nvml_gi_profile_v2;
typedef struct {
    unsigned version, id, slices, instances, sms, copy_engines, decoders, encoders, jpegs, ofas;
    unsigned long long memory_mb;
    char name[96];
    unsigned capabilities;
} nvml_gi_profile_v3;
#define GI_PROFILE_V2 ((unsigned)(sizeof(nvml_gi_profile_v2) | (2u << 24)))
#define GI_PROFILE_V3 ((unsigned)(sizeof(nvml_gi_profile_v3) | (3u << 24)))

/* The versioned one: v2 or v3 (another version: INVALID_ARGUMENT, as NVML documents for
 * info->version), with the profile's name ("MIG 1g.10gb+me", as `nvidia-smi mig -lgip` shows
 * it) and no capabilities (P2P, graphics: 0). */
FG_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                            void *info)
{
    nvmlReturn_t rc = check(device);
    if (rc || !info)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    unsigned version = *(unsigned *)info;
    if (version != GI_PROFILE_V2 && version != GI_PROFILE_V3)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlGpuInstanceProfileInfo_t plain;
    rc = nvmlDeviceGetGpuInstanceProfileInfo(device, profile, &plain);
    if (rc)
        return rc;
    char name[96] = "MIG ";
    lock_mig();
    profile_name(device->index, gi_profile(profile), name + 4, sizeof name - 4);
    unlock_mig();
    if (version == GI_PROFILE_V2) {
        nvml_gi_profile_v2 *v2 = info;
        *v2 = (nvml_gi_profile_v2){version, plain.id, plain.p2p, plain.slices, plain.instances,
                                   plain.sms, 0, 0, 0, 0, 0, plain.memory_mb, {0}};
        memcpy(v2->name, name, sizeof name);
    } else {
        nvml_gi_profile_v3 *v3 = info;
        *v3 = (nvml_gi_profile_v3){version, plain.id, plain.slices, plain.instances, plain.sms,
                                   0, 0, 0, 0, 0, plain.memory_mb, {0}, 0};
        memcpy(v3->name, name, sizeof name);
    }
    return NVML_SUCCESS;
}

typedef struct {
    unsigned start, size;
} nvml_placement;

/* nvmlGpuInstanceInfo_t: the GPU's handle, the instance id, the profile id (the driver's, as in
 * nvmlGpuInstanceProfileInfo_t), its placement (first memory slice, slices). */
typedef struct {
    nvmlDevice_t device;
    unsigned id, profile_id;
    nvml_placement placement;
} nvmlGpuInstanceInfo_t;

/* A live GPU instance handle (mig_lock held). */
static bool live_gi(const struct nvml_gi *gi)
{
    const char *p = (const char *)gi, *first = (const char *)gpu_instances;
    if (!gi || p < first || p >= first + sizeof gpu_instances ||
        (size_t)(p - first) % sizeof *gi != 0)
        return false;
    return gi->live;
}

/* A live compute instance handle (mig_lock held). */
static bool live_ci(const struct nvml_ci *ci)
{
    const char *p = (const char *)ci, *first = (const char *)gpu_instances;
    if (!ci || p < first || p >= first + sizeof gpu_instances)
        return false;
    size_t in_gi = (size_t)(p - first) % sizeof(struct nvml_gi);
    size_t offset = offsetof(struct nvml_gi, ci);
    if (in_gi < offset || (in_gi - offset) % sizeof *ci != 0 ||
        (in_gi - offset) / sizeof *ci >= MAX_CI_IDS)
        return false;
    return ci->live && ci->gi && ci->gi->live;
}

/* The GPU instance with id ID on the GPU DEVICE (the real call needs privileges; the fake's
 * does not). */
FG_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                                    struct nvml_gi **instance)
{
    nvmlReturn_t rc = check(device);
    if (rc || !instance)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    if (!in_mig_mode(device->index))
        return NVML_ERROR_NOT_SUPPORTED;
    if (id >= MAX_GI_IDS)
        return NVML_ERROR_NOT_FOUND;
    lock_mig();
    struct nvml_gi *gi = &gpu_instances[device->index][id];
    bool live = gi->live;
    unlock_mig();
    if (!live)
        return NVML_ERROR_NOT_FOUND;
    *instance = gi;
    return NVML_SUCCESS;
}

/* The GPU instances of the profile whose driver id is PROFILE_ID (nvmlGpuInstanceProfileInfo_t's
 * id, as NVML documents: 19 for 1g.10gb) on DEVICE, by id. */
FG_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profile_id,
                                                 struct nvml_gi **instances, unsigned int *count)
{
    nvmlReturn_t rc = check(device);
    if (rc || !count || !instances)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    if (!in_mig_mode(device->index))
        return NVML_ERROR_NOT_SUPPORTED;
    int p = gi_profile_by_id(profile_id);
    if (p < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0;
    lock_mig();
    for (int g = 0; g < MAX_GI_IDS; g++) {
        struct nvml_gi *gi = &gpu_instances[device->index][g];
        if (gi->live && gi->profile == p)
            instances[n++] = gi;
    }
    unlock_mig();
    *count = n;
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(struct nvml_gi *instance, nvmlGpuInstanceInfo_t *info)
{
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return NVML_ERROR_UNINITIALIZED;
    lock_mig();
    if (!info || !live_gi(instance)) {
        unlock_mig();
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    memset(info, 0, sizeof *info);
    info->device = &devices[instance->card];
    info->id = (unsigned)instance->id;
    info->profile_id = instance->profile >= 0 ? gi_profiles[instance->profile].id : 0;
    info->placement.start = (unsigned)instance->start;
    info->placement.size = instance->profile >= 0 ? gi_profiles[instance->profile].eighths : 0;
    unlock_mig();
    return NVML_SUCCESS;
}

/* Creates a GPU instance of the profile whose driver id is PROFILE_ID on DEVICE, at PLACEMENT
 * or (NULL) the first free one of the guide's, with no compute instance (as the driver does;
 * `nvidia-smi mig -cgi -C` adds them), named by profile_name. */
static nvmlReturn_t create_gpu_instance(nvmlDevice_t device, unsigned profile_id,
                                        const nvml_placement *placement, bool placed,
                                        struct nvml_gi **instance)
{
    nvmlReturn_t rc = check(device);
    if (rc || !instance || (placed && !placement))
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    if (!in_mig_mode(device->index))
        return NVML_ERROR_NOT_SUPPORTED;
    int p = gi_profile_by_id(profile_id);
    if (p < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    int starts[8], n = gi_starts(p, starts);
    if (placed) {
        bool valid = placement->size == gi_profiles[p].eighths;
        bool listed = false;
        for (int i = 0; i < n; i++)
            listed |= (unsigned)starts[i] == placement->start;
        if (!valid || !listed)
            return NVML_ERROR_INVALID_ARGUMENT;
        starts[0] = (int)placement->start;
        n = 1;
    }
    lock_mig();
    struct nvml_gi *card = gpu_instances[device->index];
    unsigned taken = 0;
    int compute = 0, media = 0;
    char name[32];
    profile_name(device->index, p, name, sizeof name);
    for (int g = 0; g < MAX_GI_IDS; g++)
        if (card[g].live && card[g].profile >= 0) {
            taken |= ((1u << gi_profiles[card[g].profile].eighths) - 1) << card[g].start;
            compute += (int)gi_profiles[card[g].profile].slices;
            media += (int)gi_profiles[card[g].profile].media;
        }
    struct nvml_gi *gi = NULL;
    if (compute + (int)gi_profiles[p].slices <= 7 && media + (int)gi_profiles[p].media <= 1)
        for (int i = 0; i < n && !gi; i++) {
            unsigned mask = ((1u << gi_profiles[p].eighths) - 1) << starts[i];
            if (!(taken & mask))
                gi = &card[gi_id_of((int)gi_profiles[p].eighths, starts[i])];
            if (gi) {
                memset(gi, 0, sizeof *gi);
                gi->live = true;
                gi->card = device->index;
                gi->id = gi_id_of((int)gi_profiles[p].eighths, starts[i]);
                gi->profile = p;
                gi->start = starts[i];
                gi->unit = -1;
                snprintf(gi->name, sizeof gi->name, "%s", name);
            }
        }
    unlock_mig();
    if (!gi)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    *instance = gi;
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profile_id,
                                                   struct nvml_gi **instance)
{
    return create_gpu_instance(device, profile_id, NULL, false, instance);
}

FG_EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device,
                                                                unsigned int profile_id,
                                                                const nvml_placement *placement,
                                                                struct nvml_gi **instance)
{
    return create_gpu_instance(device, profile_id, placement, true, instance);
}

/* The placements of the profile whose driver id is PROFILE_ID (the guide's, whatever is
 * placed now): their number, and with PLACEMENTS (large enough, as NVML asks) each one. Cards
 * out of MIG mode: not supported (the fakes do not model which cards could be in it). */
FG_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device,
                                                                     unsigned int profile_id,
                                                                     nvml_placement *placements,
                                                                     unsigned int *count)
{
    nvmlReturn_t rc = check(device);
    if (rc || !count)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    if (!in_mig_mode(device->index))
        return NVML_ERROR_NOT_SUPPORTED;
    int p = gi_profile_by_id(profile_id);
    if (p < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    int starts[8], n = gi_starts(p, starts);
    for (int i = 0; placements && i < n; i++)
        placements[i] = (nvml_placement){(unsigned)starts[i], gi_profiles[p].eighths};
    *count = (unsigned)n;
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(nvmlDevice_t device,
                                                                  unsigned int profile_id,
                                                                  nvml_placement *placements,
                                                                  unsigned int *count)
{
    return nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, profile_id, placements, count);
}

/* How many more GPU instances of the profile whose driver id is PROFILE_ID fit now: its free
 * placements (a profile's placements do not overlap one another), within the card's compute
 * slices left and, for +me, its one set of media extensions. */
FG_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device,
                                                                 unsigned int profile_id,
                                                                 unsigned int *count)
{
    nvmlReturn_t rc = check(device);
    if (rc || !count)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    if (!in_mig_mode(device->index))
        return NVML_ERROR_NOT_SUPPORTED;
    int p = gi_profile_by_id(profile_id);
    if (p < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    int starts[8], n = gi_starts(p, starts);
    unsigned taken = 0;
    int compute = 0, media = 0, free_placements = 0;
    lock_mig();
    const struct nvml_gi *card = gpu_instances[device->index];
    for (int g = 0; g < MAX_GI_IDS; g++)
        if (card[g].live && card[g].profile >= 0) {
            taken |= ((1u << gi_profiles[card[g].profile].eighths) - 1) << card[g].start;
            compute += (int)gi_profiles[card[g].profile].slices;
            media += (int)gi_profiles[card[g].profile].media;
        }
    unlock_mig();
    for (int i = 0; i < n; i++)
        free_placements += !(taken & (((1u << gi_profiles[p].eighths) - 1) << starts[i]));
    int fit = (7 - compute) / (int)gi_profiles[p].slices;
    if (gi_profiles[p].media)
        fit = fit < 1 - media ? fit : 1 - media;
    *count = (unsigned)(free_placements < fit ? free_placements : fit);
    return NVML_SUCCESS;
}

/* In use: memory held on its GPU instance by any process (the ledger knows memory per GPU
 * instance, not which compute instance a process runs on). */
static bool memory_in_use(const struct nvml_gi *gi)
{
    return gi->unit >= 0 && vramshim_fakegpu_unit_used(gi->unit) > 0;
}

/* Refused while a compute instance or memory use is on it (NVML_ERROR_IN_USE, as NVML
 * documents). */
FG_EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(struct nvml_gi *instance)
{
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return NVML_ERROR_UNINITIALIZED;
    lock_mig();
    nvmlReturn_t rc = NVML_SUCCESS;
    if (!live_gi(instance))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    else {
        for (int c = 0; c < MAX_CI_IDS; c++)
            if (instance->ci[c].live)
                rc = NVML_ERROR_IN_USE;
        if (!rc && memory_in_use(instance))
            rc = NVML_ERROR_IN_USE;
        if (!rc)
            instance->live = false;
    }
    unlock_mig();
    return rc;
}

/* nvmlComputeInstanceProfileInfo_t (v1), and _v2_t/_v3_t (a version first, a name of 96 bytes
 * last, v3 then capabilities): id, sliceCount, instanceCount, multiprocessorCount, the shared
 * engines (not modelled: 0). */
typedef struct {
    unsigned id, slices, instances, sms, copy_engines, decoders, encoders, jpegs, ofas;
} nvmlComputeInstanceProfileInfo_t;
typedef struct {
    unsigned version;
    nvmlComputeInstanceProfileInfo_t info;
    char name[96];
    unsigned capabilities;
} nvml_ci_profile_v3;
#define CI_PROFILE_V2 ((unsigned)(offsetof(nvml_ci_profile_v3, capabilities) | (2u << 24)))
#define CI_PROFILE_V3 ((unsigned)(sizeof(nvml_ci_profile_v3) | (3u << 24)))

/* Compute-instance profile PROFILE of GPU instance GI; its placements' count, or NVML's error:
 * an unknown profile or engine profile INVALID_ARGUMENT, one larger than the GPU instance
 * NOT_SUPPORTED, as NVML documents. */
static nvmlReturn_t ci_profile_info(struct nvml_gi *gi, unsigned profile, unsigned engine,
                                    nvmlComputeInstanceProfileInfo_t *info, char *name, size_t n)
{
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return NVML_ERROR_UNINITIALIZED;
    lock_mig();
    bool live = live_gi(gi);
    int gi_slices = live && gi->profile >= 0 ? (int)gi_profiles[gi->profile].slices : 0;
    char gi_name[32];
    snprintf(gi_name, sizeof gi_name, "%s", live ? gi->name : "");
    unlock_mig();
    if (!live || !info || engine != 0 || profile >= 9)
        return NVML_ERROR_INVALID_ARGUMENT; /* 9: NVML_COMPUTE_INSTANCE_PROFILE_COUNT */
    if (profile > 4 || ci_slices_of[profile] > gi_slices)
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned long long eighth;
    int slice_sms = 0, slices = ci_slices_of[profile], step = slices == 3 ? 4 : slices;
    vramshim_fakegpu_mig_slices(&eighth, &slice_sms);
    memset(info, 0, sizeof *info);
    info->id = profile;
    info->slices = (unsigned)slices;
    for (int start = 0; start + slices <= gi_slices; start += step)
        info->instances++;
    info->sms = (unsigned)(slices * slice_sms);
    if (name) {
        if (slices == gi_slices)
            snprintf(name, n, "MIG %s", gi_name);
        else
            snprintf(name, n, "MIG %dc.%s", slices, gi_name);
    }
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(
    struct nvml_gi *gi, unsigned int profile, unsigned int engine,
    nvmlComputeInstanceProfileInfo_t *info)
{
    return ci_profile_info(gi, profile, engine, info, NULL, 0);
}

/* The versioned one: v2 or v3 (a version of another size or number: INVALID_ARGUMENT, as NVML
 * documents for info->version). */
FG_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(struct nvml_gi *gi,
                                                                     unsigned int profile,
                                                                     unsigned int engine,
                                                                     nvml_ci_profile_v3 *info)
{
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return NVML_ERROR_UNINITIALIZED;
    if (!info || (info->version != CI_PROFILE_V2 && info->version != CI_PROFILE_V3))
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlComputeInstanceProfileInfo_t plain;
    char name[96];
    nvmlReturn_t rc = ci_profile_info(gi, profile, engine, &plain, name, sizeof name);
    if (rc)
        return rc;
    info->info = plain;
    memcpy(info->name, name, sizeof name);
    if (info->version == CI_PROFILE_V3)
        info->capabilities = 0;
    return NVML_SUCCESS;
}

/* Creates a compute instance of profile PROFILE_ID (its id is the profile's number) in GPU
 * instance GI, at PLACEMENT or (NULL) the first free one; its id the lowest free. */
static nvmlReturn_t create_compute_instance(struct nvml_gi *gi, unsigned profile_id,
                                            const nvml_placement *placement, bool placed,
                                            struct nvml_ci **instance)
{
    nvmlComputeInstanceProfileInfo_t info;
    nvmlReturn_t rc = ci_profile_info(gi, profile_id, 0, &info, NULL, 0);
    if (rc)
        return rc;
    if (!instance || (placed && !placement))
        return NVML_ERROR_INVALID_ARGUMENT;
    int slices = (int)info.slices, step = slices == 3 ? 4 : slices;
    lock_mig();
    if (!live_gi(gi)) {
        unlock_mig();
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    int gi_slices = (int)gi_profiles[gi->profile].slices;
    if (placed && (placement->size != (unsigned)slices || placement->start % (unsigned)step ||
                   placement->start + (unsigned)slices > (unsigned)gi_slices)) {
        unlock_mig();
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    unsigned taken = 0;
    int id = -1;
    for (int c = MAX_CI_IDS - 1; c >= 0; c--)
        if (gi->ci[c].live)
            taken |= ((1u << gi->ci[c].slices) - 1) << gi->ci[c].start;
        else
            id = c;
    int start = -1;
    for (int s = placed ? (int)placement->start : 0; s + slices <= gi_slices && start < 0;
         s += placed ? gi_slices : step)
        if (!(taken & (((1u << slices) - 1) << s)))
            start = s;
    struct nvml_ci *ci = NULL;
    if (start >= 0 && id >= 0 && next_uuid[gi->card] < 256) {
        ci = &gi->ci[id];
        memset(ci, 0, sizeof *ci);
        ci->live = true;
        ci->id = id;
        ci->slices = slices;
        ci->start = start;
        ci->uuid_index = next_uuid[gi->card]++;
        ci->gi = gi;
        ci->handle = (struct nvml_device){gi->card, 1, ci};
    }
    unlock_mig();
    if (!ci)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    *instance = ci;
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(struct nvml_gi *gi,
                                                            unsigned int profile_id,
                                                            struct nvml_ci **instance)
{
    return create_compute_instance(gi, profile_id, NULL, false, instance);
}

FG_EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstanceWithPlacement(
    struct nvml_gi *gi, unsigned int profile_id, const nvml_placement *placement,
    struct nvml_ci **instance)
{
    return create_compute_instance(gi, profile_id, placement, true, instance);
}

/* Refused while memory is in use on its GPU instance (NVML_ERROR_IN_USE): see memory_in_use. */
FG_EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(struct nvml_ci *instance)
{
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return NVML_ERROR_UNINITIALIZED;
    lock_mig();
    nvmlReturn_t rc = NVML_SUCCESS;
    if (!live_ci(instance))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (memory_in_use(instance->gi))
        rc = NVML_ERROR_IN_USE;
    else
        instance->live = false;
    unlock_mig();
    return rc;
}

/* The compute instances of profile PROFILE_ID in GPU instance GI, by id. */
FG_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(struct nvml_gi *gi,
                                                          unsigned int profile_id,
                                                          struct nvml_ci **instances,
                                                          unsigned int *count)
{
    nvmlComputeInstanceProfileInfo_t info;
    nvmlReturn_t rc = ci_profile_info(gi, profile_id, 0, &info, NULL, 0);
    if (rc)
        return rc;
    if (!instances || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0;
    lock_mig();
    for (int c = 0; live_gi(gi) && c < MAX_CI_IDS; c++)
        if (gi->ci[c].live && gi->ci[c].slices == (int)info.slices)
            instances[n++] = &gi->ci[c];
    unlock_mig();
    *count = n;
    return NVML_SUCCESS;
}

/* The placements of compute-instance profile PROFILE_ID within GPU instance GI (see
 * place_compute in the driver's config.c), and how many more of it fit now (its placements do
 * not overlap one another). */
FG_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    struct nvml_gi *gi, unsigned int profile_id, nvml_placement *placements, unsigned int *count)
{
    nvmlComputeInstanceProfileInfo_t info;
    nvmlReturn_t rc = ci_profile_info(gi, profile_id, 0, &info, NULL, 0);
    if (rc)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned step = info.slices == 3 ? 4 : info.slices;
    for (unsigned i = 0; placements && i < info.instances; i++)
        placements[i] = (nvml_placement){i * step, info.slices};
    *count = info.instances;
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(struct nvml_gi *gi,
                                                                          unsigned int profile_id,
                                                                          unsigned int *count)
{
    nvmlComputeInstanceProfileInfo_t info;
    nvmlReturn_t rc = ci_profile_info(gi, profile_id, 0, &info, NULL, 0);
    if (rc)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned step = info.slices == 3 ? 4 : info.slices, taken = 0, free_placements = 0;
    lock_mig();
    for (int c = 0; live_gi(gi) && c < MAX_CI_IDS; c++)
        if (gi->ci[c].live)
            taken |= ((1u << gi->ci[c].slices) - 1) << gi->ci[c].start;
    unlock_mig();
    for (unsigned i = 0; i < info.instances; i++)
        free_placements += !(taken & (((1u << info.slices) - 1) << (i * step)));
    *count = free_placements;
    return NVML_SUCCESS;
}

/* The compute instance with id ID in GPU instance GI. */
FG_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(struct nvml_gi *gi, unsigned int id,
                                                             struct nvml_ci **instance)
{
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return NVML_ERROR_UNINITIALIZED;
    lock_mig();
    bool live = live_gi(gi);
    bool found = live && id < MAX_CI_IDS && gi->ci[id].live;
    unlock_mig();
    if (!live || !instance)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!found)
        return NVML_ERROR_NOT_FOUND;
    *instance = &gi->ci[id];
    return NVML_SUCCESS;
}

/* nvmlComputeInstanceInfo_t: the GPU's handle, the GPU instance, the id, the profile id, the
 * placement within the GPU instance's compute slices. */
typedef struct {
    nvmlDevice_t device;
    struct nvml_gi *gpu_instance;
    unsigned id, profile_id;
    nvml_placement placement;
} nvmlComputeInstanceInfo_t;

FG_EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(struct nvml_ci *instance,
                                                     nvmlComputeInstanceInfo_t *info)
{
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return NVML_ERROR_UNINITIALIZED;
    lock_mig();
    if (!info || !live_ci(instance)) {
        unlock_mig();
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    memset(info, 0, sizeof *info);
    info->device = &devices[instance->gi->card];
    info->gpu_instance = instance->gi;
    info->id = (unsigned)instance->id;
    info->profile_id = (unsigned)ci_profile_of(instance->slices);
    info->placement.start = (unsigned)instance->start;
    info->placement.size = (unsigned)instance->slices;
    unlock_mig();
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(struct nvml_ci *instance,
                                                  nvmlComputeInstanceInfo_t *info)
{
    return nvmlComputeInstanceGetInfo_v2(instance, info);
}

/* nvmlDeviceAttributes_t: multiprocessorCount, the shared engines (copy, decoder, encoder,
 * JPEG, OFA: not modelled, 0), gpuInstanceSliceCount, computeInstanceSliceCount, memorySizeMB.
 * A MIG device handle's are its compute instance's (memory: its GPU instance's). */
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
    struct mig_view view = mig_view(device);
    memset(attributes, 0, sizeof *attributes);
    attributes->sms = (unsigned)view.sms;
    attributes->gpu_instance_slices = (unsigned)view.gi_slices;
    attributes->compute_instance_slices = (unsigned)view.ci_slices;
    attributes->memory_mb = view.total >> 20;
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
        struct mig_view view = mig_view(device);
        *total = view.total;
        *used = view.unit >= 0 ? vramshim_fakegpu_unit_used(view.unit) : 0;
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
    static __thread unsigned gpu_instance[MAX_LISTED], compute_instance[MAX_LISTED];
    nvmlReturn_t rc = check_any(device);
    if (rc || !count)
        return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    /* The memory units to list: the card's, or its GPU instances' (with their instance ids: a
     * MIG device handle's own compute instance, a GPU handle's first of each GPU instance). */
    int units[MAX_GI_IDS], ids[MAX_GI_IDS], ci_ids[MAX_GI_IDS], unit_count = 0;
    if (in_mig_mode(device->index)) {
        lock_mig();
        for (int g = 0; g < MAX_GI_IDS; g++) {
            struct nvml_gi *gi = &gpu_instances[device->index][g];
            if (!gi->live || gi->unit < 0 || (device->mig && device->ci->gi != gi))
                continue;
            int ci = device->mig ? device->ci->id : 0;
            for (int c = MAX_CI_IDS - 1; !device->mig && c >= 0; c--)
                if (gi->ci[c].live)
                    ci = c;
            units[unit_count] = gi->unit;
            ids[unit_count] = gi->id;
            ci_ids[unit_count++] = ci;
        }
        unlock_mig();
    } else {
        /* Out of MIG mode: the card's own memory unit. */
        units[unit_count] = -1;
        ids[unit_count] = -1;
        ci_ids[unit_count++] = -1;
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
        for (int i = 0; i < n; i++) {
            gpu_instance[listed + i] = (unsigned)ids[u];
            compute_instance[listed + i] = (unsigned)ci_ids[u];
        }
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
            ((unsigned *)(entry + 16))[0] = gpu_instance[i];
            ((unsigned *)(entry + 16))[1] = compute_instance[i];
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

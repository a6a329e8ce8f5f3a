/* Initialisation, devices and contexts. One primary context per device; contexts made with
 * cuCtxCreate are separate objects on the same device. The current context is per thread;
 * a thread with none uses nothing implicitly (like the real driver). */
#include "driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int initialized; /* atomic: 1 after a successful cuInit */
static __thread CUcontext current;
/* A small per-thread stack for cuCtxPushCurrent / cuCtxPopCurrent. */
static __thread CUcontext pushed[16];
static __thread int pushed_count;

bool fg_initialized(void) { return __atomic_load_n(&initialized, __ATOMIC_ACQUIRE); }

bool fg_valid_device(int dev) { return dev >= 0 && dev < fg_config()->count; }

CUcontext fg_current(void) { return current; }

CUresult fg_current_device(int *dev)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!current || current->destroyed)
        return CUDA_ERROR_INVALID_CONTEXT;
    *dev = current->device;
    return CUDA_SUCCESS;
}

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t *fg_init_lock(void) { return &init_lock; }

FG_EXPORT CUresult cuInit(unsigned int flags)
{
    if (fg_initialized()) {
        fg_python_exit_grace();
        return CUDA_SUCCESS;
    }
    const struct fg_config *config = fg_config();
    if (!config->valid)
        return CUDA_ERROR_INVALID_VALUE;
    if (config->count == 0)
        return CUDA_ERROR_NO_DEVICE; /* CUDA_VISIBLE_DEVICES left none, as the real driver says */
    pthread_mutex_lock(&init_lock);
    if (!fg_initialized()) {
        for (int d = 0; d < config->count; d++) {
            pthread_mutex_init(&fg_devices[d].lock, NULL);
            fg_devices[d].primary.device = d;
            fg_devices[d].primary.primary = true;
            fg_pools_init_device(d);
        }
        __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&init_lock);
    fg_python_exit_grace();
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDriverGetVersion(int *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = FG_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceGetCount(int *count)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = fg_config()->count;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fg_valid_device(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

static CUresult check_device(CUdevice dev)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    return fg_valid_device(dev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

FG_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CUresult rc = check_device(dev);
    if (rc)
        return rc;
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    fg_device_name(dev, name, (size_t)len);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CUresult rc = check_device(dev);
    if (rc)
        return rc;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = fg_device_capacity(dev);
    return CUDA_SUCCESS;
}

/* A UUID that differs per device and is stable: the machine's device behind the ordinal. In
 * MIG mode the _v2 call gives the MIG device's UUID, as CUDA documents; the first call (CUDA
 * 9.2's) keeps giving the GPU's. */
static CUresult device_uuid(CUuuid *uuid, CUdevice dev, bool mig)
{
    CUresult rc = check_device(dev);
    if (rc)
        return rc;
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    if (mig && fg_config()->mig_index[dev] >= 0)
        fg_mig_uuid(fg_config()->physical[dev], fg_config()->mig_index[dev],
                    (unsigned char *)uuid->bytes);
    else
        fg_physical_uuid(fg_config()->physical[dev], (unsigned char *)uuid->bytes);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) { return device_uuid(uuid, dev, true); }

FG_EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { return device_uuid(uuid, dev, false); }

FG_EXPORT CUresult cuDeviceGetLuid(char *luid, unsigned int *mask, CUdevice dev)
{
    return CUDA_ERROR_NOT_SUPPORTED; /* Windows only */
}

FG_EXPORT CUresult cuDeviceGetPCIBusId(char *bus_id, int len, CUdevice dev)
{
    CUresult rc = check_device(dev);
    if (rc)
        return rc;
    if (!bus_id || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(bus_id, (size_t)len, "00000000:%02X:00.0", 0x10 + fg_config()->physical[dev]);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *bus_id)
{
    unsigned domain, bus, device, function;
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!dev || !bus_id || sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &device, &function) != 4)
        return CUDA_ERROR_INVALID_VALUE;
    /* The bus id is the machine's device's; a device CUDA_VISIBLE_DEVICES hides is not found. */
    const struct fg_config *config = fg_config();
    for (int v = 0; domain == 0 && device == 0 && function == 0 && v < config->count; v++)
        if (config->physical[v] + 0x10 == (int)bus) {
            *dev = v;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_DEVICE;
}

/* Figures of a data-centre card (an H100's where they matter to libraries: launch limits,
 * shared memory); the configured SM count and compute capability. */
static int attribute_value(int attribute, CUdevice dev, int *value)
{
    const struct fg_config *c = fg_config();
    switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *value = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *value = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *value = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *value = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *value = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *value = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *value = 49152; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: *value = 65536; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *value = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: *value = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *value = 65536; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *value = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: *value = 512; break;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = fg_device_sms(dev); break;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: *value = 0; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *value = 0x10 + c->physical[dev]; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *value = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *value = 0; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *value = 2619000; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *value = 5120; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *value = 50331648; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *value = 2048; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *value = 3; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = c->cc_major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = c->cc_minor; break;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *value = 233472; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: *value = 65536; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD: *value = 0; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *value = 232448; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: *value = 32; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOL_SUPPORTED_HANDLE_TYPES: *value = 1; break;
    case 128: *value = c->fabric; break; /* CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED */
    default:
        if (attribute <= 0 || attribute > 160)
            return CUDA_ERROR_INVALID_VALUE;
        *value = 0; /* a capability this fake does not have */
    }
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev)
{
    CUresult rc = check_device(dev);
    if (rc)
        return rc;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    return attribute_value(attribute, dev, value);
}

FG_EXPORT CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    CUresult rc = check_device(dev);
    if (rc)
        return rc;
    if (!major || !minor)
        return CUDA_ERROR_INVALID_VALUE;
    *major = fg_config()->cc_major;
    *minor = fg_config()->cc_minor;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
    CUresult rc = check_device(dev);
    if (!rc)
        rc = check_device(peer);
    if (rc)
        return rc;
    if (!can)
        return CUDA_ERROR_INVALID_VALUE;
    *can = dev != peer;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceGetP2PAttribute(int *value, int attribute, CUdevice src, CUdevice dst)
{
    CUresult rc = check_device(src);
    if (!rc)
        rc = check_device(dst);
    if (rc)
        return rc;
    if (!value || src == dst)
        return CUDA_ERROR_INVALID_DEVICE;
    *value = attribute == 1 ? 0 : 1; /* performance rank 0; access, atomics, arrays supported */
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- primary contexts */
/* The first retain creates the primary context and charges VRAMSHIM_FAKEGPU_CONTEXT_BYTES;
 * the last release gives them back. */
FG_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    CUresult rc = check_device(dev);
    if (rc)
        return rc;
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    fg_python_exit_grace();
    struct fg_device *d = &fg_devices[dev];
    pthread_mutex_lock(&d->lock);
    if (d->primary_refs == 0 && !d->primary_charged) {
        if (!fg_device_reserve_unseen(dev, fg_config()->context_bytes)) {
            pthread_mutex_unlock(&d->lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        d->primary_charged = true;
    }
    d->primary_refs++;
    d->primary.destroyed = false;
    pthread_mutex_unlock(&d->lock);
    *ctx = &d->primary;
    return CUDA_SUCCESS;
}

static CUresult primary_release(CUdevice dev)
{
    CUresult rc = check_device(dev);
    if (rc)
        return rc;
    struct fg_device *d = &fg_devices[dev];
    pthread_mutex_lock(&d->lock);
    if (d->primary_refs == 0)
        rc = CUDA_ERROR_INVALID_CONTEXT;
    else if (--d->primary_refs == 0 && d->primary_charged) {
        fg_device_release(dev, fg_config()->context_bytes + d->loaded);
        d->primary_charged = false;
        d->loaded = 0;
        d->loaded_count = 0;
    }
    pthread_mutex_unlock(&d->lock);
    return rc;
}

FG_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return primary_release(dev); }

FG_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    CUresult rc = check_device(dev);
    if (rc)
        return rc;
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fg_devices[dev].lock);
    *flags = fg_devices[dev].primary.flags;
    *active = fg_devices[dev].primary_refs > 0;
    pthread_mutex_unlock(&fg_devices[dev].lock);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    CUresult rc = check_device(dev);
    if (rc)
        return rc;
    if (flags & ~(unsigned)CU_CTX_FLAGS_MASK)
        return CUDA_ERROR_INVALID_VALUE;
    fg_devices[dev].primary.flags = flags;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    return check_device(dev);
}

/* ---------------------------------------------------------------- current context */
FG_EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    *ctx = current;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx && ctx->destroyed)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    current = ctx;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (pushed_count == (int)(sizeof pushed / sizeof *pushed))
        return CUDA_ERROR_NOT_SUPPORTED;
    pushed[pushed_count++] = current;
    current = ctx;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *ctx)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx)
        *ctx = current;
    current = pushed_count ? pushed[--pushed_count] : NULL;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuCtxGetDevice(CUdevice *dev)
{
    int d;
    CUresult rc = fg_current_device(&d);
    if (rc)
        return rc;
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    *dev = d;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuCtxGetFlags(unsigned int *flags)
{
    int d;
    CUresult rc = fg_current_device(&d);
    if (rc)
        return rc;
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = current->flags;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = 3020;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuCtxSynchronize(void)
{
    int d;
    CUresult rc = fg_current_device(&d);
    if (rc)
        return rc;
    if ((rc = fg_capture_forbids()))
        return rc;
    fg_pools_sync();
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev)
{
    CUresult rc = check_device(dev);
    if (rc)
        return rc;
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->device = dev;
    c->flags = flags;
    *ctx = c;
    current = c;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    if (!fg_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx || ctx->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (current == ctx)
        current = NULL;
    /* Kept allocated (marked destroyed): handles to it may still be compared. */
    ctx->destroyed = true;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuCtxGetLimit(size_t *value, int limit)
{
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    static const size_t limits[] = {1024, 1 << 20, 8 << 20, 2, 2048, 64, 0};
    if (limit < 0 || limit >= (int)(sizeof limits / sizeof *limits))
        return CUDA_ERROR_NOT_SUPPORTED;
    *value = limits[limit];
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuCtxSetLimit(int limit, size_t value) { return CUDA_SUCCESS; }

FG_EXPORT CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    if (least)
        *least = 0;
    if (greatest)
        *greatest = -5;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
    int d;
    CUresult rc = fg_current_device(&d);
    if (rc)
        return rc;
    return peer && peer->device != d ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

FG_EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peer) { return CUDA_SUCCESS; }

/* ---------------------------------------------------------------- loaded kernel code */
CUresult fg_load_kernels(int dev, const char *name, unsigned long long bytes)
{
    if (!fg_valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    struct fg_device *d = &fg_devices[dev];
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&d->lock);
    bool loaded = false;
    for (int i = 0; i < d->loaded_count; i++)
        loaded |= strcmp(d->loaded_names[i], name) == 0;
    if (!loaded && bytes > 0) {
        if (!fg_device_reserve_unseen(dev, bytes))
            rc = CUDA_ERROR_OUT_OF_MEMORY; /* the real driver's lazy load fails the same way */
        else
            d->loaded += bytes;
    }
    if (!loaded && !rc && d->loaded_count < 8)
        snprintf(d->loaded_names[d->loaded_count++], sizeof d->loaded_names[0], "%s", name);
    pthread_mutex_unlock(&d->lock);
    return rc;
}

CUresult fg_kernel_launch(void)
{
    int dev;
    CUresult rc = fg_current_device(&dev);
    if (rc)
        return rc;
    return fg_load_kernels(dev, "", fg_config()->module_bytes);
}

/* For the fake runtime and libraries, which load kernels through the driver. Not NVIDIA
 * symbols. */
FG_EXPORT int vramshim_fakegpu_kernel_launch(void) { return fg_kernel_launch(); }
/* The runtime's launches: on STREAM, so that a capturing stream records them. */
FG_EXPORT CUresult vramshim_fakegpu_kernel_launch_on(CUstream stream)
{
    return fg_kernel_launch_on(stream);
}

FG_EXPORT int vramshim_fakegpu_load_kernels(int dev, const char *name, unsigned long long bytes)
{
    return fg_load_kernels(dev, name ? name : "", bytes);
}

/* A library's own kernels (LIBRARY "libcublas" or "libcudnn"), once per device: the calling
 * thread's current device is charged its VRAMSHIM_FAKEGPU_*_KERNEL_BYTES, as memory no hook
 * sees; CUDA_ERROR_OUT_OF_MEMORY when it does not fit. Not an NVIDIA symbol. */
FG_EXPORT int vramshim_fakegpu_load_library_kernels(const char *library)
{
    unsigned long long bytes;
    if (library && strcmp(library, "libcublas") == 0)
        bytes = fg_config()->cublas_kernel_bytes;
    else if (library && strcmp(library, "libcudnn") == 0)
        bytes = fg_config()->cudnn_kernel_bytes;
    else
        return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult rc = fg_current_device(&dev);
    return rc ? rc : fg_load_kernels(dev, library, bytes);
}

FG_EXPORT unsigned long long vramshim_fakegpu_nccl_bytes(void) { return fg_config()->nccl_bytes; }

FG_EXPORT int vramshim_fakegpu_fabric(void) { return fg_config()->fabric; }

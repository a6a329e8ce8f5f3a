/* What a program sees of the fake machine, on the fake runtime and NVML (fakegpu_libs.rs).
 * argv[1] "visible": the devices CUDA_VISIBLE_DEVICES leaves (count, each one's PCI bus id and
 * UUID), then 8 MiB allocated on device 0 and NVML's view of every device of the machine (the
 * bytes it says this process uses on each). argv[1] "module": the driver's used bytes before
 * any kernel, after the first launch and after a second one. argv[1] "cublas": the driver's
 * used bytes on device 0 before any cuBLAS handle, after a first and a second handle, then on
 * device 1 (when there is one) before and after a handle of its own. argv[1] "mig": what CUDA and
 * NVML say of MIG devices (the devices CUDA sees, their names, memory, SMs and UUIDs; NVML's
 * MIG mode, MIG device handles and their figures on every GPU). argv[1] "layout": the same for
 * a MIG layout of several MIG devices per card (each CUDA device's figures and 8 MiB on each;
 * every GPU's MIG devices by index with their GPU and compute instance ids and the processes
 * NVML lists on the GPU and on each MIG device, with their instance ids; the GPU-instance
 * profiles each GPU offers and the instances of each; each MIG device's attributes and its GPU
 * instance's info). argv[1] "hold": 100 MiB allocated on device 0, a line said, and the
 * process waits until its stdin closes (another process's use of a device). */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef int cudaError_t;
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int device);
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
cudaError_t cudaSetDevice(int device);
typedef struct {
    unsigned x, y, z;
} dim3;
cudaError_t cudaLaunchKernel(const void *f, dim3 grid, dim3 block, void **args, size_t shared,
                             void *stream);

typedef struct {
    unsigned long long total, free, used;
} nvml_memory;

static int visible(void)
{
    int count = -1;
    int rc = cudaGetDeviceCount(&count);
    printf("count=%d rc=%d\n", count, rc);
    for (int d = 0; d < count; d++) {
        char bus[32] = "";
        cudaDeviceGetPCIBusId(bus, sizeof bus, d);
        printf("device %d bus=%s\n", d, bus);
    }
    if (count > 0) {
        void *p;
        printf("malloc rc=%d\n", cudaMalloc(&p, 8 << 20));
    }
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    int (*init)(void) = nvml ? (int (*)(void))dlsym(nvml, "nvmlInit_v2") : NULL;
    int (*get_count)(unsigned *) = nvml ? (int (*)(unsigned *))dlsym(nvml, "nvmlDeviceGetCount_v2") : NULL;
    int (*by_index)(unsigned, void **) =
        nvml ? (int (*)(unsigned, void **))dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2") : NULL;
    int (*uuid)(void *, char *, unsigned) =
        nvml ? (int (*)(void *, char *, unsigned))dlsym(nvml, "nvmlDeviceGetUUID") : NULL;
    int (*memory)(void *, nvml_memory *) =
        nvml ? (int (*)(void *, nvml_memory *))dlsym(nvml, "nvmlDeviceGetMemoryInfo") : NULL;
    if (!init || !get_count || !by_index || !uuid || !memory) {
        printf("no nvml\n");
        return 1;
    }
    unsigned n = 0;
    int rc_init = init();
    int rc_count = get_count(&n);
    printf("nvml init=%d count=%u rc=%d\n", rc_init, n, rc_count);
    for (unsigned i = 0; i < n; i++) {
        void *device = NULL;
        char text[96] = "";
        nvml_memory m = {0};
        by_index(i, &device);
        uuid(device, text, sizeof text);
        memory(device, &m);
        printf("nvml %u %s used=%llu\n", i, text, m.used);
    }
    return 0;
}

static unsigned long long used(void)
{
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    return total - free;
}

static int module(void)
{
    dim3 one = {1, 1, 1};
    unsigned long long before = used();
    int first = cudaLaunchKernel((const void *)module, one, one, NULL, 0, NULL);
    unsigned long long after_first = used();
    int second = cudaLaunchKernel((const void *)module, one, one, NULL, 0, NULL);
    printf("before=%llu first rc=%d used=%llu second rc=%d used=%llu\n", before, first,
           after_first, second, used());
    return 0;
}

/* cuBLAS through dlopen, as NVML: the program links the runtime alone. */
static int cublas(void)
{
    char soname[32];
    snprintf(soname, sizeof soname, "libcublas.so.%d", CUDA_MAJOR);
    void *library = dlopen(soname, RTLD_NOW);
    int (*create)(void **) = library ? (int (*)(void **))dlsym(library, "cublasCreate_v2") : NULL;
    if (!create) {
        printf("no cublasCreate_v2 in %s\n", soname);
        return 1;
    }
    int count = 0;
    cudaGetDeviceCount(&count);
    for (int d = 0; d < count && d < 2; d++) {
        void *first = NULL, *second = NULL;
        cudaSetDevice(d);
        unsigned long long before = used();
        int first_rc = create(&first);
        unsigned long long after_first = used();
        int second_rc = create(&second);
        printf("device %d before=%llu first rc=%d used=%llu second rc=%d used=%llu\n", d, before,
               first_rc, after_first, second_rc, used());
    }
    return 0;
}

static void *nvml_function(void *nvml, const char *name)
{
    void *f = dlsym(nvml, name);
    if (!f) {
        printf("no %s\n", name);
        _exit(1);
    }
    return f;
}

static void uuid_text(const unsigned char *u, char *out, size_t n)
{
    snprintf(out, n, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
             u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
             u[14], u[15]);
}

static int mig(void)
{
    int count = -1;
    int rc = cudaGetDeviceCount(&count);
    printf("cuda count=%d rc=%d\n", count, rc);
    int (*name)(char *, int, int) = (int (*)(char *, int, int))dlsym(RTLD_DEFAULT, "cuDeviceGetName");
    int (*total)(size_t *, int) = (int (*)(size_t *, int))dlsym(RTLD_DEFAULT, "cuDeviceTotalMem_v2");
    int (*attribute)(int *, int, int) =
        (int (*)(int *, int, int))dlsym(RTLD_DEFAULT, "cuDeviceGetAttribute");
    int (*uuid2)(unsigned char *, int) =
        (int (*)(unsigned char *, int))dlsym(RTLD_DEFAULT, "cuDeviceGetUuid_v2");
    int (*uuid1)(unsigned char *, int) =
        (int (*)(unsigned char *, int))dlsym(RTLD_DEFAULT, "cuDeviceGetUuid");
    if (!name || !total || !attribute || !uuid2 || !uuid1) {
        printf("no driver\n");
        return 1;
    }
    for (int d = 0; d < count; d++) {
        char text[256] = "", bus[32] = "", v2[48], v1[48];
        size_t bytes = 0, free_bytes = 0, info_total = 0;
        int sms = 0;
        unsigned char u2[16] = {0}, u1[16] = {0};
        name(text, sizeof text, d);
        total(&bytes, d);
        attribute(&sms, 16, d); /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */
        uuid2(u2, d);
        uuid1(u1, d);
        uuid_text(u2, v2, sizeof v2);
        uuid_text(u1, v1, sizeof v1);
        cudaDeviceGetPCIBusId(bus, sizeof bus, d);
        cudaMemGetInfo(&free_bytes, &info_total);
        printf("cuda %d name=%s total=%zu sms=%d info-total=%zu bus=%s uuid_v2=%s uuid=%s\n", d,
               text, bytes, sms, info_total, bus, v2, v1);
    }
    if (count > 0) {
        void *p;
        printf("malloc rc=%d\n", cudaMalloc(&p, 8 << 20));
    }

    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!nvml) {
        printf("no nvml\n");
        return 1;
    }
    int (*init)(void) = nvml_function(nvml, "nvmlInit_v2");
    int (*get_count)(unsigned *) = nvml_function(nvml, "nvmlDeviceGetCount_v2");
    int (*by_index)(unsigned, void **) = nvml_function(nvml, "nvmlDeviceGetHandleByIndex_v2");
    int (*by_uuid)(const char *, void **) = nvml_function(nvml, "nvmlDeviceGetHandleByUUID");
    int (*get_name)(void *, char *, unsigned) = nvml_function(nvml, "nvmlDeviceGetName");
    int (*get_uuid)(void *, char *, unsigned) = nvml_function(nvml, "nvmlDeviceGetUUID");
    int (*memory)(void *, nvml_memory *) = nvml_function(nvml, "nvmlDeviceGetMemoryInfo");
    int (*mig_mode)(void *, unsigned *, unsigned *) = nvml_function(nvml, "nvmlDeviceGetMigMode");
    int (*max_mig)(void *, unsigned *) = nvml_function(nvml, "nvmlDeviceGetMaxMigDeviceCount");
    int (*mig_by_index)(void *, unsigned, void **) =
        nvml_function(nvml, "nvmlDeviceGetMigDeviceHandleByIndex");
    int (*parent_of)(void *, void **) =
        nvml_function(nvml, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
    int (*is_mig)(void *, unsigned *) = nvml_function(nvml, "nvmlDeviceIsMigDeviceHandle");
    unsigned n = 0;
    int rc_init = init();
    rc = get_count(&n);
    printf("nvml init=%d count=%u rc=%d\n", rc_init, n, rc);
    for (unsigned i = 0; i < n; i++) {
        void *gpu = NULL, *migd = NULL, *parent = NULL, *other = NULL, *found = NULL;
        char text[256] = "", uuid[96] = "";
        unsigned current = 9, pending = 9, max = 9, flag = 9;
        nvml_memory m = {0};
        by_index(i, &gpu);
        get_name(gpu, text, sizeof text);
        get_uuid(gpu, uuid, sizeof uuid);
        memory(gpu, &m);
        int mode_rc = mig_mode(gpu, &current, &pending);
        int max_rc = max_mig(gpu, &max);
        int flag_rc = is_mig(gpu, &flag);
        printf("nvml gpu %u name=%s uuid=%s total=%llu used=%llu mig=%u/%u rc=%d max=%u rc=%d "
               "is-mig=%u rc=%d\n",
               i, text, uuid, m.total, m.used, current, pending, mode_rc, max, max_rc, flag, flag_rc);
        rc = mig_by_index(gpu, 0, &migd);
        int second = mig_by_index(gpu, 1, &other);
        int past = mig_by_index(gpu, 7, &other);
        printf("nvml gpu %u mig-device 0 rc=%d 1 rc=%d 7 rc=%d\n", i, rc, second, past);
        if (rc)
            continue;
        memset(&m, 0, sizeof m);
        text[0] = uuid[0] = 0;
        flag = 9;
        get_name(migd, text, sizeof text);
        get_uuid(migd, uuid, sizeof uuid);
        memory(migd, &m);
        is_mig(migd, &flag);
        int parent_rc = parent_of(migd, &parent);
        int parent_of_gpu = parent_of(gpu, &other);
        int uuid_rc = by_uuid(uuid, &found);
        printf("nvml mig %u name=%s uuid=%s total=%llu used=%llu is-mig=%u parent rc=%d same=%d "
               "parent-of-gpu rc=%d by-uuid rc=%d same=%d\n",
               i, text, uuid, m.total, m.used, flag, parent_rc, parent == gpu, parent_of_gpu,
               uuid_rc, found == migd);
    }
    return 0;
}

/* nvmlProcessInfo_t (v2/v3): pid, usedGpuMemory, gpuInstanceId, computeInstanceId. */
typedef struct {
    unsigned pid;
    unsigned long long used;
    unsigned gpu_instance, compute_instance;
} nvml_process;

/* The processes NVML lists on HANDLE: "n=COUNT rc=RC [self|other:BYTES:GI:CI]...". */
static void print_processes(int (*list)(void *, unsigned *, nvml_process *), void *handle)
{
    nvml_process entries[16];
    unsigned n = 16;
    int rc = list(handle, &n, entries);
    printf(" processes n=%u rc=%d", n, rc);
    for (unsigned i = 0; !rc && i < n; i++)
        printf(" %s:%llu:%d:%d", entries[i].pid == (unsigned)getpid() ? "self" : "other",
               entries[i].used, (int)entries[i].gpu_instance, (int)entries[i].compute_instance);
}

/* nvmlGpuInstanceProfileInfo_t, nvmlGpuInstanceInfo_t, nvmlDeviceAttributes_t. */
typedef struct {
    unsigned id, p2p, slices, instances, sms, copy_engines, decoders, encoders, jpegs, ofas;
    unsigned long long memory_mb;
} nvml_gi_profile;
typedef struct {
    void *device;
    unsigned id, profile_id, start, size;
} nvml_gi_info;
typedef struct {
    unsigned sms, copy_engines, decoders, encoders, jpegs, ofas, gi_slices, ci_slices;
    unsigned long long memory_mb;
} nvml_attributes;

static int layout(void)
{
    int count = -1;
    int rc = cudaGetDeviceCount(&count);
    printf("cuda count=%d rc=%d\n", count, rc);
    int (*name)(char *, int, int) = (int (*)(char *, int, int))dlsym(RTLD_DEFAULT, "cuDeviceGetName");
    int (*total)(size_t *, int) = (int (*)(size_t *, int))dlsym(RTLD_DEFAULT, "cuDeviceTotalMem_v2");
    int (*attribute)(int *, int, int) =
        (int (*)(int *, int, int))dlsym(RTLD_DEFAULT, "cuDeviceGetAttribute");
    int (*uuid2)(unsigned char *, int) =
        (int (*)(unsigned char *, int))dlsym(RTLD_DEFAULT, "cuDeviceGetUuid_v2");
    if (!name || !total || !attribute || !uuid2) {
        printf("no driver\n");
        return 1;
    }
    for (int d = 0; d < count; d++) {
        char text[256] = "", v2[48];
        size_t bytes = 0, free_bytes = 0, info_total = 0;
        int sms = 0;
        unsigned char u2[16] = {0};
        name(text, sizeof text, d);
        total(&bytes, d);
        attribute(&sms, 16, d); /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */
        uuid2(u2, d);
        uuid_text(u2, v2, sizeof v2);
        cudaSetDevice(d);
        void *p;
        int malloc_rc = cudaMalloc(&p, 8 << 20);
        cudaMemGetInfo(&free_bytes, &info_total);
        printf("cuda %d name=%s total=%zu sms=%d uuid_v2=%s malloc rc=%d free=%zu\n", d, text,
               bytes, sms, v2, malloc_rc, free_bytes);
    }
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!nvml) {
        printf("no nvml\n");
        return 1;
    }
    int (*init)(void) = nvml_function(nvml, "nvmlInit_v2");
    int (*get_count)(unsigned *) = nvml_function(nvml, "nvmlDeviceGetCount_v2");
    int (*by_index)(unsigned, void **) = nvml_function(nvml, "nvmlDeviceGetHandleByIndex_v2");
    int (*by_uuid)(const char *, void **) = nvml_function(nvml, "nvmlDeviceGetHandleByUUID");
    int (*get_name)(void *, char *, unsigned) = nvml_function(nvml, "nvmlDeviceGetName");
    int (*get_uuid)(void *, char *, unsigned) = nvml_function(nvml, "nvmlDeviceGetUUID");
    int (*memory)(void *, nvml_memory *) = nvml_function(nvml, "nvmlDeviceGetMemoryInfo");
    int (*mig_mode)(void *, unsigned *, unsigned *) = nvml_function(nvml, "nvmlDeviceGetMigMode");
    int (*max_mig)(void *, unsigned *) = nvml_function(nvml, "nvmlDeviceGetMaxMigDeviceCount");
    int (*mig_by_index)(void *, unsigned, void **) =
        nvml_function(nvml, "nvmlDeviceGetMigDeviceHandleByIndex");
    int (*parent_of)(void *, void **) =
        nvml_function(nvml, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
    int (*gi_id)(void *, unsigned *) = nvml_function(nvml, "nvmlDeviceGetGpuInstanceId");
    int (*ci_id)(void *, unsigned *) = nvml_function(nvml, "nvmlDeviceGetComputeInstanceId");
    int (*list)(void *, unsigned *, nvml_process *) =
        nvml_function(nvml, "nvmlDeviceGetComputeRunningProcesses_v3");
    int (*profile_info)(void *, unsigned, nvml_gi_profile *) =
        nvml_function(nvml, "nvmlDeviceGetGpuInstanceProfileInfo");
    int (*instances_of)(void *, unsigned, void **, unsigned *) =
        nvml_function(nvml, "nvmlDeviceGetGpuInstances");
    int (*instance_by_id)(void *, unsigned, void **) =
        nvml_function(nvml, "nvmlDeviceGetGpuInstanceById");
    int (*instance_info)(void *, nvml_gi_info *) = nvml_function(nvml, "nvmlGpuInstanceGetInfo");
    int (*attributes)(void *, nvml_attributes *) = nvml_function(nvml, "nvmlDeviceGetAttributes_v2");
    unsigned n = 0;
    int rc_init = init();
    rc = get_count(&n);
    printf("nvml init=%d count=%u rc=%d\n", rc_init, n, rc);
    for (unsigned i = 0; i < n; i++) {
        void *gpu = NULL;
        char text[256] = "";
        unsigned current = 9, pending = 9, max = 9, id = 99;
        nvml_memory m = {0};
        by_index(i, &gpu);
        get_name(gpu, text, sizeof text);
        memory(gpu, &m);
        mig_mode(gpu, &current, &pending);
        max_mig(gpu, &max);
        int gi_rc = gi_id(gpu, &id);
        printf("nvml gpu %u name=%s total=%llu used=%llu mig=%u/%u max=%u gi rc=%d", i, text,
               m.total, m.used, current, pending, max, gi_rc);
        print_processes(list, gpu);
        printf("\n");
        /* NVML_GPU_INSTANCE_PROFILE_1_SLICE .. 7_SLICE, 1_SLICE_REV2, and 1_SLICE_REV1 (+me). */
        static const unsigned profiles[] = {0, 1, 2, 3, 4, 9, 7};
        printf("nvml gpu %u profiles", i);
        for (unsigned p = 0; p < sizeof profiles / sizeof *profiles; p++) {
            nvml_gi_profile info = {0};
            void *instances[8];
            unsigned existing = 8;
            int info_rc = profile_info(gpu, profiles[p], &info);
            /* Listed by the driver's profile id (info.id), as NVML documents. */
            int list_rc = instances_of(gpu, info_rc ? profiles[p] : info.id, instances, &existing);
            if (info_rc || list_rc)
                printf(" %u:%d:%d", profiles[p], info_rc, list_rc);
            else
                printf(" %u:id=%u,slices=%u,count=%u,sms=%u,mb=%llu,now=%u", profiles[p], info.id,
                       info.slices, info.instances, info.sms, info.memory_mb, existing);
        }
        printf("\n");
        for (unsigned k = 0; k < (max ? max + 1 : 1); k++) {
            void *migd = NULL, *parent = NULL, *found = NULL;
            rc = mig_by_index(gpu, k, &migd);
            if (rc) {
                printf("nvml gpu %u mig %u rc=%d\n", i, k, rc);
                continue;
            }
            char uuid[96] = "";
            unsigned gi = 99, ci = 99;
            text[0] = 0;
            memset(&m, 0, sizeof m);
            get_name(migd, text, sizeof text);
            get_uuid(migd, uuid, sizeof uuid);
            memory(migd, &m);
            int rc_gi = gi_id(migd, &gi), rc_ci = ci_id(migd, &ci);
            parent_of(migd, &parent);
            by_uuid(uuid, &found);
            printf("nvml gpu %u mig %u name=%s uuid=%s total=%llu used=%llu gi=%u rc=%d ci=%u "
                   "rc=%d parent=%d by-uuid=%d",
                   i, k, text, uuid, m.total, m.used, gi, rc_gi, ci, rc_ci, parent == gpu,
                   found == migd);
            print_processes(list, migd);
            printf("\n");
            nvml_attributes a = {0};
            nvml_gi_info gi_info = {0};
            void *instance = NULL;
            int attributes_rc = attributes(migd, &a);
            int by_id_rc = instance_by_id(gpu, gi, &instance);
            int info_rc = by_id_rc ? -1 : instance_info(instance, &gi_info);
            printf("nvml gpu %u mig %u attributes rc=%d sms=%u slices=%u/%u mb=%llu instance rc=%d "
                   "info rc=%d id=%u profile=%u placement=%u+%u same=%d\n",
                   i, k, attributes_rc, a.sms, a.gi_slices, a.ci_slices, a.memory_mb, by_id_rc,
                   info_rc, gi_info.id, gi_info.profile_id, gi_info.start, gi_info.size,
                   gi_info.device == gpu);
        }
    }
    return 0;
}

static int hold(void)
{
    void *p;
    printf("held rc=%d\n", cudaMalloc(&p, 100 << 20));
    fflush(stdout);
    char byte;
    while (read(0, &byte, 1) > 0)
        ;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "visible"))
        return visible();
    if (argc == 2 && !strcmp(argv[1], "module"))
        return module();
    if (argc == 2 && !strcmp(argv[1], "cublas"))
        return cublas();
    if (argc == 2 && !strcmp(argv[1], "mig"))
        return mig();
    if (argc == 2 && !strcmp(argv[1], "layout"))
        return layout();
    if (argc == 2 && !strcmp(argv[1], "hold"))
        return hold();
    fprintf(stderr, "usage: devices visible|module|cublas|mig|layout|hold\n");
    return 2;
}

/* MIG compute instances and NVML's instance management on the fakes (fakegpu_libs.rs).
 * argv[1] "show": the CUDA device this process sees (name, bytes, SMs, MIG UUID, free bytes
 * before and after 8 MiB of its own), then NVML's MIG devices of every GPU (name, UUID, GPU
 * and compute instance ids, memory, attributes) and the GPU used bytes.
 * argv[1] "hold": 100 MiB allocated on device 0, a line said, and the process waits until its
 * stdin closes. argv[1] "manage": NVML's create/destroy calls on card 0 with their return codes,
 * the placements and remaining capacity of the profiles, and the MIG devices after each step;
 * card 1 (out of MIG mode) refuses. argv[1] "busy": the
 * destroy calls on card 0's GPU instance 1 while memory is in use on it. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef int cudaError_t;
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);

/* NVML through dlsym, unprototyped (the arguments are pointers and unsigned ints). */
typedef int (*nvml_fn)();
static void *nvml;
static nvml_fn f(const char *name)
{
    nvml_fn found = (nvml_fn)dlsym(nvml, name);
    if (!found) {
        printf("no %s\n", name);
        _exit(1);
    }
    return found;
}

typedef struct {
    unsigned long long total, free, used;
} nvml_memory;
typedef struct {
    unsigned sms, copy_engines, decoders, encoders, jpegs, ofas, gi_slices, ci_slices;
    unsigned long long memory_mb;
} nvml_attributes;
typedef struct {
    unsigned start, size;
} nvml_placement;
typedef struct {
    void *device;
    unsigned id, profile_id;
    nvml_placement placement;
} nvml_gi_info;
typedef struct {
    void *device, *gpu_instance;
    unsigned id, profile_id;
    nvml_placement placement;
} nvml_ci_info;
typedef struct {
    unsigned id, slices, instances, sms, copy_engines, decoders, encoders, jpegs, ofas;
} nvml_ci_profile;
typedef struct {
    unsigned version;
    nvml_ci_profile info;
    char name[96];
} nvml_ci_profile_v2;
typedef struct {
    unsigned id, p2p, slices, instances, sms, copy_engines, decoders, encoders, jpegs, ofas;
    unsigned long long memory_mb;
} nvml_gi_profile;

static void uuid_text(const unsigned char *u, char *out, size_t n)
{
    snprintf(out, n, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
             u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
             u[14], u[15]);
}

/* Every MIG device of GPU handle GPU (index I): one line each. */
static void mig_devices(unsigned i, void *gpu)
{
    for (unsigned k = 0; k < 8; k++) {
        void *mig = NULL;
        int rc = f("nvmlDeviceGetMigDeviceHandleByIndex")(gpu, k, &mig);
        if (rc) {
            printf("gpu %u mig %u rc=%d\n", i, k, rc);
            break;
        }
        char name[128] = "", uuid[96] = "";
        unsigned gi = 99, ci = 99;
        nvml_memory m = {0};
        nvml_attributes a = {0};
        f("nvmlDeviceGetName")(mig, name, sizeof name);
        f("nvmlDeviceGetUUID")(mig, uuid, sizeof uuid);
        f("nvmlDeviceGetGpuInstanceId")(mig, &gi);
        f("nvmlDeviceGetComputeInstanceId")(mig, &ci);
        f("nvmlDeviceGetMemoryInfo")(mig, &m);
        int a_rc = f("nvmlDeviceGetAttributes_v2")(mig, &a);
        printf("gpu %u mig %u name=%s uuid=%s gi=%u ci=%u total=%llu used=%llu attributes rc=%d "
               "sms=%u slices=%u/%u mb=%llu\n",
               i, k, name, uuid, gi, ci, m.total, m.used, a_rc, a.sms, a.gi_slices, a.ci_slices,
               a.memory_mb);
    }
}

static int show(void)
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
    if (count > 0) {
        char text[256] = "", v2[48];
        size_t bytes = 0, before = 0, after = 0, info_total = 0;
        int sms = 0;
        unsigned char u2[16] = {0};
        name(text, sizeof text, 0);
        total(&bytes, 0);
        attribute(&sms, 16, 0); /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */
        uuid2(u2, 0);
        uuid_text(u2, v2, sizeof v2);
        cudaMemGetInfo(&before, &info_total);
        void *p;
        int malloc_rc = cudaMalloc(&p, 8 << 20);
        cudaMemGetInfo(&after, &info_total);
        printf("cuda 0 name=%s total=%zu sms=%d uuid=MIG-%s free=%zu malloc rc=%d free=%zu "
               "info-total=%zu\n",
               text, bytes, sms, v2, before, malloc_rc, after, info_total);
    }
    nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!nvml) {
        printf("no nvml\n");
        return 1;
    }
    unsigned n = 0;
    int init_rc = f("nvmlInit_v2")();
    f("nvmlDeviceGetCount_v2")(&n);
    printf("nvml init=%d count=%u\n", init_rc, n);
    for (unsigned i = 0; i < n; i++) {
        void *gpu = NULL;
        nvml_memory m = {0};
        f("nvmlDeviceGetHandleByIndex_v2")(i, &gpu);
        f("nvmlDeviceGetMemoryInfo")(gpu, &m);
        printf("gpu %u total=%llu used=%llu\n", i, m.total, m.used);
        mig_devices(i, gpu);
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

/* A GPU instance's info and its compute instances of each compute-instance profile. */
static void gpu_instance(const char *what, void *gpu, void *gi)
{
    nvml_gi_info info = {0};
    int rc = f("nvmlGpuInstanceGetInfo")(gi, &info);
    printf("%s info rc=%d id=%u profile=%u placement=%u+%u same=%d cis", what, rc, info.id,
           info.profile_id, info.placement.start, info.placement.size, info.device == gpu);
    for (unsigned p = 0; p < 5; p++) {
        void *cis[8];
        unsigned n = 99;
        rc = f("nvmlGpuInstanceGetComputeInstances")(gi, p, cis, &n);
        if (rc) {
            printf(" %u:rc=%d", p, rc);
            continue;
        }
        printf(" %u:", p);
        for (unsigned c = 0; c < n; c++) {
            nvml_ci_info ci = {0};
            int ci_rc = f("nvmlComputeInstanceGetInfo_v2")(cis[c], &ci);
            printf("%s[rc=%d id=%u profile=%u at=%u+%u same=%d]", c ? "," : "", ci_rc, ci.id,
                   ci.profile_id, ci.placement.start, ci.placement.size,
                   ci.device == gpu && ci.gpu_instance == gi);
        }
    }
    printf("\n");
}

/* The placements and remaining capacity of GPU-instance profiles (driver ids) on GPU. */
static void capacity(void *gpu)
{
    static const unsigned ids[] = {19, 20, 15, 14, 9, 5, 0};
    printf("capacity");
    for (unsigned i = 0; i < sizeof ids / sizeof *ids; i++) {
        nvml_placement at[8];
        unsigned n = 0, left = 99;
        int rc = f("nvmlDeviceGetGpuInstancePossiblePlacements_v2")(gpu, ids[i], at, &n);
        int left_rc = f("nvmlDeviceGetGpuInstanceRemainingCapacity")(gpu, ids[i], &left);
        printf(" %u:rc=%d,left=%u(rc=%d),at=", ids[i], rc, left, left_rc);
        for (unsigned k = 0; k < n; k++)
            printf("%s%u+%u", k ? "/" : "", at[k].start, at[k].size);
    }
    printf("\n");
}

/* The same for compute-instance profiles 0 - 4 of GPU instance GI. */
static void ci_capacity(const char *what, void *gi)
{
    printf("%s ci capacity", what);
    for (unsigned p = 0; p < 5; p++) {
        nvml_placement at[8];
        unsigned n = 0, left = 99;
        int rc = f("nvmlGpuInstanceGetComputeInstancePossiblePlacements")(gi, p, at, &n);
        int left_rc = f("nvmlGpuInstanceGetComputeInstanceRemainingCapacity")(gi, p, &left);
        if (rc) {
            printf(" %u:rc=%d", p, rc);
            continue;
        }
        printf(" %u:left=%u(rc=%d),at=", p, left, left_rc);
        for (unsigned k = 0; k < n; k++)
            printf("%s%u+%u", k ? "/" : "", at[k].start, at[k].size);
    }
    printf("\n");
}

static int manage(void)
{
    nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!nvml) {
        printf("no nvml\n");
        return 1;
    }
    void *gpu = NULL, *other = NULL, *gi = NULL, *gi1 = NULL, *gi13 = NULL, *created = NULL;
    void *ci = NULL, *cis[8];
    unsigned n = 0;
    printf("before init create rc=%d\n", f("nvmlDeviceCreateGpuInstance")(gpu, 9u, &gi));
    f("nvmlInit_v2")();
    f("nvmlDeviceGetHandleByIndex_v2")(0u, &gpu);
    f("nvmlDeviceGetHandleByIndex_v2")(1u, &other);

    /* The +me profile (NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 7) and the layout's instance. */
    nvml_gi_profile profile = {0};
    int rc = f("nvmlDeviceGetGpuInstanceProfileInfo")(gpu, 7u, &profile);
    printf("+me profile rc=%d id=%u slices=%u instances=%u sms=%u mb=%llu", rc, profile.id,
           profile.slices, profile.instances, profile.sms, profile.memory_mb);
    rc = f("nvmlDeviceGetGpuInstances")(gpu, profile.id, cis, &n);
    printf(" instances rc=%d n=%u\n", rc, n);
    /* The versioned query: v2 (a name after v1's fields), v3 (no P2P field, capabilities). */
    struct {
        unsigned version, id, p2p, slices, instances, sms, engines[5];
        unsigned long long memory_mb;
        char name[96];
    } gi_v2 = {0};
    struct {
        unsigned version, id, slices, instances, sms, engines[5];
        unsigned long long memory_mb;
        char name[96];
        unsigned capabilities;
    } gi_v3 = {0};
    gi_v2.version = (unsigned)sizeof gi_v2 | 2u << 24;
    rc = f("nvmlDeviceGetGpuInstanceProfileInfoV")(gpu, 7u, &gi_v2);
    printf("profile v2 7 rc=%d id=%u slices=%u instances=%u sms=%u mb=%llu name=%s", rc, gi_v2.id,
           gi_v2.slices, gi_v2.instances, gi_v2.sms, gi_v2.memory_mb, gi_v2.name);
    gi_v3.version = (unsigned)sizeof gi_v3 | 3u << 24;
    rc = f("nvmlDeviceGetGpuInstanceProfileInfoV")(gpu, 4u, &gi_v3);
    printf(" v3 4 rc=%d id=%u slices=%u instances=%u sms=%u mb=%llu name=%s", rc, gi_v3.id,
           gi_v3.slices, gi_v3.instances, gi_v3.sms, gi_v3.memory_mb, gi_v3.name);
    gi_v3.version = 3u << 24;
    printf(" bad-version rc=%d\n", f("nvmlDeviceGetGpuInstanceProfileInfoV")(gpu, 4u, &gi_v3));
    f("nvmlDeviceGetGpuInstanceById")(gpu, 13u, &gi13);
    gpu_instance("gi 13", gpu, gi13);
    f("nvmlDeviceGetGpuInstanceById")(gpu, 1u, &gi1);
    gpu_instance("gi 1", gpu, gi1);
    capacity(gpu);
    ci_capacity("gi 1", gi1);

    /* Compute-instance profiles of the 3g instance. */
    printf("ci profiles");
    for (unsigned p = 0; p < 6; p++) {
        nvml_ci_profile info = {0};
        rc = f("nvmlGpuInstanceGetComputeInstanceProfileInfo")(gi1, p, 0u, &info);
        printf(" %u:rc=%d", p, rc);
        if (!rc)
            printf(",id=%u,slices=%u,instances=%u,sms=%u", info.id, info.slices, info.instances,
                   info.sms);
    }
    nvml_ci_profile info = {0};
    printf(" 9:rc=%d engine1:rc=%d",
           f("nvmlGpuInstanceGetComputeInstanceProfileInfo")(gi1, 9u, 0u, &info),
           f("nvmlGpuInstanceGetComputeInstanceProfileInfo")(gi1, 0u, 1u, &info));
    nvml_ci_profile_v2 v2 = {0};
    v2.version = (unsigned)sizeof v2 | 2u << 24;
    rc = f("nvmlGpuInstanceGetComputeInstanceProfileInfoV")(gi1, 0u, 0u, &v2);
    printf(" v2:rc=%d,name=%s,sms=%u", rc, v2.name, v2.info.sms);
    v2.version = 2u << 24;
    printf(" bad-version:rc=%d\n", f("nvmlGpuInstanceGetComputeInstanceProfileInfoV")(gi1, 0u, 0u, &v2));

    /* The 3g instance is full (2c and 1c) and in use by its compute instances. */
    printf("full: create 1c rc=%d destroy gi rc=%d\n",
           f("nvmlGpuInstanceCreateComputeInstance")(gi1, 0u, &ci),
           f("nvmlGpuInstanceDestroy")(gi1));
    void *one = NULL, *two = NULL;
    f("nvmlGpuInstanceGetComputeInstances")(gi1, 0u, &one, &n);
    f("nvmlGpuInstanceGetComputeInstances")(gi1, 1u, &two, &n);
    printf("destroy 1c rc=%d", f("nvmlComputeInstanceDestroy")(one));
    printf(" again rc=%d", f("nvmlComputeInstanceDestroy")(one));
    printf(" 2c rc=%d", f("nvmlComputeInstanceDestroy")(two));
    printf(" gi rc=%d", f("nvmlGpuInstanceDestroy")(gi1));
    printf(" again rc=%d", f("nvmlGpuInstanceDestroy")(gi1));
    printf(" by id rc=%d\n", f("nvmlDeviceGetGpuInstanceById")(gpu, 1u, &gi));
    mig_devices(0, gpu);
    capacity(gpu);

    /* Creating GPU instances: +me (one a card), placements, then a 3g where the old one was. */
    nvml_placement at4 = {4, 4}, at2 = {2, 4}, size2 = {0, 2};
    printf("create +me rc=%d 3g at 4 rc=%d at 2 rc=%d size 2 rc=%d profile 6 rc=%d",
           f("nvmlDeviceCreateGpuInstance")(gpu, 20u, &gi),
           f("nvmlDeviceCreateGpuInstanceWithPlacement")(gpu, 9u, &at4, &gi),
           f("nvmlDeviceCreateGpuInstanceWithPlacement")(gpu, 9u, &at2, &gi),
           f("nvmlDeviceCreateGpuInstanceWithPlacement")(gpu, 9u, &size2, &gi),
           f("nvmlDeviceCreateGpuInstance")(gpu, 6u, &gi));
    rc = f("nvmlDeviceCreateGpuInstance")(gpu, 9u, &created);
    printf(" 3g rc=%d", rc);
    printf(" another rc=%d\n", f("nvmlDeviceCreateGpuInstance")(gpu, 9u, &gi));
    gpu_instance("created", gpu, created);
    mig_devices(0, gpu);

    /* Compute instances in it: placements, then the first free. */
    nvml_placement c1 = {1, 2}, c2 = {2, 2}, c0 = {0, 2}, c_two = {2, 1};
    rc = f("nvmlGpuInstanceCreateComputeInstance")(created, 0u, &ci);
    printf("create 1c rc=%d 2c at 1 rc=%d at 2 rc=%d at 0 rc=%d 2c rc=%d", rc,
           f("nvmlGpuInstanceCreateComputeInstanceWithPlacement")(created, 1u, &c1, &gi),
           f("nvmlGpuInstanceCreateComputeInstanceWithPlacement")(created, 1u, &c2, &gi),
           f("nvmlGpuInstanceCreateComputeInstanceWithPlacement")(created, 1u, &c0, &gi),
           f("nvmlGpuInstanceCreateComputeInstance")(created, 1u, &gi));
    printf(" 1c at 2 rc=%d", f("nvmlGpuInstanceCreateComputeInstanceWithPlacement")(created, 0u,
                                                                                    &c_two, &gi));
    printf(" 3c rc=%d 4c rc=%d\n", f("nvmlGpuInstanceCreateComputeInstance")(created, 2u, &gi),
           f("nvmlGpuInstanceCreateComputeInstance")(created, 3u, &gi));
    gpu_instance("created", gpu, created);
    ci_capacity("created", created);
    void *by_id = NULL;
    nvml_ci_info by_id_info = {0};
    rc = f("nvmlGpuInstanceGetComputeInstanceById")(created, 1u, &by_id);
    f("nvmlComputeInstanceGetInfo_v2")(by_id, &by_id_info);
    printf("ci by id 1 rc=%d id=%u at=%u+%u", rc, by_id_info.id, by_id_info.placement.start,
           by_id_info.placement.size);
    printf(" 5 rc=%d\n", f("nvmlGpuInstanceGetComputeInstanceById")(created, 5u, &gi));
    mig_devices(0, gpu);
    printf("destroy gi rc=%d\n", f("nvmlGpuInstanceDestroy")(created));

    /* A card out of MIG mode. */
    printf("card 1: create rc=%d profile rc=%d by id rc=%d\n",
           f("nvmlDeviceCreateGpuInstance")(other, 9u, &gi),
           f("nvmlDeviceGetGpuInstanceProfileInfo")(other, 2u, &profile),
           f("nvmlDeviceGetGpuInstanceById")(other, 0u, &gi));
    return 0;
}

/* With memory in use on card 0's GPU instance 1 (another process's, through the ledger): its
 * 1c compute instance and the instance itself refuse to go. */
static int busy(void)
{
    nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!nvml) {
        printf("no nvml\n");
        return 1;
    }
    void *gpu = NULL, *gi1 = NULL, *one = NULL;
    unsigned n = 0;
    f("nvmlInit_v2")();
    f("nvmlDeviceGetHandleByIndex_v2")(0u, &gpu);
    f("nvmlDeviceGetGpuInstanceById")(gpu, 1u, &gi1);
    f("nvmlGpuInstanceGetComputeInstances")(gi1, 0u, &one, &n);
    printf("busy: destroy 1c rc=%d gi rc=%d\n", f("nvmlComputeInstanceDestroy")(one),
           f("nvmlGpuInstanceDestroy")(gi1));
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "busy"))
        return busy();
    if (argc == 2 && !strcmp(argv[1], "show"))
        return show();
    if (argc == 2 && !strcmp(argv[1], "hold"))
        return hold();
    if (argc == 2 && !strcmp(argv[1], "manage"))
        return manage();
    fprintf(stderr, "usage: mig_instances show|hold|manage|busy\n");
    return 2;
}

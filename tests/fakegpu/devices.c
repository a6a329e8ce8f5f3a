/* What a program sees of the fake machine, on the fake runtime and NVML (fakegpu_libs.rs).
 * argv[1] "visible": the devices CUDA_VISIBLE_DEVICES leaves (count, each one's PCI bus id and
 * UUID), then 8 MiB allocated on device 0 and NVML's view of every device of the machine (the
 * bytes it says this process uses on each). argv[1] "module": the driver's used bytes before
 * any kernel, after the first launch and after a second one. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int cudaError_t;
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int device);
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
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

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "visible"))
        return visible();
    if (argc == 2 && !strcmp(argv[1], "module"))
        return module();
    fprintf(stderr, "usage: devices visible|module\n");
    return 2;
}

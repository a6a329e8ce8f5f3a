/* Copies more device data than VRAMSHIM_FAKEGPU_HOST_BYTES allows (the test sets 48 MiB) on
 * the fake runtime, in 16 MiB copies: what each reads back ("data" or "zeros"), and how much
 * the process's peak resident set grew past its baseline (VmHWM - VmRSS, both host buffers
 * already touched). One line per step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int cudaError_t;
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind);
cudaError_t cudaMemset(void *p, int value, size_t n);
#define H2D 1
#define D2H 2
#define MIB (1ul << 20)
#define CHUNK (16 * MIB)

static unsigned char *source, *back;

/* A field of /proc/self/status in KiB. */
static long status_kib(const char *field)
{
    char line[256];
    long value = -1;
    size_t len = strlen(field);
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, len) && line[len] == ':')
            value = strtol(line + len + 1, NULL, 10);
    fclose(f);
    return value;
}

/* What DEVICE holds: "data" (the source's bytes), "zeros", or "other". */
static const char *read_back(void *device)
{
    int rc = cudaMemcpy(back, device, CHUNK, D2H);
    if (rc)
        return "error";
    if (!memcmp(back, source, CHUNK))
        return "data";
    for (size_t i = 0; i < CHUNK; i++)
        if (back[i])
            return "other";
    return "zeros";
}

static void copy_in(const char *step, void *device)
{
    int rc = cudaMemcpy(device, source, CHUNK, H2D);
    printf("%s rc=%d %s\n", step, rc, read_back(device));
}

int main(void)
{
    void *big, *small[2];
    source = malloc(CHUNK);
    back = malloc(CHUNK);
    if (!source || !back)
        return 1;
    for (size_t i = 0; i < CHUNK; i++)
        source[i] = (unsigned char)(i * 7 + 1);
    memset(back, 0, CHUNK);
    /* 96 MiB: larger than the mappings the fake keeps for reuse, so its free gives its pages
     * back. */
    if (cudaMalloc(&big, 6 * CHUNK) || cudaMalloc(&small[0], CHUNK) || cudaMalloc(&small[1], CHUNK))
        return 2;
    long baseline = status_kib("VmRSS");
    copy_in("big0", big);
    copy_in("big1", (char *)big + CHUNK);
    copy_in("big2", (char *)big + 2 * CHUNK);
    copy_in("small0", small[0]);               /* past the bound: dropped */
    copy_in("big0-again", big);                /* its pages are counted already */
    printf("memset rc=%d\n", cudaMemset(small[1], 0x5a, CHUNK)); /* past it too */
    printf("small1 %s\n", read_back(small[1]));
    printf("free rc=%d\n", cudaFree(big));     /* 48 MiB given back */
    copy_in("small0-after-free", small[0]);
    long growth = status_kib("VmHWM") - baseline;
    printf("growth_mib=%ld\n", growth < 0 ? -1 : growth / 1024);
    return 0;
}

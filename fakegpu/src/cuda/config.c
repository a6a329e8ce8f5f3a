/* The simulated machine, from the environment (all optional):
 *   VRAMSHIM_FAKEGPU_COUNT          devices the machine has (1..64, default 1)
 *   VRAMSHIM_FAKEGPU_MEMORY         bytes per device, a plain integer (default 80 GiB)
 *   VRAMSHIM_FAKEGPU_NAME           device name (default "NVIDIA H100 80GB HBM3")
 *   VRAMSHIM_FAKEGPU_CC             compute capability "MAJOR.MINOR" (default "9.0")
 *   VRAMSHIM_FAKEGPU_SMS            multiprocessors (default 132)
 *   VRAMSHIM_FAKEGPU_CONTEXT_BYTES  device memory a primary context takes (default 0)
 *   VRAMSHIM_FAKEGPU_MODULE_BYTES   device memory the first kernel launch on a device takes
 *                                   (CUDA loads modules lazily; default 0)
 *   VRAMSHIM_FAKEGPU_NCCL_BYTES     device memory an NCCL rank takes for itself (default 0;
 *                                   see fakegpu/src/nccl/nccl.c)
 *   VRAMSHIM_FAKEGPU_FABRIC         1: NVML reports an NVLink fabric, and cuMemCreate of a
 *                                   fabric handle fails with CUDA_ERROR_NOT_PERMITTED (no IMEX
 *                                   channel), as on the H100/H200 systems measured (default 0)
 *   VRAMSHIM_FAKEGPU_HOST_BYTES     host RAM that device data copied in may hold (default: a
 *                                   quarter of the machine's RAM)
 *   VRAMSHIM_FAKEGPU_MIG            a MIG profile, "<N>g.<M>gb" (such as 3g.40gb): every device
 *                                   is in MIG mode with one MIG device of that profile, which
 *                                   MEMORY, SMS and NAME then describe (default: no MIG)
 *   VRAMSHIM_FAKEGPU_CARD_MEMORY    with MIG, the whole card's bytes, as NVML reports its GPU
 *                                   (default: MEMORY)
 *   VRAMSHIM_FAKEGPU_LEDGER         a file every process of the machine shares as one device
 *                                   ledger (read in ledger.c; unusable: one line, and the
 *                                   process counts alone)
 * An invalid value: one stderr line and cuInit fails with CUDA_ERROR_INVALID_VALUE.
 * CUDA_VISIBLE_DEVICES then picks the devices the program sees, as the real driver does. */
#include "driver.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static struct fg_config config;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;

static void invalid(const char *var, const char *value, const char *why)
{
    fprintf(stderr, "vramshim fakegpu: %s=\"%s\" is invalid: %s; CUDA initialisation fails\n", var,
            value, why);
    config.valid = false;
}

/* A plain decimal integer in [min, max]. */
static void read_number(const char *var, unsigned long long min, unsigned long long max,
                        unsigned long long *out)
{
    const char *text = getenv(var);
    if (!text)
        return;
    char *end = NULL;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (!*text || *end || errno || text[0] == '-' || text[0] == '+' || value < min || value > max) {
        char why[96];
        snprintf(why, sizeof why, "expected a whole number from %llu to %llu", min, max);
        invalid(var, text, why);
        return;
    }
    *out = value;
}

void fg_physical_uuid(int physical, unsigned char out[16])
{
    memset(out, 0, 16);
    memcpy(out, "FAKEGPU", 7);
    out[15] = (unsigned char)physical;
}

void fg_mig_uuid(int physical, unsigned char out[16])
{
    memset(out, 0, 16);
    memcpy(out, "FAKEMIG", 7);
    out[15] = (unsigned char)physical;
}

/* The device whose UUID text ("GPU-" or "MIG-" and 36 characters) starts with ENTRY, which
 * starts with PREFIX ("GPU-" or "MIG-"; MIG devices exist only in MIG mode); -1 when none
 * does, -2 when several do. */
static int device_of_uuid(const char *entry, size_t length, const char *prefix)
{
    int found = -1;
    bool mig = strcmp(prefix, "MIG-") == 0;
    if (mig && !config.mig)
        return -1;
    for (int p = 0; p < config.physical_count; p++) {
        unsigned char u[16];
        char text[48];
        if (mig)
            fg_mig_uuid(p, u);
        else
            fg_physical_uuid(p, u);
        snprintf(text, sizeof text,
                 "%s%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", prefix, u[0],
                 u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
                 u[14], u[15]);
        if (length <= strlen(text) && strncasecmp(text, entry, length) == 0) {
            if (found != -1)
                return -2;
            found = p;
        }
    }
    return found;
}

/* CUDA_VISIBLE_DEVICES as the driver reads it: unset, every device; otherwise a comma-separated
 * list of indices ("1gpu" reads as 1, as strtoul would) or of "GPU-" UUIDs or unique prefixes
 * of them, in the order given. The first entry that is not valid (not a number, a negative one,
 * an index past the last device, a UUID no device or several devices match, a form other than
 * the first entry's) ends the list; a device named twice leaves no device visible. An empty
 * value: no device. In MIG mode entries may also be "MIG-" UUIDs (or unique prefixes), and a
 * process sees one MIG device at most, as CUDA enumerates a single MIG device: the first the
 * list names (by index or UUID its GPU's), the first GPU's when the variable is unset. */
static void apply_visible_devices(void)
{
    const char *list = getenv("CUDA_VISIBLE_DEVICES");
    config.count = 0;
    if (!list) {
        for (int p = 0; p < config.physical_count; p++)
            config.physical[config.count++] = p;
        if (config.mig)
            config.count = 1;
        return;
    }
    const char *first = list + strspn(list, " \t");
    bool uuids = strncmp(first, "GPU-", 4) == 0 || strncmp(first, "MIG-", 4) == 0;
    for (const char *entry = list; *entry;) {
        size_t length = strcspn(entry, ",");
        const char *start = entry + strspn(entry, " \t");
        size_t trimmed = length - (size_t)(start - entry);
        while (trimmed && (start[trimmed - 1] == ' ' || start[trimmed - 1] == '\t'))
            trimmed--;
        int device = -1;
        if (uuids) {
            if (trimmed > 4 && strncmp(start, "GPU-", 4) == 0)
                device = device_of_uuid(start, trimmed, "GPU-");
            else if (trimmed > 4 && strncmp(start, "MIG-", 4) == 0)
                device = device_of_uuid(start, trimmed, "MIG-");
            if (device == -2) {
                config.count = 0; /* an ambiguous prefix: the driver shows nothing */
                return;
            }
        } else {
            const char *digits = start + (*start == '+');
            if (*start != '-' && *digits >= '0' && *digits <= '9') {
                unsigned long long index = 0;
                while (*digits >= '0' && *digits <= '9' && index < FG_MAX_DEVICES)
                    index = index * 10 + (unsigned)(*digits++ - '0');
                device = index < (unsigned long long)config.physical_count ? (int)index : -1;
            }
        }
        if (device < 0)
            return;
        for (int v = 0; v < config.count; v++)
            if (config.physical[v] == device) {
                config.count = 0;
                return;
            }
        config.physical[config.count++] = device;
        if (config.mig)
            return; /* one MIG device per process */
        entry += length;
        if (*entry == ',')
            entry++;
    }
}

static void load(void)
{
    config.valid = true;
    unsigned long long count = 1, memory = 80ull << 30, sms = 132, context = 0;
    read_number("VRAMSHIM_FAKEGPU_COUNT", 1, FG_MAX_DEVICES, &count);
    read_number("VRAMSHIM_FAKEGPU_MEMORY", 1, 1ull << 50, &memory);
    read_number("VRAMSHIM_FAKEGPU_SMS", 1, 1024, &sms);
    read_number("VRAMSHIM_FAKEGPU_CONTEXT_BYTES", 0, 1ull << 50, &context);
    unsigned long long module = 0, nccl = 0, fabric = 0;
    read_number("VRAMSHIM_FAKEGPU_MODULE_BYTES", 0, 1ull << 50, &module);
    read_number("VRAMSHIM_FAKEGPU_NCCL_BYTES", 0, 1ull << 50, &nccl);
    read_number("VRAMSHIM_FAKEGPU_FABRIC", 0, 1, &fabric);
    unsigned long long sweep = 10;
    read_number("VRAMSHIM_FAKEGPU_LEDGER_SWEEP_MS", 0, 86400000, &sweep);
    config.ledger_sweep_ns = (long long)sweep * 1000000;
    config.module_bytes = module;
    config.nccl_bytes = nccl;
    config.fabric = fabric == 1;
    /* A quarter of the machine's RAM: enough for the data a dry run copies in (weights,
     * batches) on any machine, never enough to get the program OOM-killed. */
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    unsigned long long host = pages > 0 && page > 0 ? (unsigned long long)pages * page / 4
                                                    : 1ull << 30;
    read_number("VRAMSHIM_FAKEGPU_HOST_BYTES", 0, 1ull << 50, &host);
    config.host_bytes = host;
    const char *mig = getenv("VRAMSHIM_FAKEGPU_MIG");
    if (mig) {
        unsigned slices = 0, gb = 0;
        int end = -1;
        if (strlen(mig) >= sizeof config.mig_profile ||
            sscanf(mig, "%ug.%ugb%n", &slices, &gb, &end) != 2 || end != (int)strlen(mig) ||
            slices < 1 || slices > 8 || gb < 1 || mig[0] < '0' || mig[0] > '9' ||
            strchr(mig, ' ') || strchr(mig, '-') || strchr(mig, '+'))
            invalid("VRAMSHIM_FAKEGPU_MIG", mig, "expected a MIG profile such as 3g.40gb");
        else {
            config.mig = true;
            strcpy(config.mig_profile, mig);
        }
    }
    unsigned long long card_memory = memory;
    read_number("VRAMSHIM_FAKEGPU_CARD_MEMORY", 1, 1ull << 50, &card_memory);
    config.card_memory = card_memory;
    config.physical_count = (int)count;
    apply_visible_devices();
    config.memory = memory;
    if (config.valid && config.mig && card_memory < memory)
        invalid("VRAMSHIM_FAKEGPU_CARD_MEMORY", getenv("VRAMSHIM_FAKEGPU_CARD_MEMORY"),
                "smaller than the MIG device's VRAMSHIM_FAKEGPU_MEMORY");
    config.sms = (int)sms;
    config.context_bytes = context;
    if (config.valid && context > memory)
        invalid("VRAMSHIM_FAKEGPU_CONTEXT_BYTES", getenv("VRAMSHIM_FAKEGPU_CONTEXT_BYTES"),
                "larger than VRAMSHIM_FAKEGPU_MEMORY");

    const char *name = getenv("VRAMSHIM_FAKEGPU_NAME");
    if (!name)
        name = "NVIDIA H100 80GB HBM3";
    if (!*name || strlen(name) >= sizeof config.name)
        invalid("VRAMSHIM_FAKEGPU_NAME", name, "expected 1 to 255 bytes");
    else
        strcpy(config.name, name);
    /* The parent GPU's name: the MIG device's without " MIG <profile>", as the driver names
     * a MIG device after its GPU ("NVIDIA A100-SXM4-80GB MIG 3g.40gb"). */
    strcpy(config.card_name, config.name);
    char *suffix = strstr(config.card_name, " MIG ");
    if (config.mig && suffix && suffix != config.card_name)
        *suffix = 0;

    config.cc_major = 9;
    config.cc_minor = 0;
    const char *cc = getenv("VRAMSHIM_FAKEGPU_CC");
    if (cc) {
        unsigned major, minor;
        char tail;
        if (sscanf(cc, "%u.%u%c", &major, &minor, &tail) != 2 || major < 1 || major > 99 ||
            minor > 9 || strchr(cc, ' ') || cc[0] == '+')
            invalid("VRAMSHIM_FAKEGPU_CC", cc, "expected MAJOR.MINOR, such as 9.0 or 12.0");
        else {
            config.cc_major = (int)major;
            config.cc_minor = (int)minor;
        }
    }
}

const struct fg_config *fg_config(void)
{
    pthread_once(&config_once, load);
    return &config;
}

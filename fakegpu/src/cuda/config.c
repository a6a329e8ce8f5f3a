/* The simulated machine, from the environment (all optional):
 *   VRAMSHIM_FAKEGPU_COUNT          devices (1..64, default 1)
 *   VRAMSHIM_FAKEGPU_MEMORY         bytes per device, a plain integer (default 80 GiB)
 *   VRAMSHIM_FAKEGPU_NAME           device name (default "NVIDIA H100 80GB HBM3")
 *   VRAMSHIM_FAKEGPU_CC             compute capability "MAJOR.MINOR" (default "9.0")
 *   VRAMSHIM_FAKEGPU_SMS            multiprocessors (default 132)
 *   VRAMSHIM_FAKEGPU_CONTEXT_BYTES  device memory a primary context takes (default 0)
 *   VRAMSHIM_FAKEGPU_HOST_BYTES     host RAM that device data copied in may hold (default: a
 *                                   quarter of the machine's RAM)
 * An invalid value: one stderr line and cuInit fails with CUDA_ERROR_INVALID_VALUE. */
#include "driver.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static void load(void)
{
    config.valid = true;
    unsigned long long count = 1, memory = 80ull << 30, sms = 132, context = 0;
    read_number("VRAMSHIM_FAKEGPU_COUNT", 1, FG_MAX_DEVICES, &count);
    read_number("VRAMSHIM_FAKEGPU_MEMORY", 1, 1ull << 50, &memory);
    read_number("VRAMSHIM_FAKEGPU_SMS", 1, 1024, &sms);
    read_number("VRAMSHIM_FAKEGPU_CONTEXT_BYTES", 0, 1ull << 50, &context);
    /* A quarter of the machine's RAM: enough for the data a dry run copies in (weights,
     * batches) on any machine, never enough to get the program OOM-killed. */
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    unsigned long long host = pages > 0 && page > 0 ? (unsigned long long)pages * page / 4
                                                    : 1ull << 30;
    read_number("VRAMSHIM_FAKEGPU_HOST_BYTES", 0, 1ull << 50, &host);
    config.host_bytes = host;
    config.count = (int)count;
    config.memory = memory;
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

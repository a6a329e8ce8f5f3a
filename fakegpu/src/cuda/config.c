/* The simulated machine, from the environment (all optional):
 *   VRAMSHIM_FAKEGPU_COUNT          devices the machine has (1..64, default 1)
 *   VRAMSHIM_FAKEGPU_MEMORY         bytes per device, a plain integer (default 80 GiB)
 *   VRAMSHIM_FAKEGPU_NAME           device name (default "NVIDIA H100 80GB HBM3")
 *   VRAMSHIM_FAKEGPU_CC             compute capability "MAJOR.MINOR" (default "9.0")
 *   VRAMSHIM_FAKEGPU_SMS            multiprocessors (default 132)
 *   VRAMSHIM_FAKEGPU_CONTEXT_BYTES  device memory a primary context takes (default 0)
 *   VRAMSHIM_FAKEGPU_MODULE_BYTES   device memory the first kernel launch on a device takes
 *                                   (CUDA loads modules lazily; default 0)
 *   VRAMSHIM_FAKEGPU_CUBLAS_KERNEL_BYTES  device memory no hook sees that a device's first
 *                                   cuBLAS handle takes beyond its allocations (cuBLAS's
 *                                   kernels; default 0)
 *   VRAMSHIM_FAKEGPU_CUDNN_KERNEL_BYTES   device memory no hook sees that a device's first cuDNN
 *                                   execution (cudnnBackendExecute) takes (cuDNN's kernels;
 *                                   default 0)
 *   VRAMSHIM_FAKEGPU_NCCL_BYTES     device memory an NCCL rank takes for itself (default 0;
 *                                   see fakegpu/src/nccl/nccl.c)
 *   VRAMSHIM_FAKEGPU_FABRIC         1: NVML reports an NVLink fabric, and cuMemCreate of a
 *                                   fabric handle fails with CUDA_ERROR_NOT_PERMITTED (no IMEX
 *                                   channel), as on the H100/H200 systems measured (default 0)
 *   VRAMSHIM_FAKEGPU_HOST_BYTES     host RAM that device data copied in may hold (default: a
 *                                   quarter of the machine's RAM)
 *   VRAMSHIM_FAKEGPU_MIG            a MIG layout (default: no MIG): each card's MIG profiles,
 *                                   "<N>g.<M>gb" comma-separated, or "none" (out of MIG mode),
 *                                   cards separated by ';' ("3g.40gb,2g.20gb;none"); one card's
 *                                   entry stands for every card ("3g.40gb": one 3g.40gb MIG
 *                                   device on each). MEMORY, SMS and NAME describe the
 *                                   layout's first MIG device; the others scale from it by the
 *                                   MIG user guide's fractions (see read_mig_layout)
 *   VRAMSHIM_FAKEGPU_CARD_MEMORY    with MIG, the whole card's bytes, as NVML reports its GPU
 *                                   (default: MEMORY)
 *   VRAMSHIM_FAKEGPU_CARD_SMS       with MIG, a whole card's SMs (a card out of MIG mode;
 *                                   default: SMS)
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

void fg_mig_uuid(int physical, int index, unsigned char out[16])
{
    memset(out, 0, 16);
    memcpy(out, "FAKEMIG", 7);
    out[14] = (unsigned char)index;
    out[15] = (unsigned char)physical;
}

static void uuid_string(const unsigned char u[16], const char *prefix, char *text, size_t n)
{
    snprintf(text, n, "%s%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             prefix, u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
             u[12], u[13], u[14], u[15]);
}

/* The device whose UUID text ("GPU-" or "MIG-" and 36 characters) starts with ENTRY, which
 * starts with PREFIX ("GPU-" or "MIG-"; MIG devices exist only on cards in MIG mode): the card
 * (*INDEX its MIG device, or -1); -1 when none does, -2 when several do. */
static int device_of_uuid(const char *entry, size_t length, const char *prefix, int *index)
{
    int found = -1;
    bool mig = strcmp(prefix, "MIG-") == 0;
    *index = -1;
    for (int p = 0; p < config.physical_count; p++)
        for (int i = 0; i < (mig ? config.cards[p].mig_count : 1); i++) {
            unsigned char u[16];
            char text[48];
            if (mig)
                fg_mig_uuid(p, i, u);
            else
                fg_physical_uuid(p, u);
            uuid_string(u, prefix, text, sizeof text);
            if (length <= strlen(text) && strncasecmp(text, entry, length) == 0) {
                if (found != -1)
                    return -2;
                found = p;
                *index = mig ? i : -1;
            }
        }
    return found;
}

/* Makes card P's device (MIG device INDEX of it, or the card) visible as the next ordinal. */
static void add_visible(int p, int index)
{
    int v = config.count++;
    config.physical[v] = p;
    config.mig_index[v] = index;
    config.unit[v] = index >= 0 ? config.cards[p].mig[index].unit : config.cards[p].unit;
}

/* CUDA_VISIBLE_DEVICES as the driver reads it: unset, every device; otherwise a comma-separated
 * list of indices ("1gpu" reads as 1, as strtoul would) or of "GPU-" UUIDs or unique prefixes
 * of them, in the order given. The first entry that is not valid (not a number, a negative one,
 * an index past the last device, a UUID no device or several devices match, a form other than
 * the first entry's) ends the list; a device named twice leaves no device visible. An empty
 * value: no device. With cards in MIG mode entries may also be "MIG-" UUIDs (or unique
 * prefixes), and a process sees one MIG device at most, as CUDA enumerates a single MIG device
 * (the MIG user guide, "CUDA Device Enumeration"): the first the list names (by index or GPU
 * UUID, a MIG card's MIG device 0), which ends the list; unset: the cards out of MIG mode and
 * the first MIG card's MIG device 0, in the machine's order. */
static void apply_visible_devices(void)
{
    const char *list = getenv("CUDA_VISIBLE_DEVICES");
    config.count = 0;
    if (!list) {
        bool mig_seen = false;
        for (int p = 0; p < config.physical_count; p++)
            if (config.cards[p].mig_count == 0)
                add_visible(p, -1);
            else if (!mig_seen) {
                add_visible(p, 0);
                mig_seen = true;
            }
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
        int device = -1, index = -1;
        if (uuids) {
            if (trimmed > 4 && strncmp(start, "GPU-", 4) == 0)
                device = device_of_uuid(start, trimmed, "GPU-", &index);
            else if (trimmed > 4 && strncmp(start, "MIG-", 4) == 0)
                device = device_of_uuid(start, trimmed, "MIG-", &index);
            if (device == -2) {
                config.count = 0; /* an ambiguous prefix: the driver shows nothing */
                return;
            }
        } else {
            const char *digits = start + (*start == '+');
            if (*start != '-' && *digits >= '0' && *digits <= '9') {
                unsigned long long number = 0;
                while (*digits >= '0' && *digits <= '9' && number < FG_MAX_DEVICES)
                    number = number * 10 + (unsigned)(*digits++ - '0');
                device = number < (unsigned long long)config.physical_count ? (int)number : -1;
            }
        }
        if (device < 0)
            return;
        if (index < 0 && config.cards[device].mig_count > 0)
            index = 0; /* a MIG card named by index or GPU UUID: its first MIG device */
        for (int v = 0; v < config.count; v++)
            if (config.physical[v] == device && config.mig_index[v] == index) {
                config.count = 0;
                return;
            }
        add_visible(device, index);
        if (index >= 0)
            return; /* one MIG device per process */
        entry += length;
        if (*entry == ',')
            entry++;
    }
}

/* GPU-instance shapes on the MIG-capable cards (A100 40/80GB, H100, H200), from NVIDIA's
 * Multi-Instance GPU User Guide ("Supported MIG Profiles": 8 memory slices and 7 compute
 * slices per card; each profile's placements, as `nvidia-smi mig -lgipp` lists them): compute
 * slices, memory slices (eighths of the card), and the memory slices an instance may start at. */
static const struct {
    int slices, eighths, start_count, starts[7];
} mig_shapes[] = {
    {1, 1, 7, {0, 1, 2, 3, 4, 5, 6}}, /* 1g.5gb  (A100 40GB), 1g.10gb (80GB), 1g.18gb (H200) */
    {1, 2, 4, {0, 2, 4, 6}},          /* 1g.10gb (A100 40GB), 1g.20gb (80GB), 1g.35gb (H200) */
    {2, 2, 3, {0, 2, 4}},             /* 2g.10gb, 2g.20gb, 2g.35gb */
    {3, 4, 2, {0, 4}},                /* 3g.20gb, 3g.40gb, 3g.71gb */
    {4, 4, 1, {0}},                   /* 4g.20gb, 4g.40gb, 4g.71gb */
    {7, 8, 1, {0}},                   /* 7g.40gb, 7g.80gb, 7g.141gb */
};

/* A GPU instance of a layout being read: its profile, shape, placement, media extensions and
 * compute instances (compute slices each, and where each starts within it). */
struct layout_gi {
    char profile[32];
    int slices, eighths, start;
    bool media;
    int ci_count, ci_slices[FG_MAX_MIG], ci_start[FG_MAX_MIG];
};

/* Places a card's GPU instances from K on, memory slices USED taken: the first placement of
 * each in the layout's order that lets all fit (a search: "1g.10gb,4g.40gb" puts the 4g
 * instance at slice 0 and the 1g one after it). */
static bool place(struct layout_gi *gis, int count, int k, unsigned used)
{
    if (k == count)
        return true;
    struct layout_gi *m = &gis[k];
    for (size_t s = 0; s < sizeof mig_shapes / sizeof *mig_shapes; s++) {
        if (mig_shapes[s].slices != m->slices || mig_shapes[s].eighths != m->eighths)
            continue;
        for (int i = 0; i < mig_shapes[s].start_count; i++) {
            unsigned mask = ((1u << m->eighths) - 1) << mig_shapes[s].starts[i];
            if (used & mask)
                continue;
            m->start = mig_shapes[s].starts[i];
            if (place(gis, count, k + 1, used | mask))
                return true;
        }
    }
    return false;
}

/* Places a GPU instance's compute instances from K on, compute slices USED taken, the same
 * way. Where a compute instance of C slices may start within a GPU instance of S slices, as
 * `nvidia-smi mig -lcipp` lists them: at multiples of C (of 4 for 3 slices) with C <= S and
 * start + C <= S (a 7g instance: 1c at 0-6, 2c at 0/2/4, 3c at 0/4, 4c and 7c at 0). */
static bool place_compute(struct layout_gi *gi, int k, unsigned used)
{
    if (k == gi->ci_count)
        return true;
    int c = gi->ci_slices[k], step = c == 3 ? 4 : c;
    for (int start = 0; start + c <= gi->slices; start += step) {
        unsigned mask = ((1u << c) - 1) << start;
        if (used & mask)
            continue;
        gi->ci_start[k] = start;
        if (place_compute(gi, k + 1, used | mask))
            return true;
    }
    return false;
}

/* A GPU instance's id as the driver numbers it by placement: the whole card 0, a half (4
 * memory slices) 1-2, a quarter 3-6, an eighth 7-14 (GI 2 is the 3g instance at slice 4). */
static int gpu_instance_id(const struct fg_mig_device *m)
{
    switch (m->eighths) {
    case 8: return 0;
    case 4: return 1 + m->start / 4;
    case 2: return 3 + m->start / 2;
    default: return 7 + m->start;
    }
}

static int by_instance(const void *a, const void *b)
{
    const struct fg_mig_device *x = a, *y = b;
    return x->gi_id != y->gi_id ? x->gi_id - y->gi_id : x->ci_id - y->ci_id;
}

static void invalid_layout(const char *value, int card, const char *why)
{
    char text[320];
    if (card >= 0)
        snprintf(text, sizeof text, "card %d: %s", card, why);
    else
        snprintf(text, sizeof text, "%s", why);
    invalid("VRAMSHIM_FAKEGPU_MIG", value, text);
}

/* The length of the layout item at ITEM: up to a ',' outside brackets, a ';' or the end. */
static size_t item_length(const char *item, const char *end)
{
    size_t n = 0;
    int depth = 0;
    while (item + n < end && item[n] != ';' && (item[n] != ',' || depth > 0)) {
        depth += item[n] == '[' ? 1 : item[n] == ']' ? -1 : 0;
        n++;
    }
    return n;
}

/* Reads one GPU instance of a layout, "<N>g.<M>gb", "+me" for media extensions, then its
 * compute instances "[<C>c,...]" (none: one filling it), into GI; false with WHY (and
 * *NOT_PROFILE when the text is not a profile at all). */
static bool read_gpu_instance(const char *item, size_t n, struct layout_gi *gi, char *why,
                              size_t why_size, bool *not_profile)
{
    char text[96];
    *not_profile = false;
    memset(gi, 0, sizeof *gi);
    if (n == 0 || n >= sizeof text) {
        *not_profile = true;
        return false;
    }
    memcpy(text, item, n);
    text[n] = 0;
    char *bracket = strchr(text, '[');
    const char *computes = NULL;
    if (bracket) {
        if (text[n - 1] != ']' || bracket[1] == ']') {
            snprintf(why, why_size,
                     "\"%.40s\": compute instances are written [<C>c,...] after the profile, "
                     "such as 3g.40gb[2c,1c]", text);
            return false;
        }
        text[n - 1] = 0;
        *bracket = 0;
        computes = bracket + 1;
    }
    size_t base = strlen(text);
    if (base > 3 && strcmp(text + base - 3, "+me") == 0) {
        gi->media = true;
        text[base - 3] = 0;
    }
    unsigned slices = 0, gb = 0;
    int end = -1;
    if (strlen(text) >= sizeof gi->profile - 3 ||
        sscanf(text, "%ug.%ugb%n", &slices, &gb, &end) != 2 || end != (int)strlen(text) ||
        gb < 1 || text[0] < '1' || text[0] > '9' || strpbrk(text, " +-[]")) {
        *not_profile = true;
        return false;
    }
    if (slices != 1 && slices != 2 && slices != 3 && slices != 4 && slices != 7) {
        snprintf(why, why_size, "%s: no MIG profile has %u compute slices (1g, 2g, 3g, 4g, 7g)",
                 text, slices);
        return false;
    }
    snprintf(gi->profile, sizeof gi->profile, "%.28s%s", text, gi->media ? "+me" : "");
    gi->slices = (int)slices;
    gi->eighths = slices == 7 ? 8 : slices >= 3 ? 4 : 2;
    /* 1g: an eighth of the card or two, whichever its GB figure is nearer. */
    if (slices == 1 && (double)gb * 1e9 * 8 < 1.5 * (double)config.card_memory)
        gi->eighths = 1;
    if (gi->media && gi->eighths != 1) {
        snprintf(why, why_size,
                 "%s: media extensions (+me) come with the 1g profile of one memory slice only "
                 "(1g.5gb+me, 1g.10gb+me, 1g.18gb+me)", gi->profile);
        return false;
    }
    if (!computes) {
        gi->ci_count = 1;
        gi->ci_slices[0] = gi->slices;
        return true;
    }
    for (const char *c = computes;;) {
        size_t length = strcspn(c, ",");
        unsigned count = 0;
        int used = -1;
        char ci[16];
        bool ok = length > 0 && length < sizeof ci;
        if (ok) {
            memcpy(ci, c, length);
            ci[length] = 0;
            ok = sscanf(ci, "%uc%n", &count, &used) == 1 && used == (int)length &&
                 ci[0] >= '1' && ci[0] <= '9';
        }
        if (!ok) {
            snprintf(why, why_size,
                     "%s: \"%.*s\" is not a compute instance such as 1c (compute slices, then c)",
                     gi->profile, (int)(length < 20 ? length : 20), c);
            return false;
        }
        if ((count != 1 && count != 2 && count != 3 && count != 4 && count != 7) ||
            (int)count > gi->slices) {
            snprintf(why, why_size,
                     "%s: no %uc compute instance (1c, 2c, 3c, 4c or 7c, at most its %d "
                     "compute slices)", gi->profile, count, gi->slices);
            return false;
        }
        if (gi->ci_count == FG_MAX_MIG) {
            snprintf(why, why_size, "%s: more than 7 compute instances", gi->profile);
            return false;
        }
        gi->ci_slices[gi->ci_count++] = (int)count;
        if (c[length] != ',')
            break;
        c += length + 1; /* a comma last leaves an empty item: refused above */
    }
    return true;
}

/* VRAMSHIM_FAKEGPU_MIG: the cards' GPU instances, each with its compute instances (the MIG
 * devices). A profile's memory share is the guide's: 3g and 4g take 4/8 of the card, 2g 2/8,
 * 7g all; a 1g profile 1/8 or 2/8 (1g.10gb and 1g.20gb of an 80 GB card), told apart by its GB
 * figure against an eighth of CARD_MEMORY. "+me" (1g of one memory slice only, one per card:
 * the guide's "a single 1g profile can include media extensions") has its base profile's
 * memory and SMs. "[2c,1c]" after a profile: its compute instances, placed in order as the
 * driver places them, ids 0, 1, ... in the order given; each one a MIG device with its own SMs
 * and the GPU instance's memory. The layout's first GPU instance has MEMORY bytes and SMS SMs
 * (all its compute slices'); the others the same bytes per memory slice and SMs per compute
 * slice. Refused: a profile that is not <N>g.<M>gb[+me][[<C>c,...]] with N one of 1, 2, 3, 4,
 * 7; more than 7 GPU instances on a card; a set no placement fits on one card (the guide's
 * placements, which also keep a card within its 7 compute slices), or compute instances no
 * placement fits in their GPU instance; a number of cards' entries other than 1 or the
 * machine's; more than 64 memory units in all. */
static void read_mig_layout(const char *value, unsigned long long memory, unsigned long long sms)
{
    int entries = 1;
    for (const char *c = value; *c; c++)
        entries += *c == ';';
    bool single = !strchr(value, ';') && !strchr(value, ',');
    if (entries > 1 && entries != config.physical_count) {
        char why[160];
        snprintf(why, sizeof why, "it names %d cards and the machine has %d (VRAMSHIM_FAKEGPU_COUNT)",
                 entries, config.physical_count);
        invalid_layout(value, -1, why);
        return;
    }
    struct layout_gi first;
    bool have_first = false;
    const char *entry = value;
    for (int card = 0; card < entries; card++) {
        size_t length = strcspn(entry, ";");
        struct fg_card *c = &config.cards[card];
        c->mig_count = 0;
        if (length == 0 || entry[0] == ',' || entry[length - 1] == ',') {
            if (single)
                invalid("VRAMSHIM_FAKEGPU_MIG", value, "expected a MIG profile such as 3g.40gb");
            else
                invalid_layout(value, card, "an empty profile (a card's entry is its MIG "
                                            "profiles, comma-separated, or none)");
            return;
        }
        if (length == 4 && strncmp(entry, "none", 4) == 0) {
            entry += length + (entry[length] == ';');
            continue;
        }
        struct layout_gi gis[FG_MAX_MIG];
        int gi_count = 0, media = 0;
        for (const char *item = entry; item < entry + length;) {
            size_t n = item_length(item, entry + length);
            struct layout_gi gi;
            char why[200];
            bool not_profile;
            if (!read_gpu_instance(item, n, &gi, why, sizeof why, &not_profile)) {
                if (not_profile && single)
                    invalid("VRAMSHIM_FAKEGPU_MIG", value, "expected a MIG profile such as 3g.40gb");
                else if (not_profile) {
                    snprintf(why, sizeof why,
                             "\"%.*s\" is not a MIG profile such as 3g.40gb (or none for a card "
                             "out of MIG mode)", (int)(n < 40 ? n : 40), item);
                    invalid_layout(value, card, why);
                } else
                    invalid_layout(value, card, why);
                return;
            }
            if (gi_count == FG_MAX_MIG) {
                invalid_layout(value, card, "more than 7 MIG devices on one card");
                return;
            }
            media += gi.media;
            if (media > 1) {
                invalid_layout(value, card, "more than one +me profile (a card has one set of "
                                            "media extensions)");
                return;
            }
            gis[gi_count++] = gi;
            item += n + (item[n] == ',');
        }
        if (!place(gis, gi_count, 0, 0)) {
            char why[256];
            int compute = 0;
            for (int k = 0; k < gi_count; k++)
                compute += gis[k].slices;
            snprintf(why, sizeof why,
                     compute > 7 ? "%.*s take %d compute slices, a card has 7"
                                 : "%.*s do not fit the card's 8 memory slices at the placements "
                                   "the MIG user guide gives",
                     (int)(length < 120 ? length : 120), entry, compute);
            invalid_layout(value, card, why);
            return;
        }
        for (int k = 0; k < gi_count; k++) {
            struct layout_gi *gi = &gis[k];
            if (!place_compute(gi, 0, 0)) {
                char why[200];
                snprintf(why, sizeof why,
                         "%.31s: its compute instances do not fit its %d compute slices at the "
                         "placements the driver gives", gi->profile, gi->slices);
                invalid_layout(value, card, why);
                return;
            }
            if (!have_first) {
                first = *gi;
                have_first = true;
            }
            for (int i = 0; i < gi->ci_count; i++) {
                struct fg_mig_device *m = &c->mig[c->mig_count++];
                memset(m, 0, sizeof *m);
                strcpy(m->profile, gi->profile);
                m->slices = gi->slices;
                m->eighths = gi->eighths;
                m->start = gi->start;
                m->media = gi->media;
                m->ci_slices = gi->ci_slices[i];
                m->ci_start = gi->ci_start[i];
                m->ci_id = i;
                if (m->ci_slices == m->slices)
                    snprintf(m->ci_profile, sizeof m->ci_profile, "%.31s", gi->profile);
                else
                    snprintf(m->ci_profile, sizeof m->ci_profile, "%dc.%.31s", m->ci_slices,
                             gi->profile);
            }
        }
        entry += length + (entry[length] == ';');
    }
    for (int card = entries; card < config.physical_count; card++)
        config.cards[card] = config.cards[0];
    if (!have_first)
        return; /* every card out of MIG mode */
    config.mig = true;
    unsigned long long per_eighth = memory / (unsigned long long)first.eighths;
    unsigned long long per_slice = sms / (unsigned long long)first.slices;
    config.mig_eighth = per_eighth;
    config.mig_slice_sms = (int)per_slice;
    int units = 0;
    for (int p = 0; p < config.physical_count; p++) {
        struct fg_card *c = &config.cards[p];
        for (int k = 0; k < c->mig_count; k++) {
            c->mig[k].gi_id = gpu_instance_id(&c->mig[k]);
            c->mig[k].memory = per_eighth * (unsigned long long)c->mig[k].eighths;
            c->mig[k].sms = (int)(per_slice * (unsigned long long)c->mig[k].ci_slices);
        }
        qsort(c->mig, (size_t)c->mig_count, sizeof *c->mig, by_instance);
        if (c->mig_count == 0)
            c->unit = units++;
        /* One memory unit per GPU instance: its compute instances share its memory. */
        for (int k = 0; k < c->mig_count; k++)
            c->mig[k].unit = k > 0 && c->mig[k].gi_id == c->mig[k - 1].gi_id ? c->mig[k - 1].unit
                                                                             : units++;
    }
    if (units > FG_MAX_DEVICES)
        invalid_layout(value, -1, "more than 64 devices (cards out of MIG mode and MIG devices)");
}

unsigned long long fg_device_capacity(int v)
{
    int index = v >= 0 && v < config.count ? config.mig_index[v] : -1;
    if (index >= 0)
        return config.cards[config.physical[v]].mig[index].memory;
    return config.mig ? config.card_memory : config.memory;
}

int fg_device_sms(int v)
{
    int index = v >= 0 && v < config.count ? config.mig_index[v] : -1;
    if (index >= 0)
        return config.cards[config.physical[v]].mig[index].sms;
    return config.mig ? config.card_sms : config.sms;
}

/* A MIG device is named after its card and compute instance ("NVIDIA A100-SXM4-80GB MIG
 * 3g.40gb", "... MIG 1c.3g.40gb" for a compute instance of 1 of its 3 slices): NAME for the
 * profile of the layout's first MIG device. */
void fg_mig_name(int physical, int index, char *out, size_t n)
{
    const char *profile = config.cards[physical].mig[index].ci_profile;
    const char *suffix = strstr(config.name, " MIG ");
    if (suffix && strcmp(suffix + 5, profile) == 0)
        snprintf(out, n, "%s", config.name);
    else
        snprintf(out, n, "%.200s MIG %.31s", config.card_name, profile);
}

void fg_device_name(int v, char *out, size_t n)
{
    int index = v >= 0 && v < config.count ? config.mig_index[v] : -1;
    if (index < 0)
        snprintf(out, n, "%s", config.mig ? config.card_name : config.name);
    else
        fg_mig_name(config.physical[v], index, out, n);
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
    unsigned long long cublas_kernels = 0, cudnn_kernels = 0;
    read_number("VRAMSHIM_FAKEGPU_CUBLAS_KERNEL_BYTES", 0, 1ull << 50, &cublas_kernels);
    read_number("VRAMSHIM_FAKEGPU_CUDNN_KERNEL_BYTES", 0, 1ull << 50, &cudnn_kernels);
    config.cublas_kernel_bytes = cublas_kernels;
    config.cudnn_kernel_bytes = cudnn_kernels;
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
    unsigned long long card_memory = memory, card_sms = sms;
    read_number("VRAMSHIM_FAKEGPU_CARD_MEMORY", 1, 1ull << 50, &card_memory);
    read_number("VRAMSHIM_FAKEGPU_CARD_SMS", 1, 1024, &card_sms);
    config.card_memory = card_memory;
    config.card_sms = (int)card_sms;
    config.physical_count = (int)count;
    const char *mig = getenv("VRAMSHIM_FAKEGPU_MIG");
    if (mig)
        read_mig_layout(mig, memory, sms);
    config.memory = memory;
    if (config.valid && config.mig && card_memory < memory)
        invalid("VRAMSHIM_FAKEGPU_CARD_MEMORY", getenv("VRAMSHIM_FAKEGPU_CARD_MEMORY"),
                "smaller than the MIG device's VRAMSHIM_FAKEGPU_MEMORY");
    if (!config.mig)
        for (int p = 0; p < config.physical_count; p++)
            config.cards[p].unit = p;
    apply_visible_devices();
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

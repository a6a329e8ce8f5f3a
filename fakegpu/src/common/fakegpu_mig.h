/* What the fake driver (libcuda.so.1) tells the fake NVML of a card's MIG device (resolver.c,
 * nvml.c). Not an NVIDIA interface. */
#pragma once

struct vramshim_fakegpu_mig_info {
    char name[256];      /* "NVIDIA A100-SXM4-80GB MIG 3g.40gb" */
    char profile[32];    /* "3g.40gb" */
    unsigned long long total, used; /* its bytes; in use (every process's with a ledger) */
    int gpu_instance_id; /* by placement, as the driver numbers GPU instances */
    int start, eighths;  /* its memory slices: the first, and how many of the card's 8 */
    int slices, sms;     /* compute slices (of 7) and SMs */
    int unit;            /* the memory unit (processes are listed per unit) */
};

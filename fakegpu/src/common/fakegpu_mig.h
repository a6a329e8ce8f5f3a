/* What the fake driver (libcuda.so.1) tells the fake NVML of a card's MIG device (resolver.c,
 * nvml.c). Not an NVIDIA interface. */
#pragma once

struct vramshim_fakegpu_mig_info {
    char name[256];      /* "NVIDIA A100-SXM4-80GB MIG 3g.40gb", "... MIG 1c.3g.40gb" */
    char profile[32];    /* its GPU instance's: "3g.40gb", "1g.10gb+me" */
    unsigned long long total, used; /* its GPU instance's bytes; in use (every process's with
                                     * a ledger, on any of the GPU instance's compute instances) */
    int gpu_instance_id; /* by placement, as the driver numbers GPU instances */
    int start, eighths;  /* its memory slices: the first, and how many of the card's 8 */
    int slices, sms;     /* the GPU instance's compute slices (of 7); the compute instance's SMs */
    int unit;            /* the GPU instance's memory unit (processes are listed per unit) */
    int media;           /* 1: the GPU instance has the media extensions (+me) */
    int ci_id, ci_slices, ci_start; /* the compute instance: id, compute slices, first slice */
};

"""A job too big for its card, for `vramshim dryrun` with real torch (fakegpu_torch.rs): weights and
activations fit a 1 GiB card, then a 2 GiB buffer does not. Prints torch's own figures (as JSON on
stdout) before it fails.

With the argument `recovered_first`, the activations are freed (their segment stays cached) and a
buffer 128 MiB larger than the card's free memory comes first: torch's cudaMalloc fails, torch
releases its cache and asks again, which succeeds; only then does the 2 GiB buffer fail. torch's own
`num_alloc_retries`, `num_ooms` and allocation count are printed once it has failed, and the error raised again."""
import json
import sys

import torch

MiB = 1 << 20

model = torch.nn.Linear(4096, 4096).cuda()  # 64 MiB of weights, 16 KiB of bias
activations = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")  # DRYRUN: activations
print(json.dumps({"reserved_peak": torch.cuda.max_memory_reserved(),
                  "num_device_alloc": torch.cuda.memory_stats()["num_device_alloc"]}), flush=True)
if sys.argv[1:] == ["recovered_first"]:
    del activations
    free, _ = torch.cuda.mem_get_info()
    larger = free + 128 * MiB
    fits_once_released = torch.empty(larger, dtype=torch.uint8, device="cuda")  # DRYRUN: recovered
    try:
        too_big = torch.empty(2048 * MiB, dtype=torch.uint8, device="cuda")  # DRYRUN: then 2 GiB
    except torch.OutOfMemoryError:
        stats = torch.cuda.memory_stats()
        print(json.dumps({"recovered_request": larger, "num_alloc_retries": stats["num_alloc_retries"],
                          "num_ooms": stats["num_ooms"],
                          "allocations": stats["allocation.all.allocated"],
                          "reserved_peak": stats["reserved_bytes.all.peak"]}), flush=True)
        raise
too_big = torch.empty(2048 * MiB, dtype=torch.uint8, device="cuda")  # DRYRUN: too big

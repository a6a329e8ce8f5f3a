"""A job too big for its card, for `vramshim dryrun` with real torch (fakegpu_torch.rs): weights and
activations fit a 1 GiB card, then a 2 GiB buffer does not. Prints torch's own figures (as JSON on
stdout) before it fails."""
import json

import torch

MiB = 1 << 20

model = torch.nn.Linear(4096, 4096).cuda()  # 64 MiB of weights, 16 KiB of bias
activations = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")  # DRYRUN: activations
print(json.dumps({"reserved_peak": torch.cuda.max_memory_reserved(),
                  "num_device_alloc": torch.cuda.memory_stats()["num_device_alloc"]}), flush=True)
too_big = torch.empty(2048 * MiB, dtype=torch.uint8, device="cuda")  # DRYRUN: too big

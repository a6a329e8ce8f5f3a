"""NVTX ranges and marks from real PyTorch (tests/tests/fakegpu_torch.rs): each range holds
one device allocation made inside it, so the log's marks and allocations interleave in a
known order. Caching off (PYTORCH_NO_CUDA_MEMORY_CACHING=1): one cudaMalloc per tensor.
Prints the injection library NVTX was given, what each NVTX call returned (one `name value`
line each), then `done`."""

import os

import torch
import torch.cuda.nvtx as nvtx

MIB = 1 << 20


def tensor(mib):
    return torch.empty(mib * MIB, dtype=torch.uint8, device="cuda")


torch.cuda.init()
print("injection", os.environ.get("NVTX_INJECTION64_PATH"))
kept = []
print("push outer", nvtx.range_push("outer"))
kept.append(tensor(4))
print("push inner", nvtx.range_push("inner"))
kept.append(tensor(8))
print("pop inner", nvtx.range_pop())
print("pop outer", nvtx.range_pop())
with nvtx.range("step {}", 3):
    kept.append(tensor(16))
nvtx.mark("checkpoint")
handle = nvtx.range_start("load")
kept.append(tensor(32))
nvtx.range_end(handle)
print("pop nothing", nvtx.range_pop())
torch.cuda.synchronize()
print("done", flush=True)

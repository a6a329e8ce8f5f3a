"""Real PyTorch on the fake GPU, for the reports of a torch 2.1 recording, whose blocks come
with their block sizes only (tests/tests/fakegpu_torch.rs): an MLP trained with Adam on
batches of varying size, every tensor a multiple of 512 bytes (float32, every dimension a
multiple of 128, no scalar on the device: the backward pass starts from a full gradient), so
that each block torch hands out is the size asked for: batches are multiples of 2048, so the
activations are multiples of 2 MiB and no request meets a cached block at most 1 MiB larger
(which torch would hand out whole, not split). The cache is emptied once between two
rounds of steps. Under whatever PYTORCH_CUDA_ALLOC_CONF is set. Mode (argv[1]) `mlp`: that
alone; `mixed`: then a transformer step and a caught out-of-memory error (blocks larger than
asked for).

At the end, with Python's garbage collector off (nothing is freed from then on): torch's
counters, its own snapshot (segments and their blocks) and its history's entries, printed as
one JSON line; then os._exit, so that the recording ends where torch's snapshot was taken."""
import gc
import json
import os
import sys

import torch

mode = sys.argv[1]
assert mode in ("mlp", "mixed"), mode
torch.manual_seed(0)
torch.cuda.memory._record_memory_history(max_entries=10_000_000)

# No biases: a bias's gradient is a sum over the batch, whose reduction takes small scratch
# buffers (8 and 128 bytes) for large batches.
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096, bias=False), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 4096, bias=False), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 256, bias=False)).cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)


def step(batch):
    optimizer.zero_grad(set_to_none=True)
    x = torch.randn(batch, 1024, device="cuda")
    out = model(x)
    out.backward(torch.ones_like(out))
    optimizer.step()


for batch in (2048, 6144, 4096, 8192):
    step(batch)
torch.cuda.empty_cache()
for batch in (2048, 10240, 6144, 4096):
    step(batch)
if mode == "mixed":
    # Then blocks that are not the size asked for: a transformer step (sizes of every kind,
    # scalars included), and one request too large for the device, caught (torch releases
    # its cache and retries first).
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024,
                                             dropout=0.0, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).cuda()
    encoder(torch.randn(16, 384, 256, device="cuda")).square().mean().backward()
    try:
        torch.empty(1 << 40, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError:
        pass
    kept = torch.empty(1000, 3, device="cuda")
torch.cuda.synchronize()

gc.collect()
gc.disable()
s = torch.cuda.memory_stats()
snapshot = torch.cuda.memory._snapshot()
segments = [[seg["address"], seg["total_size"],
             [[b["address"], b["size"], b["state"]] for b in seg["blocks"]]]
            for seg in snapshot["segments"] if seg["device"] == 0]
entries = [[e["action"], e.get("addr", e.get("device_free")), e["size"]]
           for e in snapshot["device_traces"][0]]
print(json.dumps({
    "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    "reserved_peak": s["reserved_bytes.all.peak"],
    "allocated_peak": s["allocated_bytes.all.peak"],
    "reserved": s["reserved_bytes.all.current"],
    "allocated": s["allocated_bytes.all.current"],
    "num_alloc_retries": s["num_alloc_retries"],
    "num_ooms": s["num_ooms"],
    "segments": segments,
    "entries": entries,
}), flush=True)
os._exit(0)

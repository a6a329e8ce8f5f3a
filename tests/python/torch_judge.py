"""Real PyTorch as the judge of vramshim's figures (tests/tests/torch_judge.rs,
scripts/gpu-smoke.sh). One process runs the workloads named in argv[1] (comma-separated: mlp,
transformer, inference; churn for the cost comparison) under whatever allocator PYTORCH_CUDA_ALLOC_CONF /
PYTORCH_NO_CUDA_MEMORY_CACHING select, and prints torch's own figures as one JSON line.

Optional environment:
  JUDGE_FRACTION=F        torch.cuda.set_per_process_memory_fraction(F) first
  JUDGE_SNAPSHOT=PATH     _record_memory_history(stacks="python"); writes PATH (_dump_snapshot)
                          and PATH.json: each traced allocation's size and Python frames
  JUDGE_OOM=1             after the workloads, ask for more than the card has (caught)
  JUDGE_HISTORY=python|all  record memory history with these stacks (cost comparison)
  JUDGE_WARMUP=1          run the workloads once untimed first (cost comparison)
The workloads' request streams do not depend on the allocator: the same tensors, in the same
order, whatever the mode, so one tensor-level recording predicts every native configuration.
"""
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.abspath(__file__))


def figures():
    s = torch.cuda.memory_stats()
    keys = ["reserved_bytes.all.peak", "allocated_bytes.all.peak", "requested_bytes.all.peak",
            "num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms"]
    out = {key: s.get(key, 0) for key in keys}
    out["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    return out


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(512, 2048)
        self.fc2 = torch.nn.Linear(2048, 512)

    def forward(self, x):
        hidden = torch.relu(self.fc1(x))  # JUDGE: mlp forward
        return self.fc2(hidden)


def mlp():
    """Three Adam steps of a two-layer MLP (the optimizer's state appears at the first step)."""
    torch.manual_seed(0)
    model = Mlp().cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(3):
        x = torch.randn(256, 512, device="cuda")
        loss = model(x).square().mean()  # JUDGE: mlp loop
        loss.backward()
        optimizer.step()  # JUDGE: mlp step
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    del model, optimizer, x, loss


def transformer():
    """A small TransformerEncoder trained with Adam on batches of varying sequence length (the
    classic fragmentation case)."""
    torch.manual_seed(0)
    # The fake cuDNN has no operations: attention takes torch's own kernels.
    torch.backends.cuda.enable_cudnn_sdp(False)
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024,
                                             dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).cuda()
    head = torch.nn.Linear(256, 1000).cuda()
    optimizer = torch.optim.Adam(list(model.parameters()) + list(head.parameters()), lr=1e-4)
    for length in [64, 384, 96, 512, 160, 448, 32, 320]:
        x = torch.randn(16, length, 256, device="cuda")
        target = torch.randint(0, 1000, (16 * length,), device="cuda")
        optimizer.zero_grad(set_to_none=True)
        logits = head(model(x)).reshape(-1, 1000)
        loss = torch.nn.functional.cross_entropy(logits, target)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    del model, head, optimizer, x, target, logits, loss


def inference():
    """An inference loop that empties the cache after each batch."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 1024)).cuda().eval()
    with torch.no_grad():
        for batch in [32, 512, 128, 1024, 64]:
            model(torch.randn(batch, 1024, device="cuda")).sum().item()
            torch.cuda.empty_cache()
    del model


def churn():
    """Many small allocations, little compute (the recorders' cost, scripts/bench-torch-history.sh):
    200 Adam steps of a tiny MLP."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 64)).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(200):
        model(torch.randn(32, 64, device="cuda")).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def main():
    fraction = os.environ.get("JUDGE_FRACTION")
    if fraction:
        torch.cuda.set_per_process_memory_fraction(float(fraction))
    snapshot = os.environ.get("JUDGE_SNAPSHOT")
    history = os.environ.get("JUDGE_HISTORY")
    workloads = {"mlp": mlp, "transformer": transformer, "inference": inference,
                 "churn": churn}
    if os.environ.get("JUDGE_WARMUP"):
        # Timing only: CUDA's and the libraries' first-use costs, untimed and unrecorded.
        for name in sys.argv[1].split(","):
            workloads[name]()
        torch.cuda.synchronize()
    if snapshot:
        torch.cuda.memory._record_memory_history(stacks="python")
    elif history:
        torch.cuda.memory._record_memory_history(stacks=history)
    failed = None
    started, started_cpu = time.perf_counter(), time.process_time()
    try:
        for name in sys.argv[1].split(","):
            workloads[name]()
    except torch.OutOfMemoryError as error:
        # "Tried to allocate X" names the rounded request; the figures below still hold.
        failed = {"workload": name, "message": str(error).split("\n")[0]}
    torch.cuda.synchronize()
    result = figures()
    result["failed"] = failed
    result["workload_s"] = time.perf_counter() - started
    # CPU time of every thread of the process: what a recorder adds, less blurred by load.
    result["workload_cpu_s"] = time.process_time() - started_cpu
    if history and not snapshot:
        result["history_events"] = sum(
            len(trace) for trace in torch.cuda.memory._snapshot()["device_traces"])
    if os.environ.get("JUDGE_OOM"):
        total = torch.cuda.mem_get_info()[1]
        # Half the card while half of it and 2 MiB more are held: no release of torch's cache
        # can make room, so torch releases it, retries once and raises.
        held = torch.empty(total // 2 + (2 << 20), dtype=torch.uint8, device="cuda")
        try:
            torch.empty(total // 2, dtype=torch.uint8, device="cuda")  # JUDGE: oom
        except torch.OutOfMemoryError:
            after = figures()
            result["oom_retries"] = after["num_alloc_retries"] - result["num_alloc_retries"]
            result["oom_count"] = after["num_ooms"] - result["num_ooms"]
        del held
    if snapshot:
        torch.cuda.memory._dump_snapshot(snapshot)
        allocs = [{"size": e["size"], "frames": e["frames"]}
                  for e in torch.cuda.memory._snapshot()["device_traces"][0]
                  if e["action"] == "alloc"]
        with open(snapshot + ".json", "w") as out:
            json.dump(allocs, out)
        torch.cuda.memory._record_memory_history(enabled=None)
    print(json.dumps(result), flush=True)


main()

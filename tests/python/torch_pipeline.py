"""Point to point between two processes on fake GPUs, started by `torchrun --nproc_per_node=2`
(tests/tests/fakegpu_torch.rs): `dist.send`/`dist.recv` and `batch_isend_irecv` carry each
rank's real data (copied from the host: kernels compute nothing on the fake GPU), then a
2-stage pipeline trains for three steps of two micro-batches with Adam: stage 0 (rank 0)
sends its activations forward, stage 1 (rank 1) sends their gradients back. Each rank writes
its figures as JSON to OUTDIR/rank<R>.json (argv[1])."""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

rank = int(os.environ["RANK"])
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
peer = 1 - rank


def used():
    free, total = torch.cuda.mem_get_info()
    return total - free


# One message each way, of different sizes, then both ways at once in one batch.
if rank == 0:
    dist.send(torch.arange(6.0).cuda(), dst=1)
    received = torch.empty(3, device="cuda")
    dist.recv(received, src=1)
else:
    received = torch.empty(6, device="cuda")
    dist.recv(received, src=0)
    dist.send(torch.tensor([7.0, 8.0, 9.0]).cuda(), dst=0)
mine = torch.full((4,), float(10 + rank)).cuda()
theirs = torch.empty(4, device="cuda")
for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer),
                                       dist.P2POp(dist.irecv, theirs, peer)]):
    request.wait()

torch.manual_seed(0)
if rank == 0:
    stage = nn.Sequential(nn.Linear(256, 1024), nn.ReLU()).cuda()
else:
    stage = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
optimizer = torch.optim.Adam(stage.parameters(), lr=1e-3)
micro_batches, batch = 2, 64
steps = []
for _ in range(3):
    optimizer.zero_grad(set_to_none=True)
    for _ in range(micro_batches):
        if rank == 0:
            activations = stage(torch.randn(batch, 256, device="cuda"))
            dist.send(activations.detach(), dst=1)
            gradient = torch.empty_like(activations)
            dist.recv(gradient, src=1)
            activations.backward(gradient)
        else:
            activations = torch.empty(batch, 1024, device="cuda")
            dist.recv(activations, src=0)
            activations.requires_grad_()
            target = torch.randint(0, 10, (batch,), device="cuda")
            nn.functional.cross_entropy(stage(activations), target).backward()
            dist.send(activations.grad, dst=0)
    optimizer.step()
    torch.cuda.synchronize()
    steps.append((torch.cuda.memory_reserved(), used()))
dist.barrier()

s = torch.cuda.memory_stats()
result = {
    "rank": rank, "pid": os.getpid(), "device": torch.cuda.current_device(),
    "received": received.tolist(), "exchanged": theirs.tolist(), "steps": steps,
    "reserved_peak": s.get("reserved_bytes.all.peak", 0),
    "num_device_alloc": s.get("num_device_alloc", 0),
    "num_device_free": s.get("num_device_free", 0),
}
dist.destroy_process_group()
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as out:
    json.dump(result, out)

"""Data-parallel training on fake GPUs, one process per rank, started by
`torchrun --nproc_per_node=N` (tests/tests/fakegpu_torch.rs). Each rank checks that small
collectives carry real data between the processes, trains an MLP with Adam for three steps,
wrapped in DistributedDataParallel (argv[2] "ddp", the default) or sharded with FSDP2's
fully_shard ("fsdp"), and writes its figures as JSON to OUTDIR/rank<R>.json (argv[1])."""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

rank = int(os.environ["RANK"])
local_rank = int(os.environ["LOCAL_RANK"])
world = int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))


def used():
    free, total = torch.cuda.mem_get_info()
    return total - free


# Real data through the collectives: each rank's own numbers, copied from the host (kernels
# compute nothing on the fake GPU, copies are real), combined by NCCL.
total = torch.full((4,), float(rank + 1)).cuda()
dist.all_reduce(total)
gathered = torch.empty(world, 4, device="cuda")
dist.all_gather_into_tensor(gathered, torch.full((4,), float(rank + 1)).cuda())
root_value = torch.tensor([42.0 if rank == 0 else -1.0]).cuda()
dist.broadcast(root_value, src=0)
scattered = torch.empty(2, device="cuda")
dist.reduce_scatter_tensor(scattered, (torch.arange(2.0 * world) * (rank + 1)).cuda())
average = torch.tensor([float(rank)], dtype=torch.float32).cuda()
dist.all_reduce(average, op=dist.ReduceOp.AVG)
# Half-precision averages of values copied from the host (a value cast on the device would be a
# kernel's output, which the fakes do not compute).
halves = {}
for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
    half = torch.tensor([1.0 + rank, 2.5 - 2.375 * rank], dtype=dtype).cuda()
    dist.all_reduce(half, op=dist.ReduceOp.AVG)
    halves[name] = half.tolist()
maximum = torch.tensor([10 * rank + 7], dtype=torch.int64).cuda()
dist.all_reduce(maximum, op=dist.ReduceOp.MAX)

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 10)).cuda()
if (sys.argv[2] if len(sys.argv) > 2 else "ddp") == "fsdp":
    from torch.distributed.fsdp import fully_shard
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    ddp = fully_shard(model)
else:
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
data = torch.randn(64, 512, device="cuda")
target = torch.randint(0, 10, (64,), device="cuda")
steps = []
for _ in range(3):
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(ddp(data), target)
    loss.backward()
    optimizer.step()
    loss.item()
    torch.cuda.synchronize()
    steps.append((torch.cuda.memory_reserved(), used()))
dist.barrier()

s = torch.cuda.memory_stats()
result = {
    "rank": rank, "pid": os.getpid(), "device": torch.cuda.current_device(),
    "all_reduce": total.tolist(), "all_gather": gathered.tolist(),
    "broadcast": root_value.tolist(), "reduce_scatter": scattered.tolist(),
    "average": average.tolist(), "average_halves": halves, "maximum": maximum.tolist(), "steps": steps,
    "reserved_peak": s.get("reserved_bytes.all.peak", 0),
    "num_device_alloc": s.get("num_device_alloc", 0),
    "num_device_free": s.get("num_device_free", 0),
}
dist.destroy_process_group()
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as out:
    json.dump(result, out)

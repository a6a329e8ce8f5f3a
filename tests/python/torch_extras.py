"""Real PyTorch with the optional extras of scripts/fetch-torch.sh --extras (torchvision,
triton) on the fake GPU (tests/tests/fakegpu_torch.rs). One mode per run (argv[1]); prints one
JSON object as its last line: torch's figures and the fake driver's used bytes (total - free
from torch.cuda.mem_get_info)."""
import json
import os
import sys

import torch
from torch import nn


def used():
    free, total = torch.cuda.mem_get_info()
    return total - free


def stats():
    s = torch.cuda.memory_stats()
    return {key.replace(".all", "").replace(".", "_"): s.get(key, 0) for key in (
        "num_alloc_retries", "num_ooms", "reserved_bytes.all.peak", "allocated_bytes.all.peak",
        "reserved_bytes.all.current", "num_device_alloc", "num_device_free")}


def train(model, inputs, labels, steps):
    """`steps` training steps with SGD and momentum: after each torch's reserved bytes and the
    driver's used bytes."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    figures = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        loss.item()
        torch.cuda.synchronize()
        figures.append((torch.cuda.memory_reserved(), used()))
    return figures


def resnet50():
    """torchvision's ResNet-50 (25.6 M parameters), two training steps on 8 images of
    3x224x224."""
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda()
    images = torch.randn(8, 3, 224, 224, device="cuda")
    labels = torch.randint(0, 1000, (8,), device="cuda")
    steps = train(model, images, labels, 2)
    parameters = sum(p.numel() for p in model.parameters())
    print(json.dumps({"mode": "resnet50", "torchvision": torchvision.__version__,
                      "parameters": parameters, "steps": steps, **stats()}))


def compiled():
    """torch.compile (inductor, triton kernels) of a small MLP: two training steps; with the
    number of graphs dynamo compiled and of triton kernels inductor generated."""
    import triton
    from torch._dynamo.utils import counters
    from torch._inductor import metrics
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 10)).cuda()
    compiled_model = torch.compile(model)
    inputs = torch.randn(64, 512, device="cuda")
    labels = torch.randint(0, 10, (64,), device="cuda")
    steps = train(compiled_model, inputs, labels, 2)
    print(json.dumps({"mode": "compile", "triton": triton.__version__, "steps": steps,
                      "graphs": counters["stats"]["unique_graphs"],
                      "kernels": metrics.generated_kernel_count,
                      **stats()}))


{"resnet50": resnet50, "compile": compiled}[sys.argv[1]]()
# Leave without finalising the interpreter, as torch_cudnn.py does and for the same torch /
# CPython exit race (the autograd thread still dropping the last backward's state): CI saw
# the resnet50 mode end in "terminate called without an active exception" once, after its
# figures were printed.
sys.stdout.flush()
os._exit(0)

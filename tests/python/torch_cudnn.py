"""Real PyTorch convolutions through the fake cuDNN (tests/tests/fakegpu_torch.rs). One mode
per run (argv[1]); prints one JSON object as its last line: torch's figures and the fake
driver's used bytes (total - free from torch.cuda.mem_get_info)."""
import json
import os
import sys

import torch
from torch import nn

MiB = 1 << 20

from torch_figures import stats, used  # noqa: E402  (this folder is on sys.path)


def conv_workspace(benchmark=False):
    """One 3x3 convolution, 64 to 64 channels on a 128x128 image, fp32, no bias: the fake's
    first engine wants one image's im2col matrix as workspace, 64 x 3 x 3 x 128 x 128 x 4 bytes
    = 36 MiB, which torch allocates for the call and frees after it (with `benchmark`, also
    while it times the candidate plans)."""
    torch.backends.cudnn.benchmark = benchmark
    conv = nn.Conv2d(64, 64, 3, padding=1, bias=False).cuda()
    x = torch.empty(1, 64, 128, 128, device="cuda")
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with torch.no_grad():
        y = conv(x)
    torch.cuda.synchronize()
    print(json.dumps({"mode": "conv_workspace", "before": before,
                      "after": torch.cuda.memory_allocated(), "output": y.numel() * 4,
                      "reserved": torch.cuda.memory_reserved(), "used": used(), **stats()}))


class Block(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norm, a 1x1 projection where the
    shape changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet_steps(count):
    """A ResNet-18-like network (stem, two stages of two blocks) trained with Adam for `count`
    steps on 16 images of 3x112x112: after each step torch's reserved bytes and the driver's
    used bytes."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
        Block(64, 64, 1), Block(64, 64, 1), Block(64, 128, 2), Block(128, 128, 1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 1000)).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    images = torch.randn(16, 3, 112, 112, device="cuda")
    labels = torch.randint(0, 1000, (16,), device="cuda")
    steps = []
    for _ in range(count):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        loss.item()
        torch.cuda.synchronize()
        steps.append((torch.cuda.memory_reserved(), used()))
    return steps


def resnet():
    """Three ResNet training steps."""
    print(json.dumps({"mode": "resnet", "steps": resnet_steps(3), **stats()}))


def resnet_trace():
    """Two ResNet training steps under PyTorch's own memory history: its alloc /
    free_requested / free_completed / segment_alloc entries (action, address, size), for the
    tensors recorded beside it."""
    torch.cuda.memory._record_memory_history(max_entries=10_000_000)
    resnet_steps(2)
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    entries = [[e["action"], e["addr"], e["size"]] for e in snapshot["device_traces"][0]
               if e["action"] in ("alloc", "free_requested", "free_completed", "segment_alloc",
                                  "segment_free")]
    print(json.dumps({"mode": "resnet_trace", "entries": entries, **stats()}))


def fused_conv_add_relu():
    """torch's fused convolution + add + bias + ReLU (cuDNN 8's runtime fusion): its output
    shape."""
    x = torch.randn(2, 8, 16, 16, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    z = torch.randn(2, 8, 16, 16, device="cuda")
    bias = torch.randn(8, device="cuda")
    y = torch.cudnn_convolution_add_relu(x, w, z, 1.0, bias, [1, 1], [1, 1], [1, 1], 1)
    torch.cuda.synchronize()
    return list(y.shape)


def with_warnings(work):
    """Runs `work` with every warning recorded (on cuDNN 8 torch dlopens
    libcudnn_cnn_infer.so.8 at its first convolution and warns when it cannot): what it
    returned, the warnings, and the libcudnn files mapped afterwards."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = work()
    with open("/proc/self/maps") as maps:
        mapped = sorted({line.split()[-1] for line in maps if "/libcudnn" in line})
    return result, {"warnings": [str(c.message) for c in caught], "mapped": mapped}


def fused():
    """The fused convolution alone."""
    shape, seen = with_warnings(fused_conv_add_relu)
    print(json.dumps({"mode": "fused", "fused": shape, **seen, **stats()}))


def resnet_fused():
    """Three ResNet training steps, then the fused convolution."""
    (steps, shape), seen = with_warnings(lambda: (resnet_steps(3), fused_conv_add_relu()))
    print(json.dumps({"mode": "resnet_fused", "steps": steps, "fused": shape, **seen,
                      **stats()}))


def attention():
    """Scaled dot-product attention forward and backward through cuDNN only."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q = torch.randn(4, 8, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        out = nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        out.sum().backward()
    torch.cuda.synchronize()
    print(json.dumps({"mode": "attention", "shape": list(out.shape),
                      "grad": list(q.grad.shape), **stats()}), flush=True)


{"conv_workspace": conv_workspace,
 "conv_workspace_benchmark": lambda: conv_workspace(benchmark=True), "resnet": resnet, "resnet_trace": resnet_trace,
 "attention": attention, "fused": fused, "resnet_fused": resnet_fused}[sys.argv[1]]()
# Every mode leaves without finalising the interpreter: otherwise the autograd thread may still
# be dropping the last backward's GraphTask, whose thread-local state holds a Python object;
# its decref then meets the finalising interpreter, which ends the thread with pthread_exit
# inside a noexcept destructor: std::terminate, exit 134. A race in torch and CPython (gdb:
# PyThread_exit_thread under ~ThreadLocalState on pt_autograd_0): in the attention mode 3 runs
# in 6 with the fakes alone, no recorder; in the resnet mode 1 run in 8 and 1 in 16 under the
# recorder once the fake cuBLAS and cuDNN took their handles' memory (0 in 16 before: the
# race's timing). The recorder flushes its log on _exit as on exit.
sys.stdout.flush()
os._exit(0)

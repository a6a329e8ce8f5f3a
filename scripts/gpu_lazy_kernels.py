#!/usr/bin/env python3
"""Device memory outside PyTorch's allocator, workload by workload, on a real GPU.

    python3 scripts/gpu_lazy_kernels.py mlp,transformer,inference,resnet

Runs tests/python/torch_judge.py's workloads in one process and prints one JSON line: after the
context and a first kernel (torch.zeros), then after each workload, the device's used bytes
(cudaMemGetInfo's total - free), torch's reserved bytes and their difference ("outside": the
CUDA context, the kernels loaded so far, the libraries' own handles and workspaces). With
CUDA's default lazy loading a kernel's module takes memory at its first launch, which no hook
sees; the growth of "outside" beyond the libraries' recorded handles is that memory
(docs/gpus.md). CUDA_MODULE_LOADING=EAGER shows the other extreme.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests", "python"))
import torch  # noqa: E402
import torch_judge  # noqa: E402  (the workloads)


def used():
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free


def main():
    torch.zeros(1, device="cuda")
    rows = [("context and first kernel", used(), torch.cuda.memory_reserved())]
    for name in sys.argv[1].split(","):
        getattr(torch_judge, name)()
        rows.append((name, used(), torch.cuda.memory_reserved()))
    print(json.dumps({
        "module_loading": os.environ.get("CUDA_MODULE_LOADING") or "(default: lazy)",
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
        "rows": [{"after": step, "used": u, "reserved": r, "outside": u - r}
                 for step, u, r in rows]}))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What a real card and NVIDIA's libraries take, for the fake GPU's figures (docs/gpus.md).

Run on a machine with a GPU, under the recorder so that each library's own allocations are in
the log between marks:

    vramshim run -o probe.%p.vlog -- python3 scripts/gpu_probe.py [driver]

With `driver` it measures the context alone: cuInit, the primary context made current, then
cuMemGetInfo (no PyTorch, no library, no kernel loaded). Without it, PyTorch steps, each after
a `vramshim.mark` of its name: the context (torch.cuda.init), a first tensor, cuBLAS (a first
matmul, then a matmul on a second thread, which gets its own handle), cuBLASLt (addmm with a
bias in bf16), cuDNN (a 3x3 convolution forward and backward), NCCL (a one-rank process group
and an all_reduce). After each step it prints one JSON line: the driver's used bytes
(total - free), PyTorch's reserved and allocated bytes, and used - reserved (memory outside
PyTorch's allocator: the context, libraries' own allocations, loaded kernels).
"""
import ctypes
import json
import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
import vramshim  # noqa: E402  (the repository's package: marks in the log)


def driver_only():
    cuda = ctypes.CDLL("libcuda.so.1")
    device, context = ctypes.c_int(), ctypes.c_void_p()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    for what, rc in (
        ("cuInit", lambda: cuda.cuInit(0)),
        ("cuDeviceGet", lambda: cuda.cuDeviceGet(ctypes.byref(device), 0)),
        ("cuDevicePrimaryCtxRetain",
         lambda: cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)),
        ("cuCtxSetCurrent", lambda: cuda.cuCtxSetCurrent(context)),
        ("cuMemGetInfo_v2", lambda: cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))),
    ):
        code = rc()
        if code != 0:
            raise SystemExit(f"gpu_probe: {what} returned {code}")
    name = ctypes.create_string_buffer(256)
    cuda.cuDeviceGetName(name, 256, device)
    print(json.dumps({"step": "driver context", "name": name.value.decode(),
                      "total": total.value, "used": total.value - free.value}), flush=True)


def torch_steps():
    import torch

    def report(step, **extra):
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        reserved = torch.cuda.memory_reserved()
        print(json.dumps({"step": step, "used": total - free, "reserved": reserved,
                          "allocated": torch.cuda.memory_allocated(),
                          "outside": total - free - reserved, **extra}), flush=True)

    def step(name):
        vramshim.mark(name)
        return name

    versions = {}
    try:
        from importlib import metadata
        for dist in metadata.distributions():
            name = dist.metadata["Name"] or ""
            if name.startswith("nvidia-"):
                versions[name] = dist.version
    except Exception as error:
        versions["error"] = repr(error)
    props = torch.cuda.get_device_properties(0)
    report(step("context"), name=props.name, total_global_mem=props.total_memory,
           cc=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
           torch=torch.__version__, cuda=torch.version.cuda,
           cudnn=torch.backends.cudnn.version(), packages=versions,
           module_loading=os.environ.get("CUDA_MODULE_LOADING"))
    name = step("first tensor")
    x = torch.ones(1024, 1024, device="cuda")
    report(name)
    name = step("cublas matmul")
    y = x @ x
    report(name)
    name = step("cublas second thread")
    out = []
    worker = threading.Thread(target=lambda: out.append(x @ x), name="second")
    worker.start()
    worker.join()
    report(name)
    name = step("cublaslt addmm bf16")
    w = torch.ones(1024, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
    z = torch.nn.functional.linear(w, w, b)
    report(name)
    name = step("cudnn conv")
    torch.backends.cudnn.benchmark = False
    conv = torch.nn.Conv2d(64, 64, 3, padding=1, bias=False).cuda()
    image = torch.ones(1, 64, 128, 128, device="cuda", requires_grad=True)
    conv(image).sum().backward()
    report(name)
    name = step("nccl one rank")
    try:
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
        t = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(t)
        report(name, nccl=".".join(map(str, torch.cuda.nccl.version())))
        dist.destroy_process_group()
    except Exception as error:  # the probe goes on: the other figures stand
        print(json.dumps({"step": name, "error": repr(error)}), flush=True)
    del x, y, z, out, w, b, conv, image


if __name__ == "__main__":
    driver_only() if sys.argv[1:] == ["driver"] else torch_steps()

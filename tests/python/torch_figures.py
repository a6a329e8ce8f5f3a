"""torch's memory figures as the cuDNN scripts print them (torch_cudnn.py, torch_rnn.py)."""
import torch


def used():
    """The device's used bytes: total - free, as the driver says (cudaMemGetInfo)."""
    free, total = torch.cuda.mem_get_info()
    return total - free


def stats():
    s = torch.cuda.memory_stats()
    # Torch 2.2 and older count no num_device_alloc/free: their segment counters are the same
    # cudaMalloc/cudaFree counts (every segment is one cudaMalloc without expandable segments).
    s.setdefault("num_device_alloc", s["segment.all.allocated"])
    s.setdefault("num_device_free", s["segment.all.freed"])
    return {key.replace(".all", "").replace(".", "_"): s.get(key, 0) for key in (
        "num_alloc_retries", "num_ooms", "reserved_bytes.all.peak", "allocated_bytes.all.peak",
        "reserved_bytes.all.current", "num_device_alloc", "num_device_free")}

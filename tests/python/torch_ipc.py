"""A CUDA tensor sent between processes by torch.multiprocessing (spawn) on the fake GPU.

The producer fills a tensor with known values and puts it, and a view at an offset into the
same storage, on a queue; the consumer (a spawned process: torch's CUDA IPC opens the
producer's memory handle and event handle) reads both, writes new values through the view,
and says what it saw; the producer then reads its own tensor back. The last line printed is
one JSON object with what each side saw and both sides' memory figures.
"""

import json
import queue
import sys
import time

import torch
import torch.multiprocessing as mp

N = 1 << 18  # float32 elements: 1 MiB


def consumer(tensors, replies):
    try:
        received(tensors, replies)
    except Exception as error:  # said to the producer, which prints it: no 60 s wait
        replies.put({"error": repr(error)})
        raise


def received(tensors, replies):
    tensor, view = tensors.get()
    seen = {
        "pid": __import__("os").getpid(),
        "sum": float(tensor.cpu().double().sum()),
        "first": tensor[:4].cpu().tolist(),
        "view_first": view[:2].cpu().tolist(),
        "device": str(tensor.device),
        "allocated": torch.cuda.memory_allocated(),
        "reserved": torch.cuda.memory_reserved(),
        "free": torch.cuda.mem_get_info()[0],
    }
    # Kernels compute nothing on the fake GPU: the new values are copied in from the host.
    view.copy_(torch.full((view.numel(),), -2.5))
    tensor[:3].copy_(torch.tensor([10.0, 20.0, 30.0]))
    torch.cuda.synchronize()
    del tensor, view
    replies.put(seen)


def reply(replies, worker):
    """The consumer's answer, or what became of it when it died without one."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            return replies.get(timeout=0.5)
        except queue.Empty:
            if not worker.is_alive():
                return {"error": f"the consumer exited with {worker.exitcode}"}
    return {"error": "no answer from the consumer in 120 s"}


def main():
    mp.set_start_method("spawn")
    tensors, replies = mp.Queue(), mp.Queue()
    tensor = torch.arange(N, dtype=torch.float32, device="cuda")
    tensor.copy_(torch.arange(N, dtype=torch.float32))  # kernels do nothing: real values
    view = tensor[1000:1010]
    free_before = torch.cuda.mem_get_info()[0]
    worker = mp.Process(target=consumer, args=(tensors, replies))
    worker.start()
    tensors.put((tensor, view))
    seen = reply(replies, worker)
    worker.join(timeout=60)
    back = tensor.cpu()
    print(
        json.dumps(
            {
                "consumer": seen,
                "exitcode": worker.exitcode,
                "producer_first": back[:4].tolist(),
                "producer_view": back[998:1012].tolist(),
                "producer_sum": float(back.double().sum()),
                "producer_allocated": torch.cuda.memory_allocated(),
                "producer_free_before": free_before,
                "producer_free_after": torch.cuda.mem_get_info()[0],
            }
        )
    )


if __name__ == "__main__":
    sys.exit(main())

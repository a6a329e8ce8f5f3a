"""A known MLP trained with Adam on the fake GPU (tests/tests/breakdown.rs): prints, as its
last line, the parameter bytes (sum of numel x element size) that `vramshim breakdown` must
find, the bytes of the ReLU outputs autograd saves for backward in one step, and the steps
run."""
import gc
import json
import os
import sys

import torch


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10)).cuda()
    saved = []
    for layer in model:
        if isinstance(layer, torch.nn.ReLU):
            layer.register_forward_hook(
                lambda _m, _i, out: saved.append(out.numel() * out.element_size()))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.randn(256, 512, device="cuda")
    target = torch.randint(0, 10, (256,), device="cuda")
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        loss.item()
    torch.cuda.synchronize()
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    # The caching allocator's blocks: each request rounded up to 512 bytes (kMinBlockSize).
    blocks = sum(-(-p.numel() * p.element_size() // 512) * 512 for p in model.parameters())
    print(json.dumps({"parameter_bytes": parameters, "parameter_block_bytes": blocks,
                      "parameters": len(list(model.parameters())),
                      "relu_saved_bytes": sum(saved) // steps,
                      "steps": steps}), flush=True)


if __name__ == "__main__":
    main()
    # main's tensors are freed by now (its frame is gone; collect any cycle); leave without
    # finalising the interpreter, as tests/python/torch_cudnn.py does and for its reason: the
    # autograd thread may still be dropping the last backward's GraphTask, whose decref then
    # meets the finalising interpreter and ends in std::terminate (exit 134, seen once in CI in
    # the no-caching run). The recorder flushes its log on _exit as on exit.
    gc.collect()
    torch.cuda.synchronize()
    sys.stdout.flush()
    os._exit(0)

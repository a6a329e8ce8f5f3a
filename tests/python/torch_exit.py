"""A script that ends right after its last backward, with no synchronize and no I/O between
(tests/tests/fakegpu_torch.rs): on the fake GPU, where kernels take no time, torch 2.15's
autograd worker may still be letting go of the graph task when the interpreter finalizes,
unless the fake driver's exit grace (fakegpu/src/cuda/python_exit.c) gave it time. Prints, as
its last line, the atexit callbacks registered before and after CUDA's initialisation."""
import atexit
import json

import torch

before = atexit._ncallbacks()
layer = torch.nn.Linear(64, 64).cuda()
after = atexit._ncallbacks()
x = torch.randn(8, 64, device="cuda")
print(json.dumps({"atexit_before": before, "atexit_after": after}), flush=True)
layer(x).sum().backward()

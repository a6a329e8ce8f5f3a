"""Real PyTorch recurrent networks through cuDNN's RNN API (tests/tests/fakegpu_torch.rs; the
same script on a real GPU: scripts/gpu_rnn_probe.sh). One mode per run (argv[1]); prints one
JSON object as its last line: torch's figures and the driver's used bytes (total - free from
torch.cuda.mem_get_info)."""
import json
import sys

import torch
from torch import nn

from torch_figures import stats, used  # this folder is on sys.path


# A two-layer LSTM with dropout between its layers, batch first: 8 sequences of 100 steps of
# 256 features, hidden state 512.
BATCH, STEPS, FEATURES, HIDDEN, LAYERS, DROPOUT = 8, 100, 256, 512, 2, 0.25
CUDNN_LSTM = 2


def one_forward(model, x):
    """One training forward through torch's cuDNN RNN op itself (as nn.LSTM calls it): the
    sizes torch allocated during it, in order (its caching allocator's blocks, under its own
    memory history), and the reserve space it returned for the backward."""
    weights = model._flat_weights
    # The flat weight buffer that flatten_parameters made and the parameters view.
    storage = weights[0].untyped_storage()
    buffer = torch.empty(0, device="cuda").set_(storage, 0, (storage.nbytes() // 4,), (1,))
    hx = torch.zeros(LAYERS, BATCH, HIDDEN, device="cuda")
    cx = torch.zeros(LAYERS, BATCH, HIDDEN, device="cuda")
    state = torch._cudnn_init_dropout_state(DROPOUT, True, 0, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    with torch.no_grad():
        output, hy, cy, reserve, _ = torch._cudnn_rnn(
            x, weights, 4, buffer, hx, cx, CUDNN_LSTM, HIDDEN, 0, LAYERS, True, DROPOUT, True,
            False, [], state)
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    allocations = [e["size"] for e in snapshot["device_traces"][0] if e["action"] == "alloc"]
    return {"allocations": allocations, "reserve": reserve.numel(),
            "dropout_state": state.numel(), "output": list(output.shape)}


def lstm():
    """The LSTM's weight buffer against its parameters, one forward's allocations, then three
    training steps with SGD: after each, torch's reserved bytes and the driver's used bytes."""
    torch.manual_seed(0)
    model = nn.LSTM(FEATURES, HIDDEN, num_layers=LAYERS, dropout=DROPOUT, batch_first=True)
    model = model.cuda()
    parameters = sum(p.numel() for p in model.parameters())
    weight_bytes = model._flat_weights[0].untyped_storage().nbytes()
    x = torch.randn(BATCH, STEPS, FEATURES, device="cuda")
    forward = one_forward(model, x)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = []
    for _ in range(3):
        optimizer.zero_grad(set_to_none=True)
        output, _ = model(x)
        output.square().mean().backward()
        optimizer.step()
        torch.cuda.synchronize()
        steps.append((torch.cuda.memory_reserved(), used()))
    print(json.dumps({"mode": "lstm", "parameters": parameters, "weight_bytes": weight_bytes,
                      **forward, "steps": steps, **stats()}))


def variants():
    """Other recurrent networks through cuDNN: a bidirectional GRU, a 3-layer ReLU RNN, an LSTM
    with a projection and dropout, a half-precision LSTM. Each trains one step on 4 sequences
    of 20 steps, runs in eval mode, then on a packed batch of lengths 20, 15, 10, 5: its
    parameter count, its weight buffer's bytes and the packed output's shape."""
    torch.manual_seed(0)
    networks = [("gru", nn.GRU(64, 128, 2, bidirectional=True)),
                ("relu", nn.RNN(32, 64, 3, nonlinearity="relu")),
                ("lstm_projection", nn.LSTM(64, 128, 2, proj_size=32, dropout=0.1)),
                ("lstm_half", nn.LSTM(64, 128).half())]
    results = {}
    for name, model in networks:
        model = model.cuda()
        dtype = next(model.parameters()).dtype
        x = torch.randn(20, 4, model.input_size, device="cuda", dtype=dtype)
        output, _ = model(x)
        output.float().square().mean().backward()
        model.eval()
        with torch.no_grad():
            model(x)
        model.train()
        packed = nn.utils.rnn.pack_padded_sequence(x, [20, 15, 10, 5])
        output, _ = model(packed)
        torch.cuda.synchronize()
        results[name] = {"parameters": sum(p.numel() for p in model.parameters()),
                         "weight_bytes": model._flat_weights[0].untyped_storage().nbytes(),
                         "packed_output": list(output.data.shape)}
    print(json.dumps({"mode": "variants", "networks": results, **stats()}))


# CTC: 64 steps, 16 sequences, 32 classes (blank 0), labels of 12: every block a multiple of
# 512 bytes but the costs'.
CTC_STEPS, CTC_BATCH, CTC_CLASSES, CTC_LABEL = 64, 16, 32, 12


def ctc():
    """CTC loss through cuDNN (blank 0, int32 targets, every input length the same): torch's
    two paths, lengths as lists with the targets on the host (cudnnCTCLoss) and lengths and
    targets on the device (cudnnCTCLoss_v8). Each: whether torch picks cuDNN, the sizes its op
    allocated, in order (torch's memory history), then F.ctc_loss and its backward."""
    torch.manual_seed(0)
    steps, batch = CTC_STEPS, CTC_BATCH
    log_probs = torch.randn(steps, batch, CTC_CLASSES, device="cuda").log_softmax(2)
    targets = torch.randint(1, CTC_CLASSES, (batch * CTC_LABEL,), dtype=torch.int32)
    lengths = ([steps] * batch, [CTC_LABEL] * batch)

    def on_device(value):
        # Copied from the host, not filled by a kernel: a copy carries its values on the fake
        # GPU, where kernels compute nothing (torch reads the lengths back).
        return torch.tensor([value] * batch, dtype=torch.int32).cuda()

    paths = {}
    for name, args in (("host", (targets, *lengths)),
                       ("device", (targets.cuda(), on_device(steps), on_device(CTC_LABEL)))):
        chosen = torch._use_cudnn_ctc_loss(log_probs, *args, 0)
        allocations = None  # torch's own kernels (torch 2.4 keeps device targets off cuDNN)
        if chosen:
            torch.cuda.synchronize()
            torch.cuda.memory._record_memory_history(max_entries=100_000)
            costs, grad = torch._cudnn_ctc_loss(log_probs, *args, 0, True, False)
            torch.cuda.synchronize()
            snapshot = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            allocations = [e["size"] for e in snapshot["device_traces"][0]
                           if e["action"] == "alloc"]
            del costs, grad
        x = log_probs.detach().requires_grad_()
        torch.nn.functional.ctc_loss(x, *args, reduction="sum").backward()
        torch.cuda.synchronize()
        paths[name] = {"cudnn": chosen, "allocations": allocations,
                       "grad": list(x.grad.shape)}
    print(json.dumps({"mode": "ctc", "paths": paths, **stats()}))


{"lstm": lstm, "variants": variants, "ctc": ctc}[sys.argv[1]]()

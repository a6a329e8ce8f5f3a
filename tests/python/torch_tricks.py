"""Memory tricks as pairs of workloads on the fake GPU (tests/tests/tricks.rs): a small MLP
trained with Adam for a few steps, each step followed by an evaluation batch. The mode says
which variant runs:

  item        evaluation loss summed with `.item()` under `torch.no_grad()` (the tricks on)
  leak        `val_total += criterion(model(x), y)`: every evaluation graph stays alive
  grad_eval   evaluation without `torch.no_grad()` (its activations are saved, then dropped)
  checkpoint  the hidden block under `torch.utils.checkpoint`
  inplace     `ReLU(inplace=True)`
  autocast    the training forward under `torch.autocast` (bfloat16)
  eval_leak   no training: an evaluation loop summing `criterion(...)` (graphs kept)
  eval_item   no training: the same loop summing `.item()`
  eval_sequential  as eval_leak, the model a plain `nn.Sequential` (below)
  train       training alone, no evaluation: nothing allocated after the last optimizer step;
              the model a plain `nn.Sequential` of Linear and ReLU layers, whose Linear layers
              allocate from one stack (a call's first stack comes again within each call)
  accumulate  gradient accumulation: each step's batch as MICRO_BATCHES micro-batches, each
              loss scaled and back-propagated before the next forward
  release     as `item`, and with `probe`, `del` of the data and `torch.cuda.empty_cache()`
              before the probe
  lines       no model: a loop of lines whose allocations torch measures one by one (for
              `vramshim lines`); prints, per line, what each execution added to
              `memory_allocated()` and the peak above it within the line

Prints, as its last line, torch's own figures: parameter bytes, `memory_allocated()` at the
end of each step (after `optimizer.step()`), `max_memory_allocated()` and
`max_memory_reserved()`, with a third argument `probe`, at the end, at a block allocated to be the peak:
allocated, reserved, the device's used memory and the bytes of segments with no tensor in
them (torch's snapshot)."""
import json
import sys

import torch
import torch.utils.checkpoint

PROBE_BYTES = 512 << 20
# Activations large beside cuBLAS's 2 x 64 MiB handles and its 32 MiB workspace.
BATCH = 8192
WIDTH = 1024
MICRO_BATCHES = 4
# The `lines` mode's tensors: distinct sizes, each a multiple of torch's 512-byte rounding.
KEPT_BYTES = 2 << 20
PAIR_BYTES = 3 << 20
SCRATCH_BYTES = 5 << 20
AFTER_BYTES = 1 << 20


def lines_mode(steps):
    """Each line below runs once per step; between two executions of one line the others
    allocate. The scratch tensor is dropped after the next line has allocated."""
    kept = []
    figures = {"kept": [], "pair": [], "scratch": [], "after": []}

    def measure(name, before):
        torch.cuda.synchronize()
        figures[name].append({"added": torch.cuda.memory_allocated() - before,
                              "peak_above": torch.cuda.max_memory_allocated() - before})

    for _ in range(steps):
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        kept.append(torch.empty(KEPT_BYTES // 4, device="cuda"))
        measure("kept", before)
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        kept.append(torch.ones(PAIR_BYTES // 4, device="cuda") * 2)
        measure("pair", before)
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        scratch = torch.ones(SCRATCH_BYTES // 4, device="cuda")
        measure("scratch", before)
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        kept.append(torch.zeros(AFTER_BYTES // 4, device="cuda"))
        measure("after", before)
        del scratch
    # One more line allocates: it ends the loop's last execution (`vramshim lines` takes a
    # line's execution as over when its thread allocates on another line; frees before that,
    # at exit too, would count as the last execution's own).
    done = torch.empty(128, device="cuda")
    del done
    print(json.dumps({"mode": "lines", "steps": steps, "lines": figures}), flush=True)


class Net(torch.nn.Module):
    def __init__(self, inplace, checkpoint):
        super().__init__()
        self.checkpoint = checkpoint
        self.first = torch.nn.Linear(256, WIDTH)
        self.hidden = torch.nn.Sequential(
            torch.nn.ReLU(inplace=inplace), torch.nn.Linear(WIDTH, WIDTH),
            torch.nn.ReLU(inplace=inplace), torch.nn.Linear(WIDTH, WIDTH),
            torch.nn.ReLU(inplace=inplace))
        self.last = torch.nn.Linear(WIDTH, 10)

    def forward(self, x):
        x = self.first(x)
        if self.checkpoint:
            x = torch.utils.checkpoint.checkpoint(self.hidden, x, use_reentrant=False)
        else:
            x = self.hidden(x)
        return self.last(x)


def main():
    mode = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    probe = len(sys.argv) > 3 and sys.argv[3] == "probe"
    if mode == "lines":
        lines_mode(steps)
        return
    torch.manual_seed(0)
    if mode in ("train", "eval_sequential"):
        model = torch.nn.Sequential(
            torch.nn.Linear(256, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH),
            torch.nn.ReLU(), torch.nn.Linear(WIDTH, 10)).cuda()
    else:
        model = Net(mode == "inplace", mode == "checkpoint").cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = torch.nn.CrossEntropyLoss()
    data = torch.randn(BATCH, 256, device="cuda")
    target = torch.randint(0, 10, (BATCH,), device="cuda")
    val_data = torch.randn(BATCH, 256, device="cuda")
    val_target = torch.randint(0, 10, (BATCH,), device="cuda")
    val_total = 0.0
    # Bytes of each ReLU output in a forward pass with autograd on (numel x element size):
    # what `inplace=True` does not allocate. The last training forward's.
    relu_outputs = []

    def relu_output(module, inputs, output):
        if torch.is_grad_enabled():
            relu_outputs.append(output.numel() * output.element_size())

    for module in model.modules():
        if isinstance(module, torch.nn.ReLU):
            module.register_forward_hook(relu_output)
    step_ends = []
    eval_kept = []
    forward_kept = []
    # Torch's highest allocated bytes within each training forward and each evaluation
    # forward (its peak counter reset before each; the run's peak kept across the resets).
    forward_peak = []
    eval_peak = []
    run_peak = [0]

    def reset_peak():
        run_peak[0] = max(run_peak[0], torch.cuda.max_memory_allocated())
        torch.cuda.reset_peak_memory_stats()
    if mode in ("eval_leak", "eval_item", "eval_sequential"):
        # An evaluation loop alone: no optimizer, so steps are the model's calls.
        for _ in range(steps):
            torch.cuda.synchronize()
            step_ends.append(torch.cuda.memory_allocated())
            if mode in ("eval_leak", "eval_sequential"):
                val_total += criterion(model(val_data), val_target)
            else:
                val_total += criterion(model(val_data), val_target).item()
        print(json.dumps({"mode": mode, "steps": steps, "step_end_allocated": step_ends}),
              flush=True)
        return
    if mode == "train":
        # Training alone, nothing allocated after the last optimizer step: the log ends
        # within the last step. Live bytes at each step's end once its gradients are gone
        # (where the next step's forward begins), and torch's highest allocated bytes per
        # step, its counter reset there (where vramshim's steps begin) and read at the end.
        step_peaks = []
        for index in range(steps):
            optimizer.zero_grad()
            if index:
                step_ends.append(torch.cuda.memory_allocated())
                step_peaks.append(torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
            criterion(model(data), target).backward()
            optimizer.step()
        torch.cuda.synchronize()
        step_peaks.append(torch.cuda.max_memory_allocated())
        print(json.dumps({"mode": mode, "steps": steps, "step_end_allocated": step_ends,
                          "step_peak_allocated": step_peaks}), flush=True)
        return
    for _ in range(steps):
        optimizer.zero_grad()
        relu_outputs.clear()
        if mode == "accumulate":
            micro = BATCH // MICRO_BATCHES
            for index in range(MICRO_BATCHES):
                part = slice(index * micro, (index + 1) * micro)
                before = torch.cuda.memory_allocated()
                loss = criterion(model(data[part]), target[part]) / MICRO_BATCHES
                forward_kept.append(torch.cuda.memory_allocated() - before)
                loss.backward()
        else:
            reset_peak()
            before = torch.cuda.memory_allocated()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "autocast"):
                loss = criterion(model(data), target)
            forward_kept.append(torch.cuda.memory_allocated() - before)
            forward_peak.append(torch.cuda.max_memory_allocated())
            loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
        step_ends.append(torch.cuda.memory_allocated())
        if mode == "leak":
            val_total += criterion(model(val_data), val_target)
        elif mode == "grad_eval":
            reset_peak()
            before = torch.cuda.memory_allocated()
            out = criterion(model(val_data), val_target)
            eval_peak.append(torch.cuda.max_memory_allocated())
            eval_kept.append(torch.cuda.memory_allocated() - before)
            val_total += out.item()
            del out
        else:
            with torch.no_grad():
                reset_peak()
                before = torch.cuda.memory_allocated()
                out = criterion(model(val_data), val_target)
                eval_peak.append(torch.cuda.max_memory_allocated())
                eval_kept.append(torch.cuda.memory_allocated() - before)
                val_total += out.item()
                del out
    torch.cuda.synchronize()
    # The peak of allocated bytes, at a moment torch can be asked about: a block larger than
    # anything before, taken while the model, its gradients and Adam's state are live.
    at_probe = None
    if probe:
        # One small convolution: cuDNN's handle takes memory of its own.
        image = torch.randn(1, 3, 16, 16, device="cuda")
        torch.nn.functional.conv2d(image, torch.randn(4, 3, 3, 3, device="cuda"))
        torch.cuda.synchronize()
        del image
        if mode == "release":
            # What training needed and evaluation does not, and the cache given back.
            del data, target
            torch.cuda.empty_cache()
        block = torch.empty(PROBE_BYTES // 4, device="cuda")
        torch.cuda.synchronize()
        at_probe = {"allocated": torch.cuda.memory_allocated(),
                    "max_allocated": torch.cuda.max_memory_allocated(),
                    "reserved": torch.cuda.memory_reserved(),
                    # Segments with no tensor in them: what empty_cache() would give back.
                    "free_segments": sum(segment["total_size"]
                                         for segment in torch.cuda.memory_snapshot()
                                         if segment["allocated_size"] == 0),
                    "used": (lambda free, total: total - free)(*torch.cuda.mem_get_info())}
        del block
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    print(json.dumps({"mode": mode, "steps": steps, "parameter_bytes": parameters,
                      "step_end_allocated": step_ends, "at_probe": at_probe,
                      "eval_kept": eval_kept, "forward_kept": forward_kept,
                      "relu_output_bytes": relu_outputs, "forward_peak": forward_peak,
                      "eval_peak": eval_peak,
                      "max_allocated": max(run_peak[0], torch.cuda.max_memory_allocated()),
                      "max_reserved": torch.cuda.max_memory_reserved()}), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""GPU smoke test helper for scripts/gpu-smoke.sh (two jobs, one file).

Train (needs PyTorch and a GPU; run under `vramshim run`):

    python3 scripts/gpu_smoke.py --mode MODE

trains a small MLP on random data for a few steps (several hundred MiB of device memory) and
prints one JSON line with PyTorch's own memory figures. MODE names the allocator setting that
gpu-smoke.sh put in the environment before the start (PyTorch reads it at import time):

    default     no setting: the native caching allocator
    expandable  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    async       PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
    nocache     PYTORCH_NO_CUDA_MEMORY_CACHING=1

Replay (standard library only, no GPU):

    vramshim dump --json LOG | python3 scripts/gpu_smoke.py --replay --mode MODE \\
        --torch-json MODE.json [--reference-json default.json]

replays the log's events, computes the peak of live device bytes, compares it with PyTorch's
figure for that mode, prints one verdict line (PASS/FAIL) plus details, exits 1 on FAIL.

What the replay counts (device memory only):
  - alloc / free, matched by address (arrays: by handle); the free's own size is 0 in the log.
  - VMM physical memory: cuMemCreate adds the handle's size; it is given back when the handle
    is released *and* no mapping of it is left (the driver's rule).
  - VMM mapped bytes: cuMemMap adds its size, cuMemUnmap subtracts the mappings it removes.
  - Never counted: reserve / unreserve (address space only), pinned host memory (device -1),
    failed calls (result != 0; failed allocations are `alloc_failed` events), pool trims.
  Sums: "all" = allocations + VMM physical memory (each byte once); "pytorch" = only what
  PyTorch's allocator asks the driver for in this mode (below); "other" = all - pytorch when
  the mode is not expandable (cuBLAS's own default workspace from its static cudart shows up
  there as cuMemAlloc_v2: PyTorch's counters never see it, so it is kept out of the check).

What is compared, per mode (PyTorch's counters cover only its own allocator):
  default     log: live cudaMalloc bytes (one cudaMalloc per segment)
              torch: max_memory_reserved(); the segments ARE reserved memory: must be equal.
  expandable  log: mapped VMM bytes (cuMemMap - cuMemUnmap; physical bytes printed beside)
              torch: max_memory_reserved(), which grows by each chunk mapped; within 2%.
  async       log: live cudaMallocAsync bytes (one call per tensor)
              torch: max_memory_allocated(), which this backend takes from the default pool's
              cudaMemPoolAttrUsedMemHigh. The pool's reserved high watermark
              (max_memory_reserved() here, cudaMemPoolAttrReservedMemHigh) is printed but not
              compared: it includes memory the pool keeps after cudaFreeAsync and its chunk
              rounding, which no API call reveals. Within 2%.
  nocache     log: live cudaMalloc bytes (one cudaMalloc(exact size) per tensor storage)
              torch: PyTorch's counters stay 0 in this mode (the uncached path bypasses its
              statistics), so the figure is the *default* run's peak of requested bytes
              (memory_stats "requested_bytes.all.peak", else max_memory_allocated()): the same
              deterministic program, tensor for tensor. (Should a PyTorch version count in
              this mode, its own max_memory_allocated() is used.) Within 2%.
A mode also fails when its setting was not in effect (environment, allocator backend).
"""

import argparse
import json
import os
import sys

MODES = {
    # mode: (PYTORCH_CUDA_ALLOC_CONF, PYTORCH_NO_CUDA_MEMORY_CACHING)
    "default": (None, None),
    "expandable": ("expandable_segments:True", None),
    "async": ("backend:cudaMallocAsync", None),
    "nocache": (None, "1"),
}

TOLERANCE = 0.02
MIB = 1 << 20


def mib(n):
    return "%.2f MiB" % (n / MIB)


# ---------------------------------------------------------------------------------------------
# Training (PyTorch)


def check_env(mode):
    """Warnings when the environment does not hold the mode's setting."""
    conf, nocache = MODES[mode]
    seen_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")
    seen_nocache = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING")
    problems = []
    if (seen_conf or None) != conf:
        problems.append("PYTORCH_CUDA_ALLOC_CONF=%r, expected %r" % (seen_conf, conf))
    if (seen_nocache or None) != nocache:
        problems.append("PYTORCH_NO_CUDA_MEMORY_CACHING=%r, expected %r" % (seen_nocache, nocache))
    return problems


def pool_attributes(torch):
    """The default memory pool's reserved/used figures, asked of libcudart directly (ctypes).

    Only meaningful for the cudaMallocAsync backend; None where it cannot be asked."""
    import ctypes

    # cudaMemPoolAttr values (CUDA 11.2+): ReservedMemCurrent 5, ReservedMemHigh 6,
    # UsedMemCurrent 7, UsedMemHigh 8.
    attrs = {"reserved_current": 5, "reserved_high": 6, "used_current": 7, "used_high": 8}
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            # The libcudart PyTorch already loaded (dlopen finds it by soname).
            rt = ctypes.CDLL(name, mode=getattr(os, "RTLD_NOLOAD", 4) | ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        try:
            pool = ctypes.c_void_p()
            dev = torch.cuda.current_device()
            if rt.cudaDeviceGetDefaultMemPool(ctypes.byref(pool), ctypes.c_int(dev)) != 0:
                return None
            out = {"library": name}
            for key, attr in attrs.items():
                value = ctypes.c_uint64()
                if rt.cudaMemPoolGetAttribute(pool, ctypes.c_int(attr), ctypes.byref(value)) != 0:
                    return None
                out[key] = value.value
            return out
        except (AttributeError, OSError):
            return None
    return None


def make_model(torch, width, layers):
    """An MLP with its own forward, so that Python stacks have a model line to name."""

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(
                torch.nn.Linear(width, width, bias=False) for _ in range(layers))

        def forward(self, x):
            for layer in self.layers:
                x = torch.relu(layer(x))  # STACK-CHECK: forward
            return x

    return MLP()


def marker_line(marker):
    """The line of this file that carries `# STACK-CHECK: marker`."""
    with open(os.path.abspath(__file__)) as source:
        for number, line in enumerate(source, 1):
            if line.rstrip().endswith("# STACK-CHECK: " + marker):
                return number
    raise SystemExit("gpu_smoke.py: no STACK-CHECK marker %r" % marker)


def check_stacks(folded):
    """Checks `vramshim flamegraph --what allocated --folded --by-thread` of a training run:
    the model's forward line and the training loop's line that calls it are named, and
    backward-pass allocations are attributed to an autograd thread with a ...Backward0 frame.
    Prints one verdict line and details; returns True on PASS."""
    forward = "forward (gpu_smoke.py:%d)" % marker_line("forward")
    call = "train (gpu_smoke.py:%d)" % marker_line("call")
    forward_bytes = backward_bytes = total = 0
    autograd_threads = set()
    for line in folded:
        stack, _, weight = line.rstrip("\n").rpartition(" ")
        if not stack or not weight.isdigit():
            continue
        frames = stack.split(";")
        total += int(weight)
        # Python frames are named by qualified name ("MLP.forward"): match the tail.
        names_forward = any(f.endswith(forward) for f in frames)
        names_call = any(f.endswith(call) for f in frames)
        if names_forward and names_call:
            forward_bytes += int(weight)
        thread = next((f for f in frames if f.startswith("thread ")), "")
        if thread.startswith("thread pt_autograd") and any("Backward0" in f for f in frames):
            backward_bytes += int(weight)
            autograd_threads.add(thread)
    ok = forward_bytes > 0 and backward_bytes > 0
    print("%-10s forward %s, backward on %s: %s" % (
        "stacks", mib(forward_bytes), ", ".join(sorted(autograd_threads)) or "no autograd thread",
        "PASS" if ok else "FAIL"))
    print("           allocated in all: %s; looked for '%s' under '%s', and 'thread pt_autograd*'"
          " with a '...Backward0' frame" % (mib(total), forward, call))
    return ok


def train(mode, steps):
    problems = check_env(mode)
    for problem in problems:
        print("gpu_smoke.py: warning: %s" % problem, file=sys.stderr)

    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("gpu_smoke.py: torch.cuda.is_available() is False", file=sys.stderr)
        return 3

    torch.manual_seed(0)
    device = torch.device("cuda")
    # Sizes are multiples of 2 MiB so that every allocator's rounding stays out of the way:
    # weights 2048 x 2048 fp32 = 16 MiB, activations 1024 x 2048 fp32 = 8 MiB. Six layers:
    # 96 MiB of weights, 96 of gradients, 192 of Adam state, ~100 of activations.
    width, layers, batch = 2048, 6, 1024
    model = make_model(torch, width, layers).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    losses = []
    for _ in range(steps):
        x = torch.randn(batch, width, device=device)
        y = torch.randn(batch, width, device=device)
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)  # STACK-CHECK: call
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
        del x, y, loss
    torch.cuda.synchronize()

    stats = torch.cuda.memory_stats()
    keep = (
        "reserved_bytes.all.peak",
        "allocated_bytes.all.peak",
        "active_bytes.all.peak",
        "requested_bytes.all.peak",
        "num_device_alloc",
        "num_device_free",
        "num_alloc_retries",
        "num_ooms",
    )
    try:
        backend = torch.cuda.get_allocator_backend()
    except (AttributeError, RuntimeError):
        backend = None
    result = {
        "mode": mode,
        "pid": os.getpid(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(),
        "device": torch.cuda.current_device(),
        "backend": backend,
        "env_problems": problems,
        "steps": steps,
        "final_loss": losses[-1] if losses else None,
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "stats": {key: stats.get(key) for key in keep},
        "pool": pool_attributes(torch) if mode == "async" else None,
    }
    # Free everything and hand cached memory back (frees / unmaps / a pool trim in the log);
    # the peaks above are already taken.
    del model, optimizer
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# Replay (standard library only)


class Sums:
    """Running sums of live bytes per group, with each group's peak."""

    def __init__(self):
        self.current = {}
        self.peak = {}

    def add(self, groups, size):
        for group in groups:
            value = self.current.get(group, 0) + size
            self.current[group] = value
            if value > self.peak.get(group, 0):
                self.peak[group] = value

    def sub(self, groups, size):
        for group in groups:
            self.current[group] = self.current.get(group, 0) - size


def pytorch_api(mode, api):
    """Whether allocations made through `api` are PyTorch's allocator's in this mode."""
    if mode in ("default", "nocache"):
        return api == "cudaMalloc"
    if mode == "async":
        return api.startswith("cudaMalloc") and "Async" in api
    return False  # expandable: PyTorch's memory is counted from the VMM mappings


def replay(lines, mode):
    sums = Sums()
    live = {}  # ("a", addr) or ("h", handle) -> (size, groups)
    physical = {}  # VMM handle -> {"size", "released", "maps"}
    mappings = {}  # mapped address -> (size, handle)
    counts = {"events": 0, "unmatched_frees": 0, "unmatched_unmaps": 0, "failed_calls": 0,
              "damage": 0}
    other_by_api = {}
    vmm_physical_groups = ("all", "vmm_physical") + (() if mode == "expandable" else ("other",))
    vmm_mapped_groups = ("vmm_mapped", "pytorch") if mode == "expandable" else ("vmm_mapped",)

    def release_physical(handle):
        entry = physical.get(handle)
        if entry is not None and entry["released"] and entry["maps"] == 0:
            sums.sub(vmm_physical_groups, entry["size"])
            del physical[handle]

    header = None
    for line in lines:
        line = line.strip()
        if not line:
            continue
        rec = json.loads(line)
        kind = rec.get("type")
        if kind == "header":
            header = rec
            continue
        if kind == "damage":
            counts["damage"] += 1
            continue
        if kind != "event":
            continue
        counts["events"] += 1
        event, api = rec["event"], rec["api"]
        if rec["device"] == -1 or event in ("reserve", "unreserve", "trim", "alloc_failed"):
            continue
        if rec["result"] != 0:
            counts["failed_calls"] += 1
            continue
        addr, size, handle = rec["addr"], rec["size"], rec["handle"]
        if event == "alloc":
            key = ("a", addr) if addr else (("h", handle) if handle else None)
            if key is None:
                continue  # cudaMalloc(0) and the like: nothing obtained
            if pytorch_api(mode, api):
                groups = ("all", "pytorch")
            else:
                groups = ("all", "other")
                other_by_api[api] = other_by_api.get(api, 0) + 1
            old = live.pop(key, None)
            if old is not None:
                sums.sub(old[1], old[0])
            live[key] = (size, groups)
            sums.add(groups, size)
        elif event == "free":
            key = ("a", addr) if addr else ("h", handle)
            old = live.pop(key, None)
            if old is None:
                counts["unmatched_frees"] += 1
            else:
                sums.sub(old[1], old[0])
        elif event == "create":
            physical[handle] = {"size": size, "released": False, "maps": 0}
            sums.add(vmm_physical_groups, size)
        elif event == "release":
            entry = physical.get(handle)
            if entry is not None:
                entry["released"] = True
                release_physical(handle)
        elif event == "map":
            old = mappings.pop(addr, None)
            if old is not None:
                sums.sub(vmm_mapped_groups, old[0])
            mappings[addr] = (size, handle)
            sums.add(vmm_mapped_groups, size)
            if handle in physical:
                physical[handle]["maps"] += 1
        elif event == "unmap":
            end = addr + size
            gone = [start for start in mappings if addr <= start < end]
            if not gone:
                counts["unmatched_unmaps"] += 1
            for start in gone:
                msize, mhandle = mappings.pop(start)
                sums.sub(vmm_mapped_groups, msize)
                if mhandle in physical:
                    physical[mhandle]["maps"] -= 1
                    release_physical(mhandle)
    peaks = {g: sums.peak.get(g, 0) for g in ("all", "pytorch", "other", "vmm_physical",
                                                "vmm_mapped")}
    return {"header": header, "peaks": peaks, "counts": counts, "other_by_api": other_by_api}


def torch_figure(mode, figures, reference):
    """(bytes, description) of PyTorch's figure to compare with, or (None, why)."""
    if mode in ("default", "expandable"):
        return figures.get("max_memory_reserved"), "max_memory_reserved()"
    if mode == "async":
        return figures.get("max_memory_allocated"), "max_memory_allocated() = pool used high"
    # nocache: PyTorch's counters stay 0 here; should a version count, its own figure is used.
    if figures.get("max_memory_allocated"):
        return figures["max_memory_allocated"], "max_memory_allocated()"
    if not reference:
        return None, "no default-mode figures to compare with"
    requested = (reference.get("stats") or {}).get("requested_bytes.all.peak")
    if requested:
        return requested, "default run's requested_bytes.all.peak"
    return reference.get("max_memory_allocated"), "default run's max_memory_allocated()"


def load_json(path):
    """The last JSON object line of a file (the training script's result), or None."""
    if not path:
        return None
    try:
        with open(path) as f:
            found = None
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        found = json.loads(line)
                    except ValueError:
                        pass
            return found
    except OSError:
        return None


def check(mode, result, figures, reference):
    """Prints the verdict line and details; returns True for PASS."""
    peaks = result["peaks"]
    log_peak = peaks["pytorch"]
    figure, what = torch_figure(mode, figures, reference)
    problems = []
    if not figure:
        verdict, diff_text = "FAIL", "n/a"
        problems.append("no PyTorch figure (%s)" % what)
    else:
        diff = (log_peak - figure) / figure
        diff_text = "%+.3f%%" % (100 * diff)
        if mode == "default":
            ok = log_peak == figure
        else:
            ok = abs(diff) <= TOLERANCE
        verdict = "PASS" if ok else "FAIL"
    if result["counts"]["damage"]:
        problems.append("log damaged (%d)" % result["counts"]["damage"])
        verdict = "FAIL"
    details = [
        "log peaks: all device memory %s; PyTorch allocator's %s; other %s"
        % (mib(peaks["all"]), mib(peaks["pytorch"]), mib(peaks["other"])),
    ]
    if figure:
        details.append("in bytes: log %d, torch %d, log - torch = %+d"
                       % (log_peak, figure, log_peak - figure))
    if peaks["vmm_mapped"] or peaks["vmm_physical"]:
        details.append("VMM: mapped peak %s, physical (cuMemCreate until released and unmapped)"
                       " peak %s" % (mib(peaks["vmm_mapped"]), mib(peaks["vmm_physical"])))
    if result["other_by_api"]:
        details.append("allocations outside PyTorch's allocator, by api: %s" % ", ".join(
            "%s %d" % item for item in sorted(result["other_by_api"].items())))
    if mode == "async":
        pool = figures.get("pool") or {}
        details.append("pool reserved high (not compared): %s; pool used high via ctypes: %s"
                       % (mib(figures.get("max_memory_reserved") or 0),
                          mib(pool["used_high"]) if "used_high" in pool else "n/a"))
    if mode == "nocache":
        details.append("this run's own counters: max_memory_reserved %s, max_memory_allocated %s"
                       " (0 expected: the uncached path keeps no statistics)"
                       % (mib(figures.get("max_memory_reserved") or 0),
                          mib(figures.get("max_memory_allocated") or 0)))
    counts = result["counts"]
    details.append("events %d; failed calls %d; frees of unknown addresses %d; unmaps of"
                   " unknown ranges %d" % (counts["events"], counts["failed_calls"],
                                           counts["unmatched_frees"], counts["unmatched_unmaps"]))
    if figures.get("backend"):
        details.append("torch %s, allocator backend %s" % (figures.get("torch"),
                                                           figures.get("backend")))
    # The run must have tested what its mode says.
    problems += figures.get("env_problems") or []
    backend = figures.get("backend")
    if backend is not None and backend != ("cudaMallocAsync" if mode == "async" else "native"):
        problems.append("allocator backend is %r" % backend)
    if problems:
        verdict = "FAIL"
    header = result["header"] or {}
    env = header.get("env") or {}
    details.append("log header: PYTORCH_CUDA_ALLOC_CONF=%s PYTORCH_NO_CUDA_MEMORY_CACHING=%s"
                   % (env.get("PYTORCH_CUDA_ALLOC_CONF"), env.get("PYTORCH_NO_CUDA_MEMORY_CACHING")))
    rule = "equal" if mode == "default" else "within 2%"
    print("%-10s %14s %14s %10s  %s  (%s, %s)" % (
        mode, mib(log_peak), mib(figure) if figure else "n/a", diff_text, verdict, what, rule))
    for line in details:
        print("           " + line)
    for problem in problems:
        print("           problem: " + problem)
    return verdict == "PASS"


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", required=True, choices=sorted(MODES))
    parser.add_argument("--steps", type=int, default=5, help="training steps (train)")
    parser.add_argument("--replay", action="store_true",
                        help="replay `vramshim dump --json` from stdin and compare")
    parser.add_argument("--torch-json", help="the training run's JSON line (replay)")
    parser.add_argument("--reference-json", help="the default run's JSON line (replay, nocache)")
    parser.add_argument("--peaks-only", action="store_true",
                        help="replay: print the computed peaks as JSON, compare nothing")
    parser.add_argument("--check-stacks", action="store_true",
                        help="read folded stacks (flamegraph --what allocated --folded "
                             "--by-thread) from stdin and check the Python and autograd frames")
    args = parser.parse_args(argv)
    if args.check_stacks:
        return 0 if check_stacks(sys.stdin) else 1
    if not args.replay:
        return train(args.mode, args.steps)
    result = replay(sys.stdin, args.mode)
    if args.peaks_only:
        print(json.dumps({"peaks": result["peaks"], "counts": result["counts"],
                          "other_by_api": result["other_by_api"]}, sort_keys=True))
        return 0
    figures = load_json(args.torch_json) or {}
    reference = load_json(args.reference_json)
    return 0 if check(args.mode, result, figures, reference) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

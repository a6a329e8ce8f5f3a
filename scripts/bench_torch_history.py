"""Driver of scripts/bench-torch-history.sh: argv[1] = the release target directory."""
import json
import os
import statistics
import subprocess
import sys
import tempfile

RELEASE = sys.argv[1]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(RELEASE, "fakegpu", "lib")
FAKES = ["libcuda.so.1", "libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13",
         "libcudnn.so.9", "libnccl.so.2", "libnvidia-ml.so.1", "libcusparse.so.12",
         "libcusolver.so.12", "libcufft.so.12", "libcurand.so.10", "libnvrtc.so.13",
         "libnvJitLink.so.13", "libcupti.so.13", "libcufile.so.0", "libnvshmem_host.so.3",
         "libcusparseLt.so.0"]
WORKLOADS = "churn"
# vramshim records the warm-up too: its events are counted over the whole log and halved.
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))


def run(env, recorded):
    """One judge process; returns its figures (plus logged events when recorded)."""
    with tempfile.TemporaryDirectory() as logs:
        preload = [os.path.join(LIB, f) for f in FAKES]
        if recorded:
            preload.insert(0, os.path.join(RELEASE, "libvramshim.so"))
        full = {k: v for k, v in os.environ.items()
                if not k.startswith(("PYTORCH_", "JUDGE_")) and k != "LD_PRELOAD"}
        full.update(LD_PRELOAD=":".join(preload), LD_LIBRARY_PATH=LIB,
                    VRAMSHIM_FAKEGPU_MEMORY=str(8 << 30),
                    VRAMSHIM_OUTPUT=os.path.join(logs, "%p.vlog"), JUDGE_WARMUP="1", **env)
        out = subprocess.run([sys.executable, "-W", "ignore",
                              os.path.join(ROOT, "tests/python/torch_judge.py"), WORKLOADS],
                             env=full, capture_output=True, text=True, check=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        if recorded:
            log = [os.path.join(logs, f) for f in os.listdir(logs) if f.endswith(".vlog")]
            dump = subprocess.run([os.path.join(RELEASE, "vramshim"), "dump", "--json", *log],
                                  capture_output=True, text=True, check=True).stdout
            events = [json.loads(line) for line in dump.splitlines()]
            result["events"] = sum(1 for e in events if e.get("type") == "event"
                                   and e.get("event") in ("alloc", "free")) // 2
            result["allocs"] = sum(1 for e in events if e.get("type") == "event"
                                   and e.get("event") == "alloc") // 2
        return result


MODES = {
    "default": ({}, False),
    "history python": ({"JUDGE_HISTORY": "python"}, False),
    "history all": ({"JUDGE_HISTORY": "all"}, False),
    "no caching": ({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, False),
    "no caching + vramshim": ({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, True),
    "cudaMallocAsync": ({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, False),
    "cudaMallocAsync + vramshim": ({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
                                   True),
}
times = {mode: [] for mode in MODES}
last = {}
for _ in range(ROUNDS):
    for mode, (env, recorded) in MODES.items():
        last[mode] = run(env, recorded)
        times[mode].append(last[mode]["workload_cpu_s"])
median = {mode: statistics.median(t) for mode, t in times.items()}
allocs = last["no caching + vramshim"]["allocs"]


def cost(mode, base, events):
    extra = median[mode] - median[base]
    return extra / events * 1e6, extra / allocs * 1e6


stack = os.environ.get("VRAMSHIM_STACK", "mixed")
rows = [
    (f"vramshim, cudaMallocAsync ({stack})", "cudaMallocAsync + vramshim", "cudaMallocAsync",
     last["cudaMallocAsync + vramshim"]["events"]),
    (f"vramshim, no caching ({stack})", "no caching + vramshim", "no caching",
     last["no caching + vramshim"]["events"]),
    ('_record_memory_history(stacks="python")', "history python", "default",
     last["history python"]["history_events"]),
    ('_record_memory_history(stacks="all")', "history all", "default",
     last["history all"]["history_events"]),
]
print(f"workload: {WORKLOADS}, {allocs} tensor allocations, process CPU time (all threads), "
      f"medians of {ROUNDS} rounds")
for mode in MODES:
    print(f"  {mode:24} {median[mode] * 1e3:9.1f} ms")
print(f"{'recorder':42} {'events':>7} {'us/event':>9} {'us/alloc':>9}")
figures = []
for label, mode, base, events in rows:
    per_event, per_alloc = cost(mode, base, events)
    figures.append((per_event, per_alloc))
    print(f"{label:42} {events:7} {per_event:9.2f} {per_alloc:9.2f}")
ours = figures[0]
for (label, *_), (per_event, per_alloc) in zip(rows[2:], figures[2:]):
    if ours[0] > 0 and ours[1] > 0:
        print(f"{label} / vramshim (cudaMallocAsync): {per_event / ours[0]:.1f}x per event, "
              f"{per_alloc / ours[1]:.1f}x per allocation")
    else:
        print(f"{label}: vramshim's cost is within the noise of this run")

#!/usr/bin/env python3
"""Does `vramshim dryrun` predict this GPU? torch's own figures, natively and on the fakes.

Runs tests/python/torch_judge.py (mlp, transformer, inference, resnet) once natively on this
machine's GPU and once under `vramshim dryrun --gpu MODEL` (the fake libraries, the same torch,
the same script), in each allocator mode, and compares torch.cuda.memory_stats() of the two:
peak reserved, allocated and requested bytes, cudaMalloc / cudaFree counts, retries and OOMs.
Every difference is printed and counted; exit status 1 if any. Also printed, not counted: the
device memory outside torch's allocator at the end (used - reserved: the CUDA context, loaded
kernels, the libraries' handles), which dryrun charges from figures measured on an H100 and
an H200 (docs/gpus.md) and which a real driver grows as it loads kernels lazily.

usage: gpu_dryrun.py VRAMSHIM GPU_MODEL OUT_DIR [--modes default,expandable,max-split,roundup,async]
(scripts/gpu-smoke.sh runs it with every mode; DRYRUN=0 skips it)
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests/python/torch_judge.py")
WORKLOADS = "mlp,transformer,inference,resnet"
MODES = [("default", None), ("expandable", "expandable_segments:True"),
         ("max-split", "max_split_size_mb:64"), ("roundup", "roundup_power2_divisions:4"),
         ("async", "backend:cudaMallocAsync")]
KEYS = ["reserved_bytes.all.peak", "allocated_bytes.all.peak", "requested_bytes.all.peak",
        "num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms"]


def figures(text):
    """torch_judge.py's JSON line (the last one naming the reserved peak)."""
    for line in reversed(text.splitlines()):
        if line.startswith("{") and "reserved_bytes.all.peak" in line:
            return json.loads(line)
    return None


def main():
    vramshim, gpu, out_dir = sys.argv[1:4]
    chosen = [m for m, _ in MODES]
    if "--modes" in sys.argv:
        chosen = sys.argv[sys.argv.index("--modes") + 1].split(",")
        unknown = set(chosen) - {m for m, _ in MODES}
        if unknown:
            raise SystemExit(f"gpu_dryrun.py: unknown modes {sorted(unknown)}")
    os.makedirs(out_dir, exist_ok=True)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTORCH_", "VRAMSHIM_", "JUDGE_")) and k != "LD_PRELOAD"}
    base["JUDGE_DEVICE_USED"] = "1"
    same = differ = 0
    results = {}
    for mode, conf in [(m, c) for m, c in MODES if m in chosen]:
        env = dict(base, PYTORCH_CUDA_ALLOC_CONF=conf) if conf else base
        command = [sys.executable, "-W", "ignore", SCRIPT, WORKLOADS]
        real = subprocess.run(command, env=env, capture_output=True, text=True)
        fake = subprocess.run([vramshim, "dryrun", "--gpu", gpu, "--json", "-o",
                               os.path.join(out_dir, mode + ".%p.vlog"), "--", *command],
                              env=env, capture_output=True, text=True)
        # dryrun --json: the verdict on stdout, the program's own stdout on stderr.
        native, simulated = figures(real.stdout), figures(fake.stderr)
        results[mode] = {"native": native, "dryrun": simulated, "native_exit": real.returncode,
                         "dryrun_exit": fake.returncode}
        print(f"== {mode}: native exit {real.returncode}, dryrun exit {fake.returncode}")
        if native is None or simulated is None:
            print("   no figures:", (real.stderr if native is None else fake.stderr)[-1500:])
            differ += 1
            continue
        for key in KEYS:
            ok = native.get(key) == simulated.get(key)
            same += ok
            differ += not ok
            print(f"   {key:28} native {native.get(key)!s:>12}  dryrun "
                  f"{simulated.get(key)!s:>12}  diff {(simulated.get(key) or 0) - (native.get(key) or 0):+d}"
                  f"  {'SAME' if ok else 'DIFFERS'}")
        outside = [f.get("device_used_end", 0) - f.get("reserved_end_total", 0)
                   for f in (native, simulated)]
        print(f"   outside torch's allocator at the end (not counted): native {outside[0]}, "
              f"dryrun {outside[1]}, diff {outside[1] - outside[0]:+d}")
    with open(os.path.join(out_dir, "dryrun.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"dryrun vs this GPU: {same} figures the same, {differ} different")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()

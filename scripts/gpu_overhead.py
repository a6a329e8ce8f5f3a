#!/usr/bin/env python3
"""What the recorder costs a real GPU program: with vs without, side by side, as ratios.

    python3 scripts/gpu_overhead.py VRAMSHIM LIBVRAMSHIM OUT_DIR [ROUNDS] [WORKLOADS...]

Runs tests/python/torch_judge.py (JUDGE_WARMUP=1: each workload once untimed first, so CUDA's
and the libraries' first-use costs are out) natively and with libvramshim.so preloaded (the
default caching allocator, so the tensors are recorded through the tracker the shim attaches;
VRAMSHIM_STACK as set, default mixed), ROUNDS (default 3) interleaved rounds per workload
(default: churn, the many-small-tensors case, and mlp,transformer,resnet). Prints per workload
the medians of the timed part's wall and CPU seconds (all threads), their ratios with/without
with the rounds' min and max, the events the log holds and the added CPU per event.
"""
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests/python/torch_judge.py")


def figures(text):
    for line in reversed(text.splitlines()):
        if line.startswith("{") and "workload_s" in line:
            return json.loads(line)
    raise SystemExit("torch_judge.py printed no figures:\n" + text[-2000:])


def main():
    vramshim, shim, out_dir = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    workloads = sys.argv[5:] or ["churn", "mlp,transformer,resnet"]
    os.makedirs(out_dir, exist_ok=True)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTORCH_", "JUDGE_")) and k != "LD_PRELOAD"}
    base["JUDGE_WARMUP"] = "1"
    for work in workloads:
        runs = {"without": [], "with": []}
        events = []
        for r in range(rounds):
            for mode in ("without", "with"):
                env = dict(base)
                if mode == "with":
                    log = os.path.join(out_dir, f"{work.replace(',', '-')}.{r}.vlog")
                    env.update(LD_PRELOAD=shim, VRAMSHIM_OUTPUT=log)
                out = subprocess.run([sys.executable, "-W", "ignore", SCRIPT, work], env=env,
                                     capture_output=True, text=True)
                if out.returncode != 0:
                    raise SystemExit(f"{work} {mode}: exit {out.returncode}\n{out.stderr[-2000:]}")
                f = figures(out.stdout)
                runs[mode].append((f["workload_s"], f["workload_cpu_s"]))
                if mode == "with":
                    dump = subprocess.run([vramshim, "dump", "--json", log],
                                          capture_output=True, text=True).stdout
                    events.append(sum(1 for line in dump.splitlines()
                                      if line.startswith('{"') and '"type":"event"' in line))
        print(f"== {work} ({rounds} interleaved rounds, VRAMSHIM_STACK="
              f"{os.environ.get('VRAMSHIM_STACK', 'mixed')})")
        for i, what in ((0, "wall"), (1, "CPU")):
            without = [x[i] for x in runs["without"]]
            with_ = [x[i] for x in runs["with"]]
            ratios = [w / o for w, o in zip(with_, without)]
            print(f"   {what:4} without {statistics.median(without):8.3f} s  with "
                  f"{statistics.median(with_):8.3f} s  ratio {statistics.median(ratios):.3f} "
                  f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
        added = statistics.median(x[1] for x in runs["with"]) - \
            statistics.median(x[1] for x in runs["without"])
        count = statistics.median(events)
        # The log counts the warm-up's events too: the timed part has about half of them.
        per_event = added / (count / 2) * 1e6 if count else float("nan")
        print(f"   events in the log {count:.0f} (warm-up and timed part); added CPU "
              f"{added * 1e3:.1f} ms, about {per_event:.2f} us per timed event")


if __name__ == "__main__":
    main()

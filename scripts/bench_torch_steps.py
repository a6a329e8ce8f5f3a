"""The training-step workload of scripts/bench-torch-trace.sh (BENCH_WORKLOAD=steps).

  bench_torch_steps.py RELEASE_DIR            the driver: interleaved rounds, figures printed
  bench_torch_steps.py --worker HISTORY ...   one measured process (run by the driver)

Each process imports tests/python/torch_judge.py's workloads (an MLP, a transformer and a ResNet
trained with Adam: tensors made inside nn.Module calls, on autograd's thread and for the
optimizer's state; BENCH_STEPS=bert for a BERT-style encoder trained through a Trainer-like call
chain, its allocations ~25 Python frames deep instead of ~10), runs them once untimed (CUDA's,
cuDNN's and the allocator's first-use costs), starts PyTorch's memory history if asked, then times BENCH_BLOCKS blocks, each one pass of the
workloads: the CPU time of the whole process (every thread: the recorder's writer, autograd's)
per block. Tensor events are counted from the shim's log (tensor_alloc, tensor_free_requested,
tensor_free stamped inside the timed window) and from PyTorch's own trace (alloc,
free_requested, free_completed); the cost per event is (median block - the fakes alone's median
block) / tensor events per block, per round, against the same round's fakes alone.

BENCH_NORMALISED=1: after each block the process also times a fixed CPU reference (the bench
loop's tensor loop at depth 10 on the CPU, BENCH_REFERENCE_PAIRS pairs) and keeps the median of
the ratios block / reference, which cancels a shared host's phases of speed; costs are then in
units of a CPU-loop event (a third of a reference pair), as in the loop's normalised mode.

BENCH_CALLGRIND=1: instead, one pass per mode under callgrind (BENCH_CALLGRIND_MODES, default
alone, vramshim_none, vramshim_mixed, torch_python, torch_all; BENCH_JOBS processes at a time),
its counts zeroed and dumped around the window by a small library's client requests (built
here with callgrind.h): every thread's instructions per tensor event above the fakes alone,
far steadier than the times (no cache misses or lock waits counted), though whole-process
counts still differ by a few percent between runs. The count is the recorders' own calls
(their inclusive costs: PyTorch's record_trace, which runs the trackers, and its stack
gathering; vramshim's writer; c10::reportMemoryUsageToProfiler, which the shim interposes,
above its cost under the fakes alone), not the whole window's "summary:" or "totals:" line, printed
beside it: with the counts zeroed by a client request, callgrind's whole-window lines can count
other threads' instructions from before the window. The recorder's writer thread wakes
by wall time (every VRAMSHIM_FLUSH_MS) and pays a fixed cost per chunk it seals (its head,
its first event in full; with VRAMSHIM_COMPRESS=1 also zstd's tables, some 50,000 - 75,000
instructions), so its share grows with the window's wall time, which callgrind and the host's
load stretch: the window's seconds are printed too. The recorder writes its chunks plain;
`vramshim run` compresses the log after the program exits: that cost (`vramshim compact` of a
copy of the log under callgrind, its own process) is printed beside, per event of the log.
Each recorder's log is also read for its chunking (`vramshim dump --counts`: events a chunk),
and the same process is run once natively for its chunking there: at native speed a 50 ms drain
holds 10 - 60 times the events it holds under callgrind (by the host's load). Only the
writer's work depends on it (its costs a drain and a chunk, spread over more or fewer events;
with VRAMSHIM_COMPRESS=1, chunks of 16 KiB of records or more are compressed at zstd level 1,
smaller ones at -2). A
longer VRAMSHIM_FLUSH_MS under callgrind does not measure native-speed chunking: its drains
then span the window's edges (one 3 s drain took in the untimed pass's events), so the
writer's cost at native-speed chunking is measured on a native log re-chunked
(`format/examples/chunk_costs.rs`).
BENCH_CALLGRIND_KEEP=DIR keeps each mode's window dump there (MODE.callgrind.out.1) for
callgrind_annotate. Minutes of a core per process, mostly importing torch.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKES = ["libcuda.so.1", "libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13",
         "libcudnn.so.9", "libnccl.so.2", "libnvidia-ml.so.1", "libcusparse.so.12",
         "libcusolver.so.12", "libcufft.so.12", "libcurand.so.10", "libnvrtc.so.13",
         "libnvJitLink.so.13", "libcupti.so.13", "libcufile.so.0", "libnvshmem_host.so.3",
         "libcusparseLt.so.0"]
SHIM_TENSOR_EVENTS = ("tensor_alloc", "tensor_free_requested", "tensor_free")
TORCH_TENSOR_EVENTS = ("alloc", "free_requested", "free_completed")


def worker(history, workloads, blocks, reference_pairs):
    """One process: prints its block times, window and PyTorch's trace counts as JSON."""
    import torch
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    import torch_judge

    steps = [getattr(torch_judge, name) for name in workloads.split(",")]

    def one_pass():
        for step in steps:
            step()
        torch.cuda.synchronize()

    def alloc_free():
        x = torch.empty(1024)
        del x

    def reference(depth):  # the bench loop's tensor loop, on the CPU, at depth ~10
        if depth == 0:
            for _ in range(reference_pairs):
                alloc_free()
        else:
            reference(depth - 1)

    # Under callgrind (the driver's BENCH_CALLGRIND=1): its counts zeroed at the window's start
    # and dumped at its end, every thread's. Loaded before the untimed pass: a library loaded
    # just before the window made vramshim rebuild its unwinder inside it, which forgets every
    # thread's remembered walks and unwind rules (a cost of the measure, not of the steps).
    counter = os.environ.get("BENCH_WINDOW_LIBRARY")
    counter = __import__("ctypes").CDLL(counter) if counter else None
    block_s, reference_s = [], []
    # The untimed pass (block -1) and the timed ones run from the same lines, as a training
    # loop's steps do: a pass called from another line of this script has other Python
    # stacks, which a recorder that keeps each stack once would define all over again in
    # the window (110 of a pass's 2,346 allocations' stacks), a first-use cost of the
    # untimed pass's kind.
    for block in range(-1, blocks):
        if block == 0:
            if history == "state":
                torch.cuda.memory._record_memory_history(enabled="state", stacks="python")
            elif history != "off":
                torch.cuda.memory._record_memory_history(stacks=history)
            if counter:
                counter.window_start()
            window_start = time.monotonic_ns()
        start = time.process_time()
        one_pass()
        elapsed = time.process_time() - start
        if reference_pairs:
            start = time.process_time()
            reference(8)
            if block >= 0:
                reference_s.append(time.process_time() - start)
        if block >= 0:
            block_s.append(elapsed)
    window_end = time.monotonic_ns()
    if counter:
        counter.window_end()
    trace = {}
    if history in ("python", "all"):
        for device in torch.cuda.memory._snapshot()["device_traces"]:
            for entry in device:
                trace[entry["action"]] = trace.get(entry["action"], 0) + 1
    print(json.dumps({"block_s": block_s, "reference_s": reference_s, "trace": trace,
                      "window": [window_start, window_end], "torch": torch.__version__}),
          flush=True)
    sys.stderr.flush()
    os._exit(0)  # as torch_judge.py: no interpreter finalisation beside autograd's thread


MODES = {  # name: (PyTorch history, VRAMSHIM_STACK or None for no shim)
    "alone": ("off", None),
    "vramshim_none": ("off", "none"),
    "vramshim_mixed": ("off", "mixed"),
    "vramshim_native": ("off", "native"),
    "vramshim_python": ("off", "python"),
    "torch_python": ("python", None),
    "torch_all": ("all", None),
    "torch_state": ("state", None),
}


def shim_chunks(release, paths):
    """(events, chunks) of the logs at `paths`, as `vramshim dump --counts` reads them: how
    many events the writer sealed in a chunk on average (its drains' sizes)."""
    events, chunks = 0, 0
    for path in paths:
        out = subprocess.run([os.path.join(release, "vramshim"), "dump", "--counts", "--json",
                              path], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            record = json.loads(line)
            if record.get("type") == "counts":
                events += record["events"]
                chunks += record["chunks"]
    return events, chunks


def shim_events(release, paths, window):
    """Tensor events of the logs at `paths` stamped inside the window (CLOCK_MONOTONIC ns), and
    how many stacks they use that no event before the window used."""
    dump = subprocess.run([os.path.join(release, "vramshim"), "dump", "--json", *paths],
                          capture_output=True, text=True, check=True).stdout
    start_mono, count = 0, 0
    before, new_stacks = set(), set()
    for line in dump.splitlines():
        record = json.loads(line)
        kind = record.get("type")
        if kind == "header":
            start_mono = record["start_mono_ns"]
        elif kind == "event" and record.get("event") in SHIM_TENSOR_EVENTS:
            stamp = start_mono + record["t_ns"]
            if stamp < window[0]:
                before.add(record.get("stack"))
            elif stamp <= window[1]:
                count += 1
                if record.get("stack") not in before:
                    new_stacks.add(record.get("stack"))
    return count, len(new_stacks)


def compaction(release, paths, work):
    """`vramshim compact` of copies of the logs at `paths`, under callgrind: (instructions,
    events in the logs, bytes as recorded, bytes compacted). What `vramshim run` spends on the
    logs after the program has exited (the recorder writes its chunks plain: VRAMSHIM_COMPRESS),
    in its own process, not the program's. None without a `vramshim compact`."""
    tool = os.path.join(release, "vramshim")
    if subprocess.run([tool, "compact", "--help"], capture_output=True).returncode != 0:
        return None
    os.makedirs(work, exist_ok=True)
    copies = []
    for path in paths:
        copy = os.path.join(work, os.path.basename(path))
        shutil.copy(path, copy)
        copies.append(copy)
    recorded = sum(os.path.getsize(copy) for copy in copies)
    events = shim_chunks(release, copies)[0]
    out = os.path.join(work, "compact.callgrind.out")
    subprocess.run(["valgrind", "--tool=callgrind", "--dump-instr=no",
                    f"--callgrind-out-file={out}", tool, "compact", *copies],
                   capture_output=True, check=True)
    with open(out) as dump:
        total = next(int(line.split()[1]) for line in dump if line.startswith("summary:"))
    return total, events, recorded, sum(os.path.getsize(copy) for copy in copies)


def run(release, mode, workloads, blocks, reference_pairs, callgrind=None):
    """One worker process of `mode`; with `callgrind` (the window library's path) under
    callgrind, adding "instructions": every thread's, inside the timed window."""
    history, stack = MODES[mode]
    lib = os.path.join(release, "fakegpu", "lib")
    preload = [os.path.join(lib, f) for f in FAKES]
    if stack:
        preload.insert(0, os.path.join(release, "libvramshim.so"))
    with tempfile.TemporaryDirectory() as logs:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTORCH_", "JUDGE_", "VRAMSHIM_")) and k != "LD_PRELOAD"}
        env.update(LD_PRELOAD=":".join(preload), LD_LIBRARY_PATH=lib,
                   VRAMSHIM_FAKEGPU_MEMORY=str(8 << 30),
                   VRAMSHIM_OUTPUT=os.path.join(logs, "%p.vlog"))
        if stack:
            env["VRAMSHIM_STACK"] = stack
        command = [sys.executable, "-W", "ignore", os.path.abspath(__file__), "--worker",
                   history, workloads, str(blocks), str(reference_pairs)]
        if callgrind:
            env.update(BENCH_WINDOW_LIBRARY=callgrind, PYTHONHASHSEED="0")
            command = ["valgrind", "--tool=callgrind", "--dump-instr=no",
                       f"--callgrind-out-file={logs}/callgrind.out"] + command
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        if stack:
            paths = [os.path.join(logs, f) for f in os.listdir(logs) if f.endswith(".vlog")]
            result["events"], result["new_stacks"] = shim_events(release, paths,
                                                                 result["window"])
            result["chunking"] = shim_chunks(release, paths)
            if callgrind:
                result["compaction"] = compaction(release, paths, os.path.join(logs, "compact"))
        elif history in ("python", "all"):
            result["events"] = sum(result["trace"].get(a, 0) for a in TORCH_TENSOR_EVENTS)
        if callgrind:
            # The window's dump (part 1). Neither whole-window line is trustworthy with the
            # counts zeroed by a client request in a threaded program: "summary:" can count
            # instructions another thread ran before the window (a C program whose second
            # thread runs 60 M instructions before the window and 60 M in it, beside the main
            # thread's 60 M in it: summary 180.0 M; with 180 M before, 300.0 M), and
            # "totals:" (the sum of the dumped functions' costs) read 78 M above the summary
            # for the MLP alone under the fakes alone. The measure is the recorders' own calls,
            # each begun and ended inside the window (their inclusive costs, from the call
            # edges; exact in that C program whatever ran before the window): PyTorch's record_trace (which calls the trackers, vramshim's included,
            # and builds the TraceEntry they get) and stack gathering, vramshim's writer.
            path = os.path.join(logs, "callgrind.out.1")
            with open(path) as part:
                for line in part:
                    if line.startswith(("summary:", "totals:")):
                        result[line.split(":")[0]] = int(line.split()[1])
            calls = inclusive_calls(path, RECORDER_CALLS)
            result["record_trace"] = calls[RECORD_TRACE]
            result["gather"] = calls[GATHER]
            result["callback"] = calls["vramshim::torch_trace::invoke"]
            result["writing"] = calls["vramshim::writer::flush"]
            result["report"] = calls[REPORT]
            keep = os.environ.get("BENCH_CALLGRIND_KEEP")
            if keep:
                os.makedirs(keep, exist_ok=True)
                shutil.copy(path, os.path.join(keep, f"{mode}.callgrind.out.1"))
    return result


RECORD_TRACE = "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::record_trace("
GATHER = "torch::cuda::(anonymous namespace)::gather"  # gather() or gather_with_cpp()
# PyTorch's allocator calls it at every block allocation and free request, outside
# record_trace; the shim interposes it (the 2.1 route) and forwards it to libc10's: its calls
# cost the fakes alone libc10's function, under the shim the interposer and libc10's.
REPORT = "c10::reportMemoryUsageToProfiler("
# name or name prefix (ending "(" or "gather"): the calls whose inclusive costs are summed.
RECORDER_CALLS = (RECORD_TRACE, GATHER, REPORT, "vramshim::torch_trace::invoke",
                  "vramshim::writer::flush")


def inclusive_calls(path, functions):
    """Instructions inside calls to each of `functions` (an exact name, or a prefix when it
    ends with "(" or is GATHER) in a callgrind dump: the sum of the inclusive costs of every
    call site, except the calls from a function of the same name or prefix (the shim's
    interposer calling the definition it hides, of the same name: counted inside the
    interposer's); none of them may call itself otherwise."""
    def matches(name):
        for function in functions:
            prefix = function.endswith("(") or function == GATHER
            if name == function or (prefix and name.startswith(function)):
                return function
        return None
    names, totals, target, take = {}, dict.fromkeys(functions, 0), None, False
    caller = None
    with open(path) as dump:
        for line in dump:
            # Names are compressed: "(id) name" the first time, "(id)" after, in fn= or cfn=.
            if line.startswith(("fn=", "cfn=")):
                ref, _, name = line.split("=", 1)[1].strip().partition(" ")
                if name:
                    names[ref] = name
                if line.startswith("fn="):
                    caller = matches(names.get(ref, ref))
                else:
                    target = matches(names.get(ref, ref))
                    if target is not None and target == caller:
                        target = None
            elif line.startswith("calls="):
                take = target is not None
            elif take:
                totals[target] += int(line.split()[1])
                take = False
    return totals


WINDOW_C = """#include <valgrind/callgrind.h>
void window_start(void) { CALLGRIND_ZERO_STATS; }
void window_end(void) { CALLGRIND_DUMP_STATS_AT("window"); }
"""


def instructions(release):
    """BENCH_CALLGRIND=1: one process a mode under callgrind (BENCH_JOBS at a time); every
    thread's instructions inside the window, per tensor event above the fakes alone."""
    import concurrent.futures
    workloads = os.environ.get("BENCH_STEPS", "mlp,transformer,resnet")
    modes = os.environ.get("BENCH_CALLGRIND_MODES",
                           "alone,vramshim_none,vramshim_mixed,torch_python,torch_all").split(",")
    with tempfile.TemporaryDirectory() as work:
        library = os.path.join(work, "libwindow.so")
        with open(os.path.join(work, "window.c"), "w") as source:
            source.write(WINDOW_C)
        built = subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", library,
                                os.path.join(work, "window.c")], capture_output=True, text=True)
        if built.returncode != 0:
            print(f"SKIPPED: no callgrind.h to build the window marks ({built.stderr.strip()})")
            return
        load_start = loadavg()
        jobs = int(os.environ.get("BENCH_JOBS", "2"))
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            results = dict(zip(modes, pool.map(
                lambda mode: run(release, mode, workloads, 1, 0, library), modes)))
        # The same processes at native speed, for the writer's chunking there: it drains by
        # wall time, so under callgrind (10 - 60 times slower) each drain and chunk holds
        # that many times fewer events.
        native = {mode: run(release, mode, workloads, 1, 0) for mode in modes
                  if MODES[mode][1] is not None}
    counted = {m: r["events"] for m, r in results.items() if r.get("events")}
    print(f"== training steps ({workloads}), PyTorch {results[modes[0]]['torch']}, one pass "
          f"under callgrind a mode; load average {load_start} at the start, {loadavg()} at "
          "the end")
    print("tensor events in the window: " + ", ".join(f"{m} {e}" for m, e in counted.items()))
    if "alone" not in results:
        # A run for the dumps alone (BENCH_CALLGRIND_KEEP): nothing to subtract from.
        print("no per-event figures: they are counted above the fakes alone; add 'alone' to "
              "BENCH_CALLGRIND_MODES")
        return
    alone = results["alone"]
    events = statistics.median(counted.values())
    per_event = {}
    for mode, result in results.items():
        # The recorder's own calls above the fakes alone: PyTorch's record_trace beyond what it
        # costs with no history and no tracker (vramshim's callback runs inside it), stack
        # gathering, the writer.
        own = (result["record_trace"] - alone["record_trace"] + result["gather"]
               + result["writing"] + result["report"] - alone["report"])
        n = result.get("events", events)
        per_event[mode] = own / n
        seconds = (result["window"][1] - result["window"][0]) / 1e9
        print(f"{mode:16} recorder {own:13,} instructions, {per_event[mode]:9.1f} per tensor "
              f"event; the whole window's summary line {result['summary'] - alone['summary']:+,}"
              f" ({(result['summary'] - alone['summary']) / n:.1f} an event), totals line "
              f"{result['totals'] - alone['totals']:+,} ({(result['totals'] - alone['totals']) / n:.1f})"
              f" above the fakes alone; window {seconds:.1f} s of wall time")
        if mode in native:
            ours, theirs = result["chunking"], native[mode]["chunking"]
            native_s = (native[mode]["window"][1] - native[mode]["window"][0]) / 1e9
            print(f"{'':16} stacks first used in the window: {result['new_stacks']}")
            print(f"{'':16} chunks: {ours[0] / max(ours[1], 1):,.0f} events a chunk under "
                  f"callgrind ({ours[0]:,} events, "
                  f"{ours[1]} chunks); natively {theirs[0] / max(theirs[1], 1):,.0f} "
                  f"({theirs[0]:,} events, {theirs[1]} chunks; window {native_s:.2f} s)")
        if result.get("compaction"):
            total, logged, recorded, compacted = result["compaction"]
            print(f"{'':16} after the program exits, `vramshim compact` (as `vramshim run` "
                  f"does; its own process): {total:,} instructions for the log's {logged:,} "
                  f"events ({total / max(logged, 1):,.0f} an event), {recorded:,} -> "
                  f"{compacted:,} bytes")
        if result["callback"]:
            print(f"{'':16} vramshim's callback {result['callback']:,} "
                  f"({result['callback'] / n:.1f} an event), its writer {result['writing']:,} "
                  f"({result['writing'] / n:.1f}), PyTorch's record_trace around the callback "
                  f"{result['record_trace'] - result['callback'] - alone['record_trace']:+,}"
                  f", the interposed c10::reportMemoryUsageToProfiler "
                  f"{result['report'] - alone['report']:+,}")
        elif result["gather"]:
            print(f"{'':16} PyTorch's stack gathering {result['gather']:,} "
                  f"({result['gather'] / n:.1f} an event), record_trace "
                  f"{result['record_trace'] - alone['record_trace']:+,}")
    if "vramshim_mixed" in per_event:
        for theirs, goal in (("torch_python", 0.5), ("torch_all", 0.1)):
            if per_event.get(theirs, 0) > 0:
                print(f"vramshim mixed / torch stacks={theirs[6:]}: "
                      f"{per_event['vramshim_mixed'] / per_event[theirs]:.3f} (goal <= {goal})")


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def spread(values):
    return f"{statistics.median(values):8.3f}  (min {min(values):.3f}, max {max(values):.3f})"


def driver(release):
    workloads = os.environ.get("BENCH_STEPS", "mlp,transformer,resnet")
    rounds = int(os.environ.get("BENCH_ROUNDS", "5"))
    blocks = int(os.environ.get("BENCH_BLOCKS", "5"))
    normalised = os.environ.get("BENCH_NORMALISED") == "1"
    reference_pairs = int(os.environ.get("BENCH_REFERENCE_PAIRS", "20000")) if normalised else 0
    load_start = loadavg()
    per_round = []  # per round: mode -> (statistic, tensor events per block or None)
    all_events = {mode: [] for mode in MODES}
    reference_event_ns = []
    version = "?"
    for _ in range(rounds):
        figures = {}
        for mode in MODES:
            result = run(release, mode, workloads, blocks, reference_pairs)
            if normalised:
                stat = statistics.median(
                    b / r for b, r in zip(result["block_s"], result["reference_s"]))
                reference_event_ns.extend(r / (3 * reference_pairs) * 1e9
                                          for r in result["reference_s"])
            else:
                stat = statistics.median(result["block_s"]) * 1e9  # ns
            events = result.get("events")
            if events is not None:
                all_events[mode].append(events / blocks)
            figures[mode] = stat
            version = result["torch"]
        per_round.append(figures)
    load_end = loadavg()
    # PyTorch's "state" history keeps no trace: its events are the trace's of the same stream.
    events = {mode: statistics.median(e) for mode, e in all_events.items() if e}
    events["torch_state"] = events["torch_python"]
    events["alone"] = None
    unit = "CPU-loop events" if normalised else "ns"
    print(f"== training steps ({workloads}), PyTorch {version}: {rounds} interleaved "
          f"rounds x {blocks} blocks; load average {load_start} at the start, {load_end} at "
          f"the end")
    print("tensor events per block: " + ", ".join(
        f"{mode} {statistics.median(e):.0f}" + ("" if min(e) == max(e) else
                                                  f" ({min(e):.0f}-{max(e):.0f})")
        for mode, e in all_events.items() if e))
    if normalised:
        print("== block / CPU reference per process (medians of its blocks); rounds:")
        for mode in MODES:
            values = [r[mode] for r in per_round]
            print(f"{mode:16} {spread(values)}")
        print(f"one CPU-loop event: {statistics.median(reference_event_ns):.1f} ns (median of "
              "every reference block)")
    else:
        print("== CPU time per block, ms (medians of each process's blocks); rounds:")
        for mode in MODES:
            values = [r[mode] / 1e6 for r in per_round]
            print(f"{mode:16} {spread(values)}")
    cost = {}
    for mode in MODES:
        if mode == "alone":
            continue
        per_event = []
        for r in per_round:
            extra = r[mode] - r["alone"]
            if normalised:  # block/reference ratio -> CPU-loop events per tensor event
                extra *= 3 * reference_pairs
            per_event.append(extra / events[mode])
        cost[mode] = per_event
    print(f"== cost per tensor event above the fakes alone, {unit}: median (min, max) of "
          f"{rounds} rounds")
    for mode, values in cost.items():
        print(f"{mode:16} {spread(values)}")
    for theirs, goal in (("torch_python", 0.5), ("torch_all", 0.1)):
        ratios = [ours / their for ours, their in zip(cost["vramshim_mixed"], cost[theirs])
                  if their > 0]
        name = theirs.replace("torch_", "")
        if ratios:
            of_medians = statistics.median(cost["vramshim_mixed"]) / statistics.median(
                cost[theirs])
            print(f"vramshim mixed / torch stacks={name}: {spread(ratios)} over {len(ratios)} "
                  f"of {rounds} rounds (goal <= {goal}); of the medians {of_medians:.3f}")
        else:
            print(f"vramshim mixed / torch stacks={name}: PyTorch's cost within the noise")


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif os.environ.get("BENCH_CALLGRIND") == "1":
        instructions(sys.argv[1])
    else:
        driver(sys.argv[1])

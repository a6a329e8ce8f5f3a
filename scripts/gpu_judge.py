"""Issue 11's judge on any device: torch's own figures against vramshim's, every difference
printed. The same checks tests/tests/torch_judge.rs makes on the fake GPU.

Runs tests/python/torch_judge.py under the recorder (one process per allocator mode, or
`torchrun --nproc_per_node=2` per mode for DDP), then:
  1. each native mode's log (`vramshim allocator --json`; per rank for DDP): peak reserved,
     cudaMalloc and cudaFree counts, retries and failed cudaMallocs equal
     reserved_bytes.all.peak, num_device_alloc, num_device_free, num_alloc_retries
     (+ num_ooms); expandable segments: the mapped peak only (their num_device_alloc counts
     mapped ranges);
  2. `vramshim whatif` on the cudaMallocAsync recording (each rank's own for DDP), at the
     device's total memory, predicts each mode's max_memory_reserved(), allocated and
     requested peaks and counters: 0 bytes of difference allowed;
  3. Python stacks of the MLP with caching off (one cudaMalloc per tensor): ReLU's output
     under Mlp.forward's line under the loop's line; backward allocations on pt_autograd_*
     with a ...Backward0::apply frame (but the bias gradients' reduce_grad sums); Adam's state
     under the loop's optimizer.step() line and Adam.step;
  4. `export --pytorch-snapshot` of that run against torch's own `_snapshot()` of the same
     workload under the default allocator (with caching off torch records nothing): the same
     allocations in the same order, each with its size and Python frames (cuBLAS's own
     driver-API allocations, which torch never sees, are taken out by address and size);
  5. torch's real OOM (the MLP, then half the card held and half asked for): `vramshim oom`
     gives the failed request, verdict exceeded_free_memory, torch's one retry (failed, after
     releasing the cached segments: the bytes and count by which torch's reserved bytes and
     num_device_free moved) and the script's line;
  6. tight capacity on any device, by a ballast: the ResNet recorded under cudaMallocAsync;
     whatif on that recording picks capacities (MiB beside the libraries' peak, from the
     mode's whole-card peak down, 4 MiB a step): with the defaults the first where torch's
     allocator raises an OOM after a retry and the first where a retry lets it finish, with
     expandable segments the first OOM after a retry. Each is then run natively with
     JUDGE_BALLAST_LEAVE (torch_judge.py takes the rest of the free memory with the
     driver's cuMemAlloc once torch's context exists), and whatif at the bytes cudaMemGetInfo
     then said were free is compared with it: check 1's log figures, the OOM raised or none,
     the OOM's size (as torch's message prints it), peak reserved, cudaMalloc/cudaFree
     counts, retries and OOMs (up to the OOM where torch raised one), or check 2's row where
     it finished; and the bytes the device lost after the ballast that the log does not hold
     (0: whatif's capacity is the card torch had). Nothing in it is fake-specific: the free
     bytes are read at run time, so the same check runs on a real GPU.
  7. tensors inside the default allocator's segments (issue 12): tests/python/torch_fakegpu.py
     `trace` (an MLP, empty_cache(), a transformer step, with torch's own memory history on)
     under the recorder, default and expandable segments: the log's tensor events (alloc,
     free_requested, free_completed, segment_alloc / segment_map / segment_unmap) equal torch's
     own history entry for entry (action, address, size) up to torch's snapshot, and every
     tensor block lies inside a segment or mapping the recorder saw the driver make.
Prints every comparison and its difference; exit status 1 if any differs.

usage: gpu_judge.py VRAMSHIM LIBVRAMSHIM OUT_DIR [--fake FAKE_LIB_DIR] [--checks 1,2,3,4,5,6,7]
                    [--workloads mlp,transformer,inference,resnet|none] [--no-ddp]
                    [--tight-cudnn on|off]
--tight-cudnn: whether check 6's ResNet runs its convolutions through cuDNN (JUDGE_CUDNN=0 when
off). Default: on with --fake, off on a real card, where a cuDNN that cannot have its chosen
workspace falls back to engines whose workspaces no recording shows, so nearly every tight
capacity rests on a guess (an H100 with cuDNN 9.19: 23 of 24 in each mode) and is not judged.
With --fake the fake GPU libraries are preloaded too (how machines without a GPU check the
script; the fakes of torch's CUDA major are chosen from torch.version.cuda). DDP needs two
devices: on a machine with one GPU it is skipped, and says so."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests/python/torch_judge.py")
FAKES = {
    "13": ["libcuda.so.1", "libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13",
           "libcudnn.so.9", "libnccl.so.2", "libnvidia-ml.so.1", "libcusparse.so.12",
           "libcusolver.so.12", "libcufft.so.12", "libcurand.so.10", "libnvrtc.so.13",
           "libnvJitLink.so.13", "libcupti.so.13", "libcufile.so.0", "libnvshmem_host.so.3",
           "libcusparseLt.so.0"],
    "12": ["libcuda.so.1", "libcudart.so.12", "libcublas.so.12", "libcublasLt.so.12",
           "libcudnn.so.9", "libnccl.so.2", "libnvidia-ml.so.1", "libcusparse.so.12",
           "libcusolver.so.11", "libcufft.so.11", "libcurand.so.10", "libnvrtc.so.12",
           "libcupti.so.12", "libcusparseLt.so.0"],
}
MODES = [("default", ""), ("expandable", "expandable_segments:True"),
         ("max-split", "max_split_size_mb:64"), ("roundup", "roundup_power2_divisions:4")]
FAKE_MEMORY = 8 << 30

vramshim, shim, out_dir = sys.argv[1:4]
options = sys.argv[4:]


def option(name, default=None):
    return options[options.index(name) + 1] if name in options else default


fake = option("--fake")
checks = {int(c) for c in option("--checks", "1,2,3,4,5,6,7").split(",")}
tight_cudnn = option("--tight-cudnn", "on" if fake else "off")
if tight_cudnn not in ("on", "off"):
    raise SystemExit(f"--tight-cudnn: 'on' or 'off', not {tight_cudnn!r}")
workloads = option("--workloads", "mlp,transformer,inference,resnet")
bad = 0
compared = 0
not_judged = []  # cases a real card left without a judgeable capacity, with why


def torch_cuda_major():
    """torch.version.cuda's major, read from torch/version.py (importing torch needs the
    CUDA libraries the fakes stand in for)."""
    import importlib.util
    spec = importlib.util.find_spec("torch")
    with open(os.path.join(spec.submodule_search_locations[0], "version.py")) as f:
        for line in f:
            if line.startswith("cuda"):
                return line.split("=")[1].strip().strip("'\"").split(".")[0]
    raise SystemExit("torch/version.py names no CUDA version")


preload = [shim]
if fake:
    preload += [os.path.join(fake, f) for f in FAKES[torch_cuda_major()]]


def environment(logs, env, devices=1):
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTORCH_", "JUDGE_", "VRAMSHIM_")) and k != "LD_PRELOAD"}
    full.update(LD_PRELOAD=":".join(preload), VRAMSHIM_OUTPUT=os.path.join(logs, "%p.vlog"),
                **env)
    if fake:
        full.update(LD_LIBRARY_PATH=fake, VRAMSHIM_FAKEGPU_MEMORY=str(FAKE_MEMORY),
                    VRAMSHIM_FAKEGPU_COUNT=str(devices), VRAMSHIM_FAKEGPU_NCCL_TIMEOUT="120")
    return full


def fail_run(name, out, logs):
    with open(os.path.join(logs, "stderr.txt"), "w") as f:
        f.write(out.stderr)
    if out.returncode != 0:
        raise SystemExit(f"{name}: exit {out.returncode}\n{out.stderr[-2000:]}")


def run(name, env, work=None):
    """One recorded judge process: (torch's figures, its log)."""
    return run_script(name, env, SCRIPT, work or workloads)


def run_script(name, env, script, *args):
    """One recorded process of a test script: (its last JSON line, its log)."""
    logs = os.path.join(out_dir, name)
    os.makedirs(logs, exist_ok=True)
    out = subprocess.run([sys.executable, "-W", "ignore", script, *args],
                         env=environment(logs, env), capture_output=True, text=True)
    fail_run(name, out, logs)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    log = [os.path.join(logs, f) for f in os.listdir(logs) if f.endswith(".vlog")]
    if len(log) != 1:
        raise SystemExit(f"{name}: expected one log in {logs}, found {log}")
    return result, log[0]


def run_ddp(name, env):
    """One recorded `torchrun --nproc_per_node=2` of the ddp workload: [(figures, log)] by
    rank."""
    logs = os.path.join(out_dir, name)
    os.makedirs(logs, exist_ok=True)
    # TORCH_DIST_USE_NCCL2=0: torch 2.15's default NCCL process group ("nccl2") takes a
    # snapshot of the allocator when it is made, which backend:cudaMallocAsync refuses (an
    # exception, then std::terminate in its destructor); the stock one, in every mode alike.
    full = environment(logs, dict(env, JUDGE_RANK_DIR=logs, TORCH_DIST_USE_NCCL2="0"),
                       devices=2)
    out = subprocess.run([sys.executable, "-W", "ignore", "-m", "torch.distributed.run",
                          "--standalone", "--nproc_per_node=2", SCRIPT, "ddp"],
                         env=full, capture_output=True, text=True)
    fail_run(name, out, logs)
    ranks = []
    for rank in range(2):
        with open(os.path.join(logs, f"rank{rank}.json")) as f:
            torch = json.load(f)
        ranks.append((torch, os.path.join(logs, f"{torch['pid']}.vlog")))
    return ranks


def tool(*args):
    out = subprocess.run([vramshim, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"vramshim {' '.join(args)}: exit {out.returncode}\n{out.stderr}")
    return out.stdout


def tool_json(*args):
    return json.loads(tool(*args))


def events(log):
    return [json.loads(line) for line in tool("dump", "--json", log).splitlines()]


def compare(label, pairs):
    """Prints each (what, vramshim's, torch's) and whether they are equal."""
    global bad, compared
    for what, got, want in pairs:
        ok = got == want
        compared += 1
        bad += 0 if ok else 1
        if isinstance(got, int) and isinstance(want, int):
            print(f"  {label:15} {what:32} vramshim {got:>12}  torch {want:>12}  "
                  f"diff {got - want:+d}  {'PASS' if ok else 'FAIL'}")
        else:
            print(f"  {label:15} {what:32} vramshim {got!r}  torch {want!r}  "
                  f"{'PASS' if ok else 'FAIL'}")


def device_total(log, device):
    for entry in events(log):
        if entry.get("type") == "mem_info" and entry.get("device") == device:
            return entry["total"]
    raise SystemExit(f"{log}: no device total for device {device}")


def check_1(label, torch, log, device=0):
    """The log's segments against memory_stats()."""
    view = next(d for d in tool_json("allocator", "--json", log)["devices"]
                if d["device"] == device)
    libraries = view.get("libraries") or {}
    if libraries.get("alloc", {}).get("count"):
        # Not compared: torch's counters never see the libraries' own memory.
        print(f"  {label:15} libraries (driver-API, not torch's): "
              f"{libraries['alloc']['count']} allocations, peak {libraries['peak']} bytes")
    pairs = [("peak reserved", view["reserved"]["peak"], torch["reserved_bytes.all.peak"])]
    if "expandable" not in label:
        pairs += [
            ("cudaMalloc count", view["cuda_malloc"]["count"], torch["num_device_alloc"]),
            ("cudaFree count", view["cuda_free"]["count"], torch["num_device_free"]),
            ("retries", len(view["oom_retries"]), torch["num_alloc_retries"]),
            ("failed cudaMalloc", view["cuda_malloc"]["failed"],
             torch["num_alloc_retries"] + torch["num_ooms"]),
        ]
    compare(label, pairs)


def check_2(label, row, torch):
    """whatif's row against the native run's figures."""
    compare(label, [
        ("peak reserved", row["peak_reserved"], torch["max_memory_reserved"]),
        ("peak allocated", row["peak_allocated"], torch["allocated_bytes.all.peak"]),
        ("peak requested", row["peak_requested"], torch["requested_bytes.all.peak"]),
        ("num_device_alloc", row["num_device_alloc"], torch["num_device_alloc"]),
        ("num_device_free", row["num_device_free"], torch["num_device_free"]),
        ("num_alloc_retries", row["num_alloc_retries"], torch["num_alloc_retries"]),
        ("num_ooms", row["num_ooms"], torch["num_ooms"]),
    ])


def tried_to_allocate(message):
    """What torch's OutOfMemoryError says it tried to allocate ("32.00 MiB")."""
    return " ".join(message.split("Tried to allocate ")[1].split(" ")[:2]).rstrip(".")


def torch_size_text(size):
    """A size as torch's OOM message prints it (c10 format_size)."""
    if size <= 1 << 10:
        return f"{size} bytes"
    for unit, shift in (("KiB", 10), ("MiB", 20), ("GiB", 30)):
        if size <= 1 << (shift + 10) or unit == "GiB":
            return f"{size / (1 << shift):.2f} {unit}"


def check_2_at_oom(label, oom, torch):
    """whatif's OOM (its figures when it fails; its totals go on past it, the program stops
    there) against the native run that raised one."""
    compare(label, [
        ("OOM request", torch_size_text(oom["alloc_size"]),
         tried_to_allocate(torch["failed"]["message"])),
        ("peak reserved at the OOM", oom["peak_reserved"], torch["max_memory_reserved"]),
        ("num_device_alloc", oom["num_device_alloc"], torch["num_device_alloc"]),
        ("num_device_free", oom["num_device_free"], torch["num_device_free"]),
        ("num_alloc_retries", oom["num_alloc_retries"], torch["num_alloc_retries"]),
        ("num_ooms", oom["num_ooms"], torch["num_ooms"]),
    ])


def whatif_rows(log, capacity):
    args = ["whatif", "--json", log, "--capacity", f"{capacity // 1024}KiB"]
    for _, conf in MODES:
        args += ["--config", conf]
    return {row["conf"]: row for row in tool_json(*args)["configs"]}


def checks_1_and_2():
    print(f"== workloads {workloads}: one process per allocator mode")
    _, async_log = run("async", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
    runs = {label: run(label, {"PYTORCH_CUDA_ALLOC_CONF": conf} if conf else {})
            for label, conf in MODES}
    if 1 in checks:
        print("== check 1: each native mode's log against torch.cuda.memory_stats()")
        for label, (torch, log) in runs.items():
            check_1(label, torch, log)
    if 2 in checks:
        total = device_total(async_log, 0)
        print(f"== check 2: whatif on the cudaMallocAsync recording at {total} bytes")
        rows = whatif_rows(async_log, total)
        for label, conf in MODES:
            check_2(label, rows[conf], runs[label][0])


def ddp_checks():
    if not fake:
        count = subprocess.run([sys.executable, "-c",
                                "import torch; print(torch.cuda.device_count())"],
                               capture_output=True, text=True).stdout.strip()
        if count in ("", "0", "1"):
            print(f"== ddp: skipped (needs 2 devices, this machine has {count or 'no'})")
            return
    print("== ddp: torchrun --nproc_per_node=2 per allocator mode, each rank its own device")
    async_ranks = run_ddp("ddp-async", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
    runs = {label: run_ddp(f"ddp-{label}", {"PYTORCH_CUDA_ALLOC_CONF": conf} if conf else {})
            for label, conf in MODES}
    for rank, (async_torch, async_log) in enumerate(async_ranks):
        device = async_torch["device"]
        if 1 in checks:
            print(f"== check 1, rank {rank} (device {device})")
            for label, ranks in runs.items():
                torch, log = ranks[rank]
                check_1(f"ddp{rank}-{label}", torch, log, torch["device"])
        if 2 in checks:
            total = device_total(async_log, device)
            print(f"== check 2, rank {rank}: whatif on its cudaMallocAsync recording at "
                  f"{total} bytes")
            args = ["whatif", "--json", async_log, "--device", str(device), "--capacity",
                    f"{total // 1024}KiB"]
            for _, conf in MODES:
                args += ["--config", conf]
            rows = {row["conf"]: row for row in tool_json(*args)["configs"]}
            for label, conf in MODES:
                check_2(f"ddp{rank}-{label}", rows[conf], runs[label][rank][0])


def script_line(marker):
    with open(SCRIPT) as f:
        lines = [n for n, line in enumerate(f, 1) if marker in line]
    assert len(lines) == 1, marker
    return lines[0]


def folded_by_thread(log):
    out = tool("flamegraph", "--what", "allocated", "--by-thread", "--stacks", "mixed",
               "--folded", log)
    rows = []
    for line in out.splitlines():
        stack, _, weight = line.rpartition(" ")
        rows.append((stack.split(";"), int(weight)))
    return rows


def check_3(log):
    """Python stacks of the no-caching MLP run."""
    name = os.path.basename(SCRIPT)
    loop = f"mlp ({name}:{script_line('# JUDGE: mlp loop')})"
    forward = f"Mlp.forward ({name}:{script_line('# JUDGE: mlp forward')})"
    step = f"mlp ({name}:{script_line('# JUDGE: mlp step')})"
    relu = backward = reduce_grad = adam_state = 0
    misplaced = []
    for frames, weight in folded_by_thread(log):
        thread = frames[1] if len(frames) > 1 else ""
        if thread.startswith("thread pt_autograd_"):
            if any("Backward0::apply(" in f for f in frames):
                backward += weight
            elif any("InputMetadata::reduce_grad" in f for f in frames):
                reduce_grad += weight
            else:
                misplaced.append((frames, weight))
            continue
        if loop in frames and forward in frames:
            outer, inner = frames.index(loop), frames.index(forward)
            if outer > inner:
                misplaced.append((frames, weight))
            elif not any(".py:" in f and not f.startswith("Mlp.forward")
                         for f in frames[inner:]):
                relu += weight
        adam = next((i for i, f in enumerate(frames) if f.startswith("Adam._init_group (")),
                    None)
        if step in frames and adam is not None:
            outer = frames.index(step)
            if outer < adam and any(f.startswith("Adam.step (") for f in frames[outer:adam]):
                adam_state += weight
            else:
                misplaced.append((frames, weight))
    parameters = (512 * 2048 + 2048 + 2048 * 512 + 512) * 4
    compare("stacks", [
        (f"ReLU output under {forward} under {loop}", relu, 3 * 256 * 2048 * 4),
        (f"Adam state under {step} > Adam.step", adam_state, 2 * parameters),
        ("bias sums (reduce_grad) on pt_autograd_*", reduce_grad, 3 * (2048 + 512) * 4),
        ("pt_autograd_* bytes elsewhere", sum(w for _, w in misplaced), 0),
        ("pt_autograd_* under ...Backward0 > 0", backward > 0, True),
    ])
    for frames, weight in misplaced[:5]:
        print(f"    misplaced {weight} bytes: {';'.join(frames)}")


def check_4(log, reference_path):
    """The export of the no-caching run against torch's snapshot of the default run."""
    exported = os.path.join(out_dir, "vramshim-snapshot.json")
    tool("export", log, "--pytorch-snapshot", "--stacks", "python", "-o", exported)
    with open(exported) as f:
        snapshot = json.load(f)
    with open(reference_path) as f:
        theirs = json.load(f)
    libraries = {(e["addr"], e["size"]) for e in events(log)
                 if e.get("event") == "alloc" and e.get("api") == "cuMemAlloc_v2"}
    allocs = [e for e in snapshot["device_traces"][0] if e["action"] == "alloc"]
    ours = [e for e in allocs if (e["addr"], e["size"]) not in libraries]
    compare("snapshot", [
        ("libraries' allocations taken out", len(allocs) - len(ours), len(libraries)),
        ("allocations", len(ours), len(theirs)),
    ])
    differ = 0
    for index, (mine, reference) in enumerate(zip(ours, theirs)):
        frames = [(f["filename"], f["line"], f["name"].rsplit(".", 1)[-1])
                  for f in mine["frames"] if f["filename"].endswith(".py")]
        want = [(f["filename"], f["line"], f["name"]) for f in reference["frames"]]
        if mine["size"] != reference["size"] or frames != want:
            differ += 1
            if differ <= 5:
                print(f"    allocation {index}: vramshim {mine['size']} {frames}\n"
                      f"                   torch {reference['size']} {want}")
    compare("snapshot", [("allocations whose size or frames differ", differ, 0)])


def checks_3_and_4():
    snapshots = os.path.join(out_dir, "snapshots")
    os.makedirs(snapshots, exist_ok=True)
    nocache_snapshot = os.path.join(snapshots, "nocache.pickle")
    _, log = run("nocache-mlp", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1",
                                 "JUDGE_SNAPSHOT": nocache_snapshot}, "mlp")
    if 3 in checks:
        print("== check 3: Python stacks of the MLP with caching off")
        check_3(log)
    if 4 in checks:
        print("== check 4: export --pytorch-snapshot against torch's own snapshot")
        with open(nocache_snapshot + ".json") as f:
            compare("snapshot", [("torch's history with caching off", len(json.load(f)), 0)])
        reference = os.path.join(snapshots, "default.pickle")
        run("default-mlp-snapshot", {"JUDGE_SNAPSHOT": reference}, "mlp")
        check_4(log, reference + ".json")


def check_5():
    print("== check 5: vramshim oom on torch's own OutOfMemoryError")
    torch, log = run("oom", {"JUDGE_OOM": "1"}, "mlp")
    compare("oom", [("torch: retries, OOMs", (torch.get("oom_retries"), torch.get("oom_count")),
                     (1, 1))])
    failures = tool_json("oom", "--json", "--stacks", "python", log)["failures"]
    failures = [f for f in failures if f["verdict"] != "other_error"]
    total = device_total(log, 0)
    # torch asks for total // 2 bytes, rounded up to its 2 MiB segment granularity.
    request = -(-(total // 2) // (2 << 20)) * (2 << 20)
    compare("oom", [("failed allocations", len(failures), 2)])
    if len(failures) != 2:
        return
    first, retry = failures
    retried = first.get("retry") or {}
    line = script_line("# JUDGE: oom")
    compare("oom", [
        ("request", first["request"], request),
        ("verdict", first["verdict"], "exceeded_free_memory"),
        ("retry succeeded", retried.get("succeeded"), False),
        ("retry released bytes", retried.get("released_bytes"), torch["oom_released_bytes"]),
        ("retry released segments", retried.get("released_count"),
         torch["oom_released_count"]),
        ("second failure is the retry", retry.get("is_retry_of"), 0),
        ("retry verdict", retry["verdict"], "exceeded_free_memory"),
    ] + [(f"failure {i} line", (f["frames"][0]["file"], f["frames"][0]["line"]),
          (SCRIPT, line)) for i, f in enumerate(failures)])


MIB = 1 << 20
# Check 6's search: at most this many capacities, 1 MiB apart (whatif takes well under a
# second each on the ResNet's recording). 4 MiB apart missed the ResNet's retry that saves
# the run with cuDNN off (138 and 139 MiB beside the libraries on the fakes, between a fit at
# 140 and an OOM at 137).
TIGHT_STEPS = 96


def whatif_row(log, capacity, conf):
    """whatif's row for one configuration at exactly `capacity` bytes."""
    report = tool_json("whatif", "--json", log, "--capacity", str(capacity), "--config", conf)
    return report["configs"][0]


def outcome(row):
    """'oom after retry', 'retry saves' or None: the two cases check 6 wants."""
    if not row.get("library_failure") and row["num_alloc_retries"] >= 1:
        return "oom after retry" if row.get("oom") else "retry saves"
    return None


def library_bytes_live(log):
    """The driver-API (cuMemAlloc) bytes the log holds at its end."""
    live = {}
    for e in events(log):
        if e.get("event") == "alloc" and e.get("api") == "cuMemAlloc_v2":
            live[e["addr"]] = e["size"]
        elif e.get("event") == "free" and e.get("api") == "cuMemFree_v2":
            live.pop(e["addr"], None)
    return sum(live.values())


# Check 6's runs: the ResNet with cuDNN on or off (--tight-cudnn).
TIGHT_ENV = {} if tight_cudnn == "on" else {"JUDGE_CUDNN": "0"}


def check_6_run(label, kind, conf, leave, async_log, lazily):
    """One native ResNet run with a ballast leaving `leave` bytes free, against whatif at the
    bytes left free less `lazily` (the kernels the driver loads after the ballast, which no
    hook sees: 0 on the fakes)."""
    env = dict(TIGHT_ENV, JUDGE_BALLAST_LEAVE=str(leave), JUDGE_LIBRARY_FAILURES="1")
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    torch, log = run(label, env, "resnet")
    held = torch["ballast"]
    free = held["free_after"]
    print(f"  {label:15} {kind}: ballast {held['taken']} bytes, {free} free of "
          f"{held['free_before']}; whatif's capacity {free - lazily}")
    row = whatif_row(async_log, free - lazily, conf)
    check_1(label, torch, log)
    unseen = unseen_bytes(torch, log)
    library = bool(torch["failed"] and torch["failed"].get("library"))
    oom = torch["failed"] is not None and not library
    other = row.get("other_order")
    if other and not ends_as(row, torch, oom) and ends_as(other, torch, oom):
        # This PyTorch breaks best-fit ties by address and the outcome hangs on where the
        # driver puts segments, which a real one varies from run to run: whatif gives both
        # layouts, and the run is judged against the one it followed.
        print(f"  {label:15} torch followed whatif's other address order ({other['order']})")
        row = dict(row, **{k: other[k] for k in ("fits", "peak_reserved", "num_device_alloc",
                                                 "num_device_free", "num_alloc_retries",
                                                 "num_ooms", "oom")})
        kind = outcome(row)
    if library:
        print(f"  {label:15} torch: {torch['failed']['message']}")
    # A run that finished launched every kernel the calibration run did: the same bytes. One
    # that stopped at an OOM may not have reached some of them.
    compare(label, [
        ("bytes taken that no hook saw", unseen if torch["failed"] is None else min(unseen, lazily),
         lazily),
        ("torch raised an OOM", oom, kind == "oom after retry"),
        ("whatif predicts an OOM", row.get("oom") is not None, oom),
        ("a library's allocation failed", library, False),
        ("whatif's library failure", row.get("library_failure") is not None, library),
    ])
    if oom and row.get("oom"):
        check_2_at_oom(label, row["oom"], torch)
    elif not torch["failed"]:
        check_2(label, row, torch)


def ends_as(row, torch, oom):
    """Whether a whatif row (or its other_order) ends as torch's run did: an OOM or not,
    and the peak reserved and cudaMalloc count at its end."""
    if (row.get("oom") is not None) != oom:
        return False
    end = row["oom"] if oom else row
    return (end["peak_reserved"], end["num_device_alloc"]) == \
        (torch["max_memory_reserved"], torch["num_device_alloc"])


def unseen_bytes(torch, log):
    """What the device lost after the ballast less what the log holds at the end (torch's
    segments, the libraries' driver-API allocations): memory no hook saw."""
    held = torch["ballast"]
    libraries_end = library_bytes_live(log) - held["taken"]
    print(f"  {'':15} at the end: {held['free_end']} free, torch reserved "
          f"{held['reserved_end']}, the libraries {libraries_end} (ballast left out)")
    return held["free_after"] - held["free_end"] - held["reserved_end"] - libraries_end


def check_6():
    """Tight capacity on any device: the ResNet's native runs with a ballast
    (JUDGE_BALLAST_LEAVE: the driver's memory taken outside torch until that much is free)
    against whatif on its cudaMallocAsync recording at the bytes left free."""
    print("== check 6: tight capacity by a ballast (ResNet; default and expandable modes; "
          f"cuDNN {tight_cudnn})")
    _, async_log = run("tight-async", dict(TIGHT_ENV,
                                           PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync"),
                       "resnet")
    view = next(d for d in tool_json("allocator", "--json", async_log)["devices"]
                if d["device"] == 0)
    # The libraries' own memory (cuBLAS's and cuDNN's handles, driver-API) shares the card
    # with torch's segments: each capacity tried is some MiB beside their peak.
    libraries = (view.get("libraries") or {}).get("peak", 0)
    print(f"  libraries' peak in the recording: {libraries} bytes")
    # whatif picks the capacities, torch judges them: from the mode's peak at the whole card
    # down, 1 MiB at a time, the first where a retry lets torch's allocator finish (the
    # defaults; expandable segments' retries on this workload never do) and the first where
    # it raises an OOM after a retry.
    total = device_total(async_log, 0)
    # whatif's capacity is what the recorded allocations can use. A real driver loads each
    # kernel's module when it is first launched (CUDA's lazy loading), after the ballast,
    # taking device memory no hook sees (on an H200 with torch 2.11: the first kernel's
    # 96,468,992 bytes and about 20 MB more for this ResNet's cuDNN and cuBLAS kernels). A
    # calibration run with room to spare measures it; each tight run's ballast then leaves
    # that much more. The fakes load nothing lazily (dryrun charges the first kernel and
    # cuBLAS's and cuDNN's kernels, the judge's fakes do not), so there it must be 0, and the
    # run is skipped.
    lazily = 0
    if not fake:
        roomy = whatif_row(async_log, total, "")["peak_reserved"] + libraries + 1024 * MIB
        torch, log = run("tight-calibration", dict(TIGHT_ENV, JUDGE_BALLAST_LEAVE=str(roomy)),
                         "resnet")
        if torch["failed"] is not None:
            raise SystemExit(f"check 6: the calibration run failed with {roomy} bytes free")
        lazily = unseen_bytes(torch, log)
        print(f"  kernels loaded lazily after the ballast (no hook sees them): {lazily} bytes")
    for mode, conf, wanted in (("default", "", ["oom after retry", "retry saves"]),
                               ("expandable", "expandable_segments:True",
                                ["oom after retry"])):
        whole = whatif_row(async_log, total, conf)["peak_reserved"]
        chosen = {}
        fell_back = 0
        for mib in range(whole // MIB, 16, -1)[:TIGHT_STEPS]:
            row = whatif_row(async_log, mib * MIB + libraries, conf)
            if row.get("cudnn_fallbacks") and not fake:
                # whatif survives a cuDNN workspace that did not fit by assuming the next
                # engine needs none (the fake cuDNN's does); a real cuDNN's may ask for
                # another (on an H200, cuDNN 9.19: after 22,450,960 bytes, more than 22 MiB),
                # which the recording cannot tell. Not a prediction to judge on a real card.
                print(f"  tight-{mode}-{mib}: skipped, whatif's outcome rests on "
                      f"{row['cudnn_fallbacks']} cuDNN fallback(s)")
                fell_back += 1
                continue
            kind = outcome(row)
            if kind in wanted and kind not in chosen:
                chosen[kind] = mib
            if len(chosen) == len(wanted):
                break
        if len(chosen) < len(wanted) and fell_back:
            # Not a difference: the capacities that would show the missing cases were not
            # judgeable here (on an H100 with cuDNN 9.19 every one of them was).
            missing = [kind for kind in wanted if kind not in chosen]
            not_judged.append(f"check 6 tight-{mode}: no capacity showing {missing} without a "
                              f"cuDNN fallback ({fell_back} skipped)")
            print(f"  tight-{mode}: NOT JUDGED for {missing}: {fell_back} capacities skipped")
        else:
            compare(f"tight-{mode}", [("cases whatif found", sorted(chosen), wanted)])
        for kind, mib in sorted(chosen.items(), key=lambda item: item[1]):
            check_6_run(f"tight-{mode}-{mib}", kind, conf, mib * MIB + libraries + lazily,
                        async_log, lazily)

# The log's tensor events and torch's own history entries (torch_fakegpu.py's trace mode).
TENSOR_ACTIONS = {"tensor_alloc": "alloc", "tensor_free_requested": "free_requested",
                  "tensor_free": "free_completed", "tensor_segment": "segment_alloc",
                  "tensor_segment_map": "segment_map", "tensor_segment_unmap": "segment_unmap"}


def inside(live, addr, size):
    """Whether [addr, addr + size) lies in the live ranges (start -> end), adjacent ones
    joined."""
    end = addr
    while end < addr + size:
        start = next((a for a, b in live.items() if a <= end < b), None)
        if start is None:
            return False
        end = live[start]
    return True


def check_7():
    """Tensors in the default allocator, recorded by the tracker the shim attaches, against
    torch's own memory history of the same run."""
    print("== check 7: tensors in the default allocator against torch's own history")
    script = os.path.join(ROOT, "tests/python/torch_fakegpu.py")
    for mode, conf in (("default", ""), ("expandable", "expandable_segments:True")):
        label = f"tensors-{mode}"
        # No stacks: this compares addresses and sizes, and stacks of deep torch frames only
        # slow the run.
        env = {"VRAMSHIM_STACK": "none"}
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        torch, log = run_script(label, env, script, "trace")
        entries = [tuple(e) for e in torch["entries"]]
        # Replayed in order: the driver's ranges live at each tensor allocation (cudaMalloc'd
        # segments; expandable segments' cuMemMap'd ranges, adjacent ones joined).
        recorded, live, outside = [], {}, 0
        for e in events(log):
            if e.get("type") != "event" or e.get("result") != 0:
                continue
            action = TENSOR_ACTIONS.get(e.get("event"))
            if action and e.get("api") == "torch.CUDACachingAllocator":
                recorded.append((action, e["addr"], e["size"]))
                if action == "alloc" and not inside(live, e["addr"], e["size"]):
                    outside += 1
            elif e.get("api") == "cudaMalloc" and e.get("event") == "alloc":
                live[e["addr"]] = e["addr"] + e["size"]
            elif e.get("api") == "cudaFree" and e.get("event") == "free":
                live.pop(e["addr"], None)
            elif e.get("api") == "cuMemMap":
                live[e["addr"]] = e["addr"] + e["size"]
            elif e.get("api") == "cuMemUnmap":
                for start in [a for a in live if e["addr"] <= a < e["addr"] + e["size"]]:
                    del live[start]
        ours = recorded[:len(entries)]
        first = next((i for i, (a, b) in enumerate(zip(ours, entries)) if a != b), None)
        if first is not None:
            print(f"  {label:15} first difference at entry {first}: vramshim {ours[first]} "
                  f"torch {entries[first]}")
        compare(label, [
            ("torch's history entries", len(ours), len(entries)),
            ("entries that differ", sum(a != b for a, b in zip(ours, entries)), 0),
            ("blocks outside a recorded segment", outside, 0),
        ])


if (1 in checks or 2 in checks) and workloads != "none":
    checks_1_and_2()
if (1 in checks or 2 in checks) and "--no-ddp" not in options:
    ddp_checks()
if 3 in checks or 4 in checks:
    checks_3_and_4()
if 5 in checks:
    check_5()
if 6 in checks:
    check_6()
if 7 in checks:
    check_7()
for line in not_judged:
    print(f"gpu_judge: not judged: {line}")
print(f"gpu_judge: {bad} difference(s) in {compared} comparisons"
      f"{f', {len(not_judged)} case(s) not judged' if not_judged else ''}; logs under {out_dir}")
sys.exit(1 if bad else 0)

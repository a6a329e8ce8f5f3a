#!/usr/bin/env bash
# GPU smoke test: does the log's peak agree with PyTorch's own figures on a real GPU?
#
# Runs only where `nvidia-smi` works and python3 has PyTorch with CUDA; anywhere else it says
# "skipped: ..." and exits 0. Builds the recorder (release), then trains a small MLP
# (scripts/gpu_smoke.py, a few hundred MiB) under `vramshim run` in four allocator modes:
#   default     the native caching allocator
#   expandable  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
#   async       PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
#   nocache     PYTORCH_NO_CUDA_MEMORY_CACHING=1
# Each run prints PyTorch's figures as JSON; the log is replayed from `vramshim dump --json`
# (peak of live device bytes) and compared with them. Which figure is compared with which
# sum, and why, is written at the top of scripts/gpu_smoke.py. In short:
#   default     live cudaMalloc bytes        == max_memory_reserved()       (exact)
#   expandable  mapped VMM bytes             ~  max_memory_reserved()       (2%)
#   async       live cudaMallocAsync bytes   ~  max_memory_allocated()      (2%; the pool's
#               used high watermark; its reserved high watermark is shown, not compared)
#   nocache     live cudaMalloc bytes        ~  the default run's peak requested bytes (2%;
#               PyTorch keeps no statistics without its cache)
# Memory outside PyTorch's allocator (cuBLAS's own workspace, ...) is printed, not compared.
#
# Environment: PYTHON (default python3), OUT_DIR (where logs and JSON go; default a new
# temporary folder, kept and named at the end), MODES (default "default expandable async
# nocache"; nocache needs default's figures), PYSTACKS (default 1; 0 skips the Python-stack
# check on the async run), WHATIF (default 1; 0 skips the what-if check at
# the end: `vramshim whatif` on the async log against the default and expandable runs), JUDGE
# (default 1; 0 skips the judge: scripts/gpu_judge.py, issue 11's exact checks 1-6).
# Exit status 1 if any mode fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"
python="${PYTHON:-python3}"

skip() {
    echo "skipped: $*"
    exit 0
}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    skip "no NVIDIA GPU (nvidia-smi not found or failing)"
fi
if ! command -v "$python" >/dev/null 2>&1; then
    skip "no $python"
fi
probe="$("$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>/dev/null | tail -n 1 || true)"
case "$probe" in
    "") skip "PyTorch is not importable by $python" ;;
    *" True") ;;
    *) skip "torch.cuda.is_available() is False ($probe)" ;;
esac

echo "== $(nvidia-smi -L | head -n 1)"
echo "== $probe"
target="${CARGO_TARGET_DIR:-$root/target}"
vramshim="$target/release/vramshim"
# A GPU machine may have no Rust toolchain: a release build made elsewhere (same x86-64 Linux,
# an older or equal glibc) and copied into target/release is used as it is.
if command -v cargo >/dev/null 2>&1; then
    echo "== building (cargo build --release)"
    cargo build --release --quiet -p vramshim -p vramshim-report -p vramshim-fakegpu
elif [ -x "$vramshim" ] && [ -f "$target/release/libvramshim.so" ]; then
    echo "== no cargo here: using the release build already in $target/release"
else
    skip "no cargo to build with, and no release build in $target/release"
fi
[ -x "$vramshim" ] || { echo "gpu-smoke: $vramshim missing after the build" >&2; exit 2; }

out_dir="${OUT_DIR:-}"
if [ -z "$out_dir" ]; then
    out_dir="$(mktemp -d "${TMPDIR:-/tmp}/vramshim-gpu-smoke.XXXXXX")"
fi
mkdir -p "$out_dir"
out_dir="$(cd "$out_dir" && pwd)"

modes="${MODES:-default expandable async nocache}"
passed=0
failed=0

echo
printf '%-10s %14s %14s %10s  %s\n' mode "log peak" "torch figure" diff verdict
for mode in $modes; do
    case "$mode" in
        default) setting=() ;;
        expandable) setting=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) ;;
        async) setting=(PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync) ;;
        nocache) setting=(PYTORCH_NO_CUDA_MEMORY_CACHING=1) ;;
        *)
            echo "$mode: unknown mode (default, expandable, async, nocache)  FAIL"
            failed=$((failed + 1))
            continue
            ;;
    esac
    json="$out_dir/$mode.json"
    errors="$out_dir/$mode.stderr"
    rm -f "$json" "$errors" "$out_dir/$mode".*.vlog
    # Only this mode's setting: PyTorch reads them when it starts.
    rc=0
    env -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_ALLOC_CONF -u PYTORCH_NO_CUDA_MEMORY_CACHING \
        ${setting[@]+"${setting[@]}"} \
        "$vramshim" run -o "$out_dir/$mode.%p.vlog" -- \
        "$python" "$root/scripts/gpu_smoke.py" --mode "$mode" >"$json" 2>"$errors" || rc=$?
    pid="$(sed -n 's/.*"pid": *\([0-9][0-9]*\).*/\1/p' "$json" | tail -n 1)"
    if [ "$rc" != 0 ] || [ -z "$pid" ]; then
        if [ "$rc" != 0 ]; then
            echo "$mode: the training run exited with status $rc  FAIL"
        else
            echo "$mode: the training run printed no result line  FAIL"
        fi
        tail -n 8 "$errors" | sed 's/^/           | /'
        failed=$((failed + 1))
        continue
    fi
    log="$out_dir/$mode.$pid.vlog"
    if [ ! -s "$log" ]; then
        echo "$mode: no log $log for pid $pid  FAIL"
        tail -n 8 "$errors" | sed 's/^/           | /'
        failed=$((failed + 1))
        continue
    fi
    if "$vramshim" dump --json "$log" |
        "$python" "$root/scripts/gpu_smoke.py" --replay --mode "$mode" \
            --torch-json "$json" --reference-json "$out_dir/default.json"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
    fi
    echo "           log: $log"
done

# ---------------------------------------------------------------------------------------
# Python stacks (PYSTACKS=0 skips): in the cudaMallocAsync run (one allocation per tensor),
# allocations must be attributed to the model's forward line and the training loop's line
# that calls it, and backward-pass allocations to an autograd thread (pt_autograd_N) with its
# native ...Backward0 frame. Unverified on a real GPU so far.
if [ "${PYSTACKS:-1}" = 1 ]; then
    echo
    echo "== python stacks: forward lines and autograd threads"
    async_pid="$(sed -n 's/.*"pid": *\([0-9][0-9]*\).*/\1/p' "$out_dir/async.json" 2>/dev/null | tail -n 1 || true)"
    async_log="$out_dir/async.$async_pid.vlog"
    if [ -z "$async_pid" ] || [ ! -s "$async_log" ]; then
        echo "stacks: skipped (needs the async run's log; MODES includes async)"
    elif "$vramshim" flamegraph "$async_log" --what allocated --folded --by-thread \
        >"$out_dir/async.folded" 2>"$out_dir/stacks.stderr" &&
        "$python" "$root/scripts/gpu_smoke.py" --mode async --check-stacks <"$out_dir/async.folded"; then
        passed=$((passed + 1))
    else
        tail -n 8 "$out_dir/stacks.stderr" | sed 's/^/           | /'
        failed=$((failed + 1))
    fi
fi

# ---------------------------------------------------------------------------------------
# The allocator what-if against the real allocator (WHATIF=0 skips it).
# `vramshim whatif` replays the async run's per-tensor log through the caching-allocator
# model; its predicted peak reserved must be within 2% of torch.cuda.max_memory_reserved() of
# the default run (config '') and of the expandable run (expandable_segments:True). Needs
# MODES to include async and default (expandable optional). Unverified on a real GPU so far.
if [ "${WHATIF:-1}" = 1 ]; then
    echo
    echo "== whatif: predicted peak reserved vs. PyTorch (2%)"
    async_pid="$(sed -n 's/.*"pid": *\([0-9][0-9]*\).*/\1/p' "$out_dir/async.json" 2>/dev/null | tail -n 1 || true)"
    async_log="$out_dir/async.$async_pid.vlog"
    case " $modes " in
        *" async "*" default "* | *" default "*" async "*) wanted=1 ;;
        *) wanted=0 ;;
    esac
    if [ "$wanted" = 0 ]; then
        echo "whatif: skipped (needs MODES to include async and default)"
    elif [ -z "$async_pid" ] || [ ! -s "$async_log" ] || [ ! -s "$out_dir/default.json" ]; then
        echo "whatif: the async or default run left no log or figures  FAIL"
        failed=$((failed + 1))
    elif ! "$vramshim" whatif --json --config '' --config expandable_segments:True \
        "$async_log" >"$out_dir/whatif.json" 2>"$out_dir/whatif.stderr"; then
        echo "whatif: vramshim whatif failed  FAIL"
        tail -n 8 "$out_dir/whatif.stderr" | sed 's/^/           | /'
        failed=$((failed + 1))
    else
        whatif_rc=0
        "$python" - "$out_dir" <<'PY' || whatif_rc=$?
import json, os, sys
out = sys.argv[1]
def torch_figures(mode):
    path = os.path.join(out, mode + ".json")
    if not os.path.exists(path):
        return None
    lines = [l for l in open(path) if l.lstrip().startswith("{")]
    return json.loads(lines[-1]) if lines else None
report = json.load(open(os.path.join(out, "whatif.json")))
predicted = {c["conf"]: c["peak_reserved"] for c in report["configs"]}
bad = 0
for conf, mode in (("", "default"), ("expandable_segments:True", "expandable")):
    figures = torch_figures(mode)
    name = conf or "(default)"
    if figures is None or not figures.get("max_memory_reserved"):
        print("%-26s no %s run to compare with  SKIP" % (name, mode))
        continue
    want = figures["max_memory_reserved"]
    got = predicted.get(conf)
    diff = (got - want) / want * 100.0 if got is not None else float("inf")
    ok = got is not None and abs(diff) <= 2.0
    print("%-26s predicted %10.1f MiB  torch %10.1f MiB  %+6.2f%%  %s"
          % (name, (got or 0) / 2**20, want / 2**20, diff, "PASS" if ok else "FAIL"))
    bad += 0 if ok else 1
for note in report.get("notes", []):
    print("           note: " + note)
sys.exit(1 if bad else 0)
PY
        if [ "$whatif_rc" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
    fi
fi

# dryrun against this card (DRYRUN=0 skips it): scripts/gpu_dryrun.py runs torch_judge.py's
# workloads natively and under `vramshim dryrun --gpu MODEL` (the preset whose driver name is
# this GPU's, from `vramshim dryrun --list-gpus`) in five allocator modes and compares torch's
# own memory_stats(); every difference is printed and fails the stage. Needs the fake
# libraries beside the vramshim executable (target/release/fakegpu/lib), as dryrun does.
if [ "${DRYRUN:-1}" = 1 ]; then
    echo
    gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
    model="$("$vramshim" dryrun --list-gpus | awk -v name="$gpu_name" 'NR > 1 {
        line = $0; sub(/^[^ ]+ +/, "", line)
        if (index(line, name "  ") == 1) { print $1; exit } }')"
    if [ -z "$model" ]; then
        echo "== dryrun: skipped (no preset names \"$gpu_name\"; vramshim dryrun --list-gpus)"
    else
        echo "== dryrun --gpu $model: torch's figures natively vs on the fakes"
        if "$python" -W ignore "$root/scripts/gpu_dryrun.py" "$vramshim" "$model" "$out_dir/dryrun"; then
            passed=$((passed + 1))
        else
            failed=$((failed + 1))
        fi
    fi
fi

# Issue 11's judge (JUDGE=0 skips it): the fake-GPU suite's checks 1-6 on this GPU, exact
# (tests/python/torch_judge.py per allocator mode, and DDP where there are two GPUs;
# scripts/gpu_judge.py compares each log, whatif prediction, Python stack, snapshot export
# and OOM report with torch's own figures and prints every difference). Check 6 makes this
# card tight: a ballast (the driver's cuMemAlloc, outside torch) leaves the ResNet the
# capacities where whatif predicts an OOM after a retry and a retry that saves the run, and
# torch's figures there are compared with whatif's at the bytes left free.
if [ "${JUDGE:-1}" = 1 ]; then
    echo
    echo "== judge: memory_stats() vs the logs, whatif vs each native mode, tight capacity by a ballast (0 bytes)"
    if "$python" -W ignore scripts/gpu_judge.py "$vramshim" "$target/release/libvramshim.so" \
        "$out_dir/judge"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
    fi
fi

echo
echo "logs, JSON and stderr of each run: $out_dir"
echo "gpu-smoke: $passed passed, $failed failed"
[ "$failed" = 0 ]

#!/usr/bin/env bash
# The cost per PyTorch tensor event (alloc, free_requested, free_completed) of vramshim's
# tracker on the default caching allocator, against PyTorch's own memory history, on the fake
# GPU: a loop allocating and freeing one tensor at Python depth ~10, timed inside the process
# (CPU time of all its threads, the recorder's writer included: wall time is too noisy here),
# under (a) the fakes alone, (b) vramshim (VRAMSHIM_STACK=mixed, native, python, none; and the
# tracker attached but inert),
# (c) _record_memory_history(stacks="python"), (d) stacks="all". Extra cost per event = (time
# - time alone) / events; the ratios vramshim / torch are printed. Median of 3 interleaved
# rounds. BENCH_ITERATIONS sets the loop length (default 20000). Not a test: timings vary.
#
# BENCH_NORMALISED=1: on a host whose speed changes by phases of seconds (a shared VM), each
# process instead alternates BENCH_BLOCKS (default 10) blocks of BENCH_ITERATIONS (default
# there 3000) pairs on the GPU with the same loop allocating on the CPU and prints the median
# ratio of each pair of blocks; costs are then in units of a CPU-loop event, medians of
# BENCH_ROUNDS (default 8) interleaved rounds. The writer thread's lagging work partly falls
# into the CPU blocks, which flatters the shim a little.
#
# BENCH_WORKLOAD=steps: real training steps instead of the loop (scripts/bench_torch_steps.py:
# tests/python/torch_judge.py's MLP, transformer and ResNet trained with Adam, BENCH_STEPS to
# choose (e.g. BENCH_STEPS=bert: a BERT-style encoder, allocations ~25 Python frames deep),
# BENCH_BLOCKS passes timed per process, BENCH_ROUNDS interleaved rounds, default 5),
# under the fakes alone, vramshim (none, mixed, native, python) and PyTorch's history
# ("python", "all", and enabled="state"); tensor events counted from the shim's log and from
# PyTorch's trace; each ratio's median, min and max over the rounds. BENCH_NORMALISED=1 there
# times a CPU reference loop after each block and works on the ratios; BENCH_CALLGRIND=1 counts
# instructions under callgrind instead (one pass a mode).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p vramshim -p vramshim-fakegpu -p vramshim-report --quiet
LIB=$PWD/target/release/fakegpu/lib
SHIM=$PWD/target/release/libvramshim.so
if ! python=$(bash scripts/fetch-torch.sh 2>/dev/null); then
    echo "SKIPPED: PyTorch could not be installed (scripts/fetch-torch.sh)"
    exit 0
fi
if [ "${BENCH_WORKLOAD:-loop}" = steps ]; then
    exec "$python" -W ignore scripts/bench_torch_steps.py "$PWD/target/release"
fi
preload=""
for soname in libcuda.so.1 libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 \
    libnccl.so.2 libnvidia-ml.so.1 libcusparse.so.12 libcusolver.so.12 libcufft.so.12 \
    libcurand.so.10 libnvrtc.so.13 libnvJitLink.so.13 libcupti.so.13 libcufile.so.0 \
    libnvshmem_host.so.3 libcusparseLt.so.0; do
    preload+="$LIB/$soname:"
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/loop.py" <<'PY'
import sys, time
import torch
history = sys.argv[1]
iterations = int(sys.argv[2])
torch.empty(1, device="cuda")  # CUDA and the allocator initialised, first segment taken
if history != "off":
    torch.cuda.memory._record_memory_history(stacks=history, max_entries=3 * iterations + 100)
def alloc_free():
    x = torch.empty(1024, device="cuda")
    del x
def nest(depth):
    if depth == 0:
        for _ in range(iterations):
            alloc_free()
    else:
        nest(depth - 1)
for _ in range(2):
    start = time.process_time()
    nest(8)
    elapsed = time.process_time() - start
print(f"{elapsed / (3 * iterations) * 1e9:.1f}")
PY
cat >"$work/blocks.py" <<'PY'
import sys, time
import torch
history = sys.argv[1]
iterations = int(sys.argv[2])
blocks = int(sys.argv[3])
torch.empty(1, device="cuda")
if history != "off":
    torch.cuda.memory._record_memory_history(
        stacks=history, max_entries=3 * iterations * blocks // 2 + 100
    )
def alloc_free(device):
    x = torch.empty(1024, device=device)
    del x
def nest(depth, device):
    if depth == 0:
        for _ in range(iterations):
            alloc_free(device)
    else:
        nest(depth - 1, device)
nest(8, "cuda")
nest(8, "cpu")
ratios = []
for _ in range(blocks):
    start = time.process_time()
    nest(8, "cuda")
    middle = time.process_time()
    nest(8, "cpu")
    ratios.append((middle - start) / (time.process_time() - middle))
ratios.sort()
print(f"{ratios[len(ratios) // 2]:.4f}")
PY
if [ "${BENCH_NORMALISED:-0}" = 1 ]; then
    n=${BENCH_ITERATIONS:-3000}
    blocks=${BENCH_BLOCKS:-10}
    brun() { # history, extra env...
        local history=$1
        shift
        env LD_LIBRARY_PATH="$LIB" VRAMSHIM_OUTPUT="$work/%p.vlog" "$@" \
            "$python" -W ignore "$work/blocks.py" "$history" "$n" "$blocks"
        rm -f "$work"/*.vlog
    }
    declare -A ratios
    for _ in $(seq "${BENCH_ROUNDS:-8}"); do
        ratios[alone]+="$(brun off LD_PRELOAD="$preload") "
        ratios[vramshim_none]+="$(brun off LD_PRELOAD="$SHIM:$preload" VRAMSHIM_STACK=none) "
        ratios[vramshim_mixed]+="$(brun off LD_PRELOAD="$SHIM:$preload" VRAMSHIM_STACK=mixed) "
        ratios[torch_python]+="$(brun python LD_PRELOAD="$preload") "
        ratios[torch_all]+="$(brun all LD_PRELOAD="$preload") "
    done
    median_of() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{v[NR]=$1} END {
        print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2 }'; }
    echo "== GPU-loop / CPU-loop time per process (median of $blocks block pairs of $n pairs)"
    declare -A med
    for name in alone vramshim_none vramshim_mixed torch_python torch_all; do
        med[$name]=$(median_of "${ratios[$name]}")
        printf '%-16s %8s (runs: %s)\n' "$name" "${med[$name]}" "${ratios[$name]}"
    done
    awk -v a="${med[alone]}" -v none="${med[vramshim_none]}" -v m="${med[vramshim_mixed]}" \
        -v tp="${med[torch_python]}" -v ta="${med[torch_all]}" 'BEGIN {
        printf "== cost above the fakes alone, in CPU-loop events\n"
        printf "vramshim none   %.3f\nvramshim mixed  %.3f\n", none-a, m-a
        printf "torch python    %.3f\ntorch all       %.3f\n", tp-a, ta-a
        printf "vramshim mixed / torch stacks=python: %.2f (goal <= 0.5)\n", (m-a)/(tp-a)
        printf "vramshim mixed / torch stacks=all:    %.2f (goal <= 0.1)\n", (m-a)/(ta-a)
    }'
    exit 0
fi
n=${BENCH_ITERATIONS:-20000}
run() { # name, history, extra env...
    local history=$1
    shift
    env LD_LIBRARY_PATH="$LIB" VRAMSHIM_OUTPUT="$work/%p.vlog" "$@" \
        "$python" -W ignore "$work/loop.py" "$history" "$n"
}
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
declare -A times
names=(alone tracker_inert vramshim_none vramshim_python vramshim_native vramshim_mixed
    torch_python torch_all)
for _ in 1 2 3; do
    times[alone]+="$(run off LD_PRELOAD="$preload") "
    # The tracker attached but ignoring every entry: what PyTorch pays to report to it.
    times[tracker_inert]+="$(run off LD_PRELOAD="$SHIM:$preload" VRAMSHIM_STACK=none \
        VRAMSHIM_TEST_TORCH_LAYOUT_BREAK=1 2>/dev/null) "
    times[vramshim_none]+="$(run off LD_PRELOAD="$SHIM:$preload" VRAMSHIM_STACK=none) "
    times[vramshim_mixed]+="$(run off LD_PRELOAD="$SHIM:$preload" VRAMSHIM_STACK=mixed) "
    times[vramshim_native]+="$(run off LD_PRELOAD="$SHIM:$preload" VRAMSHIM_STACK=native) "
    times[vramshim_python]+="$(run off LD_PRELOAD="$SHIM:$preload" VRAMSHIM_STACK=python) "
    times[torch_python]+="$(run python LD_PRELOAD="$preload") "
    times[torch_all]+="$(run all LD_PRELOAD="$preload") "
    rm -f "$work"/*.vlog
done
declare -A med
echo "== ns per tensor event (median of 3; $n alloc+free pairs, 3 events each)"
for name in "${names[@]}"; do
    med[$name]=$(tr ' ' '\n' <<<"${times[$name]}" | grep . | median)
    printf '%-16s %8s ns/event (runs: %s)\n' "$name" "${med[$name]}" "${times[$name]}"
done
echo "== extra cost per event over the fakes alone, and ratios"
awk -v a="${med[alone]}" -v m="${med[vramshim_mixed]}" -v nat="${med[vramshim_native]}" \
    -v py="${med[vramshim_python]}" -v tp="${med[torch_python]}" -v ta="${med[torch_all]}" \
    -v inert="${med[tracker_inert]}" -v none="${med[vramshim_none]}" 'BEGIN {
    printf "tracker inert   %7.1f ns (PyTorch building and passing each entry)\n", inert-a
    printf "vramshim none   %7.1f ns\n", none-a
    printf "vramshim mixed  %7.1f ns\nvramshim native %7.1f ns\nvramshim python %7.1f ns\n", m-a, nat-a, py-a
    printf "torch python    %7.1f ns\ntorch all       %7.1f ns\n", tp-a, ta-a
    printf "vramshim mixed / torch stacks=python: %.2f (goal <= 0.5)\n", (m-a)/(tp-a)
    printf "vramshim mixed / torch stacks=all:    %.2f (goal <= 0.1)\n", (m-a)/(ta-a)
}'

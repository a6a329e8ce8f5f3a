#!/usr/bin/env bash
# Prints the cost of CUDA calls through the fake GPU libraries (budget: at most 1 us per call),
# with and without the device ledger (VRAMSHIM_FAKEGPU_LEDGER),
# and, when scripts/fetch-torch.sh can provide PyTorch, the time per training step of a small
# MLP with Adam on the fakes alone and under `vramshim dryrun` (recorder on), default and
# cudaMallocAsync allocators, medians of 3 interleaved rounds. BENCH_ITERATIONS sets the loop length (default 200000).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p vramshim-fakegpu --quiet
LIB=$PWD/target/release/fakegpu/lib
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
gcc -O2 -o "$WORK/calls" fakegpu/bench/calls.c -L"$LIB" -Wl,-rpath-link,"$LIB" -l:libcudart.so.13
gcc -O2 -o "$WORK/ledger" fakegpu/bench/ledger.c -L"$LIB" -Wl,-rpath-link,"$LIB" -l:libcudart.so.13
echo "== CUDA calls through the fakes (one thread)"
LD_LIBRARY_PATH=$LIB "$WORK/calls" "${BENCH_ITERATIONS:-200000}"
# The device ledger that `vramshim dryrun` always sets: without it, then with it (a fresh file),
# this process alone, beside 1, 2, 4 and 8 other processes on the card, beside three on the other
# cards (BENCH_LEDGER_ROUNDS: rounds of each, the fastest printed; default 1).
for ledger in "" "$WORK/device-ledger"; do
    if [ -n "$ledger" ]; then echo "== With a device ledger"; else echo "== Without a device ledger"; fi
    VRAMSHIM_FAKEGPU_COUNT=4 VRAMSHIM_FAKEGPU_LEDGER=$ledger LD_LIBRARY_PATH=$LIB "$WORK/ledger" \
        "${BENCH_ITERATIONS:-200000}" "${BENCH_LEDGER_ROUNDS:-1}"
done

echo "== PyTorch training step on the fakes"
if ! python=$(bash scripts/fetch-torch.sh 2>/dev/null); then
    echo "SKIPPED: PyTorch could not be installed (scripts/fetch-torch.sh)"
    exit 0
fi
preload=""
for soname in libcuda.so.1 libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 \
    libnccl.so.2 libnvidia-ml.so.1 libcusparse.so.12 libcusolver.so.12 libcufft.so.12 \
    libcurand.so.10 libnvrtc.so.13 libnvJitLink.so.13 libcupti.so.13 libcufile.so.0 \
    libnvshmem_host.so.3 libcusparseLt.so.0; do
    preload+="$LIB/$soname:"
done
step_script=$(mktemp --suffix=.py)
logs=$(mktemp -d)
trap 'rm -rf "$step_script" "$logs"' EXIT
cat >"$step_script" <<'PY'
import time
import torch
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 1024)).cuda()
optimizer = torch.optim.Adam(model.parameters())
data = torch.randn(512, 1024, device="cuda")
def step():
    optimizer.zero_grad()
    model(data).square().mean().backward()
    optimizer.step()
for _ in range(3):
    step()
torch.cuda.synchronize()
steps = 50
start = time.perf_counter()
for _ in range(steps):
    step()
torch.cuda.synchronize()
print(f"{(time.perf_counter() - start) / steps * 1e3:.3f}")
PY
VRAMSHIM=${VRAMSHIM:-target/release/vramshim}
[ -x "$VRAMSHIM" ] || VRAMSHIM=target/debug/vramshim
# One round: the step time on the fakes alone, then under `vramshim dryrun` (fakes and recorder).
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
for conf in "" "backend:cudaMallocAsync"; do
    plain=() dry=()
    for _ in 1 2 3; do
        plain+=("$(PYTORCH_CUDA_ALLOC_CONF=$conf LD_PRELOAD=$preload LD_LIBRARY_PATH=$LIB \
            "$python" -W ignore "$step_script")")
        dry+=("$(PYTORCH_CUDA_ALLOC_CONF=$conf VRAMSHIM_FAKEGPU_DIR=$(dirname "$LIB") \
            "$VRAMSHIM" dryrun --json -o "$logs/%p.vlog" -- "$python" -W ignore "$step_script" \
            2>&1 >/dev/null | tail -n 1)")
    done
    p=$(printf '%s\n' "${plain[@]}" | median)
    d=$(printf '%s\n' "${dry[@]}" | median)
    printf 'MLP 1024-4096-1024, batch 512, Adam, allocator %-24s fakes only %6.3f ms/step   dryrun (recorded) %6.3f ms/step   ratio %.2fx\n' \
        "${conf:-default}:" "$p" "$d" "$(awk -v a="$d" -v b="$p" 'BEGIN {print a / b}')"
done

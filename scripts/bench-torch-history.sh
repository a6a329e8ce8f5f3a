#!/usr/bin/env bash
# Check 6 of issue 11: vramshim's CPU cost per recorded event against PyTorch's own
# `_record_memory_history(stacks="python")` and `stacks="all"`, on the same workload
# (tests/python/torch_judge.py churn: 200 Adam steps of a tiny MLP) on the fake GPU, as ratios
# from one run. Both are CPU-side costs, so the fakes measure them. Medians of
# BENCH_ROUNDS (default 3) interleaved rounds of the process's CPU time (user + sys, all
# threads) over the workload only (torch's import and a warm-up round excluded).
#   torch history:  default allocator, history on vs off; events = torch's trace entries
#   vramshim:       PYTORCH_NO_CUDA_MEMORY_CACHING=1 (one cudaMalloc/cudaFree per tensor, the
#                   recording `whatif` replays), recorder on vs off; events = logged
#                   allocations and frees (VRAMSHIM_STACK as set, default mixed)
# Per-allocation costs divide by the tensors the workload allocates (the same in every mode).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p vramshim-fakegpu -p vramshim -p vramshim-report --quiet
if ! python=$(bash scripts/fetch-torch.sh 2>/dev/null | tail -1); then
    echo "SKIPPED: PyTorch could not be installed (scripts/fetch-torch.sh)"
    exit 0
fi
exec "$python" -W ignore scripts/bench_torch_history.py "$PWD/target/release"

#!/usr/bin/env bash
# Throughput of the PyTorch caching-allocator model (crate vramshim-sim).
#
# Builds sim/examples/bench.rs in release mode and runs it on a synthetic training-like
# stream of 10 million requests (two streams, many small and medium tensors allocated and
# freed in LIFO order per iteration, a few large ones, varying batch shapes): first with the
# default settings, then with expandable_segments:True. Each run prints requests/s and the
# ratio to the budget of 2,000,000 simulated requests per second.
#
# Arguments are passed to both runs (e.g. --requests 2000000 for a quick check).
# Only the simulator's work is timed (request generation is not). The budget is judged on the
# time the simulating thread spent on a CPU (Linux schedstat), which a busy machine does not
# inflate; the wall-clock rate and the share of wall time the thread got are printed too.
# Exit status 1 when a run is below the budget, else 0.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "== building (cargo build --release -p vramshim-sim --example bench)"
cargo build --release --quiet -p vramshim-sim --example bench
bench="${CARGO_TARGET_DIR:-$PWD/target}/release/examples/bench"
[ -x "$bench" ] || { echo "bench-allocator: missing $bench after the build" >&2; exit 2; }

status=0
for conf in "" "expandable_segments:True"; do
    echo
    "$bench" --conf "$conf" "$@" || status=1
done
exit "$status"

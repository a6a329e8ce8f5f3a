#!/usr/bin/env bash
# The first command to try: records a toy training run and shows what the log holds.
#
# No GPU needed: tests/fake/ holds a small fake CUDA driver (libcuda.so.1) and runtime
# (libcudart.so.12) that hand out made-up device addresses from a pretend 2 GiB GPU. The
# recorder cannot tell them from the real libraries, so what you see here is what you would
# see on a real GPU.
#
# Needs Rust, gcc and Python 3. Usage: scripts/demo.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
target="${CARGO_TARGET_DIR:-$PWD/target}"

echo "== building the recorder (libvramshim.so) and the vramshim tool"
cargo build --quiet -p vramshim -p vramshim-report
echo "== building the fake CUDA driver/runtime and the demo program (gcc)"
bash tests/build-c.sh "$target/c"

vramshim="$target/debug/vramshim"
fakes="$target/c/lib"
demo="$target/c/bin/demo"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/vramshim-demo.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
log="$tmp/demo.vlog"

# The demo "trains" for 5 steps, leaks a 16 MiB buffer per step, then fails a 1200 MiB
# allocation that would have fit without the leaks. LD_LIBRARY_PATH makes it load the fake
# libraries; FAKECUDA_MEM sets the fake GPU's size.
echo
echo "== running: vramshim run -o $log -- demo"
LD_LIBRARY_PATH="$fakes${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" FAKECUDA_MEM=2G \
    "$vramshim" run -o "$log" -- "$demo"

# The log starts with the module map and the distinct call stacks (raw addresses, for
# offline symbolisation); they are left out here so that the events fit on the screen.
echo
echo "== vramshim dump (first 25 lines; module and stack records left out)"
"$vramshim" dump "$log" | grep -Ev '^(module|stack) ' | head -n 25 || true

# A tally from the JSON form (one object per line), the way a script would read it.
echo
echo "== tally, from vramshim dump --json"
"$vramshim" dump --json "$log" | python3 -c '
import json, sys
from collections import Counter

def mib(n):
    return "%.0f MiB" % (n / 2**20)

count, size, records = Counter(), Counter(), Counter()
live, current, peak = {}, 0, 0
for line in sys.stdin:
    rec = json.loads(line)
    records[rec["type"]] += 1
    if rec["type"] != "event":
        continue
    key = (rec["event"], rec["api"])
    count[key] += 1
    size[key] += rec["size"]
    if rec["device"] < 0 or rec["result"] != 0:
        continue  # pinned host memory (device -1) and failed calls hold no device memory
    if rec["event"] == "alloc":
        live[rec["addr"]] = rec["size"]
        current += rec["size"]
        peak = max(peak, current)
    elif rec["event"] == "free":
        current -= live.pop(rec["addr"], 0)

print("%-14s %-16s %6s %12s" % ("event", "api", "count", "bytes asked"))
for (event, api), n in sorted(count.items()):
    asked = mib(size[(event, api)]) if event != "free" else "-"
    print("%-14s %-16s %6d %12s" % (event, api, n, asked))
print("records: " + ", ".join("%d %s" % (n, t) for t, n in sorted(records.items())))
print("device memory: peak %s, still allocated at exit %s in %d block(s)"
      % (mib(peak), mib(current), len(live)))
'
echo
echo "Next, on your own program (a GPU and the real CUDA libraries this time):"
echo "  $vramshim run -- python train.py"
echo "  $vramshim dump vramshim-train.<pid>.vlog"

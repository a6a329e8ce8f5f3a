#!/usr/bin/env bash
# The first command to try: records a toy training run and shows what vramshim says about it.
#
# No GPU needed: tests/fake/ holds a small fake CUDA driver (libcuda.so.1) and runtime
# (libcudart.so.12) that hand out made-up device addresses from a pretend 2 GiB GPU. The
# recorder cannot tell them from the real libraries, so what you see here is what you would
# see on a real GPU.
#
# Needs Rust, gcc and Python 3. Usage: scripts/demo.sh [DIR]
# The log and the pictures stay in DIR (default: target/demo), and the script ends with the
# commands to look at them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
target="${CARGO_TARGET_DIR:-$PWD/target}"
out="${1:-$target/demo}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

echo "== building the recorder (libvramshim.so) and the vramshim tool (the first build takes a few minutes)"
cargo build -p vramshim -p vramshim-report
echo "== building the fake CUDA driver/runtime and the demo program (gcc)"
bash tests/build-c.sh "$target/c"
echo "   built $target/c/lib/libcuda.so.1, libcudart.so.12 and $target/c/bin/demo"

vramshim="$target/debug/vramshim"
fakes="$target/c/lib"
demo="$target/c/bin/demo"
log="$out/demo.vlog"

# The demo "trains" for 5 steps, leaks a 16 MiB buffer per step, then fails a 1200 MiB
# allocation that would have fit without the leaks. LD_LIBRARY_PATH makes it load the fake
# libraries; FAKECUDA_MEM sets the fake GPU's size.
echo
echo "== running: vramshim run -o $log -- demo"
LD_LIBRARY_PATH="$fakes${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" FAKECUDA_MEM=2G \
    "$vramshim" run -o "$log" -- "$demo"

echo
echo "== vramshim report: peak per device, what held it, calls by API family"
"$vramshim" report "$log"

echo
echo "== vramshim leaks: still allocated at exit, by call stack"
"$vramshim" leaks "$log" --frames 3

echo
echo "== vramshim oom: why the 1200 MiB allocation failed"
"$vramshim" oom "$log" --frames 3 --top 3

echo
echo "== vramshim timeline (and the same as a picture: --svg)"
COLUMNS=${COLUMNS:-90} "$vramshim" timeline "$log" --device 0 --svg "$out/timeline.svg"

echo
echo "== vramshim flamegraph --what leaks --folded (pictures: flame graphs of the leaks and of the OOM)"
"$vramshim" flamegraph "$log" --what leaks --folded
"$vramshim" flamegraph "$log" --what leaks -o "$out/leaks.svg"
"$vramshim" flamegraph "$log" --what oom -o "$out/oom.svg"

echo
echo "== vramshim html: all of it in one page"
"$vramshim" html "$log" -o "$out/report.html"

echo
echo "The log and the pictures are kept in $out:"
echo "  xdg-open $out/report.html       # the whole report, in a browser (works offline)"
echo "  xdg-open $out/timeline.svg      # also leaks.svg, oom.svg: SVG opens in any browser"
echo "  $vramshim report $log   # or peak, leaks, oom, timeline, dump ... on the log"
echo
echo "Next, on your own program (a GPU and the real CUDA libraries this time):"
echo "  $vramshim run -- python train.py"
echo "  $vramshim report vramshim-train.<pid>.vlog     # then peak, leaks, oom, timeline, flamegraph"
echo "  $vramshim dump vramshim-train.<pid>.vlog       # every record"

#!/usr/bin/env bash
# Reproduce docs/real-cuda-probe.md: fetch the real libraries, build the helpers, and write
#   OUTDIR/cudart-probe.log   real_cudart under LD_PRELOAD=libprobe.so (dlopen/dlsym/resolver log)
#   OUTDIR/driver.log         real_driver (resolver answers, cuInit & co. before/after cuInit)
#   OUTDIR/nm-libcuda.txt     nm -D --defined-only of libcuda
#   OUTDIR/readelf-libcuda.txt readelf -d of libcuda
# usage: tests/real/run-probe.sh OUTDIR
# Prints "skipped: real libraries unavailable" and exits 0 when they cannot be fetched.
set -euo pipefail
if [[ $# -ne 1 ]]; then
    echo "usage: $0 OUTDIR" >&2
    exit 64
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$1
mkdir -p "$out"
rc=0
libs=$("$root/scripts/fetch-real-cuda.sh" | tail -n1) || rc=$?
if [[ $rc -eq 3 ]]; then
    echo "skipped: real libraries unavailable"
    exit 0
elif [[ $rc -ne 0 ]]; then
    exit "$rc"
fi
"$here/build.sh" "$out/bin"
LD_LIBRARY_PATH=$libs LD_PRELOAD=$out/bin/libprobe.so "$out/bin/real_cudart" >"$out/cudart-probe.log" 2>&1
LD_LIBRARY_PATH=$libs "$out/bin/real_driver" >"$out/driver.log" 2>&1
nm -D --defined-only "$libs/libcuda.so.1" >"$out/nm-libcuda.txt"
readelf -d "$libs/libcuda.so.1" >"$out/readelf-libcuda.txt"
echo "logs in $out (libraries from $libs)"

#!/usr/bin/env bash
# Build the real-library test helpers into OUTDIR:
#   OUTDIR/real_cudart   drives the real libcudart.so.12 (dlopen'ed; no CUDA headers needed)
#   OUTDIR/real_driver   calls the real libcuda.so.1 directly (resolver answers, cuInit, ...)
#   OUTDIR/libprobe.so   LD_PRELOAD logger of dlopen/dlsym and of cuGetProcAddress look-ups
# usage: tests/real/build.sh OUTDIR
set -euo pipefail
if [[ $# -ne 1 ]]; then
    echo "usage: $0 OUTDIR" >&2
    exit 64
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$1
mkdir -p "$out"
CC=${CC:-gcc}
cflags=(-g -O1 -Wall -Wextra -Werror)
"$CC" "${cflags[@]}" -o "$out/real_cudart" "$here/real_cudart.c" -ldl
"$CC" "${cflags[@]}" -o "$out/real_driver" "$here/real_driver.c" -ldl
"$CC" "${cflags[@]}" -shared -fPIC -o "$out/libprobe.so" "$here/probe_preload.c" -ldl -lpthread

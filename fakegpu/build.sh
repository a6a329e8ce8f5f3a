#!/usr/bin/env bash
# Build the fake NVIDIA libraries into OUTDIR/lib (scratch: OUTDIR/obj). gcc and binutils only;
# no CUDA toolkit. Idempotent: only what changed is rebuilt. See fakegpu/README.md.
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: fakegpu/build.sh OUTDIR" >&2; exit 2; }
exec python3 "$(dirname "$0")/build.py" "$(dirname "$0")" "$1"

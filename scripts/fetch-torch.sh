#!/usr/bin/env bash
# Install, once, a real PyTorch CUDA wheel from PyPI into a cached virtual environment for
# the fake-GPU tests (tests/tests/fakegpu_torch.rs): torch itself with --no-deps, plus its
# pure-Python dependencies at the versions that torch release pins; none of NVIDIA's wheels
# (the fakes stand in for them).
#
# usage: fetch-torch.sh [VERSION]   (default $VRAMSHIM_TORCH_VERSION, else 2.15.0)
# The releases the tests use: 2.15.0 (PyPI's build for CUDA 13), 2.6.0 and 2.4.1 (PyPI's builds
# for CUDA 12.4 and 12.1: libcudart.so.12, cuBLAS 12, cuDNN 9).
# Cache: ${VRAMSHIM_CACHE:-$HOME/.cache/vramshim}/torch-<version>/ (a venv; the file VERSION
#        inside is written last: its presence marks a complete install).
# stdout: the venv's python, as the last (only) line. Everything else goes to stderr.
# Exit 3 with a one-line message on stderr when torch cannot be installed (no network, ...).
set -euo pipefail

[[ $# -le 1 ]] || { echo "usage: scripts/fetch-torch.sh [VERSION]" >&2; exit 2; }
TORCH_VERSION=${1:-${VRAMSHIM_TORCH_VERSION:-2.15.0}}
[[ $TORCH_VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || {
    echo "fetch-torch: not a torch release number: '$TORCH_VERSION'" >&2
    exit 2
}

CACHE_ROOT=${VRAMSHIM_CACHE:-${HOME:-/tmp}/.cache/vramshim}
VENV=$CACHE_ROOT/torch-$TORCH_VERSION

say() { printf 'fetch-torch: %s\n' "$*" >&2; }
unavailable() {
    printf 'fetch-torch: torch unavailable: %s\n' "$*" >&2
    exit 3
}

if [[ -f $VENV/VERSION ]]; then
    say "reusing $VENV ($(cat "$VENV/VERSION"))"
    printf '%s\n' "$VENV/bin/python"
    exit 0
fi

[[ $(uname -m) == x86_64 ]] || unavailable "only x86_64 is supported (this is $(uname -m))"
command -v python3 >/dev/null 2>&1 || unavailable "python3 not found"
mkdir -p "$CACHE_ROOT" || unavailable "cannot create $CACHE_ROOT"

# Serialise concurrent callers (parallel test runs).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE_ROOT/torch-$TORCH_VERSION.lock"
    flock 9
    if [[ -f $VENV/VERSION ]]; then
        printf '%s\n' "$VENV/bin/python"
        exit 0
    fi
fi

rm -rf "$VENV"
say "creating $VENV"
python3 -m venv "$VENV" >&2 || unavailable "python3 -m venv failed (is the venv module installed?)"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check --no-input)
log=$CACHE_ROOT/torch-$TORCH_VERSION-pip.log
say "installing torch==$TORCH_VERSION (500-900 MB) with --no-deps"
"${pip[@]}" install --no-deps --only-binary=:all: --retries 2 --timeout 60 \
    "torch==$TORCH_VERSION" >"$log" 2>&1 || {
    tail -n 3 "$log" >&2
    rm -rf "$VENV"
    unavailable "pip install torch==$TORCH_VERSION failed"
}
# torch's own requirements at its pins (sympy==1.13.1 for 2.6), less NVIDIA's CUDA packages and
# triton (only torch.compile needs triton) and those whose environment marker is false here.
pure_deps=$("$VENV/bin/python" - <<'PY'
import importlib.metadata as metadata
from pip._vendor.packaging.requirements import Requirement
for text in metadata.requires("torch") or []:
    requirement = Requirement(text)
    if requirement.name.startswith(("nvidia-", "cuda-", "triton")):
        continue
    if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
        print(str(requirement).split(";")[0].strip())
PY
) || unavailable "cannot read torch's requirements"
mapfile -t pure_deps <<<"$pure_deps"
say "installing torch's pure-Python dependencies: ${pure_deps[*]}"
"${pip[@]}" install --only-binary=:all: --retries 2 --timeout 60 "${pure_deps[@]}" \
    >>"$log" 2>&1 || {
    tail -n 3 "$log" >&2
    rm -rf "$VENV"
    unavailable "pip install of torch's dependencies failed"
}
installed=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))') ||
    unavailable "torch does not report its version"
printf 'torch==%s installed %s\n' "$installed" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$VENV/VERSION"
say "installed torch $installed in $VENV"
printf '%s\n' "$VENV/bin/python"

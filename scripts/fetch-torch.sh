#!/usr/bin/env bash
# Install, once, the real PyTorch CUDA wheel from PyPI into a cached virtual environment for
# the fake-GPU tests (tests/tests/fakegpu_torch.rs): torch itself with --no-deps, plus its
# pure-Python dependencies; none of NVIDIA's wheels (the fakes stand in for them).
#
# Cache: ${VRAMSHIM_CACHE:-$HOME/.cache/vramshim}/torch-<version>/ (a venv; the file VERSION
#        inside is written last: its presence marks a complete install).
# stdout: the venv's python, as the last (only) line. Everything else goes to stderr.
# Exit 3 with a one-line message on stderr when torch cannot be installed (no network, ...).
set -euo pipefail

TORCH_VERSION=${VRAMSHIM_TORCH_VERSION:-2.15.0}
PURE_DEPS=(filelock typing-extensions sympy networkx jinja2 fsspec mpmath MarkupSafe)

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
    exec 9>"$CACHE_ROOT/torch.lock"
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
say "installing torch==$TORCH_VERSION (about 540 MB) with --no-deps"
"${pip[@]}" install --no-deps --only-binary=:all: --retries 2 --timeout 60 \
    "torch==$TORCH_VERSION" >"$CACHE_ROOT/torch-pip.log" 2>&1 || {
    tail -n 3 "$CACHE_ROOT/torch-pip.log" >&2
    rm -rf "$VENV"
    unavailable "pip install torch==$TORCH_VERSION failed"
}
say "installing torch's pure-Python dependencies: ${PURE_DEPS[*]}"
"${pip[@]}" install --only-binary=:all: --retries 2 --timeout 60 "${PURE_DEPS[@]}" \
    >>"$CACHE_ROOT/torch-pip.log" 2>&1 || {
    tail -n 3 "$CACHE_ROOT/torch-pip.log" >&2
    rm -rf "$VENV"
    unavailable "pip install of torch's dependencies failed"
}
installed=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))') ||
    unavailable "torch does not report its version"
printf 'torch==%s installed %s\n' "$installed" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$VENV/VERSION"
say "installed torch $installed in $VENV"
printf '%s\n' "$VENV/bin/python"

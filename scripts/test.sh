#!/usr/bin/env bash
# The whole test suite: formatting, lints, build, unit and end-to-end tests.
# Needs only what a fresh machine has (Rust, gcc, Python 3); downloads crates and, for the
# real-driver test, NVIDIA's libcudart / libcuda (cached under ~/.cache/vramshim).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

if rustup component list --installed 2>/dev/null | grep -q rustfmt || command -v rustfmt >/dev/null; then
  step "cargo fmt --check"
  cargo fmt --all -- --check
fi
if rustup component list --installed 2>/dev/null | grep -q clippy || cargo clippy --version >/dev/null 2>&1; then
  step "cargo clippy -D warnings"
  cargo clippy --workspace --all-targets --quiet -- -D warnings
fi
step "cargo build"
cargo build --workspace --quiet
step "cargo test"
cargo test --workspace --quiet 2>&1
# The decoder under libFuzzer (installs cargo-fuzz on first use); VRAMSHIM_FUZZ_SECONDS=0 skips.
if [ "${VRAMSHIM_FUZZ_SECONDS:-60}" != 0 ]; then
  step "fuzz the log decoder (scripts/fuzz.sh)"
  bash scripts/fuzz.sh
fi

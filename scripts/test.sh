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
# Real PyTorch for the fake-GPU tests (tests/tests/fakegpu_torch.rs, RELEASES there): 2.15.0
# (CUDA 13), 2.6.0 and 2.4.1 (CUDA 12), each installed once into ~/.cache/vramshim. Without one, its
# tests are skipped, and the summary says so; with VRAMSHIM_REQUIRE_TORCH=1 (CI) that is a
# failure.
step "real PyTorch for the fake-GPU tests (scripts/fetch-torch.sh)"
skipped=()
for release in 2.15.0 2.6.0 2.4.1; do
  if ! bash scripts/fetch-torch.sh "$release" >/dev/null; then
    if [ "${VRAMSHIM_REQUIRE_TORCH:-0}" = 1 ]; then
      echo "torch $release could not be installed and VRAMSHIM_REQUIRE_TORCH=1" >&2
      exit 1
    fi
    skipped+=("SKIPPED: real PyTorch $release on the fake GPU (fakegpu_torch): torch could not be installed")
  fi
done
step "cargo test"
# Tests that cannot run (a download impossible here, an interpreter not installed) append a
# line to this file: the summary below names each one.
skip_file=$(mktemp)
trap 'rm -f "$skip_file"' EXIT
VRAMSHIM_SKIPPED_FILE="$skip_file" cargo test --workspace --quiet 2>&1
# The decoder under libFuzzer (installs cargo-fuzz on first use); VRAMSHIM_FUZZ_SECONDS=0 skips.
if [ "${VRAMSHIM_FUZZ_SECONDS:-60}" != 0 ]; then
  step "fuzz the log decoder (scripts/fuzz.sh)"
  bash scripts/fuzz.sh
fi

step "summary"
while IFS= read -r line; do skipped+=("$line"); done < <(sort -u "$skip_file")
if [ ${#skipped[@]} -eq 0 ]; then
  echo "nothing skipped"
else
  printf '%s\n' "${skipped[@]}"
fi

#!/usr/bin/env bash
# Fuzzes the log decoder and the report commands with cargo-fuzz (libFuzzer), on stable Rust.
#
#   scripts/fuzz.sh                 every target for 60 s (VRAMSHIM_FUZZ_SECONDS to change)
#   scripts/fuzz.sh decode          only the named target(s)
#
# Targets (fuzz/fuzz_targets/):
#   decode         arbitrary bytes as a whole log: read to the end without a panic, the same
#                  whatever the read sizes.
#   decode_chunk   arbitrary bytes as the payload of a well-formed chunk after a valid header,
#                  so records are decoded past the checksum; what decodes must round-trip.
#   decode_header  arbitrary bytes as the body of a well-formed header; must round-trip.
#   report         the bytes choose records with extreme values (u64::MAX sizes and addresses,
#                  i32::MIN/MAX devices, times jumping and going backwards, frees without
#                  allocations, stacks of up to 256 frames, unknown ids, bogus module maps),
#                  encoded as a well-formed log and read by one report command (report, peak,
#                  leaks, oom, timeline, flamegraph, diff, html, export, breakdown, steps or
#                  advise); no panic, hang (10 s) or
#                  more than 2 GiB.
#
# Installs cargo-fuzz into ~/.cargo/bin when it is missing. cargo-fuzz needs unstable rustc
# flags (sancov passes, -Zsanitizer); RUSTC_BOOTSTRAP=1 lets the stable toolchain take them.
# Targets run side by side, VRAMSHIM_FUZZ_JOBS at a time (default: the number of CPUs), each
# on one core for the full time. The sanitizer is VRAMSHIM_FUZZ_SANITIZER (default none:
# the format crate has no unsafe code, and AddressSanitizer costs 10-20x fewer runs; `address`
# works too).
# Seeds are small synthetic logs (format/examples/synth.rs), with compressed, with plain and
# with continued chunks, written into fuzz/corpus/ at run time together with their plain chunks' payloads and
# header bodies; what the fuzzer adds there is
# kept between runs (the folder is not committed).
# Exits non-zero if a target crashes, panics, hangs (10 s per input) or runs out of memory;
# the input that did it is saved under fuzz/artifacts/<target>/, and the log says how to
# replay it.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${VRAMSHIM_FUZZ_SECONDS:-60}
sanitizer=${VRAMSHIM_FUZZ_SANITIZER:-none}
jobs=${VRAMSHIM_FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
if [ $# -gt 0 ]; then
  targets=("$@")
else
  targets=(decode decode_chunk decode_header report)
fi

step() { printf '\n== %s\n' "$*"; }
# cargo-fuzz passes nightly-only flags; RUSTC_BOOTSTRAP=1 makes stable rustc accept them.
fuzz() { RUSTC_BOOTSTRAP=1 cargo fuzz "$@"; }

if ! cargo fuzz --version >/dev/null 2>&1; then
  step "cargo install cargo-fuzz"
  started=$(date +%s)
  cargo install cargo-fuzz --locked --version 0.13.2
  echo "cargo-fuzz installed in $(($(date +%s) - started)) s"
fi

step "cargo fuzz build (sanitizer $sanitizer)"
build_log=$(mktemp "${TMPDIR:-/tmp}/vramshim-fuzz-build.XXXXXX")
if ! fuzz build --sanitizer "$sanitizer" >"$build_log" 2>&1; then
  tail -n 60 "$build_log"
  echo "FAILED: cargo fuzz build (full log: $build_log)"
  exit 1
fi
grep -E '^\s*Finished' "$build_log" || true
rm -f "$build_log"

step "fuzz seeds"
cargo build --release --quiet -p vramshim-format --example synth
synth="${CARGO_TARGET_DIR:-target}/release/examples/synth"
mkdir -p fuzz/corpus/decode fuzz/corpus/decode_chunk fuzz/corpus/decode_header fuzz/corpus/report
for spec in 1:1 2:5 3:20 4:60; do
  seed=${spec%%:*}
  events=${spec##*:}
  "$synth" --seed "$seed" --events "$events" -o "fuzz/corpus/decode/synth-$seed-$events.vlog" >/dev/null 2>&1
  # Plain chunks too (crash path, version 1); their payloads seed decode_chunk.
  "$synth" --seed "$seed" --events "$events" --plain \
    -o "fuzz/corpus/decode/synth-$seed-$events-plain.vlog" >/dev/null 2>&1
  # Continued chunks (format 6) of a few records each; their plain payloads seed decode_chunk.
  "$synth" --seed "$seed" --events "$events" --continued 4 \
    -o "fuzz/corpus/decode/synth-$seed-$events-continued.vlog" >/dev/null 2>&1
done
# decode_chunk takes a bare chunk payload, decode_header a bare header body: cut them out.
python3 - fuzz/corpus <<'EOF'
import os, struct, sys
corpus = sys.argv[1]
for name in sorted(os.listdir(os.path.join(corpus, "decode"))):
    if not name.startswith("synth-"):
        continue
    data = open(os.path.join(corpus, "decode", name), "rb").read()
    header_len = struct.unpack_from("<I", data, 12)[0]
    with open(os.path.join(corpus, "decode_header", name + ".header"), "wb") as out:
        out.write(data[20:20 + header_len])
    pos = 20 + header_len
    index = 0
    # Key chunks ("VSCK" plain, "VSCZ" compressed: 12-byte heads) and continued ones (0xC5
    # plain, 0xC7 compressed: kind, LEB128 length, CRC-32); plain payloads are kept. A
    # continued payload decoded from a fresh state is still records to decode.
    while pos < len(data):
        if data[pos:pos + 4] in (b"VSCK", b"VSCZ") and pos + 12 <= len(data):
            plain = data[pos:pos + 4] == b"VSCK"
            length = struct.unpack_from("<I", data, pos + 4)[0]
            start = pos + 12
        elif data[pos] in (0xC5, 0xC7):
            plain = data[pos] == 0xC5
            length, shift, at = 0, 0, pos + 1
            while at < len(data) and shift < 64:
                byte = data[at]
                length |= (byte & 0x7F) << shift
                shift += 7
                at += 1
                if byte < 0x80:
                    break
            start = at + 4
        else:
            break
        if plain:
            with open(os.path.join(corpus, "decode_chunk", f"{name}.chunk{index}"), "wb") as out:
                out.write(data[start:start + length])
            index += 1
        pos = start + length
EOF
for target in "${targets[@]}"; do
  echo "$target: $(find "fuzz/corpus/$target" -type f | wc -l) inputs in fuzz/corpus/$target"
done

step "cargo fuzz run: ${targets[*]} (${seconds} s each, $jobs at a time, sanitizer $sanitizer)"
logs=$(mktemp -d "${TMPDIR:-/tmp}/vramshim-fuzz.XXXXXX")
running=0
for target in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  (
    rc=0
    fuzz run "$target" --sanitizer "$sanitizer" -- \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      >"$logs/$target.log" 2>&1 || rc=$?
    echo "$rc" >"$logs/$target.rc"
  ) &
  running=$((running + 1))
done
wait

passed=0
failed=0
for target in "${targets[@]}"; do
  log="$logs/$target.log"
  rc=$(cat "$logs/$target.rc" 2>/dev/null || echo "?")
  runs=$(grep -oE 'Done [0-9]+ runs in [0-9]+ second' "$log" | tail -n 1 || true)
  if [ "$rc" != 0 ] || [ -z "$runs" ]; then
    echo "---- $target (last lines of $log)"
    tail -n 60 "$log"
    echo "FAILED: fuzz target $target (exit $rc); full log: $log"
    failed=$((failed + 1))
  else
    passed=$((passed + 1))
    echo "$target: ${runs}s, no finding  [$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 | sed 's/^#[0-9]*[[:space:]]*DONE[[:space:]]*//')]"
  fi
done
echo "fuzz: $passed passed, $failed failed"
if [ "$failed" != 0 ]; then
  exit 1
fi
rm -rf "$logs"

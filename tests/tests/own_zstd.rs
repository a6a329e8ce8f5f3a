//! The recorder compresses its chunks with its own, statically linked zstd: a program that
//! uses the system's libzstd at the same time must see no zstd symbol from the preload in its
//! global scope and get exactly what it gets without the recorder
//! (`tests/programs/own_zstd.c`, which dlopens `libzstd.so.1`).

mod common;

use common::*;
use vramshim_format::chunk_spans;

const PAIRS: usize = 50_000;

/// (plain, compressed) chunk counts of a well-formed log (key and continued chunks).
fn chunk_kinds(bytes: &[u8]) -> (usize, usize) {
    let spans = chunk_spans(bytes);
    let end = spans.last().map_or(0, |span| span.start + span.len());
    assert_eq!(end, bytes.len(), "the chunks do not end with the file");
    let compressed = spans.iter().filter(|span| span.compressed).count();
    (spans.len() - compressed, compressed)
}

#[test]
fn a_program_using_the_system_libzstd_is_unaffected_by_the_recorders_own() {
    let pairs = PAIRS.to_string();
    let plain = run_plain("own_zstd", &[&pairs], &[]);
    if plain.status.code() == Some(3) {
        skipped("no system libzstd.so.1 to load (own_zstd)");
        return;
    }
    assert!(
        plain.status.success(),
        "own_zstd without the shim: {}",
        String::from_utf8_lossy(&plain.stderr)
    );
    // The recorder's in-process compression on (off by default): its zstd beside the program's.
    let run = run_under_shim(
        "own-zstd",
        "own_zstd",
        &[&pairs],
        &[("VRAMSHIM_COMPRESS", "1")],
    );
    assert!(
        run.output.status.success(),
        "own_zstd under the shim: {}",
        run.stderr()
    );
    // The same lines with and without the recorder: no zstd symbol in the global scope, the
    // system library's version, ZSTD_compress from libzstd.so.1, the same compressed sizes.
    let stdout = run.stdout();
    assert_eq!(stdout, String::from_utf8_lossy(&plain.stdout));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0],
        "global ZSTD_compress=absent ZSTD_versionNumber=absent"
    );
    assert!(
        lines[1].starts_with("zstd version=") && lines[1].ends_with(" compress_from=libzstd.so.1"),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].starts_with(&format!("done pairs={PAIRS} roundtrips=50 packed=")),
        "{}",
        lines[2]
    );

    // Meanwhile the recorder compressed its own chunks, and they read back whole.
    let log = run.log();
    let bytes = std::fs::read(&log).expect("read log");
    let (_, compressed) = chunk_kinds(&bytes);
    assert!(compressed >= 2, "compressed chunks: {compressed}");
    let dump = dump(&log);
    assert!(
        !dump.iter().any(|line| line["type"] == "damage"),
        "damage in {log:?}"
    );
    let events = events(&dump);
    assert_eq!(select(&events, "alloc", "cuMemAlloc_v2").len(), PAIRS);
    assert_eq!(select(&events, "free", "cuMemFree_v2").len(), PAIRS);
    assert_eq!(events.len(), 2 * PAIRS);
}

//! Compressed chunks (format version 2) end to end: what the real recorder writes reads back
//! exactly, damaged or torn compressed chunks lose only themselves, logs mixing plain and
//! compressed chunks read whole, and a log written by the version 1 recorder still reads.

mod common;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use common::{run_under_shim, scratch, tool};
use serde_json::Value;
use vramshim_format::{
    CHUNK_HEADER_LEN, CHUNK_MAGIC, COMPRESSED_CHUNK_MAGIC, ChunkBuilder, Event, EventKind,
    FORMAT_VERSION, Header, Record,
};

/// One chunk of a log file: its marker, where it starts and its whole length.
#[derive(Clone, Copy, Debug)]
struct ChunkSpan {
    magic: [u8; 4],
    start: usize,
    len: usize,
}

/// The chunks of a well-formed log, walked through their heads; a continued chunk (format 6)
/// has its first byte as its `magic`.
fn chunks(bytes: &[u8]) -> Vec<ChunkSpan> {
    let spans: Vec<ChunkSpan> = vramshim_format::chunk_spans(bytes)
        .into_iter()
        .map(|span| ChunkSpan {
            magic: if span.key {
                bytes[span.start..span.start + 4]
                    .try_into()
                    .expect("4 bytes")
            } else {
                [bytes[span.start], 0, 0, 0]
            },
            start: span.start,
            len: span.len(),
        })
        .collect();
    let end = spans.last().map_or(0, |span| span.start + span.len);
    assert_eq!(end, bytes.len(), "the chunks do not end with the file");
    spans
}

/// How many of `spans` are compressed chunks, key or continued.
fn compressed_count(spans: &[ChunkSpan]) -> usize {
    spans
        .iter()
        .filter(|span| {
            span.magic == COMPRESSED_CHUNK_MAGIC
                || span.magic[0] == vramshim_format::CONTINUED_COMPRESSED_CHUNK
        })
        .count()
}

/// `vramshim dump --json LOG`: exit code and the JSON lines.
fn dump(log: &Path) -> (Option<i32>, Vec<Value>) {
    let output = tool(&[OsStr::new("dump"), OsStr::new("--json"), log.as_os_str()]);
    let lines = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|err| panic!("{err}: {line}")))
        .collect();
    (output.status.code(), lines)
}

/// `vramshim dump --counts --json LOG`: (chunks, key chunks, compressed chunks, events).
fn chunk_counts(log: &Path) -> (u64, u64, u64, u64) {
    let output = tool(&[
        OsStr::new("dump"),
        OsStr::new("--counts"),
        OsStr::new("--json"),
        log.as_os_str(),
    ]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    // The header's line first, then the counts'.
    let counts: Value = text
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["type"] == "counts")
        .unwrap_or_else(|| panic!("no counts line: {text}"));
    let field = |name: &str| {
        counts[name]
            .as_u64()
            .unwrap_or_else(|| panic!("{name}: {text}"))
    };
    (
        field("chunks"),
        field("key_chunks"),
        field("compressed_chunks"),
        field("events"),
    )
}

fn of_type<'a>(lines: &'a [Value], kind: &str) -> Vec<&'a Value> {
    lines.iter().filter(|line| line["type"] == kind).collect()
}

/// (kind, t_ns, addr, size) of each event line.
fn event_keys(lines: &[Value]) -> Vec<(String, u64, u64, u64)> {
    of_type(lines, "event")
        .into_iter()
        .map(|line| {
            (
                line["event"].as_str().expect("event kind").to_owned(),
                line["t_ns"].as_u64().expect("t_ns"),
                line["addr"].as_u64().expect("addr"),
                line["size"].as_u64().expect("size"),
            )
        })
        .collect()
}

#[test]
fn a_real_process_log_is_compressed_and_reads_back_exactly() {
    const THREADS: usize = 2;
    const PAIRS: usize = 20_000;
    let run = run_under_shim(
        "compressed-real",
        "bench",
        &[&THREADS.to_string(), &PAIRS.to_string(), "8"],
        &[
            ("FAKECUDA_MEM", "unlimited"),
            ("VRAMSHIM_STACK", "native"),
            // The in-process compression, kept as an option (off by default).
            ("VRAMSHIM_COMPRESS", "1"),
        ],
    );
    assert!(
        run.output.status.success(),
        "bench failed: {}",
        run.stderr()
    );
    let log = run.log();
    let bytes = std::fs::read(&log).expect("read log");
    let spans = chunks(&bytes);
    let compressed = compressed_count(&spans);
    assert!(
        compressed > 0,
        "no compressed chunk among {} chunks",
        spans.len()
    );

    let (code, lines) = dump(&log);
    assert_eq!(code, Some(0));
    assert_eq!(lines[0]["version"], FORMAT_VERSION);
    assert!(of_type(&lines, "damage").is_empty(), "damage in {log:?}");
    // Every thread's PAIRS allocations of 4096 bytes, each freed by that thread's next
    // event, at the address it got; times never go backwards.
    let events = of_type(&lines, "event");
    assert_eq!(events.len(), THREADS * PAIRS * 2);
    let mut by_thread: HashMap<u64, Vec<&Value>> = HashMap::new();
    let mut last_t = 0;
    for event in &events {
        let t = event["t_ns"].as_u64().expect("t_ns");
        assert!(t >= last_t, "time went backwards at {event}");
        last_t = t;
        by_thread
            .entry(event["thread"].as_u64().expect("thread"))
            .or_default()
            .push(event);
    }
    assert_eq!(by_thread.len(), THREADS, "threads: {:?}", by_thread.keys());
    for (thread, events) in &by_thread {
        assert_eq!(events.len(), PAIRS * 2, "thread {thread}");
        for pair in events.chunks(2) {
            let (alloc, free) = (pair[0], pair[1]);
            assert_eq!(
                (
                    &alloc["event"],
                    &alloc["api"],
                    &alloc["size"],
                    &alloc["result"]
                ),
                (
                    &Value::from("alloc"),
                    &Value::from("cuMemAlloc_v2"),
                    &Value::from(4096),
                    &Value::from(0)
                ),
                "{alloc}"
            );
            assert_eq!(
                (&free["event"], &free["api"], &free["addr"]),
                (
                    &Value::from("free"),
                    &Value::from("cuMemFree_v2"),
                    &alloc["addr"]
                ),
                "{free}"
            );
            assert_ne!(alloc["stack"], 0, "{alloc}");
        }
    }
    // A repetitive loop costs far less than the 8.5 bytes per event of plain chunks.
    let per_event = bytes.len() as f64 / events.len() as f64;
    assert!(per_event < 3.0, "{per_event:.2} bytes per event");

    // The report commands read the same: every event, everything freed.
    let output = tool(&[OsStr::new("leaks"), log.as_os_str()]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains(&format!("{} events over", THREADS * PAIRS * 2)),
        "{text}"
    );
    assert!(
        text.contains("no leaks: everything allocated was freed"),
        "{text}"
    );
}

/// The recorder writes plain chunks unless `VRAMSHIM_COMPRESS=1`; an odd value warns once and
/// keeps the default. The same events either way.
#[test]
fn the_recorder_compresses_only_when_asked() {
    const PAIRS: usize = 20_000;
    for (label, value) in [("default", None), ("on", Some("1")), ("odd", Some("zstd"))] {
        let mut env = vec![("FAKECUDA_MEM", "unlimited"), ("VRAMSHIM_STACK", "native")];
        env.extend(value.map(|v| ("VRAMSHIM_COMPRESS", v)));
        let run = run_under_shim(
            &format!("compress-{label}"),
            "bench",
            &["1", &PAIRS.to_string(), "8"],
            &env,
        );
        assert!(run.output.status.success(), "{label}: {}", run.stderr());
        let stderr = run.stderr();
        if label == "odd" {
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
            assert!(
                stderr.starts_with("vramshim: ") && stderr.contains("VRAMSHIM_COMPRESS=\"zstd\""),
                "{stderr}"
            );
        } else {
            assert_eq!(stderr, "", "{label}");
        }
        let log = run.log();
        let bytes = std::fs::read(&log).expect("read log");
        let spans = chunks(&bytes);
        let compressed = compressed_count(&spans);
        if label == "on" {
            assert!(
                compressed > 0,
                "{label}: no compressed chunk of {}",
                spans.len()
            );
        } else {
            assert_eq!(compressed, 0, "{label}: {} chunks", spans.len());
        }
        let (code, lines) = dump(&log);
        assert_eq!(code, Some(0), "{label}");
        assert!(of_type(&lines, "damage").is_empty(), "{label}");
        assert_eq!(of_type(&lines, "event").len(), 2 * PAIRS, "{label}");
    }
}

fn header() -> Header {
    Header {
        version: FORMAT_VERSION,
        pid: 7,
        ppid: 1,
        argv: vec!["crafted".into()],
        start_unix_ns: 1_700_000_000_000_000_000,
        start_mono_ns: 1_000,
        hostname: "crafted-host".into(),
        env: Vec::new(),
        apis: vec!["cudaMalloc".into(), "cudaFree".into()],
        stack_mode: "none".into(),
        mode: "stream".into(),
        recorder: "crafted".into(),
        time_resolution_ns: 1,
    }
}

/// `CHUNKS` chunks of `PER_CHUNK` alloc/free events each, times 100 + i*37 ns.
const CHUNKS: usize = 4;
const PER_CHUNK: usize = 2_000;

fn chunk_records(chunk: usize) -> Vec<Record> {
    (0..PER_CHUNK)
        .map(|i| {
            let n = chunk * PER_CHUNK + i;
            let alloc = i % 2 == 0;
            Record::Event(Event {
                kind: if alloc {
                    EventKind::Alloc
                } else {
                    EventKind::Free
                },
                api: if alloc { 0 } else { 1 },
                t_ns: 100 + n as u64 * 37,
                thread: 11,
                addr: 0x7000_0000 + (n as u64 / 2 % 8) * 0x10_0000,
                size: if alloc { 1 << 20 } else { 0 },
                ..Event::default()
            })
        })
        .collect()
}

/// The events of `chunks` as `event_keys` gives them.
fn expected_keys(chunks: &[usize]) -> Vec<(String, u64, u64, u64)> {
    chunks
        .iter()
        .flat_map(|&chunk| chunk_records(chunk))
        .map(|record| match record {
            Record::Event(event) => (
                match event.kind {
                    EventKind::Alloc => "alloc".to_owned(),
                    _ => "free".to_owned(),
                },
                event.t_ns,
                event.addr,
                event.size,
            ),
            other => panic!("not an event: {other:?}"),
        })
        .collect()
}

/// A log of `CHUNKS` chunks; `plain` says which are written uncompressed.
fn crafted_log(plain: &[usize]) -> Vec<u8> {
    let mut out = header().encode();
    let mut builder = ChunkBuilder::new();
    for chunk in 0..CHUNKS {
        for record in chunk_records(chunk) {
            builder.push(&record);
        }
        if plain.contains(&chunk) {
            builder.finish_into(&mut out);
        } else {
            builder.finish_compressed_into(&mut out);
        }
    }
    out
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write crafted log");
    path
}

/// The one damage line of `lines`: its offset and message.
fn only_damage(lines: &[Value]) -> (u64, String) {
    let damage = of_type(lines, "damage");
    assert_eq!(damage.len(), 1, "{damage:?}");
    (
        damage[0]["offset"].as_u64().expect("offset"),
        damage[0]["message"].as_str().expect("message").to_owned(),
    )
}

#[test]
fn compressed_and_plain_chunks_mix_in_one_log() {
    let dir = scratch("compressed-mixed");
    let bytes = crafted_log(&[1, 3]);
    let kinds: Vec<[u8; 4]> = chunks(&bytes).iter().map(|span| span.magic).collect();
    assert_eq!(
        kinds,
        [
            COMPRESSED_CHUNK_MAGIC,
            CHUNK_MAGIC,
            COMPRESSED_CHUNK_MAGIC,
            CHUNK_MAGIC
        ]
    );
    let log = write(&dir, "mixed.log", &bytes);
    let (code, lines) = dump(&log);
    assert_eq!(code, Some(0));
    assert!(of_type(&lines, "damage").is_empty());
    assert_eq!(event_keys(&lines), expected_keys(&[0, 1, 2, 3]));
    // Four key chunks, two of them compressed, every event read.
    assert_eq!(chunk_counts(&log), (4, 4, 2, (CHUNKS * PER_CHUNK) as u64));
}

#[test]
fn dump_counts_the_chunks_read_key_and_continued() {
    // A key chunk, two continued ones (the second plain), a key chunk, a continued one: five
    // chunks, two of them key, four compressed. With the second chunk's payload damaged, it
    // and the continued chunk after it are lost (they carry on from it), and the counts say
    // so: three chunks read, the events of chunks 0, 3 and 4.
    let dir = scratch("compressed-chunk-counts");
    let mut out = header().encode();
    let mut builder = ChunkBuilder::new().with_continued_chunks();
    for chunk in 0..5 {
        if chunk == 3 {
            builder.request_key();
        }
        for record in chunk_records(chunk % CHUNKS) {
            builder.push(&record);
        }
        if chunk == 2 {
            builder.finish_into(&mut out);
        } else {
            builder.finish_compressed_into(&mut out);
        }
    }
    let whole = (5 * PER_CHUNK) as u64;
    assert_eq!(
        chunk_counts(&write(&dir, "whole.log", &out)),
        (5, 2, 4, whole)
    );
    let spans = chunks(&out);
    let keys: Vec<bool> = spans
        .iter()
        .map(|span| span.magic == COMPRESSED_CHUNK_MAGIC || span.magic == CHUNK_MAGIC)
        .collect();
    assert_eq!(keys, [true, false, false, true, false]);
    let second = spans[1];
    out[second.start + second.len / 2] ^= 0x55;
    assert_eq!(
        chunk_counts(&write(&dir, "damaged.log", &out)),
        (3, 2, 3, whole - 2 * PER_CHUNK as u64)
    );
}

#[test]
fn a_damaged_compressed_chunk_is_skipped_and_reading_goes_on() {
    let dir = scratch("compressed-damaged");
    let mut bytes = crafted_log(&[]);
    let spans = chunks(&bytes);
    assert!(
        spans
            .iter()
            .all(|span| span.magic == COMPRESSED_CHUNK_MAGIC)
    );
    let second = spans[1];
    bytes[second.start + second.len / 2] ^= 0x55;
    let (code, lines) = dump(&write(&dir, "damaged.log", &bytes));
    assert_eq!(code, Some(0));
    let (offset, message) = only_damage(&lines);
    assert_eq!(offset, second.start as u64);
    assert!(message.contains("checksum mismatch"), "{message}");
    assert_eq!(event_keys(&lines), expected_keys(&[0, 2, 3]));
}

#[test]
fn a_compressed_chunk_that_does_not_decompress_is_skipped() {
    // The checksum matches (recomputed after the damage): the decompressor itself must
    // notice, report it and let the reader carry on.
    let dir = scratch("compressed-bad-frame");
    let mut bytes = crafted_log(&[]);
    let third = chunks(&bytes)[2];
    let payload = third.start + CHUNK_HEADER_LEN..third.start + third.len;
    // Past the zstd frame header (4 magic bytes, 2 of descriptor and length): block data.
    for byte in &mut bytes[payload.start + 12..payload.end] {
        *byte = 0xff;
    }
    let crc = crc32(&bytes[payload.clone()]);
    bytes[third.start + 8..third.start + 12].copy_from_slice(&crc.to_le_bytes());
    let (code, lines) = dump(&write(&dir, "bad-frame.log", &bytes));
    assert_eq!(code, Some(0));
    let (offset, message) = only_damage(&lines);
    assert_eq!(offset, third.start as u64);
    assert!(message.contains("does not decompress"), "{message}");
    assert_eq!(event_keys(&lines), expected_keys(&[0, 1, 3]));
}

#[test]
fn a_torn_compressed_tail_reads_to_the_last_whole_chunk() {
    let dir = scratch("compressed-torn");
    let bytes = crafted_log(&[]);
    let last = chunks(&bytes)[CHUNKS - 1];
    for cut in [
        last.start + 3,
        last.start + CHUNK_HEADER_LEN + 2,
        last.start + last.len - 1,
    ] {
        let (code, lines) = dump(&write(&dir, &format!("torn-{cut}.log"), &bytes[..cut]));
        assert_eq!(code, Some(0), "cut at {cut}");
        let (offset, message) = only_damage(&lines);
        assert_eq!(offset, last.start as u64, "cut at {cut}");
        assert!(message.contains("incomplete chunk"), "{message}");
        assert_eq!(
            event_keys(&lines),
            expected_keys(&[0, 1, 2]),
            "cut at {cut}"
        );
    }
}

#[test]
fn a_log_of_the_version_1_recorder_still_reads_exactly() {
    // Recorded by the version 1 shim (plain chunks only) from the alloc/free loop of
    // scripts/bench_peers.c (40 pairs, depth 3); the JSON is that version's own dump of it.
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let log = fixtures.join("v1-alloc-free.log");
    let expected = std::fs::read_to_string(fixtures.join("v1-alloc-free.json")).expect("fixture");
    let output = tool(&[OsStr::new("dump"), OsStr::new("--json"), log.as_os_str()]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    // The same as that version's own dump, but for the header's time resolution, which later
    // readers add: 1 ns, as every log of that recorder is.
    let stdout = String::from_utf8_lossy(&output.stdout);
    let (header, rest) = stdout.split_once('\n').expect("header line");
    let (expected_header, expected_rest) = expected.split_once('\n').expect("header line");
    let mut header: serde_json::Value = serde_json::from_str(header).expect("JSON");
    let resolution = header
        .as_object_mut()
        .and_then(|fields| fields.remove("time_resolution_ns"));
    assert_eq!(resolution, Some(serde_json::json!(1)));
    assert_eq!(
        header,
        serde_json::from_str::<serde_json::Value>(expected_header).expect("JSON")
    );
    assert_eq!(rest, expected_rest);
    let bytes = std::fs::read(&log).expect("fixture");
    assert_eq!(bytes[8..12], 1u32.to_le_bytes());
    assert!(chunks(&bytes).iter().all(|span| span.magic == CHUNK_MAGIC));
    let (_, lines) = dump(&log);
    assert_eq!(of_type(&lines, "event").len(), 80);
}

#[test]
fn a_log_of_the_version_3_recorder_still_reads_exactly() {
    // Recorded by the version 3 shim (every entry-point name spelled out in the header, repeats
    // with their time deltas; a compressed chunk, then the exit record's plain chunk) from the
    // alloc/free loop of scripts/bench_peers.c (40 pairs, depth 3); the JSON is that version's
    // own dump of it.
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let log = fixtures.join("v3-alloc-free.log");
    let expected = std::fs::read_to_string(fixtures.join("v3-alloc-free.json")).expect("fixture");
    let output = tool(&[OsStr::new("dump"), OsStr::new("--json"), log.as_os_str()]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), expected);
    let bytes = std::fs::read(&log).expect("fixture");
    assert_eq!(bytes[8..12], 3u32.to_le_bytes());
    let magics: Vec<[u8; 4]> = chunks(&bytes).iter().map(|span| span.magic).collect();
    assert_eq!(magics, [COMPRESSED_CHUNK_MAGIC, CHUNK_MAGIC]);
    let (_, lines) = dump(&log);
    assert_eq!(of_type(&lines, "event").len(), 80);
    assert_eq!(lines[0]["apis"].as_array().map(Vec::len), Some(81));
}

#[test]
fn a_log_of_the_version_4_recorder_still_reads_exactly() {
    // Recorded by the version 4 shim at VRAMSHIM_TIME_RESOLUTION=10ms with native stacks
    // (entry points as runs of the frozen table, times in 10 ms units, one-byte same-time
    // repeats, each module's three addresses in full, every chunk's thread starting at 0, the
    // exit record in a chunk of its own) from the alloc/free loop of scripts/bench_peers.c
    // (40 pairs, depth 3); the JSON is that version's own dump of it.
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let log = fixtures.join("v4-alloc-free.log");
    let expected = std::fs::read_to_string(fixtures.join("v4-alloc-free.json")).expect("fixture");
    let output = tool(&[OsStr::new("dump"), OsStr::new("--json"), log.as_os_str()]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), expected);
    let bytes = std::fs::read(&log).expect("fixture");
    assert_eq!(bytes[8..12], 4u32.to_le_bytes());
    let magics: Vec<[u8; 4]> = chunks(&bytes).iter().map(|span| span.magic).collect();
    assert_eq!(magics, [COMPRESSED_CHUNK_MAGIC, CHUNK_MAGIC]);
    let (_, lines) = dump(&log);
    assert_eq!(of_type(&lines, "event").len(), 80);
    assert_eq!(of_type(&lines, "module").len(), 8);
    assert_eq!(lines[0]["time_resolution_ns"], 10_000_000);
}

/// CRC-32 (IEEE), as the format uses.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

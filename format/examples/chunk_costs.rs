//! What the recorder's writer pays per chunk: re-chunks a log's records as a writer that seals a
//! chunk every N records does (continued chunks, as the recorder writes them), then encodes and
//! compresses them with each zstd setting in its own function, for counting under callgrind.
//!
//! ```text
//! cargo build --release -p vramshim-format --example chunk_costs
//! valgrind --tool=callgrind --callgrind-out-file=OUT target/release/examples/chunk_costs LOG 84
//! callgrind_annotate --inclusive=yes OUT | grep chunk_costs::
//! ```
//!
//! A third argument `--no-free-pairs` writes a block's `tensor_free_requested` and
//! `tensor_free` as two records, as format versions before 7 did (the same binary's before).
//!
//! Prints the records, the chunks and each setting's bytes (payloads only; the writer's way
//! counts the chunks' heads too); the instructions are callgrind's inclusive counts of
//! `encode_chunks` (the records encoded, no compression), of each `compress_*` function and of
//! `writer_chunks` (encoding and compression as the library does both).
//! `compress_stream_*` compress a 20-chunk key interval (or, `compress_one_stream_*`, all
//! chunks) as one zstd stream, each chunk ending with `ZSTD_e_flush`: format 8's idea, measured
//! and not taken (docs/tensor-cost-rounds.md, "Fourteenth round (compression, 2026-11-28, issue 12)").

use std::fs::File;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use vramshim_format::{CONTINUED_CHUNK, ChunkBuilder, Item, LogReader, Record};

/// `--no-free-pairs`: builders write as format 6 did.
static NO_FREE_PAIRS: AtomicBool = AtomicBool::new(false);

/// The builder each way of writing starts from.
fn builder() -> ChunkBuilder {
    let chunk = ChunkBuilder::new().with_continued_chunks();
    if NO_FREE_PAIRS.load(Ordering::Relaxed) {
        chunk.without_free_pairs()
    } else {
        chunk
    }
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(path), per_chunk) = (args.next(), args.next()) else {
        eprintln!("usage: chunk_costs LOG [RECORDS_PER_CHUNK] [--no-free-pairs]");
        return ExitCode::from(2);
    };
    if args.next().as_deref() == Some("--no-free-pairs") {
        NO_FREE_PAIRS.store(true, Ordering::Relaxed);
    }
    let per_chunk: usize = per_chunk.and_then(|n| n.parse().ok()).unwrap_or(84).max(1);
    let reader = match File::open(&path).map(LogReader::new) {
        Ok(Ok(reader)) => reader,
        Ok(Err(err)) => {
            eprintln!("chunk_costs: {path}: {err}");
            return ExitCode::from(2);
        }
        Err(err) => {
            eprintln!("chunk_costs: {path}: {err}");
            return ExitCode::from(2);
        }
    };
    let records: Vec<Record> = reader
        .filter_map(|item| match item {
            Item::Record(record) => Some(record),
            _ => None,
        })
        .collect();
    let events: Vec<Record> = records
        .iter()
        .filter(|record| matches!(record, Record::Event(_)))
        .cloned()
        .collect();
    println!(
        "{} events encoded alone: {} plain payload bytes",
        events.len(),
        encode_events(&events, per_chunk)
            .iter()
            .map(Vec::len)
            .sum::<usize>()
    );
    let chunks = encode_chunks(&records, per_chunk);
    let payloads: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
    let raw: usize = payloads.iter().map(|p| p.len()).sum();
    let mut crc = crc32fast::Hasher::new();
    payloads.iter().for_each(|payload| crc.update(payload));
    println!(
        "{} records, {} chunks of {per_chunk} records, {raw} plain payload bytes (CRC-32 {:08x})",
        records.len(),
        payloads.len(),
        crc.finalize()
    );
    println!("zstd level 1: {} bytes", compress_level_1(&payloads));
    println!(
        "zstd level 1, target length 1 (raw literals): {} bytes",
        compress_level_1_raw_literals(&payloads)
    );
    println!("zstd level -1: {} bytes", compress_level_minus_1(&payloads));
    println!(
        "zstd level -2 (the writer's for chunks under 16 KiB): {} bytes",
        compress_level_minus_2(&payloads)
    );
    println!(
        "zstd level -2, hashLog 8: {} bytes",
        compress_level_minus_2_hash_log_8(&payloads)
    );
    println!(
        "zstd level -2, one stream a key interval of 20 chunks, ZSTD_e_flush a chunk: {} bytes",
        compress_stream_minus_2(&payloads)
    );
    println!(
        "zstd level 1, one stream a key interval of 20 chunks, ZSTD_e_flush a chunk: {} bytes",
        compress_stream_level_1(&payloads)
    );
    println!(
        "zstd level -2, one stream for all chunks, ZSTD_e_flush a chunk: {} bytes",
        compress_one_stream_minus_2(&payloads)
    );
    println!(
        "the writer's way (ChunkBuilder::finish_compressed_into): {} bytes",
        writer_chunks(&records, per_chunk)
    );
    ExitCode::SUCCESS
}

/// The records in chunks of `per_chunk`, plain (the encoding's cost alone): each chunk's
/// payload.
#[inline(never)]
fn encode_chunks(records: &[Record], per_chunk: usize) -> Vec<Vec<u8>> {
    let mut chunk = builder();
    let mut payloads = Vec::new();
    let mut finish = |chunk: &mut ChunkBuilder| {
        let mut out = Vec::new();
        chunk.finish_into(&mut out);
        if !out.is_empty() {
            payloads.push(payload(out));
        }
    };
    for (index, record) in records.iter().enumerate() {
        chunk.push(record);
        if (index + 1) % per_chunk == 0 {
            finish(&mut chunk);
        }
    }
    finish(&mut chunk);
    payloads
}

/// The records in chunks of `per_chunk` as the recorder's writer seals them (encoded and
/// compressed by [`ChunkBuilder::finish_compressed_into`]): the chunks' bytes.
#[inline(never)]
fn writer_chunks(records: &[Record], per_chunk: usize) -> usize {
    let mut chunk = builder();
    let mut out = Vec::new();
    for (index, record) in records.iter().enumerate() {
        chunk.push(record);
        if (index + 1) % per_chunk == 0 {
            chunk.finish_compressed_into(&mut out);
        }
    }
    chunk.finish_compressed_into(&mut out);
    out.len()
}

/// [`encode_chunks`] of the events alone (its count apart from the definitions').
#[inline(never)]
fn encode_events(events: &[Record], per_chunk: usize) -> Vec<Vec<u8>> {
    encode_chunks(events, per_chunk)
}

/// A plain chunk's payload: after a key chunk's 12-byte head, or a continued chunk's kind,
/// length (LEB128) and checksum.
fn payload(chunk: Vec<u8>) -> Vec<u8> {
    let head = if chunk[0] == CONTINUED_CHUNK {
        let length_bytes = chunk[1..].iter().take_while(|&&b| b & 0x80 != 0).count() + 1;
        1 + length_bytes + 4
    } else {
        12
    };
    chunk[head..].to_vec()
}

fn compress_with(payloads: &[&[u8]], parameters: &[zstd_safe::CParameter]) -> usize {
    let mut ctx = zstd_safe::CCtx::create();
    for parameter in parameters {
        let _ = ctx.set_parameter(*parameter);
    }
    let mut out = Vec::new();
    let mut bytes = 0;
    for payload in payloads {
        out.clear();
        out.reserve(zstd_safe::compress_bound(payload.len()));
        let _ = ctx.compress2(&mut out, payload);
        bytes += out.len().min(payload.len());
    }
    bytes
}

#[inline(never)]
fn compress_level_1(payloads: &[&[u8]]) -> usize {
    compress_with(payloads, &[zstd_safe::CParameter::CompressionLevel(1)])
}

#[inline(never)]
fn compress_level_1_raw_literals(payloads: &[&[u8]]) -> usize {
    compress_with(
        payloads,
        &[
            zstd_safe::CParameter::CompressionLevel(1),
            zstd_safe::CParameter::TargetLength(1),
        ],
    )
}

#[inline(never)]
fn compress_level_minus_1(payloads: &[&[u8]]) -> usize {
    compress_with(payloads, &[zstd_safe::CParameter::CompressionLevel(-1)])
}

#[inline(never)]
fn compress_level_minus_2(payloads: &[&[u8]]) -> usize {
    compress_with(payloads, &[zstd_safe::CParameter::CompressionLevel(-2)])
}

#[inline(never)]
fn compress_level_minus_2_hash_log_8(payloads: &[&[u8]]) -> usize {
    compress_with(
        payloads,
        &[
            zstd_safe::CParameter::CompressionLevel(-2),
            zstd_safe::CParameter::HashLog(8),
        ],
    )
}

/// One zstd stream a key interval (`key_every` chunks), each chunk's payload ending with
/// `ZSTD_e_flush` (a block boundary: the window and tables carry on), the interval's last with
/// `ZSTD_e_end`: the bytes the chunks' compressed payloads take.
fn compress_stream(payloads: &[&[u8]], level: i32, key_every: usize) -> usize {
    let mut ctx = zstd_safe::CCtx::create();
    let _ = ctx.set_parameter(zstd_safe::CParameter::CompressionLevel(level));
    let mut out: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut bytes = 0;
    for (index, payload) in payloads.iter().enumerate() {
        let last_of_interval = (index + 1) % key_every == 0 || index + 1 == payloads.len();
        let directive = if last_of_interval {
            zstd_safe::zstd_sys::ZSTD_EndDirective::ZSTD_e_end
        } else {
            zstd_safe::zstd_sys::ZSTD_EndDirective::ZSTD_e_flush
        };
        out.clear();
        let mut input = zstd_safe::InBuffer::around(payload);
        loop {
            let mut output = zstd_safe::OutBuffer::around(&mut out);
            let remaining = match ctx.compress_stream2(&mut output, &mut input, directive) {
                Ok(remaining) => remaining,
                Err(_) => return 0,
            };
            if remaining == 0 {
                break;
            }
            let len = out.len();
            out.reserve(len.max(4096));
        }
        bytes += out.len();
    }
    bytes
}

#[inline(never)]
fn compress_stream_minus_2(payloads: &[&[u8]]) -> usize {
    compress_stream(payloads, -2, 20)
}

#[inline(never)]
fn compress_stream_level_1(payloads: &[&[u8]]) -> usize {
    compress_stream(payloads, 1, 20)
}

#[inline(never)]
fn compress_one_stream_minus_2(payloads: &[&[u8]]) -> usize {
    compress_stream(payloads, -2, usize::MAX)
}

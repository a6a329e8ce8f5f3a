//! Chooses the recorder's zstd level: re-chunks a log's records as the recorder does (256 KiB
//! payloads) and times compressing each payload with the zstd library at levels 1 to 3 (one
//! context reused, as the writer does) and with the pure-Rust `ruzstd` encoder.
//!
//! ```text
//! cargo run --release -p vramshim-format --example zstd_levels -- LOG
//! ```
//!
//! Prints, per encoder, CPU ns per record and compressed bytes per record.

use std::fs::File;
use std::process::ExitCode;
use std::time::Instant;

use vramshim_format::{ChunkBuilder, Item, LogReader};

const CHUNK_BYTES: usize = 256 << 10;
const CHUNK_HEADER_LEN: usize = 12;
/// Timed rounds per encoder; the fastest counts.
const ROUNDS: usize = 5;

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: zstd_levels LOG");
        return ExitCode::from(2);
    };
    let reader = match File::open(&path).map(LogReader::new) {
        Ok(Ok(reader)) => reader,
        Ok(Err(err)) => {
            eprintln!("zstd_levels: {path}: {err}");
            return ExitCode::from(2);
        }
        Err(err) => {
            eprintln!("zstd_levels: {path}: {err}");
            return ExitCode::from(2);
        }
    };
    // Plain chunks, then their payloads.
    let mut chunk = ChunkBuilder::new();
    let mut plain = Vec::new();
    let mut records = 0usize;
    for item in reader {
        if let Item::Record(record) = item {
            chunk.push(&record);
            records += 1;
            if chunk.payload_len() >= CHUNK_BYTES {
                chunk.finish_into(&mut plain);
            }
        }
    }
    chunk.finish_into(&mut plain);
    let mut payloads = Vec::new();
    let mut at = 0;
    while at + CHUNK_HEADER_LEN <= plain.len() {
        let len = u32::from_le_bytes(plain[at + 4..at + 8].try_into().unwrap_or_default()) as usize;
        payloads.push(&plain[at + CHUNK_HEADER_LEN..at + CHUNK_HEADER_LEN + len]);
        at += CHUNK_HEADER_LEN + len;
    }
    let raw: usize = payloads.iter().map(|p| p.len()).sum();
    println!(
        "{records} records, {} chunks, {:.2} plain bytes/record",
        payloads.len(),
        raw as f64 / records as f64
    );
    for level in 1..=3 {
        let mut ctx = zstd_safe::CCtx::create();
        let _ = ctx.set_parameter(zstd_safe::CParameter::CompressionLevel(level));
        let mut out = Vec::with_capacity(zstd_safe::compress_bound(CHUNK_BYTES * 2));
        measure(
            &format!("zstd level {level}"),
            &payloads,
            records,
            |payload| {
                out.clear();
                out.reserve(zstd_safe::compress_bound(payload.len()));
                let _ = ctx.compress2(&mut out, payload);
                out.len()
            },
        );
    }
    // As the recorder used it: owned buffers lent and taken back (the copy of each payload
    // into the source is counted; it is a memcpy of 256 KiB).
    let mut compressor: ruzstd::encoding::FrameCompressor<
        std::io::Cursor<Vec<u8>>,
        Vec<u8>,
        ruzstd::encoding::MatchGeneratorDriver,
    > = ruzstd::encoding::FrameCompressor::new(ruzstd::encoding::CompressionLevel::Fastest);
    let mut drain = Vec::new();
    measure("ruzstd fastest", &payloads, records, |payload| {
        drain.clear();
        compressor.set_source(std::io::Cursor::new(payload.to_vec()));
        compressor.set_drain(std::mem::take(&mut drain));
        compressor.compress();
        drain = compressor.take_drain().unwrap_or_default();
        drain.len()
    });
    ExitCode::SUCCESS
}

/// Compresses every payload with `compress` (which returns the compressed size) in each of
/// `ROUNDS` rounds, and prints the fastest round's CPU ns per record and the compressed bytes
/// per record.
fn measure(
    name: &str,
    payloads: &[&[u8]],
    records: usize,
    mut compress: impl FnMut(&[u8]) -> usize,
) {
    let mut best = f64::MAX;
    let mut bytes = 0;
    for _ in 0..ROUNDS {
        let started = Instant::now();
        bytes = payloads
            .iter()
            .map(|payload| compress(payload))
            .sum::<usize>();
        best = best.min(started.elapsed().as_secs_f64());
    }
    println!(
        "{name}: {:.1} ns/record, {:.3} bytes/record",
        best * 1e9 / records as f64,
        bytes as f64 / records as f64
    );
}

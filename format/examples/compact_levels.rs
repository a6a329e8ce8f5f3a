//! Chooses `vramshim compact`'s chunk size and zstd level: re-encodes a log's records as
//! compact does (the header's time resolution and pid, continued chunks, every chunk
//! compressed at one level) for each chunk size and level, and reads the result back.
//!
//! ```text
//! cargo run --release -p vramshim-format --example compact_levels -- LOG [LEVEL...]
//! ```
//!
//! Prints, per chunk size and level: the log's bytes (header included), the encoding and
//! compression time and the time to read every record back (the fastest of three rounds).

use std::process::ExitCode;
use std::time::Instant;

use vramshim_format::{ChunkBuilder, Item, LogReader, Record};

const CHUNK_KIB: [usize; 5] = [256, 1024, 4096, 16384, 32768];
const DEFAULT_LEVELS: [i32; 6] = [1, 3, 6, 9, 12, 19];
const ROUNDS: usize = 3;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: compact_levels LOG [LEVEL...]");
        return ExitCode::from(2);
    };
    let levels: Vec<i32> = args.filter_map(|level| level.parse().ok()).collect();
    let levels = if levels.is_empty() {
        DEFAULT_LEVELS.to_vec()
    } else {
        levels
    };
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(err) => {
            eprintln!("compact_levels: {path}: {err}");
            return ExitCode::from(2);
        }
    };
    let reader = match LogReader::new(bytes.as_slice()) {
        Ok(reader) => reader,
        Err(err) => {
            eprintln!("compact_levels: {path}: {err}");
            return ExitCode::from(2);
        }
    };
    let header = reader.header().clone();
    // The reader has read the header and nothing more.
    let header_len = reader.offset() as usize;
    let mut records: Vec<Record> = Vec::new();
    for item in reader {
        match item {
            Item::Record(record) => records.push(record),
            Item::Damage(damage) => {
                eprintln!("compact_levels: {path}: {damage}");
                return ExitCode::from(2);
            }
        }
    }
    println!(
        "{path}: {} bytes, {} records, read in {:.1} ms",
        bytes.len(),
        records.len(),
        read_ms(&bytes)
    );
    for kib in CHUNK_KIB {
        for &level in &levels {
            let mut best = f64::MAX;
            let mut out = Vec::new();
            for _ in 0..ROUNDS {
                let started = Instant::now();
                out.clear();
                out.extend_from_slice(&bytes[..header_len]);
                let mut chunk = ChunkBuilder::new()
                    .with_time_resolution(header.time_resolution_ns)
                    .with_first_thread(header.pid)
                    .with_continued_chunks()
                    .with_compression_level(level);
                for record in &records {
                    chunk.push(record);
                    if chunk.payload_len() >= kib << 10 {
                        chunk.finish_compressed_into(&mut out);
                    }
                }
                chunk.finish_compressed_into(&mut out);
                best = best.min(started.elapsed().as_secs_f64());
            }
            println!(
                "chunks {kib:>5} KiB level {level:>2}: {:>9} bytes ({:.3} of the log), written in {:>7.1} ms, read in {:>6.1} ms",
                out.len(),
                out.len() as f64 / bytes.len() as f64,
                best * 1e3,
                read_ms(&out)
            );
        }
    }
    ExitCode::SUCCESS
}

/// The fastest of [`ROUNDS`] reads of every record of `log`, in milliseconds.
fn read_ms(log: &[u8]) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let Ok(reader) = LogReader::new(log) else {
            return f64::NAN;
        };
        let read = reader.count();
        std::hint::black_box(read);
        best = best.min(started.elapsed().as_secs_f64());
    }
    best * 1e3
}

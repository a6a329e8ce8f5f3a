//! Decode-speed baseline: reads a log with [`LogReader`] and counts what it holds.
//!
//! ```text
//! cargo run --release -p vramshim-format --example decode -- LOG
//! ```
//!
//! Prints records, events, damage and events per second (the ceiling for any analysis that
//! reads every record).

use std::fs::File;
use std::process::ExitCode;
use std::time::Instant;

use vramshim_format::{Item, LogReader, Record};

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: decode LOG");
        return ExitCode::from(2);
    };
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(err) => {
            eprintln!("decode: {path}: {err}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let reader = match LogReader::new(file) {
        Ok(reader) => reader,
        Err(err) => {
            eprintln!("decode: {path}: {err}");
            return ExitCode::from(2);
        }
    };
    let (mut records, mut events, mut damage) = (0u64, 0u64, 0u64);
    // Touch every event so the loop cannot be optimised into nothing.
    let mut checksum = 0u64;
    let mut reader = reader;
    for item in reader.by_ref() {
        match item {
            Item::Record(Record::Event(event)) => {
                records += 1;
                events += 1;
                checksum = checksum.wrapping_add(event.addr ^ event.size ^ event.t_ns);
            }
            Item::Record(_) => records += 1,
            Item::Damage(_) => damage += 1,
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let bytes = reader.offset();
    println!("records: {records}");
    println!("events: {events}");
    println!("damage: {damage}");
    println!("bytes: {bytes}");
    println!("seconds: {seconds:.3}");
    println!("events/s: {:.0}", events as f64 / seconds);
    println!("MiB/s: {:.1}", bytes as f64 / seconds / (1u64 << 20) as f64);
    println!("checksum: {checksum:016x}");
    ExitCode::SUCCESS
}

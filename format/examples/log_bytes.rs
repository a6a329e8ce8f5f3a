//! Where a log's bytes go: the header field by field, then every chunk (its fixed bytes, its
//! compression, its records by kind).
//!
//! ```text
//! cargo run --release -p vramshim-format --example log_bytes -- LOG
//! ```

use std::collections::BTreeMap;
use std::process::ExitCode;

use vramshim_format::{Cursor, LogReader, Record, chunk_spans};

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: log_bytes LOG");
        return ExitCode::from(2);
    };
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(err) => {
            eprintln!("log_bytes: {path}: {err}");
            return ExitCode::from(2);
        }
    };
    let header = match LogReader::new(&bytes[..]) {
        Ok(reader) => reader.header().clone(),
        Err(err) => {
            eprintln!("log_bytes: {path}: {err}");
            return ExitCode::from(2);
        }
    };
    let Some(header_len) = bytes
        .get(12..16)
        .map(|len| u32::from_le_bytes(len.try_into().unwrap_or_default()) as usize)
    else {
        eprintln!("log_bytes: {path}: too short");
        return ExitCode::from(2);
    };
    println!(
        "file {} bytes, format version {}",
        bytes.len(),
        header.version
    );
    println!(
        "header {} bytes: 20 fixed (magic, version, length, crc) + {header_len} body",
        20 + header_len
    );
    // Each part's bytes: the header as written less the header written without it.
    let as_written = header.encode_as(header.version).len();
    let without = |strip: &dyn Fn(&mut vramshim_format::Header)| {
        let mut stripped = header.clone();
        strip(&mut stripped);
        as_written - stripped.encode_as(header.version).len()
    };
    let apis = without(&|h| h.apis.clear());
    let argv = without(&|h| h.argv.clear());
    let env = without(&|h| h.env.clear());
    let strings = without(&|h| {
        h.hostname.clear();
        h.stack_mode.clear();
        h.mode.clear();
        h.recorder.clear();
    });
    println!(
        "  entry-point names ({}): {apis}; argv ({}): {argv}; env ({}): {env}; hostname, \
         stack mode, mode, recorder: {strings} (+4 lengths); the rest (ids, times, counts, \
         resolution): {}",
        header.apis.len(),
        header.argv.len(),
        header.env.len(),
        header_len - apis - argv - env - strings - 4
    );
    let mut at = 20 + header_len;
    let mut delta = header.chunk_start_state();
    let (mut keys, mut continued, mut continued_bytes) = (0, 0, 0);
    for (index, span) in chunk_spans(&bytes).into_iter().enumerate() {
        let len = span.payload;
        let payload = &bytes[span.start + span.head..span.start + span.len()];
        let compressed = span.compressed;
        if span.key {
            keys += 1;
        } else {
            continued += 1;
            continued_bytes += span.len();
        }
        // Version 4 frames say their length; earlier chunks put it first as a u32.
        let frame = if header.version >= 4 {
            payload
        } else {
            &payload[4..]
        };
        let records: Vec<u8> = if compressed {
            let plain_len = zstd_safe::get_frame_content_size(frame)
                .ok()
                .flatten()
                .unwrap_or(0) as usize;
            let mut out = Vec::with_capacity(plain_len);
            if zstd_safe::decompress(&mut out, frame).is_err() {
                eprintln!("chunk {index}: does not decompress");
            }
            out
        } else {
            payload.to_vec()
        };
        let mut by_kind: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        let mut cursor = Cursor::new(&records);
        delta = if span.key {
            header.chunk_start_state()
        } else {
            delta.continued()
        };
        let mut first_event = None;
        while !cursor.is_empty() {
            let before = cursor.position();
            let record = match delta.decode(&mut cursor) {
                Ok(record) => record,
                Err(err) => {
                    eprintln!("chunk {index}: bad record ({})", err.0);
                    break;
                }
            };
            let size = cursor.position() - before;
            let name = match &record {
                Record::Event(event) => {
                    let tag = records[before];
                    if first_event.is_none() {
                        first_event = Some(size);
                    }
                    // A run's bytes count with its last record.
                    if tag >= 0xf8 || (0xe8..0xf0).contains(&tag) {
                        format!("in runs: {}", event.kind.name())
                    } else if tag >= 0xf0 {
                        format!("same-time repeat {}", event.kind.name())
                    } else if tag < 0x10 {
                        format!("repeat {}", event.kind.name())
                    } else {
                        format!("full {}", event.kind.name())
                    }
                }
                Record::MemInfo(_) => "mem_info".into(),
                Record::ThreadName(_) => "thread_name".into(),
                Record::Stack(_) => "stack".into(),
                Record::Module(_) => "module".into(),
                Record::Dropped(_) => "dropped".into(),
                Record::Note(_) => "note".into(),
                Record::DumpBegin(_) => "dump_begin".into(),
                Record::Code(_) => "code".into(),
                Record::Mark(_) => "mark".into(),
                Record::Exit(_) => "exit".into(),
            };
            let entry = by_kind.entry(name).or_default();
            entry.0 += 1;
            entry.1 += size;
        }
        println!(
            "chunk {index} at {at}: {} bytes, {} = {} head + {}{} ({} record bytes{}); first event {} bytes",
            span.len(),
            if span.key { "key" } else { "continued" },
            span.head,
            len,
            if compressed && header.version >= 4 {
                " zstd payload (frame)"
            } else if compressed {
                " zstd payload (4 length + frame)"
            } else {
                " plain payload"
            },
            records.len(),
            if compressed {
                format!(", frame {} bytes", frame.len())
            } else {
                String::new()
            },
            first_event.unwrap_or(0)
        );
        for (name, (count, size)) in &by_kind {
            println!("    {name:>24}: {count:>8} records {size:>8} bytes");
        }
        at += span.len();
    }
    println!(
        "{keys} key chunks, {continued} continued chunks ({continued_bytes} bytes, heads included)"
    );
    if at < bytes.len() {
        println!("tail: {} bytes not a whole chunk", bytes.len() - at);
    }
    ExitCode::SUCCESS
}

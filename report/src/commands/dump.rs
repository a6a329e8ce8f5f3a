//! `vramshim dump LOG [--json]`: every decoded record, for inspection and for scripts.

use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{Value, json};
use vramshim_format::{Frame, Header, Item, Record, RecordCounts};

use crate::commands::common;
use crate::units::{bytes, counted, seconds};
use crate::{Failure, logfile};

#[derive(clap::Args)]
pub struct Args {
    /// The log to print.
    log: PathBuf,
    /// One JSON object per line (header first), integers as JSON numbers.
    #[arg(long)]
    json: bool,
    /// Instead of the records, how many events the log holds and in how many records (a
    /// run of repeats, or a block's free request and free together, is one record) and
    /// chunks.
    #[arg(long)]
    counts: bool,
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let reader = logfile::open(&args.log)?;
    let header = reader.header().clone();
    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    let written: io::Result<()> = (|| {
        if args.json {
            writeln!(out, "{}", header_json(&header))?;
        } else if !args.counts {
            write_header_text(&mut out, &header)?;
        }
        let mut reader = reader;
        for item in reader.by_ref() {
            match item {
                Item::Record(_) if args.counts => {}
                Item::Record(record) => {
                    if args.json {
                        writeln!(out, "{}", record_json(&header, &record))?;
                    } else {
                        write_record_text(&mut out, &header, &record)?;
                    }
                }
                Item::Damage(damage) => {
                    eprintln!("vramshim: warning: {}: {damage}", args.log.display());
                    if args.json {
                        let value = json!({"type": "damage", "offset": damage.offset, "message": damage.to_string()});
                        writeln!(out, "{value}")?;
                    }
                }
            }
        }
        if args.counts {
            write_counts(&mut out, reader.counts(), args.json)?;
        }
        out.flush()
    })();
    common::finish_stdout(written)
}

/// `dump --counts`: the events read against the records that held them, and the chunks.
fn write_counts(out: &mut impl Write, counts: RecordCounts, json: bool) -> io::Result<()> {
    if json {
        let value = json!({
            "type": "counts",
            "events": counts.events,
            "event_records": counts.event_records,
            "free_pairs": counts.free_pairs,
            "runs": counts.runs,
            "other_records": counts.other_records,
            "chunks": counts.chunks,
            "key_chunks": counts.key_chunks,
            "compressed_chunks": counts.compressed_chunks,
        });
        return writeln!(out, "{value}");
    }
    writeln!(
        out,
        "{} in {} ({}, {}); {}; {} ({} key, {} compressed)",
        counted(counts.events, "event"),
        counted(counts.event_records, "record"),
        counted(counts.free_pairs, "free pair"),
        counted(counts.runs, "run"),
        counted(counts.other_records, "other record"),
        counted(counts.chunks, "chunk"),
        counts.key_chunks,
        counts.compressed_chunks,
    )
}

fn header_json(header: &Header) -> Value {
    let env: serde_json::Map<String, Value> = header
        .env
        .iter()
        .map(|(name, value)| {
            (
                name.clone(),
                value.clone().map_or(Value::Null, Value::String),
            )
        })
        .collect();
    json!({
        "type": "header",
        "version": header.version,
        "pid": header.pid,
        "ppid": header.ppid,
        "argv": header.argv,
        "start_unix_ns": header.start_unix_ns,
        "start_mono_ns": header.start_mono_ns,
        "hostname": header.hostname,
        "env": env,
        "stack_mode": header.stack_mode,
        "mode": header.mode,
        "recorder": header.recorder,
        "time_resolution_ns": header.time_resolution_ns,
        "apis": header.apis,
    })
}

/// One record as a JSON object with a `type` field.
pub fn record_json(header: &Header, record: &Record) -> Value {
    match record {
        Record::Event(event) => {
            let mut value = json!({
                "type": "event",
                "event": event.kind.name(),
                "api": header.api_name(event.api),
                "t_ns": event.t_ns,
                "thread": event.thread,
                "device": event.device,
                "addr": event.addr,
                "size": event.size,
                "stream": event.stream,
                "handle": event.handle,
                "result": event.result,
                "stack": event.stack,
            });
            if let Some((free, total)) = event.mem_info {
                value["mem_free"] = json!(free);
                value["mem_total"] = json!(total);
            }
            value
        }
        Record::MemInfo(info) => json!({
            "type": "mem_info", "t_ns": info.t_ns, "device": info.device,
            "free": info.free, "total": info.total,
        }),
        Record::ThreadName(thread) => {
            json!({"type": "thread", "thread": thread.thread, "name": thread.name})
        }
        Record::Stack(stack) => json!({
            "type": "stack",
            "id": stack.id,
            "frames": stack.frames.iter().map(|frame| match *frame {
                Frame::Native(ip) => json!(ip),
                Frame::Python { code, offset, entry } => {
                    json!({"code": code, "offset": offset, "entry": entry})
                }
            }).collect::<Vec<Value>>(),
        }),
        Record::Code(code) => json!({
            "type": "code", "id": code.id,
            "python": format!("{}.{}", code.python >> 8, code.python & 0xff),
            "filename": code.filename, "qualname": code.qualname,
            "first_line": code.first_line, "line_table": hex(&code.line_table),
        }),
        Record::Module(module) => json!({
            "type": "module", "path": module.path, "load_bias": module.load_bias,
            "start": module.start, "end": module.end, "build_id": hex(&module.build_id),
        }),
        Record::Dropped(dropped) => {
            json!({"type": "dropped", "t_ns": dropped.t_ns, "count": dropped.count})
        }
        Record::Note(note) => json!({"type": "note", "t_ns": note.t_ns, "text": note.text}),
        Record::Mark(mark) => json!({
            "type": "mark", "t_ns": mark.t_ns, "thread": mark.thread, "text": mark.text,
        }),
        Record::Exit(exit) => json!({"type": "exit", "t_ns": exit.t_ns}),
        Record::DumpBegin(dump) => json!({
            "type": "dump_begin", "t_ns": dump.t_ns, "reason": dump.reason,
            "events_discarded": dump.events_discarded, "live_count": dump.live_count,
            "window_count": dump.window_count,
        }),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn write_header_text(out: &mut impl Write, header: &Header) -> io::Result<()> {
    writeln!(
        out,
        "# vramshim log, format {} (recorder {})",
        header.version, header.recorder
    )?;
    writeln!(out, "# command: {}", header.argv.join(" "))?;
    writeln!(
        out,
        "# pid {} (parent {}) on {}",
        header.pid, header.ppid, header.hostname
    )?;
    writeln!(
        out,
        "# stacks: {}, mode: {}",
        header.stack_mode, header.mode
    )?;
    if let Some(note) = crate::units::resolution_note(header.time_resolution_ns) {
        writeln!(out, "# {note}")?;
    }
    for (name, value) in &header.env {
        if let Some(value) = value {
            writeln!(out, "# {name}={value}")?;
        }
    }
    Ok(())
}

fn write_record_text(out: &mut impl Write, header: &Header, record: &Record) -> io::Result<()> {
    match record {
        Record::Event(e) => {
            write!(
                out,
                "{:>14} tid {:<7} {:<12} {:<30} dev {:>2}",
                seconds(e.t_ns),
                e.thread,
                e.kind.name(),
                header.api_name(e.api),
                e.device
            )?;
            if e.addr != 0 {
                write!(out, " addr {:#x}", e.addr)?;
            }
            write!(out, " size {} ({})", e.size, bytes(e.size))?;
            if e.stream != 0 {
                write!(out, " stream {:#x}", e.stream)?;
            }
            if e.handle != 0 {
                write!(out, " handle {:#x}", e.handle)?;
            }
            if e.result != 0 {
                write!(out, " result {}", e.result)?;
            }
            if let Some((free, total)) = e.mem_info {
                write!(out, " device free {} of {}", bytes(free), bytes(total))?;
            }
            if e.stack != 0 {
                write!(out, " stack {}", e.stack)?;
            }
            writeln!(out)
        }
        Record::MemInfo(m) => writeln!(
            out,
            "{:>14} device {} memory: {} free of {}",
            seconds(m.t_ns),
            m.device,
            bytes(m.free),
            bytes(m.total)
        ),
        Record::ThreadName(t) => writeln!(out, "thread {} is {:?}", t.thread, t.name),
        Record::Code(c) => writeln!(
            out,
            "code {}: {} ({}:{}) python {}.{}",
            c.id,
            c.qualname,
            c.filename,
            c.first_line,
            c.python >> 8,
            c.python & 0xff
        ),
        Record::Stack(s) => {
            let frames: Vec<String> = s
                .frames
                .iter()
                .map(|frame| match *frame {
                    Frame::Native(ip) => format!("{ip:#x}"),
                    Frame::Python {
                        code,
                        offset,
                        entry,
                    } => format!("py:{code}@{offset}{}", if entry { "!" } else { "" }),
                })
                .collect();
            writeln!(out, "stack {}: {}", s.id, frames.join(" "))
        }
        Record::Module(m) => writeln!(
            out,
            "module {:#x}-{:#x} bias {:#x} {} build-id {}",
            m.start,
            m.end,
            m.load_bias,
            m.path,
            if m.build_id.is_empty() {
                "-".to_owned()
            } else {
                hex(&m.build_id)
            }
        ),
        Record::Dropped(d) => writeln!(
            out,
            "{:>14} DROPPED {} (ring full)",
            seconds(d.t_ns),
            counted(d.count, "event")
        ),
        Record::Note(n) => writeln!(out, "{:>14} note: {}", seconds(n.t_ns), n.text),
        Record::Mark(m) => writeln!(
            out,
            "{:>14} mark: {} (thread {})",
            seconds(m.t_ns),
            m.text,
            m.thread
        ),
        Record::Exit(e) => writeln!(out, "{:>14} EXIT (normal)", seconds(e.t_ns)),
        Record::DumpBegin(d) => writeln!(
            out,
            "{:>14} flight-recorder dump ({}): {} live allocations, {} recent records, {} older events not kept",
            seconds(d.t_ns),
            d.reason,
            d.live_count,
            d.window_count,
            d.events_discarded
        ),
    }
}

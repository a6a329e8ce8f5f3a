//! `vramshim lines`: per source line, what it allocated, beside its text.

use std::io::{self, Write};
use std::rc::Rc;

use serde_json::{Value, json};

use super::{processes_json, write_processes};
use crate::analysis::lines::LineStats;
use crate::replay::Process;
use crate::units::bytes;

/// Source files larger than this are not read (their lines print without text).
const SOURCE_MAX_BYTES: u64 = 16 << 20;

/// One source file's lines that allocated, with their text where the file could be read.
pub struct FileView {
    pub file: Rc<str>,
    /// Whether the file was read (a regular file at the recorded path).
    pub source_read: bool,
    /// (line, stats, text), in line order.
    pub lines: Vec<(u32, LineStats, Option<String>)>,
}

impl FileView {
    /// Reads the source text of `lines` from `file` (only a regular file: never a FIFO or a
    /// device named by a log).
    pub fn read(file: Rc<str>, lines: Vec<(u32, LineStats)>) -> FileView {
        let source = std::fs::metadata(&*file)
            .ok()
            .filter(|meta| meta.is_file() && meta.len() <= SOURCE_MAX_BYTES)
            .and_then(|_| std::fs::read(&*file).ok())
            .map(|data| String::from_utf8_lossy(&data).into_owned());
        let text_of = |line: u32| {
            let source = source.as_ref()?;
            let index = usize::try_from(line).ok()?.checked_sub(1)?;
            source
                .lines()
                .nth(index)
                .map(|text| text.trim_end().to_string())
        };
        FileView {
            source_read: source.is_some(),
            lines: lines
                .into_iter()
                .map(|(line, stats)| (line, stats, text_of(line)))
                .collect(),
            file,
        }
    }
}

pub struct LinesReport<'a> {
    pub processes: &'a [Process],
    pub files: Vec<FileView>,
}

pub fn text(out: &mut dyn Write, report: &LinesReport<'_>) -> io::Result<()> {
    write_processes(out, report.processes)?;
    if report.files.is_empty() {
        writeln!(
            out,
            "\nno allocation has a Python line in the selected files"
        )?;
    }
    for file in &report.files {
        writeln!(out, "\n{}", file.file)?;
        if !file.source_read {
            writeln!(out, "  (source not readable at this path)")?;
        }
        writeln!(
            out,
            "  {:>6} {:>11} {:>6} {:>6} {:>11} {:>11} {:>11} {:>11} {:>24}  source",
            "line",
            "allocated",
            "count",
            "execs",
            "net live",
            "net/exec",
            "at peak",
            "live at end",
            "via autograd (at peak)"
        )?;
        for (line, stats, text) in &file.lines {
            // What autograd's threads allocated for the line's backward call: bytes, count,
            // and bytes of it live at the peak (all included in the columns before).
            let via = if stats.via_autograd_count == 0 {
                String::new()
            } else {
                format!(
                    "{} x{} ({})",
                    bytes(stats.via_autograd_bytes),
                    stats.via_autograd_count,
                    bytes(stats.via_autograd_at_peak_bytes)
                )
            };
            writeln!(
                out,
                "  {:>6} {:>11} {:>6} {:>6} {:>11} {:>11} {:>11} {:>11} {:>24}  {}",
                line,
                bytes(stats.allocated_bytes),
                stats.count,
                stats.executions,
                bytes(stats.net_bytes()),
                bytes(stats.net_per_execution_bytes()),
                bytes(stats.at_peak_bytes),
                bytes(stats.live_at_end_bytes()),
                via,
                text.as_deref().unwrap_or("")
            )?;
        }
    }
    Ok(())
}

pub fn json(report: &LinesReport<'_>) -> Value {
    json!({
        "processes": processes_json(report.processes),
        "files": report.files.iter().map(|file| json!({
            "file": &*file.file,
            "source_read": file.source_read,
            "lines": file.lines.iter().map(|(line, stats, text)| json!({
                "line": line,
                "source": text,
                "allocated_bytes": stats.allocated_bytes,
                "count": stats.count,
                "freed_bytes": stats.freed_bytes,
                "live_at_end_bytes": stats.live_at_end_bytes(),
                "executions": stats.executions,
                "net_bytes": stats.net_bytes(),
                "net_per_execution_bytes": stats.net_per_execution_bytes(),
                "at_peak_bytes": stats.at_peak_bytes,
                "via_autograd_bytes": stats.via_autograd_bytes,
                "via_autograd_count": stats.via_autograd_count,
                "via_autograd_at_peak_bytes": stats.via_autograd_at_peak_bytes,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

//! `diff` views: per-stack changes between two recordings, as a table and as JSON.

use std::io::{self, Write};

use serde_core::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Value, json};

use super::frames::Fold;
use super::{SeqJson, device_name, processes_json, short_stack};
use crate::analysis::diff::{Diff, StackDiff};
use crate::analysis::peaks::Peak;
use crate::replay::Process;
use crate::units::{bytes, counted, seconds};

/// One recording of the comparison.
pub struct SideView<'a> {
    pub processes: &'a [Process],
    /// Peaks of the selected devices.
    pub peaks: Vec<Peak>,
    /// Bytes allocated over the run on the selected devices.
    pub allocated_bytes: u64,
}

impl SideView<'_> {
    /// Live bytes at the peaks, summed over the selected devices.
    pub fn peak_bytes(&self) -> u64 {
        self.peaks
            .iter()
            .map(|p| p.bytes)
            .fold(0, u64::saturating_add)
    }
}

/// Everything the diff shows.
pub struct DiffReport<'a> {
    pub a: SideView<'a>,
    pub b: SideView<'a>,
    pub device: Option<i32>,
    /// Rows are per thread name and stack (`--by-thread`).
    pub by_thread: bool,
    /// Sorted ([`Diff::sort`]).
    pub rows: &'a Diff,
    /// Rows shown in text.
    pub top: usize,
    /// Frames per stack in text.
    pub frames: usize,
    /// Which frames the text shows (JSON rows keep every frame).
    pub fold: Fold,
    /// The per-category section (`render::breakdown::diff_json_section`), where both logs
    /// have Python frames.
    pub categories: Option<Value>,
}

/// B − A as JSON; exact for any two sizes a log can hold.
fn change(a: u64, b: u64) -> i64 {
    (i128::from(b) - i128::from(a)).clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// A signed size: `+16.00 MiB`, `-512 B`, `0`.
pub fn signed_bytes(change: i128) -> String {
    let size = bytes(u64::try_from(change.unsigned_abs()).unwrap_or(u64::MAX));
    match change.signum() {
        1 => format!("+{size}"),
        -1 => format!("-{size}"),
        _ => "0".to_string(),
    }
}

fn side_json(side: &SideView<'_>) -> Value {
    json!({
        "logs": side.processes.iter().map(|p| p.path.display().to_string()).collect::<Vec<_>>(),
        "processes": processes_json(side.processes),
        "peak_bytes": side.peak_bytes(),
        "allocated_bytes": side.allocated_bytes,
        "peaks": side.peaks.iter().map(|p| json!({
            "device": p.device,
            "bytes": p.bytes,
            "t_ns": p.t_ns,
        })).collect::<Vec<_>>(),
    })
}

/// The comparison as one JSON document (both sides, totals, every stack, and `warnings`),
/// written as it is serialised: with millions of stacks, a document built whole first would
/// take many times the memory of the output.
pub fn write_json(
    out: &mut dyn Write,
    report: &DiffReport<'_>,
    warnings: &[String],
) -> io::Result<()> {
    serde_json::to_writer_pretty(out, &Document { report, warnings }).map_err(io::Error::from)
}

/// The whole document; keys in the sorted order `serde_json::Value` prints them in.
struct Document<'a> {
    report: &'a DiffReport<'a>,
    warnings: &'a [String],
}

impl Serialize for Document<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let report = self.report;
        let (a, b) = (&report.a, &report.b);
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("a", &side_json(a))?;
        map.serialize_entry("b", &side_json(b))?;
        if let Some(categories) = &report.categories {
            map.serialize_entry("categories", categories)?;
        }
        map.serialize_entry("device", &report.device)?;
        map.serialize_entry("stacks", &SeqJson(report.rows.rows().map(RowJson)))?;
        map.serialize_entry(
            "total",
            &json!({
                "peak_a": a.peak_bytes(),
                "peak_b": b.peak_bytes(),
                "peak_change": change(a.peak_bytes(), b.peak_bytes()),
                "allocated_a": a.allocated_bytes,
                "allocated_b": b.allocated_bytes,
                "allocated_change": change(a.allocated_bytes, b.allocated_bytes),
            }),
        )?;
        map.serialize_entry("warnings", self.warnings)?;
        map.end()
    }
}

/// One stack's row.
struct RowJson<'a>(StackDiff<'a>);

impl Serialize for RowJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let row = &self.0;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("allocated_a", &row.allocated[0].bytes)?;
        map.serialize_entry("allocated_b", &row.allocated[1].bytes)?;
        map.serialize_entry(
            "allocated_change",
            &change(row.allocated[0].bytes, row.allocated[1].bytes),
        )?;
        map.serialize_entry("allocated_count_a", &row.allocated[0].count)?;
        map.serialize_entry("allocated_count_b", &row.allocated[1].count)?;
        map.serialize_entry("frames", &row.labels)?;
        map.serialize_entry("peak_a", &row.peak[0].bytes)?;
        map.serialize_entry("peak_b", &row.peak[1].bytes)?;
        map.serialize_entry("peak_change", &change(row.peak[0].bytes, row.peak[1].bytes))?;
        map.serialize_entry("peak_count_a", &row.peak[0].count)?;
        map.serialize_entry("peak_count_b", &row.peak[1].count)?;
        if let Some(thread) = row.thread {
            map.serialize_entry("thread", thread)?;
        }
        map.end()
    }
}

fn describe(out: &mut dyn Write, name: &str, side: &SideView<'_>) -> io::Result<()> {
    let logs: Vec<String> = side
        .processes
        .iter()
        .map(|p| format!("{} (pid {})", p.path.display(), p.header.pid))
        .collect();
    writeln!(out, "{name}: {}", logs.join(", "))?;
    let peaks: Vec<String> = side
        .peaks
        .iter()
        .map(|p| {
            format!(
                "{} {} at {}",
                device_name(p.device),
                bytes(p.bytes),
                seconds(p.t_ns)
            )
        })
        .collect();
    writeln!(
        out,
        "   peak {} ({}), allocated {} over the run",
        bytes(side.peak_bytes()),
        if peaks.is_empty() {
            "nothing allocated".to_string()
        } else {
            peaks.join(", ")
        },
        bytes(side.allocated_bytes)
    )
}

/// The comparison as a table, growth first, with a totals line.
pub fn text(out: &mut dyn Write, report: &DiffReport<'_>) -> io::Result<()> {
    describe(out, "A", &report.a)?;
    describe(out, "B", &report.b)?;
    if let Some(device) = report.device {
        writeln!(out, "only {}", device_name(device))?;
    }
    writeln!(
        out,
        "\nper {}, growth first (peak: live at each device's peak, summed over devices):",
        if report.by_thread {
            "thread name and stack"
        } else {
            "stack"
        }
    )?;
    writeln!(
        out,
        "  {:>11} {:>11} {:>12}  {:>11} {:>11} {:>12}  stack",
        "peak A", "peak B", "change", "alloc A", "alloc B", "change"
    )?;
    let row_line = |out: &mut dyn Write, amounts: [u64; 4], stack: &str| {
        let [peak_a, peak_b, alloc_a, alloc_b] = amounts;
        writeln!(
            out,
            "  {:>11} {:>11} {:>12}  {:>11} {:>11} {:>12}  {stack}",
            bytes(peak_a),
            bytes(peak_b),
            signed_bytes(i128::from(peak_b) - i128::from(peak_a)),
            bytes(alloc_a),
            bytes(alloc_b),
            signed_bytes(i128::from(alloc_b) - i128::from(alloc_a)),
        )
    };
    for row in report.rows.rows().take(report.top) {
        row_line(
            out,
            [
                row.peak[0].bytes,
                row.peak[1].bytes,
                row.allocated[0].bytes,
                row.allocated[1].bytes,
            ],
            &match row.thread {
                Some(thread) => format!(
                    "thread {thread}: {}",
                    short_stack(row.labels.frames(), report.frames, report.fold)
                ),
                None => short_stack(row.labels.frames(), report.frames, report.fold),
            },
        )?;
    }
    if report.rows.row_count() > report.top {
        writeln!(
            out,
            "  ... {} (--top to show them, --json for all)",
            counted((report.rows.row_count() - report.top) as u64, "more stack")
        )?;
    }
    row_line(
        out,
        [
            report.a.peak_bytes(),
            report.b.peak_bytes(),
            report.a.allocated_bytes,
            report.b.allocated_bytes,
        ],
        "total",
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn diff_signed_sizes() {
        assert_eq!(super::signed_bytes(16 << 20), "+16.00 MiB");
        assert_eq!(super::signed_bytes(-512), "-512 B");
        assert_eq!(super::signed_bytes(0), "0");
        assert_eq!(super::change(5, 3), -2);
        assert_eq!(super::change(0, u64::MAX), i64::MAX);
    }
}

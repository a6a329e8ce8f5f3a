//! Snapshot views (`peak`, `peak --at`, `leaks`): a live set grouped by stack, flat and as a
//! tree.

use std::io::{self, Write};

use serde_core::ser::{Serialize, SerializeMap, Serializer};

use super::frames::Fold;
use super::{
    GroupJson, SeqJson, TreeJson, device_name, processes_json, write_groups, write_processes,
    write_tree,
};
use crate::analysis::groups::{StackGroup, TreeNode};
use crate::replay::Process;
use crate::units::{bytes, seconds};

/// One device's live set at the chosen moment.
pub struct SnapshotView {
    pub device: i32,
    pub t_ns: u64,
    pub bytes: u64,
    pub count: u64,
    /// Tensor view: PyTorch's caching-allocator segments then (count, bytes reserved).
    pub segments: (u64, u64),
    pub groups: Vec<StackGroup>,
    pub tree: TreeNode,
}

/// What the views show and how much of it.
pub struct SnapshotReport<'a> {
    pub processes: &'a [Process],
    /// "peak", "at" or "leaks".
    pub what: &'static str,
    /// Groups are split by thread (`--by-thread`).
    pub by_thread: bool,
    pub views: Vec<SnapshotView>,
    /// Flat groups shown in text.
    pub top: usize,
    /// Frames shown per group in text.
    pub frames: usize,
    /// Tree branches below this share (percent) are folded in text.
    pub min_share: f64,
    /// Which frames the text shows.
    pub fold: Fold,
}

/// The JSON document, with `warnings`, written as it is serialised (a peak's tree can hold
/// millions of nodes: built whole first, it would take many times the memory of the output).
pub fn write_json(
    out: &mut dyn Write,
    report: &SnapshotReport<'_>,
    warnings: &[String],
) -> io::Result<()> {
    serde_json::to_writer_pretty(out, &Document { report, warnings }).map_err(io::Error::from)
}

/// The whole document; keys in the sorted order `serde_json::Value` prints them in.
struct Document<'a> {
    report: &'a SnapshotReport<'a>,
    warnings: &'a [String],
}

impl Serialize for Document<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let report = self.report;
        let mut map = serializer.serialize_map(Some(4))?;
        map.serialize_entry(
            "devices",
            &SeqJson(report.views.iter().map(|view| ViewJson {
                view,
                processes: report.processes,
            })),
        )?;
        map.serialize_entry("processes", &processes_json(report.processes))?;
        map.serialize_entry("warnings", self.warnings)?;
        map.serialize_entry("what", report.what)?;
        map.end()
    }
}

/// One device's view.
struct ViewJson<'a> {
    view: &'a SnapshotView,
    processes: &'a [Process],
}

impl Serialize for ViewJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let view = self.view;
        let whole = view.bytes;
        let mut map = serializer.serialize_map(Some(7))?;
        map.serialize_entry("bytes", &view.bytes)?;
        map.serialize_entry("count", &view.count)?;
        map.serialize_entry("device", &view.device)?;
        if view.segments.0 > 0 {
            map.serialize_entry(
                "pytorch_segments",
                &serde_json::json!({"count": view.segments.0, "bytes": view.segments.1}),
            )?;
        }
        map.serialize_entry(
            "stacks",
            &SeqJson(view.groups.iter().map(|group| GroupJson {
                group,
                whole,
                processes: self.processes,
            })),
        )?;
        map.serialize_entry("t_ns", &view.t_ns)?;
        map.serialize_entry(
            "tree",
            &TreeJson {
                node: &view.tree,
                whole,
            },
        )?;
        map.end()
    }
}

pub fn text(out: &mut dyn Write, report: &SnapshotReport<'_>) -> io::Result<()> {
    write_processes(out, report.processes)?;
    if report.views.is_empty() {
        let nothing = match report.what {
            "leaks" => "no leaks: everything allocated was freed",
            _ => "no memory was live",
        };
        writeln!(out, "\n{nothing}")?;
    }
    for view in &report.views {
        let plural = if view.count == 1 { "" } else { "s" };
        let moment = match report.what {
            "peak" => format!("peak at {}", seconds(view.t_ns)),
            "leaks" => format!(
                "still live at {} ({})",
                crate::replay::end_name(report.processes),
                seconds(view.t_ns)
            ),
            _ => format!("live at {}", seconds(view.t_ns)),
        };
        writeln!(
            out,
            "\n{}: {} {} in {} allocation{plural}",
            device_name(view.device),
            moment,
            bytes(view.bytes),
            view.count
        )?;
        if view.segments.0 > 0 {
            let (count, reserved) = view.segments;
            let plural = if count == 1 { "" } else { "s" };
            writeln!(
                out,
                "  PyTorch's caching allocator held {count} segment{plural}, {} reserved: tensors are counted, not the segments",
                bytes(reserved)
            )?;
            if view.count == 0 {
                // Only the allocator's cache: no tensor to list.
                continue;
            }
        }
        if report.by_thread {
            writeln!(out, "  by thread and stack:")?;
        } else {
            writeln!(out, "  by stack:")?;
        }
        write_groups(
            out,
            &view.groups,
            view.bytes,
            report.top,
            report.frames,
            report.fold,
        )?;
        writeln!(out, "  callers -> callees:")?;
        write_tree(out, &view.tree, view.bytes, report.min_share, report.fold)?;
    }
    Ok(())
}

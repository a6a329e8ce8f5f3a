//! Snapshot views (`peak`, `peak --at`, `leaks`): a live set grouped by stack, flat and as a
//! tree.

use std::io::{self, Write};

use serde_json::{Value, json};

use super::{
    device_name, group_json, processes_json, tree_json, write_groups, write_processes, write_tree,
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
}

pub fn json(report: &SnapshotReport<'_>) -> Value {
    json!({
        "what": report.what,
        "processes": processes_json(report.processes),
        "devices": report.views.iter().map(|v| json!({
            "device": v.device,
            "t_ns": v.t_ns,
            "bytes": v.bytes,
            "count": v.count,
            "stacks": v.groups.iter().map(|g| group_json(g, v.bytes, report.processes)).collect::<Vec<_>>(),
            "tree": tree_json(&v.tree, v.bytes),
        })).collect::<Vec<_>>(),
    })
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
            "leaks" => format!("still live at exit ({})", seconds(view.t_ns)),
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
        if report.by_thread {
            writeln!(out, "  by thread and stack:")?;
        } else {
            writeln!(out, "  by stack:")?;
        }
        write_groups(out, &view.groups, view.bytes, report.top, report.frames)?;
        writeln!(out, "  callers -> callees:")?;
        write_tree(out, &view.tree, view.bytes, report.min_share)?;
    }
    Ok(())
}

//! Renderers: text and JSON from analysis results. Nothing here reads logs.

pub mod advise;
pub mod allocator;
pub mod breakdown;
pub mod chrome_trace;
pub mod diff;
pub mod dryrun;
pub mod flamegraph;
pub mod frames;
pub mod html;
pub mod lines;
pub mod oom;
pub mod parquet;
pub mod pprof;
pub mod pytorch;
pub mod snapshot;
pub mod speedscope;
pub mod steps;
pub mod summary;
pub mod svg;
pub mod timeline;
pub mod whatif;

use std::io::{self, Write};

use serde_core::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Value, json};
use vramshim_format::{HOST_DEVICE, UNKNOWN_DEVICE};

use crate::analysis::groups::{GroupThread, NO_STACK, StackGroup, TreeNode};
use crate::replay::{Live, Process};
use crate::symbols::SymFrame;
use crate::units::{bytes, counted, seconds};
use frames::{Fold, ShownNode};

/// Tree levels indented; deeper ones line up with the last.
const MAX_INDENT: usize = 24;

/// Report order of devices: device ordinals first, then pinned host (-1), then unknown (-2).
pub fn device_order(device: i32) -> (bool, u32) {
    (device < 0, device.unsigned_abs())
}

/// How a device is named in text.
pub fn device_name(device: i32) -> String {
    match device {
        HOST_DEVICE => "pinned host memory".to_string(),
        UNKNOWN_DEVICE => "unknown device".to_string(),
        n => format!("device {n}"),
    }
}

/// Share of `part` in `whole` as a percentage (0 when `whole` is 0).
pub fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

pub fn frame_json(frame: &SymFrame) -> Value {
    json!({
        "function": frame.function.as_deref(),
        "file": frame.file.as_deref(),
        "line": frame.line,
        "module": &*frame.module,
        "offset": frame.offset,
        "inlined": frame.inlined,
        "label": frame.label(),
    })
}

/// A thread of a group split by thread: `{"tid", "name", "pid"}` (name null when unknown).
pub fn thread_json(thread: &GroupThread) -> Value {
    json!({
        "tid": thread.tid,
        "name": thread.name,
        "pid": thread.pid,
    })
}

/// Adds `"thread"` to `value` when `thread` is set (groups split by thread only, so views
/// without `--by-thread` keep their shape).
fn with_thread(mut value: Value, thread: Option<&GroupThread>) -> Value {
    if let (Some(thread), Value::Object(map)) = (thread, &mut value) {
        map.insert("thread".to_string(), thread_json(thread));
    }
    value
}

/// A stack group: bytes, count, share of `whole`, the pids contributing, frames innermost
/// first, and its thread when split by thread.
pub fn group_json(group: &StackGroup, whole: u64, processes: &[Process]) -> Value {
    with_thread(
        json!({
            "bytes": group.bytes,
            "count": group.count,
            "share": share(group.bytes, whole),
            "pids": group.processes.iter().map(|p| processes[*p as usize].header.pid).collect::<Vec<_>>(),
            "frames": group.frames.iter().map(frame_json).collect::<Vec<_>>(),
        }),
        group.thread.as_ref(),
    )
}

/// [`frame_json`] written straight to the output: the same document, without building it
/// (keys in the sorted order `serde_json::Value` prints them in).
pub struct FrameJson<'a>(pub &'a SymFrame);

impl Serialize for FrameJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let frame = self.0;
        let mut map = serializer.serialize_map(Some(7))?;
        map.serialize_entry("file", &frame.file.as_deref())?;
        map.serialize_entry("function", &frame.function.as_deref())?;
        map.serialize_entry("inlined", &frame.inlined)?;
        map.serialize_entry("label", &frame.label())?;
        map.serialize_entry("line", &frame.line)?;
        map.serialize_entry("module", &*frame.module)?;
        map.serialize_entry("offset", &frame.offset)?;
        map.end()
    }
}

/// A sequence serialised item by item as it is written.
pub struct SeqJson<I>(pub I);

impl<I> Serialize for SeqJson<I>
where
    I: Iterator + Clone,
    I::Item: Serialize,
{
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.clone())
    }
}

/// [`group_json`] written straight to the output.
pub struct GroupJson<'a> {
    pub group: &'a StackGroup,
    pub whole: u64,
    pub processes: &'a [Process],
}

impl Serialize for GroupJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let group = self.group;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("bytes", &group.bytes)?;
        map.serialize_entry("count", &group.count)?;
        map.serialize_entry("frames", &SeqJson(group.frames.iter().map(FrameJson)))?;
        map.serialize_entry(
            "pids",
            &SeqJson(
                group
                    .processes
                    .iter()
                    .map(|p| self.processes[*p as usize].header.pid),
            ),
        )?;
        map.serialize_entry("share", &share_json(group.bytes, self.whole))?;
        if let Some(thread) = &group.thread {
            map.serialize_entry("thread", &thread_json(thread))?;
        }
        map.end()
    }
}

/// The caller → callee tree as nested objects (thread nodes: `frame` null, `thread` set),
/// written straight to the output.
pub struct TreeJson<'a> {
    pub node: &'a TreeNode,
    pub whole: u64,
}

impl Serialize for TreeJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let node = self.node;
        let whole = self.whole;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("bytes", &node.bytes)?;
        map.serialize_entry(
            "children",
            &SeqJson(node.children.iter().map(|node| TreeJson { node, whole })),
        )?;
        map.serialize_entry("count", &node.count)?;
        map.serialize_entry("frame", &node.frame.as_deref().map(FrameJson))?;
        map.serialize_entry("share", &share_json(node.bytes, whole))?;
        if let Some(thread) = &node.thread {
            map.serialize_entry("thread", &thread_json(thread))?;
        }
        map.end()
    }
}

/// A share as `json!` stores it (a non-finite number becomes null).
fn share_json(part: u64, whole: u64) -> Value {
    Value::from(share(part, whole))
}

/// The innermost `n` frames shown (see [`frames::shown`]) on one line: `alloc (a.c:3) <-
/// main (a.c:9)`.
pub fn short_stack(frames: &[SymFrame], n: usize, fold: Fold) -> String {
    if frames.is_empty() {
        return NO_STACK.to_string();
    }
    frames::shown(frames, fold)
        .frames
        .iter()
        .take(n)
        .map(|frame| frames::text_label(frame, fold))
        .collect::<Vec<_>>()
        .join(" <- ")
}

/// One live allocation.
pub fn live_json(live: &Live, processes: &[Process]) -> Value {
    let process = &processes[live.process as usize];
    json!({
        "pid": process.header.pid,
        "kind": live.kind.name(),
        "api": process.api(live.api),
        "device": live.device,
        "addr": live.addr,
        "handle": live.handle,
        "size": live.size,
        "stream": live.stream,
        "thread": live.thread,
        "thread_name": process.thread_names.get(&live.thread),
        "t_ns": live.t_ns,
    })
}

/// Prints a stack one frame a line after `indent`: up to `limit` frames shown (see
/// [`frames::shown`]), with the lines that stand for the folded ones.
pub fn write_stack(
    out: &mut dyn Write,
    stack: &[SymFrame],
    limit: usize,
    fold: Fold,
    indent: &str,
) -> io::Result<()> {
    if stack.is_empty() {
        return writeln!(out, "{indent}{NO_STACK}");
    }
    let shown = frames::shown(stack, fold);
    if let Some(line) = shown.leading_line() {
        writeln!(out, "{indent}{line}")?;
    }
    for frame in shown.frames.iter().take(limit) {
        writeln!(out, "{indent}{}", frames::text_label(frame, fold))?;
    }
    if let Some(line) = shown.rest_line(limit) {
        writeln!(out, "{indent}{line}")?;
    }
    Ok(())
}

/// Prints the largest groups with up to `frames` frames each (and the thread of each group
/// split by thread).
pub fn write_groups(
    out: &mut dyn Write,
    groups: &[StackGroup],
    whole: u64,
    limit: usize,
    frames: usize,
    fold: Fold,
) -> io::Result<()> {
    for group in groups.iter().take(limit) {
        writeln!(
            out,
            "  {:>11} {:>6.1}%  {} allocation{}",
            bytes(group.bytes),
            share(group.bytes, whole),
            group.count,
            if group.count == 1 { "" } else { "s" }
        )?;
        if let Some(thread) = &group.thread {
            writeln!(out, "        {}", thread.label())?;
        }
        write_stack(out, &group.frames, frames, fold, "        ")?;
    }
    if groups.len() > limit {
        let rest: u64 = groups[limit..]
            .iter()
            .map(|g| g.bytes)
            .fold(0, u64::saturating_add);
        writeln!(
            out,
            "  {:>11} {:>6.1}%  in {}",
            bytes(rest),
            share(rest, whole),
            counted((groups.len() - limit) as u64, "more stack")
        )?;
    }
    Ok(())
}

/// Prints the caller → callee tree, hiding branches under `min_share` percent; machinery
/// frames are folded as in the flat view unless `fold` says not to (see
/// [`ShownNode::children`]).
pub fn write_tree(
    out: &mut dyn Write,
    node: &TreeNode,
    whole: u64,
    min_share: f64,
    fold: Fold,
) -> io::Result<()> {
    fn walk(
        out: &mut dyn Write,
        node: &ShownNode<'_>,
        whole: u64,
        min_share: f64,
        fold: Fold,
        depth: usize,
    ) -> io::Result<()> {
        let mut hidden = (0u64, 0usize);
        for child in node.children(fold) {
            if share(child.bytes, whole) < min_share {
                hidden.0 = hidden.0.saturating_add(child.bytes);
                hidden.1 += 1;
                continue;
            }
            let label = match (child.frame(), child.thread()) {
                (Some(frame), _) => frames::text_label(frame, fold),
                (None, Some(thread)) => thread.label(),
                (None, None) => String::new(),
            };
            writeln!(
                out,
                "  {:>11} {:>6.1}% {}{}",
                bytes(child.bytes),
                share(child.bytes, whole),
                "  ".repeat(depth),
                label
            )?;
            // Deep stacks stop indenting at some point rather than run off the screen.
            walk(
                out,
                &child,
                whole,
                min_share,
                fold,
                (depth + 1).min(MAX_INDENT),
            )?;
        }
        if hidden.1 > 0 {
            writeln!(
                out,
                "  {:>11} {:>6.1}% {}({} smaller branch{})",
                bytes(hidden.0),
                share(hidden.0, whole),
                "  ".repeat(depth),
                hidden.1,
                if hidden.1 == 1 { "" } else { "es" }
            )?;
        }
        Ok(())
    }
    walk(out, &ShownNode::root(node), whole, min_share, fold, 0)
}

/// Text header naming each process of the replay.
pub fn write_processes(out: &mut dyn Write, processes: &[Process]) -> io::Result<()> {
    for process in processes {
        let header = &process.header;
        writeln!(
            out,
            "process {} on {}: {}",
            header.pid,
            header.hostname,
            header.argv.join(" ")
        )?;
        writeln!(
            out,
            "  log {}, {} over {}",
            process.path.display(),
            counted(process.events, "event"),
            seconds(process.end_ns)
        )?;
        if let Some(note) = crate::units::resolution_note(header.time_resolution_ns) {
            writeln!(out, "  {note}")?;
        }
        if process.graph_frees_outside > 0 {
            writeln!(
                out,
                "  {} of CUDA graph allocations outside their graph (back to the graph pool)",
                counted(process.graph_frees_outside, "free")
            )?;
        }
    }
    if let Some(note) = merge_order_note(processes) {
        writeln!(out, "{note}")?;
    }
    Ok(())
}

/// What merging several processes' logs is worth when one of them was recorded at a coarser
/// resolution than 1 ns: the replay interleaves processes by time, so events of different
/// processes within one step of it are taken in log order (the first log's first), not as
/// they happened, and a device figure that adds up processes may be off within a step.
/// `None` for one process or full resolution.
fn merge_order_note(processes: &[Process]) -> Option<String> {
    let coarsest = processes
        .iter()
        .map(|process| process.header.time_resolution_ns)
        .max()?;
    (processes.len() > 1 && coarsest > 1).then(|| {
        format!(
            "events of different processes less than {} apart are merged in log order, not as \
             they happened (times recorded at that resolution): a device's figures that add up \
             several processes may be off within a step; record with VRAMSHIM_TIME_RESOLUTION=1ns \
             for exact merged figures",
            crate::units::resolution(coarsest)
        )
    })
}

/// Per-process facts for JSON.
pub fn processes_json(processes: &[Process]) -> Value {
    Value::Array(
        processes
            .iter()
            .map(|process| {
                let header = &process.header;
                json!({
                    "log": process.path.display().to_string(),
                    "pid": header.pid,
                    "ppid": header.ppid,
                    "argv": header.argv,
                    "hostname": header.hostname,
                    "start_unix_ns": header.start_unix_ns,
                    "start_offset_ns": process.start_offset_ns,
                    "time_resolution_ns": header.time_resolution_ns,
                    "duration_ns": process.end_ns,
                    "events": process.events,
                    "unmatched_frees": process.unmatched_frees,
                    "graph_frees_outside": process.graph_frees_outside,
                    "dropped_events": process.dropped,
                    "ring_dumps": process.dumps.len(),
                    "damage": process.damage.iter().map(|d| json!({"offset": d.offset, "message": d.to_string()})).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

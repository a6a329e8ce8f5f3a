//! `vramshim report` / `summary`: text and JSON.

use std::io::{self, Write};
use std::rc::Rc;

use serde_json::{Value, json};

use super::frames::Fold;
use super::{
    device_name, frame_json, group_json, live_json, processes_json, short_stack, write_groups,
    write_processes,
};
use crate::analysis::apis::Family;
use crate::analysis::groups::StackGroup;
use crate::analysis::peaks::{Peak, ReservedPeak};
use crate::analysis::summary::{FamilyCounts, MemorySample};
use crate::replay::{Live, Process};
use crate::symbols::SymFrame;
use crate::units::{bytes, counted, seconds};

/// Stacks shown at each peak.
pub const TOP_STACKS: usize = 10;

/// One device (or pinned host memory) in the summary.
pub struct DeviceSummary {
    pub device: i32,
    /// Tensor view: live bytes count PyTorch's tensors in place of its segments.
    pub peak: Peak,
    /// Tensor view: the peak of what the driver handed out (segments, not tensors).
    pub reserved: Option<ReservedPeak>,
    pub peak_groups: Vec<StackGroup>,
    /// Bytes of the device's CUDA graph pool among the peak's live bytes.
    pub graph_pool_at_peak: u64,
    /// Bytes the device's CUDA graph pool still held at the end (among `exit_bytes`): no trim
    /// after the last launch, whether or not the graphs were destroyed.
    pub graph_pool_at_exit: u64,
    /// Tensor view: PyTorch's segments still cached at exit (count, bytes).
    pub exit_segments: (u64, u64),
    pub exit_bytes: u64,
    pub exit_count: u64,
    pub failures: u64,
    /// This device's `cuMemGetInfo` samples, in time order.
    pub samples: Vec<MemorySample>,
    /// Each process's own peak on this device.
    pub per_process: Vec<(u32, Peak)>,
}

/// Everything the summary shows.
pub struct SummaryReport<'a> {
    pub processes: &'a [Process],
    pub duration_ns: u64,
    pub devices: Vec<DeviceSummary>,
    pub families: Vec<[FamilyCounts; Family::ALL.len()]>,
    pub total_families: [FamilyCounts; Family::ALL.len()],
    pub largest: Vec<(Live, Rc<[SymFrame]>)>,
}

fn sample_json(sample: &MemorySample) -> Value {
    json!({
        "t_ns": sample.t_ns,
        "used": sample.used,
        "total": sample.total,
        "tracked": sample.tracked,
        "untracked": sample.untracked(),
    })
}

fn families_json(counts: &[FamilyCounts; Family::ALL.len()]) -> Value {
    Value::Array(
        Family::ALL
            .iter()
            .zip(counts)
            .map(|(family, c)| {
                json!({
                    "family": family.name(),
                    "allocs": c.allocs,
                    "frees": c.frees,
                    "failures": c.failures,
                    "allocated_bytes": c.allocated_bytes,
                })
            })
            .collect(),
    )
}

/// The sample with the highest use, and the first one (the baseline before most allocations).
fn notable_samples(samples: &[MemorySample]) -> Option<(&MemorySample, &MemorySample)> {
    let first = samples.first()?;
    let highest = samples
        .iter()
        .max_by_key(|s| (s.used, std::cmp::Reverse(s.t_ns)))?;
    Some((first, highest))
}

pub fn json(report: &SummaryReport<'_>) -> Value {
    let processes = report.processes;
    let devices: Vec<Value> = report
        .devices
        .iter()
        .map(|d| {
            let notable = notable_samples(&d.samples);
            let mut device = json!({
                "device": d.device,
                "peak_bytes": d.peak.bytes,
                "peak_count": d.peak.count,
                "peak_t_ns": d.peak.t_ns,
                "graph_pool_at_peak_bytes": d.graph_pool_at_peak,
                "graph_pool_at_exit_bytes": d.graph_pool_at_exit,
                "live_at_exit_bytes": d.exit_bytes,
                "live_at_exit_count": d.exit_count,
                "failures": d.failures,
                "top_stacks_at_peak": d.peak_groups.iter().take(TOP_STACKS).map(|g| group_json(g, d.peak.bytes, processes)).collect::<Vec<_>>(),
                "memory_samples": {
                    "count": d.samples.len(),
                    "first": notable.map(|(first, _)| sample_json(first)),
                    "highest_use": notable.map(|(_, highest)| sample_json(highest)),
                },
                "per_process": d.per_process.iter().map(|(p, peak)| json!({
                    "pid": processes[*p as usize].header.pid,
                    "peak_bytes": peak.bytes,
                    "peak_t_ns": peak.t_ns,
                })).collect::<Vec<_>>(),
            });
            if let (Some(reserved), Value::Object(map)) = (d.reserved, &mut device) {
                map.insert(
                    "reserved_peak".into(),
                    json!({
                        "bytes": reserved.bytes,
                        "t_ns": reserved.t_ns,
                        "pytorch_segments": {"count": reserved.segments.0, "bytes": reserved.segments.1},
                    }),
                );
                map.insert(
                    "pytorch_segments_at_exit".into(),
                    json!({"count": d.exit_segments.0, "bytes": d.exit_segments.1}),
                );
            }
            device
        })
        .collect();
    let (device_entries, host): (Vec<_>, Vec<_>) = report
        .devices
        .iter()
        .zip(devices)
        .partition(|(d, _)| d.device != vramshim_format::HOST_DEVICE);
    json!({
        "processes": processes_json(processes),
        "per_process_families": processes.iter().zip(&report.families).map(|(p, f)| json!({
            "pid": p.header.pid,
            "families": families_json(f),
        })).collect::<Vec<_>>(),
        "duration_ns": report.duration_ns,
        "devices": device_entries.into_iter().map(|(_, v)| v).collect::<Vec<_>>(),
        "pinned_host": host.into_iter().map(|(_, v)| v).next(),
        "families": families_json(&report.total_families),
        "largest": report.largest.iter().map(|(live, frames)| {
            let mut value = live_json(live, processes);
            if let Value::Object(map) = &mut value {
                map.insert("frames".into(), frames.iter().map(frame_json).collect::<Vec<_>>().into());
            }
            value
        }).collect::<Vec<_>>(),
    })
}

/// The overview as text, stacks' frames folded as `fold` says.
pub fn text(out: &mut dyn Write, report: &SummaryReport<'_>, fold: Fold) -> io::Result<()> {
    let processes = report.processes;
    write_processes(out, processes)?;
    if processes.len() > 1 {
        writeln!(
            out,
            "{} processes over {}",
            processes.len(),
            seconds(report.duration_ns)
        )?;
    }
    if report.devices.is_empty() {
        writeln!(out, "\nno memory was allocated")?;
    }
    for d in &report.devices {
        writeln!(out, "\n{}", device_name(d.device))?;
        let end = crate::replay::end_name(report.processes);
        let (peak, exit) = if d.reserved.is_some() {
            ("peak allocated", format!("live at {end}   "))
        } else {
            ("peak", format!("live at {end}  "))
        };
        writeln!(
            out,
            "  {peak:<13} {} at {} ({} allocation{} live{})",
            bytes(d.peak.bytes),
            seconds(d.peak.t_ns),
            d.peak.count,
            if d.peak.count == 1 { "" } else { "s" },
            if d.reserved.is_some() {
                ": PyTorch's tensors and memory outside its allocator"
            } else {
                ""
            }
        )?;
        if let Some(reserved) = d.reserved {
            writeln!(
                out,
                "  peak reserved  {} at {} (PyTorch's {} segment{}, {}, and memory outside its allocator)",
                bytes(reserved.bytes),
                seconds(reserved.t_ns),
                reserved.segments.0,
                if reserved.segments.0 == 1 { "" } else { "s" },
                bytes(reserved.segments.1)
            )?;
        }
        writeln!(
            out,
            "  {exit}{} in {} allocation{}",
            bytes(d.exit_bytes),
            d.exit_count,
            if d.exit_count == 1 { "" } else { "s" }
        )?;
        if d.reserved.is_some() && d.exit_segments.0 > 0 {
            writeln!(
                out,
                "  cached at {end} {} in {} segment{} of PyTorch's allocator (the allocator's, not leaks)",
                bytes(d.exit_segments.1),
                d.exit_segments.0,
                if d.exit_segments.0 == 1 { "" } else { "s" }
            )?;
        }
        if d.graph_pool_at_peak > 0 {
            writeln!(
                out,
                "  graph pool    {} of the peak (CUDA graphs' memory, held by the driver's graph pool)",
                bytes(d.graph_pool_at_peak)
            )?;
        }
        if d.graph_pool_at_exit > 0 {
            writeln!(
                out,
                "  graph pool    {} of it at {end} (the driver keeps it, destroyed graphs' too, until cudaDeviceGraphMemTrim; not a leak)",
                bytes(d.graph_pool_at_exit)
            )?;
        }
        if d.failures > 0 {
            writeln!(out, "  failed allocations  {}", d.failures)?;
        }
        if processes.len() > 1 {
            for (p, peak) in &d.per_process {
                writeln!(
                    out,
                    "  pid {:<8} peak {} at {}",
                    processes[*p as usize].header.pid,
                    bytes(peak.bytes),
                    seconds(peak.t_ns)
                )?;
            }
        }
        if let Some((first, highest)) = notable_samples(&d.samples) {
            writeln!(
                out,
                "  device memory ({} of cuMemGetInfo, {} total):",
                counted(d.samples.len() as u64, "sample"),
                bytes(first.total)
            )?;
            for (what, s) in [("first sample", first), ("highest use", highest)] {
                writeln!(
                    out,
                    "    {what:<13} at {}: used {}, tracked {}, untracked {} (context, modules, other processes)",
                    seconds(s.t_ns),
                    bytes(s.used),
                    bytes(s.tracked),
                    bytes(s.untracked())
                )?;
            }
        }
        if !d.peak_groups.is_empty() {
            writeln!(out, "  stacks holding most at the peak:")?;
            write_groups(out, &d.peak_groups, d.peak.bytes, TOP_STACKS, 4, fold)?;
        }
    }
    writeln!(out, "\ncalls by API family")?;
    writeln!(
        out,
        "  {:<15} {:>10} {:>10} {:>8} {:>12}",
        "family", "allocs", "frees", "failed", "allocated"
    )?;
    for (family, c) in Family::ALL.iter().zip(&report.total_families) {
        if c.allocs + c.frees + c.failures == 0 {
            continue;
        }
        writeln!(
            out,
            "  {:<15} {:>10} {:>10} {:>8} {:>12}",
            family.name(),
            c.allocs,
            c.frees,
            c.failures,
            bytes(c.allocated_bytes)
        )?;
    }
    if !report.largest.is_empty() {
        writeln!(out, "\nlargest allocations")?;
        for (live, frames) in &report.largest {
            let process = &processes[live.process as usize];
            writeln!(
                out,
                "  {:>11}  {:<22} {:<18} at {}  {}",
                bytes(live.size),
                process.api(live.api),
                device_name(live.device),
                seconds(live.t_ns),
                short_stack(frames, 2, fold)
            )?;
        }
    }
    Ok(())
}

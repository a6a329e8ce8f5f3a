//! `vramshim whatif`: the simulated configurations, ranked, as text and JSON.

use std::io::{self, Write};

use serde_json::{Value, json};
use vramshim_sim::{AddressOrder, Stats};

use super::device_name;
use crate::analysis::requests::{AddressVotes, CapacitySource, Requests, Ties};
use crate::replay::Process;
use crate::units::{bytes, counted, seconds};

/// The recording's pattern when the requests replayed are PyTorch's tensor blocks (its
/// default allocator, recorded through its tracker or its profiler report).
pub const TENSORS_PATTERN: &str = "caching_allocator_tensors";

/// One simulated configuration and its outcome.
pub struct Row {
    /// As the user wrote it, or the built-in set's name for it.
    pub label: String,
    /// The `PYTORCH_CUDA_ALLOC_CONF` string (normalised; empty for the defaults).
    pub conf: String,
    pub stats: Stats,
    /// Where the outcome hangs on the driver's address order (PyTorch breaking best-fit ties
    /// by address): the same configuration with segments laid out in the other order, when
    /// it fits where this does not (or the reverse), or differs in peak reserved, retries or
    /// `cudaMalloc`s.
    pub other_order: Option<(AddressOrder, Stats)>,
}

impl Row {
    /// No simulated allocation failed, PyTorch's or another library's (a cuBLAS handle's
    /// memory that does not fit beside PyTorch's segments fails the program too), except
    /// cuDNN workspaces, whose failure torch survives.
    pub fn fits(&self) -> bool {
        fits(&self.stats)
    }
}

/// A simulation in which no allocation failed, PyTorch's or another library's (see
/// [`Row::fits`]).
pub fn fits(stats: &Stats) -> bool {
    stats.first_oom.is_none() && stats.external_failures == 0
}

pub struct WhatIfReport<'a> {
    pub process: &'a Process,
    pub device: i32,
    /// What the recorded allocations look like (`analysis::allocator::Pattern::name`, or [`TENSORS_PATTERN`]).
    pub pattern: &'static str,
    pub pattern_reason: String,
    pub requests: &'a Requests,
    /// `None`: unlimited.
    pub capacity: Option<u64>,
    pub capacity_source: CapacitySource,
    /// The driver's address order the segments were laid out in, decided from the
    /// recording's first addresses (`votes`: over the whole recording).
    pub order: AddressOrder,
    pub votes: AddressVotes,
    pub torch_version: Option<String>,
    pub ties: Ties,
    pub memory_fraction: Option<f64>,
    /// Best first: no OOM before OOM, then by peak reserved, then fewer `cudaMalloc`s, then
    /// the order simulated.
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
    /// The requests simulated are PyTorch 2.1's block sizes (its profiler report has no
    /// requested sizes).
    pub requests_are_blocks: bool,
}

impl WhatIfReport<'_> {
    /// The best configuration that fits, if any.
    pub fn best(&self) -> Option<&Row> {
        self.rows.iter().find(|row| row.fits())
    }
}

fn oom_json(stats: &Stats) -> Value {
    match &stats.first_oom {
        Some(oom) => json!({
            "t_ns": oom.t_ns,
            "request_index": oom.request_index,
            "size": oom.size,
            "rounded": oom.rounded,
            "alloc_size": oom.alloc_size,
            "stream": oom.stream,
            "reserved": oom.reserved,
            "allocated": oom.allocated,
            "peak_reserved": oom.peak_reserved,
            "num_alloc_retries": oom.num_alloc_retries,
            "num_device_alloc": oom.num_device_alloc,
            "num_device_free": oom.num_device_free,
            "num_ooms": oom.num_ooms,
        }),
        None => Value::Null,
    }
}

/// The first cuDNN workspace that did not fit (its convolution fell back), or null.
fn fallback_json(stats: &Stats) -> Value {
    match &stats.first_fallback {
        Some(failure) => json!({
            "t_ns": failure.t_ns,
            "request_index": failure.request_index,
            "size": failure.size,
            "alloc_size": failure.alloc_size,
            "reserved": failure.reserved,
            "num_ooms": failure.num_ooms,
        }),
        None => Value::Null,
    }
}

/// The first library allocation that did not fit beside PyTorch's segments, or null.
fn library_failure_json(stats: &Stats) -> Value {
    match &stats.first_external_failure {
        Some(failure) => json!({
            "t_ns": failure.t_ns,
            "size": failure.size,
            "reserved": failure.reserved,
            "libraries": failure.external,
            "peak_reserved": failure.peak_reserved,
            "num_alloc_retries": failure.num_alloc_retries,
            "num_device_alloc": failure.num_device_alloc,
            "num_device_free": failure.num_device_free,
        }),
        None => Value::Null,
    }
}

fn row_json(rank: usize, row: &Row) -> Value {
    let s = &row.stats;
    json!({
        "rank": rank,
        "label": row.label,
        "conf": row.conf,
        "fits": row.fits(),
        "peak_reserved": s.peak_reserved,
        "peak_reserved_t_ns": s.at_peak.t_ns,
        "peak_allocated": s.peak_allocated,
        "peak_requested": s.peak_requested,
        "allocated_at_peak": s.at_peak.allocated,
        "reserved_minus_allocated_at_peak": s.at_peak.reserved_minus_allocated,
        "inactive_split_at_peak": s.at_peak.inactive_split_bytes,
        "largest_free_at_peak": s.at_peak.largest_free_block,
        "total_free_at_peak": s.at_peak.total_free,
        "fragmentation_at_peak": s.at_peak.external_fragmentation,
        "num_device_alloc": s.num_device_alloc,
        "num_device_free": s.num_device_free,
        "num_alloc_retries": s.num_alloc_retries,
        "num_ooms": s.num_ooms,
        "oom": oom_json(s),
        "library_failures": s.external_failures,
        "library_failure": library_failure_json(s),
        "cudnn_fallbacks": s.workspace_fallbacks,
        "cudnn_fallback": fallback_json(s),
        "cudnn_workspaces_skipped": s.workspaces_skipped,
        "other_order": match &row.other_order {
            Some((order, other)) => json!({
                "order": order_name(*order),
                "fits": fits(other),
                "peak_reserved": other.peak_reserved,
                "num_device_alloc": other.num_device_alloc,
                "num_device_free": other.num_device_free,
                "num_alloc_retries": other.num_alloc_retries,
                "num_ooms": other.num_ooms,
                "oom": oom_json(other),
            }),
            None => Value::Null,
        },
    })
}

/// "rising" or "falling".
fn order_name(order: AddressOrder) -> &'static str {
    match order {
        AddressOrder::Rising => "rising",
        AddressOrder::Falling => "falling",
    }
}

pub fn json(report: &WhatIfReport<'_>) -> Value {
    let r = report.requests;
    json!({
        "log": report.process.path.display().to_string(),
        "pid": report.process.header.pid,
        "device": report.device,
        "pattern": report.pattern,
        "pattern_reason": report.pattern_reason,
        "capacity": report.capacity,
        "capacity_source": report.capacity_source.name(),
        "address_order": {
            "order": order_name(report.order),
            "rising": report.votes.rising,
            "falling": report.votes.falling,
            "torch_version": report.torch_version,
            "ties": report.ties.name(),
        },
        "memory_fraction": report.memory_fraction,
        "requests": {
            "allocs": r.allocs,
            "frees": r.frees,
            "empty_cache": r.empty_cache,
            "failed_in_recording": r.failed,
            "cudnn_benchmark_probes": r.cudnn_probes,
            "graph_captures": r.graphs.captures,
            "graph_allocs": r.graphs.allocs,
            "left_out": r.skipped,
            "other_libraries": r.external_allocs,
            "other_devices": r.other_devices,
            "sizes": if report.requests_are_blocks { "blocks" } else { "requested" },
        },
        "configs": report.rows.iter().enumerate().map(|(i, row)| row_json(i + 1, row)).collect::<Vec<_>>(),
        "best": report.best().map(|row| json!({
            "label": row.label,
            "conf": row.conf,
            "peak_reserved": row.stats.peak_reserved,
        })),
        "notes": report.notes,
    })
}

/// How to set a configuration in the shell.
pub fn export_line(conf: &str) -> String {
    if conf.is_empty() {
        "the defaults: leave PYTORCH_CUDA_ALLOC_CONF unset (or set it to \"\")".to_string()
    } else {
        format!("PYTORCH_CUDA_ALLOC_CONF={conf}")
    }
}

fn oom_text(stats: &Stats) -> String {
    let library = stats.first_external_failure.as_ref();
    match (&stats.first_oom, library) {
        (Some(oom), Some(failure)) if failure.t_ns < oom.t_ns => library_text(failure),
        (Some(oom), _) => format!("yes at {} ({} request)", seconds(oom.t_ns), bytes(oom.size)),
        (None, Some(failure)) => library_text(failure),
        (None, None) if stats.workspace_fallbacks > 0 => format!(
            "no ({} survived: cuDNN fell back)",
            counted(stats.num_ooms, "OOM")
        ),
        (None, None) => "no".to_string(),
    }
}

fn library_text(failure: &vramshim_sim::ExternalFailure) -> String {
    format!(
        "yes at {} (a library's {})",
        seconds(failure.t_ns),
        bytes(failure.size)
    )
}

pub fn text(out: &mut dyn Write, report: &WhatIfReport<'_>) -> io::Result<()> {
    let r = report.requests;
    writeln!(
        out,
        "{} (pid {}), {}: {}, {}, {} empty_cache",
        report.process.path.display(),
        report.process.header.pid,
        device_name(report.device),
        counted(r.allocs, "allocation"),
        counted(r.frees, "free"),
        r.empty_cache
    )?;
    writeln!(
        out,
        "recording looks like: {} ({})",
        report.pattern, report.pattern_reason
    )?;
    match report.capacity {
        Some(capacity) => writeln!(
            out,
            "capacity: {}{}",
            bytes(capacity),
            match report.capacity_source {
                CapacitySource::Given => " (--capacity)",
                _ => " (device total from the log's cuMemGetInfo samples)",
            }
        )?,
        None => writeln!(
            out,
            "capacity: unlimited (no --capacity and no memory sample)"
        )?,
    }
    let votes = report.votes;
    let torch = match &report.torch_version {
        Some(version) => format!("torch {version}"),
        // Without a version, ties by address come only from a log whose blocks came from the
        // profiler report (`WhatIf::blocks_reported`).
        None if report.ties == Ties::ByAddress => {
            "torch's version not found; its blocks came from the profiler report, so it is older than 2.2, which".to_string()
        }
        None => "torch's version not found (--torch-version gives it), taken as the current release's".to_string(),
    };
    match report.ties {
        Ties::ByAddress => writeln!(
            out,
            "segment addresses: {} ({torch} breaks best-fit ties by address; the recording's driver: {} new addresses above the earlier ones, {} below)",
            order_name(report.order),
            votes.rising,
            votes.falling
        )?,
        Ties::BySegmentAge => writeln!(
            out,
            "segment addresses: {} ({torch} breaks best-fit ties by segment age)",
            order_name(report.order),
        )?,
    }
    if let Some(fraction) = report.memory_fraction {
        writeln!(out, "memory fraction: {fraction}")?;
    }
    writeln!(out)?;
    let headers = [
        "#",
        "fits",
        "peak reserved",
        "peak allocated",
        "reserved-alloc",
        "frag",
        "cudaMalloc",
        "retries",
        "OOM",
        "config",
    ];
    let cells: Vec<[String; 10]> = report
        .rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let s = &row.stats;
            [
                (i + 1).to_string(),
                if row.fits() { "yes" } else { "no" }.to_string(),
                bytes(s.peak_reserved),
                bytes(s.peak_allocated),
                bytes(s.at_peak.reserved_minus_allocated),
                format!("{:.1}%", s.at_peak.external_fragmentation * 100.0),
                s.num_device_alloc.to_string(),
                s.num_alloc_retries.to_string(),
                oom_text(s),
                if row.label.is_empty() {
                    "(default)".to_string()
                } else {
                    row.label.clone()
                },
            ]
        })
        .collect();
    let mut widths = headers.map(str::len);
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |out: &mut dyn Write, row: &[String]| -> io::Result<()> {
        let mut text = String::new();
        for (i, cell) in row.iter().enumerate() {
            let pad = widths[i].saturating_sub(cell.chars().count());
            // Numbers right-aligned, words left-aligned; the last column unpadded.
            if i == row.len() - 1 {
                text.push_str(cell);
            } else if (2..=7).contains(&i) || i == 0 {
                text.push_str(&" ".repeat(pad));
                text.push_str(cell);
                text.push_str("  ");
            } else {
                text.push_str(cell);
                text.push_str(&" ".repeat(pad + 2));
            }
        }
        writeln!(out, "{}", text.trim_end())
    };
    let header_cells: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    line(out, &header_cells)?;
    for row in &cells {
        line(out, row)?;
    }
    writeln!(out)?;
    match report.best() {
        Some(best) => writeln!(
            out,
            "best that fits: {} (peak reserved {})",
            export_line(&best.conf),
            bytes(best.stats.peak_reserved)
        )?,
        None => writeln!(out, "no configuration fits the capacity")?,
    }
    for row in &report.rows {
        if let Some((order, other)) = &row.other_order {
            let name = if row.label.is_empty() {
                "(default)"
            } else {
                row.label.as_str()
            };
            writeln!(
                out,
                "note: {name} hangs on where the driver puts new segments (this PyTorch breaks best-fit ties by address; a real driver's order varies from run to run): laid out {}, {} at a peak reserved of {}, with {} and {}",
                order_name(*order),
                if fits(other) {
                    "it fits"
                } else {
                    "it runs out of memory"
                },
                bytes(other.peak_reserved),
                match other.num_alloc_retries {
                    1 => "1 retry".to_string(),
                    n => format!("{n} retries"),
                },
                counted(other.num_device_alloc, "cudaMalloc"),
            )?;
        }
    }
    for note in &report.notes {
        writeln!(out, "note: {note}")?;
    }
    Ok(())
}

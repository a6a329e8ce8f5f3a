//! `vramshim allocator`: the caching-allocator view, as text and JSON.

use std::io::{self, Write};

use serde_json::{Value, json};

use super::{device_name, processes_json};
use crate::analysis::allocator::{
    ALLOC_ENV, AllocatorView, Calls, DeviceAllocator, Libraries, Sizes,
};
use crate::analysis::oom::Retry;
use crate::replay::Process;
use crate::units::{bytes, counted, seconds};

/// Sizes listed in the text histogram (JSON has them all).
pub const TEXT_SIZES: usize = 12;

/// PyTorch's release-and-retry after a failed allocation, or after its own refusal past the
/// memory fraction (no failed call); also a release that is not a retry (oversize, garbage
/// collection).
pub struct RetryView {
    pub process: u32,
    pub device: i32,
    /// The failure, or (past the fraction, where no call failed) the first release.
    pub t_ns: u64,
    /// The segment size asked for (0 where the recording does not tell).
    pub request: u64,
    pub retry: Retry,
    /// PyTorch refused the segment itself, past `set_per_process_memory_fraction`: no
    /// `cudaMalloc` failed before the release.
    pub past_fraction: bool,
}

pub struct AllocatorReport<'a> {
    pub processes: &'a [Process],
    pub duration_ns: u64,
    pub view: &'a AllocatorView,
    /// PyTorch's release-and-retry sequences it counts (`num_alloc_retries`), after a failed
    /// call or past the memory fraction.
    pub retries: Vec<RetryView>,
    /// `max_split_size_mb`'s uncounted step ([`Retry::oversize`]).
    pub oversize_releases: Vec<RetryView>,
    /// `garbage_collection_threshold`'s releases inside an allocation (not retries).
    pub gc_releases: Vec<RetryView>,
    /// Failed allocations per device.
    pub failures: Vec<(i32, u64)>,
}

fn calls_json(calls: &Calls) -> Value {
    json!({ "count": calls.count, "bytes": calls.bytes })
}

fn env_json(processes: &[Process]) -> Value {
    Value::Array(
        processes
            .iter()
            .map(|p| {
                let mut map = serde_json::Map::new();
                map.insert("pid".to_string(), json!(p.header.pid));
                for name in ALLOC_ENV {
                    map.insert(name.to_string(), json!(p.header.env_value(name)));
                }
                Value::Object(map)
            })
            .collect(),
    )
}

fn device_json(report: &AllocatorReport<'_>, d: &DeviceAllocator) -> Value {
    let (pattern, reason) = d.pattern();
    let processes = report.processes;
    let pid = |p: u32| processes.get(p as usize).map(|p| p.header.pid);
    json!({
        "device": d.device,
        "pattern": pattern.name(),
        "pattern_reason": reason,
        "reserved": {
            "peak": d.reserved.peak,
            "peak_t_ns": d.reserved.peak_t_ns,
            "final": d.reserved.current,
            "bucket_ns": d.reserved.series.bucket_ns,
            "series": d.reserved.series.points().iter().map(|(t, v)| json!({"t_ns": t, "reserved": v})).collect::<Vec<_>>(),
        },
        "segment_sizes": sizes_json(&d.sizes),
        "segment_sizes_other": calls_json(&d.sizes.other),
        "cuda_malloc": {
            "count": d.malloc.count,
            "bytes": d.malloc.bytes,
            "failed": d.malloc_failed.count,
            "failed_bytes": d.malloc_failed.bytes,
        },
        "cuda_free": calls_json(&d.free),
        "vmm": {
            "create": calls_json(&d.vmm_create),
            "release": calls_json(&d.vmm_release),
            "maps": d.vmm_maps,
            "unmaps": d.vmm_unmaps,
        },
        "stream_ordered": {
            "alloc": calls_json(&d.async_alloc),
            "free": calls_json(&d.async_free),
            "trims": d.trims,
        },
        "empty_cache": {
            "count": d.bursts.total.count,
            "bytes": d.bursts.total.bytes,
            "omitted": d.bursts.omitted,
            "bursts": d.bursts.list.iter().map(|b| json!({
                "pid": pid(b.process),
                "t_ns": b.t_ns,
                "end_t_ns": b.end_t_ns,
                "frees": b.frees,
                "bytes": b.bytes,
            })).collect::<Vec<_>>(),
        },
        "failed_allocations": report.failures.iter().find(|(dev, _)| *dev == d.device).map_or(0, |(_, n)| *n),
        "oom_retries": retries_json(&report.retries, d.device, pid),
        "oversize_releases": retries_json(&report.oversize_releases, d.device, pid),
        "gc_releases": retries_json(&report.gc_releases, d.device, pid),
        "libraries": libraries_json(&d.libraries),
        "outside_allocator": d.outside.map(|o| json!({
            "samples": o.samples,
            "max": o.max,
            "max_t_ns": o.max_t_ns,
            "last": o.last,
            "last_t_ns": o.last_t_ns,
            "device_total": o.total,
        })),
    })
}

fn retries_json(retries: &[RetryView], device: i32, pid: impl Fn(u32) -> Option<u32>) -> Value {
    retries
        .iter()
        .filter(|r| r.device == device)
        .map(|r| {
            json!({
                "pid": pid(r.process),
                "t_ns": r.t_ns,
                "request": r.request,
                "released_bytes": r.retry.released_bytes,
                "released_count": r.retry.released_count,
                "succeeded": r.retry.succeeded,
                "retry_t_ns": r.retry.t_ns,
                "past_fraction": r.past_fraction,
            })
        })
        .collect::<Vec<_>>()
        .into()
}

/// Driver-API allocations kept out of the reserved bytes (all zero when there were none, or
/// when they were the device's only allocations and so count as reserved).
fn libraries_json(l: &Libraries) -> Value {
    json!({
        "peak": l.held.peak,
        "peak_t_ns": l.held.peak_t_ns,
        "final": l.held.current,
        "alloc": calls_json(&l.malloc),
        "failed": calls_json(&l.failed),
        "free": calls_json(&l.free),
        "sizes": sizes_json(&l.sizes),
        "sizes_other": calls_json(&l.sizes.other),
    })
}

/// Each size with its count and bytes, smallest size first.
fn sizes_json(sizes: &Sizes) -> Vec<Value> {
    sizes
        .counts
        .iter()
        .map(|(size, count)| json!({"size": size, "count": count, "bytes": size.saturating_mul(*count)}))
        .collect()
}

/// The [`TEXT_SIZES`] sizes holding most bytes, and how many more there are.
fn top_sizes(sizes: &Sizes) -> (Vec<(u64, u64)>, u64) {
    let mut all = sizes.by_bytes();
    let rest = all.len().saturating_sub(TEXT_SIZES) as u64 + sizes.other.count;
    all.truncate(TEXT_SIZES);
    (all, rest)
}

pub fn json(report: &AllocatorReport<'_>) -> Value {
    json!({
        "processes": processes_json(report.processes),
        "duration_ns": report.duration_ns,
        "env": env_json(report.processes),
        "address_reservations": calls_json(&report.view.reservations),
        "devices": report.view.devices.iter().map(|d| device_json(report, d)).collect::<Vec<_>>(),
    })
}

pub fn text(out: &mut dyn Write, report: &AllocatorReport<'_>) -> io::Result<()> {
    for process in report.processes {
        let header = &process.header;
        write!(
            out,
            "{} (pid {}): {}",
            process.path.display(),
            header.pid,
            header.argv.join(" ")
        )?;
        writeln!(out)?;
        for name in ALLOC_ENV {
            if let Some(value) = header.env_value(name) {
                writeln!(out, "  {name}={value}")?;
            }
        }
    }
    writeln!(out, "duration {}", seconds(report.duration_ns))?;
    if report.view.devices.is_empty() {
        writeln!(out, "\nno device allocations")?;
    }
    for d in &report.view.devices {
        let (pattern, reason) = d.pattern();
        writeln!(
            out,
            "\n{}: looks like {} ({reason})",
            device_name(d.device),
            pattern.name()
        )?;
        // What the allocator's bytes are called: segments are reserved, live allocations held.
        let held = if pattern.is_segments() {
            "reserved"
        } else {
            "held"
        };
        let reserved_word = if pattern.is_segments() {
            "reserved"
        } else {
            "held (no caching allocator: live allocations)"
        };
        writeln!(
            out,
            "  {reserved_word}: peak {} at {}, at the end {}",
            bytes(d.reserved.peak),
            seconds(d.reserved.peak_t_ns),
            bytes(d.reserved.current)
        )?;
        writeln!(
            out,
            "  cudaMalloc: {} calls, {}; {} failed; cudaFree: {} calls, {}",
            d.malloc.count,
            bytes(d.malloc.bytes),
            d.malloc_failed.count,
            d.free.count,
            bytes(d.free.bytes)
        )?;
        if d.vmm_create.count > 0 || d.vmm_release.count > 0 {
            writeln!(
                out,
                "  VMM: {} cuMemCreate ({}), {} cuMemRelease ({}), {} maps, {} unmaps",
                d.vmm_create.count,
                bytes(d.vmm_create.bytes),
                d.vmm_release.count,
                bytes(d.vmm_release.bytes),
                d.vmm_maps,
                d.vmm_unmaps
            )?;
        }
        if d.async_alloc.count > 0 || d.trims > 0 {
            writeln!(
                out,
                "  stream-ordered: {} ({}), {}, {}",
                counted(d.async_alloc.count, "allocation"),
                bytes(d.async_alloc.bytes),
                counted(d.async_free.count, "free"),
                counted(d.trims, "trim")
            )?;
        }
        if !d.sizes.counts.is_empty() {
            let (sizes, rest) = top_sizes(&d.sizes);
            writeln!(out, "  segment sizes (by bytes):")?;
            for (size, count) in &sizes {
                writeln!(
                    out,
                    "    {:>12} x {:<6} {}",
                    bytes(*size),
                    count,
                    bytes(size.saturating_mul(*count))
                )?;
            }
            if rest > 0 {
                writeln!(out, "    ... and {rest} more")?;
            }
        }
        let libraries = &d.libraries;
        if libraries.malloc.count + libraries.failed.count > 0 {
            writeln!(
                out,
                "  libraries (driver-API cuMemAlloc beside the allocator's, not in {reserved}): {}, {}; peak {} at {}, at the end {}{}",
                counted(libraries.malloc.count, "allocation"),
                bytes(libraries.malloc.bytes),
                bytes(libraries.held.peak),
                seconds(libraries.held.peak_t_ns),
                bytes(libraries.held.current),
                if libraries.failed.count > 0 {
                    format!("; {} failed", libraries.failed.count)
                } else {
                    String::new()
                },
                reserved = held,
            )?;
            let (sizes, rest) = top_sizes(&libraries.sizes);
            let listed: Vec<String> = sizes
                .iter()
                .map(|(size, count)| format!("{} x {count}", bytes(*size)))
                .collect();
            let more = if rest > 0 {
                format!(", and {rest} more")
            } else {
                String::new()
            };
            writeln!(out, "    sizes: {}{more}", listed.join(", "))?;
        }
        writeln!(
            out,
            "  empty_cache() bursts: {} releasing {}",
            d.bursts.total.count,
            bytes(d.bursts.total.bytes)
        )?;
        for b in d.bursts.list.iter().take(10) {
            writeln!(
                out,
                "    at {}: {}, {}",
                seconds(b.t_ns),
                counted(b.frees, "free"),
                bytes(b.bytes)
            )?;
        }
        let retries: Vec<&RetryView> = report
            .retries
            .iter()
            .filter(|r| r.device == d.device)
            .collect();
        let oversize = report
            .oversize_releases
            .iter()
            .filter(|r| r.device == d.device)
            .count();
        let past_fraction = retries.iter().filter(|r| r.past_fraction).count();
        if past_fraction > 0 {
            writeln!(
                out,
                "  OOM retries: {} ({past_fraction} past the memory fraction, with no failed call)",
                retries.len()
            )?;
        } else {
            writeln!(out, "  OOM retries: {}", retries.len())?;
        }
        if oversize > 0 {
            writeln!(
                out,
                "    (and {} of blocks over max_split_size_mb first, which PyTorch does not count as retries)",
                counted(oversize as u64, "release")
            )?;
        }
        let gc: Vec<&RetryView> = report
            .gc_releases
            .iter()
            .filter(|r| r.device == d.device)
            .collect();
        if !gc.is_empty() {
            writeln!(
                out,
                "    (and {} by garbage_collection_threshold, {}, which PyTorch does not count as retries)",
                counted(gc.len() as u64, "release"),
                bytes(gc.iter().map(|r| r.retry.released_bytes).sum())
            )?;
        }
        for r in retries {
            let what = if !r.past_fraction {
                format!("{} failed", bytes(r.request))
            } else if r.request > 0 {
                format!("{} refused past the memory fraction", bytes(r.request))
            } else {
                "refused past the memory fraction".to_string()
            };
            writeln!(
                out,
                "    at {}: {what}, released {} in {}, retry {}",
                seconds(r.t_ns),
                bytes(r.retry.released_bytes),
                counted(r.retry.released_count, "free"),
                if r.retry.succeeded {
                    "succeeded"
                } else {
                    "failed"
                }
            )?;
        }
        match d.outside {
            Some(o) => writeln!(
                out,
                "  outside any allocator (used - {reserved}{libs}): up to {} at {}, {} at the last sample (device total {})",
                bytes(o.max),
                seconds(o.max_t_ns),
                bytes(o.last),
                bytes(o.total),
                reserved = held,
                libs = if libraries.malloc.count > 0 {
                    " - libraries"
                } else {
                    ""
                },
            )?,
            None => writeln!(out, "  outside any allocator: no memory samples")?,
        }
    }
    Ok(())
}

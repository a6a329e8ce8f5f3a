//! `vramshim allocator`: the caching-allocator view, as text and JSON.

use std::io::{self, Write};

use serde_json::{Value, json};

use super::{device_name, processes_json};
use crate::analysis::allocator::{ALLOC_ENV, AllocatorView, Calls, DeviceAllocator, Libraries};
use crate::analysis::oom::Retry;
use crate::replay::Process;
use crate::units::{bytes, counted, seconds};

/// Sizes listed in the text histogram (JSON has them all).
pub const TEXT_SIZES: usize = 12;

/// A failed allocation followed by PyTorch's release-and-retry.
pub struct RetryView {
    pub process: u32,
    pub device: i32,
    pub t_ns: u64,
    pub request: u64,
    pub retry: Retry,
}

pub struct AllocatorReport<'a> {
    pub processes: &'a [Process],
    pub duration_ns: u64,
    pub view: &'a AllocatorView,
    pub retries: Vec<RetryView>,
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
    let mut sizes: Vec<(u64, u64)> = d.sizes.iter().map(|(s, n)| (*s, *n)).collect();
    sizes.sort_by_key(|(size, _)| *size);
    json!({
        "device": d.device,
        "pattern": pattern.name(),
        "pattern_reason": reason,
        "reserved": {
            "peak": d.peak_reserved,
            "peak_t_ns": d.peak_t_ns,
            "final": d.reserved,
            "bucket_ns": d.series.bucket_ns,
            "series": d.series.points().iter().map(|(t, v)| json!({"t_ns": t, "reserved": v})).collect::<Vec<_>>(),
        },
        "segment_sizes": sizes.iter().map(|(size, count)| json!({"size": size, "count": count, "bytes": size.saturating_mul(*count)})).collect::<Vec<_>>(),
        "segment_sizes_other": calls_json(&d.other_sizes),
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
            "count": d.burst_total.count,
            "bytes": d.burst_total.bytes,
            "omitted": d.bursts_omitted,
            "bursts": d.bursts.iter().map(|b| json!({
                "pid": pid(b.process),
                "t_ns": b.t_ns,
                "end_t_ns": b.end_t_ns,
                "frees": b.frees,
                "bytes": b.bytes,
            })).collect::<Vec<_>>(),
        },
        "failed_allocations": report.failures.iter().find(|(dev, _)| *dev == d.device).map_or(0, |(_, n)| *n),
        "oom_retries": report.retries.iter().filter(|r| r.device == d.device).map(|r| json!({
            "pid": pid(r.process),
            "t_ns": r.t_ns,
            "request": r.request,
            "released_bytes": r.retry.released_bytes,
            "released_count": r.retry.released_count,
            "succeeded": r.retry.succeeded,
            "retry_t_ns": r.retry.t_ns,
        })).collect::<Vec<_>>(),
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
        "sizes": l.sizes.counts.iter().map(|(size, count)| json!({"size": size, "count": count, "bytes": size.saturating_mul(*count)})).collect::<Vec<_>>(),
        "sizes_other": calls_json(&l.sizes.other),
    })
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
        let reserved_word = if pattern.is_segments() {
            "reserved"
        } else {
            "held (no caching allocator: live allocations)"
        };
        writeln!(
            out,
            "  {reserved_word}: peak {} at {}, at the end {}",
            bytes(d.peak_reserved),
            seconds(d.peak_t_ns),
            bytes(d.reserved)
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
        if !d.sizes.is_empty() {
            let mut sizes: Vec<(u64, u64)> = d.sizes.iter().map(|(s, n)| (*s, *n)).collect();
            sizes.sort_by_key(|(size, count)| {
                (std::cmp::Reverse(size.saturating_mul(*count)), *size)
            });
            writeln!(out, "  segment sizes (by bytes):")?;
            for (size, count) in sizes.iter().take(TEXT_SIZES) {
                writeln!(
                    out,
                    "    {:>12} x {:<6} {}",
                    bytes(*size),
                    count,
                    bytes(size.saturating_mul(*count))
                )?;
            }
            let rest = sizes.len().saturating_sub(TEXT_SIZES) as u64 + d.other_sizes.count;
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
                reserved = if pattern.is_segments() {
                    "reserved"
                } else {
                    "held"
                },
            )?;
            let mut sizes: Vec<(u64, u64)> = libraries
                .sizes
                .counts
                .iter()
                .map(|(s, n)| (*s, *n))
                .collect();
            sizes.sort_by_key(|(size, count)| {
                (std::cmp::Reverse(size.saturating_mul(*count)), *size)
            });
            let listed: Vec<String> = sizes
                .iter()
                .take(TEXT_SIZES)
                .map(|(size, count)| format!("{} x {count}", bytes(*size)))
                .collect();
            let rest = sizes.len().saturating_sub(TEXT_SIZES) as u64 + libraries.sizes.other.count;
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
            d.burst_total.count,
            bytes(d.burst_total.bytes)
        )?;
        for b in d.bursts.iter().take(10) {
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
        writeln!(out, "  OOM retries: {}", retries.len())?;
        for r in retries {
            writeln!(
                out,
                "    at {}: {} failed, released {} in {}, retry {}",
                seconds(r.t_ns),
                bytes(r.request),
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
                reserved = if pattern.is_segments() {
                    "reserved"
                } else {
                    "held"
                },
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

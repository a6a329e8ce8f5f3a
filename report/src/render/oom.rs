//! `vramshim oom`: each failed allocation with its context and verdict.

use std::io::{self, Write};

use serde_json::{Value, json};

use super::frames::Fold;
use super::{
    device_name, group_json, live_json, processes_json, write_groups, write_processes, write_stack,
};
use crate::analysis::groups::StackGroup;
use crate::analysis::oom::{Failure, Verdict};
use crate::replay::Process;
use crate::symbols::SymFrame;
use crate::units::{bytes, counted, seconds};

/// A failure with its stacks resolved.
pub struct FailureView<'a> {
    pub failure: &'a Failure,
    pub frames: std::rc::Rc<[SymFrame]>,
    /// Stacks of `failure.largest_live`, in the same order.
    pub largest_frames: Vec<std::rc::Rc<[SymFrame]>>,
    /// Live set on the device by stack (empty past the detailed limit).
    pub live_groups: Vec<StackGroup>,
}

pub struct OomReport<'a> {
    pub processes: &'a [Process],
    pub failures: Vec<FailureView<'a>>,
    pub top: usize,
    pub frames: usize,
    /// Which frames the text shows.
    pub fold: Fold,
}

/// The verdict in words.
pub fn explain(failure: &Failure) -> String {
    match (failure.verdict, failure.mem_info) {
        (Verdict::ExceededFree, Some((free, _))) => format!(
            "the request ({}) exceeded the device's free memory ({})",
            bytes(failure.request),
            bytes(free)
        ),
        (Verdict::FragmentationOrLimit, Some((free, _))) => format!(
            "free memory ({}) was enough for the request ({}): the failure came from fragmentation or a limit (memory fraction, pool limit, MIG/MPS)",
            bytes(free),
            bytes(failure.request)
        ),
        (Verdict::AllocatorLimit, _) => format!(
            "PyTorch's allocator refused the request ({}) itself, without asking the driver: the segment it needed would pass the process's memory fraction (torch.cuda.set_per_process_memory_fraction); it released its cached segments, tried again and refused again",
            bytes(failure.request)
        ),
        (Verdict::OtherError, _) => format!(
            "not out of memory: the call failed with error {}{} (PyTorch falls back to another way of allocating on such errors)",
            failure.result,
            match failure.result {
                1 => " (invalid value)",
                800 => " (CUDA_ERROR_NOT_PERMITTED)",
                801 => " (CUDA_ERROR_NOT_SUPPORTED)",
                _ => "",
            }
        ),
        _ => "no free/total reading was recorded with the failure".to_string(),
    }
}

/// Tensor view: the bytes PyTorch's allocator held free inside its segments at the failure.
fn cached(failure: &Failure) -> u64 {
    failure.segments.map_or(0, |(_, _, cached)| cached)
}

fn retry_text(view: &FailureView<'_>) -> Option<String> {
    let retry = view.failure.retry?;
    Some(format!(
        "retried like PyTorch's caching allocator: released {}{} in {} free{} on the same thread, then asked again at {}: {}",
        bytes(retry.released_bytes),
        if retry.oversize {
            " of blocks over max_split_size_mb (PyTorch's first step, not counted in num_alloc_retries)"
        } else {
            ""
        },
        retry.released_count,
        if retry.released_count == 1 { "" } else { "s" },
        seconds(retry.t_ns),
        if retry.succeeded {
            "succeeded"
        } else {
            "failed again"
        }
    ))
}

pub fn json(report: &OomReport<'_>) -> Value {
    let processes = report.processes;
    json!({
        "processes": processes_json(processes),
        "failures": report.failures.iter().map(|view| {
            let f = view.failure;
            let process = &processes[f.process as usize];
            json!({
                "pid": process.header.pid,
                "t_ns": f.t_ns,
                "api": process.api(f.api),
                "device": f.device,
                "thread": f.thread,
                "thread_name": process.thread_names.get(&f.thread),
                "stream": f.stream,
                "request": f.request,
                "result": f.result,
                "free": f.mem_info.map(|(free, _)| free),
                "total": f.mem_info.map(|(_, total)| total),
                "used": f.mem_info.map(|(free, total)| total.saturating_sub(free)),
                "tracked_bytes": f.tracked_bytes,
                "tracked_count": f.tracked_count,
                "untracked_bytes": f.mem_info.map(|(free, total)| total.saturating_sub(free).saturating_sub(f.tracked_bytes).saturating_sub(cached(f))),
                "block_request": f.block_request,
                "pytorch_segments": f.segments.map(|(count, bytes, cached)| json!({
                    "count": count,
                    "bytes": bytes,
                    "cached_bytes": cached,
                })),
                "verdict": f.verdict.name(),
                "explanation": explain(f),
                "frames": view.frames.iter().map(super::frame_json).collect::<Vec<_>>(),
                "retry": f.retry.map(|r| json!({
                    "released_bytes": r.released_bytes,
                    "released_count": r.released_count,
                    "succeeded": r.succeeded,
                    "t_ns": r.t_ns,
                    "oversize": r.oversize,
                })),
                "is_retry_of": f.is_retry_of,
                "largest_live": f.largest_live.iter().zip(&view.largest_frames).map(|(l, frames)| {
                    let mut value = live_json(l, processes);
                    if let Value::Object(map) = &mut value {
                        map.insert("frames".into(), frames.iter().map(super::frame_json).collect::<Vec<_>>().into());
                    }
                    value
                }).collect::<Vec<_>>(),
                "live_by_stack": view.live_groups.iter().map(|g| group_json(g, f.tracked_bytes, processes)).collect::<Vec<_>>(),
            })
        }).collect::<Vec<_>>(),
    })
}

pub fn text(out: &mut dyn Write, report: &OomReport<'_>) -> io::Result<()> {
    let processes = report.processes;
    write_processes(out, processes)?;
    if report.failures.is_empty() {
        writeln!(out, "\nno failed allocations")?;
    }
    for (index, view) in report.failures.iter().enumerate() {
        let f = view.failure;
        let process = &processes[f.process as usize];
        writeln!(
            out,
            "\nfailure {}: {} of {} on {} at {} (thread {}, result {})",
            index + 1,
            process.api(f.api),
            bytes(f.request),
            device_name(f.device),
            seconds(f.t_ns),
            process.thread_name(f.thread),
            f.result
        )?;
        write_stack(out, &view.frames, report.frames, report.fold, "    ")?;
        if let Some(block) = f.block_request {
            writeln!(
                out,
                "  PyTorch's allocator gave up on a block of {} (the tensor's request)",
                bytes(block)
            )?;
        }
        if let Some((count, reserved, cached)) = f.segments {
            writeln!(
                out,
                "  PyTorch's allocator held {} ({}), {} of it cached: free inside its segments, not tensors",
                counted(count, "segment"),
                bytes(reserved),
                bytes(cached)
            )?;
        }
        if let Some((free, total)) = f.mem_info {
            let used = total.saturating_sub(free);
            let what = if f.segments.is_some() {
                format!(
                    "{} live (tensors and memory outside PyTorch's allocator) in {}, {} cached by the allocator",
                    bytes(f.tracked_bytes),
                    counted(f.tracked_count, "allocation"),
                    bytes(cached(f))
                )
            } else {
                format!(
                    "{} tracked in {}",
                    bytes(f.tracked_bytes),
                    counted(f.tracked_count, "allocation")
                )
            };
            writeln!(
                out,
                "  device: {} free of {}; {} used, of which {what} and {} untracked (context, modules, other processes)",
                bytes(free),
                bytes(total),
                bytes(used),
                bytes(
                    used.saturating_sub(f.tracked_bytes)
                        .saturating_sub(cached(f))
                )
            )?;
        } else {
            writeln!(
                out,
                "  tracked live on the device: {} in {}",
                bytes(f.tracked_bytes),
                counted(f.tracked_count, "allocation")
            )?;
        }
        writeln!(out, "  verdict: {}", explain(f))?;
        if let Some(retry) = retry_text(view) {
            writeln!(out, "  {retry}")?;
        }
        if let Some(first) = f.is_retry_of {
            writeln!(
                out,
                "  (this is the repeated request of failure {})",
                first + 1
            )?;
        }
        if !f.largest_live.is_empty() {
            writeln!(out, "  largest live allocations:")?;
            for (live, frames) in f.largest_live.iter().zip(&view.largest_frames) {
                writeln!(
                    out,
                    "    {:>11}  {} at {}  {}",
                    bytes(live.size),
                    process.api(live.api),
                    seconds(live.t_ns),
                    super::short_stack(frames, 2, report.fold)
                )?;
            }
        }
        if !view.live_groups.is_empty() {
            writeln!(out, "  live by stack:")?;
            write_groups(
                out,
                &view.live_groups,
                f.tracked_bytes,
                report.top,
                report.frames,
                report.fold,
            )?;
        }
    }
    Ok(())
}

//! `vramshim diff A B`: what changed between two recordings, stack by stack: bytes live at
//! the peak and bytes allocated over the run.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::Failure;
use crate::analysis::allocated::Allocated;
use crate::analysis::breakdown::{Breakdown, DeviceBreakdown, changes};
use crate::analysis::diff::{Diff, Measure};
use crate::analysis::groups::{Stacks, totals_by_id};
use crate::analysis::peaks::{Peak, Peaks};
use crate::commands::breakdown;
use crate::commands::common::{ByThread, SegmentsArg, Select, StacksArg, UnfoldArg, emit_streamed};
use crate::python::StackView;
use crate::render::breakdown as render_breakdown;
use crate::render::diff::{self, DiffReport, SideView};
use crate::replay::{self, Process, Stop, View};

#[derive(clap::Args)]
pub struct Args {
    /// The first recording (the baseline).
    #[arg(value_name = "A")]
    a: PathBuf,
    /// The second recording, compared with A.
    #[arg(value_name = "B")]
    b: PathBuf,
    /// Only this device ordinal (as the process numbered it; -1 = pinned host memory).
    #[arg(long, allow_hyphen_values = true)]
    device: Option<i32>,
    /// The same content as one JSON document, every stack included.
    #[arg(long)]
    json: bool,
    /// Stacks listed (text only).
    #[arg(long, default_value_t = 20)]
    top: usize,
    /// Frames printed per stack (text only).
    #[arg(long, default_value_t = 3)]
    frames: usize,
    #[command(flatten)]
    unfold: UnfoldArg,
    #[command(flatten)]
    view: StacksArg,
    // With it, rows are matched by thread name and stack: thread ids differ between runs.
    #[command(flatten)]
    threads: ByThread,
    /// Compare PyTorch's caching-allocator segments, as the driver handed them out, instead
    /// of the tensors inside them (tensors are compared when both logs hold them).
    #[command(flatten)]
    segments: SegmentsArg,
}

/// Frames of symbolised stacks kept for reuse (a few MiB): `diff` asks for each stack about
/// twice per pass (peak and allocated totals, sorting and writing), far apart with millions.
const DIFF_CACHED_FRAMES: usize = 1 << 16;

/// One recording, measured; its stacks are in the [`Diff`].
struct Measured {
    peaks: Vec<Peak>,
    allocated_bytes: u64,
    warnings: Vec<String>,
    /// Each device's breakdown, taken on the same replay (tensor view only).
    breakdown: Option<Vec<DeviceBreakdown>>,
}

/// Replays `path` and adds its stacks to `table` as `side` (0 = A, 1 = B). Only what the
/// report shows of the replay is kept: its processes (with their stack tables, which the
/// caller drops or keeps for the rows' labels) and the stacks symbolised from them. In the
/// tensor view the same replay also breaks the recording down by category (`breakdown`).
fn measure(
    path: &PathBuf,
    side: usize,
    table: &mut Diff,
    device: Option<i32>,
    view: StackView,
    by_thread: bool,
    counted: View,
) -> Result<(Measured, Vec<Process>, Stacks), Failure> {
    let logs = std::slice::from_ref(path);
    let mut peak_observer = Peaks::default();
    let mut allocated = Allocated::new(device, by_thread);
    let mut categories = (counted == View::Tensors).then(|| Breakdown::new(device));
    let replay = match categories.as_mut() {
        Some(categories) => replay::run_view(
            logs,
            &mut [&mut peak_observer, &mut allocated, categories],
            Stop::End,
            counted,
        )?,
        None => replay::run_view(
            logs,
            &mut [&mut peak_observer, &mut allocated],
            Stop::End,
            counted,
        )?,
    };
    // Only programs with Python frames get the section: its rules read Python frames.
    let python = replay.processes.iter().any(|p| !p.codes.is_empty());
    let breakdown = categories
        .filter(|_| python)
        .map(|categories| categories.finish(&replay.processes, &replay.state).1);
    let snapshots = peak_observer.snapshots(&replay.state, device);
    let peaks: Vec<Peak> = peak_observer
        .total
        .iter()
        .filter(|p| device.is_none_or(|d| d == p.device))
        .copied()
        .collect();
    drop(peak_observer);
    let mut warnings: Vec<String> = replay.device_warning(device).into_iter().collect();
    warnings.extend(replay.warnings());
    // Only the processes are needed from here on (not the live set at the end).
    let replay::Replay { processes, .. } = replay;
    let mut stacks = Stacks::new(&processes, view, by_thread).with_cache_limit(DIFF_CACHED_FRAMES);
    // Each device at its own peak, summed: the memory the run needed at most, per stack.
    let at_peaks = totals_by_id(snapshots.iter().flat_map(|s| &s.allocations), by_thread);
    drop(snapshots);
    table.add_side(side, Measure::Peak, [at_peaks], &mut stacks, &processes);
    let allocated_bytes = allocated
        .devices
        .values()
        .flat_map(|totals| totals.values())
        .map(|(bytes, _)| *bytes)
        .fold(0, u64::saturating_add);
    // Device by device: a table summed over devices would be one more of millions of ids.
    table.add_side(
        side,
        Measure::Allocated,
        allocated.devices.into_values(),
        &mut stacks,
        &processes,
    );
    warnings.extend(stacks.warnings());
    let measured = Measured {
        peaks,
        allocated_bytes,
        warnings,
        breakdown,
    };
    Ok((measured, processes, stacks))
}

/// `processes` without their stack, code and module tables.
fn without_tables(mut processes: Vec<Process>) -> Vec<Process> {
    for process in &mut processes {
        process.stacks = Default::default();
        process.python_stacks = Default::default();
        process.codes = Default::default();
        process.modules = Default::default();
    }
    processes
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let by_thread = args.threads.by_thread;
    let view = args.view.stacks;
    // Tensors only when both sides have them: tensors against segments compare nothing.
    let mut notes = Vec::new();
    let counted = if args.segments.segments {
        View::Driver
    } else {
        match (replay::has_tensors(&args.a)?, replay::has_tensors(&args.b)?) {
            (true, true) => View::Tensors,
            (false, false) => View::Driver,
            (a_has, _) => {
                notes.push(format!(
                    "only {} holds PyTorch's tensors: both logs are compared at the segment level",
                    if a_has { "A" } else { "B" }
                ));
                View::Driver
            }
        }
    };
    let mut rows = Diff::new();
    let (a, a_processes, a_stacks) =
        measure(&args.a, 0, &mut rows, args.device, view, by_thread, counted)?;
    // A's tables go before B is read: the two replays are never held at once.
    drop(a_stacks);
    let a_python = a_processes.iter().any(|p| !p.codes.is_empty());
    let a_processes = without_tables(a_processes);
    let (b, b_processes, b_stacks) =
        measure(&args.b, 1, &mut rows, args.device, view, by_thread, counted)?;
    let b_python = b_processes.iter().any(|p| !p.codes.is_empty());
    rows.keep_stacks(1, b_processes, b_stacks);
    // Rows of A only are labelled from A's stack definitions, read again.
    if rows.needs_stacks(0) {
        let replay = replay::run(std::slice::from_ref(&args.a), &mut [], Stop::End)?;
        let stacks =
            Stacks::new(&replay.processes, view, by_thread).with_cache_limit(DIFF_CACHED_FRAMES);
        rows.keep_stacks(0, replay.processes, stacks);
    }
    rows.sort();
    // What changed in a framework user's terms (`breakdown`'s categories), for programs with
    // Python frames only: taken on each side's own replay in the tensor view; compared at the
    // segment level, the categories still want the tensors, so each log is replayed once more.
    let categories = match (&a.breakdown, &b.breakdown) {
        _ if !(a_python && b_python) => None,
        (Some(a_devices), Some(b_devices)) => Some(changes(a_devices, b_devices)),
        _ => {
            let a_devices = breakdown::devices(std::slice::from_ref(&args.a), args.device)?;
            let b_devices = breakdown::devices(std::slice::from_ref(&args.b), args.device)?;
            Some(changes(&a_devices, &b_devices))
        }
    };
    let mut warnings: Vec<String> = notes;
    warnings.extend(a.warnings.iter().cloned());
    warnings.extend(b.warnings.iter().cloned());
    warnings.dedup();
    let report = DiffReport {
        a: SideView {
            processes: &a_processes,
            peaks: a.peaks.clone(),
            allocated_bytes: a.allocated_bytes,
        },
        b: SideView {
            processes: rows.kept_processes(1).unwrap_or_default(),
            peaks: b.peaks.clone(),
            allocated_bytes: b.allocated_bytes,
        },
        device: args.device,
        by_thread,
        rows: &rows,
        top: args.top,
        frames: args.frames,
        fold: args.unfold.fold(),
        categories: categories
            .as_deref()
            .map(render_breakdown::diff_json_section),
    };
    // `emit` reads only `json` from the selection.
    let select = Select {
        logs: vec![args.a.clone(), args.b.clone()],
        device: args.device,
        json: args.json,
    };
    emit_streamed(
        &select,
        &warnings,
        |out, warnings| diff::write_json(out, &report, warnings),
        |out| {
            diff::text(out, &report)?;
            match &categories {
                Some(devices) => render_breakdown::diff_text_section(out, devices),
                None => Ok(()),
            }
        },
    )
}

//! `vramshim diff A B`: what changed between two recordings, stack by stack: bytes live at
//! the peak and bytes allocated over the run.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::Failure;
use crate::analysis::allocated::Allocated;
use crate::analysis::diff::{Diff, Measure};
use crate::analysis::groups::{Stacks, totals_by_id};
use crate::analysis::peaks::{Peak, Peaks};
use crate::commands::common::{self, ByThread, Select, StacksArg, emit_streamed};
use crate::python::StackView;
use crate::render::diff::{self, DiffReport, SideView};
use crate::replay::{self, Process, Stop};

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
    view: StacksArg,
    // With it, rows are matched by thread name and stack: thread ids differ between runs.
    #[command(flatten)]
    threads: ByThread,
}

/// One recording, measured; its stacks are in the [`Diff`] and its replay is gone.
struct Measured {
    /// The replay's processes without their stack, code and module tables.
    processes: Vec<Process>,
    peaks: Vec<Peak>,
    allocated_bytes: u64,
    warnings: Vec<String>,
}

/// Replays `path` and adds its stacks to `table` as `side` (0 = A, 1 = B). Only what the
/// report shows of the replay is kept: the two replays are never held at once.
fn measure(
    path: &PathBuf,
    side: usize,
    table: &mut Diff,
    device: Option<i32>,
    view: StackView,
    by_thread: bool,
) -> Result<Measured, Failure> {
    let logs = std::slice::from_ref(path);
    let mut peaks = Peaks::default();
    let mut allocated = Allocated::new(device, by_thread);
    let replay = replay::run(logs, &mut [&mut peaks, &mut allocated], Stop::End)?;
    let snapshots = peaks.snapshots(&replay.state, device);
    let peaks: Vec<Peak> = peaks
        .total
        .iter()
        .filter(|p| device.is_none_or(|d| d == p.device))
        .copied()
        .collect();
    let mut stacks = Stacks::new(&replay.processes, view, by_thread);
    // Each device at its own peak, summed: the memory the run needed at most, per stack.
    let at_peaks = totals_by_id(snapshots.iter().flat_map(|s| &s.allocations), by_thread);
    drop(snapshots);
    table.add_side(
        side,
        Measure::Peak,
        &at_peaks,
        &mut stacks,
        &replay.processes,
    );
    drop(at_peaks);
    let allocated = allocated.summed();
    table.add_side(
        side,
        Measure::Allocated,
        &allocated,
        &mut stacks,
        &replay.processes,
    );
    let allocated_bytes = allocated
        .values()
        .map(|(bytes, _)| *bytes)
        .fold(0, u64::saturating_add);
    let warnings = common::warnings(&replay, &stacks);
    let mut processes = replay.processes;
    for process in &mut processes {
        process.stacks = Default::default();
        process.python_stacks = Default::default();
        process.codes = Default::default();
        process.modules = Default::default();
    }
    Ok(Measured {
        processes,
        peaks,
        allocated_bytes,
        warnings,
    })
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let by_thread = args.threads.by_thread;
    let mut rows = Diff::new();
    let a = measure(
        &args.a,
        0,
        &mut rows,
        args.device,
        args.view.stacks,
        by_thread,
    )?;
    let b = measure(
        &args.b,
        1,
        &mut rows,
        args.device,
        args.view.stacks,
        by_thread,
    )?;
    rows.sort();
    let mut warnings: Vec<String> = a.warnings.clone();
    warnings.extend(b.warnings.iter().cloned());
    warnings.dedup();
    let report = DiffReport {
        a: SideView {
            processes: &a.processes,
            peaks: a.peaks.clone(),
            allocated_bytes: a.allocated_bytes,
        },
        b: SideView {
            processes: &b.processes,
            peaks: b.peaks.clone(),
            allocated_bytes: b.allocated_bytes,
        },
        device: args.device,
        by_thread,
        rows,
        top: args.top,
        frames: args.frames,
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
        |out| diff::text(out, &report),
    )
}

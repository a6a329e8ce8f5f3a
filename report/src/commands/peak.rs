//! `vramshim peak LOG... [--at TIME]` and `vramshim leaks LOG...`: the exact live set at the
//! peak, at a given time, or at exit, grouped by stack.

use std::process::ExitCode;

use crate::Failure;
use crate::analysis::groups::{Stacks, by_stack, tree};
use crate::analysis::peaks::Peaks;
use crate::analysis::snapshot::Snapshot;
use crate::commands::common::{self, ByThread, Select, StacksArg, emit_streamed};
use crate::render::snapshot::{self, SnapshotReport, SnapshotView};
use crate::replay::{self, Process, Stop, View};
use crate::units;

/// How much of a snapshot the text shows.
#[derive(clap::Args)]
pub struct Shape {
    /// Stacks listed (flat view, text only).
    #[arg(long, default_value_t = 20)]
    top: usize,
    /// Frames printed per stack (text only).
    #[arg(long, default_value_t = 8)]
    frames: usize,
    /// Fold tree branches holding less than this percentage (text only).
    #[arg(long, default_value_t = 1.0)]
    min_share: f64,
}

#[derive(clap::Args)]
pub struct PeakArgs {
    #[command(flatten)]
    select: Select,
    #[command(flatten)]
    view: StacksArg,
    #[command(flatten)]
    threads: ByThread,
    /// Count PyTorch's caching-allocator segments, as the driver handed them out, instead of
    /// the tensors inside them (for logs recorded with the allocator's tracker).
    #[arg(long)]
    segments: bool,
    /// Show what was live at this time instead of at the peak (since the start: `1.5`,
    /// `1.5s`, `250ms`, `40us`, `1200ns`).
    #[arg(long, value_name = "TIME", value_parser = units::parse_time)]
    at: Option<u64>,
    #[command(flatten)]
    shape: Shape,
}

#[derive(clap::Args)]
pub struct LeaksArgs {
    #[command(flatten)]
    select: Select,
    #[command(flatten)]
    view: StacksArg,
    #[command(flatten)]
    threads: ByThread,
    /// Count PyTorch's caching-allocator segments, as the driver handed them out, instead of
    /// the tensors inside them (for logs recorded with the allocator's tracker).
    #[arg(long)]
    segments: bool,
    #[command(flatten)]
    shape: Shape,
}

pub fn peak(args: PeakArgs) -> Result<ExitCode, Failure> {
    let select = &args.select;
    let (replay, snapshots, what) = match args.at {
        Some(at) => {
            let replay = replay::run_view(
                &select.logs,
                &mut [],
                Stop::AfterTime(at),
                view(args.segments),
            )?;
            let snapshots = devices_of(&replay.state, select.device)
                .into_iter()
                .map(|device| Snapshot::of(&replay.state, Some(device), at))
                .collect();
            (replay, snapshots, "at")
        }
        None => {
            let mut peaks = Peaks::default();
            let replay = replay::run_view(
                &select.logs,
                &mut [&mut peaks],
                Stop::End,
                view(args.segments),
            )?;
            let snapshots = peaks.snapshots(&replay.state, select.device);
            (replay, snapshots, "peak")
        }
    };
    let stacks = Stacks::new(&replay.processes, args.view.stacks, args.threads.by_thread);
    render(select, &args.shape, stacks, &replay, snapshots, what)
}

pub fn leaks(args: LeaksArgs) -> Result<ExitCode, Failure> {
    let select = &args.select;
    let replay = replay::run_view(&select.logs, &mut [], Stop::End, view(args.segments))?;
    let snapshots = devices_of(&replay.state, select.device)
        .into_iter()
        .map(|device| Snapshot::of(&replay.state, Some(device), replay.end_ns))
        .collect();
    let stacks = Stacks::new(&replay.processes, args.view.stacks, args.threads.by_thread);
    render(select, &args.shape, stacks, &replay, snapshots, "leaks")
}

/// The replay's view: tensors unless `--segments`.
fn view(segments: bool) -> View {
    if segments {
        View::Driver
    } else {
        View::Tensors
    }
}

/// Devices with something live (PyTorch's cached segments included), narrowed to `only`.
fn devices_of(state: &replay::State, only: Option<i32>) -> Vec<i32> {
    let mut devices: Vec<i32> = state
        .devices()
        .iter()
        .filter(|d| {
            (d.live_count > 0 || state.segment_totals(d.device).0 > 0)
                && only.is_none_or(|o| o == d.device)
        })
        .map(|d| d.device)
        .collect();
    devices.sort_by_key(|d| crate::render::device_order(*d));
    devices
}

/// Renders `snapshots` grouped as `stacks` says (by stack, or by thread and stack).
fn render(
    select: &Select,
    shape: &Shape,
    mut stacks: Stacks,
    replay: &replay::Replay,
    snapshots: Vec<Snapshot>,
    what: &'static str,
) -> Result<ExitCode, Failure> {
    let processes: &[Process] = &replay.processes;
    let views = snapshots
        .into_iter()
        .filter(|s| !s.allocations.is_empty() || s.segments.0 > 0)
        .map(|s| {
            let groups = by_stack(&s.allocations, &mut stacks, processes);
            SnapshotView {
                device: s.device.unwrap_or_default(),
                t_ns: s.t_ns,
                bytes: s.bytes(),
                count: s.allocations.len() as u64,
                segments: s.segments,
                tree: tree(&groups),
                groups,
            }
        })
        .collect();
    let report = SnapshotReport {
        processes,
        what,
        by_thread: stacks.by_thread(),
        views,
        top: shape.top,
        frames: shape.frames,
        min_share: shape.min_share,
    };
    let warnings = common::warnings(replay, &stacks);
    emit_streamed(
        select,
        &warnings,
        |out, warnings| snapshot::write_json(out, &report, warnings),
        |out| snapshot::text(out, &report),
    )
}

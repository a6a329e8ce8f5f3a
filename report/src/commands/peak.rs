//! `vramshim peak LOG... [--at TIME]` and `vramshim leaks LOG...`: the exact live set at the
//! peak, at a given time, or at exit, grouped by stack.

use std::process::ExitCode;

use serde_json::Value;

use crate::Failure;
use crate::analysis::groups::{Stacks, by_stack, tree};
use crate::analysis::peaks::Peaks;
use crate::analysis::snapshot::Snapshot;
use crate::commands::common::{
    self, ByThread, SegmentsArg, Select, StacksArg, UnfoldArg, emit_streamed,
};
use crate::render::snapshot::{self, SnapshotReport, SnapshotView};
use crate::replay::{self, Process, Stop, View};
use crate::units;

/// How much of a snapshot the text shows.
#[derive(clap::Args)]
pub struct Shape {
    /// Stacks listed (flat view, text only).
    #[arg(long, default_value_t = DEFAULT_SHAPE.top)]
    top: usize,
    /// Frames printed per stack (text only).
    #[arg(long, default_value_t = DEFAULT_SHAPE.frames)]
    frames: usize,
    /// Fold tree branches holding less than this percentage (text only).
    #[arg(long, default_value_t = DEFAULT_SHAPE.min_share)]
    min_share: f64,
    #[command(flatten)]
    unfold: UnfoldArg,
}

#[derive(clap::Args)]
pub struct PeakArgs {
    #[command(flatten)]
    select: Select,
    #[command(flatten)]
    view: StacksArg,
    #[command(flatten)]
    threads: ByThread,
    #[command(flatten)]
    segments: SegmentsArg,
    /// Show what was live at this time instead of at the peak (since the start: `1.5`,
    /// `1.5s`, `250ms`, `40us`, `1200ns`), or at the program's first mark of that text
    /// (`mark:epoch 3`, written by `vramshim.mark`).
    #[arg(long, value_name = "TIME", value_parser = parse_at)]
    at: Option<At>,
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
    #[command(flatten)]
    segments: SegmentsArg,
    #[command(flatten)]
    shape: Shape,
}

pub fn peak(args: PeakArgs) -> Result<ExitCode, Failure> {
    let select = &args.select;
    let at = match &args.at {
        Some(At::Time(t_ns)) => Some(*t_ns),
        Some(At::Mark(text)) => Some(mark_time(select, text)?),
        None => None,
    };
    let mut late = None;
    let (replay, snapshots, what) = match at {
        Some(at) => {
            let replay = replay::run_view(
                &select.logs,
                &mut [],
                Stop::AfterTime(at),
                args.segments.view(),
            )?;
            let snapshots = devices_of(&replay.state, select.device)
                .into_iter()
                .map(|device| Snapshot::of(&replay.state, Some(device), at))
                .collect();
            if replay.complete && at > replay.end_ns {
                late = Some(format!(
                    "--at {}: past the end of the log (its last record is at {}); what was live at its end is shown",
                    units::seconds(at),
                    units::seconds(replay.end_ns),
                ));
            }
            (replay, snapshots, "at")
        }
        None => {
            let (replay, snapshots) = at_peaks(select, args.segments.view())?;
            (replay, snapshots, "peak")
        }
    };
    let stacks = Stacks::new(&replay.processes, args.view.stacks, args.threads.by_thread);
    let shown = Shown { what, late };
    render(select, &args.shape, stacks, &replay, snapshots, shown)
}

/// Which moment a snapshot view shows, and a warning about it.
struct Shown {
    /// "peak", "at" or "leaks".
    what: &'static str,
    /// `--at` past the end of the log.
    late: Option<String>,
}

pub fn leaks(args: LeaksArgs) -> Result<ExitCode, Failure> {
    let select = &args.select;
    let (replay, snapshots) = at_end(select, args.segments.view())?;
    let stacks = Stacks::new(&replay.processes, args.view.stacks, args.threads.by_thread);
    let shown = Shown {
        what: "leaks",
        late: None,
    };
    render(select, &args.shape, stacks, &replay, snapshots, shown)
}

/// A moment given to `--at`.
#[derive(Clone, Debug)]
pub enum At {
    /// Nanoseconds since the start.
    Time(u64),
    /// The first mark with this text.
    Mark(String),
}

fn parse_at(text: &str) -> Result<At, String> {
    match text.strip_prefix("mark:") {
        Some(mark) => Ok(At::Mark(mark.to_string())),
        None => units::parse_time(text).map(At::Time),
    }
}

/// The time of the first mark whose text is `text` in `select`'s logs (a replay of its own:
/// marks are known only once read).
fn mark_time(select: &Select, text: &str) -> Result<u64, Failure> {
    let replay = replay::run(&select.logs, &mut [], Stop::End)?;
    let mut marks: Vec<(u64, &str)> = replay
        .processes
        .iter()
        .flat_map(|p| {
            p.marks
                .iter()
                .map(move |m| (p.start_offset_ns.saturating_add(m.t_ns), m.text.as_str()))
        })
        .collect();
    marks.sort();
    if let Some((t_ns, _)) = marks.iter().find(|(_, mark)| *mark == text) {
        return Ok(*t_ns);
    }
    let mut known: Vec<String> = marks.iter().map(|(_, mark)| format!("{mark:?}")).collect();
    known.dedup();
    Err(Failure::input(if known.is_empty() {
        format!("--at mark:{text}: the log has no marks (vramshim.mark writes them)")
    } else {
        format!(
            "--at mark:{text}: no such mark; the log's marks: {}",
            known.join(", ")
        )
    }))
}

/// The JSON document of `vramshim peak --json` (`leaks` false) or `vramshim leaks --json`
/// (`leaks` true) for `select`'s logs, stacks shown as `view` says.
pub fn json_document(select: &Select, view: StacksArg, leaks: bool) -> Result<Value, Failure> {
    let (replay, snapshots) = if leaks {
        at_end(select, View::Tensors)?
    } else {
        at_peaks(select, View::Tensors)?
    };
    let what = if leaks { "leaks" } else { "peak" };
    let stacks = Stacks::new(&replay.processes, view.stacks, false);
    let mut document = Vec::new();
    let shown = Shown { what, late: None };
    with_report(
        &DEFAULT_SHAPE,
        select.device,
        stacks,
        &replay,
        snapshots,
        shown,
        |report, warnings| snapshot::write_json(&mut document, report, &warnings),
    )
    .and_then(|()| serde_json::from_slice(&document).map_err(std::io::Error::from))
    .map_err(|err| Failure {
        message: format!("cannot build the {what} view: {err}"),
        code: 1,
    })
}

/// The text limits when no option changes them (they do not shape the JSON).
const DEFAULT_SHAPE: Shape = Shape {
    top: 20,
    frames: 8,
    min_share: 1.0,
    unfold: UnfoldArg { unfold: false },
};

/// The replay of `select`'s logs in `view` and the live set at each device's peak.
fn at_peaks(select: &Select, view: View) -> Result<(replay::Replay, Vec<Snapshot>), Failure> {
    let mut peaks = Peaks::default();
    let replay = replay::run_view(&select.logs, &mut [&mut peaks], Stop::End, view)?;
    let snapshots = peaks.snapshots(&replay.state, select.device);
    Ok((replay, snapshots))
}

/// The replay of `select`'s logs in `view` and what was still live on each device at its end.
fn at_end(select: &Select, view: View) -> Result<(replay::Replay, Vec<Snapshot>), Failure> {
    let replay = replay::run_view(&select.logs, &mut [], Stop::End, view)?;
    let snapshots = devices_of(&replay.state, select.device)
        .into_iter()
        .map(|device| Snapshot::of(&replay.state, Some(device), replay.end_ns))
        .collect();
    Ok((replay, snapshots))
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
    stacks: Stacks,
    replay: &replay::Replay,
    snapshots: Vec<Snapshot>,
    shown: Shown,
) -> Result<ExitCode, Failure> {
    with_report(
        shape,
        select.device,
        stacks,
        replay,
        snapshots,
        shown,
        |report, warnings| {
            emit_streamed(
                select,
                &warnings,
                |out, warnings| snapshot::write_json(out, report, warnings),
                |out| snapshot::text(out, report),
            )
        },
    )
}

/// Groups `snapshots` as `stacks` says and hands the report, with the warnings, to `then`.
fn with_report<T>(
    shape: &Shape,
    device: Option<i32>,
    mut stacks: Stacks,
    replay: &replay::Replay,
    snapshots: Vec<Snapshot>,
    shown: Shown,
    then: impl FnOnce(&SnapshotReport<'_>, Vec<String>) -> T,
) -> T {
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
        what: shown.what,
        by_thread: stacks.by_thread(),
        views,
        top: shape.top,
        frames: shape.frames,
        min_share: shape.min_share,
        fold: shape.unfold.fold(),
    };
    let mut warnings = common::warnings(replay, device, &stacks);
    warnings.extend(shown.late);
    then(&report, warnings)
}

//! `vramshim breakdown LOG...`: what fills each device at its peak and over time, in a
//! framework user's terms (parameters, gradients, optimizer state, activations, ...).

use std::path::PathBuf;
use std::process::ExitCode;

use crate::Failure;
use crate::analysis::breakdown::{Breakdown, Category, DeviceBreakdown};
use crate::analysis::groups::{IdTotals, Stacks, add_total, by_stack_totals};
use crate::analysis::peaks::Peaks;
use crate::commands::common::{self, Select, StacksArg, UnfoldArg, emit};
use crate::render::breakdown::{self, BreakdownReport, DeviceView};
use crate::replay::{self, Stop, View};

/// Stacks listed per category (text only), unless `--top` says otherwise.
const DEFAULT_TOP: usize = 3;
/// Frames printed per stack (text only), unless `--frames` says otherwise.
const DEFAULT_FRAMES: usize = 4;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    select: Select,
    #[command(flatten)]
    view: StacksArg,
    /// Stacks listed per category (text only).
    #[arg(long, default_value_t = DEFAULT_TOP)]
    top: usize,
    /// Frames printed per stack (text only).
    #[arg(long, default_value_t = DEFAULT_FRAMES)]
    frames: usize,
    #[command(flatten)]
    unfold: UnfoldArg,
}

/// Each device's breakdown (no stacks): for `report` and `advise`.
pub fn devices(logs: &[PathBuf], device: Option<i32>) -> Result<Vec<DeviceBreakdown>, Failure> {
    let mut observer = Breakdown::new(device);
    let replay = replay::run_view(logs, &mut [&mut observer], Stop::End, View::Tensors)?;
    Ok(observer.finish(&replay.processes, &replay.state).1)
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let select = &args.select;
    // One replay: categories by lifetime, bytes per category over time and at each peak, and
    // the peak's live set.
    let mut observer = Breakdown::new(select.device);
    let mut peaks = Peaks::default();
    let replay = replay::run_view(
        &select.logs,
        &mut [&mut observer, &mut peaks],
        Stop::End,
        View::Tensors,
    )?;
    let (categories, breakdowns) = observer.finish(&replay.processes, &replay.state);
    let processes = &replay.processes;
    let mut stacks = Stacks::new(processes, args.view.stacks, false);
    let snapshots = peaks.snapshots(&replay.state, select.device);
    let devices = breakdowns
        .iter()
        .map(|device| {
            let mut totals: Vec<IdTotals> =
                Category::ALL.iter().map(|_| IdTotals::default()).collect();
            if let Some(snapshot) = snapshots.iter().find(|s| s.device == Some(device.device)) {
                for live in &snapshot.allocations {
                    add_total(&mut totals[categories.of(live.seq) as usize], live, false);
                }
            }
            DeviceView {
                breakdown: device,
                stacks: totals
                    .iter()
                    .map(|totals| by_stack_totals(totals, &mut stacks, processes))
                    .collect(),
            }
        })
        .collect();
    let report = BreakdownReport {
        processes,
        devices,
        top: args.top,
        frames: args.frames,
        fold: args.unfold.fold(),
    };
    let warnings = common::warnings(&replay, select.device, &stacks);
    emit(
        select,
        &warnings,
        || breakdown::json(&report),
        |out| breakdown::text(out, &report),
    )
}

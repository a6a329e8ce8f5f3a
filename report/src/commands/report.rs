//! `vramshim report LOG...` (also `summary`): the overview.

use std::process::ExitCode;

use crate::Failure;
use crate::analysis::groups::{Stacks, by_stack};
use crate::analysis::peaks::Peaks;
use crate::analysis::summary::Summary;
use crate::commands::{
    self,
    common::{self, ByThread, SegmentsArg, Select, StacksArg, UnfoldArg, emit},
};
use crate::render::breakdown;
use crate::render::summary::{self, DeviceSummary, SummaryReport};
use crate::replay::{self, Stop};
use vramshim_format::EventKind;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    select: Select,
    #[command(flatten)]
    view: StacksArg,
    #[command(flatten)]
    threads: ByThread,
    #[command(flatten)]
    segments: SegmentsArg,
    #[command(flatten)]
    unfold: UnfoldArg,
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let select = &args.select;
    with_report(
        select,
        args.view,
        args.threads,
        args.segments,
        |report, warnings| {
            // What fills each device, in a framework user's terms (`vramshim breakdown` has the
            // stacks): for programs with Python frames only, as it replays the logs twice more.
            let categories = if report.processes.iter().any(|p| !p.codes.is_empty()) {
                commands::breakdown::devices(&select.logs, select.device)?
            } else {
                Vec::new()
            };
            emit(
                select,
                &warnings,
                || {
                    let mut value = summary::json(report);
                    value["breakdown"] = breakdown::json_section(&categories);
                    value
                },
                |out| {
                    summary::text(out, report, args.unfold.fold())?;
                    breakdown::text_section(out, &categories)
                },
            )
        },
    )?
}

/// Builds the overview of `select`'s logs and hands it, with the warnings, to `then` (the
/// report borrows the replay, so it cannot be returned).
pub fn with_report<T>(
    select: &Select,
    view: StacksArg,
    threads: ByThread,
    segments: SegmentsArg,
    then: impl FnOnce(&SummaryReport<'_>, Vec<String>) -> T,
) -> Result<T, Failure> {
    // One pass: counts, samples, peaks and the exact live set at each peak.
    let mut peaks = Peaks::default();
    let mut counts = Summary::new(select.logs.len(), select.device);
    let replay = replay::run_view_with(
        &select.logs,
        &mut (&mut peaks, &mut counts),
        Stop::End,
        segments.view(),
    )?;
    let wanted: Vec<_> = peaks
        .total
        .iter()
        .filter(|peak| select.device.is_none_or(|d| d == peak.device))
        .copied()
        .collect();
    let at_peaks = peaks.snapshots(&replay.state, select.device);
    let processes = &replay.processes;
    let mut stacks = Stacks::new(processes, view.stacks, threads.by_thread);
    let devices = wanted
        .iter()
        .map(|peak| {
            let snapshot = at_peaks.iter().find(|s| s.device == Some(peak.device));
            let graph_pool_at_peak = snapshot.map_or(0, |s| {
                s.allocations
                    .iter()
                    .filter(|live| live.kind == EventKind::GraphPool)
                    .map(|live| live.size)
                    .sum()
            });
            let peak_groups = snapshot.map_or_else(Vec::new, |s| {
                by_stack(&s.allocations, &mut stacks, processes)
            });
            let exit = replay
                .state
                .devices()
                .iter()
                .find(|d| d.device == peak.device)
                .copied()
                .unwrap_or_default();
            // The pool is the driver's until a trim: what it still held at the end.
            let graph_pool_at_exit = replay
                .state
                .live()
                .filter(|live| live.kind == EventKind::GraphPool && live.device == peak.device)
                .map(|live| live.size)
                .sum();
            DeviceSummary {
                device: peak.device,
                graph_pool_at_exit,
                peak: *peak,
                reserved: peaks.reserved(peak.device),
                exit_segments: replay.state.segment_totals(peak.device),
                peak_groups,
                graph_pool_at_peak,
                exit_bytes: exit.live_bytes,
                exit_count: exit.live_count,
                failures: counts
                    .failures
                    .iter()
                    .find(|(d, _)| *d == peak.device)
                    .map_or(0, |(_, n)| *n),
                samples: counts
                    .samples
                    .iter()
                    .filter(|s| s.device == peak.device)
                    .copied()
                    .collect(),
                per_process: peaks
                    .per_process
                    .iter()
                    .filter(|(_, p)| p.device == peak.device)
                    .copied()
                    .collect(),
            }
        })
        .collect();
    let largest = counts
        .largest()
        .into_iter()
        .map(|live| (live, stacks.frames(processes, live.process, live.stack)))
        .collect();
    let report = SummaryReport {
        processes,
        duration_ns: replay.end_ns,
        devices,
        families: counts.families.clone(),
        total_families: counts.total_families(),
        largest,
    };
    let warnings = common::warnings(&replay, select.device, &stacks);
    Ok(then(&report, warnings))
}

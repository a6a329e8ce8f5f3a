//! `vramshim oom LOG...`: post-mortem of every failed allocation.

use std::process::ExitCode;

use crate::Failure;
use crate::analysis::groups::{Stacks, by_stack_totals};
use crate::analysis::oom::Oom;
use crate::commands::common::{self, ByThread, SegmentsArg, Select, StacksArg, UnfoldArg, emit};
use crate::render::frames::Fold;
use crate::render::oom::{self, FailureView, OomReport};
use crate::replay::{self, Stop};

/// Live stacks listed per failure in text, unless `--top` says otherwise.
const DEFAULT_TOP: usize = 5;
/// Frames printed per stack in text, unless `--frames` says otherwise.
const DEFAULT_FRAMES: usize = 6;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    select: Select,
    #[command(flatten)]
    view: StacksArg,
    #[command(flatten)]
    threads: ByThread,
    /// Live stacks listed per failure (text only).
    #[arg(long, default_value_t = DEFAULT_TOP)]
    top: usize,
    /// Frames printed per stack (text only).
    #[arg(long, default_value_t = DEFAULT_FRAMES)]
    frames: usize,
    #[command(flatten)]
    unfold: UnfoldArg,
    #[command(flatten)]
    segments: SegmentsArg,
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let select = &args.select;
    with_report(
        select,
        args.view,
        args.threads,
        args.segments,
        |mut report, warnings| {
            report.top = args.top;
            report.frames = args.frames;
            report.fold = args.unfold.fold();
            emit(
                select,
                &warnings,
                || oom::json(&report),
                |out| oom::text(out, &report),
            )
        },
    )?
}

/// Builds the post-mortem of every failed allocation in `select`'s logs and hands it, with
/// the warnings, to `then` (text limits at their defaults: set them in `then`).
pub fn with_report<T>(
    select: &Select,
    view: StacksArg,
    threads: ByThread,
    segments: SegmentsArg,
    then: impl FnOnce(OomReport<'_>, Vec<String>) -> T,
) -> Result<T, Failure> {
    let by_thread = threads.by_thread;
    let mut analysis = Oom::new(select.device, by_thread);
    let replay = replay::run_view(
        &select.logs,
        &mut [&mut analysis],
        Stop::End,
        segments.view(),
    )?;
    let processes = &replay.processes;
    let mut stacks = Stacks::new(processes, view.stacks, by_thread);
    let failures = analysis
        .failures
        .iter()
        .map(|failure| FailureView {
            failure,
            frames: stacks.frames(processes, failure.process, failure.stack),
            largest_frames: failure
                .largest_live
                .iter()
                .map(|live| stacks.frames(processes, live.process, live.stack))
                .collect(),
            live_groups: failure.live_by_id.as_ref().map_or_else(Vec::new, |totals| {
                by_stack_totals(totals, &mut stacks, processes)
            }),
        })
        .collect();
    let report = OomReport {
        processes,
        failures,
        top: DEFAULT_TOP,
        frames: DEFAULT_FRAMES,
        fold: Fold::default(),
    };
    let warnings = common::warnings(&replay, select.device, &stacks);
    Ok(then(report, warnings))
}

//! `vramshim oom LOG...`: post-mortem of every failed allocation.

use std::process::ExitCode;

use crate::Failure;
use crate::analysis::groups::{Stacks, by_stack_totals};
use crate::analysis::oom::Oom;
use crate::commands::common::{self, ByThread, Select, StacksArg, emit};
use crate::render::oom::{self, FailureView, OomReport};
use crate::replay::{self, Stop};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    select: Select,
    #[command(flatten)]
    view: StacksArg,
    #[command(flatten)]
    threads: ByThread,
    /// Live stacks listed per failure (text only).
    #[arg(long, default_value_t = 5)]
    top: usize,
    /// Frames printed per stack (text only).
    #[arg(long, default_value_t = 6)]
    frames: usize,
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let select = &args.select;
    let by_thread = args.threads.by_thread;
    let mut analysis = Oom::new(select.device, by_thread);
    let replay = replay::run(&select.logs, &mut [&mut analysis], Stop::End)?;
    let processes = &replay.processes;
    let mut stacks = Stacks::new(processes, args.view.stacks, by_thread);
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
        top: args.top,
        frames: args.frames,
    };
    let warnings = common::warnings(&replay, &stacks);
    emit(
        select,
        &warnings,
        || oom::json(&report),
        |out| oom::text(out, &report),
    )
}

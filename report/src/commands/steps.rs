//! `vramshim steps LOG...`: training iterations, memory per step, and growth across steps
//! charged to the training loop's lines that never free what they allocate.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::Failure;
use crate::analysis::steps::{ProcessSteps, Steps};
use crate::commands::common::{Select, emit};
use crate::render::steps::{self, StepsReport};
use crate::replay::{self, Stop, View};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    select: Select,
}

/// Each process's steps in `logs` (tensor view), on `device` or every device, with the
/// process's id.
pub fn find(logs: &[PathBuf], device: Option<i32>) -> Result<Vec<(u32, ProcessSteps)>, Failure> {
    let (replay, found) = replayed(logs, device)?;
    let processes = &replay.processes;
    Ok(found
        .into_iter()
        .map(|steps| {
            let pid = processes
                .get(steps.process as usize)
                .map_or(0, |p| p.header.pid);
            (pid, steps)
        })
        .collect())
}

/// Steps by the optimizer; then, for processes without one, a second replay split at their
/// most repeated model call. Processes in order.
fn replayed(
    logs: &[PathBuf],
    device: Option<i32>,
) -> Result<(replay::Replay, Vec<ProcessSteps>), Failure> {
    let mut analysis = Steps::new(device);
    let replay = replay::run_view(logs, &mut [&mut analysis], Stop::End, View::Tensors)?;
    let split = analysis.call_split();
    let mut found = analysis.finish(&replay.processes);
    if split.is_empty() {
        return Ok((replay, found));
    }
    drop(replay);
    let mut by_calls = Steps::by_calls(device, split);
    let replay = replay::run_view(logs, &mut [&mut by_calls], Stop::End, View::Tensors)?;
    let split_found = by_calls.finish(&replay.processes);
    found.retain(|steps| split_found.iter().all(|s| s.process != steps.process));
    found.extend(split_found.into_iter().filter(|s| s.by_call.is_some()));
    found.sort_by_key(|steps| steps.process);
    Ok((replay, found))
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let select = &args.select;
    let (replay, found) = replayed(&select.logs, select.device)?;
    let processes = &replay.processes;
    let report = StepsReport {
        processes,
        steps: &found,
    };
    let warnings = replay.warnings();
    emit(
        select,
        &warnings,
        || steps::json(&report),
        |out| steps::text(out, &report),
    )
}

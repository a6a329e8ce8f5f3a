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
    let mut analysis = Steps::new(device);
    let replay = replay::run_view(logs, &mut [&mut analysis], Stop::End, View::Tensors)?;
    let processes = &replay.processes;
    Ok(analysis
        .finish(processes)
        .into_iter()
        .map(|steps| {
            let pid = processes
                .get(steps.process as usize)
                .map_or(0, |p| p.header.pid);
            (pid, steps)
        })
        .collect())
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let select = &args.select;
    let mut analysis = Steps::new(select.device);
    let replay = replay::run_view(&select.logs, &mut [&mut analysis], Stop::End, View::Tensors)?;
    let processes = &replay.processes;
    let found = analysis.finish(processes);
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

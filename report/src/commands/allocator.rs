//! `vramshim allocator LOG...`: the caching-allocator view of any recording.

use std::process::ExitCode;

use crate::Failure;
use crate::analysis::allocator::AllocatorView;
use crate::analysis::oom::Oom;
use crate::commands::common::{Select, emit};
use crate::render::allocator::{self, AllocatorReport, RetryView};
use crate::replay::{self, Stop};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    select: Select,
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let select = &args.select;
    with_report(select, |report, warnings| {
        emit(
            select,
            &warnings,
            || allocator::json(report),
            |out| allocator::text(out, report),
        )
    })?
}

/// Builds the allocator view of `select`'s logs and hands it, with the warnings, to `then`.
pub fn with_report<T>(
    select: &Select,
    then: impl FnOnce(&AllocatorReport<'_>, Vec<String>) -> T,
) -> Result<T, Failure> {
    let mut view = AllocatorView::new(select.device);
    let mut oom = Oom::new(select.device, false);
    let replay = replay::run(&select.logs, &mut [&mut view, &mut oom], Stop::End)?;
    view.finish();
    // Every release-and-ask-again; PyTorch counts in num_alloc_retries all but
    // max_split_size_mb's first step (the failure after it has the counted retry).
    let (oversize_releases, retries) = oom
        .failures
        .iter()
        .filter(|f| f.device >= 0)
        .filter_map(|f| {
            f.retry.map(|retry| RetryView {
                process: f.process,
                device: f.device,
                t_ns: f.t_ns,
                request: f.request,
                retry,
            })
        })
        .partition(|r| r.retry.oversize);
    let failures: Vec<(i32, u64)> = view
        .devices
        .iter()
        .map(|d| {
            let n = oom.failures.iter().filter(|f| f.device == d.device).count() as u64;
            (d.device, n)
        })
        .collect();
    let report = AllocatorReport {
        processes: &replay.processes,
        duration_ns: replay.end_ns,
        view: &view,
        retries,
        oversize_releases,
        failures,
    };
    let mut warnings: Vec<String> = replay.device_warning(select.device).into_iter().collect();
    warnings.extend(replay.warnings());
    Ok(then(&report, warnings))
}

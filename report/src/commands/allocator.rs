//! `vramshim allocator LOG...`: the caching-allocator view of any recording.

use std::process::ExitCode;

use crate::Failure;
use crate::analysis::allocator::AllocatorView;
use crate::analysis::oom::{Oom, Retry, Verdict};
use crate::analysis::releases::{ReleaseKind, Releases};
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
    let mut releases = Releases::new(select.device);
    let replay = replay::run(
        &select.logs,
        &mut [&mut view, &mut oom, &mut releases],
        Stop::End,
    )?;
    view.finish();
    // Every release-and-ask-again; PyTorch counts in num_alloc_retries all but
    // max_split_size_mb's first step (the failure after it has the counted retry).
    let (mut oversize_releases, mut retries): (Vec<RetryView>, Vec<RetryView>) = oom
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
                past_fraction: f.verdict == Verdict::AllocatorLimit,
            })
        })
        .partition(|r| r.retry.oversize);
    // The releases no failed call marks (past a memory fraction), told by their stacks.
    let mut gc_releases = Vec::new();
    for release in releases.list.iter().filter(|r| r.device >= 0) {
        let found = RetryView {
            process: release.process,
            device: release.device,
            t_ns: release.t_ns,
            request: release.request,
            retry: Retry {
                released_bytes: release.released_bytes,
                released_count: release.released_count,
                succeeded: release.succeeded,
                t_ns: release.end_t_ns,
                oversize: release.kind == ReleaseKind::Oversize,
            },
            past_fraction: true,
        };
        match release.kind {
            ReleaseKind::Retry => retries.push(found),
            ReleaseKind::Oversize => oversize_releases.push(found),
            ReleaseKind::GarbageCollection => gc_releases.push(found),
            ReleaseKind::Other => {}
        }
    }
    retries.sort_by_key(|r| r.t_ns);
    oversize_releases.sort_by_key(|r| r.t_ns);
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
        gc_releases,
        failures,
    };
    let mut warnings: Vec<String> = replay.device_warning(select.device).into_iter().collect();
    warnings.extend(replay.warnings());
    Ok(then(&report, warnings))
}

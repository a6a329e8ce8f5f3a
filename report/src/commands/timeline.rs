//! `vramshim timeline LOG... [--svg FILE] [--by-thread]`: live bytes over time per device (and
//! per allocating thread), as a terminal chart, JSON or an SVG picture.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::Failure;
use crate::analysis::timeline::{DEFAULT_THREAD_SERIES, Timeline};
use crate::commands::common::{SegmentsArg, Select, emit, write_file, write_stdout};
use crate::render::timeline::{self, TimelineReport};
use crate::replay::{self, Stop};

/// Chart width when `$COLUMNS` is unset or not a number.
const DEFAULT_COLUMNS: usize = 100;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    select: Select,
    /// Also draw the charts as an SVG picture into FILE (`-`: the SVG on stdout, instead of
    /// the terminal chart).
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Also a series per allocating thread under each device's: the live bytes of the
    /// allocations that thread made (a free counts against the thread that allocated,
    /// whichever thread frees), named `thread NAME (tid N, pid P)`; JSON: each device's
    /// `threads`.
    #[arg(long)]
    by_thread: bool,
    /// With --by-thread: series for the N threads with the highest peak on each device; the
    /// others are summed into one "other threads" series.
    #[arg(
        long,
        value_name = "N",
        requires = "by_thread",
        default_value_t = DEFAULT_THREAD_SERIES as u16,
        value_parser = clap::value_parser!(u16).range(1..=256)
    )]
    top_threads: u16,
    /// Count PyTorch's caching-allocator segments as the live bytes, as the driver handed
    /// them out, with no separate reserved series (for logs recorded with the allocator's
    /// tracker; by default the live bytes are its tensors and the segments are the
    /// reserved series).
    #[command(flatten)]
    segments: SegmentsArg,
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let select = &args.select;
    let top_threads = args.by_thread.then_some(usize::from(args.top_threads));
    with_report(select, top_threads, args.segments, |report, warnings| {
        if let Some(path) = &args.svg {
            let picture = timeline::svg(report);
            if path.as_os_str() == "-" {
                for warning in &warnings {
                    eprintln!("vramshim: warning: {warning}");
                }
                return write_stdout(picture.as_bytes());
            }
            write_file(path, picture.as_bytes())?;
        }
        let columns = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.trim().parse::<usize>().ok())
            .filter(|c| *c > 0)
            .unwrap_or(DEFAULT_COLUMNS);
        emit(
            select,
            &warnings,
            || timeline::json(report),
            |out| timeline::text(out, report, columns),
        )
    })?
}

/// Builds the timelines of `select`'s logs (with a series per thread for the `top_threads`
/// busiest threads of each device when given) and hands them, with the warnings, to `then`.
pub fn with_report<T>(
    select: &Select,
    top_threads: Option<usize>,
    segments: SegmentsArg,
    then: impl FnOnce(&TimelineReport<'_>, Vec<String>) -> T,
) -> Result<T, Failure> {
    let mut analysis = match top_threads {
        Some(top_threads) => Timeline::by_thread(select.device, top_threads, None),
        None => Timeline::new(select.device),
    };
    let mut replay = replay::run_view(
        &select.logs,
        &mut [&mut analysis],
        Stop::End,
        segments.view(),
    )?;
    // More allocating threads on a device than series: now that their peaks are known, a
    // second replay draws the chosen ones.
    if let Some(top_threads) = top_threads
        && let Some(chosen) = analysis.second_pass()
    {
        drop(replay);
        analysis = Timeline::by_thread(select.device, top_threads, Some(chosen));
        replay = replay::run_view(
            &select.logs,
            &mut [&mut analysis],
            Stop::End,
            segments.view(),
        )?;
    }
    analysis.finish();
    let report = TimelineReport {
        processes: &replay.processes,
        timeline: &analysis,
        end_ns: replay.end_ns,
    };
    let mut warnings: Vec<String> = replay.device_warning(select.device).into_iter().collect();
    warnings.extend(replay.warnings());
    Ok(then(&report, warnings))
}

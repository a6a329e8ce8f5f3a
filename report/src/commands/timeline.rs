//! `vramshim timeline LOG... [--svg FILE]`: live bytes over time per device, as a terminal
//! chart, JSON or an SVG picture.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::Failure;
use crate::analysis::timeline::Timeline;
use crate::commands::common::{Select, emit};
use crate::commands::flamegraph::write_file;
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
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let select = &args.select;
    let mut analysis = Timeline::new(select.device);
    let replay = replay::run(&select.logs, &mut [&mut analysis], Stop::End)?;
    let report = TimelineReport {
        processes: &replay.processes,
        timeline: &analysis,
        end_ns: replay.end_ns,
    };
    let warnings = replay.warnings();
    if let Some(path) = &args.svg {
        let picture = timeline::svg(&report);
        if path.as_os_str() == "-" {
            for warning in &warnings {
                eprintln!("vramshim: warning: {warning}");
            }
            let mut stdout = std::io::stdout().lock();
            return match stdout
                .write_all(picture.as_bytes())
                .and_then(|()| stdout.flush())
            {
                Ok(()) => Ok(ExitCode::SUCCESS),
                Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
                Err(err) => Err(Failure {
                    message: format!("cannot write output: {err}"),
                    code: 1,
                }),
            };
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
        || timeline::json(&report),
        |out| timeline::text(out, &report, columns),
    )
}

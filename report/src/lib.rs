//! `vramshim`: runs programs under the recorder and reads what it recorded. The commands live
//! in the library (so that fuzz targets can drive them, `fuzz/`); [`run`] is the whole CLI.

mod analysis;
mod commands;
mod debug_prefix;
mod gpus;
mod logfile;
mod progress;
mod python;
mod render;
mod replay;
mod symbols;
mod units;

use std::process::ExitCode;

use std::ffi::OsString;

use clap::{Parser, Subcommand};

/// GPU memory flight recorder: record every CUDA allocation of a program, then ask questions.
#[derive(Parser)]
#[command(name = "vramshim", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a program under the recorder (LD_PRELOAD=libvramshim.so) and name the logs written.
    Run(commands::run::Args),
    /// Run a program on simulated GPUs (fake NVIDIA libraries, memory is exact bookkeeping of
    /// the chosen card) under the recorder, and say whether it fits.
    Dryrun(commands::dryrun::Args),
    /// Overview: peak per device and what held it, live at exit, calls by API family,
    /// largest allocations, device memory no hook sees.
    #[command(visible_alias = "summary")]
    Report(commands::report::Args),
    /// The exact set of allocations live at each device's peak (or `--at` a time), by stack.
    Peak(commands::peak::PeakArgs),
    /// Allocations still live when the process ended, by stack.
    Leaks(commands::peak::LeaksArgs),
    /// Post-mortem of each failed allocation: request, free memory, live set, verdict, retries.
    Oom(commands::oom::Args),
    /// What fills each device at its peak and over time, in a framework user's terms:
    /// parameters, gradients, optimizer state, activations, temporaries, workspaces (by
    /// library), communication, other, the allocator's cache and the context (from a
    /// tensor-level recording), with the top stacks of each.
    Breakdown(commands::breakdown::Args),
    /// The program's own source lines that allocated, beside their text: bytes allocated,
    /// count, net live change, bytes live at the peak.
    Lines(commands::lines::Args),
    /// Training steps (where the optimizer's step ends): peak and live bytes per step, and
    /// growth across steps with the training loop's lines that never free.
    Steps(commands::steps::Args),
    /// Ranked suggestions, each with its evidence and the bytes it would free: checkpointing,
    /// optimizer state, allocator settings, leaks, evaluation without no_grad, autocast.
    Advise(commands::advise::Args),
    /// Live bytes over time per device, with used memory, the peak and failures: a terminal
    /// chart, JSON, or an SVG picture.
    Timeline(commands::timeline::Args),
    /// A flame graph weighted by bytes: live at the peak, leaks, all allocations or at an OOM.
    Flamegraph(commands::flamegraph::Args),
    /// One self-contained HTML page (opens offline): the overview, a zoomable timeline per
    /// device, flame graphs of the peak, the leaks and each OOM, the OOM verdicts, the
    /// allocator view and the whatif table.
    Html(commands::html::Args),
    /// Per-stack changes of peak and allocated bytes between two recordings, growth first.
    Diff(commands::diff::Args),
    /// The caching-allocator view: which allocator the log looks like, reserved bytes over
    /// time, segment sizes, cudaMalloc/cudaFree, empty_cache() bursts, OOM retries, memory
    /// outside any allocator.
    Allocator(commands::allocator::Args),
    /// Simulate PyTorch's caching allocator under several PYTORCH_CUDA_ALLOC_CONF settings on a
    /// tensor-level recording (backend:cudaMallocAsync or PYTORCH_NO_CUDA_MEMORY_CACHING=1),
    /// ranked by peak reserved memory.
    Whatif(commands::whatif::Args),
    /// Export the recording to other tools' formats: `--pytorch-snapshot` (PyTorch's memory
    /// viewer), `--pprof FILE`, `--speedscope FILE`, `--chrome-trace FILE` (Perfetto),
    /// `--parquet FILE` (DuckDB, pandas).
    Export(commands::export::Args),
    /// Print every record of a log, as text or as JSON lines.
    Dump(commands::dump::Args),
    /// Rewrite logs with their records compressed (`vramshim run` does it after the program
    /// exits): checked record by record before the log is replaced; a damaged log or one a
    /// process still writes is left as it is.
    Compact(commands::compact::Args),
}

/// An error that ends the command: a one-line message and an exit code.
pub struct Failure {
    pub message: String,
    pub code: u8,
}

impl Failure {
    /// Bad input (not a log, unreadable file, bad arguments): exit code 2.
    pub fn input(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code: 2,
        }
    }
}

/// Runs the command line `args` (the program name first) as `vramshim` does: parses it (a
/// bad one prints clap's message and exits the process, as a command line should), runs the
/// command, prints a failure's message; returns the exit code.
pub fn run<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(error) => {
            // `vramshim run python train.py`: the program belongs after `--`.
            let launcher = args
                .get(1)
                .and_then(|a| a.to_str())
                .filter(|a| *a == "run" || *a == "dryrun");
            if let Some(launcher) = launcher
                && error.kind() == clap::error::ErrorKind::UnknownArgument
                && !args.iter().any(|a| a == "--")
            {
                let _ = error.print();
                eprintln!(
                    "tip: put the program after `--`: vramshim {launcher} [OPTIONS] -- PROGRAM [ARGS...]"
                );
                return ExitCode::from(2);
            }
            error.exit()
        }
    };
    let result = match cli.command {
        Command::Run(args) => commands::run::run(args),
        Command::Dryrun(args) => commands::dryrun::run(args),
        Command::Report(args) => commands::report::run(args),
        Command::Peak(args) => commands::peak::peak(args),
        Command::Leaks(args) => commands::peak::leaks(args),
        Command::Oom(args) => commands::oom::run(args),
        Command::Breakdown(args) => commands::breakdown::run(args),
        Command::Lines(args) => commands::lines::run(args),
        Command::Steps(args) => commands::steps::run(args),
        Command::Advise(args) => commands::advise::run(args),
        Command::Timeline(args) => commands::timeline::run(args),
        Command::Flamegraph(args) => commands::flamegraph::run(args),
        Command::Diff(args) => commands::diff::run(args),
        Command::Html(args) => commands::html::run(args),
        Command::Allocator(args) => commands::allocator::run(args),
        Command::Whatif(args) => commands::whatif::run(args),
        Command::Export(args) => commands::export::run(args),
        Command::Dump(args) => commands::dump::run(args),
        Command::Compact(args) => commands::compact::run(args),
    };
    match result {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("vramshim: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

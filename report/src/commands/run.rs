//! `vramshim run [-o PATH] [--stack MODE] -- CMD ARGS...`: runs a program with the recorder
//! preloaded, passes on its exit status (and the signal that killed it), then names the logs.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use crate::Failure;
use crate::commands::launch;
use crate::units::bytes;

#[derive(clap::Args)]
pub struct Args {
    /// Log path (`%p` = pid of the recorded process); default vramshim-<program>.<pid>.vlog.
    #[arg(short = 'o', long = "output")]
    output: Option<OsString>,
    /// Call stacks to capture: none, native, python or mixed (default mixed: native frames
    /// plus, in a Python process, the Python frames).
    #[arg(long, value_parser = ["none", "native", "python", "mixed"])]
    stack: Option<String>,
    /// The program and its arguments.
    #[arg(required = true, last = true)]
    command: Vec<OsString>,
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let library = launch::find_library()?;
    let manifest = launch::Manifest::create()?;
    if let Some(output) = &args.output {
        launch::remove_stale_log(output);
    }

    let preload = launch::preload(&[library]);
    let (program, rest) = launch::split_command(&args.command)?;
    let mut command = Command::new(program);
    command
        .args(rest)
        .env("LD_PRELOAD", preload)
        .env("VRAMSHIM_MANIFEST", manifest.path());
    if let Some(output) = &args.output {
        command.env("VRAMSHIM_OUTPUT", output);
    }
    if let Some(stack) = &args.stack {
        command.env("VRAMSHIM_STACK", stack);
    }
    let status = launch::spawn_and_wait(&mut command, program)?;
    report_logs(&manifest.logs());
    Ok(launch::exit_like(status))
}

fn report_logs(logs: &[PathBuf]) {
    if logs.is_empty() {
        eprintln!("vramshim: no log written (the program made no CUDA memory call)");
        return;
    }
    for path in logs {
        let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        eprintln!("vramshim: wrote {} ({})", path.display(), bytes(size));
    }
}

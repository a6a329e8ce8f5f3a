//! `vramshim`: runs programs under the recorder and reads what it recorded.

mod commands;
mod logfile;
mod units;

use std::process::ExitCode;

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
    /// Print every record of a log, as text or as JSON lines.
    Dump(commands::dump::Args),
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => commands::run::run(args),
        Command::Dump(args) => commands::dump::run(args),
    };
    match result {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("vramshim: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

//! `vramshim run [-o PATH] [--stack MODE] -- CMD ARGS...`: runs a program with the recorder
//! preloaded, passes on its exit status (and the signal that killed it), then compacts the
//! logs (`compact`: the recorder writes them plain) and names them.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use crate::Failure;
use crate::commands::{compact, launch};
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
    /// Leave the logs as the recorder wrote them (plain chunks), not compacted.
    #[arg(long)]
    no_compact: bool,
    /// The program and its arguments.
    #[arg(required = true, last = true)]
    command: Vec<OsString>,
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let library = launch::find_library()?;
    if let Some(output) = &args.output {
        // Before the program starts: a log that cannot be written is found out now, not
        // after a long run.
        unwritable(output).map_or(Ok(()), |why| {
            Err(Failure::input(format!(
                "cannot write the log to {}: {why}; the program was not started",
                Path::new(output).display()
            )))
        })?;
    }
    let manifest = launch::Manifest::create()?;
    if let Some(output) = &args.output {
        launch::remove_stale_log(output);
    }

    let preload = launch::preload(std::slice::from_ref(&library));
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
    if let Some(nvtx) = launch::nvtx_injection(&library) {
        command.env(launch::NVTX_INJECTION, nvtx);
    }
    let status = launch::spawn_and_wait(&mut command, program)?;
    report_logs(&manifest.logs(), args.output.as_deref(), !args.no_compact);
    Ok(launch::exit_like(status))
}

/// Why the recorder could not create its log at `output` (`-o`), as far as can be told before
/// it runs: the directory it goes in is missing or not writable, or something other than a
/// regular file or a directory is at the path (the recorder refuses those). None when it can.
fn unwritable(output: &OsStr) -> Option<String> {
    // `%p` becomes a pid: any one tells which directory is meant.
    let mut bytes = Vec::with_capacity(output.len());
    let raw = output.as_bytes();
    let mut i = 0;
    while i < raw.len() {
        if raw[i..].starts_with(b"%p") {
            bytes.extend_from_slice(std::process::id().to_string().as_bytes());
            i += 2;
        } else {
            bytes.push(raw[i]);
            i += 1;
        }
    }
    let path = PathBuf::from(OsString::from_vec(bytes));
    let seen = std::fs::symlink_metadata(&path);
    let dir = match &seen {
        Ok(meta) if meta.is_dir() => path.as_path(),
        _ if raw.ends_with(b"/") => path.as_path(),
        Ok(meta) if !meta.is_file() => {
            return Some("it exists and is not a regular file".to_string());
        }
        _ => match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        },
    };
    match std::fs::metadata(dir) {
        Err(error) => return Some(format!("{}: {error}", dir.display())),
        Ok(meta) if !meta.is_dir() => return Some(format!("{}: not a directory", dir.display())),
        Ok(_) => {}
    }
    let Ok(c_dir) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return Some("the path holds a NUL byte".to_string());
    };
    // SAFETY: `c_dir` is a valid NUL-terminated string for the duration of the call.
    if unsafe { libc::access(c_dir.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        let error = std::io::Error::last_os_error();
        return Some(format!("{}: {error}", dir.display()));
    }
    None
}

/// Names each log written, with its size, after compacting it when `compact` (one that cannot
/// be is left as recorded, and the line says why).
fn report_logs(logs: &[PathBuf], output: Option<&OsStr>, compact: bool) {
    if logs.is_empty() {
        match output.and_then(unwritable) {
            Some(why) => eprintln!(
                "vramshim: no log written: cannot write it to {}: {why}",
                Path::new(output.unwrap_or_default()).display()
            ),
            None => eprintln!("vramshim: no log written (the program made no CUDA memory call)"),
        }
        return;
    }
    if !compact {
        for path in logs {
            let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            eprintln!("vramshim: wrote {} ({})", path.display(), bytes(size));
        }
        return;
    }
    // The program has ended: Ctrl-C (ignored while it ran) now stops the compaction (which
    // sets its handlers), the logs left as recorded, the exit status still the program's.
    let outcomes = compact::compact_logs(logs, compact::DEFAULT_LEVEL);
    for (path, outcome) in logs.iter().zip(outcomes) {
        match outcome {
            Ok(compact::Outcome::Compacted { before, after }) => eprintln!(
                "vramshim: wrote {} ({}; {} as recorded)",
                path.display(),
                bytes(after),
                bytes(before)
            ),
            Ok(compact::Outcome::Unchanged { size }) => {
                eprintln!("vramshim: wrote {} ({})", path.display(), bytes(size))
            }
            Err(why) => eprintln!(
                "vramshim: wrote {} ({}, as recorded: not compacted: {why})",
                path.display(),
                bytes(std::fs::metadata(path).map(|m| m.len()).unwrap_or(0))
            ),
        }
    }
}

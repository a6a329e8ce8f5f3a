//! What `run` and `dryrun` share: finding the recorder, building `LD_PRELOAD`, running the
//! program with signals forwarded to it, and ending with its exit status.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};

use crate::Failure;

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(signal: libc::c_int) {
    let child = CHILD.load(Ordering::Relaxed);
    if child > 0 {
        unsafe { libc::kill(child, signal) };
    }
}

/// `VRAMSHIM_LIB`, else `libvramshim.so` beside this executable (or in `../lib`).
pub fn find_library() -> Result<PathBuf, Failure> {
    if let Some(path) = std::env::var_os("VRAMSHIM_LIB").filter(|v| !v.is_empty()) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        return Err(Failure::input(format!(
            "VRAMSHIM_LIB={} is not a file",
            path.display()
        )));
    }
    let exe = std::env::current_exe()
        .map_err(|err| Failure::input(format!("cannot find own executable: {err}")))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    for candidate in [
        dir.join("libvramshim.so"),
        dir.join("../lib/libvramshim.so"),
    ] {
        if candidate.is_file() {
            return Ok(candidate.canonicalize().unwrap_or(candidate));
        }
    }
    Err(Failure::input(format!(
        "libvramshim.so not found beside {} (build it with `cargo build`, or set VRAMSHIM_LIB)",
        exe.display()
    )))
}

/// `LD_PRELOAD` with `first` in order, then whatever the environment already preloads.
pub fn preload(first: &[PathBuf]) -> OsString {
    let mut parts: Vec<OsString> = first.iter().map(|p| p.as_os_str().to_owned()).collect();
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        parts.push(existing);
    }
    let mut joined = OsString::new();
    for (index, part) in parts.iter().enumerate() {
        if index > 0 {
            joined.push(":");
        }
        joined.push(part);
    }
    joined
}

/// The program and its arguments, split; an error when there is no program.
pub fn split_command(command: &[OsString]) -> Result<(&OsString, &[OsString]), Failure> {
    command
        .split_first()
        .ok_or_else(|| Failure::input("no command given"))
}

/// Starts `command` and waits for it. Signals sent to vramshim alone go to the program;
/// terminal signals (Ctrl-C) already reach both, and vramshim waits for the program to
/// decide.
pub fn spawn_and_wait(command: &mut Command, program: &OsStr) -> Result<ExitStatus, Failure> {
    let mut child = command.spawn().map_err(|err| Failure {
        message: format!("cannot run {}: {err}", program.to_string_lossy()),
        code: 127,
    })?;
    CHILD.store(child.id() as i32, Ordering::Relaxed);
    unsafe {
        for signal in [libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2] {
            libc::signal(signal, forward as *const () as libc::sighandler_t);
        }
        for signal in [libc::SIGINT, libc::SIGQUIT] {
            libc::signal(signal, libc::SIG_IGN);
        }
    }
    child.wait().map_err(|err| Failure {
        message: format!("waiting for the program failed: {err}"),
        code: 1,
    })
}

/// Ends like the program did: the same exit code, or death by the same signal, so the
/// caller sees the same status.
pub fn exit_like(status: ExitStatus) -> ExitCode {
    if let Some(signal) = status.signal() {
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
            libc::kill(libc::getpid(), signal);
        }
        return ExitCode::from((128 + signal) as u8);
    }
    ExitCode::from(status.code().unwrap_or(1) as u8)
}

/// The log paths the recorder appended to `manifest`, one per line, in order.
pub fn manifest_logs(manifest: &Path) -> Vec<PathBuf> {
    let listed = std::fs::read(manifest).unwrap_or_default();
    listed
        .split(|&b| b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| PathBuf::from(OsStr::from_bytes(line)))
        .collect()
}

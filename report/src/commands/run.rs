//! `vramshim run [-o PATH] [--stack MODE] -- CMD ARGS...`: runs a program with the recorder
//! preloaded, passes on its exit status (and the signal that killed it), then names the logs.

use std::ffi::{OsStr, OsString};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicI32, Ordering};

use crate::Failure;
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

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(signal: libc::c_int) {
    let child = CHILD.load(Ordering::Relaxed);
    if child > 0 {
        unsafe { libc::kill(child, signal) };
    }
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let library = find_library()?;
    let mut manifest = Manifest::create()?;
    if let Some(output) = &args.output {
        remove_stale_log(output);
    }

    let mut preload = OsString::from(&library);
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(existing);
    }
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| Failure::input("no command given"))?;
    let mut command = Command::new(program);
    command
        .args(rest)
        .env("LD_PRELOAD", preload)
        .env("VRAMSHIM_MANIFEST", &manifest.path);
    if let Some(output) = &args.output {
        command.env("VRAMSHIM_OUTPUT", output);
    }
    if let Some(stack) = &args.stack {
        command.env("VRAMSHIM_STACK", stack);
    }
    let mut child = command.spawn().map_err(|err| Failure {
        message: format!("cannot run {}: {err}", program.to_string_lossy()),
        code: 127,
    })?;
    CHILD.store(child.id() as i32, Ordering::Relaxed);
    // Signals sent to vramshim alone go to the program. Terminal signals (Ctrl-C) already
    // reach both; vramshim waits for the program to decide.
    unsafe {
        for signal in [libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2] {
            libc::signal(signal, forward as *const () as libc::sighandler_t);
        }
        for signal in [libc::SIGINT, libc::SIGQUIT] {
            libc::signal(signal, libc::SIG_IGN);
        }
    }
    let status = child.wait().map_err(|err| Failure {
        message: format!("waiting for the program failed: {err}"),
        code: 1,
    })?;
    report_logs(&manifest.read());
    drop(manifest);
    if let Some(signal) = status.signal() {
        // Die the same way, so the caller sees the same status.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
            libc::kill(libc::getpid(), signal);
        }
        return Ok(ExitCode::from((128 + signal) as u8));
    }
    Ok(ExitCode::from(status.code().unwrap_or(1) as u8))
}

/// `VRAMSHIM_LIB`, else `libvramshim.so` beside this executable (or in `../lib`).
fn find_library() -> Result<PathBuf, Failure> {
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

/// The file each recorded process appends its log's path to, in a private directory (mode
/// 0700, random name): nobody else can plant or read anything there. Removed when dropped.
struct Manifest {
    dir: PathBuf,
    path: PathBuf,
    /// Kept open: read back through this handle, whatever happens to the name meanwhile.
    file: std::fs::File,
}

impl Manifest {
    fn create() -> Result<Manifest, Failure> {
        let template = std::env::temp_dir().join("vramshim-run.XXXXXX");
        let mut template = template.into_os_string().into_vec();
        template.push(0);
        // mkdtemp: created atomically with a fresh random name and mode 0700.
        let made = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
        if made.is_null() {
            return Err(Failure::input(format!(
                "cannot create a private directory in {}: {}",
                std::env::temp_dir().display(),
                std::io::Error::last_os_error()
            )));
        }
        template.pop();
        let dir = PathBuf::from(OsString::from_vec(template));
        let path = dir.join("manifest");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|err| {
                let _ = std::fs::remove_dir(&dir);
                Failure::input(format!("cannot create {}: {err}", path.display()))
            })?;
        Ok(Manifest { dir, path, file })
    }

    /// What the processes appended.
    fn read(&mut self) -> Vec<u8> {
        let mut listed = Vec::new();
        let _ = self.file.seek(SeekFrom::Start(0));
        let _ = self.file.read_to_end(&mut listed);
        listed
    }
}

impl Drop for Manifest {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// `-o PATH` names a fixed file that an earlier run of the same command wrote: remove it, so
/// that running again overwrites as users expect (the recorder itself never writes into an
/// existing file). Only a regular vramshim log of this user whose writer has exited goes;
/// anything else stays, and the recorder writes beside it.
fn remove_stale_log(output: &OsStr) {
    let bytes = output.as_bytes();
    if bytes.windows(2).any(|w| w == b"%p") || bytes.ends_with(b"/") {
        return;
    }
    let path = Path::new(output);
    let Ok(seen) = std::fs::symlink_metadata(path) else {
        return;
    };
    if !seen.file_type().is_file() || seen.uid() != unsafe { libc::getuid() } {
        return;
    }
    // O_NONBLOCK: should a FIFO replace the file meanwhile, opening it does not wait.
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    else {
        return;
    };
    let same = file
        .metadata()
        .is_ok_and(|now| now.is_file() && now.dev() == seen.dev() && now.ino() == seen.ino());
    if !same {
        return;
    }
    let Ok(reader) = vramshim_format::LogReader::new(file) else {
        return;
    };
    let writer = reader.header().pid as libc::pid_t;
    let writer_running = writer > 0
        && (unsafe { libc::kill(writer, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM));
    if !writer_running {
        let _ = std::fs::remove_file(path);
    }
}

fn report_logs(listed: &[u8]) {
    let logs: Vec<&[u8]> = listed
        .split(|&b| b == b'\n')
        .filter(|line| !line.is_empty())
        .collect();
    if logs.is_empty() {
        eprintln!("vramshim: no log written (the program made no CUDA memory call)");
        return;
    }
    for log in logs {
        let path = Path::new(OsStr::from_bytes(log));
        let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        eprintln!("vramshim: wrote {} ({})", path.display(), bytes(size));
    }
}

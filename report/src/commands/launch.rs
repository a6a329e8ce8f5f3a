//! What `run` and `dryrun` share: finding the recorder, building `LD_PRELOAD`, running the
//! program with signals forwarded to it, and ending with its exit status.

use std::ffi::{OsStr, OsString};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
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

/// The environment variable NVTX reads the path of its injection library from.
pub const NVTX_INJECTION: &str = "NVTX_INJECTION64_PATH";

/// `libvramshim_nvtx.so` beside the recorder `library`, for `NVTX_INJECTION64_PATH`: `None`
/// when it is missing, or when the user set the variable (their tool, such as Nsight
/// Systems, keeps it).
pub fn nvtx_injection(library: &Path) -> Option<PathBuf> {
    if std::env::var_os(NVTX_INJECTION).is_some_and(|v| !v.is_empty()) {
        return None;
    }
    let path = library.with_file_name("libvramshim_nvtx.so");
    path.is_file().then_some(path)
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
        // As a shell says it: 127 when there is no such program, 126 when it cannot be run.
        code: match err.kind() {
            std::io::ErrorKind::NotFound => 127,
            _ => 126,
        },
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

/// The file each recorded process appends its log's path to, in a private directory (mode
/// 0700, random name): nobody else can plant or read anything there. Removed when dropped.
pub struct Manifest {
    dir: PathBuf,
    path: PathBuf,
    /// Kept open: read back through this handle, whatever happens to the name meanwhile.
    file: std::fs::File,
    /// Other files made in `dir` (`private_file`), removed with it.
    others: Vec<PathBuf>,
}

impl Manifest {
    pub fn create() -> Result<Manifest, Failure> {
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
        Ok(Manifest {
            dir,
            path,
            file,
            others: Vec::new(),
        })
    }

    /// A new empty file NAME (mode 0600) in the manifest's private directory, removed with it.
    pub fn private_file(&mut self, name: &str) -> Result<PathBuf, Failure> {
        let path = self.dir.join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|err| Failure::input(format!("cannot create {}: {err}", path.display())))?;
        self.others.push(path.clone());
        Ok(path)
    }

    /// Where the recorder appends (`VRAMSHIM_MANIFEST`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The log paths the recorded processes appended, one per line, in order.
    pub fn logs(mut self) -> Vec<PathBuf> {
        let mut listed = Vec::new();
        let _ = self.file.seek(SeekFrom::Start(0));
        let _ = self.file.read_to_end(&mut listed);
        listed
            .split(|&b| b == b'\n')
            .filter(|line| !line.is_empty())
            .map(|line| PathBuf::from(OsStr::from_bytes(line)))
            .collect()
    }
}

impl Drop for Manifest {
    fn drop(&mut self) {
        for other in &self.others {
            let _ = std::fs::remove_file(other);
        }
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// `-o PATH` names a fixed file that an earlier run of the same command wrote: remove it, so
/// that running again overwrites as users expect (the recorder itself never writes into an
/// existing file). Only a regular vramshim log of this user whose writer has exited goes;
/// anything else stays, and the recorder writes beside it.
pub fn remove_stale_log(output: &OsStr) {
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

//! Starting the recorder on the first CUDA call, and keeping the log complete across the
//! process's life: fork, exec, exit, `_exit`, fatal signals and thread exit.

use std::ffi::{OsString, c_char, c_int, c_void};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use vramshim_format::{FORMAT_VERSION, Header, Note, RECORDED_ENV, Record};

use crate::capture::{self, Ring};
use crate::config::{Config, Mode};
use crate::{flight, interpose, stacks, table, writer};

const UNINIT: u8 = 0;
const STARTING: u8 = 1;
const ON: u8 = 2;
const OFF: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
static CONFIG: OnceLock<Config> = OnceLock::new();
/// Set by the final flush: later events (other libraries' destructors) are written at once.
static FINISHED: AtomicBool = AtomicBool::new(false);
/// Process-wide set-up done once (fork handlers, signal handlers, thread-exit key).
static PROCESS_SETUP: std::sync::Once = std::sync::Once::new();
static THREAD_KEY: AtomicU32 = AtomicU32::new(u32::MAX);
/// Pid of the parent when this process is a fork child that has not started its log yet.
static FORKED_FROM: AtomicU32 = AtomicU32::new(0);
static WRITER: Mutex<Option<std::thread::JoinHandle<()>>> = Mutex::new(None);

/// The settings (read once).
pub fn config() -> &'static Config {
    CONFIG.get_or_init(|| {
        let (config, warnings) = Config::from_env();
        for warning in warnings {
            crate::warn(&warning);
        }
        config
    })
}

/// Whether recording is on; starts it on the first call.
#[inline]
pub fn ensure_started() -> bool {
    match STATE.load(Ordering::Acquire) {
        ON => true,
        OFF => false,
        _ => start_slow(),
    }
}

/// Stops recording for good (after an internal error).
pub fn disable() {
    STATE.store(OFF, Ordering::Release);
}

#[cold]
fn start_slow() -> bool {
    loop {
        match STATE.compare_exchange(UNINIT, STARTING, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                let started = crate::guard(false, start);
                STATE.store(if started { ON } else { OFF }, Ordering::Release);
                return started;
            }
            Err(ON) => return true,
            Err(OFF) => return false,
            // Another thread is opening the log.
            Err(_) => std::thread::sleep(Duration::from_micros(50)),
        }
    }
}

fn start() -> bool {
    let config = config();
    PROCESS_SETUP.call_once(process_setup);
    let pid = std::process::id();
    let (wanted, named_by_pid) = log_path(config, pid);
    let start_mono_ns = capture::now_ns();
    let header = Header {
        version: FORMAT_VERSION,
        pid,
        ppid: unsafe { libc::getppid() } as u32,
        argv: command_line(),
        start_unix_ns: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
        start_mono_ns,
        hostname: hostname(),
        env: RECORDED_ENV
            .iter()
            .map(|name| {
                let value = std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
                ((*name).to_owned(), value)
            })
            .collect(),
        apis: table::api_names(),
        stack_mode: config.stack.name().to_owned(),
        mode: match config.mode {
            Mode::Stream => "stream".to_owned(),
            Mode::Ring => "ring".to_owned(),
        },
        recorder: env!("CARGO_PKG_VERSION").to_owned(),
    };
    let ring_events = (config.mode == Mode::Ring).then_some(config.ring_events);
    let output = match create_log(
        &wanted,
        named_by_pid,
        pid,
        &header.encode(),
        start_mono_ns,
        ring_events,
    ) {
        Ok(output) => output,
        Err(why) => {
            crate::warn(&why);
            return false;
        }
    };
    let path = output.path.clone();
    writer::install(output);
    let parent = FORKED_FROM.swap(0, Ordering::AcqRel);
    if parent != 0 {
        writer::define(Record::Note(Note {
            t_ns: 0,
            text: format!("fork child of pid {parent}"),
        }));
    }
    if let Some(manifest) = &config.manifest {
        writer::append_manifest(manifest, &absolute(&path));
    }
    crate::debug(format_args!("recording to {}", path.to_string_lossy()));
    let interval = Duration::from_millis(config.flush_ms);
    match std::thread::Builder::new()
        .name("vramshim-writer".into())
        .spawn(move || writer_loop(interval))
    {
        Ok(handle) => {
            writer::set_writer_thread(handle.thread().clone());
            *WRITER.lock() = Some(handle);
        }
        Err(err) => crate::warn(&format!(
            "cannot start the writer thread ({err}); events are written when buffers fill and at exit"
        )),
    }
    true
}

fn writer_loop(interval: Duration) {
    // Wakes every interval, or early when a producer's ring is half full.
    loop {
        std::thread::park_timeout(interval);
        if STATE.load(Ordering::Acquire) == OFF {
            return;
        }
        crate::guard((), || writer::flush(writer::FlushKind::Periodic));
    }
}

/// `VRAMSHIM_OUTPUT` with `%p` replaced by the pid, or `vramshim-<program>.<pid>.vlog`; a
/// directory (existing and not a symlink, or ending in `/`) gets the default name inside it.
/// The flag says whether the name already holds the pid.
fn log_path(config: &Config, pid: u32) -> (OsString, bool) {
    let default_name = format!("vramshim-{}.{pid}.vlog", program_name());
    let Some(template) = &config.output else {
        return (OsString::from(default_name), true);
    };
    let mut bytes = Vec::new();
    let mut named_by_pid = false;
    let raw = template.as_bytes();
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' && raw.get(i + 1) == Some(&b'p') {
            bytes.extend_from_slice(pid.to_string().as_bytes());
            named_by_pid = true;
            i += 2;
        } else {
            bytes.push(raw[i]);
            i += 1;
        }
    }
    let path = OsString::from_vec(bytes);
    // `symlink_metadata`: a symlink planted at the path must not send the log elsewhere.
    let is_dir = std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_dir());
    if path.as_bytes().ends_with(b"/") || is_dir {
        let mut joined = std::path::PathBuf::from(path);
        joined.push(default_name);
        return (joined.into_os_string(), true);
    }
    (path, named_by_pid)
}

/// Creates the log at `wanted`, or beside it when a regular file is already there: another
/// process's log (a fork or exec'd child, a process started at the same time, an earlier run)
/// or someone else's file. Nothing that exists is ever opened or overwritten, and each name is
/// taken atomically (`O_EXCL`), so processes racing for one path each get their own file. The
/// name beside it is `<stem>.<pid>.<ext>` (then `.2`, `.3`, ... after that), or `<path>.2`,
/// `.3`, ... when the name already holds the pid (an exec'd image of the same process).
/// Anything but a regular file at `wanted` (a symlink, a FIFO, a device) is refused. The error
/// is the whole warning line.
fn create_log(
    wanted: &OsString,
    named_by_pid: bool,
    pid: u32,
    header: &[u8],
    start_mono_ns: u64,
    ring_events: Option<usize>,
) -> Result<writer::Output, String> {
    let unrecorded = "the program runs unrecorded";
    match writer::open_log(wanted, header, start_mono_ns, ring_events) {
        Ok(output) => return Ok(output),
        Err(writer::OpenError::Exists) => {}
        Err(writer::OpenError::Failed(why)) => {
            return Err(format!(
                "cannot create log {}: {why}; {unrecorded}",
                wanted.to_string_lossy()
            ));
        }
    }
    if let Some(kind) = writer::special_file_kind(wanted) {
        return Err(format!(
            "cannot create log {}: it is {kind} (only a new regular file is written); {unrecorded}",
            wanted.to_string_lossy()
        ));
    }
    let first = if named_by_pid {
        wanted.clone()
    } else {
        let as_path = std::path::Path::new(wanted);
        let mut name = as_path
            .file_stem()
            .map(|s| s.to_os_string())
            .unwrap_or_default();
        name.push(format!(".{pid}"));
        if let Some(ext) = as_path.extension() {
            name.push(".");
            name.push(ext);
        }
        as_path.with_file_name(name).into_os_string()
    };
    const MAX_TRIES: u32 = 1000;
    // `first` itself is `wanted` when the name already holds the pid: start at `.2` then.
    let start = if named_by_pid { 2 } else { 1 };
    for n in start..=MAX_TRIES {
        let mut candidate = first.clone();
        if n > 1 {
            candidate.push(format!(".{n}"));
        }
        match writer::open_log(&candidate, header, start_mono_ns, ring_events) {
            Ok(output) => {
                crate::warn(&format!(
                    "{} already exists; logging to {}",
                    wanted.to_string_lossy(),
                    candidate.to_string_lossy()
                ));
                return Ok(output);
            }
            Err(writer::OpenError::Exists) => {}
            Err(writer::OpenError::Failed(why)) => {
                return Err(format!(
                    "cannot create log {} ({} already exists): {why}; {unrecorded}",
                    candidate.to_string_lossy(),
                    wanted.to_string_lossy()
                ));
            }
        }
    }
    Err(format!(
        "cannot create log {}: it and every name beside it up to .{MAX_TRIES} already exist; {unrecorded}",
        wanted.to_string_lossy()
    ))
}

/// The program's name for the default log name: the script for `python x.py`, the module for
/// `python -m pkg`, else the executable's base name.
fn program_name() -> String {
    let argv = command_line();
    let base = |s: &str| s.rsplit('/').next().unwrap_or(s).to_owned();
    let exe = argv
        .first()
        .map(|a| base(a))
        .unwrap_or_else(|| "process".into());
    let mut name = exe.clone();
    if exe.starts_with("python") {
        let mut args = argv.iter().skip(1);
        while let Some(arg) = args.next() {
            if arg == "-m" {
                if let Some(module) = args.next() {
                    name = module.clone();
                }
                break;
            }
            if arg.starts_with('-') {
                continue;
            }
            let script = base(arg);
            name = script.strip_suffix(".py").unwrap_or(&script).to_owned();
            break;
        }
    }
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.is_empty() {
        "process".into()
    } else {
        clean
    }
}

fn command_line() -> Vec<String> {
    std::fs::read("/proc/self/cmdline")
        .map(|raw| {
            raw.split(|&b| b == 0)
                .filter(|part| !part.is_empty())
                .map(|part| String::from_utf8_lossy(part).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return String::new();
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

fn absolute(path: &OsString) -> OsString {
    std::path::absolute(path).map_or_else(|_| path.clone(), |p| p.into_os_string())
}

/// Kernel thread id of the caller.
pub fn gettid() -> u32 {
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

// ---------------------------------------------------------------------------------------
// Process-wide set-up: fork handlers, fatal-signal handlers, thread exit.

fn process_setup() {
    unsafe {
        libc::pthread_atfork(
            Some(before_fork),
            Some(after_fork_parent),
            Some(after_fork_child),
        );
        let mut key: libc::pthread_key_t = 0;
        if libc::pthread_key_create(&mut key, Some(thread_exit)) == 0 {
            THREAD_KEY.store(key, Ordering::Release);
        }
    }
    install_signal_handlers();
}

/// Arranges for the ring to be released when the calling thread exits.
pub fn set_thread_exit_hook(ring: *const Ring) {
    let key = THREAD_KEY.load(Ordering::Acquire);
    if key != u32::MAX {
        unsafe { libc::pthread_setspecific(key, ring.cast::<c_void>()) };
    }
}

unsafe extern "C" fn thread_exit(ring: *mut c_void) {
    // Later hooks on this thread (TLS destructors) get a fresh ring.
    crate::guard((), || {
        capture::release_unwind_cache();
        let current = capture::forget_thread_ring();
        if !current.is_null() && current != ring.cast_const().cast() {
            // A newer ring replaced this one; it is released by its own key value.
            return;
        }
        if current == ring.cast_const().cast() {
            // A name set since the last check still reaches the log.
            capture::reread_own_name_of(current);
        }
        writer::release_thread_ring(ring.cast_const().cast());
    });
}

extern "C" fn before_fork() {
    crate::guard((), || {
        if STATE.load(Ordering::Acquire) != ON {
            return;
        }
        // Get what is buffered to disk, then hold every lock so the child copies none held.
        writer::flush(writer::FlushKind::Periodic);
        writer::lock_all();
        stacks::lock_all();
        writer::lock_defs();
        FORK_LOCKED.store(true, Ordering::Release);
    });
}

static FORK_LOCKED: AtomicBool = AtomicBool::new(false);

extern "C" fn after_fork_parent() {
    if FORK_LOCKED.swap(false, Ordering::AcqRel) {
        unsafe {
            writer::unlock_all();
            stacks::unlock_all();
        }
    }
}

extern "C" fn after_fork_child() {
    if FORK_LOCKED.swap(false, Ordering::AcqRel) {
        unsafe {
            writer::unlock_all();
            stacks::unlock_all();
        }
    }
    crate::guard((), || {
        let was = STATE.load(Ordering::Acquire);
        if was == ON || was == STARTING {
            // The child records into its own log, opened at its first CUDA call.
            writer::reset_after_fork();
            stacks::reset_after_fork();
            capture::reset_samples();
            capture::forget_thread_ring();
            // The writer thread does not exist in the child.
            std::mem::forget(WRITER.lock().take());
            writer::clear_writer_thread();
            FORKED_FROM.store(unsafe { libc::getppid() } as u32, Ordering::Release);
            STATE.store(UNINIT, Ordering::Release);
        }
    });
}

/// Writes everything out before the process image goes away (exit, `_exit`, exec).
pub fn final_flush() {
    if STATE.load(Ordering::Acquire) == ON {
        crate::guard((), || {
            capture::reread_own_name();
            writer::flush(writer::FlushKind::Final)
        });
    }
}

/// Runs after every `atexit` handler (frameworks free CUDA memory there): the last flush.
extern "C" fn at_fini() {
    final_flush();
    FINISHED.store(true, Ordering::Release);
}

#[used]
#[unsafe(link_section = ".fini_array")]
static FINI: extern "C" fn() = at_fini;

/// Whether the final flush already ran (then each later event is flushed at once).
pub fn finished() -> bool {
    FINISHED.load(Ordering::Acquire)
}

const FATAL_SIGNALS: [c_int; 5] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGABRT,
    libc::SIGFPE,
    libc::SIGILL,
];

/// The actions that were installed before ours, restored before re-raising.
static mut PREVIOUS: [libc::sigaction; 5] = unsafe { std::mem::zeroed() };
static mut PREVIOUS_USR2: libc::sigaction = unsafe { std::mem::zeroed() };

fn install_signal_handlers() {
    unsafe {
        for (i, &signal) in FATAL_SIGNALS.iter().enumerate() {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_fatal_signal as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, &raw mut PREVIOUS[i]);
        }
        if config().mode == Mode::Ring {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigusr2 as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGUSR2, &action, &raw mut PREVIOUS_USR2);
        }
    }
}

extern "C" fn on_fatal_signal(signal: c_int, _info: *mut libc::siginfo_t, _context: *mut c_void) {
    if STATE.load(Ordering::Acquire) == ON {
        crate::guard((), || writer::flush(writer::FlushKind::Crash));
    }
    // Put back what was there and deliver the signal again: the program dies (or its own
    // handler runs) exactly as it would have without the shim.
    unsafe {
        if let Some(i) = FATAL_SIGNALS.iter().position(|&s| s == signal) {
            libc::sigaction(signal, &raw const PREVIOUS[i], std::ptr::null_mut());
        }
        libc::raise(signal);
    }
}

extern "C" fn on_sigusr2(_signal: c_int, _info: *mut libc::siginfo_t, _context: *mut c_void) {
    flight::request(flight::REQUEST_SIGUSR2);
    // An atomic swap and a futex wake: no lock, no allocation, so fine in a signal handler.
    writer::wake();
}

// ---------------------------------------------------------------------------------------
// Exported process-ending calls: flush first, then the real function.

fn next_fn(name: &std::ffi::CStr) -> *mut c_void {
    interpose::next(name)
}

/// Flushes the log, then `_exit`.
///
/// # Safety
/// Same contract as libc's `_exit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    final_flush();
    let real = next_fn(c"_exit");
    if !real.is_null() {
        let real: extern "C" fn(c_int) -> ! = unsafe { std::mem::transmute(real) };
        real(status);
    }
    unsafe { libc::syscall(libc::SYS_exit_group, status) };
    unreachable_exit()
}

/// Flushes the log, then `_Exit`.
///
/// # Safety
/// Same contract as libc's `_Exit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    unsafe { _exit(status) }
}

fn unreachable_exit() -> ! {
    loop {
        unsafe { libc::syscall(libc::SYS_exit_group, 127) };
    }
}

macro_rules! exec_hook {
    ($name:ident ( $($arg:ident : $ty:ty),* )) => {
        #[doc = concat!("Flushes the log, then `", stringify!($name), "`.")]
        ///
        /// # Safety
        /// Same contract as libc's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            before_exec();
            type Real = unsafe extern "C" fn($($ty),*) -> c_int;
            let real = next_fn(concat_cstr!($name));
            if real.is_null() {
                unsafe { *libc::__errno_location() = libc::ENOSYS };
                return -1;
            }
            let real: Real = unsafe { std::mem::transmute::<*mut c_void, Real>(real) };
            unsafe { real($($arg),*) }
        }
    };
}

macro_rules! concat_cstr {
    ($name:ident) => {
        match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
            Ok(name) => name,
            Err(_) => c"",
        }
    };
}

fn before_exec() {
    if STATE.load(Ordering::Acquire) == ON {
        crate::guard((), || writer::final_note("exec"));
    }
}

exec_hook!(execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char));
exec_hook!(execv(path: *const c_char, argv: *const *const c_char));
exec_hook!(execvp(file: *const c_char, argv: *const *const c_char));
exec_hook!(execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char));
exec_hook!(fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char));

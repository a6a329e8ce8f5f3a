//! Starting the recorder on the first CUDA call, and keeping the log complete across the
//! process's life: fork, exec, exit, `_exit`, fatal signals and thread exit. What may run in
//! each of these contexts is written down in `docs/shim-contexts.md`.

use std::ffi::{OsString, c_char, c_int, c_void};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, Ordering};
use std::time::Duration;

use vramshim_format::{FORMAT_VERSION, Header, Note, RECORDED_ENV, Record};

use crate::capture;
use crate::config::{Config, Mode};
use crate::process::{self, CONFIG, FINISHED, OFF, STATE, THREAD_KEY, UNINIT, config};
use crate::sync::Lock;
use crate::{altstack, flight, real, ring, stacks, table, writer};

/// Process-wide set-up done once (fork handlers, signal handlers, thread-exit key).
static PROCESS_SETUP: std::sync::Once = std::sync::Once::new();
/// Pid of the parent when this process is a fork child that has not started its log yet.
static FORKED_FROM: AtomicU32 = AtomicU32::new(0);
/// Pid of the process that opened the log (0 = none). A different pid with the state still
/// `ON` means a vfork child (or `posix_spawn`'s clone) borrowing the parent's memory: no fork
/// handler ran there, and the shim must not touch anything.
static OWNER_PID: AtomicU32 = AtomicU32::new(0);
static WRITER: Lock<Option<std::thread::JoinHandle<()>>> = Lock::new(None);

pub fn start() -> bool {
    let config = config();
    PROCESS_SETUP.call_once(process_setup);
    let pid = std::process::id();
    OWNER_PID.store(pid, Ordering::Release);
    let (wanted, named_by_pid) = log_path(config, pid);
    let start_mono_ns = process::now_ns();
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
        time_resolution_ns: config.time_resolution_ns,
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
    // The writer thread blocks every signal from its first instruction (it inherits the mask
    // of the thread that creates it): process-directed signals go to the program's threads.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut before: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut before);
    }
    let spawned = std::thread::Builder::new()
        .name("vramshim-writer".into())
        .spawn(move || writer_loop(interval));
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut()) };
    match spawned {
        Ok(handle) => {
            ring::set_writer_thread(handle.thread().clone());
            *WRITER.lock() = Some(handle);
        }
        Err(err) => crate::warn(&format!(
            "cannot start the writer thread ({err}); events are written when buffers fill and at exit"
        )),
    }
    true
}

fn writer_loop(interval: Duration) {
    // Wakes every interval, or early when a producer's ring is half full or a chunk left open
    // is due.
    loop {
        std::thread::park_timeout(writer::next_wait(interval));
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
    match writer::open_log(wanted, header, pid, start_mono_ns, ring_events) {
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
        match writer::open_log(&candidate, header, pid, start_mono_ns, ring_events) {
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
    program_name_of(&command_line())
}

/// [`program_name`] of the command line `argv`.
fn program_name_of(argv: &[String]) -> String {
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
            if arg == "-c" || arg == "-" {
                // A command string or standard input: no script to name the log after.
                break;
            }
            if arg == "-W" || arg == "-X" || arg == "--check-hash-based-pycs" {
                // Options whose value is the next argument, not the script.
                args.next();
                continue;
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

// ---------------------------------------------------------------------------------------
// Process-wide set-up: fork handlers, fatal-signal handlers, thread exit.

/// At load: the fork handlers, so that a fork while another thread is still starting the
/// recorder (state `STARTING`) leaves a child that starts afresh, not one that waits forever.
extern "C" fn at_load() {
    process::set_starter(start);
    real::set_on_adopt(table::resolve_driver);
    unsafe {
        libc::pthread_atfork(
            Some(before_fork),
            Some(after_fork_parent),
            Some(after_fork_child),
        );
    }
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = at_load;

fn process_setup() {
    unsafe {
        let mut key: libc::pthread_key_t = 0;
        if libc::pthread_key_create(&mut key, Some(thread_exit)) == 0 {
            THREAD_KEY.store(key, Ordering::Release);
        }
    }
    // Found now, in an ordinary context: a vfork child must not look them up (dlsym locks and
    // allocates).
    for (slot, name) in REAL_EXITS.iter().zip(REAL_EXIT_NAMES) {
        real_fn(slot, name);
    }
    install_signal_handlers();
}

unsafe extern "C" fn thread_exit(ring: *mut c_void) {
    // Later hooks on this thread (TLS destructors) get a fresh ring.
    crate::guard((), || {
        stacks::release_thread_caches();
        altstack::release_alt_stack();
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

/// Before `fork`: only lets the shim's own walks of the loader's list finish (see
/// `sync::loader_walk`); takes no lock.
extern "C" fn before_fork() {
    crate::sync::before_fork();
}

extern "C" fn after_fork_parent() {
    crate::sync::after_fork_parent();
}

/// In the fork child, before `fork` returns there. Only async-signal-safe work: plain
/// stores, `close`, `getppid`. Every lock is made free again whatever the parent's threads
/// were doing (they do not exist here), the parent's buffers are leaked rather than freed,
/// and the child opens its own log at its next CUDA call, in an ordinary context.
extern "C" fn after_fork_child() {
    crate::sync::after_fork_child();
    unsafe {
        writer::reset_in_fork_child();
        stacks::reset_in_fork_child();
        real::reset_in_fork_child();
        WRITER.reset_in_fork_child(None);
        // A thread of the parent may have been setting these up: start them over.
        if CONFIG.get().is_none() {
            std::ptr::write(std::ptr::addr_of!(CONFIG).cast_mut(), OnceLock::new());
        }
        if !PROCESS_SETUP.is_completed() {
            std::ptr::write(
                std::ptr::addr_of!(PROCESS_SETUP).cast_mut(),
                std::sync::Once::new(),
            );
        }
        let key = THREAD_KEY.load(Ordering::Acquire);
        if key != u32::MAX {
            libc::pthread_setspecific(key, std::ptr::null());
        }
    }
    capture::reset_samples();
    capture::forget_thread_ring();
    OWNER_PID.store(0, Ordering::Release);
    // Every state but "off for good" starts over: a parent still starting (another thread
    // in `start`) does not exist here to finish.
    if STATE.load(Ordering::Acquire) != OFF {
        FORKED_FROM.store(unsafe { libc::getppid() } as u32, Ordering::Release);
        STATE.store(UNINIT, Ordering::Release);
    }
}

/// Whether this is a vfork child (or `posix_spawn`'s clone) running in the memory of the
/// process that recorded: then the shim does nothing at all (one `getpid` system call).
fn in_vfork_child() -> bool {
    let owner = OWNER_PID.load(Ordering::Acquire);
    owner != 0 && owner != unsafe { libc::getpid() } as u32
}

/// Writes everything out before the process image goes away (exit, `_exit`, exec).
pub fn final_flush() {
    if process::is_on() && !in_vfork_child() && !writer::busy_on_this_thread() {
        crate::guard((), || {
            capture::reread_own_name();
            writer::flush(writer::FlushKind::Final)
        });
    }
}

/// Runs after every `atexit` handler (frameworks free CUDA memory there), on `exit` and on a
/// return from `main` only (`_exit` skips destructors): the last flush, then the exit record
/// that tells the report the process ended normally.
extern "C" fn at_fini() {
    if in_vfork_child() {
        return;
    }
    if process::is_on() && !writer::busy_on_this_thread() {
        crate::guard((), || {
            capture::reread_own_name();
            writer::exit_record()
        });
    }
    FINISHED.store(true, Ordering::Release);
}

#[used]
#[unsafe(link_section = ".fini_array")]
static FINI: extern "C" fn() = at_fini;

const FATAL_SIGNALS: [c_int; 5] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGABRT,
    libc::SIGFPE,
    libc::SIGILL,
];

/// The program's actions for the fatal signals, as they were when the shim installed its own
/// (written once, before the shim's handler can run).
static mut PREVIOUS: [libc::sigaction; 5] = unsafe { std::mem::zeroed() };
/// A previous handler installed with `SA_RESETHAND` has run once: it is the default now.
static PREVIOUS_RESET: [AtomicBool; 5] = [const { AtomicBool::new(false) }; 5];
/// Ring mode's dump signal (0 = none) and the program's action for it.
static DUMP_SIGNAL: AtomicI32 = AtomicI32::new(0);
static mut DUMP_PREVIOUS: libc::sigaction = unsafe { std::mem::zeroed() };
static DUMP_PREVIOUS_RESET: AtomicBool = AtomicBool::new(false);

/// Installs `handler` for `signal` and saves the program's action in `previous`, unless the
/// shim's handler is already there (a second set-up after fork must not save itself).
fn install_handler(signal: c_int, handler: usize, flags: c_int, previous: *mut libc::sigaction) {
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut current);
        if current.sa_sigaction == handler {
            return;
        }
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler;
        action.sa_flags = libc::SA_SIGINFO | flags;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(signal, &action, previous);
    }
}

fn install_signal_handlers() {
    for (i, &signal) in FATAL_SIGNALS.iter().enumerate() {
        install_handler(
            signal,
            on_fatal_signal as *const () as usize,
            libc::SA_ONSTACK,
            unsafe { &raw mut PREVIOUS[i] },
        );
    }
    let config = config();
    if config.mode == Mode::Ring
        && let Some(dump) = &config.dump_signal
    {
        DUMP_SIGNAL.store(dump.number, Ordering::Release);
        install_handler(
            dump.number,
            on_dump_signal as *const () as usize,
            libc::SA_RESTART | libc::SA_ONSTACK,
            &raw mut DUMP_PREVIOUS,
        );
    }
}

/// Whether the kernel raised `info` for a faulting instruction (which faults again when the
/// handler returns), rather than someone sending the signal.
fn is_fault(signal: c_int, info: *const libc::siginfo_t) -> bool {
    let code = if info.is_null() {
        0
    } else {
        unsafe { (*info).si_code }
    };
    code > 0
        && matches!(
            signal,
            libc::SIGSEGV | libc::SIGBUS | libc::SIGFPE | libc::SIGILL
        )
}

/// Calls the program's handler `previous` the way the kernel would have: with the original
/// siginfo and context for `SA_SIGINFO`, the signal number only otherwise, and with the mask
/// of the interrupted code plus its `sa_mask` (plus the signal itself unless `SA_NODEFER`).
/// `SA_RESETHAND` makes it the default after this call (`reset`). If it returns, the shim's
/// mask comes back; if it jumps out, it restores its own.
unsafe fn call_previous(
    previous: &libc::sigaction,
    reset: &AtomicBool,
    signal: c_int,
    info: *mut libc::siginfo_t,
    context: *mut c_void,
) {
    if previous.sa_flags & libc::SA_RESETHAND != 0 {
        reset.store(true, Ordering::Release);
    }
    unsafe {
        let mut mask: libc::sigset_t = std::mem::zeroed();
        if context.is_null() {
            libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut mask);
        } else {
            mask = (*context.cast::<libc::ucontext_t>()).uc_sigmask;
        }
        for other in 1..=libc::SIGRTMAX() {
            if libc::sigismember(&previous.sa_mask, other) == 1 {
                libc::sigaddset(&mut mask, other);
            }
        }
        if previous.sa_flags & libc::SA_NODEFER == 0 {
            libc::sigaddset(&mut mask, signal);
        } else {
            libc::sigdelset(&mut mask, signal);
        }
        let mut ours: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_SETMASK, &mask, &mut ours);
        if previous.sa_flags & libc::SA_SIGINFO != 0 {
            let handler: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
                std::mem::transmute(previous.sa_sigaction);
            handler(signal, info, context);
        } else {
            let handler: extern "C" fn(c_int) = std::mem::transmute(previous.sa_sigaction);
            handler(signal);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &ours, std::ptr::null_mut());
    }
}

/// Lets `signal` take the process as it would have without the shim: the default action
/// again, and the signal again with its original siginfo. A fault repeats by itself when the
/// handler returns; a sent signal is queued to this thread (blocked until the handler returns).
unsafe fn die_by_default(signal: c_int, info: *mut libc::siginfo_t) {
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(signal, &action, std::ptr::null_mut());
        if !is_fault(signal, info) {
            let sent = !info.is_null()
                && libc::syscall(
                    libc::SYS_rt_tgsigqueueinfo,
                    libc::getpid(),
                    process::gettid(),
                    signal,
                    info,
                ) == 0;
            if !sent {
                libc::raise(signal);
            }
        }
    }
}

extern "C" fn on_fatal_signal(signal: c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    let errno = unsafe { *libc::__errno_location() };
    let Some(i) = FATAL_SIGNALS.iter().position(|&s| s == signal) else {
        return;
    };
    let previous = unsafe { PREVIOUS[i] };
    let disposition = if PREVIOUS_RESET[i].load(Ordering::Acquire) {
        libc::SIG_DFL
    } else {
        previous.sa_sigaction
    };
    let fault = is_fault(signal, info);
    // A sent signal the program ignores changes nothing: no flush, nothing else.
    if disposition == libc::SIG_IGN && !fault {
        unsafe { *libc::__errno_location() = errno };
        return;
    }
    if process::is_on() && !in_vfork_child() {
        crate::guard((), || writer::flush(writer::FlushKind::Crash));
    }
    unsafe {
        if disposition == libc::SIG_DFL || disposition == libc::SIG_IGN {
            // An ignored fault kills like the default one (the kernel forces it).
            die_by_default(signal, info);
        } else {
            call_previous(&previous, &PREVIOUS_RESET[i], signal, info, context);
        }
        *libc::__errno_location() = errno;
    }
}

extern "C" fn on_dump_signal(signal: c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    let errno = unsafe { *libc::__errno_location() };
    if signal == DUMP_SIGNAL.load(Ordering::Acquire) {
        flight::request(flight::REQUEST_SIGNAL);
        // An atomic swap and a futex wake: no lock, no allocation.
        ring::wake();
        let previous = unsafe { DUMP_PREVIOUS };
        let reset = DUMP_PREVIOUS_RESET.load(Ordering::Acquire);
        // The program's own handler runs too; its default action (often: terminate) does
        // not, since asking for a dump is what the signal is for here.
        if !reset
            && previous.sa_sigaction != libc::SIG_DFL
            && previous.sa_sigaction != libc::SIG_IGN
        {
            unsafe { call_previous(&previous, &DUMP_PREVIOUS_RESET, signal, info, context) };
        }
    }
    unsafe { *libc::__errno_location() = errno };
}

// ---------------------------------------------------------------------------------------
// Exported process-ending calls: flush first, then the real function.

/// The real `_exit` and exec functions, found at set-up (index order of [`REAL_EXIT_NAMES`]).
static REAL_EXITS: [AtomicPtr<c_void>; 6] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 6];
const REAL_EXIT_NAMES: [&std::ffi::CStr; 6] = [
    c"_exit", c"execve", c"execv", c"execvp", c"execvpe", c"fexecve",
];

/// The next definition of a function, looked up once.
fn real_fn(slot: &AtomicPtr<c_void>, name: &std::ffi::CStr) -> *mut c_void {
    let mut real = slot.load(Ordering::Acquire);
    if real.is_null() {
        real = real::next(name);
        slot.store(real, Ordering::Release);
    }
    real
}

/// Flushes the log, then `_exit`. A vfork child goes straight to the real `_exit`.
///
/// # Safety
/// Same contract as libc's `_exit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    let real = if in_vfork_child() {
        REAL_EXITS[0].load(Ordering::Acquire)
    } else {
        final_flush();
        real_fn(&REAL_EXITS[0], REAL_EXIT_NAMES[0])
    };
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

/// glibc's `dl_iterate_phdr`, gated so that no walk of the loader's list is in flight when
/// the process forks (see `sync::loader_walk`); otherwise unchanged.
///
/// # Safety
/// Same contract as glibc's `dl_iterate_phdr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dl_iterate_phdr(
    callback: Option<
        unsafe extern "C" fn(*mut libc::dl_phdr_info, libc::size_t, *mut c_void) -> c_int,
    >,
    data: *mut c_void,
) -> c_int {
    static REAL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    let real = real_fn(&REAL, c"dl_iterate_phdr");
    if real.is_null() {
        return 0;
    }
    type Real = unsafe extern "C" fn(
        Option<unsafe extern "C" fn(*mut libc::dl_phdr_info, libc::size_t, *mut c_void) -> c_int>,
        *mut c_void,
    ) -> c_int;
    let real: Real = unsafe { std::mem::transmute::<*mut c_void, Real>(real) };
    crate::sync::loader_walk(|| unsafe { real(callback, data) })
}

fn unreachable_exit() -> ! {
    loop {
        unsafe { libc::syscall(libc::SYS_exit_group, 127) };
    }
}

macro_rules! exec_hook {
    ($index:literal, $name:ident ( $($arg:ident : $ty:ty),* )) => {
        #[doc = concat!("Flushes the log, then `", stringify!($name), "`.")]
        ///
        /// # Safety
        /// Same contract as libc's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            let real = if in_vfork_child() {
                REAL_EXITS[$index].load(Ordering::Acquire)
            } else {
                before_exec();
                real_fn(&REAL_EXITS[$index], REAL_EXIT_NAMES[$index])
            };
            type Real = unsafe extern "C" fn($($ty),*) -> c_int;
            if real.is_null() {
                unsafe { *libc::__errno_location() = libc::ENOSYS };
                return -1;
            }
            let real: Real = unsafe { std::mem::transmute::<*mut c_void, Real>(real) };
            unsafe { real($($arg),*) }
        }
    };
}

fn before_exec() {
    if process::is_on() {
        crate::guard((), || writer::final_note("exec"));
    }
}

exec_hook!(1, execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char));
exec_hook!(2, execv(path: *const c_char, argv: *const *const c_char));
exec_hook!(3, execvp(file: *const c_char, argv: *const *const c_char));
exec_hook!(4, execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char));
exec_hook!(5, fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char));

#[cfg(test)]
mod tests {
    use super::program_name_of;

    fn name(argv: &[&str]) -> String {
        program_name_of(&argv.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn python_options_with_a_value_are_not_the_script() {
        assert_eq!(
            name(&["/venv/bin/python", "-W", "ignore", "train.py"]),
            "train"
        );
        assert_eq!(
            name(&["python3", "-X", "dev", "-u", "/a/b/fit.py", "--lr"]),
            "fit"
        );
        assert_eq!(
            name(&["python3.11", "-W", "ignore", "-m", "torch.distributed.run"]),
            "torch.distributed.run"
        );
        assert_eq!(name(&["python3", "-c", "import torch"]), "python3");
        assert_eq!(name(&["./app", "-W", "x"]), "app");
        assert_eq!(name(&[]), "process");
    }
}

//! `VRAMSHIM_*` settings, read once when recording starts. A bad value gets one warning and
//! the default; it never stops the program.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

/// What call stacks to capture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackMode {
    None,
    Native,
    /// Python frames only (native ones where a thread runs no Python code).
    Python,
    /// Native and Python frames (Python frames only where an interpreter is present).
    Mixed,
}

impl StackMode {
    pub fn name(self) -> &'static str {
        match self {
            StackMode::None => "none",
            StackMode::Native => "native",
            StackMode::Python => "python",
            StackMode::Mixed => "mixed",
        }
    }
}

/// Whether everything is written, or only the last events on demand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every event is written (default).
    Stream,
    /// Flight recorder: the last `ring_events` events and the live set, written on a failed
    /// allocation, SIGUSR2, exit and crash.
    Ring,
}

/// What a producer does when its buffer is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnFull {
    /// Wait until the writer has made room (default: no event is lost).
    Wait,
    /// Drop the event and count it in the log.
    Drop,
}

#[derive(Clone, Debug)]
pub struct Config {
    /// Output path template (`%p` = pid); `None` = the default name in the working directory.
    pub output: Option<OsString>,
    pub stack: StackMode,
    pub max_frames: usize,
    /// Per-thread buffer capacity in events (a power of two).
    pub buffer_events: usize,
    pub flush_ms: u64,
    pub on_full: OnFull,
    pub mode: Mode,
    pub ring_events: usize,
    /// Ring mode's dump signal (`None`: no signal asks for a dump).
    pub dump_signal: Option<DumpSignal>,
    pub debug: bool,
    /// Where `vramshim run` wants the names of written logs appended.
    pub manifest: Option<OsString>,
}

impl Config {
    /// Reads the environment. Returns the config and the warnings to print.
    pub fn from_env() -> (Config, Vec<String>) {
        let mut warnings = Vec::new();
        let mut config = Config {
            output: env("VRAMSHIM_OUTPUT").filter(|v| !v.is_empty()),
            stack: StackMode::Mixed,
            max_frames: 64,
            buffer_events: 8192,
            flush_ms: 50,
            on_full: OnFull::Wait,
            mode: Mode::Stream,
            ring_events: 1_000_000,
            dump_signal: Some(DumpSignal::default()),
            debug: false,
            manifest: env("VRAMSHIM_MANIFEST").filter(|v| !v.is_empty()),
        };
        if let Some(value) = env_str("VRAMSHIM_STACK", &mut warnings) {
            match value.as_str() {
                "none" => config.stack = StackMode::None,
                "native" => config.stack = StackMode::Native,
                "python" => config.stack = StackMode::Python,
                "mixed" => config.stack = StackMode::Mixed,
                _ => warnings.push(invalid(
                    "VRAMSHIM_STACK",
                    &value,
                    "none, native, python, mixed",
                    "mixed",
                )),
            }
        }
        config.max_frames = number(
            "VRAMSHIM_MAX_FRAMES",
            1,
            256,
            config.max_frames,
            &mut warnings,
        );
        let buffer = number(
            "VRAMSHIM_BUFFER_EVENTS",
            64,
            1 << 24,
            config.buffer_events,
            &mut warnings,
        );
        config.buffer_events = buffer.next_power_of_two();
        config.flush_ms = number(
            "VRAMSHIM_FLUSH_MS",
            1,
            60_000,
            config.flush_ms as usize,
            &mut warnings,
        ) as u64;
        if let Some(value) = env_str("VRAMSHIM_ON_FULL", &mut warnings) {
            match value.as_str() {
                "wait" => config.on_full = OnFull::Wait,
                "drop" => config.on_full = OnFull::Drop,
                _ => warnings.push(invalid("VRAMSHIM_ON_FULL", &value, "wait, drop", "wait")),
            }
        }
        if let Some(value) = env_str("VRAMSHIM_MODE", &mut warnings) {
            match value.as_str() {
                "stream" => config.mode = Mode::Stream,
                "ring" => config.mode = Mode::Ring,
                _ => warnings.push(invalid("VRAMSHIM_MODE", &value, "stream, ring", "stream")),
            }
        }
        config.ring_events = number(
            "VRAMSHIM_RING_EVENTS",
            16,
            1 << 30,
            config.ring_events,
            &mut warnings,
        );
        if let Some(value) = env_str("VRAMSHIM_DUMP_SIGNAL", &mut warnings) {
            match DumpSignal::parse(&value) {
                Some(signal) => config.dump_signal = signal,
                None => warnings.push(format!(
                    "VRAMSHIM_DUMP_SIGNAL={value:?} is not a signal name or number, or none; \
                     using SIGUSR2"
                )),
            }
        }
        if let Some(value) = env_str("VRAMSHIM_DEBUG", &mut warnings) {
            match value.as_str() {
                "1" | "true" | "yes" => config.debug = true,
                "0" | "false" | "no" | "" => {}
                _ => warnings.push(invalid("VRAMSHIM_DEBUG", &value, "0, 1", "0")),
            }
        }
        (config, warnings)
    }
}

impl Config {
    /// The reason a dump asked for by the dump signal records (`SIGUSR2`, `signal 40`).
    pub fn dump_signal_name(&self) -> &str {
        self.dump_signal
            .as_ref()
            .map_or("signal", |signal| signal.name.as_str())
    }
}

/// The signal that asks ring mode for a dump.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpSignal {
    pub number: i32,
    /// `SIGUSR2`, or `signal N` for a signal without a name.
    pub name: String,
}

impl Default for DumpSignal {
    fn default() -> DumpSignal {
        DumpSignal {
            number: libc::SIGUSR2,
            name: "SIGUSR2".to_owned(),
        }
    }
}

/// Signals a dump may be asked with, by name. The fatal signals the shim flushes on, the
/// ones that cannot be caught and glibc's internal ones are not among them.
const SIGNAL_NAMES: [(&str, i32); 21] = [
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("TRAP", libc::SIGTRAP),
    ("USR1", libc::SIGUSR1),
    ("USR2", libc::SIGUSR2),
    ("PIPE", libc::SIGPIPE),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("STKFLT", libc::SIGSTKFLT),
    ("CHLD", libc::SIGCHLD),
    ("CONT", libc::SIGCONT),
    ("TSTP", libc::SIGTSTP),
    ("TTIN", libc::SIGTTIN),
    ("TTOU", libc::SIGTTOU),
    ("URG", libc::SIGURG),
    ("XCPU", libc::SIGXCPU),
    ("VTALRM", libc::SIGVTALRM),
    ("PROF", libc::SIGPROF),
    ("WINCH", libc::SIGWINCH),
    ("PWR", libc::SIGPWR),
];

impl DumpSignal {
    /// `none`, a name with or without `SIG` (`SIGUSR1`, `usr1`), or a number. `Some(None)`
    /// is `none`; `None` is an invalid value.
    fn parse(value: &str) -> Option<Option<DumpSignal>> {
        if value.eq_ignore_ascii_case("none") {
            return Some(None);
        }
        let by_number = |number: i32| {
            SIGNAL_NAMES
                .iter()
                .find(|(_, n)| *n == number)
                .map(|(name, _)| format!("SIG{name}"))
        };
        if let Ok(number) = value.parse::<i32>() {
            let realtime = (libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&number);
            let name =
                by_number(number).or_else(|| realtime.then(|| format!("signal {number}")))?;
            return Some(Some(DumpSignal { number, name }));
        }
        let upper = value.to_ascii_uppercase();
        let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
        let &(name, number) = SIGNAL_NAMES.iter().find(|(name, _)| *name == bare)?;
        Some(Some(DumpSignal {
            number,
            name: format!("SIG{name}"),
        }))
    }
}

fn env(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

fn env_str(name: &str, warnings: &mut Vec<String>) -> Option<String> {
    let value = env(name)?;
    match value.into_string() {
        Ok(value) => Some(value.trim().to_owned()),
        Err(raw) => {
            let shown = String::from_utf8_lossy(&raw.into_vec()).into_owned();
            warnings.push(format!(
                "{name}={shown:?} is not valid UTF-8; using the default"
            ));
            None
        }
    }
}

fn invalid(name: &str, value: &str, allowed: &str, default: &str) -> String {
    format!("{name}={value:?} is not one of {allowed}; using {default}")
}

fn number(name: &str, min: usize, max: usize, default: usize, warnings: &mut Vec<String>) -> usize {
    let Some(value) = env_str(name, warnings) else {
        return default;
    };
    match value.parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => n,
        _ => {
            warnings.push(format!(
                "{name}={value:?} is not a whole number from {min} to {max}; using {default}"
            ));
            default
        }
    }
}

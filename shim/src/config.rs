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
    /// Whether releases (frees, unmaps) get a stack too. Off by default: reports attribute a
    /// free to its allocation, and a stack walk per free would double the unwinding.
    pub free_stacks: bool,
    /// Per-thread buffer capacity in events (a power of two).
    pub buffer_events: usize,
    pub flush_ms: u64,
    /// Least time between two samples of a device's free memory (after its first event's).
    pub sample_ms: u64,
    pub on_full: OnFull,
    pub mode: Mode,
    pub ring_events: usize,
    /// Ring mode's dump signal (`None`: no signal asks for a dump).
    pub dump_signal: Option<DumpSignal>,
    pub debug: bool,
    /// The writer compresses its chunks (zstd) itself; off by default: `vramshim run` (or
    /// `vramshim compact`) compresses the log once the program has exited, out of its process.
    pub compress: bool,
    /// Where `vramshim run` wants the names of written logs appended.
    pub manifest: Option<OsString>,
    /// Times are written rounded down to a multiple of this many nanoseconds (a power of ten
    /// from 1 ns to 1 s; 1 by default). The recorder keeps full-resolution times until then.
    pub time_resolution_ns: u64,
}

impl Config {
    /// Reads the environment. Returns the config and the warnings to print.
    pub fn from_env() -> (Config, Vec<String>) {
        let mut warnings = Vec::new();
        let mut config = Config {
            output: env("VRAMSHIM_OUTPUT").filter(|v| !v.is_empty()),
            stack: StackMode::Mixed,
            max_frames: 64,
            free_stacks: false,
            buffer_events: 8192,
            flush_ms: 50,
            sample_ms: 1000,
            on_full: OnFull::Wait,
            mode: Mode::Stream,
            ring_events: 1_000_000,
            dump_signal: Some(DumpSignal::default()),
            debug: false,
            compress: false,
            manifest: env("VRAMSHIM_MANIFEST").filter(|v| !v.is_empty()),
            time_resolution_ns: 1,
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
        config.max_frames = number(MAX_FRAMES, config.max_frames, &mut warnings);
        config.buffer_events =
            number(BUFFER_EVENTS, config.buffer_events, &mut warnings).next_power_of_two();
        config.flush_ms = number(FLUSH_MS, config.flush_ms as usize, &mut warnings) as u64;
        config.sample_ms = number(SAMPLE_MS, config.sample_ms as usize, &mut warnings) as u64;
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
        config.ring_events = number(RING_EVENTS, config.ring_events, &mut warnings);
        if let Some(value) = env_str("VRAMSHIM_DUMP_SIGNAL", &mut warnings) {
            match DumpSignal::parse(&value) {
                Some(signal) => config.dump_signal = signal,
                None => warnings.push(format!(
                    "VRAMSHIM_DUMP_SIGNAL={value:?} is not a signal name or number, or none; \
                     using SIGUSR2"
                )),
            }
        }
        if let Some(value) = env_str("VRAMSHIM_FREE_STACKS", &mut warnings) {
            match value.as_str() {
                "1" | "true" | "yes" => config.free_stacks = true,
                "0" | "false" | "no" | "" => {}
                _ => warnings.push(invalid("VRAMSHIM_FREE_STACKS", &value, "0, 1", "0")),
            }
        }
        if let Some(value) = env_str("VRAMSHIM_TIME_RESOLUTION", &mut warnings) {
            match time_resolution(&value) {
                Some(ns) => config.time_resolution_ns = ns,
                None => warnings.push(format!(
                    "VRAMSHIM_TIME_RESOLUTION={value:?} is not a power of ten from 1ns to 1s \
                     (1ns, 1us, 1ms, 10ms, ...); using 1ns"
                )),
            }
        }
        if let Some(value) = env_str("VRAMSHIM_COMPRESS", &mut warnings) {
            match value.as_str() {
                "1" | "true" | "yes" => config.compress = true,
                "0" | "false" | "no" | "" => {}
                _ => warnings.push(invalid("VRAMSHIM_COMPRESS", &value, "0, 1", "0")),
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

/// A time resolution written as a whole number and a unit (`1ns`, `100us`, `10ms`, `1s`), in
/// nanoseconds, if it is a power of ten from 1 ns to 1 s.
fn time_resolution(value: &str) -> Option<u64> {
    let (digits, unit_ns) = [
        ("ns", 1),
        ("us", 1_000),
        ("ms", 1_000_000),
        ("s", 1_000_000_000),
    ]
    .into_iter()
    .find_map(|(unit, ns)| value.strip_suffix(unit).map(|digits| (digits, ns)))?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let ns = digits.parse::<u64>().ok()?.checked_mul(unit_ns)?;
    let power_of_ten = (0..=9).any(|exponent| ns == 10u64.pow(exponent));
    power_of_ten.then_some(ns)
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

/// A numeric setting and the values it may take.
struct Range {
    name: &'static str,
    min: usize,
    max: usize,
}

/// Deepest native stack kept (the capture buffer's size).
const MAX_FRAMES: Range = Range {
    name: "VRAMSHIM_MAX_FRAMES",
    min: 1,
    max: 256,
};
/// Per-thread buffer: 80 bytes an event, so at most 5 MiB a thread. The writer drains a
/// buffer once it is half full, so a larger one only costs memory.
const BUFFER_EVENTS: Range = Range {
    name: "VRAMSHIM_BUFFER_EVENTS",
    min: 64,
    max: 1 << 16,
};
/// At most a minute between drains (a SIGKILL loses at most that much).
const FLUSH_MS: Range = Range {
    name: "VRAMSHIM_FLUSH_MS",
    min: 1,
    max: 60_000,
};
/// Device memory samples: 0 samples at every event (`vramshim dryrun` asks for that).
const SAMPLE_MS: Range = Range {
    name: "VRAMSHIM_SAMPLE_MS",
    min: 0,
    max: 60_000,
};
/// Flight-recorder window: 64 bytes an event, so at most 1 GiB.
const RING_EVENTS: Range = Range {
    name: "VRAMSHIM_RING_EVENTS",
    min: 16,
    max: 1 << 24,
};

/// Reads a whole number in `range`. Text that is no number gets the default; a number
/// outside the range (too large for any integer included) gets the nearest end of it.
/// Either way with one warning.
fn number(range: Range, default: usize, warnings: &mut Vec<String>) -> usize {
    match env_str(range.name, warnings) {
        Some(value) => in_range(&range, &value, default, warnings),
        None => default,
    }
}

/// [`number`] for the text `value`.
fn in_range(range: &Range, value: &str, default: usize, warnings: &mut Vec<String>) -> usize {
    let &Range { name, min, max } = range;
    let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
    if !digits {
        warnings.push(format!(
            "{name}={value:?} is not a whole number from {min} to {max}; using {default}"
        ));
        return default;
    }
    // All digits: a parse error can only mean it overflows, which is above the maximum.
    let n = value.parse::<usize>().unwrap_or(usize::MAX);
    if n < min {
        warnings.push(format!(
            "{name}={value:?} is below the minimum {min}; using {min}"
        ));
        min
    } else if n > max {
        warnings.push(format!(
            "{name}={value:?} is above the maximum {max}; using {max}"
        ));
        max
    } else {
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(range: &Range, value: &str) -> (usize, Vec<String>) {
        let mut warnings = Vec::new();
        let n = in_range(range, value, 8192, &mut warnings);
        (n, warnings)
    }

    #[test]
    fn numbers_outside_the_range_get_its_nearest_end_with_one_warning() {
        assert_eq!(read(&BUFFER_EVENTS, "4096"), (4096, vec![]));
        assert_eq!(read(&BUFFER_EVENTS, "65536"), (65536, vec![]));
        assert_eq!(
            read(&BUFFER_EVENTS, "16777216"),
            (
                65536,
                vec![
                    "VRAMSHIM_BUFFER_EVENTS=\"16777216\" is above the maximum 65536; using 65536"
                        .to_owned()
                ]
            )
        );
        let (n, warnings) = read(&RING_EVENTS, "99999999999999999999999999");
        assert_eq!((n, warnings.len()), (1 << 24, 1));
        let (n, warnings) = read(&FLUSH_MS, "0");
        assert_eq!((n, warnings.len()), (1, 1));
        assert!(warnings[0].contains("below the minimum 1"), "{warnings:?}");
        let (n, warnings) = read(&MAX_FRAMES, "0");
        assert_eq!((n, warnings.len()), (1, 1));
        let (n, warnings) = read(&MAX_FRAMES, "257");
        assert_eq!((n, warnings.len()), (256, 1));
    }

    #[test]
    fn time_resolutions_are_powers_of_ten_from_1ns_to_1s() {
        let cases = [
            ("1ns", Some(1)),
            ("10ns", Some(10)),
            ("1us", Some(1_000)),
            ("100us", Some(100_000)),
            ("1ms", Some(1_000_000)),
            ("10ms", Some(10_000_000)),
            ("1000us", Some(1_000_000)),
            ("1s", Some(1_000_000_000)),
            ("10s", None),
            ("0ns", None),
            ("2ms", None),
            ("10", None),
            ("ms", None),
            ("-1ms", None),
            ("1.5ms", None),
            ("10 ms", None),
            ("10MS", None),
            ("99999999999999999999ns", None),
        ];
        for (text, expected) in cases {
            assert_eq!(time_resolution(text), expected, "{text:?}");
        }
    }

    #[test]
    fn text_that_is_no_number_gets_the_default_with_one_warning() {
        for value in ["", "abc", "-5", "1e6", "0x100", "12 34"] {
            let (n, warnings) = read(&BUFFER_EVENTS, value);
            assert_eq!((n, warnings.len()), (8192, 1), "{value:?}");
            assert!(warnings[0].contains("not a whole number from 64 to 65536"));
        }
    }
}

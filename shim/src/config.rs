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

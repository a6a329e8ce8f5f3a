//! A progress bar on stderr for long work through logs.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// A progress bar on stderr for long work through logs (a replay, a compaction), shown only
/// when stderr is a terminal and the work lasts over half a second.
pub struct Progress {
    /// What is being done, as the bar says it ("replaying").
    verb: &'static str,
    total_bytes: u64,
    started: Instant,
    shown: bool,
    enabled: bool,
    last: Instant,
}

impl Progress {
    /// A bar for `total_bytes` of work, drawn by [`Progress::update`] (never for 0 bytes).
    pub fn new(verb: &'static str, total_bytes: u64) -> Progress {
        let now = Instant::now();
        Progress {
            verb,
            total_bytes,
            started: now,
            shown: false,
            enabled: std::io::stderr().is_terminal() && total_bytes > 0,
            last: now,
        }
    }

    /// Redraws the bar at `done_bytes` of the total (at most 10 times a second).
    pub fn update(&mut self, done_bytes: u64) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        // Short work finishes before a bar would help; redraw at most 10 times a second.
        if now.duration_since(self.started) < Duration::from_millis(500)
            || now.duration_since(self.last) < Duration::from_millis(100)
        {
            return;
        }
        self.last = now;
        let fraction = (done_bytes as f64 / self.total_bytes as f64).min(1.0);
        let width = 30;
        let filled = (fraction * width as f64) as usize;
        let mut stderr = std::io::stderr().lock();
        let elapsed = now.duration_since(self.started).as_secs_f64();
        let left = if fraction > 0.0 {
            elapsed * (1.0 - fraction) / fraction
        } else {
            0.0
        };
        let _ = write!(
            stderr,
            "\rvramshim: {} [{}{}] {:3.0}% of {}, about {:.0} s left ",
            self.verb,
            "#".repeat(filled),
            " ".repeat(width - filled),
            fraction * 100.0,
            crate::units::bytes(self.total_bytes),
            left.ceil()
        );
        let _ = stderr.flush();
        self.shown = true;
    }

    /// Clears the bar, if one was drawn (and is drawn no more).
    pub fn finish(&mut self) {
        if self.shown {
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\r{:90}\r", "");
            let _ = stderr.flush();
            self.shown = false;
        }
        self.enabled = false;
    }
}

impl Drop for Progress {
    /// Work given up half way (an error returned) leaves no bar behind its message.
    fn drop(&mut self) {
        self.finish();
    }
}

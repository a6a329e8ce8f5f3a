//! Allocator settings: what `PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF` can set, plus the
//! two limits that come from elsewhere (the memory fraction and the device capacity).

use std::fmt::Write as _;

use crate::{KIB, LARGE_BUFFER, MIB};

/// Number of size intervals `roundup_power2_divisions` distinguishes: one per power of two
/// from 1 MiB up, the last one open-ended (`[1 MiB, 2 MiB)`, …, `[32 GiB, ∞)`; sizes below
/// 1 MiB use the first interval).
pub const ROUNDUP_INTERVALS: usize = 16;

/// Everything that changes how the caching allocator behaves.
///
/// Build one with [`Config::parse`] from a `PYTORCH_CUDA_ALLOC_CONF` string, then set
/// [`memory_fraction`](Config::memory_fraction) and [`capacity`](Config::capacity), which
/// PyTorch takes from `torch.cuda.set_per_process_memory_fraction` and from the device rather
/// than from the environment.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `max_split_size_mb`, in bytes: cached blocks of at least this size are never split, and
    /// a request below it never takes one. `None` (the default) means unlimited.
    pub max_split_size: Option<u64>,
    /// `max_non_split_rounding_mb`, in bytes: a request of at least `max_split_size` does not
    /// take a cached block this much larger or more. Default 20 MiB; only used together with
    /// `max_split_size`.
    pub max_non_split_rounding: u64,
    /// `roundup_power2_divisions`, one entry per size interval (see [`ROUNDUP_INTERVALS`]):
    /// `d > 1` rounds a request in that interval up to the next of `d` equal steps between the
    /// surrounding powers of two; 0 or 1 leaves the plain 512-byte rounding. Default all 0.
    pub roundup_power2_divisions: [u32; ROUNDUP_INTERVALS],
    /// `expandable_segments`: one growing segment per stream and pool instead of one
    /// `cudaMalloc` per segment.
    pub expandable_segments: bool,
    /// `garbage_collection_threshold`, in (0, 1). Has an effect only together with
    /// [`memory_fraction`](Config::memory_fraction), as in PyTorch.
    pub garbage_collection_threshold: Option<f64>,
    /// `torch.cuda.set_per_process_memory_fraction(f)`, in [0, 1]: the allocator refuses to
    /// reserve more than `f × capacity`. `None` = not set.
    pub memory_fraction: Option<f64>,
    /// Device memory the allocator can obtain, in bytes: a `cudaMalloc` (or the physical
    /// pages of an expandable segment) fails when reserved memory would exceed it. Default
    /// `u64::MAX` (never fails). Also sizes the address space of an expandable segment, which
    /// PyTorch makes 9/8 of the device's total memory.
    pub capacity: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_split_size: None,
            max_non_split_rounding: LARGE_BUFFER,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            expandable_segments: false,
            garbage_collection_threshold: None,
            memory_fraction: None,
            capacity: u64::MAX,
        }
    }
}

/// Keys PyTorch accepts that do not change the device caching allocator; `parse` checks
/// their value's shape and otherwise ignores them.
const IGNORED_BOOL_KEYS: &[&str] = &[
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_use_background_threads",
    "graph_capture_record_stream_reuse",
];
const IGNORED_INT_KEYS: &[&str] = &[
    "pinned_num_register_threads",
    "pinned_reserve_segment_size_mb",
];

impl Config {
    /// Parses allocator settings in `PYTORCH_CUDA_ALLOC_CONF` syntax, e.g.
    /// `"expandable_segments:True,max_split_size_mb:128"`,
    /// `"roundup_power2_divisions:[256:1,512:2,>:4]"`, `"roundup_power2_divisions:4"`,
    /// `"garbage_collection_threshold:0.6"`, `"backend:native"`. Spaces are ignored and an
    /// empty string gives the defaults, as in PyTorch; a key given twice keeps its last value.
    ///
    /// Checks values the way PyTorch does (`max_split_size_mb` and
    /// `max_non_split_rounding_mb` ≥ 20, divisions and intervals powers of two, threshold in
    /// (0, 1), `True`/`False` spelled exactly). Keys that do not affect device memory
    /// (`release_lock_on_cudamalloc`, the `pinned_*` keys, …) are accepted and ignored;
    /// `backend:cudaMallocAsync` and unknown keys are errors naming the key.
    /// [`memory_fraction`](Config::memory_fraction) and [`capacity`](Config::capacity) keep
    /// their defaults.
    pub fn parse(conf: &str) -> Result<Config, String> {
        let tokens = lex(conf);
        let mut cfg = Config::default();
        let mut p = Parser {
            tokens: &tokens,
            i: 0,
        };
        while p.i < tokens.len() {
            let key = p.next_word("a key")?;
            p.expect(':', key)?;
            match key {
                "max_split_size_mb" => {
                    let mb = p.mib_at_least_20(key)?;
                    cfg.max_split_size = Some(mb.saturating_mul(MIB));
                }
                "max_non_split_rounding_mb" => {
                    let mb = p.mib_at_least_20(key)?;
                    cfg.max_non_split_rounding = mb.saturating_mul(MIB);
                }
                "garbage_collection_threshold" => {
                    let v = p.next_word(key)?;
                    let t: f64 = v
                        .parse()
                        .map_err(|_| format!("{key}: '{v}' is not a number"))?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(format!("{key}: {v} is not in (0.0, 1.0)"));
                    }
                    cfg.garbage_collection_threshold = Some(t);
                }
                "roundup_power2_divisions" => {
                    cfg.roundup_power2_divisions = p.divisions()?;
                }
                "expandable_segments" => cfg.expandable_segments = p.boolean(key)?,
                "backend" => {
                    let v = p.next_word(key)?;
                    match v {
                        "native" => {}
                        "cudaMallocAsync" | "hipMallocAsync" => {
                            return Err(format!(
                                "backend:{v} is not modelled (the simulator models backend:native)"
                            ));
                        }
                        _ => {
                            return Err(format!(
                                "backend: unknown allocator backend '{v}' (options are native and cudaMallocAsync)"
                            ));
                        }
                    }
                }
                k if IGNORED_BOOL_KEYS.contains(&k) => {
                    p.boolean(k)?;
                }
                k if IGNORED_INT_KEYS.contains(&k) => {
                    let v = p.next_word(k)?;
                    v.parse::<u64>()
                        .map_err(|_| format!("{k}: '{v}' is not a whole number"))?;
                }
                other => return Err(format!("unrecognized allocator option '{other}'")),
            }
            if p.i < tokens.len() {
                p.expect(',', key)?;
                if p.i == tokens.len() {
                    return Err("trailing ',' at the end of the settings".to_string());
                }
            }
        }
        Ok(cfg)
    }

    /// Writes the settings that `PYTORCH_CUDA_ALLOC_CONF` can carry, leaving out defaults, so
    /// that `Config::parse(&c.to_conf_string())` gives `c` back with `memory_fraction` and
    /// `capacity` at their defaults (an empty string for the default settings). Sizes are
    /// written in whole MiB, rounded down.
    pub fn to_conf_string(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        if self.expandable_segments {
            parts.push("expandable_segments:True".to_string());
        }
        if let Some(m) = self.max_split_size {
            parts.push(format!("max_split_size_mb:{}", m / MIB));
        }
        if self.max_non_split_rounding != LARGE_BUFFER {
            parts.push(format!(
                "max_non_split_rounding_mb:{}",
                self.max_non_split_rounding / MIB
            ));
        }
        let d = &self.roundup_power2_divisions;
        if d.iter().all(|&x| x == d[0]) {
            if d[0] != 0 {
                parts.push(format!("roundup_power2_divisions:{}", d[0]));
            }
        } else {
            let mut s = String::from("roundup_power2_divisions:[");
            for (i, v) in d.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                let _ = write!(s, "{}:{}", 1u64 << i, v);
            }
            s.push(']');
            parts.push(s);
        }
        if let Some(t) = self.garbage_collection_threshold {
            parts.push(format!("garbage_collection_threshold:{t}"));
        }
        parts.join(",")
    }

    /// Checks the values a [`Simulator`](crate::Simulator) relies on: divisions are 0 or
    /// powers of two, the threshold lies in (0, 1), the fraction in [0, 1],
    /// `max_split_size` is at least 20 MiB and `max_non_split_rounding` is at least 1 KiB.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(m) = self.max_split_size
            && m < LARGE_BUFFER
        {
            return Err(format!("max_split_size {m} is below 20 MiB"));
        }
        if self.max_non_split_rounding < KIB {
            return Err(format!(
                "max_non_split_rounding {} is below 1 KiB",
                self.max_non_split_rounding
            ));
        }
        for &d in &self.roundup_power2_divisions {
            if d != 0 && !d.is_power_of_two() {
                return Err(format!(
                    "roundup_power2_divisions {d} is not a power of two"
                ));
            }
        }
        if let Some(t) = self.garbage_collection_threshold
            && !(t > 0.0 && t < 1.0)
        {
            return Err(format!("garbage_collection_threshold {t} is not in (0, 1)"));
        }
        if let Some(f) = self.memory_fraction
            && !(0.0..=1.0).contains(&f)
        {
            return Err(format!("memory_fraction {f} is not in [0, 1]"));
        }
        Ok(())
    }

    /// The divisions that apply to a rounded-to-512 request of `size` bytes (PyTorch's
    /// `roundup_power2_divisions(size)`): interval `floor(log2(size)) − 20`, clamped to
    /// `0..=15`.
    pub fn divisions_for(&self, size: u64) -> u32 {
        let log = 63 - size.max(1).leading_zeros() as usize;
        let idx = log.saturating_sub(20).min(ROUNDUP_INTERVALS - 1);
        self.roundup_power2_divisions[idx]
    }

    /// The most the allocator may reserve: `memory_fraction × capacity` when a fraction is
    /// set (PyTorch's `allowed_memory_maximum`), else `None`.
    pub fn allowed_maximum(&self) -> Option<u64> {
        self.memory_fraction
            .map(|f| (f * self.capacity as f64) as u64)
    }

    /// Whether garbage collection runs: a threshold and a memory fraction are both set.
    pub fn gc_enabled(&self) -> bool {
        self.memory_fraction.is_some() && self.garbage_collection_threshold.is_some_and(|t| t > 0.0)
    }
}

/// Splits like PyTorch's lexer: `,` `:` `[` `]` are tokens of their own, spaces vanish.
fn lex(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut buf = String::new();
    for ch in s.chars() {
        match ch {
            ',' | ':' | '[' | ']' => {
                if !buf.is_empty() {
                    out.push(std::mem::take(&mut buf));
                }
                out.push(ch.to_string());
            }
            ' ' => {}
            _ => buf.push(ch),
        }
    }
    if !buf.is_empty() {
        out.push(buf);
    }
    out
}

struct Parser<'a> {
    tokens: &'a [String],
    i: usize,
}

fn is_punct(t: &str) -> bool {
    matches!(t, "," | ":" | "[" | "]")
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<&'a str> {
        self.tokens.get(self.i).map(|s| s.as_str())
    }

    /// The next token, which must be a word (not punctuation).
    fn next_word(&mut self, what: &str) -> Result<&'a str, String> {
        match self.peek() {
            Some(t) if !is_punct(t) => {
                self.i += 1;
                Ok(t)
            }
            Some(t) => Err(format!("{what}: expected a value, found '{t}'")),
            None => Err(format!("{what}: expected a value, found the end")),
        }
    }

    fn expect(&mut self, c: char, after: &str) -> Result<(), String> {
        match self.peek() {
            Some(t) if t.len() == 1 && t.starts_with(c) => {
                self.i += 1;
                Ok(())
            }
            Some(t) => Err(format!("after '{after}': expected '{c}', found '{t}'")),
            None => Err(format!("after '{after}': expected '{c}', found the end")),
        }
    }

    fn boolean(&mut self, key: &str) -> Result<bool, String> {
        match self.next_word(key)? {
            "True" => Ok(true),
            "False" => Ok(false),
            v => Err(format!("{key}: expected True or False, found '{v}'")),
        }
    }

    fn mib_at_least_20(&mut self, key: &str) -> Result<u64, String> {
        let v = self.next_word(key)?;
        let mb: u64 = v
            .parse()
            .map_err(|_| format!("{key}: '{v}' is not a whole number of MiB"))?;
        if mb < LARGE_BUFFER / MIB {
            return Err(format!("{key}: {mb} is too small, must be >= 20"));
        }
        Ok(mb)
    }

    /// `N` (every interval) or `[MB:N, …, >:N]`, as in PyTorch (newest rules: the first
    /// entry also fills the intervals below it; `>` fills the intervals above the last one).
    fn divisions(&mut self) -> Result<[u32; ROUNDUP_INTERVALS], String> {
        const KEY: &str = "roundup_power2_divisions";
        let mut out = [0u32; ROUNDUP_INTERVALS];
        if self.peek() == Some("[") {
            self.i += 1;
            let mut first = true;
            let mut last_index = 0usize;
            loop {
                if self.peek() == Some("]") {
                    self.i += 1;
                    break;
                }
                let interval = self.next_word(KEY)?;
                self.expect(':', interval)?;
                let v = self.next_word(KEY)?;
                let d: u32 = v
                    .parse()
                    .map_err(|_| format!("{KEY}: '{v}' is not a whole number"))?;
                if d != 0 && !d.is_power_of_two() {
                    return Err(format!("{KEY}: divisions {d} must be a power of 2 or 0"));
                }
                if interval == ">" {
                    for x in out.iter_mut().skip(last_index + 1) {
                        *x = d;
                    }
                } else {
                    let mb: u64 = interval.parse().map_err(|_| {
                        format!("{KEY}: interval '{interval}' is not a whole number of MiB or '>'")
                    })?;
                    if !mb.is_power_of_two() {
                        return Err(format!("{KEY}: interval {mb} must be a power of 2"));
                    }
                    let idx = (mb.trailing_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
                    if first {
                        for x in out.iter_mut().take(idx) {
                            *x = d;
                        }
                        first = false;
                    }
                    out[idx] = d;
                    last_index = idx;
                }
                match self.peek() {
                    Some("]") => {}
                    Some(",") => self.i += 1,
                    Some(t) => return Err(format!("{KEY}: expected ',' or ']', found '{t}'")),
                    None => return Err(format!("{KEY}: missing ']'")),
                }
            }
        } else {
            let v = self.next_word(KEY)?;
            let d: u32 = v
                .parse()
                .map_err(|_| format!("{KEY}: '{v}' is not a whole number"))?;
            if !d.is_power_of_two() {
                return Err(format!("{KEY}: divisions {d} must be a power of 2"));
            }
            out = [d; ROUNDUP_INTERVALS];
        }
        Ok(out)
    }
}

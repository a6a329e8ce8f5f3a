//! Arbitrary bytes as a whole log: opening and reading to the end must terminate and never
//! panic, and how the input arrives (in one piece or a few bytes per `read`) must not change
//! what is decoded.
#![no_main]

use std::io::Read;

use libfuzzer_sys::fuzz_target;
use vramshim_format::{Item, LogReader};

/// Hands out at most `step` bytes per `read` call.
struct Trickle<'a> {
    bytes: &'a [u8],
    step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.bytes.len().min(buf.len()).min(self.step);
        buf[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        Ok(n)
    }
}

fn read_all(source: impl Read) -> Option<(Vec<Item>, u64)> {
    let mut reader = LogReader::new(source).ok()?;
    let mut items = Vec::new();
    let mut last_offset = reader.offset();
    while let Some(item) = reader.next() {
        items.push(item);
        assert!(reader.offset() >= last_offset, "offset went backwards");
        last_offset = reader.offset();
    }
    // A finished reader stays finished.
    assert!(reader.next().is_none());
    Some((items, reader.offset()))
}

fuzz_target!(|data: &[u8]| {
    let whole = read_all(data);
    if let Some((_, offset)) = &whole {
        assert_eq!(*offset, data.len() as u64, "reader stopped before the end");
    }
    // Only for some inputs: `BufReader` zeroes its 1 MiB buffer for a plain `Read`, which
    // would dominate every run.
    let last = data.last().copied().unwrap_or(0);
    if last % 8 == 0 {
        let step = 1 + usize::from(last / 8 % 16);
        let trickled = read_all(Trickle { bytes: data, step });
        assert_eq!(
            whole, trickled,
            "result depends on read sizes (step {step})"
        );
    }
});

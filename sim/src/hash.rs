//! A small, fast hasher for the id → block map (request ids are integers; SipHash would
//! cost more than the rest of a request).

use std::hash::{BuildHasherDefault, Hasher};

/// Multiply-rotate hashing of integer keys (the FxHash scheme).
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

const K: u64 = 0xf135_7aea_2e62_a9c5;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // Mix the high bits down: hashbrown takes its bucket from the low bits and its tag
        // from the top ones.
        self.0.rotate_left(26)
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.wrapping_add(n)).wrapping_mul(K);
    }
}

/// `HashMap` builder using [`IdHasher`].
pub(crate) type BuildIdHasher = BuildHasherDefault<IdHasher>;

//! LEB128 variable-length integers and the zigzag mapping for signed deltas.

use std::mem::MaybeUninit;

/// Appends `value` as unsigned LEB128, a byte at a time: for a value or two (a record's
/// fields, a definition's) as cheap as [`Room`]'s word stores, with no room to set up.
#[inline]
pub fn put_u64(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Appends `value` zigzag-mapped, so small negative numbers stay short.
#[inline]
pub fn put_i64(out: &mut Vec<u8>, value: i64) {
    put_u64(out, zigzag(value));
}

/// The zigzag mapping of a signed delta: small magnitudes, either sign, map to small numbers.
#[inline(always)]
pub(crate) fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

/// The longest record a [`Room`] takes: its writes land at their position modulo this (a power
/// of two), so that the compiler drops their bounds checks; every record written through one
/// is shorter (an event's at most `MAX_EVENT_BYTES`, record.rs).
pub(crate) const ROOM_RECORD: usize = 128;
/// A [`Room`]'s bytes: a record's, then the slack of one 8-byte store begun at its last byte.
const ROOM_BYTES: usize = ROOM_RECORD + 8;

/// Where one record's bytes are written before they join a payload: `out`'s spare capacity,
/// written in place. A varint is written as one unaligned 8-byte store and its length added,
/// not byte by byte with a length and capacity check for each (the writer's largest encoding
/// cost).
pub(crate) struct Room<'a> {
    bytes: &'a mut [MaybeUninit<u8>; ROOM_BYTES],
    /// Bytes written; `bytes[..len]` are all initialised, and `len < ROOM_BYTES`.
    len: usize,
}

/// Appends the record `write` puts in a [`Room`] (at most [`ROOM_RECORD`] bytes) to `out`: in
/// place when `out` has the room's bytes to spare (a payload buffer nearly always has), else
/// through a buffer on the stack, so that `out` grows only as pushing each byte would.
#[inline(always)]
pub(crate) fn append<R>(out: &mut Vec<u8>, write: impl FnOnce(&mut Room<'_>) -> R) -> R {
    let mut local = [MaybeUninit::<u8>::uninit(); ROOM_BYTES];
    let start = out.len();
    let (bytes, in_place) = match out.spare_capacity_mut().first_chunk_mut::<ROOM_BYTES>() {
        Some(spare) => (spare, true),
        None => (&mut local, false),
    };
    let mut room = Room { bytes, len: 0 };
    let result = write(&mut room);
    let written = room.len;
    if in_place {
        // SAFETY: `room` held `out`'s spare capacity from `start` on, and its first `written`
        // bytes are initialised (Room's invariant); `written < ROOM_BYTES` fits that capacity.
        unsafe { out.set_len(start + written) };
    } else {
        // SAFETY: the first `written` bytes of `local` are initialised (Room's invariant), and
        // `written < ROOM_BYTES`, its length.
        let bytes = unsafe { std::slice::from_raw_parts(local.as_ptr().cast::<u8>(), written) };
        out.extend_from_slice(bytes);
    }
    result
}

impl Room<'_> {
    /// Appends `len` (1 to 8) bytes: `word`'s low bytes, little-endian first. Its other bytes
    /// land in the room past them and are overwritten by the next write or left out.
    #[inline(always)]
    pub(crate) fn put_word(&mut self, word: u64, len: usize) {
        // `at + 8 <= ROOM_BYTES` whatever `self.len`: no bounds check, no panic. A record
        // longer than `ROOM_RECORD` would wrap (garbage, never unsound); none is.
        let at = self.len % ROOM_RECORD;
        let slot = &mut self.bytes[at..at + 8];
        // SAFETY: `slot` is 8 bytes long, so an unaligned store of 8 bytes stays within it
        // (one store, where writing the bytes one by one is eight).
        unsafe {
            slot.as_mut_ptr()
                .cast::<[u8; 8]>()
                .write_unaligned(word.to_le_bytes())
        };
        // `bytes[..at + len]` are initialised: those before `at` by earlier writes.
        self.len = at + len.min(8);
    }

    /// Sets the byte at `at`, written before (a record's field known only once the rest is
    /// written).
    #[inline(always)]
    pub(crate) fn set(&mut self, at: usize, byte: u8) {
        debug_assert!(at < self.len);
        self.bytes[at % ROOM_RECORD].write(byte);
    }

    /// As [`put_u64`]. Values of up to four bytes (most of an event's: time and size deltas,
    /// ids) take a compare each and a few shifts, longer ones (address deltas, often) their
    /// byte count from the leading zeros; no loop over the bytes.
    #[inline(always)]
    pub(crate) fn put_u64(&mut self, value: u64) {
        if value < 1 << 7 {
            self.put_word(value, 1);
        } else if value < 1 << 14 {
            self.put_word((value & 0x7f) | (value << 1 & 0x7f00) | 0x80, 2);
        } else if value < 1 << 21 {
            self.put_word(spread_28_bits(value) | 0x8080, 3);
        } else if value < 1 << 28 {
            self.put_word(spread_28_bits(value) | 0x80_8080, 4);
        } else if value < 1 << 56 {
            let bits = 64 - value.leading_zeros() as usize;
            // `bits.div_ceil(7)` (5 to 8 here), by a multiplication and a shift.
            let len = (bits * 9 + 64) >> 6;
            // The continuation bit of every byte but the last.
            let more = 0x0080_8080_8080_8080u64 >> (64 - 8 * len);
            let spread = spread_28_bits(value & 0x0fff_ffff) | spread_28_bits(value >> 28) << 32;
            self.put_word(spread | more, len);
        } else {
            let (low, high) = huge_leb128(value);
            self.put_word(low, 8);
            // The top 8 bits: one byte, or two when the top one is set.
            self.put_word(high, 1 + (value >> 63) as usize);
        }
    }

    /// As [`put_i64`].
    #[inline(always)]
    pub(crate) fn put_i64(&mut self, value: i64) {
        self.put_u64(zigzag(value));
    }
}

/// The LEB128 bytes of a value of 2^56 or more (nine or ten; rare): the first eight, then the
/// rest. Out of line and returning its words, so that the writer of short values keeps its
/// room in registers.
#[cold]
#[inline(never)]
fn huge_leb128(value: u64) -> (u64, u64) {
    let low = spread_28_bits(value & 0x0fff_ffff) | spread_28_bits(value >> 28) << 32;
    let high = value >> 56;
    (
        low | 0x8080_8080_8080_8080,
        (high & 0x7f) | (high << 1 & 0x7f00) | u64::from(high >= 0x80) << 7,
    )
}

/// `value`'s low 28 bits, each group of 7 in a byte of its own (lowest first), the top bit of
/// each byte clear: halves of 14 bits, then groups of 7, each moved up by a shift.
#[inline(always)]
fn spread_28_bits(value: u64) -> u64 {
    let halves = (value & 0x3fff) | (value << 2 & 0x3fff_0000);
    (halves & 0x007f_007f) | (halves << 1 & 0x7f00_7f00)
}

/// Appends a length-prefixed byte string.
pub fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u64(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Why a record could not be decoded from a chunk that passed its checksum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

/// A cursor over one chunk's payload.
pub struct Cursor<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, pos: 0 }
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.bytes.len()
    }

    /// Bytes read so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    #[inline]
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        let byte = *self
            .bytes
            .get(self.pos)
            .ok_or(DecodeError("record runs past the end of its chunk"))?;
        self.pos += 1;
        Ok(byte)
    }

    #[inline(always)]
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        // Most values (flags, deltas, small ids) fit one byte: decode those without the loop.
        if let Some(&byte) = self.bytes.get(self.pos)
            && byte < 0x80
        {
            self.pos += 1;
            return Ok(u64::from(byte));
        }
        // Two bytes (time deltas of a few microseconds) without the loop too.
        if let Some(&[low, high]) = self.bytes.get(self.pos..self.pos + 2)
            && high < 0x80
        {
            self.pos += 2;
            return Ok(u64::from(low & 0x7f) | u64::from(high) << 7);
        }
        self.u64_multibyte()
    }

    fn u64_multibyte(&mut self) -> Result<u64, DecodeError> {
        let mut value = 0u64;
        let mut shift = 0u32;
        loop {
            let byte = self.u8()?;
            if shift == 63 && byte > 1 {
                return Err(DecodeError("varint overflows 64 bits"));
            }
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
            shift += 7;
            if shift > 63 {
                return Err(DecodeError("varint longer than 10 bytes"));
            }
        }
    }

    #[inline]
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        u32::try_from(self.u64()?).map_err(|_| DecodeError("value does not fit 32 bits"))
    }

    #[inline]
    pub fn i64(&mut self) -> Result<i64, DecodeError> {
        let raw = self.u64()?;
        Ok(((raw >> 1) as i64) ^ -((raw & 1) as i64))
    }

    pub fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = usize::try_from(self.u64()?).map_err(|_| DecodeError("length too large"))?;
        let end = self
            .pos
            .checked_add(len)
            .filter(|&end| end <= self.bytes.len())
            .ok_or(DecodeError("byte string runs past the end of its chunk"))?;
        let slice = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(slice)
    }

    pub fn string(&mut self) -> Result<String, DecodeError> {
        Ok(String::from_utf8_lossy(self.bytes()?).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_extremes() {
        let values = [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX];
        let signed = [0i64, -1, 1, i64::MIN, i64::MAX, -300];
        let mut out = Vec::new();
        for &v in &values {
            put_u64(&mut out, v);
        }
        for &v in &signed {
            put_i64(&mut out, v);
        }
        let mut cursor = Cursor::new(&out);
        for &v in &values {
            assert_eq!(cursor.u64().unwrap(), v);
        }
        for &v in &signed {
            assert_eq!(cursor.i64().unwrap(), v);
        }
        assert!(cursor.is_empty());
    }

    /// Unsigned LEB128 a byte at a time: what [`put_u64`] must write.
    fn leb128_plainly(mut value: u64) -> Vec<u8> {
        let mut out = Vec::new();
        while value >= 0x80 {
            out.push((value as u8) | 0x80);
            value >>= 7;
        }
        out.push(value as u8);
        out
    }

    #[test]
    fn a_room_writes_varints_of_every_length_as_a_byte_at_a_time_would() {
        // Every power of two, one less and one more: each length's bounds, 1 to 10 bytes.
        let mut values: Vec<u64> = (0..64)
            .flat_map(|bit| {
                let power = 1u64 << bit;
                [power - 1, power, power + 1]
            })
            .collect();
        values.extend([
            u64::MAX,
            u64::MAX - 1,
            i64::MAX as u64,
            0x0123_4567_89ab_cdef,
        ]);
        for value in values {
            let expected = leb128_plainly(value);
            let mut plain = vec![0xaa];
            put_u64(&mut plain, value);
            assert_eq!(plain[1..], expected[..], "{value:#x}");
            // A room in place (room to spare), and on the stack (none).
            let mut roomy = Vec::with_capacity(256);
            roomy.push(0xaa);
            append(&mut roomy, |room| room.put_u64(value));
            assert_eq!(roomy[1..], expected[..], "{value:#x}");
            let mut tight = vec![0xaa];
            tight.shrink_to_fit();
            append(&mut tight, |room| room.put_u64(value));
            assert_eq!(tight[1..], expected[..], "{value:#x}");
            // Within a record, after other fields.
            let mut record = Vec::new();
            append(&mut record, |room| {
                room.put_u64(300);
                room.put_u64(value);
                room.put_i64(-1);
            });
            let mut fields = leb128_plainly(300);
            fields.extend(&expected);
            fields.push(1);
            assert_eq!(record, fields, "{value:#x}");
            assert_eq!(Cursor::new(&roomy[1..]).u64(), Ok(value));
        }
        for (value, bytes) in [
            (-1i64, 1),
            (i64::MIN, 10),
            (i64::MAX, 10),
            (-64, 1),
            (-65, 2),
        ] {
            let mut out = Vec::new();
            append(&mut out, |room| room.put_i64(value));
            assert_eq!(out, leb128_plainly(zigzag(value)));
            assert_eq!(out.len(), bytes);
        }
    }

    #[test]
    fn a_record_s_flag_byte_is_set_after_its_fields() {
        let mut out = vec![7];
        append(&mut out, |room| {
            room.put_word(0x10, 2);
            room.put_u64(u64::MAX);
            room.set(1, 0x81);
        });
        let mut expected = vec![7, 0x10, 0x81];
        expected.extend(leb128_plainly(u64::MAX));
        assert_eq!(out, expected);
    }

    #[test]
    fn rejects_overlong_varints() {
        let bytes = [0xffu8; 11];
        assert!(Cursor::new(&bytes).u64().is_err());
        assert!(Cursor::new(&[0x80]).u64().is_err());
    }
}

//! LEB128 variable-length integers and the zigzag mapping for signed deltas.

/// Appends `value` as unsigned LEB128.
#[inline]
pub fn put_u64(out: &mut Vec<u8>, value: u64) {
    leb128(value, |byte| out.push(byte));
}

/// Appends `value` zigzag-mapped, so small negative numbers stay short.
#[inline]
pub fn put_i64(out: &mut Vec<u8>, value: i64) {
    put_u64(out, zigzag(value));
}

/// `value`'s unsigned LEB128 bytes, each handed to `push` in order (to a `Vec`, or to a record
/// built on the stack).
#[inline(always)]
pub(crate) fn leb128(mut value: u64, mut push: impl FnMut(u8)) {
    while value >= 0x80 {
        push((value as u8) | 0x80);
        value >>= 7;
    }
    push(value as u8);
}

/// The zigzag mapping of a signed delta: small magnitudes, either sign, map to small numbers.
#[inline(always)]
pub(crate) fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
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

    #[test]
    fn rejects_overlong_varints() {
        let bytes = [0xffu8; 11];
        assert!(Cursor::new(&bytes).u64().is_err());
        assert!(Cursor::new(&[0x80]).u64().is_err());
    }
}

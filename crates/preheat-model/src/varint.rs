//! LEB128 unsigned varints and a bounds-checked byte reader used by the file format.
//!
//! The reader never panics, checked by clippy: no indexing or slicing that could go out of
//! bounds, no unwrap/expect/panic (tests excepted).

#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented
    )
)]

/// Append `v` as an unsigned LEB128 varint.
pub fn put_u64(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Number of bytes `put_u64(v)` appends.
pub fn len_u64(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// Why a read failed; converted to [`crate::format::FormatError`] by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// Input ended `needed` bytes early at `offset`.
    Truncated { offset: usize },
    /// A varint longer than 10 bytes or overflowing 64 bits at `offset`.
    BadVarint { offset: usize },
}

/// A cursor over an input slice that never panics.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    pub fn pos(&self) -> usize {
        self.pos
    }
    pub fn remaining(&self) -> usize {
        // `pos <= buf.len()` always (only `bytes`/`array` advance it, by what they read).
        self.buf.len().saturating_sub(self.pos)
    }
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], ReadError> {
        let s = self
            .pos
            .checked_add(n)
            .and_then(|end| self.buf.get(self.pos..end))
            .ok_or(ReadError::Truncated { offset: self.pos })?;
        self.pos += n;
        Ok(s)
    }
    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], ReadError> {
        let a = self
            .buf
            .get(self.pos..)
            .and_then(|rest| rest.first_chunk::<N>())
            .ok_or(ReadError::Truncated { offset: self.pos })?;
        self.pos += N;
        Ok(*a)
    }
    pub fn u8(&mut self) -> Result<u8, ReadError> {
        let [b] = self.array()?;
        Ok(b)
    }
    pub fn u16_le(&mut self) -> Result<u16, ReadError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub fn u32_le(&mut self) -> Result<u32, ReadError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64_le(&mut self) -> Result<u64, ReadError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub fn varint(&mut self) -> Result<u64, ReadError> {
        let start = self.pos;
        let mut v: u64 = 0;
        for i in 0..10 {
            let b = self.u8()?;
            let part = (b & 0x7f) as u64;
            if i == 9 && part > 1 {
                return Err(ReadError::BadVarint { offset: start });
            }
            v |= part << (7 * i);
            if b & 0x80 == 0 {
                // Canonical encodings only: a final zero byte after the first is overlong, and
                // accepting it would give one profile several byte encodings.
                if i > 0 && b == 0 {
                    return Err(ReadError::BadVarint { offset: start });
                }
                return Ok(v);
            }
        }
        Err(ReadError::BadVarint { offset: start })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_edges() {
        for v in [0u64, 1, 127, 128, 16383, 16384, u32::MAX as u64, u64::MAX] {
            let mut out = Vec::new();
            put_u64(&mut out, v);
            assert_eq!(out.len(), len_u64(v));
            let mut r = Reader::new(&out);
            assert_eq!(r.varint().unwrap(), v);
            assert_eq!(r.remaining(), 0);
        }
    }

    #[test]
    fn overlong_varint_rejected() {
        let bytes = [0xffu8; 11];
        assert!(matches!(
            Reader::new(&bytes).varint(),
            Err(ReadError::BadVarint { .. })
        ));
        let mut ten = [0xffu8; 10];
        ten[9] = 0x02; // would overflow 64 bits
        assert!(Reader::new(&ten).varint().is_err());
        assert!(
            Reader::new(&[0x80, 0x00]).varint().is_err(),
            "overlong zero"
        );
    }
}

//! A bounds-checked little-endian reader over untrusted bytes.
//!
//! Every read names what it was reading, so running off the end of the file becomes a
//! [`GgufError::Truncated`] that says which field was cut short. Descriptions are built
//! lazily: the happy path formats nothing.

use std::path::Path;

use super::error::GgufError;

pub(crate) struct Cursor<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    pos: usize,
}

/// Builds the description of the field being read, only when an error needs it.
pub(crate) type What<'w> = &'w dyn Fn() -> String;

impl<'a> Cursor<'a> {
    pub(crate) fn new(path: &'a Path, bytes: &'a [u8]) -> Cursor<'a> {
        Cursor {
            path,
            bytes,
            pos: 0,
        }
    }

    pub(crate) fn path(&self) -> &'a Path {
        self.path
    }

    /// The current offset from the start of the file.
    pub(crate) fn pos(&self) -> u64 {
        self.pos as u64
    }

    pub(crate) fn file_size(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// Bytes left after the current position.
    pub(crate) fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    /// Takes the next `n` bytes, or reports which field `what` the file is too short for.
    pub(crate) fn take(&mut self, n: u64, what: What) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                path: self.path.to_path_buf(),
                what: what(),
                needed: n,
                offset: self.pos(),
                file_size: self.file_size(),
            });
        }
        // `n <= remaining`, so it fits in usize and the range lies inside `bytes`.
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: What) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: What) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u16(&mut self, what: What) -> Result<u16, GgufError> {
        self.array(what).map(u16::from_le_bytes)
    }

    pub(crate) fn u32(&mut self, what: What) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: What) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A GGUF string: u64 byte length, then that many bytes of UTF-8.
    pub(crate) fn string(&mut self, what: What) -> Result<String, GgufError> {
        let len = self.u64(&|| format!("{} (length)", what()))?;
        let start = self.pos();
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(GgufError::InvalidUtf8 {
                path: self.path.to_path_buf(),
                what: what(),
                offset: start + e.valid_up_to() as u64,
            }),
        }
    }

    /// Checks that `count` items of at least `min_item_bytes` each can fit in the rest of
    /// the file, and returns a safe initial capacity for a Vec of them.
    /// `count_offset` is where the count itself was read, for the message.
    pub(crate) fn check_count(
        &self,
        count: u64,
        count_offset: u64,
        min_item_bytes: u64,
        what: What,
    ) -> Result<usize, GgufError> {
        let fits = count
            .checked_mul(min_item_bytes)
            .is_some_and(|total| total <= self.remaining());
        if !fits {
            return Err(GgufError::CountTooLarge {
                path: self.path.to_path_buf(),
                what: what(),
                count,
                min_item_bytes,
                offset: count_offset,
                remaining: self.remaining(),
            });
        }
        // count <= remaining <= usize::MAX, since min_item_bytes >= 1 for every caller;
        // fall back to no preallocation otherwise.
        Ok(usize::try_from(count).unwrap_or(0))
    }
}

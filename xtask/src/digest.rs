//! SHA-256 of files, with a stamp beside each file (`<file>.sha256`) so that a
//! rerun does not hash hundreds of megabytes again: the stamp holds the hash,
//! size and modification time, and is trusted while size and mtime match.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

/// Hex SHA-256 of a file, from its stamp when the stamp is current.
pub fn file_sha256(path: &Path) -> Result<String> {
    let identity = identity(path)?;
    if let Ok(stamp) = fs::read_to_string(stamp_path(path)) {
        if let Some((hash, recorded)) = stamp.split_once(' ') {
            if recorded.trim() == identity {
                return Ok(hash.to_string());
            }
        }
    }
    let hash =
        hash_reader(File::open(path).with_context(|| format!("opening {}", path.display()))?)
            .with_context(|| format!("hashing {}", path.display()))?;
    record(path, &hash)?;
    Ok(hash)
}

/// Write the stamp for a file whose hash was computed elsewhere (e.g. while
/// it was being written).
pub fn record(path: &Path, hash: &str) -> Result<()> {
    let line = format!("{hash} {}\n", identity(path)?);
    fs::write(stamp_path(path), line)
        .with_context(|| format!("writing the hash stamp of {}", path.display()))
}

pub fn hash_reader(mut reader: impl Read) -> io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            return Ok(hex::encode(hasher.finalize()));
        }
        hasher.update(&buf[..n]);
    }
}

/// A writer that hashes what passes through it.
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
        }
    }

    /// The hex digest of everything written, and the inner writer.
    pub fn finish(self) -> (String, W) {
        (hex::encode(self.hasher.finalize()), self.inner)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A hex digest in the unpadded URL-safe base64 form that wheel RECORD files use.
pub fn hex_to_record_form(hex_digest: &str) -> Result<String> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes = hex::decode(hex_digest).context("invalid hex digest")?;
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    Ok(out)
}

fn stamp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".sha256");
    path.with_file_name(name)
}

fn identity(path: &Path) -> Result<String> {
    let meta = fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    Ok(format!("{} {mtime}", meta.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_form_matches_python() {
        // base64.urlsafe_b64encode(hashlib.sha256(b"").digest()).rstrip(b"=")
        let empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(
            hex_to_record_form(empty).unwrap(),
            "47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"
        );
    }
}

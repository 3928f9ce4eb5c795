//! Disk read throughput of the filesystem holding the model, measured by reading the model
//! file itself with the page cache bypassed (O_DIRECT on Linux and Android, F_NOCACHE on
//! macOS, FILE_FLAG_NO_BUFFERING on Windows). Nothing is written, and the user's page cache
//! is left as it is.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

/// Sequential and random read rates, in bytes per second.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct DiskRates {
    pub seq_bytes_per_s: f64,
    pub rand_bytes_per_s: f64,
    /// False when the cache could not be bypassed (e.g. tmpfs) and the rates are of the
    /// page cache, not the disk.
    pub uncached: bool,
    pub bytes_read: u64,
}

const ALIGN: usize = 4096;
const SEQ_CHUNK: usize = 4 << 20;
const RAND_CHUNK: usize = 64 << 10;

/// Reads up to `max_bytes` sequentially and then random 64 KiB blocks, each phase for at
/// most `budget`.
pub fn disk_read_rates(path: &Path, max_bytes: u64, budget: Duration) -> io::Result<DiskRates> {
    let (mut file, uncached) = open_uncached(path)?;
    let len = file.metadata()?.len();
    if len < ALIGN as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is too small to measure the disk with", path.display()),
        ));
    }
    // An aligned window of an over-allocated buffer: O_DIRECT needs aligned memory.
    let mut backing = vec![0u8; SEQ_CHUNK + ALIGN];
    let off = backing.as_ptr().align_offset(ALIGN);
    let buf = &mut backing[off..off + SEQ_CHUNK];

    let start = Instant::now();
    let mut seq = 0u64;
    let limit = max_bytes.min(len);
    while seq < limit && (start.elapsed() < budget || seq == 0) {
        let n = read_some(&mut file, &mut buf[..SEQ_CHUNK])?;
        if n == 0 {
            break;
        }
        seq += n as u64;
    }
    let seq_rate = seq as f64 / start.elapsed().as_secs_f64().max(1e-9);

    // Random aligned blocks, from a fixed xorshift sequence.
    let blocks = (len / RAND_CHUNK as u64).max(1);
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let start = Instant::now();
    let mut rand = 0u64;
    let mut reads = 0;
    while (start.elapsed() < budget && reads < 4096) || reads == 0 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let at = (state % blocks) * RAND_CHUNK as u64;
        file.seek(SeekFrom::Start(at))?;
        rand += read_some(&mut file, &mut buf[..RAND_CHUNK])? as u64;
        reads += 1;
    }
    let rand_rate = rand as f64 / start.elapsed().as_secs_f64().max(1e-9);
    Ok(DiskRates {
        seq_bytes_per_s: seq_rate,
        rand_bytes_per_s: rand_rate,
        uncached,
        bytes_read: seq + rand,
    })
}

/// One read, retried on interruption; a short read at the end of the file is fine.
fn read_some(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match file.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn open_uncached(path: &Path) -> io::Result<(File, bool)> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(f) => Ok((f, true)),
        // Filesystems without direct I/O (tmpfs, some overlays) refuse the flag.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((File::open(path)?, false)),
        Err(e) => Err(e),
    }
}

#[cfg(target_os = "macos")]
fn open_uncached(path: &Path) -> io::Result<(File, bool)> {
    use std::os::unix::io::AsRawFd;
    let f = File::open(path)?;
    // SAFETY: fcntl on a descriptor we own, with an integer argument; F_NOCACHE only
    // changes caching of this descriptor's reads.
    let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_NOCACHE, 1) };
    Ok((f, rc == 0))
}

#[cfg(windows)]
fn open_uncached(path: &Path) -> io::Result<(File, bool)> {
    use std::os::windows::fs::OpenOptionsExt;
    // winbase.h's value; its reads must be sector aligned, as O_DIRECT's are here.
    const FILE_FLAG_NO_BUFFERING: u32 = 0x2000_0000;
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(FILE_FLAG_NO_BUFFERING)
        .open(path)
    {
        Ok(f) => Ok((f, true)),
        Err(_) => Ok((File::open(path)?, false)),
    }
}

#[cfg(not(any(
    target_os = "linux",
    target_os = "android",
    target_os = "macos",
    windows
)))]
fn open_uncached(path: &Path) -> io::Result<(File, bool)> {
    Ok((File::open(path)?, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_test_binary_without_writing() {
        let exe = std::env::current_exe().unwrap();
        let r = disk_read_rates(&exe, 16 << 20, Duration::from_millis(50)).unwrap();
        assert!(r.seq_bytes_per_s > 0.0 && r.rand_bytes_per_s > 0.0);
        assert!(r.bytes_read > 0);
    }

    #[test]
    fn a_missing_file_is_an_error() {
        let e = disk_read_rates(Path::new("/nonexistent/model.gguf"), 1, Duration::ZERO);
        assert!(e.is_err());
    }
}

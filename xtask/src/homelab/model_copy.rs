//! Each device's own copy of its model, out of the page cache.
//!
//! Devices must not share cached pages, and a cgroup-v1 memory limit only counts the
//! page-cache pages its own processes fault in: a copy whose pages are still cached
//! (charged to whoever copied it) would look free to the device. So after copying, the
//! copy is written back and its cached pages are dropped.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use anyhow::{Context, Result};

/// Copies `source` to `dest` and evicts `dest` from the page cache.
pub fn copy_uncached(source: &Path, dest: &Path) -> Result<u64> {
    let bytes = std::fs::copy(source, dest)
        .with_context(|| format!("copying {} to {}", source.display(), dest.display()))?;
    drop_cached(dest)?;
    Ok(bytes)
}

/// Writes back and drops a file's cached pages (dirty pages cannot be dropped).
pub fn drop_cached(path: &Path) -> Result<()> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    file.sync_all()
        .with_context(|| format!("writing back {}", path.display()))?;
    // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is open.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc))
            .with_context(|| format!("dropping {} from the page cache", path.display()));
    }
    Ok(())
}

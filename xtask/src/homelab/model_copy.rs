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

/// Room a copy must leave on the copies' disk (builds and other beds share it).
const SPARE_BYTES: u64 = 16 << 30;

/// Copies `source` to `dest` and evicts `dest` from the page cache; returns the bytes and
/// whether `dest` is a hard link instead of a copy.
///
/// When a copy would leave less than [`SPARE_BYTES`] free (four copies of the 6.5 GB MoE
/// do not fit where the beds live), `dest` is a hard link to `source`. That keeps each device's accounting
/// right where the bed's rows touch the file: every row starts with the file dropped
/// from the page cache, a ring's devices fault disjoint layers (the head alone the
/// embedding and output head), and a device alone runs by itself — so no device finds
/// pages that another was charged for.
pub fn copy_uncached(source: &Path, dest: &Path) -> Result<(u64, bool)> {
    let len = std::fs::metadata(source)
        .with_context(|| format!("reading {}", source.display()))?
        .len();
    let _ = std::fs::remove_file(dest);
    let dir = dest.parent().unwrap_or(Path::new("."));
    if free_bytes(dir).is_some_and(|free| free < len + SPARE_BYTES) {
        std::fs::hard_link(source, dest).with_context(|| {
            format!(
                "{} has no room for a copy of {} and cannot link it",
                dir.display(),
                source.display()
            )
        })?;
        drop_cached(dest)?;
        return Ok((len, true));
    }
    let bytes = std::fs::copy(source, dest)
        .with_context(|| format!("copying {} to {}", source.display(), dest.display()))?;
    drop_cached(dest)?;
    Ok((bytes, false))
}

/// Bytes free to an unprivileged writer on the filesystem holding `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` a buffer statvfs fills on success.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    Some(st.f_bavail.saturating_mul(st.f_frsize))
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

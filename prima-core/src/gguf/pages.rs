//! Page-cache hints on byte ranges of a mapped GGUF file: read a range ahead, or let the
//! kernel evict it. This is how a ring device prefetches its next layer window and releases
//! the one it streamed, so its memory holds the pages it will need next.
//!
//! Hints never change the bytes a slice of the mapping reads: a released page is read back
//! from the file on its next access.

use std::io;
use std::ops::Range;

use super::{GgufFile, ReadAhead};

/// What to tell the kernel about a range of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageHint {
    /// Start reading the range into the page cache now (`MADV_WILLNEED`), without waiting.
    WillNeed,
    /// Move the range's pages to the inactive list, first in line for reclaim (`MADV_COLD`).
    Cold,
    /// Reclaim the range's pages now (`MADV_PAGEOUT`); clean file pages are simply dropped.
    PageOut,
    /// Unmap the range from this process (`MADV_DONTNEED`), then ask the kernel to drop it
    /// from the page cache (`POSIX_FADV_DONTNEED`).
    DontNeed,
}

impl PageHint {
    pub fn name(self) -> &'static str {
        match self {
            PageHint::WillNeed => "willneed",
            PageHint::Cold => "cold",
            PageHint::PageOut => "pageout",
            PageHint::DontNeed => "dontneed",
        }
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions; it returns -1 on error, handled below.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as u64
    } else {
        4096
    }
}

impl GgufFile {
    /// A thread that reads ranges of this file ahead of their use, holding at most `cap`
    /// bytes ([`ReadAhead`]); `None` for in-memory images, which have nothing to read.
    pub fn read_ahead(&self, cap: u64) -> io::Result<Option<ReadAhead>> {
        match self.map_and_file().1 {
            Some(file) => ReadAhead::spawn(file, cap).map(Some),
            None => Ok(None),
        }
    }

    /// Applies `hint` to the file bytes `range`. Reading ahead widens the range to whole
    /// pages; releasing narrows it, so a page shared with a neighbouring tensor is kept.
    /// In-memory images (no file) ignore hints.
    pub fn advise_pages(&self, range: Range<u64>, hint: PageHint) -> io::Result<()> {
        let (map, file) = self.map_and_file();
        let Some(file) = file else {
            return Ok(());
        };
        let len = map.len() as u64;
        let page = page_size();
        let (start, end) = match hint {
            PageHint::WillNeed => (
                range.start / page * page,
                range.end.min(len).div_ceil(page) * page,
            ),
            _ => (
                range.start.div_ceil(page) * page,
                range.end.min(len) / page * page,
            ),
        };
        let end = end.min(len.div_ceil(page) * page);
        if start >= end {
            return Ok(());
        }
        let ptr = map.as_ptr().wrapping_add(start as usize) as *mut libc::c_void;
        let n = (end - start) as usize;
        let madvise = |advice: libc::c_int| {
            // SAFETY: [ptr, ptr + n) lies within our read-only, file-backed, shared mapping
            // (start and end are clamped to it and page aligned). None of these advices
            // changes what the mapping reads: for a shared file mapping, dropped pages are
            // read back from the file on the next access.
            if unsafe { libc::madvise(ptr, n, advice) } == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        };
        match hint {
            PageHint::WillNeed => madvise(libc::MADV_WILLNEED),
            #[cfg(target_os = "linux")]
            PageHint::Cold => madvise(libc::MADV_COLD),
            #[cfg(target_os = "linux")]
            PageHint::PageOut => madvise(libc::MADV_PAGEOUT),
            // Elsewhere there is no cold list to move pages to: only drop them.
            #[cfg(not(target_os = "linux"))]
            PageHint::Cold | PageHint::PageOut => madvise(libc::MADV_DONTNEED),
            PageHint::DontNeed => {
                madvise(libc::MADV_DONTNEED)?;
                #[cfg(not(target_os = "linux"))]
                let _ = file;
                #[cfg(target_os = "linux")]
                {
                    use std::os::fd::AsRawFd;
                    // SAFETY: the descriptor is our open file; fadvise only hints the kernel.
                    let rc = unsafe {
                        libc::posix_fadvise(
                            file.as_raw_fd(),
                            start as libc::off_t,
                            n as libc::off_t,
                            libc::POSIX_FADV_DONTNEED,
                        )
                    };
                    if rc != 0 {
                        return Err(io::Error::from_raw_os_error(rc));
                    }
                }
                Ok(())
            }
        }
    }
}

//! Page-cache hints on byte ranges of a mapped GGUF file: read a range ahead, or let the
//! kernel evict it. This is how a ring device prefetches its next layer window and releases
//! the one it streamed, so its memory holds the pages it will need next.
//!
//! Hints never change the bytes a slice of the mapping reads: a released page is read back
//! from the file on its next access.

use std::io;
use std::ops::Range;

use super::read_ahead::read_at;
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
    /// Read only what is touched (`MADV_RANDOM`, and `POSIX_FADV_RANDOM` for the file's
    /// reads): no read-around on a fault. For ranges read in small pieces in no order,
    /// such as streamed experts, where the kernel's readahead window (up to MiBs) would
    /// pull in neighbours that are not needed and evict ones that are.
    Random,
}

impl PageHint {
    pub fn name(self) -> &'static str {
        match self {
            PageHint::WillNeed => "willneed",
            PageHint::Cold => "cold",
            PageHint::PageOut => "pageout",
            PageHint::DontNeed => "dontneed",
            PageHint::Random => "random",
        }
    }
}

#[cfg(unix)]
fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions; it returns -1 on error, handled below.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as u64
    } else {
        4096
    }
}

/// Windows maps and pages in 4 KiB pages on x86-64 and ARM64 alike.
#[cfg(windows)]
fn page_size() -> u64 {
    4096
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

    /// Brings the file bytes of `ranges` into memory now (a device's resident weights, at
    /// start): each range is first read from the file in large preads, so that a range
    /// hinted [`PageHint::Random`] (no read-around on a fault) does not come in a page per
    /// fault, then each of its pages is touched so that it is mapped. A failed read only
    /// leaves the touching to fault the pages in.
    pub fn load_pages<'a>(&self, ranges: impl IntoIterator<Item = &'a Range<u64>>) {
        const PAGE: usize = 4096;
        let (map, mut file) = self.map_and_file();
        let bytes: &[u8] = map;
        let mut buf = vec![0u8; 1 << 20];
        let mut checksum = 0u8;
        for r in ranges {
            let end = (r.end as usize).min(bytes.len());
            let start = (r.start as usize).min(end);
            let mut at = start;
            while let (Some(f), true) = (file, at < end) {
                let n = (end - at).min(buf.len());
                match read_at(f, &mut buf[..n], at as u64) {
                    Ok(read) if read > 0 => at += read,
                    _ => file = None,
                }
            }
            for page in bytes[start..end].chunks(PAGE) {
                checksum ^= page[0];
            }
        }
        std::hint::black_box(checksum);
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
            PageHint::WillNeed | PageHint::Random => (
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
        let ptr = map.as_ptr().wrapping_add(start as usize);
        let n = (end - start) as usize;
        // SAFETY: [ptr, ptr + n) lies within our read-only, file-backed, shared mapping
        // (start and end are clamped to it and page aligned), whose file offset is 0.
        unsafe { os_hint(ptr, n, file, start, hint) }
    }
}

/// The hint as this OS has it, on `n` bytes at `ptr` (page aligned, inside the mapping),
/// which are the file's bytes from `offset`. Linux and Android: the advice of the same
/// name, and `POSIX_FADV_DONTNEED` after `MADV_DONTNEED`. macOS has no cold list and no
/// fadvise: its `MADV_DONTNEED` lowers the pages' priority, which is all three releases.
///
/// # Safety
/// `[ptr, ptr + n)` lies within a read-only, shared mapping of `file`, page aligned, and
/// holds the file's bytes from `offset`.
#[cfg(unix)]
unsafe fn os_hint(
    ptr: *const u8,
    n: usize,
    file: &std::fs::File,
    offset: u64,
    hint: PageHint,
) -> io::Result<()> {
    let ptr = ptr as *mut libc::c_void;
    let madvise = |advice: libc::c_int| {
        // SAFETY: [ptr, ptr + n) lies within a read-only, file-backed, shared mapping
        // (the caller's contract). None of these advices changes what the mapping reads:
        // for a shared file mapping, dropped pages are read back from the file on the
        // next access.
        if unsafe { libc::madvise(ptr, n, advice) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    match hint {
        PageHint::WillNeed => madvise(libc::MADV_WILLNEED),
        PageHint::Random => {
            madvise(libc::MADV_RANDOM)?;
            #[cfg(any(target_os = "linux", target_os = "android"))]
            {
                use std::os::fd::AsRawFd;
                // SAFETY: the descriptor is our open file; fadvise only hints the kernel
                // (for the open file description, which the read-ahead thread's
                // duplicate shares).
                let rc = unsafe {
                    libc::posix_fadvise(
                        file.as_raw_fd(),
                        offset as libc::off_t,
                        n as libc::off_t,
                        libc::POSIX_FADV_RANDOM,
                    )
                };
                if rc != 0 {
                    return Err(io::Error::from_raw_os_error(rc));
                }
            }
            Ok(())
        }
        #[cfg(any(target_os = "linux", target_os = "android"))]
        PageHint::Cold => madvise_or_dontneed(madvise, libc::MADV_COLD),
        #[cfg(any(target_os = "linux", target_os = "android"))]
        PageHint::PageOut => madvise_or_dontneed(madvise, libc::MADV_PAGEOUT),
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        PageHint::Cold | PageHint::PageOut => madvise(libc::MADV_DONTNEED),
        PageHint::DontNeed => {
            madvise(libc::MADV_DONTNEED)?;
            #[cfg(not(any(target_os = "linux", target_os = "android")))]
            let _ = (file, offset);
            #[cfg(any(target_os = "linux", target_os = "android"))]
            {
                use std::os::fd::AsRawFd;
                // SAFETY: the descriptor is our open file; fadvise only hints the kernel.
                let rc = unsafe {
                    libc::posix_fadvise(
                        file.as_raw_fd(),
                        offset as libc::off_t,
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

/// `MADV_COLD` and `MADV_PAGEOUT` came with Linux 5.4. Many phones run older kernels,
/// which refuse them (EINVAL): there, Android drops the pages from the process instead.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn madvise_or_dontneed(
    madvise: impl Fn(libc::c_int) -> io::Result<()>,
    advice: libc::c_int,
) -> io::Result<()> {
    let result = madvise(advice);
    #[cfg(target_os = "android")]
    if matches!(&result, Err(e) if e.raw_os_error() == Some(libc::EINVAL)) {
        return madvise(libc::MADV_DONTNEED);
    }
    result
}

/// Windows: `PrefetchVirtualMemory` reads a range ahead (Windows 8 and later), and
/// `VirtualUnlock` on pages that are not locked takes them out of the working set, to the
/// standby list: the nearest thing to a cold list, and all three releases. The file's
/// cache is the system's to manage; nothing drops it.
///
/// # Safety
/// As the Unix version: `[ptr, ptr + n)` lies within a read-only view of the file.
#[cfg(windows)]
unsafe fn os_hint(
    ptr: *const u8,
    n: usize,
    _file: &std::fs::File,
    _offset: u64,
    hint: PageHint,
) -> io::Result<()> {
    use windows_sys::Win32::System::Memory::{
        PrefetchVirtualMemory, VirtualUnlock, WIN32_MEMORY_RANGE_ENTRY,
    };
    use windows_sys::Win32::System::Threading::GetCurrentProcess;
    match hint {
        PageHint::WillNeed => {
            let range = WIN32_MEMORY_RANGE_ENTRY {
                VirtualAddress: ptr as *mut _,
                NumberOfBytes: n,
            };
            // SAFETY: one range entry, inside our mapping (the caller's contract), for our
            // own process; prefetching only reads the file's pages into memory.
            if unsafe { PrefetchVirtualMemory(GetCurrentProcess(), 1, &range, 0) } != 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        }
        // The system's readahead is the system's own on Windows.
        PageHint::Random => Ok(()),
        PageHint::Cold | PageHint::PageOut | PageHint::DontNeed => {
            // SAFETY: the range lies inside our mapping (the caller's contract) and was
            // never locked; unlocking it only trims it from the working set, and a trimmed
            // page of a file view is read back on its next access.
            unsafe { VirtualUnlock(ptr as *const _, n) };
            // It "fails" with ERROR_NOT_LOCKED by design: the pages left the set anyway.
            Ok(())
        }
    }
}

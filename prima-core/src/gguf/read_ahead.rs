//! Reading byte ranges of a GGUF file into the page cache on a thread of its own, so a
//! device's next streamed window arrives while it waits for the other devices.
//!
//! `MADV_WILLNEED` (and `POSIX_FADV_WILLNEED`, `readahead(2)`) is not enough: Linux reads at
//! most the file's readahead window (128 KiB to a few MiB) per call, and under a memory
//! cgroup its allocations give up rather than reclaim. Measured in a 450 MiB cgroup with a
//! 150 MB/s read limit, 130 MiB hinted with `MADV_WILLNEED` two seconds before use still
//! took 0.87 s to touch (0.96 s unhinted); read ahead by a thread it took 0.004 s. So the
//! reader `pread`s each range into a small scratch buffer: the kernel keeps the pages,
//! charged to the device's own cgroup, and the compute thread later maps them without
//! waiting for the disk.
//!
//! The reader never holds more than its cap of bytes read but not yet [`ReadAhead::forget`]-ten:
//! the room a memory budget leaves beside the resident layers. Reading further would evict
//! pages needed sooner (resident layers, the output head) under the device's limit.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// How much one `pread` asks for: large enough for the disk to see long requests, small
/// enough that a cancelled range stops promptly.
const PIECE: usize = 1 << 20;

#[derive(Default)]
struct Queue {
    /// Ranges still to read, in the order they were asked for.
    pending: VecDeque<Range<u64>>,
    /// The range being read now, if any.
    current: Option<Range<u64>>,
    /// Set when `current` was forgotten: the reader drops the rest of it.
    drop_current: bool,
    /// What was read and not forgotten since, and its size: at most `cap`.
    held: Vec<Range<u64>>,
    held_bytes: u64,
    cap: u64,
    stop: bool,
}

impl Queue {
    /// Removes `r` from what is held.
    fn release(&mut self, r: &Range<u64>) {
        let mut kept = Vec::with_capacity(self.held.len() + 1);
        for h in self.held.drain(..) {
            if !overlaps(&h, r) {
                kept.push(h);
                continue;
            }
            if h.start < r.start {
                kept.push(h.start..r.start);
            }
            if r.end < h.end {
                kept.push(r.end..h.end);
            }
        }
        self.held = kept;
        self.held_bytes = self.held.iter().map(|h| h.end - h.start).sum();
    }

    /// Records `r` as read, merging it with the range it continues.
    fn hold(&mut self, r: Range<u64>) {
        self.held_bytes += r.end - r.start;
        match self.held.last_mut() {
            Some(last) if last.end == r.start => last.end = r.end,
            _ => self.held.push(r),
        }
    }
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic while holding the lock leaves a queue of plain ranges, still consistent.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A background thread that reads ranges of one file ahead of their use.
pub struct ReadAhead {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ReadAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadAhead")
            .field("pending", &self.shared.lock().pending.len())
            .finish()
    }
}

fn overlaps(a: &Range<u64>, b: &Range<u64>) -> bool {
    a.start < b.end && b.start < a.end
}

/// `a` less `b`: none, one or two ranges.
fn subtract(a: &Range<u64>, b: &Range<u64>) -> Vec<Range<u64>> {
    if !overlaps(a, b) {
        return vec![a.clone()];
    }
    let mut out = Vec::new();
    if a.start < b.start {
        out.push(a.start..b.start);
    }
    if b.end < a.end {
        out.push(b.end..a.end);
    }
    out
}

impl ReadAhead {
    /// Starts the reader on its own handle of `file`, holding at most `cap` bytes read
    /// ahead.
    pub fn spawn(file: &File, cap: u64) -> io::Result<ReadAhead> {
        let file = file.try_clone()?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                cap,
                ..Queue::default()
            }),
            wake: Condvar::new(),
        });
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("prima-read-ahead".into())
            .spawn(move || read_loop(&file, &worker))?;
        Ok(ReadAhead {
            shared,
            thread: Some(thread),
        })
    }

    /// Queues `ranges` to be read after those already queued.
    pub fn read(&self, ranges: &[Range<u64>]) {
        let mut q = self.shared.lock();
        q.pending
            .extend(ranges.iter().filter(|r| r.start < r.end).cloned());
        drop(q);
        self.shared.wake.notify_one();
    }

    /// Drops `ranges` from what is queued (a queued range that covers more keeps the
    /// rest), and the rest of the range being read if `ranges` cover it: they were used
    /// (and are being released), and reading them now would only evict others. What was
    /// read of them no longer counts against the cap.
    pub fn forget(&self, ranges: &[Range<u64>]) {
        let mut q = self.shared.lock();
        let mut left: Vec<Range<u64>> = Vec::with_capacity(q.pending.len());
        for p in q.pending.drain(..) {
            let mut parts = vec![p];
            for r in ranges {
                parts = parts.into_iter().flat_map(|p| subtract(&p, r)).collect();
            }
            left.extend(parts);
        }
        q.pending = left.into();
        if let Some(c) = &q.current {
            let mut parts = vec![c.clone()];
            for r in ranges {
                parts = parts.into_iter().flat_map(|p| subtract(&p, r)).collect();
            }
            if parts.is_empty() {
                q.drop_current = true;
            }
        }
        for r in ranges {
            q.release(r);
        }
        drop(q);
        self.shared.wake.notify_all();
    }

    /// Waits until `ranges` are read, unless the reader cannot go on before the caller
    /// does (what it holds fills its cap) or was told to stop: a wait never blocks on
    /// the caller itself, and pages not read yet are simply faulted in.
    pub fn wait_read(&self, ranges: &[Range<u64>]) {
        let mut q = self.shared.lock();
        loop {
            let queued = q
                .pending
                .iter()
                .any(|p| ranges.iter().any(|r| overlaps(p, r)))
                || (q.current.as_ref())
                    .is_some_and(|c| !q.drop_current && ranges.iter().any(|r| overlaps(c, r)));
            if !queued || q.stop || q.held_bytes >= q.cap {
                return;
            }
            q = self.shared.wake.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Bytes read ahead and not forgotten (for tests and reports).
    pub fn held_bytes(&self) -> u64 {
        self.shared.lock().held_bytes
    }

    /// Whether nothing is queued or being read (for tests).
    pub fn idle(&self) -> bool {
        let q = self.shared.lock();
        q.pending.is_empty() && q.current.is_none()
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        let mut q = self.shared.lock();
        q.stop = true;
        q.pending.clear();
        q.drop_current = true;
        drop(q);
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read_loop(file: &File, shared: &Shared) {
    let mut scratch = vec![0u8; PIECE];
    loop {
        let mut range = {
            let mut q = shared.lock();
            loop {
                if q.stop {
                    return;
                }
                if let Some(r) = q.pending.pop_front() {
                    q.current = Some(r.clone());
                    q.drop_current = false;
                    break r;
                }
                q = shared.wake.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        while range.start < range.end {
            let n = (range.end - range.start).min(PIECE as u64) as usize;
            // Wait for room under the cap (the compute thread forgets what it used).
            let n = {
                let mut q = shared.lock();
                loop {
                    if q.stop || q.drop_current {
                        break 0;
                    }
                    let room = q.cap.saturating_sub(q.held_bytes);
                    if room > 0 {
                        break n.min(room as usize);
                    }
                    q = shared.wake.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            };
            if n == 0 {
                break;
            }
            match read_at(file, &mut scratch[..n], range.start) {
                // End of file, or an error: a read ahead costs speed, never correctness;
                // the compute thread reads the same pages itself and reports what fails.
                Ok(0) | Err(_) => break,
                Ok(got) => {
                    let done = range.start..range.start + got as u64;
                    range.start = done.end;
                    let mut q = shared.lock();
                    // Forgotten while being read: these bytes do not count.
                    if !q.drop_current {
                        q.hold(done);
                        // What has been read so far is no longer waited for.
                        if let Some(c) = &mut q.current {
                            c.start = range.start;
                        }
                    }
                    drop(q);
                    shared.wake.notify_all();
                }
            }
            if shared.lock().drop_current {
                break;
            }
        }
        shared.lock().current = None;
        shared.wake.notify_all();
    }
}

/// `pread`: a read at an offset. Windows' `seek_read` also moves the file's cursor, which
/// nothing relies on: the model file is only ever mapped and read at offsets.
#[cfg(unix)]
pub(super) fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(file, buf, offset)
}

#[cfg(windows)]
pub(super) fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(file, buf, offset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::{Duration, Instant};

    fn wait_idle(r: &ReadAhead) {
        let start = Instant::now();
        while !r.idle() {
            assert!(start.elapsed() < Duration::from_secs(10), "reader stuck");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    // Single ranges and a reversed one are what these calls are tested with.
    #[allow(clippy::single_range_in_vec_init, clippy::reversed_empty_ranges)]
    fn reads_what_it_is_given_and_forgets_what_is_released() {
        let dir = std::env::temp_dir().join(format!("prima-read-ahead-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.bin");
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&vec![7u8; 3 * PIECE + 5])
            .unwrap();
        let file = File::open(&path).unwrap();
        let size = (3 * PIECE + 5) as u64;
        let r = ReadAhead::spawn(&file, u64::MAX).unwrap();
        // Past the end, empty and reversed ranges are harmless.
        r.read(&[0..size, 10..10, 20..5, size..u64::MAX / 2]);
        wait_idle(&r);
        assert_eq!(r.held_bytes(), size);
        r.forget(&[0..PIECE as u64]);
        assert_eq!(r.held_bytes(), size - PIECE as u64);
        r.forget(&[0..size]);
        assert_eq!(r.held_bytes(), 0);
        drop(r);

        // Under a cap the reader stops at it, and goes on as what it read is forgotten.
        let cap = PIECE as u64 + 100;
        let r = ReadAhead::spawn(&file, cap).unwrap();
        let p = PIECE as u64;
        r.read(&[0..p, p..2 * p, 2 * p..size]);
        let start = Instant::now();
        while r.held_bytes() < cap {
            assert!(start.elapsed() < Duration::from_secs(10), "reader stuck");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(r.held_bytes(), cap, "read past its cap");
        assert!(!r.idle());
        // The first range was used: the reader goes on with the second.
        r.forget(&[0..p]);
        let start = Instant::now();
        while r.held_bytes() < cap {
            assert!(start.elapsed() < Duration::from_secs(10), "reader stuck");
            std::thread::sleep(Duration::from_millis(1));
        }
        // Forgetting the range being read drops the rest of it; dropping a reader
        // blocked on its cap ends it.
        r.forget(&[p..2 * p]);
        drop(r);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init)]
    fn a_partly_forgotten_range_keeps_its_rest_and_a_wait_never_blocks_on_the_cap() {
        let dir = std::env::temp_dir().join(format!("prima-read-wait-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.bin");
        let p = PIECE as u64;
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&vec![7u8; 3 * PIECE])
            .unwrap();
        let file = File::open(&path).unwrap();
        // Forgetting the middle of a queued (or half-read) range leaves its ends to read;
        // a wait for the end returns once it is read.
        let r = ReadAhead::spawn(&file, u64::MAX).unwrap();
        r.read(&[0..3 * p]);
        r.forget(&[p..2 * p]);
        r.wait_read(&[2 * p..3 * p]);
        wait_idle(&r);
        let held = r.held_bytes();
        assert!((2 * p..=3 * p).contains(&held), "{held}");
        drop(r);
        // A reader stopped at its cap cannot reach the last piece before the caller
        // forgets something: the wait returns instead of blocking.
        let r = ReadAhead::spawn(&file, p).unwrap();
        r.read(&[0..3 * p]);
        let start = Instant::now();
        while r.held_bytes() < p {
            assert!(start.elapsed() < Duration::from_secs(10), "reader stuck");
            std::thread::sleep(Duration::from_millis(1));
        }
        r.wait_read(&[2 * p..3 * p]);
        drop(r);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

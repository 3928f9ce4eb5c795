//! Memory read bandwidth, STREAM-style: how fast `threads` cores can stream a buffer far
//! larger than the caches. Token generation reads every weight once per token, so this is
//! the ceiling a CPU backend's generation speed is measured against.

use std::time::Instant;

/// Result of one bandwidth measurement.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct MemoryBandwidth {
    /// Best observed read rate, in bytes per second.
    pub bytes_per_s: f64,
    pub buffer_bytes: usize,
    pub threads: usize,
}

/// Bytes timed at a time: far beyond L2, and short (about 3 ms at 10 GB/s) beside the
/// burst a CPU quota grants in a period (15 ms at 0.15 of a core), so most windows run
/// unthrottled however the quota's periods fall.
const WINDOW_BYTES: usize = 32 << 20;

/// Reads a `buffer_bytes` buffer with `threads` threads, `passes` times, timing it a window
/// of [`WINDOW_BYTES`] per thread at a time, and returns the best window: the least
/// disturbed by other work, and by a CPU quota's throttling, which stops a process for
/// the rest of a period once its share is spent (timed whole, a pass on a device with
/// 0.15 of a core measured anything from 1.1 to 10.5 GB/s). The read rate is the
/// unthrottled one, as the CPU's compute rate is before the profile scales it by its share.
pub fn memory_read_bandwidth(
    buffer_bytes: usize,
    threads: usize,
    passes: usize,
) -> MemoryBandwidth {
    let threads = threads.max(1);
    let words = (buffer_bytes / 8).max(threads * 64);
    // Non-zero contents so the pages are really backed, not the shared zero page.
    let buf: Vec<u64> = (0..words as u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let window = (WINDOW_BYTES / 8 * threads).min(words);
    let mut best = 0.0f64;
    for _ in 0..passes.max(1) {
        for part in buf.chunks(window) {
            let chunk = part.len().div_ceil(threads);
            let start = Instant::now();
            let total: u64 = std::thread::scope(|s| {
                let handles: Vec<_> = part
                    .chunks(chunk)
                    .map(|piece| s.spawn(move || sum_words(piece)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or(0))
                    .fold(0, u64::wrapping_add)
            });
            std::hint::black_box(total);
            let secs = start.elapsed().as_secs_f64();
            best = best.max((part.len() * 8) as f64 / secs);
        }
    }
    MemoryBandwidth {
        bytes_per_s: best,
        buffer_bytes: words * 8,
        threads,
    }
}

/// Sums in eight independent lanes so the compiler vectorises the loop and the loads, not
/// the additions, are the bottleneck.
fn sum_words(words: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    let mut blocks = words.chunks_exact(8);
    for block in &mut blocks {
        for (lane, w) in lanes.iter_mut().zip(block) {
            *lane = lane.wrapping_add(*w);
        }
    }
    let tail = blocks
        .remainder()
        .iter()
        .fold(0u64, |a, w| a.wrapping_add(*w));
    lanes.iter().fold(tail, |a, l| a.wrapping_add(*l))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_word() {
        let words: Vec<u64> = (1..=1003).collect();
        assert_eq!(sum_words(&words), 1003 * 1004 / 2);
    }

    #[test]
    fn reports_the_buffer_it_read() {
        let bw = memory_read_bandwidth(1 << 20, 2, 2);
        assert_eq!(bw.threads, 2);
        assert!(bw.buffer_bytes >= 1 << 20);
        assert!(bw.bytes_per_s.is_finite() && bw.bytes_per_s > 0.0);
    }
}

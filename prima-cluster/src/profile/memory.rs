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

/// Reads a `buffer_bytes` buffer with `threads` threads, `passes` times, and returns the
/// best pass (the least disturbed by other work on the machine).
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
    let chunk = words.div_ceil(threads);
    let mut best = 0.0f64;
    for _ in 0..passes.max(1) {
        let start = Instant::now();
        let total: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = buf
                .chunks(chunk)
                .map(|part| s.spawn(move || sum_words(part)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0, u64::wrapping_add)
        });
        std::hint::black_box(total);
        let secs = start.elapsed().as_secs_f64();
        best = best.max((words * 8) as f64 / secs);
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

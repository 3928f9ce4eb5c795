//! CPU throughput per weight class (s_m^{cpu,q}), measured with the loaded backend's own
//! matmul on a cache-resident matrix — so it is the kernels' compute rate; reading
//! weights from RAM is measured separately (𝒯_m^{cpu}) and the LDA model adds the two.

use std::time::{Duration, Instant};

use abi_stable::std_types::RSlice;

use super::device::{QuantClass, QuantRates};
use super::probe_bufs::ProbeBufs;
use prima_abi::backend::{BackendBox, TensorView};

/// Columns of the probe matrix (a typical hidden size).
const COLS: usize = 4096;
/// Bytes of the probe matrix: small enough for L2 on most CPUs.
const TARGET_BYTES: usize = 512 * 1024;
/// Timing slices per class; the fastest counts.
const SLICES: u32 = 6;

/// Measures every class for about `per_class` each. Classes the backend does not support
/// get the f32 rate.
pub fn cpu_throughput(backend: &BackendBox, per_class: Duration) -> Result<QuantRates, String> {
    let mut rates = QuantRates::uniform(0.0);
    let mut fallback = None;
    for q in QuantClass::ALL {
        let t = q.ggml_type();
        if !backend.supports(t.id()) {
            continue;
        }
        let row_bytes = t
            .row_bytes(COLS)
            .ok_or_else(|| format!("{} rows of {COLS} columns", t.name()))?;
        let rows = (TARGET_BYTES / row_bytes).clamp(16, 1024) / 16 * 16;
        // Zero blocks are valid in every format (scales of 0) and cost what any data costs.
        let data = vec![0u8; rows * row_bytes];
        let bufs = ProbeBufs::new(backend, &vec![0.5f32; COLS], rows)?;
        let view = TensorView {
            data: RSlice::from_slice(&data),
            ggml_type: t.id(),
            cols: COLS as u64,
            rows: rows as u64,
        };
        // The CPU backend runs each call as it comes: no download is needed to time it.
        let run = || -> Result<(), String> {
            backend
                .matmul(view, bufs.x, 1, bufs.out)
                .into_result()
                .map_err(|e| format!("matmul {}: {e}", t.name()))
        };
        run()?; // warm the caches and the pool
                // The best of several short slices: the least disturbed by other work.
        let slice = per_class / SLICES;
        let mut gflops = 0.0f64;
        for _ in 0..SLICES {
            let start = Instant::now();
            let mut calls = 0u64;
            while start.elapsed() < slice || calls < 2 {
                run()?;
                calls += 1;
            }
            let secs = start.elapsed().as_secs_f64();
            gflops = gflops.max(2.0 * (rows * COLS) as f64 * calls as f64 / secs / 1e9);
        }
        rates.set(q, gflops);
        if q == QuantClass::F32 {
            fallback = Some(gflops);
        }
    }
    let fallback = fallback
        .or_else(|| {
            QuantClass::ALL
                .iter()
                .map(|&q| rates.flops_per_s(q) / 1e9)
                .find(|&v| v > 0.0)
        })
        .ok_or("the backend supports none of the profiled weight types")?;
    for q in QuantClass::ALL {
        if rates.flops_per_s(q) <= 0.0 {
            rates.set(q, fallback);
        }
    }
    Ok(rates)
}

/// Copy rate of buffers the size of a few layers' KV entries, for t_m^{kv_cpy}: the best
/// single copy within `budget`, each timed alone, so a CPU quota's throttling (which
/// stops the process for the rest of a period) does not count as copying.
pub fn memcpy_rate(budget: Duration) -> f64 {
    let src = vec![1u8; 8 << 20];
    let mut dst = vec![0u8; 8 << 20];
    dst.copy_from_slice(&src);
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut copies = 0u64;
    while start.elapsed() < budget || copies < 2 {
        let one = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
        best = best.min(one.elapsed().as_secs_f64());
        copies += 1;
    }
    src.len() as f64 / best.max(1e-9)
}

//! RMS normalisation, as ggml's `rms_norm` followed by `mul`: the mean of squares is summed
//! in f64, `scale = 1 / sqrt(mean + eps)` in f32, then `y = (x · scale) · weight`.

use super::matmul::SharedOut;
use super::{expect_len, OpResult, Weight};
use crate::pool::ChunkRunner;
use prima_abi::backend::TensorView;

/// Fewest rows (tokens) worth splitting over the pool: a row is a few hundred nanoseconds
/// of f64 sum, which the hand-off would eat for fewer.
const POOL_MIN_ROWS: usize = 8;

/// [`rms_norm`] with the rows split over `pool` (a prompt's tokens), same bits.
pub fn rms_norm_on(
    pool: &impl ChunkRunner,
    x: &[f32],
    weight: &TensorView<'_>,
    eps: f32,
    out: &mut [f32],
) -> OpResult<()> {
    let n = weight.cols as usize;
    if pool.threads() < 2
        || n == 0
        || !x.len().is_multiple_of(n)
        || x.len() / n < POOL_MIN_ROWS
        || x.len() != out.len()
    {
        // Too few rows to split, or bad lengths that `rms_norm` reports.
        return rms_norm(x, weight, eps, out);
    }
    let rows = x.len() / n;
    let per_chunk = rows.div_ceil(pool.threads() * 2);
    let dst = SharedOut(out.as_mut_ptr());
    let failed = std::sync::Mutex::new(None);
    pool.run(rows.div_ceil(per_chunk), &|c| {
        let (lo, hi) = (c * per_chunk * n, ((c + 1) * per_chunk * n).min(x.len()));
        // SAFETY: chunk `c` owns elements `lo .. hi` of `out` (as long as `x`, checked
        // above), disjoint per chunk, and `out` outlives `run`, which returns when every
        // chunk is done.
        let o = unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(lo), hi - lo) };
        if let Err(e) = rms_norm(&x[lo..hi], weight, eps, o) {
            *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
        }
    });
    match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Normalises each row of `x` (row length = `weight.cols`) into `out`.
pub fn rms_norm(x: &[f32], weight: &TensorView<'_>, eps: f32, out: &mut [f32]) -> OpResult<()> {
    let w = Weight::f32_vector("rms_norm", "weight", weight)?;
    let n = w.cols;
    if !x.len().is_multiple_of(n) {
        return Err(format!(
            "rms_norm: x length {} is not a multiple of the row length {n}",
            x.len()
        ));
    }
    expect_len("rms_norm", "out length", out.len(), x.len())?;
    if n == 0 {
        return Ok(());
    }
    // Each row's f64 sum is one chain of dependent adds, in element order (its bits), so a
    // row alone waits on the adder's latency; the rows of a group of `ROWS_AT_ONCE` run
    // their chains side by side (a 4-token decode step: its norms ~4× faster, same bits).
    const ROWS_AT_ONCE: usize = 4;
    for (xg, yg) in x
        .chunks(ROWS_AT_ONCE * n)
        .zip(out.chunks_mut(ROWS_AT_ONCE * n))
    {
        let mut sums = [0.0f64; ROWS_AT_ONCE];
        if xg.len() == ROWS_AT_ONCE * n {
            for i in 0..n {
                for (k, sum) in sums.iter_mut().enumerate() {
                    let v = xg[k * n + i] as f64;
                    *sum += v * v;
                }
            }
        } else {
            for (sum, xr) in sums.iter_mut().zip(xg.chunks_exact(n)) {
                for &v in xr {
                    *sum += v as f64 * v as f64;
                }
            }
        }
        for ((xr, yr), sum) in xg.chunks_exact(n).zip(yg.chunks_exact_mut(n)).zip(sums) {
            let mean = (sum / n as f64) as f32;
            let scale = 1.0 / (mean + eps).sqrt();
            // The weight's bytes in whole f32s (`f32_vector` checked the length), so the
            // loop vectorises.
            for ((y, &v), wb) in yr.iter_mut().zip(xr).zip(w.data.chunks_exact(4)) {
                *y = (v * scale) * f32::from_le_bytes([wb[0], wb[1], wb[2], wb[3]]);
            }
        }
    }
    Ok(())
}

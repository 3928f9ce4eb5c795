//! Rotary position embedding, with the NeoX ordering, per-dimension frequency factors and
//! YaRN, following ggml's `rope` semantics.
//!
//! Pair `i` of a head at position `p` is rotated by `θ_i = p · base^(−2i/n_rot)` (the power
//! accumulated by repeated multiplication in f32, as ggml does), divided by
//! `freq_factors[i]` when present. Without YaRN the angle is `freq_scale · θ_i`; with YaRN
//! (`ext_factor ≠ 0`) it mixes the interpolated and extrapolated angle by a ramp over the
//! correction dims `[low, high]` derived from `beta_fast`/`beta_slow`, and the magnitude
//! gains `1 + 0.1 ln(1/freq_scale)`. `attn_factor` multiplies cos and sin.

use super::matmul::SharedOut;
use super::{expect_len, mul, OpResult};
use crate::pool::{sized, ChunkRunner};
use prima_abi::backend::RopeParams;
use std::cell::RefCell;

/// Fewest positions worth splitting over the pool (a prompt's tokens).
const POOL_MIN_POSITIONS: usize = 8;

thread_local! {
    /// Each pool thread's cos/sin of one position, reused across calls.
    static COS_SIN: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// [`rope`] with the positions split over `pool`, same bits; `cache` is the caller's
/// scratch where it runs alone.
pub fn rope_on(
    pool: &impl ChunkRunner,
    x: &mut [f32],
    n_head: usize,
    head_dim: usize,
    positions: &[u32],
    p: &RopeParams<'_>,
    cache: &mut Vec<f32>,
) -> OpResult<()> {
    let row = n_head.saturating_mul(head_dim);
    let n = positions.len();
    if pool.threads() < 2 || n < POOL_MIN_POSITIONS || row == 0 || x.len() != n * row {
        // Too few positions to split, or bad lengths that `rope` reports.
        return rope(x, n_head, head_dim, positions, p, cache);
    }
    let per_chunk = n.div_ceil(pool.threads() * 2);
    let dst = SharedOut(x.as_mut_ptr());
    let failed = std::sync::Mutex::new(None);
    pool.run(n.div_ceil(per_chunk), &|c| {
        let (lo, hi) = (c * per_chunk, ((c + 1) * per_chunk).min(n));
        // SAFETY: chunk `c` owns rows `lo .. hi` of `x` (`n` rows of `row`, checked above),
        // disjoint per chunk, and `x` outlives `run`, which returns when every chunk is
        // done.
        let xs =
            unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(lo * row), (hi - lo) * row) };
        COS_SIN.with(|cell| {
            let r = rope(
                xs,
                n_head,
                head_dim,
                &positions[lo..hi],
                p,
                &mut cell.borrow_mut(),
            );
            if let Err(e) = r {
                *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
            }
        });
    });
    match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Rotates `x` (`positions.len()` rows of `n_head × head_dim`) in place; `cache` is scratch.
pub fn rope(
    x: &mut [f32],
    n_head: usize,
    head_dim: usize,
    positions: &[u32],
    p: &RopeParams<'_>,
    cache: &mut Vec<f32>,
) -> OpResult<()> {
    const OP: &str = "rope";
    let row = mul(OP, n_head, head_dim)?;
    expect_len(
        OP,
        format_args!(
            "x length ({} positions × {n_head} heads × {head_dim})",
            positions.len()
        ),
        x.len(),
        mul(OP, positions.len(), row)?,
    )?;
    let n_rot = p.n_rot as usize;
    if !n_rot.is_multiple_of(2) || n_rot > head_dim {
        return Err(format!(
            "{OP}: n_rot {n_rot} must be even and at most head_dim {head_dim}"
        ));
    }
    if let Some(f) = p.freq_factors.as_ref().into_option() {
        expect_len(OP, "freq_factors length", f.len(), n_rot / 2)?;
    }
    if n_rot == 0 || row == 0 {
        return Ok(());
    }
    let corr = p.yarn_corr_dims(n_rot);
    let cache = sized(cache, n_rot);
    let half = n_rot / 2;
    for (&pos, xr) in positions.iter().zip(x.chunks_exact_mut(row)) {
        p.fill_cos_sin(cache, pos, n_rot, corr);
        for head in xr.chunks_exact_mut(head_dim) {
            for (i, cs) in cache.chunks_exact(2).enumerate() {
                let (a, b) = if p.neox {
                    (i, i + half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cs[0] - x1 * cs[1];
                head[b] = x0 * cs[1] + x1 * cs[0];
            }
        }
    }
    Ok(())
}

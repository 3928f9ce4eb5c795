//! Rotary position embedding, with the NeoX ordering, per-dimension frequency factors and
//! YaRN, following ggml's `rope` semantics.
//!
//! Pair `i` of a head at position `p` is rotated by `θ_i = p · base^(−2i/n_rot)` (the power
//! accumulated by repeated multiplication in f32, as ggml does), divided by
//! `freq_factors[i]` when present. Without YaRN the angle is `freq_scale · θ_i`; with YaRN
//! (`ext_factor ≠ 0`) it mixes the interpolated and extrapolated angle by a ramp over the
//! correction dims `[low, high]` derived from `beta_fast`/`beta_slow`, and the magnitude
//! gains `1 + 0.1 ln(1/freq_scale)`. `attn_factor` multiplies cos and sin.

use super::{expect_len, mul, OpResult};
use crate::pool::sized;
use prima_core::plugin::backend_abi::RopeParams;
use std::f32::consts::PI;

/// The YaRN correction dimension for `n_rot` rotations over the original context.
fn corr_dim(n_dims: usize, n_ctx_orig: u32, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * PI)).ln() / (2.0 * base.ln())
}

/// `[low, high]` dims between which YaRN ramps from extrapolation to interpolation.
fn corr_dims(n_dims: usize, p: &RopeParams<'_>) -> [f32; 2] {
    let start = corr_dim(n_dims, p.n_ctx_orig, p.beta_fast, p.freq_base).floor();
    let end = corr_dim(n_dims, p.n_ctx_orig, p.beta_slow, p.freq_base).ceil();
    [start.max(0.0), end.min(n_dims as f32 - 1.0)]
}

fn yarn_ramp(low: f32, high: f32, pair: usize) -> f32 {
    let y = (pair as f32 - low) / (high - low).max(0.001);
    1.0 - y.clamp(0.0, 1.0)
}

/// Fills `cache` with the (cos, sin) of every pair for position `pos`.
fn fill_cache(cache: &mut [f32], pos: u32, p: &RopeParams<'_>, n_rot: usize, corr: [f32; 2]) {
    let theta_scale = p.freq_base.powf(-2.0 / n_rot as f32);
    let factors = p.freq_factors.as_ref().map(|f| f.as_slice()).into_option();
    let mut theta = pos as f32;
    for (i, cs) in cache.chunks_exact_mut(2).enumerate() {
        let ff = factors.map_or(1.0, |f| f[i]);
        let theta_extrap = theta / ff;
        let theta_interp = p.freq_scale * theta_extrap;
        let (mut angle, mut mscale) = (theta_interp, p.attn_factor);
        if p.ext_factor != 0.0 {
            let mix = yarn_ramp(corr[0], corr[1], i) * p.ext_factor;
            angle = theta_interp * (1.0 - mix) + theta_extrap * mix;
            mscale *= 1.0 + 0.1 * (1.0 / p.freq_scale).ln();
        }
        cs[0] = angle.cos() * mscale;
        cs[1] = angle.sin() * mscale;
        theta *= theta_scale;
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
    let corr = corr_dims(n_rot, p);
    let cache = sized(cache, n_rot);
    let half = n_rot / 2;
    for (&pos, xr) in positions.iter().zip(x.chunks_exact_mut(row)) {
        fill_cache(cache, pos, p, n_rot, corr);
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

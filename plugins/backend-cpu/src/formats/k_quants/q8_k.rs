//! Q8_K: the activation type of every K-quant. Super-blocks of 256: `d: f32`, 256 `i8`
//! quants, then 16 `i16` sums of each group of 16 quants (`bsums`); each value is `d · q`.
//!
//! Quantization takes `max`, the element of largest magnitude *with its sign*, sets
//! `iscale = −127 / max`, `q = min(127, nearest_int(iscale · x))` (nearest, ties to even, as
//! ggml's `nearest_int`) and `d = 1 / iscale`. An all-zero block stores `d = 0`, `q = 0`.

use super::QK_K;
use crate::formats::f32_at;

pub const BLOCK_ELEMS: usize = QK_K;
pub const BLOCK_BYTES: usize = 4 + QK_K + 2 * (QK_K / 16);

/// Byte offset of the quants.
pub(crate) const QS: usize = 4;
/// Byte offset of the `bsums`.
pub(crate) const BSUMS: usize = 4 + QK_K;

#[inline]
pub(crate) fn d(block: &[u8]) -> f32 {
    f32_at(block, 0)
}

#[inline]
pub(crate) fn quant(block: &[u8], i: usize) -> i32 {
    block[QS + i] as i8 as i32
}

/// Sum of the quants of group `g` (elements `16g .. 16g + 16`).
#[inline]
pub(crate) fn bsum(block: &[u8], g: usize) -> i32 {
    i16::from_le_bytes([block[BSUMS + 2 * g], block[BSUMS + 2 * g + 1]]) as i32
}

pub fn dequantize_row(src: &[u8], out: &mut [f32]) {
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = d(block);
        for (i, o) in out.iter_mut().enumerate() {
            *o = d * quant(block, i) as f32;
        }
    }
}

pub fn quantize_row(x: &[f32], out: &mut [u8]) {
    for (xs, block) in x
        .chunks_exact(BLOCK_ELEMS)
        .zip(out.chunks_exact_mut(BLOCK_BYTES))
    {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xs {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            block.fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        for (q, v) in block[QS..BSUMS].iter_mut().zip(xs) {
            *q = ((iscale * v).round_ties_even() as i32).min(127) as i8 as u8;
        }
        for g in 0..QK_K / 16 {
            let s: i32 = (0..16).map(|i| quant(block, 16 * g + i)).sum();
            block[BSUMS + 2 * g..BSUMS + 2 * g + 2].copy_from_slice(&(s as i16).to_le_bytes());
        }
        block[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

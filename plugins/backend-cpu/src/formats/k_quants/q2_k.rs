//! Q2_K: super-blocks of 256 weights in 16 sub-blocks of 16.
//!
//! Layout: `scales[16]` (low nibble: scale, high nibble: min of each sub-block), `qs[64]`
//! (2-bit quants), `d: f16`, `dmin: f16`. Element `i = 128h + 32s + l` (h < 2, s < 4, l < 32)
//! is bits `2s..2s+2` of `qs[32h + l]`; its value is `d·scale · q − dmin·min` with the
//! scale and min of sub-block `i / 16`.

use super::{q8_k, QK_K};
use crate::formats::f16_at;

pub const BLOCK_ELEMS: usize = QK_K;
pub const BLOCK_BYTES: usize = QK_K / 16 + QK_K / 4 + 2 + 2;

pub(crate) const QS: usize = QK_K / 16;
pub(crate) const D: usize = QS + QK_K / 4;

#[inline]
pub(crate) fn quant(block: &[u8], i: usize) -> i32 {
    let (h, s, l) = (i / 128, (i % 128) / 32, i % 32);
    ((block[QS + 32 * h + l] >> (2 * s)) & 3) as i32
}

pub fn dequantize_row(src: &[u8], out: &mut [f32]) {
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = f16_at(block, D);
        let dmin = f16_at(block, D + 2);
        for (i, o) in out.iter_mut().enumerate() {
            let sc = block[i / 16];
            let dl = d * (sc & 0x0F) as f32;
            let ml = dmin * (sc >> 4) as f32;
            *o = dl * quant(block, i) as f32 - ml;
        }
    }
}

pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(BLOCK_BYTES)
        .zip(a.chunks_exact(q8_k::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / BLOCK_ELEMS) {
        let (mut isum, mut msum) = (0i32, 0i32);
        for g in 0..QK_K / 16 {
            let sc = wb[g];
            let gsum: i32 = (16 * g..16 * g + 16)
                .map(|i| quant(wb, i) * q8_k::quant(ab, i))
                .sum();
            isum += (sc & 0x0F) as i32 * gsum;
            msum += (sc >> 4) as i32 * q8_k::bsum(ab, g);
        }
        let d_a = q8_k::d(ab);
        sum += d_a * f16_at(wb, D) * isum as f32 - d_a * f16_at(wb, D + 2) * msum as f32;
    }
    sum
}

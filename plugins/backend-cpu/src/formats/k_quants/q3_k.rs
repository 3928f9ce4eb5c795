//! Q3_K: super-blocks of 256 weights in 16 sub-blocks of 16, no mins.
//!
//! Layout: `hmask[32]`, `qs[64]` (low 2 bits), `scales[12]` (16 packed 6-bit scales), `d: f16`.
//! Element `i = 128h + 32s + l` takes its low 2 bits from bits `2s..2s+2` of `qs[32h + l]`;
//! its high bit is bit `i / 32` of `hmask[i % 32]`, and a *clear* high bit subtracts 4, so
//! `q ∈ −4..=3`. Scale `j` is `(low 4 bits) | (high 2 bits) << 4` minus 32, with the low bits
//! in the nibble `j / 8` of byte `j % 8` and the high bits at bit `2(j / 4)` of byte
//! `8 + j % 4`. The value is `d · scale · q`.

use super::{q8_k, QK_K};
use crate::formats::f16_at;

pub const BLOCK_ELEMS: usize = QK_K;
pub const BLOCK_BYTES: usize = QK_K / 8 + QK_K / 4 + 12 + 2;

pub(crate) const QS: usize = QK_K / 8;
pub(crate) const SCALES: usize = QS + QK_K / 4;
pub(crate) const D: usize = SCALES + 12;

#[inline]
pub(crate) fn quant(block: &[u8], i: usize) -> i32 {
    let (h, s, l) = (i / 128, (i % 128) / 32, i % 32);
    let low = ((block[QS + 32 * h + l] >> (2 * s)) & 3) as i32;
    let high_set = (block[i % 32] >> (i / 32)) & 1 == 1;
    if high_set {
        low
    } else {
        low - 4
    }
}

/// The 16 signed 6-bit sub-block scales.
pub(crate) fn scales(block: &[u8]) -> [i32; 16] {
    let packed = &block[SCALES..SCALES + 12];
    let mut out = [0i32; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = (packed[j % 8] >> (4 * (j / 8))) & 0x0F;
        let high = (packed[8 + j % 4] >> (2 * (j / 4))) & 0x03;
        *o = (low | high << 4) as i32 - 32;
    }
    out
}

pub fn dequantize_row(src: &[u8], out: &mut [f32]) {
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = f16_at(block, D);
        let sc = scales(block);
        for (i, o) in out.iter_mut().enumerate() {
            *o = d * sc[i / 16] as f32 * quant(block, i) as f32;
        }
    }
}

pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(BLOCK_BYTES)
        .zip(a.chunks_exact(q8_k::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / BLOCK_ELEMS) {
        let sc = scales(wb);
        let mut isum = 0i32;
        for (g, s) in sc.iter().enumerate() {
            let gsum: i32 = (16 * g..16 * g + 16)
                .map(|i| quant(wb, i) * q8_k::quant(ab, i))
                .sum();
            isum += s * gsum;
        }
        sum += q8_k::d(ab) * f16_at(wb, D) * isum as f32;
    }
    sum
}

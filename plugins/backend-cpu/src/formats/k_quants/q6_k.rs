//! Q6_K: super-blocks of 256 weights in 16 sub-blocks of 16, no mins.
//!
//! Layout: `ql[128]` (low 4 bits), `qh[64]` (high 2 bits), `scales[16]` (`i8`), `d: f16`.
//! Element `i = 128h + r` (h < 2, r < 128) takes its low nibble from nibble `r / 64` of
//! `ql[64h + r % 64]` and its high 2 bits from bits `2(r / 32)..` of `qh[32h + r % 32]`;
//! `q = bits − 32` and the value is `d · scale · q` of sub-block `i / 16`.

use super::{q8_k, QK_K};
use crate::formats::f16_at;

pub const BLOCK_ELEMS: usize = QK_K;
pub const BLOCK_BYTES: usize = QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;

/// Byte offsets of `qh`, the scales and `d` in a block.
pub(crate) const QH: usize = QK_K / 2;
pub(crate) const SCALES: usize = QH + QK_K / 4;
pub(crate) const D: usize = SCALES + QK_K / 16;

#[inline]
pub(crate) fn quant(block: &[u8], i: usize) -> i32 {
    let (h, r) = (i / 128, i % 128);
    let low = (block[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
    let high = (block[QH + 32 * h + r % 32] >> (2 * (r / 32))) & 0x03;
    (low | high << 4) as i32 - 32
}

#[inline]
pub(crate) fn scale(block: &[u8], g: usize) -> i32 {
    block[SCALES + g] as i8 as i32
}

pub fn dequantize_row(src: &[u8], out: &mut [f32]) {
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = f16_at(block, D);
        for (i, o) in out.iter_mut().enumerate() {
            *o = d * scale(block, i / 16) as f32 * quant(block, i) as f32;
        }
    }
}

pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(BLOCK_BYTES)
        .zip(a.chunks_exact(q8_k::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / BLOCK_ELEMS) {
        let mut isum = 0i32;
        for g in 0..QK_K / 16 {
            let gsum: i32 = (16 * g..16 * g + 16)
                .map(|i| quant(wb, i) * q8_k::quant(ab, i))
                .sum();
            isum += scale(wb, g) * gsum;
        }
        sum += q8_k::d(ab) * f16_at(wb, D) * isum as f32;
    }
    sum
}

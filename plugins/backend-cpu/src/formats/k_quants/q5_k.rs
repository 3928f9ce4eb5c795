//! Q5_K: super-blocks of 256 weights in 8 sub-blocks of 32.
//!
//! Layout: `d: f16`, `dmin: f16`, `scales[12]` (as Q4_K), `qh[32]`, `qs[128]`. The low 4
//! bits of element `i` are nibbled as in Q4_K; its 5th bit is bit `i / 32` of `qh[i % 32]`.
//! The value is `d·scale · q − dmin·min` of sub-block `i / 32`.

use super::{q4_k::low_nibble_quant, q8_k, unpack_scale_min_k4, QK_K};
use crate::formats::f16_at;

pub const BLOCK_ELEMS: usize = QK_K;
pub const BLOCK_BYTES: usize = 2 + 2 + 12 + QK_K / 8 + QK_K / 2;

const SCALES: usize = 4;
/// Offsets in a block: the fifth bits (32 bytes), then the low nibbles (128).
pub(crate) const QH: usize = 16;
pub(crate) const QS: usize = QH + QK_K / 8;

#[inline]
pub(crate) fn quant(block: &[u8], i: usize) -> i32 {
    let high = ((block[QH + i % 32] >> (i / 32)) & 1) as i32;
    low_nibble_quant(block, QS, i) | high << 4
}

pub fn dequantize_row(src: &[u8], out: &mut [f32]) {
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = f16_at(block, 0);
        let dmin = f16_at(block, 2);
        let (sc, mn) = unpack_scale_min_k4(&block[SCALES..SCALES + 12]);
        for (i, o) in out.iter_mut().enumerate() {
            let dl = d * sc[i / 32] as f32;
            let ml = dmin * mn[i / 32] as f32;
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
        let (sc, mn) = unpack_scale_min_k4(&wb[SCALES..SCALES + 12]);
        let (mut isum, mut msum) = (0i32, 0i32);
        for sb in 0..8 {
            let ssum: i32 = (32 * sb..32 * sb + 32)
                .map(|i| quant(wb, i) * q8_k::quant(ab, i))
                .sum();
            isum += sc[sb] as i32 * ssum;
            msum += mn[sb] as i32 * (q8_k::bsum(ab, 2 * sb) + q8_k::bsum(ab, 2 * sb + 1));
        }
        let d_a = q8_k::d(ab);
        sum += d_a * f16_at(wb, 0) * isum as f32 - d_a * f16_at(wb, 2) * msum as f32;
    }
    sum
}

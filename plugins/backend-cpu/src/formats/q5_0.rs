//! Q5_0: blocks of 32 weights, `d: f16`, `qh: u32` (little-endian), 16 bytes of low nibbles.
//!
//! Element `i`'s low 4 bits are nibbled as in Q4_0 and its 5th bit is bit `i` of `qh`;
//! each value is `d · (q − 16)`. Dotted against Q8_0 activations.

use super::{f16_at, q8_0};

pub const BLOCK_ELEMS: usize = 32;
pub const BLOCK_BYTES: usize = 2 + 4 + 16;

/// The unsigned 5-bit quant of element `i` of a block whose `qh` starts at `qh_off` and
/// nibbles at `qh_off + 4` (shared with Q5_1).
#[inline]
pub(crate) fn quant5(block: &[u8], qh_off: usize, i: usize) -> i32 {
    let qh = u32::from_le_bytes([
        block[qh_off],
        block[qh_off + 1],
        block[qh_off + 2],
        block[qh_off + 3],
    ]);
    let byte = block[qh_off + 4 + i % 16];
    let low = if i < 16 { byte & 0x0F } else { byte >> 4 };
    (low as u32 | ((qh >> i) & 1) << 4) as i32
}

pub fn dequantize_row(src: &[u8], out: &mut [f32]) {
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = f16_at(block, 0);
        for (i, o) in out.iter_mut().enumerate() {
            *o = d * (quant5(block, 2, i) - 16) as f32;
        }
    }
}

pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(BLOCK_BYTES)
        .zip(a.chunks_exact(q8_0::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / BLOCK_ELEMS) {
        let mut isum = 0i32;
        for i in 0..BLOCK_ELEMS {
            isum += (quant5(wb, 2, i) - 16) * q8_0::quant(ab, i);
        }
        sum += isum as f32 * f16_at(wb, 0) * f16_at(ab, 0);
    }
    sum
}

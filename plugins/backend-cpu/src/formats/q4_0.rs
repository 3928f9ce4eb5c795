//! Q4_0: blocks of 32 weights, `d: f16` then 16 bytes of 4-bit quants.
//!
//! Byte `j` holds element `j` in its low nibble and element `j + 16` in its high nibble;
//! each value is `d · (q − 8)`. Dotted against Q8_0 activations.

use super::{f16_at, q8_0};

pub const BLOCK_ELEMS: usize = 32;
pub const BLOCK_BYTES: usize = 2 + 16;

/// The signed quant of element `i` of a block.
#[inline]
fn quant(block: &[u8], i: usize) -> i32 {
    let byte = block[2 + i % 16];
    let nibble = if i < 16 { byte & 0x0F } else { byte >> 4 };
    nibble as i32 - 8
}

pub fn dequantize_row(src: &[u8], out: &mut [f32]) {
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = f16_at(block, 0);
        for (i, o) in out.iter_mut().enumerate() {
            *o = d * quant(block, i) as f32;
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
            isum += quant(wb, i) * q8_0::quant(ab, i);
        }
        sum += isum as f32 * f16_at(wb, 0) * f16_at(ab, 0);
    }
    sum
}

//! Q4_1: blocks of 32 weights, `d: f16`, `m: f16`, then 16 bytes of 4-bit quants.
//!
//! Nibble order as in Q4_0; each value is `d · q + m`. Dotted against Q8_1 activations,
//! whose `s = d_a · Σ q_a` carries the `m` term: `Σ (d q + m) d_a q_a = d d_a Σ q q_a + m s`.

use super::{f16_at, q8_1};

pub const BLOCK_ELEMS: usize = 32;
pub const BLOCK_BYTES: usize = 2 + 2 + 16;

#[inline]
fn quant(block: &[u8], i: usize) -> i32 {
    let byte = block[4 + i % 16];
    (if i < 16 { byte & 0x0F } else { byte >> 4 }) as i32
}

pub fn dequantize_row(src: &[u8], out: &mut [f32]) {
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = f16_at(block, 0);
        let m = f16_at(block, 2);
        for (i, o) in out.iter_mut().enumerate() {
            *o = d * quant(block, i) as f32 + m;
        }
    }
}

pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(BLOCK_BYTES)
        .zip(a.chunks_exact(q8_1::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / BLOCK_ELEMS) {
        let mut isum = 0i32;
        for i in 0..BLOCK_ELEMS {
            isum += quant(wb, i) * q8_1::quant(ab, i);
        }
        let (d, m) = (f16_at(wb, 0), f16_at(wb, 2));
        let (d_a, s_a) = (f16_at(ab, 0), f16_at(ab, 2));
        sum += d * d_a * isum as f32 + m * s_a;
    }
    sum
}

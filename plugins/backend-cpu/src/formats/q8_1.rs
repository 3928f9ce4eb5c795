//! Q8_1: the activation type of Q4_1 and Q5_1 weights. Blocks of 32: `d: f16`,
//! `s: f16 = d · Σ q`, then 32 `i8` quants; each value is `d · q`.
//!
//! Quantized like Q8_0 (`d = max|x| / 127`, round half away from zero); `s` lets a weight
//! with a min offset `m` add `m · Σ x` without a second pass over the block.

use super::{f16_at, put_f16, round_half_away};

pub const BLOCK_ELEMS: usize = 32;
pub const BLOCK_BYTES: usize = 2 + 2 + 32;

#[inline]
pub(crate) fn quant(block: &[u8], i: usize) -> i32 {
    block[4 + i] as i8 as i32
}

pub fn dequantize_row(src: &[u8], out: &mut [f32]) {
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = f16_at(block, 0);
        for (i, o) in out.iter_mut().enumerate() {
            *o = quant(block, i) as f32 * d;
        }
    }
}

pub fn quantize_row(x: &[f32], out: &mut [u8]) {
    for (xs, block) in x
        .chunks_exact(BLOCK_ELEMS)
        .zip(out.chunks_exact_mut(BLOCK_BYTES))
    {
        let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qsum = 0i32;
        for (q, v) in block[4..].iter_mut().zip(xs) {
            let qi = round_half_away(v * id) as i8;
            qsum += qi as i32;
            *q = qi as u8;
        }
        put_f16(block, 0, d);
        put_f16(block, 2, qsum as f32 * d);
    }
}

//! Q8_0: blocks of 32 values, `d: f16` then 32 `i8` quants; each value is `d · q`.
//!
//! Both a weight format (dotted against Q8_0) and the activation type of Q4_0, Q5_0 and
//! Q8_0 weights. Quantization: `d = max|x| / 127`, `q = round(x / d)` half away from zero.

use super::{f16_at, put_f16, round_half_away};

pub const BLOCK_ELEMS: usize = 32;
pub const BLOCK_BYTES: usize = 2 + 32;

#[inline]
pub(crate) fn quant(block: &[u8], i: usize) -> i32 {
    block[2 + i] as i8 as i32
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
        put_f16(block, 0, d);
        for (q, v) in block[2..].iter_mut().zip(xs) {
            *q = round_half_away(v * id) as i8 as u8;
        }
    }
}

pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    let blocks = w.chunks_exact(BLOCK_BYTES).zip(a.chunks_exact(BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / BLOCK_ELEMS) {
        let mut isum = 0i32;
        for i in 0..BLOCK_ELEMS {
            isum += quant(wb, i) * quant(ab, i);
        }
        sum += isum as f32 * (f16_at(wb, 0) * f16_at(ab, 0));
    }
    sum
}

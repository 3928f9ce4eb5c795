//! IQ4_NL: blocks of 32 weights, `d: f16` then 16 bytes of 4-bit indices into the fixed
//! non-linear table [`KVALUES`] (llama.cpp's `kvalues_iq4nl`).
//!
//! Byte `j` holds element `j` in its low nibble and element `j + 16` in its high nibble
//! (Q4_0's order); each value is `d · KVALUES[index]`. Dotted against Q8_0 activations.
//!
//! Float order (llama.cpp's): per block `sum += isum · (d_w · d_a)`, the integer sum of
//! table values × activation quants exact, blocks added in order.

use super::{f16_at, q8_0};

pub const BLOCK_ELEMS: usize = 32;
pub const BLOCK_BYTES: usize = 2 + 16;

/// The 16 values a 4-bit index stands for: denser near zero, where weights crowd.
pub const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The table value of element `i` of the nibbles at `qs` (16 bytes, Q4_0's order).
#[inline]
pub(crate) fn value(qs: &[u8], i: usize) -> i32 {
    let byte = qs[i % 16];
    let nibble = if i < 16 { byte & 0x0F } else { byte >> 4 };
    KVALUES[nibble as usize] as i32
}

pub fn dequantize_row(src: &[u8], out: &mut [f32]) {
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = f16_at(block, 0);
        for (i, o) in out.iter_mut().enumerate() {
            *o = d * value(&block[2..], i) as f32;
        }
    }
}

pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(BLOCK_BYTES)
        .zip(a.chunks_exact(q8_0::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / BLOCK_ELEMS) {
        let isum: i32 = (0..BLOCK_ELEMS)
            .map(|i| value(&wb[2..], i) * q8_0::quant(ab, i))
            .sum();
        sum += isum as f32 * (f16_at(wb, 0) * f16_at(ab, 0));
    }
    sum
}

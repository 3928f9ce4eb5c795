//! MXFP4 (OCP microscaling FP4, gpt-oss's expert format): blocks of 32 weights, `e: u8`
//! (an E8M0 power-of-two scale) then 16 bytes of 4-bit FP4 (E2M1) codes.
//!
//! Byte `j` holds element `j` in its low nibble and element `j + 16` in its high nibble
//! (Q4_0's order). As in llama.cpp, a code stands for twice its E2M1 value ([`KVALUES`],
//! integers) and the scale is halved to match ([`e8m0_half`]): each value is
//! `e8m0_half(e) · KVALUES[code]`. Dotted against Q8_0 activations, like IQ4_NL, which
//! differs only in its table and its f16 scale.
//!
//! Float order (llama.cpp's): per block `sum += isum · (e8m0_half(e) · d_a)`, the integer
//! sum of table values × activation quants exact, blocks added in order.

use super::{f16_at, q8_0};

pub const BLOCK_ELEMS: usize = 32;
pub const BLOCK_BYTES: usize = 1 + 16;

/// Twice the E2M1 value of each 4-bit code (sign bit 3, then two exponent bits and one
/// mantissa bit): 0, 0.5, 1, 1.5, 2, 3, 4, 6 doubled, then the same negated (code 8 is
/// −0, here 0).
pub const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half the E8M0 scale `2^(e − 127)`, that is `2^(e − 128)`, exactly, for every byte:
/// `e` 0 and 1 give the f32 subnormals `2^-128` and `2^-127`, `e` 255 gives `2^127`.
/// E8M0's NaN (255) is not special-cased, as llama.cpp does not (its loader's optional
/// validation refuses it; its kernels compute with `2^127`).
#[inline]
pub fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits((e as u32 - 1) << 23)
    }
}

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
        let d = e8m0_half(block[0]);
        for (i, o) in out.iter_mut().enumerate() {
            *o = value(&block[1..], i) as f32 * d;
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
            .map(|i| value(&wb[1..], i) * q8_0::quant(ab, i))
            .sum();
        sum += isum as f32 * (e8m0_half(wb[0]) * f16_at(ab, 0));
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_half_is_two_to_the_e_minus_128() {
        for e in 0..=255u8 {
            assert_eq!(e8m0_half(e), 2f64.powi(e as i32 - 128) as f32, "e = {e}");
        }
    }
}

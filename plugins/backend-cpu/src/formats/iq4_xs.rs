//! IQ4_XS: super-blocks of 256 weights in 8 sub-blocks of 32, each value an index into
//! IQ4_NL's non-linear table ([`iq4_nl::KVALUES`]) times a 6-bit signed sub-block scale.
//!
//! Layout: `d: f16`, `scales_h: u16` (2 high scale bits per sub-block, sub-block `s` at bits
//! `2s..2s+2`), `scales_l[4]` (4 low bits, sub-block `s` in nibble `s % 2` of byte `s / 2`),
//! `qs[128]` (16 bytes per sub-block in IQ4_NL's nibble order). Sub-block `s`'s scale is
//! `ls − 32` with `ls` those 6 bits; each value is `d · (ls − 32) · KVALUES[index]`. Dotted
//! against Q8_K activations.
//!
//! Float order (llama.cpp's x86 kernels'): per super-block the integer
//! `isum = Σ_s (ls_s − 32) · Σ value · q` (exact), then `sum += (d_w · d_a) · isum`, super-blocks
//! added in order.

use super::f16_at;
use super::iq4_nl;
use super::k_quants::{q8_k, QK_K};

pub const BLOCK_ELEMS: usize = QK_K;
pub const BLOCK_BYTES: usize = 2 + 2 + QK_K / 64 + QK_K / 2;

const SCALES_H: usize = 2;
const SCALES_L: usize = 4;
pub(crate) const QS: usize = 8;

/// The signed scales (`ls − 32`) of the 8 sub-blocks of `block`.
#[inline]
pub(crate) fn scales(block: &[u8]) -> [i32; 8] {
    let h = u16::from_le_bytes([block[SCALES_H], block[SCALES_H + 1]]) as i32;
    core::array::from_fn(|s| {
        let low = (block[SCALES_L + s / 2] >> (4 * (s % 2))) as i32 & 0x0F;
        (low | (((h >> (2 * s)) & 3) << 4)) - 32
    })
}

pub fn dequantize_row(src: &[u8], out: &mut [f32]) {
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = f16_at(block, 0);
        for ((s, ls), out) in scales(block)
            .into_iter()
            .enumerate()
            .zip(out.chunks_exact_mut(32))
        {
            let dl = d * ls as f32;
            let qs = &block[QS + 16 * s..QS + 16 * s + 16];
            for (i, o) in out.iter_mut().enumerate() {
                *o = dl * iq4_nl::value(qs, i) as f32;
            }
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
        for (s, ls) in scales(wb).into_iter().enumerate() {
            let qs = &wb[QS + 16 * s..QS + 16 * s + 16];
            let ssum: i32 = (0..32)
                .map(|i| iq4_nl::value(qs, i) * q8_k::quant(ab, 32 * s + i))
                .sum();
            isum += ls * ssum;
        }
        sum += f16_at(wb, 0) * q8_k::d(ab) * isum as f32;
    }
    sum
}

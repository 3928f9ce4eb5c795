//! NEON kernels for the 32-element block quants (Q4_0, Q4_1, Q5_0, Q8_0): each block's
//! 32 products in vector lanes (`vmull_s8`/`vmlal_high_s8` into i16, pairwise widening
//! adds into i32), the block's float term as the scalar kernel computes it.
//!
//! Not here yet: the dot-product extension (`sdot`), K-quants and prefill tiles; those
//! formats keep the scalar kernels on aarch64.

use crate::formats::{f16_at, q4_0, q4_1, q5_0, q8_0, q8_1, FormatKernels};
use core::arch::aarch64::*;
use prima_core::gguf::GgmlType;

/// Replaces the functions of `k` (the scalar table) that have a NEON version.
pub(in crate::formats) fn overlay(mut k: FormatKernels) -> FormatKernels {
    use GgmlType as T;
    k.vec_dot = match k.weight_type {
        T::Q4_0 => dot_q4_0,
        T::Q4_1 => dot_q4_1,
        T::Q5_0 => dot_q5_0,
        T::Q8_0 => dot_q8_0,
        _ => k.vec_dot,
    };
    k
}

/// `Σ x·y` over 16 + 16 signed bytes: `(x_lo, x_hi)` against 32 activation bytes at `y`.
/// The i16 lanes hold two products each, at most 2 · 128 · 127 in size (activations from
/// the quantizers are within ±127), so nothing saturates.
#[inline]
fn dot32(x_lo: int8x16_t, x_hi: int8x16_t, y: &[u8]) -> i32 {
    assert!(y.len() >= 32);
    // SAFETY: NEON is part of the aarch64 baseline; `y` holds at least 32 bytes (above).
    unsafe {
        let y_lo = vld1q_s8(y.as_ptr() as *const i8);
        let y_hi = vld1q_s8(y.as_ptr().add(16) as *const i8);
        let p_lo = vmlal_high_s8(vmull_s8(vget_low_s8(x_lo), vget_low_s8(y_lo)), x_lo, y_lo);
        let p_hi = vmlal_high_s8(vmull_s8(vget_low_s8(x_hi), vget_low_s8(y_hi)), x_hi, y_hi);
        vaddvq_s32(vaddq_s32(vpaddlq_s16(p_lo), vpaddlq_s16(p_hi)))
    }
}

/// The 16 quant bytes at `qs[..16]` as low nibbles (elements 0..16) and high nibbles
/// (elements 16..32), each minus `offset`.
#[inline]
fn nibbles(qs: &[u8], offset: i8) -> (int8x16_t, int8x16_t) {
    assert!(qs.len() >= 16);
    // SAFETY: NEON is baseline; `qs` holds at least 16 bytes (above).
    unsafe {
        let q = vld1q_u8(qs.as_ptr());
        let lo = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F)));
        let hi = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
        let off = vdupq_n_s8(offset);
        (vsubq_s8(lo, off), vsubq_s8(hi, off))
    }
}

fn dot_q4_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(q4_0::BLOCK_BYTES)
        .zip(a.chunks_exact(q8_0::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / 32) {
        let (lo, hi) = nibbles(&wb[2..], 8);
        let isum = dot32(lo, hi, &ab[2..]);
        sum += isum as f32 * f16_at(wb, 0) * f16_at(ab, 0);
    }
    sum
}

fn dot_q4_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(q4_1::BLOCK_BYTES)
        .zip(a.chunks_exact(q8_1::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / 32) {
        let (lo, hi) = nibbles(&wb[4..], 0);
        let isum = dot32(lo, hi, &ab[4..]);
        let (d, m) = (f16_at(wb, 0), f16_at(wb, 2));
        let (d_a, s_a) = (f16_at(ab, 0), f16_at(ab, 2));
        sum += d * d_a * isum as f32 + m * s_a;
    }
    sum
}

fn dot_q5_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(q5_0::BLOCK_BYTES)
        .zip(a.chunks_exact(q8_0::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / 32) {
        // Bit i of the 32-bit `qh` is the fifth bit of element i; the value is q − 16.
        let (lo, hi) = nibbles(&wb[6..], 0);
        // SAFETY: NEON is baseline.
        let (lo, hi) = unsafe {
            let bit =
                vld1q_u8([1u8, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128].as_ptr());
            // 0x10 in lane i where bit i of the two `qh` bytes at `qh` is set.
            let fifth = |qh: &[u8]| {
                let bytes = vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1]));
                vreinterpretq_s8_u8(vandq_u8(vtstq_u8(bytes, bit), vdupq_n_u8(0x10)))
            };
            let sixteen = vdupq_n_s8(16);
            (
                vsubq_s8(vorrq_s8(lo, fifth(&wb[2..4])), sixteen),
                vsubq_s8(vorrq_s8(hi, fifth(&wb[4..6])), sixteen),
            )
        };
        let isum = dot32(lo, hi, &ab[2..]);
        sum += isum as f32 * f16_at(wb, 0) * f16_at(ab, 0);
    }
    sum
}

fn dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(q8_0::BLOCK_BYTES)
        .zip(a.chunks_exact(q8_0::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / 32) {
        // SAFETY: NEON is baseline; a Q8_0 block holds 2 + 32 bytes.
        let (lo, hi) = unsafe {
            (
                vld1q_s8(wb.as_ptr().add(2) as *const i8),
                vld1q_s8(wb.as_ptr().add(18) as *const i8),
            )
        };
        let isum = dot32(lo, hi, &ab[2..]);
        sum += isum as f32 * (f16_at(wb, 0) * f16_at(ab, 0));
    }
    sum
}

//! Unquantized formats: F32, F16 and BF16, each one element per "block".
//!
//! As in ggml, an F16 weight is dotted against activations rounded to F16 and a BF16 weight
//! against activations rounded to BF16 (round to nearest even); F32 against plain F32.
//! Products are exact in f32 for F16/BF16 operands; sums are accumulated in f32.

use super::{f32_at, put_f16};
use half::{bf16, f16};

pub fn dequantize_row_f32(src: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(src.chunks_exact(4)) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

pub fn dequantize_row_f16(src: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

pub fn dequantize_row_bf16(src: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

pub fn quantize_row_f32(x: &[f32], out: &mut [u8]) {
    for (v, b) in x.iter().zip(out.chunks_exact_mut(4)) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}

pub fn quantize_row_f16(x: &[f32], out: &mut [u8]) {
    for (i, v) in x.iter().enumerate().take(out.len() / 2) {
        put_f16(out, 2 * i, *v);
    }
}

/// Round to nearest even; NaNs stay NaN (`half` implements ggml's conversion).
pub fn quantize_row_bf16(x: &[f32], out: &mut [u8]) {
    for (v, b) in x.iter().zip(out.chunks_exact_mut(2)) {
        b.copy_from_slice(&bf16::from_f32(*v).to_le_bytes());
    }
}

pub fn vec_dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w.chunks_exact(4).zip(a.chunks_exact(4)).take(n) {
        sum += f32_at(wb, 0) * f32_at(ab, 0);
    }
    sum
}

pub fn vec_dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w.chunks_exact(2).zip(a.chunks_exact(2)).take(n) {
        sum += f16::from_le_bytes([wb[0], wb[1]]).to_f32()
            * f16::from_le_bytes([ab[0], ab[1]]).to_f32();
    }
    sum
}

pub fn vec_dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w.chunks_exact(2).zip(a.chunks_exact(2)).take(n) {
        sum += bf16::from_le_bytes([wb[0], wb[1]]).to_f32()
            * bf16::from_le_bytes([ab[0], ab[1]]).to_f32();
    }
    sum
}

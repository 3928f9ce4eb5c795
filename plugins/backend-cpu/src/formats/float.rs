//! Unquantized formats: F32, F16 and BF16, each one element per "block".
//!
//! As in ggml, an F16 weight is dotted against activations rounded to F16 and a BF16 weight
//! against activations rounded to BF16 (round to nearest even); F32 against plain F32.
//! Products are exact in f32 for F16/BF16 operands; sums are accumulated in f32 in the fixed
//! lane order of [`DOT_LANES`].

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

/// Lanes of the canonical float dot: element `i` is accumulated in lane `i % 16` (a mul,
/// then an add; no FMA), the lanes are folded by halving (`l + l+8`, `+4`, `+2`, `+1`) and
/// the `n % 16` tail elements are added after, in order. SIMD kernels of any width reproduce
/// this order exactly, so every kernel level returns the same bits.
pub const DOT_LANES: usize = 16;

/// Whether every product of a BF16 weight and a BF16 activation is exact in f32, given
/// the weights' smallest nonzero and largest magnitudes `(w_min, w_max)` and the
/// activations' `(a_min, a_max)` (a minimum of `+∞` where all are zero). Then a fused
/// multiply-add rounds exactly as the canonical multiply-then-add (one rounding either
/// way), which lets the panel kernels use FMA. A product of two 8-bit significands has at
/// most 16 bits, so it is exact whenever it is a normal f32: `|w·a| ≥ 2^-126` (no
/// underflow) and `< 2^128` (no overflow), bounded by `w_min·a_min` and `w_max·a_max`,
/// which are exact in f64. Zero products are exact; an infinite or NaN bound says no.
pub fn bf16_products_exact((w_min, w_max): (f32, f32), (a_min, a_max): (f32, f32)) -> bool {
    let (low, high) = (w_min as f64 * a_min as f64, w_max as f64 * a_max as f64);
    // NaN compares false both ways, so a NaN bound (or ∞·0) falls back too.
    low >= 2f64.powi(-126) && high < 2f64.powi(128)
}

fn dot_in_lanes(n: usize, mut product: impl FnMut(usize) -> f32) -> f32 {
    let full = n / DOT_LANES * DOT_LANES;
    let mut acc = [0.0f32; DOT_LANES];
    for base in (0..full).step_by(DOT_LANES) {
        for (l, a) in acc.iter_mut().enumerate() {
            *a += product(base + l);
        }
    }
    let mut width = DOT_LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    let mut sum = acc[0];
    for i in full..n {
        sum += product(i);
    }
    sum
}

pub fn vec_dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let n = n.min(w.len() / 4).min(a.len() / 4);
    dot_in_lanes(n, |i| f32_at(w, 4 * i) * f32_at(a, 4 * i))
}

pub fn vec_dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let n = n.min(w.len() / 2).min(a.len() / 2);
    let at = |b: &[u8], i: usize| f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32();
    dot_in_lanes(n, |i| at(w, i) * at(a, i))
}

pub fn vec_dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let n = n.min(w.len() / 2).min(a.len() / 2);
    let at = |b: &[u8], i: usize| bf16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32();
    dot_in_lanes(n, |i| at(w, i) * at(a, i))
}

/// `acc[i] += w · v[i]` over the F16 row `v` (little-endian bytes): a multiply, then an add
/// (no FMA), so every kernel level returns the same bits. Attention weights V rows with it.
pub fn axpy_f16(acc: &mut [f32], w: f32, v: &[u8]) {
    for (a, b) in acc.iter_mut().zip(v.chunks_exact(2)) {
        *a += w * f16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

/// [`super::AttentionF16::dots`] from the one-row `vec_dot_f16`.
pub fn dots_f16(
    n: usize,
    keys: &[u8],
    stride: usize,
    n_keys: usize,
    q: &[u8],
    n_q: usize,
    out: &mut [f32],
) {
    for h in 0..n_q {
        let qh = &q[2 * n * h..2 * n * (h + 1)];
        for (j, o) in out[h * n_keys..(h + 1) * n_keys].iter_mut().enumerate() {
            *o = vec_dot_f16(n, &keys[j * stride..j * stride + 2 * n], qh);
        }
    }
}

/// [`super::AttentionF16::axpys`] from the one-row [`axpy_f16`].
pub fn axpys_f16(
    n: usize,
    values: &[u8],
    stride: usize,
    n_rows: usize,
    w: &[f32],
    n_q: usize,
    acc: &mut [f32],
) {
    for h in 0..n_q {
        let acc = &mut acc[h * n..(h + 1) * n];
        for j in 0..n_rows {
            axpy_f16(
                acc,
                w[h * n_rows + j],
                &values[j * stride..j * stride + 2 * n],
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::bf16_products_exact;

    #[test]
    fn bf16_product_bounds() {
        let (inf, nan) = (f32::INFINITY, f32::NAN);
        let normal = (2f32.powi(-20), 4.0);
        assert!(bf16_products_exact(normal, normal));
        // Smallest products at the normal boundary: 2^-126 is exact, just below is not.
        assert!(bf16_products_exact(
            (2f32.powi(-63), 1.0),
            (2f32.powi(-63), 1.0)
        ));
        assert!(!bf16_products_exact(
            (2f32.powi(-63), 1.0),
            (2f32.powi(-64), 1.0)
        ));
        // Subnormal operands (2^-130) need a large partner.
        assert!(!bf16_products_exact((2f32.powi(-130), 1.0), normal));
        assert!(bf16_products_exact((2f32.powi(-130), 1.0), (16.0, 16.0)));
        // Largest products: below 2^128 is finite and exact, 2^128 overflows.
        assert!(bf16_products_exact(
            (1.0, 2f32.powi(64)),
            (1.0, 2f32.powi(63) * 1.5)
        ));
        assert!(!bf16_products_exact(
            (1.0, 2f32.powi(64)),
            (1.0, 2f32.powi(64))
        ));
        // All-zero operands: no nonzero product at all.
        assert!(bf16_products_exact((inf, 0.0), normal));
        assert!(bf16_products_exact(normal, (inf, 0.0)));
        assert!(bf16_products_exact((inf, 0.0), (inf, 0.0)));
        // Infinities and NaNs never take the fused path.
        assert!(!bf16_products_exact((1.0, inf), normal));
        assert!(!bf16_products_exact(normal, (1.0, nan)));
        assert!(!bf16_products_exact((1.0, inf), (inf, 0.0)));
        assert!(!bf16_products_exact((nan, nan), normal));
    }
}

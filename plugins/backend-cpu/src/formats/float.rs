//! Unquantized formats: F32, F16 and BF16, each one element per "block".
//!
//! As in ggml, an F16 weight is dotted against activations rounded to F16 and a BF16 weight
//! against activations rounded to BF16 (round to nearest even); F32 against plain F32.
//! Sums are accumulated in f32 in the fixed lane order of [`DOT_LANES`]. F32 terms are fused
//! multiply-adds (one rounding per term, as llama.cpp's F32 dot and sgemm compute them);
//! F16/BF16 terms a multiply, then an add, whose products are exact in f32 (always for F16,
//! for BF16 while they stay normal), so there fused and unfused round alike.

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

/// Round to nearest even; NaNs stay NaN, made quiet (ggml's conversion, and `half`'s).
pub fn quantize_row_bf16(x: &[f32], out: &mut [u8]) {
    for (v, b) in x.iter().zip(out.chunks_exact_mut(2)) {
        b.copy_from_slice(&bf16_bits(*v).to_le_bytes());
    }
}

/// `half::bf16::from_f32(x).to_bits()` without branches, so the row loop vectorizes
/// (prompts convert every activation row of every BF16 matmul): adding `0x7FFF` plus the
/// kept part's lowest bit carries into it exactly when the dropped half is above one half
/// ulp, or equal to it with that bit odd.
#[inline]
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    let nan = (b >> 16) as u16 | 0x40;
    if b & 0x7FFF_FFFF > 0x7F80_0000 {
        nan
    } else {
        rounded
    }
}

/// Lanes of the canonical float dot: element `i` is accumulated in lane `i % 16`, the lanes
/// are folded by halving (`l + l+8`, `+4`, `+2`, `+1`) and the `n % 16` tail elements are
/// added after, in order, onto the folded sum. Each term, in a lane or in the tail, is
/// `fma(w_i, a_i, acc)` for F32 (one rounding: llama.cpp's ggml `vec_dot_f32` and tinyBLAS
/// sgemm fuse too, and a fused tile is what keeps an AVX2 F32 prompt at par with them) and
/// `acc + w_i·a_i` for F16/BF16 (exact products: see [`bf16_products_exact`]). SIMD kernels
/// of any width reproduce this order and these roundings exactly, so every kernel level
/// returns the same bits. Without hardware FMA the scalar F32 dot pays for `f32::mul_add`'s
/// software fallback; every SIMD level here has the instruction.
pub const DOT_LANES: usize = 16;

/// Whether every product of a BF16 weight and a BF16 activation is exact in f32, given
/// the weights' smallest nonzero and largest magnitudes `(w_min, w_max)` and the
/// activations' `(a_min, a_max)` (a minimum of `+∞` where all are zero). Then a fused
/// multiply-add rounds exactly as BF16's canonical multiply-then-add (one rounding either
/// way), which lets the panel kernels use FMA. A product of two 8-bit significands has at
/// most 16 bits, so it is exact whenever it is a normal f32: `|w·a| ≥ 2^-126` (no
/// underflow) and `< 2^128` (no overflow), bounded by `w_min·a_min` and `w_max·a_max`,
/// which are exact in f64. Zero products are exact; an infinite or NaN bound says no.
pub fn bf16_products_exact((w_min, w_max): (f32, f32), (a_min, a_max): (f32, f32)) -> bool {
    let (low, high) = (w_min as f64 * a_min as f64, w_max as f64 * a_max as f64);
    // NaN compares false both ways, so a NaN bound (or ∞·0) falls back too.
    low >= 2f64.powi(-126) && high < 2f64.powi(128)
}

/// The [`DOT_LANES`] order with `term(i, acc)` adding element `i`'s product to `acc`.
fn dot_in_lanes(n: usize, mut term: impl FnMut(usize, f32) -> f32) -> f32 {
    let full = n / DOT_LANES * DOT_LANES;
    let mut acc = [0.0f32; DOT_LANES];
    for base in (0..full).step_by(DOT_LANES) {
        for (l, a) in acc.iter_mut().enumerate() {
            *a = term(base + l, *a);
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
        sum = term(i, sum);
    }
    sum
}

/// Fused: each term is `fma(w_i, a_i, acc)` (see [`DOT_LANES`]).
pub fn vec_dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let n = n.min(w.len() / 4).min(a.len() / 4);
    dot_in_lanes(n, |i, acc| f32_at(w, 4 * i).mul_add(f32_at(a, 4 * i), acc))
}

pub fn vec_dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let n = n.min(w.len() / 2).min(a.len() / 2);
    let at = |b: &[u8], i: usize| f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32();
    dot_in_lanes(n, |i, acc| acc + at(w, i) * at(a, i))
}

pub fn vec_dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let n = n.min(w.len() / 2).min(a.len() / 2);
    let at = |b: &[u8], i: usize| bf16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32();
    dot_in_lanes(n, |i, acc| acc + at(w, i) * at(a, i))
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

/// The magnitudes of a set of BF16 values, as sign-cleared bits (which order as the
/// magnitudes do, NaN above infinity above every finite value): the largest, and the
/// smallest nonzero (`0x7FFF` when none is). Kernels whose hardware flushes subnormals
/// (DAZ/FTZ) use it to prove the scalar dot's sums never meet one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bf16Range {
    pub max: u16,
    pub min_nonzero: u16,
}

impl Bf16Range {
    /// The range of no values.
    pub const EMPTY: Bf16Range = Bf16Range {
        max: 0,
        min_nonzero: 0x7FFF,
    };

    /// The range of the values with these bits.
    pub fn of(bits: impl IntoIterator<Item = u16>) -> Bf16Range {
        bits.into_iter().fold(Bf16Range::EMPTY, |r, b| {
            let m = b & 0x7FFF;
            Bf16Range {
                max: r.max.max(m),
                min_nonzero: if m == 0 {
                    r.min_nonzero
                } else {
                    r.min_nonzero.min(m)
                },
            }
        })
    }

    /// The range of both sets.
    pub fn merge(self, o: Bf16Range) -> Bf16Range {
        Bf16Range {
            max: self.max.max(o.max),
            min_nonzero: self.min_nonzero.min(o.min_nonzero),
        }
    }
}

/// Whether a BF16 dot of `n` elements, weights in `w` and activations in `a`, keeps every
/// product and every lane's partial sum of [`DOT_LANES`]'s order normal or zero, and finite,
/// so hardware that flushes subnormal inputs and results to zero (`vdpbf16ps`) returns the
/// scalar bits. Inputs must be finite and normal. A nonzero BF16 value of exponent `≥ E` is
/// a multiple of `2^(E−7)`, so every product, and every sum of products rounded to f32, is
/// a multiple of `q = 2^(E_w + E_a − 14)` (`E` of the smallest nonzero magnitudes): a
/// nonzero one is at least `q`, normal when `q ≥ 2^−126`. Each sum is at most
/// `n · 2^(E_w' + 1) · 2^(E_a' + 1)` (`E'` of the largest) times the rounding's growth,
/// under 2 for `n < 2^22`: finite when that stays under `2^127`.
pub fn bf16_lane_sums_normal(w: Bf16Range, a: Bf16Range, n: usize) -> bool {
    const INF: u16 = 0x7F80;
    const MIN_NORMAL: u16 = 0x0080;
    let exp = |bits: u16| (bits >> 7) as i32 - 127;
    let n_bits = (usize::BITS - n.leading_zeros()) as i32;
    w.max < INF
        && a.max < INF
        && w.min_nonzero >= MIN_NORMAL
        && a.min_nonzero >= MIN_NORMAL
        && n < 1 << 22
        && exp(w.min_nonzero) + exp(a.min_nonzero) - 14 >= -126
        && n_bits + exp(w.max) + exp(a.max) + 3 <= 127
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(v: &[f32]) -> Bf16Range {
        Bf16Range::of(v.iter().map(|x| bf16::from_f32(*x).to_bits()))
    }

    /// Rows of `chunks` 16-element chunks and a tail of `tail ≥ 2` where fusing matters:
    /// lane `lane` adds `x·x` (`x = 1 + 2^-12`, `x² = 1 + 2^-11 + 2^-24`) to `−1` in the last
    /// chunk, and the tail adds `−1`, then `x·x`, to the folded sum. Fused, every step is
    /// exact: the lane `2^-11 + 2^-24`, the dot `2^-10 + 2^-23`. Unfused, `x·x` rounds to
    /// `1 + 2^-11` (a tie, to even) both times: `2^-10`.
    fn fused_rows(chunks: usize, tail: usize, lane: usize) -> (Vec<u8>, Vec<u8>) {
        let n = 16 * chunks + tail;
        let (mut w, mut a) = (vec![0.0f32; n], vec![0.0f32; n]);
        let x = 1.0 + 2f32.powi(-12);
        for (i, wi, ai) in [
            (lane, 1.0, -1.0),
            (16 * (chunks - 1) + lane, x, x),
            (16 * chunks, 1.0, -1.0),
            (n - 1, x, x),
        ] {
            (w[i], a[i]) = (wi, ai);
        }
        let bytes = |v: Vec<f32>| v.iter().flat_map(|f| f.to_le_bytes()).collect();
        (bytes(w), bytes(a))
    }

    #[test]
    fn f32_dot_fuses_each_term() {
        let fused = 2f32.powi(-10) + 2f32.powi(-23);
        for (chunks, tail) in [(2, 2), (3, 5), (62, 8)] {
            for lane in 0..16 {
                let (w, a) = fused_rows(chunks, tail, lane);
                let n = 16 * chunks + tail;
                assert_eq!(
                    vec_dot_f32(n, &w, &a),
                    fused,
                    "{chunks} chunks, lane {lane}"
                );
            }
        }
    }

    #[test]
    fn bf16_conversion_is_halfs() {
        // Every sign and exponent with the rounding-sensitive low halves, and a stride
        // through all the rest.
        let lows = [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF];
        let edges = (0..1u32 << 16).flat_map(|hi| lows.map(|lo| hi << 16 | lo));
        let stride = (0..u32::MAX / 7919).map(|i| i * 7919 + 13);
        for b in edges.chain(stride) {
            let x = f32::from_bits(b);
            assert_eq!(bf16_bits(x), bf16::from_f32(x).to_bits(), "{b:#010x}");
        }
    }

    #[test]
    fn bf16_range_bounds_the_lane_sums() {
        let ones = range(&[1.0, -0.5, 0.0]);
        assert_eq!(
            ones,
            Bf16Range {
                max: 0x3F80,
                min_nonzero: 0x3F00
            }
        );
        assert_eq!(range(&[0.0, -0.0]), Bf16Range::EMPTY);
        assert!(bf16_lane_sums_normal(ones, ones, 4096));
        // Smallest products: 2^-56 · 2^-56 = 2^-112 leaves a floor of 2^-126, just normal.
        let tiny = range(&[2f32.powi(-56), 1.0]);
        assert!(bf16_lane_sums_normal(tiny, tiny, 64));
        let tinier = range(&[2f32.powi(-57), 1.0]);
        assert!(!bf16_lane_sums_normal(tinier, tiny, 64));
        // Subnormal, infinite and NaN inputs never qualify.
        let sub = range(&[f32::from_bits(0x0040_0000), 1e30]);
        assert!(!bf16_lane_sums_normal(sub, ones, 16));
        assert!(!bf16_lane_sums_normal(ones, range(&[f32::INFINITY]), 16));
        assert!(!bf16_lane_sums_normal(range(&[f32::NAN]), ones, 16));
        // Largest: 15 products of 2^60 · 2^60 (each under 2^122) stay under 2^127 with
        // the margin, 16 do not.
        let big = range(&[2f32.powi(60)]);
        assert!(bf16_lane_sums_normal(big, big, 15));
        assert!(!bf16_lane_sums_normal(big, big, 16));
        // All zeros: nothing to flush or overflow.
        assert!(bf16_lane_sums_normal(Bf16Range::EMPTY, ones, 1000));
    }

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

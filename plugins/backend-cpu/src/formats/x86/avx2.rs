//! AVX2 + FMA + F16C kernels: every weight format's `vec_dot`, and the Q8_0, Q8_1 and Q8_K
//! activation quantizers.
//!
//! All functions here are `unsafe` only because they use these instructions; see
//! `formats::x86` for the numerics contract and how the safe wrappers are guarded.

use crate::formats::k_quants::{q2_k, q3_k, q4_k, q5_k, q6_k, q8_k, QK_K};
use crate::formats::{put_f16, q4_0, q4_1, q5_0, q5_1, q8_0, q8_1, FormatKernels};
use core::arch::x86_64::*;
use prima_abi::GgmlType;

/// Replaces the functions of `k` (the scalar table) that have an AVX2 version.
pub(in crate::formats) fn overlay(mut k: FormatKernels) -> FormatKernels {
    use GgmlType as T;
    k.vec_dot = match k.weight_type {
        T::F32 => vec_dot_f32,
        T::F16 => vec_dot_f16,
        T::BF16 => vec_dot_bf16,
        T::Q4_0 => vec_dot_q4_0,
        T::Q4_1 => vec_dot_q4_1,
        T::Q5_0 => vec_dot_q5_0,
        T::Q5_1 => vec_dot_q5_1,
        T::Q8_0 => vec_dot_q8_0,
        T::Q2K => vec_dot_q2_k,
        T::Q3K => vec_dot_q3_k,
        T::Q4K => vec_dot_q4_k,
        T::Q5K => vec_dot_q5_k,
        T::Q6K => vec_dot_q6_k,
        T::IQ4NL | T::IQ4XS | T::MXFP4 | T::Q8_1 | T::Q8K => k.vec_dot,
    };
    k.vec_dot_x4 = match k.weight_type {
        T::Q4_0 => Some(vec_dot_x4_q4_0),
        T::Q4_1 => Some(vec_dot_x4_q4_1),
        T::Q5_0 => Some(vec_dot_x4_q5_0),
        T::Q8_0 => Some(vec_dot_x4_q8_0),
        T::Q4K => Some(vec_dot_x4_q4_k),
        T::Q6K => Some(vec_dot_x4_q6_k),
        _ => k.vec_dot_x4,
    };
    k.quantize_activation = match k.vec_dot_type {
        T::Q8_0 => quantize_row_q8_0,
        T::Q8_1 => quantize_row_q8_1,
        T::Q8K => quantize_row_q8_k,
        T::F16 => quantize_row_f16,
        _ => k.quantize_activation,
    };
    k.panel = super::panel256::kernels(k.weight_type).or(k.panel);
    k.few = super::few256::kernels(k.weight_type).or(k.few);
    k.decode = super::few_rows8::decode_kernels(k.weight_type)
        .or_else(|| super::kdec8::decode_kernels(k.weight_type))
        .or(k.decode);
    super::mxfp4::overlay_avx2(super::iq4::overlay_avx2(k))
}

/// Safe `fn` wrappers with the table signatures around the `#[target_feature]` kernels.
macro_rules! wrappers {
    ($(vec_dot $name:ident => $imp:ident;)* $(quantize $qname:ident => $qimp:ident;)*) => {
        $(fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            // SAFETY: only reachable through `overlay`'s table, which `dispatch` hands out
            // after detecting avx2, fma and f16c (AVX-512 tables include it).
            unsafe { $imp(n, w, a) }
        })*
        $(fn $qname(x: &[f32], out: &mut [u8]) {
            // SAFETY: as for the vec_dot wrappers above.
            unsafe { $qimp(x, out) }
        })*
    };
}

/// Safe wrappers of the four-token kernels; they check that the four rows are in bounds.
/// `$elems` and `$act_block` are the activation type's block elements and bytes.
macro_rules! x4_wrappers {
    ($($name:ident => $imp:ident, $elems:expr, $act_block:expr;)*) => {
        $(fn $name(n: usize, w: &[u8], a: &[u8], a_stride: usize) -> [f32; 4] {
            let row = (n / $elems) * $act_block;
            assert!(a_stride >= row && a.len() >= 3 * a_stride + row, "vec_dot_x4: short rows");
            // SAFETY: only reachable through `overlay`'s table, which `dispatch` hands out
            // after detecting avx2, fma and f16c; the four rows are in bounds (above).
            unsafe { $imp(n, w, a, a_stride) }
        })*
    };
}

x4_wrappers! {
    vec_dot_x4_q4_0 => dot_x4_q4_0, 32, q8_0::BLOCK_BYTES;
    vec_dot_x4_q4_1 => dot_x4_q4_1, 32, q8_1::BLOCK_BYTES;
    vec_dot_x4_q5_0 => dot_x4_q5_0, 32, q8_0::BLOCK_BYTES;
    vec_dot_x4_q8_0 => dot_x4_q8_0, 32, q8_0::BLOCK_BYTES;
    vec_dot_x4_q4_k => dot_x4_q4_k, QK_K, q8_k::BLOCK_BYTES;
    vec_dot_x4_q6_k => dot_x4_q6_k, QK_K, q8_k::BLOCK_BYTES;
}

wrappers! {
    vec_dot vec_dot_f32 => dot_f32;
    vec_dot vec_dot_f16 => dot_f16;
    vec_dot vec_dot_bf16 => dot_bf16;
    vec_dot vec_dot_q4_0 => dot_q4_0;
    vec_dot vec_dot_q4_1 => dot_q4_1;
    vec_dot vec_dot_q5_0 => dot_q5_0;
    vec_dot vec_dot_q5_1 => dot_q5_1;
    vec_dot vec_dot_q8_0 => dot_q8_0;
    vec_dot vec_dot_q2_k => dot_q2_k;
    vec_dot vec_dot_q3_k => dot_q3_k;
    vec_dot vec_dot_q4_k => dot_q4_k;
    vec_dot vec_dot_q5_k => dot_q5_k;
    vec_dot vec_dot_q6_k => dot_q6_k;
    quantize quantize_row_q8_0 => quantize_q8_0;
    quantize quantize_row_q8_1 => quantize_q8_1;
    quantize quantize_row_q8_k => quantize_q8_k;
    quantize quantize_row_f16 => quantize_f16;
}

/// [`crate::formats::float::axpy_f16`] with F16C: eight lanes at a time, each a multiply then
/// an add, as the scalar loop does per element.
pub(in crate::formats) fn axpy_f16(acc: &mut [f32], w: f32, v: &[u8]) {
    // SAFETY: only handed out by `dispatch` (`KernelLevel::axpy_f16`) after detecting avx2,
    // fma and f16c.
    unsafe { axpy_f16_imp(acc, w, v) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_f16_imp(acc: &mut [f32], w: f32, v: &[u8]) {
    let n = acc.len().min(v.len() / 2);
    let full = n / 8 * 8;
    let wv = _mm256_set1_ps(w);
    let (a, b) = (acc.as_mut_ptr(), v.as_ptr());
    let mut i = 0;
    while i < full {
        let x = _mm256_cvtph_ps(_mm_loadu_si128(b.add(2 * i) as *const __m128i));
        let y = _mm256_add_ps(_mm256_loadu_ps(a.add(i)), _mm256_mul_ps(wv, x));
        _mm256_storeu_ps(a.add(i), y);
        i += 8;
    }
    for j in full..n {
        *a.add(j) += w * f16_at(b.add(2 * j));
    }
}

// ---- helpers (shared with the AVX-512 level) ----

/// Whole blocks both rows hold, as the scalar kernels' `zip(..).take(n / elems)` counts.
#[inline(always)]
pub(super) fn blocks(n: usize, elems: usize, w: &[u8], wbb: usize, a: &[u8], abb: usize) -> usize {
    (n / elems).min(w.len() / wbb).min(a.len() / abb)
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

#[inline(always)]
pub(super) unsafe fn f32_at(p: *const u8) -> f32 {
    (p as *const f32).read_unaligned()
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// The 32 nibbles of 16 bytes as bytes: low nibbles first, then high nibbles.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn nibbles32(p: *const u8) -> __m256i {
    let t = _mm_loadu_si128(p as *const __m128i);
    let both = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Bit `i` of the little-endian u32 at `p` as byte `i`: 0xFF when set, 0 when clear.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn bits32(p: *const u8) -> __m256i {
    let x = (p as *const u32).read_unaligned();
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(x as i32),
        _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0,
        ),
    );
    let others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1))
}

/// Pairwise `u · s` (u unsigned ≤ 255, s signed, no i16 overflow) summed to 8 i32s.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn dot_u8_i8(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

/// Pairwise `x · y` of signed bytes (y ≠ −128) summed to 8 i32s.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn dot_i8_i8(x: __m256i, y: __m256i) -> __m256i {
    dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn hsum(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01));
    _mm_cvtsi128_si32(s)
}

/// The sums of four vectors of 8 i32s.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn hsum4(p: [__m256i; 4]) -> __m128i {
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1))
}

/// `sum + t[0] + t[1] + t[2] + t[3]`, one addition at a time: four blocks' terms added in
/// block order, as the scalar kernels add them.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn add_in_order(mut sum: f32, t: __m128) -> f32 {
    sum += _mm_cvtss_f32(t);
    sum += _mm_cvtss_f32(_mm_movehdup_ps(t));
    sum += _mm_cvtss_f32(_mm_movehl_ps(t, t));
    sum += _mm_cvtss_f32(_mm_shuffle_ps(t, t, 0b11));
    sum
}

/// `Σ term(i, Σ partial(i))` over blocks `0..nb`, the float sum in block order.
///
/// `partial(i)` is block `i`'s integer dot as 8 i32 lanes; `term` turns its sum into the
/// block's float contribution exactly as the scalar kernel does, and `terms4(i, sums)` does
/// the same for blocks `i..i + 4` at once in vector lanes (same operations per lane).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn sum_blocks(
    nb: usize,
    mut partial: impl FnMut(usize) -> __m256i,
    mut term: impl FnMut(usize, i32) -> f32,
    mut terms4: impl FnMut(usize, __m128) -> __m128,
) -> f32 {
    let mut sum = 0.0f32;
    let mut i = 0;
    while i + 4 <= nb {
        let s = hsum4([partial(i), partial(i + 1), partial(i + 2), partial(i + 3)]);
        sum = add_in_order(sum, terms4(i, _mm_cvtepi32_ps(s)));
        i += 4;
    }
    while i < nb {
        sum += term(i, hsum(partial(i)));
        i += 1;
    }
    sum
}

/// The f16 pairs at the starts of four blocks `stride` bytes apart, as f32s:
/// `[x0, y0, x1, y1, x2, y2, x3, y3]` (`x` at offset 0, `y` at offset 2).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn f16_pairs4(p: *const u8, stride: usize) -> __m256 {
    let at = |k: usize| (p.add(k * stride) as *const i32).read_unaligned();
    _mm256_cvtph_ps(_mm_setr_epi32(at(0), at(1), at(2), at(3)))
}

/// The f16 at the start of four blocks `stride` bytes apart, as f32s.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn f16_x4(p: *const u8, stride: usize) -> __m128 {
    // Assembled in a general register: four word inserts would queue on the shuffle ports
    // that the block reductions need.
    let at = |k: usize| (p.add(k * stride) as *const u16).read_unaligned() as u64;
    let x = at(0) | at(1) << 16 | at(2) << 32 | at(3) << 48;
    _mm_cvtph_ps(_mm_cvtsi64_si128(x as i64))
}

/// `isum · dw · da` (Q4_0, Q5_0) of blocks `i..i + 4`, in that order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn terms4_sdd(
    w: *const u8,
    wb: usize,
    a: *const u8,
    ab: usize,
    s: __m128,
) -> __m128 {
    _mm_mul_ps(_mm_mul_ps(s, f16_x4(w, wb)), f16_x4(a, ab))
}

/// `d · d_a · isum + m · s_a` (Q4_1, Q5_1) of four blocks, in that order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn terms4_q4_1(
    w: *const u8,
    wb: usize,
    a: *const u8,
    ab: usize,
    s: __m128,
) -> __m128 {
    // [d·d_a, m·s_a] per block, then gathered as [d·d_a × 4 | m·s_a × 4].
    let prod = _mm256_mul_ps(f16_pairs4(w, wb), f16_pairs4(a, ab));
    let prod = _mm256_permutevar8x32_ps(prod, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    let (dd, ms) = (_mm256_castps256_ps128(prod), _mm256_extractf128_ps(prod, 1));
    _mm_add_ps(_mm_mul_ps(dd, s), ms)
}

/// How far ahead of their reads the decode kernels prefetch weight rows. The hardware
/// prefetchers alone leave decoding well short of the memory bandwidth here (a decode
/// step streams each row once); 4 KiB ahead was best of 1, 2, 4 and 8 KiB on SmolLM2 and
/// the 1B model (+17% on SmolLM2 over none).
const PREFETCH_AHEAD: usize = 4096;

/// Prefetches the cache lines `PREFETCH_AHEAD` bytes past `p .. p + bytes` (the weights a
/// kernel step is about to read), one per 64 bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn prefetch_ahead(p: *const u8, bytes: usize) {
    let mut off = 0;
    while off < bytes {
        // Wrapping: the address may lie past the mapping; a prefetch never faults.
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD + off) as *const i8);
        off += 64;
    }
}

// ---- 32-element block quants ----

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wb, ab) = (q4_0::BLOCK_BYTES, q8_0::BLOCK_BYTES);
    let nb = blocks(n, 32, w, wb, a, ab);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    sum_blocks(
        nb,
        |i| {
            prefetch_ahead(w.add(i * wb), wb);
            let q = _mm256_sub_epi8(nibbles32(w.add(i * wb + 2)), _mm256_set1_epi8(8));
            dot_i8_i8(q, load(a.add(i * ab + 2)))
        },
        |i, s| s as f32 * f16_at(w.add(i * wb)) * f16_at(a.add(i * ab)),
        |i, s| terms4_sdd(w.add(i * wb), wb, a.add(i * ab), ab, s),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wb, ab) = (q4_1::BLOCK_BYTES, q8_1::BLOCK_BYTES);
    let nb = blocks(n, 32, w, wb, a, ab);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    sum_blocks(
        nb,
        |i| {
            prefetch_ahead(w.add(i * wb), wb);
            dot_u8_i8(nibbles32(w.add(i * wb + 4)), load(a.add(i * ab + 4)))
        },
        |i, s| q4_1_term(w.add(i * wb), a.add(i * ab), s),
        |i, s| terms4_q4_1(w.add(i * wb), wb, a.add(i * ab), ab, s),
    )
}

/// `d · d_a · Σ q q_a + m · s_a`, the Q4_1/Q5_1 block term in the scalar order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q4_1_term(w: *const u8, a: *const u8, s: i32) -> f32 {
    let (d, m) = (f16_at(w), f16_at(w.add(2)));
    let (d_a, s_a) = (f16_at(a), f16_at(a.add(2)));
    d * d_a * s as f32 + m * s_a
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wb, ab) = (q5_0::BLOCK_BYTES, q8_0::BLOCK_BYTES);
    let nb = blocks(n, 32, w, wb, a, ab);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    sum_blocks(
        nb,
        |i| {
            let b = w.add(i * wb);
            prefetch_ahead(b, wb);
            // A clear 5th bit means q − 16: OR-ing 0xF0 into the nibble is that in i8.
            let high = _mm256_andnot_si256(bits32(b.add(2)), _mm256_set1_epi8(0xF0u8 as i8));
            let q = _mm256_or_si256(nibbles32(b.add(6)), high);
            dot_i8_i8(q, load(a.add(i * ab + 2)))
        },
        |i, s| s as f32 * f16_at(w.add(i * wb)) * f16_at(a.add(i * ab)),
        |i, s| terms4_sdd(w.add(i * wb), wb, a.add(i * ab), ab, s),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wb, ab) = (q5_1::BLOCK_BYTES, q8_1::BLOCK_BYTES);
    let nb = blocks(n, 32, w, wb, a, ab);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    sum_blocks(
        nb,
        |i| {
            let b = w.add(i * wb);
            prefetch_ahead(b, wb);
            let high = _mm256_and_si256(bits32(b.add(4)), _mm256_set1_epi8(0x10));
            let q = _mm256_or_si256(nibbles32(b.add(8)), high);
            dot_u8_i8(q, load(a.add(i * ab + 4)))
        },
        |i, s| q4_1_term(w.add(i * wb), a.add(i * ab), s),
        |i, s| terms4_q4_1(w.add(i * wb), wb, a.add(i * ab), ab, s),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wb, ab) = (q8_0::BLOCK_BYTES, q8_0::BLOCK_BYTES);
    let nb = blocks(n, 32, w, wb, a, ab);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    sum_blocks(
        nb,
        |i| {
            prefetch_ahead(w.add(i * wb), wb);
            dot_i8_i8(load(w.add(i * wb + 2)), load(a.add(i * ab + 2)))
        },
        |i, s| s as f32 * (f16_at(w.add(i * wb)) * f16_at(a.add(i * ab))),
        |i, s| {
            _mm_mul_ps(
                s,
                _mm_mul_ps(f16_x4(w.add(i * wb), wb), f16_x4(a.add(i * ab), ab)),
            )
        },
    )
}

// ---- four tokens at once ----

/// Per token `k`, `Σ_i terms(i, Σ partial(i, k))[k]` over blocks `0..nb`: four running
/// sums in the lanes of one vector, each in block order as the one-token kernels.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn sum_blocks_x4(
    nb: usize,
    mut partial: impl FnMut(usize, usize) -> __m256i,
    mut terms: impl FnMut(usize, __m128) -> __m128,
) -> [f32; 4] {
    let mut acc = _mm_setzero_ps();
    for i in 0..nb {
        let s = hsum4([partial(i, 0), partial(i, 1), partial(i, 2), partial(i, 3)]);
        acc = _mm_add_ps(acc, terms(i, _mm_cvtepi32_ps(s)));
    }
    let mut out = [0.0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), acc);
    out
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_x4_q4_0(n: usize, w: &[u8], a: &[u8], st: usize) -> [f32; 4] {
    let (wb, ab) = (q4_0::BLOCK_BYTES, q8_0::BLOCK_BYTES);
    let nb = (n / 32).min(w.len() / wb);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    let mut q = _mm256_setzero_si256();
    sum_blocks_x4(
        nb,
        |i, k| {
            if k == 0 {
                q = _mm256_sub_epi8(nibbles32(w.add(i * wb + 2)), _mm256_set1_epi8(8));
            }
            dot_i8_i8(q, load(a.add(k * st + i * ab + 2)))
        },
        |i, s| {
            let dw = _mm_set1_ps(f16_at(w.add(i * wb)));
            _mm_mul_ps(_mm_mul_ps(s, dw), f16_x4(a.add(i * ab), st))
        },
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_x4_q5_0(n: usize, w: &[u8], a: &[u8], st: usize) -> [f32; 4] {
    let (wb, ab) = (q5_0::BLOCK_BYTES, q8_0::BLOCK_BYTES);
    let nb = (n / 32).min(w.len() / wb);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    let mut q = _mm256_setzero_si256();
    sum_blocks_x4(
        nb,
        |i, k| {
            if k == 0 {
                let b = w.add(i * wb);
                let high = _mm256_andnot_si256(bits32(b.add(2)), _mm256_set1_epi8(0xF0u8 as i8));
                q = _mm256_or_si256(nibbles32(b.add(6)), high);
            }
            dot_i8_i8(q, load(a.add(k * st + i * ab + 2)))
        },
        |i, s| {
            let dw = _mm_set1_ps(f16_at(w.add(i * wb)));
            _mm_mul_ps(_mm_mul_ps(s, dw), f16_x4(a.add(i * ab), st))
        },
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_x4_q4_1(n: usize, w: &[u8], a: &[u8], st: usize) -> [f32; 4] {
    let (wb, ab) = (q4_1::BLOCK_BYTES, q8_1::BLOCK_BYTES);
    let nb = (n / 32).min(w.len() / wb);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    let mut q = _mm256_setzero_si256();
    sum_blocks_x4(
        nb,
        |i, k| {
            if k == 0 {
                q = nibbles32(w.add(i * wb + 4));
            }
            dot_u8_i8(q, load(a.add(k * st + i * ab + 4)))
        },
        |i, s| terms_x4_q4_1(w.add(i * wb), a.add(i * ab), st, s),
    )
}

/// `d · d_a · isum + m · s_a` (Q4_1, Q5_1) of one weight block at `w` against four tokens'
/// blocks `st` bytes apart from `a`, in the scalar order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn terms_x4_q4_1(w: *const u8, a: *const u8, st: usize, s: __m128) -> __m128 {
    // [d, m] of the weight block against [d_a, s_a] of each token's block.
    let wdm = _mm_cvtph_ps(_mm_set1_epi32((w as *const i32).read_unaligned()));
    let wdm = _mm256_set_m128(wdm, wdm);
    let prod = _mm256_mul_ps(wdm, f16_pairs4(a, st));
    let prod = _mm256_permutevar8x32_ps(prod, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    let (dd, ms) = (_mm256_castps256_ps128(prod), _mm256_extractf128_ps(prod, 1));
    _mm_add_ps(_mm_mul_ps(dd, s), ms)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_x4_q8_0(n: usize, w: &[u8], a: &[u8], st: usize) -> [f32; 4] {
    let (wb, ab) = (q8_0::BLOCK_BYTES, q8_0::BLOCK_BYTES);
    let nb = (n / 32).min(w.len() / wb);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    let mut q = _mm256_setzero_si256();
    sum_blocks_x4(
        nb,
        |i, k| {
            if k == 0 {
                q = load(w.add(i * wb + 2));
            }
            dot_i8_i8(q, load(a.add(k * st + i * ab + 2)))
        },
        |i, s| {
            let dw = _mm_set1_ps(f16_at(w.add(i * wb)));
            _mm_mul_ps(s, _mm_mul_ps(dw, f16_x4(a.add(i * ab), st)))
        },
    )
}

// ---- K-quants ----

/// The Q8_K `d` of four activation blocks `stride` bytes apart.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q8k_d_x4(ab: *const u8, stride: usize) -> __m128 {
    _mm_setr_ps(
        f32_at(ab),
        f32_at(ab.add(stride)),
        f32_at(ab.add(2 * stride)),
        f32_at(ab.add(3 * stride)),
    )
}

/// The mins of a Q4_K/Q5_K super-block widened to i16, each twice: `[m0, m0, m1, m1, …]`,
/// facing the 16 Q8_K `bsums` (two per 32-element sub-block).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn mins_x2(mn: [u8; 8]) -> __m256i {
    let m = _mm_cvtsi64_si128(i64::from_le_bytes(mn));
    _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m))
}

/// Four tokens' Q4_K/Q5_K super-block terms, `d_a·d·isum − d_a·dmin·msum` per lane in the
/// scalar kernel's float order; `isum` holds the four integer sums, `ab` the first token's
/// Q8_K block (the others `st` bytes apart), `wb` the weight block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn k4_terms_x4(
    wb: *const u8,
    ab: *const u8,
    st: usize,
    isum: __m128i,
    mn: [u8; 8],
) -> __m128 {
    let m = mins_x2(mn);
    let msum = hsum4(core::array::from_fn(|k| {
        _mm256_madd_epi16(load(ab.add(k * st + q8_k::BSUMS)), m)
    }));
    let d_a = q8k_d_x4(ab, st);
    let (d, dmin) = (_mm_set1_ps(f16_at(wb)), _mm_set1_ps(f16_at(wb.add(2))));
    _mm_sub_ps(
        _mm_mul_ps(_mm_mul_ps(d_a, d), _mm_cvtepi32_ps(isum)),
        _mm_mul_ps(_mm_mul_ps(d_a, dmin), _mm_cvtepi32_ps(msum)),
    )
}

/// `32 · Σ_g scale_g · bsum_g` of the Q8_K block at `ab` (as 8 i32 lanes), the part of a
/// Q6_K dot that its −32 offset contributes: `Σ (q − 32)·a = Σ q·a − 32·Σ a`, per group.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q6k_offset(ab: *const u8, scales16: __m256i) -> __m256i {
    _mm256_slli_epi32(_mm256_madd_epi16(load(ab.add(q8_k::BSUMS)), scales16), 5)
}

/// Four tokens' Q6_K super-block terms `d_a·d·isum`, in the scalar order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q6k_terms_x4(
    wb: *const u8,
    ab: *const u8,
    st: usize,
    isum: __m128i,
) -> __m128 {
    let d = _mm_set1_ps(f16_at(wb.add(208)));
    _mm_mul_ps(_mm_mul_ps(q8k_d_x4(ab, st), d), _mm_cvtepi32_ps(isum))
}

/// One Q4_K row against four tokens: each 32-byte slice of quants is split into nibbles
/// once and dotted against all four tokens' activations.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_x4_q4_k(n: usize, w: &[u8], a: &[u8], st: usize) -> [f32; 4] {
    let (wbb, abb) = (q4_k::BLOCK_BYTES, q8_k::BLOCK_BYTES);
    let nb = (n / QK_K).min(w.len() / wbb);
    let low = _mm256_set1_epi8(0x0F);
    let mut sum = _mm_setzero_ps();
    for i in 0..nb {
        let wb = &w[i * wbb..(i + 1) * wbb];
        let ab = a.as_ptr().add(i * abb);
        let (sc, mn) = scales_mins_k4(&wb[4..16]);
        let qs = wb.as_ptr().add(16);
        let mut acc = [_mm256_setzero_si256(); 4];
        for c in 0..4 {
            let q = load(qs.add(32 * c));
            let lo = _mm256_and_si256(q, low);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
            let (slo, shi) = (
                _mm256_set1_epi16(sc[2 * c] as i16),
                _mm256_set1_epi16(sc[2 * c + 1] as i16),
            );
            for (k, acc) in acc.iter_mut().enumerate() {
                let aq = ab.add(k * st + q8_k::QS + 64 * c);
                let plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load(aq)), slo);
                let phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load(aq.add(32))), shi);
                *acc = _mm256_add_epi32(*acc, _mm256_add_epi32(plo, phi));
            }
        }
        sum = _mm_add_ps(sum, k4_terms_x4(wb.as_ptr(), ab, st, hsum4(acc), mn));
    }
    let mut out = [0.0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), sum);
    out
}

/// One Q6_K row against four tokens: each 32 quants are assembled once; the −32 offset
/// comes from the activations' `bsums` ([`q6k_offset`]) instead of a second `maddubs`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_x4_q6_k(n: usize, w: &[u8], a: &[u8], st: usize) -> [f32; 4] {
    let (wbb, abb) = (q6_k::BLOCK_BYTES, q8_k::BLOCK_BYTES);
    let nb = (n / QK_K).min(w.len() / wbb);
    let low4 = _mm256_set1_epi8(0x0F);
    let low2 = _mm256_set1_epi8(0x03);
    let mut sum = _mm_setzero_ps();
    for i in 0..nb {
        let wb = &w[i * wbb..(i + 1) * wbb];
        let ab = a.as_ptr().add(i * abb);
        let (ql, qh, scales) = (wb.as_ptr(), wb.as_ptr().add(128), &wb[192..208]);
        let mut acc = [_mm256_setzero_si256(); 4];
        for h in 0..2 {
            let (ql0, ql1) = (load(ql.add(64 * h)), load(ql.add(64 * h + 32)));
            let qhv = load(qh.add(32 * h));
            for j in 0..4 {
                let l = if j % 2 == 0 { ql0 } else { ql1 };
                let l = if j < 2 { l } else { _mm256_srli_epi16(l, 4) };
                let hb =
                    _mm256_and_si256(_mm256_srl_epi16(qhv, _mm_cvtsi32_si128(2 * j as i32)), low2);
                let q = _mm256_or_si256(_mm256_and_si256(l, low4), _mm256_slli_epi16(hb, 4));
                let g = 8 * h + 2 * j;
                let s = scale_pair(scales[g] as i8 as i32, scales[g + 1] as i8 as i32);
                for (k, acc) in acc.iter_mut().enumerate() {
                    let av = load(ab.add(k * st + q8_k::QS + 128 * h + 32 * j));
                    *acc =
                        _mm256_add_epi32(*acc, _mm256_madd_epi16(_mm256_maddubs_epi16(q, av), s));
                }
            }
        }
        let scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(scales.as_ptr() as *const __m128i));
        for (k, acc) in acc.iter_mut().enumerate() {
            *acc = _mm256_sub_epi32(*acc, q6k_offset(ab.add(k * st), scales16));
        }
        sum = _mm_add_ps(sum, q6k_terms_x4(wb.as_ptr(), ab, st, hsum4(acc)));
    }
    let mut out = [0.0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), sum);
    out
}

/// `[s0 × 8, s1 × 8]` as i16s: the scales of two 16-element groups for `madd`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn scale_pair(s0: i32, s1: i32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(s1 as i16), _mm_set1_epi16(s0 as i16))
}

/// `Σ_g mins[g] · (bsum(2g) + bsum(2g+1))` of the Q8_K block at `ab` (Q4_K, Q5_K mins).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn min_sum_k4(ab: *const u8, mn: [u8; 8]) -> i32 {
    let bsums = load(ab.add(q8_k::BSUMS));
    let m = _mm_cvtsi64_si128(i64::from_le_bytes(mn));
    let m = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m));
    hsum(_mm256_madd_epi16(bsums, m))
}

/// [`crate::formats::k_quants::unpack_scale_min_k4`] on 32-bit words (as llama.cpp's kmask trick).
#[inline(always)]
pub(super) fn scales_mins_k4(packed: &[u8]) -> ([u8; 8], [u8; 8]) {
    const M1: u32 = 0x3f3f3f3f;
    const M2: u32 = 0x0f0f0f0f;
    const M3: u32 = 0x03030303;
    let word = |k: usize| {
        u32::from_le_bytes([
            packed[4 * k],
            packed[4 * k + 1],
            packed[4 * k + 2],
            packed[4 * k + 3],
        ])
    };
    let (u0, u1, u2) = (word(0), word(1), word(2));
    let sc_lo = u0 & M1;
    let sc_hi = (u2 & M2) | (((u0 >> 6) & M3) << 4);
    let mn_lo = u1 & M1;
    let mn_hi = ((u2 >> 4) & M2) | (((u1 >> 6) & M3) << 4);
    let join = |a: u32, b: u32| ((b as u64) << 32 | a as u64).to_le_bytes();
    (join(sc_lo, sc_hi), join(mn_lo, mn_hi))
}

/// One pair of 32-quant sub-blocks of a Q4_K/Q5_K super-block: `acc += sc_lo·(lo·a[0..32])
/// + sc_hi·(hi·a[32..64])`, with unsigned quants against Q8_K activations at `aq`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn acc_k4_pair(
    acc: __m256i,
    lo: __m256i,
    hi: __m256i,
    aq: *const u8,
    sc_lo: u8,
    sc_hi: u8,
) -> __m256i {
    let plo = _mm256_maddubs_epi16(lo, load(aq));
    let phi = _mm256_maddubs_epi16(hi, load(aq.add(32)));
    let acc = _mm256_add_epi32(acc, _mm256_madd_epi16(plo, _mm256_set1_epi16(sc_lo as i16)));
    _mm256_add_epi32(acc, _mm256_madd_epi16(phi, _mm256_set1_epi16(sc_hi as i16)))
}

/// A Q4_K/Q5_K super-block's contribution: `d_a·(d·Σ scaled products − dmin·Σ mins·bsums)`,
/// in the scalar kernel's float order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k4_block_term(wb: &[u8], ab: &[u8], acc: __m256i, mins: [u8; 8]) -> f32 {
    let (isum, msum) = (hsum(acc), min_sum_k4(ab.as_ptr(), mins));
    let d_a = q8_k::d(ab);
    d_a * f16_at(wb.as_ptr()) * isum as f32 - d_a * f16_at(wb.as_ptr().add(2)) * msum as f32
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wbb, abb) = (q4_k::BLOCK_BYTES, q8_k::BLOCK_BYTES);
    let nb = blocks(n, QK_K, w, wbb, a, abb);
    let mut sum = 0.0f32;
    let low = _mm256_set1_epi8(0x0F);
    for i in 0..nb {
        let (wb, ab) = (&w[i * wbb..(i + 1) * wbb], &a[i * abb..(i + 1) * abb]);
        prefetch_ahead(wb.as_ptr(), wbb);
        let (sc, mn) = scales_mins_k4(&wb[4..16]);
        let (qs, aq) = (wb.as_ptr().add(16), ab.as_ptr().add(q8_k::QS));
        let mut acc = _mm256_setzero_si256();
        for c in 0..4 {
            let q = load(qs.add(32 * c));
            let lo = _mm256_and_si256(q, low);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
            acc = acc_k4_pair(acc, lo, hi, aq.add(64 * c), sc[2 * c], sc[2 * c + 1]);
        }
        sum += k4_block_term(wb, ab, acc, mn);
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wbb, abb) = (q5_k::BLOCK_BYTES, q8_k::BLOCK_BYTES);
    let nb = blocks(n, QK_K, w, wbb, a, abb);
    let mut sum = 0.0f32;
    let low = _mm256_set1_epi8(0x0F);
    let bit5 = _mm256_set1_epi8(0x10);
    for i in 0..nb {
        let (wb, ab) = (&w[i * wbb..(i + 1) * wbb], &a[i * abb..(i + 1) * abb]);
        prefetch_ahead(wb.as_ptr(), wbb);
        let (sc, mn) = scales_mins_k4(&wb[4..16]);
        let qh = load(wb.as_ptr().add(16));
        let (qs, aq) = (wb.as_ptr().add(48), ab.as_ptr().add(q8_k::QS));
        let high = |j: usize| {
            let m = _mm256_set1_epi8((1u8 << j) as i8);
            _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, m), m), bit5)
        };
        let mut acc = _mm256_setzero_si256();
        for c in 0..4 {
            let q = load(qs.add(32 * c));
            let lo = _mm256_or_si256(_mm256_and_si256(q, low), high(2 * c));
            let hi = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(q, 4), low),
                high(2 * c + 1),
            );
            acc = acc_k4_pair(acc, lo, hi, aq.add(64 * c), sc[2 * c], sc[2 * c + 1]);
        }
        sum += k4_block_term(wb, ab, acc, mn);
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q6_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wbb, abb) = (q6_k::BLOCK_BYTES, q8_k::BLOCK_BYTES);
    let nb = blocks(n, QK_K, w, wbb, a, abb);
    let mut sum = 0.0f32;
    let low4 = _mm256_set1_epi8(0x0F);
    let low2 = _mm256_set1_epi8(0x03);
    // `vpshufb` indices spreading i16 scale `2k` over the low lane, `2k + 1` the high.
    let spread: [__m256i; 4] = core::array::from_fn(|k| {
        let (lo, hi) = ((4 * k) as i16, (4 * k + 2) as i16);
        let (lo, hi) = (lo | (lo + 1) << 8, hi | (hi + 1) << 8);
        _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo))
    });
    for i in 0..nb {
        let (wb, ab) = (&w[i * wbb..(i + 1) * wbb], &a[i * abb..(i + 1) * abb]);
        prefetch_ahead(wb.as_ptr(), wbb);
        let (ql, qh) = (wb.as_ptr(), wb.as_ptr().add(q6_k::QH));
        let scales = _mm_loadu_si128(wb.as_ptr().add(q6_k::SCALES) as *const __m128i);
        let aq = ab.as_ptr().add(q8_k::QS);
        // Σ (q − 32)·a = Σ q·a − 32 Σ_g scale_g · bsum_g: the offset once per super-block.
        let bsums = load(ab.as_ptr().add(q8_k::BSUMS));
        let offset = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scales), bsums);
        let mut acc = _mm256_slli_epi32::<5>(_mm256_sub_epi32(_mm256_setzero_si256(), offset));
        for h in 0..2 {
            let (ql0, ql1) = (load(ql.add(64 * h)), load(ql.add(64 * h + 32)));
            let qhv = load(qh.add(32 * h));
            // Scales 8h .. 8h + 8 as i16s in both lanes.
            let half = if h == 0 {
                scales
            } else {
                _mm_unpackhi_epi64(scales, scales)
            };
            let sc = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(half));
            for (k, spread) in spread.iter().enumerate() {
                let l = if k % 2 == 0 { ql0 } else { ql1 };
                let l = if k < 2 { l } else { _mm256_srli_epi16(l, 4) };
                let hb =
                    _mm256_and_si256(_mm256_srl_epi16(qhv, _mm_cvtsi32_si128(2 * k as i32)), low2);
                let q = _mm256_or_si256(_mm256_and_si256(l, low4), _mm256_slli_epi16(hb, 4));
                let av = load(aq.add(128 * h + 32 * k));
                // Unsigned 6-bit quants: each i16 pair sum is at most 2·63·127.
                let p = _mm256_maddubs_epi16(q, av);
                let sc = _mm256_shuffle_epi8(sc, *spread);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
            }
        }
        sum += q8_k::d(ab) * f16_at(wb.as_ptr().add(q6_k::D)) * hsum(acc) as f32;
    }
    sum
}

/// The 16 signed 6-bit sub-block scales of a Q3_K block (see
/// [`crate::formats::k_quants::q3_k`]'s layout) as i16s, unpacked in 32-bit words: scales
/// `4k .. 4k + 4` take their low nibbles from word `k % 2` (nibble `k / 2`) and their top
/// two bits from bits `2k ..= 2k + 1` of each byte of word 2.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q3k_scales16(packed: *const u8) -> __m256i {
    const LOW: u32 = 0x0F0F_0F0F;
    const TOP: u32 = 0x0303_0303;
    let word = |k: usize| (packed.add(4 * k) as *const u32).read_unaligned();
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let biased = _mm_setr_epi32(
        ((w0 & LOW) | (w2 & TOP) << 4) as i32,
        ((w1 & LOW) | ((w2 >> 2) & TOP) << 4) as i32,
        (((w0 >> 4) & LOW) | ((w2 >> 4) & TOP) << 4) as i32,
        (((w1 >> 4) & LOW) | ((w2 >> 6) & TOP) << 4) as i32,
    );
    _mm256_cvtepi8_epi16(_mm_sub_epi8(biased, _mm_set1_epi8(32)))
}

/// `vpshufb` indices that spread i16 scales `2c` and `2c + 1` of a 128-bit lane over the
/// low and high lane of a 256-bit vector (eight copies each): the scale of each 16-quant
/// half of quant group `c` (mod 4).
const Q3K_SCALE_IDX: [[u8; 32]; 4] = {
    let mut t = [[0u8; 32]; 4];
    let mut c = 0;
    while c < 4 {
        let mut i = 0;
        while i < 32 {
            let word = 2 * c + i / 16;
            t[c][i] = (2 * word + i % 2) as u8;
            i += 1;
        }
        c += 1;
    }
    t
};

/// Q3_K: each quant `q = low + 4·high − 4` (`low`: 2 bits, `high`: the hmask bit), so
/// `Σ_g sc_g Σ q·a = Σ_g sc_g Σ (low + 4·high)·a − 4 Σ_g sc_g · bsum_g`: unsigned quants
/// for `maddubs`, and the `−4` taken once per super-block from the Q8_K group sums.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q3_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wbb, abb) = (q3_k::BLOCK_BYTES, q8_k::BLOCK_BYTES);
    let nb = blocks(n, QK_K, w, wbb, a, abb);
    let mut sum = 0.0f32;
    let low2 = _mm256_set1_epi8(0x03);
    let four = _mm256_set1_epi8(4);
    let idx = Q3K_SCALE_IDX.map(|t| _mm256_loadu_si256(t.as_ptr() as *const __m256i));
    for i in 0..nb {
        let (wb, ab) = (&w[i * wbb..(i + 1) * wbb], &a[i * abb..(i + 1) * abb]);
        prefetch_ahead(wb.as_ptr(), wbb);
        let scales = q3k_scales16(wb.as_ptr().add(q3_k::SCALES));
        let halves = [
            _mm256_permute2x128_si256::<0x00>(scales, scales),
            _mm256_permute2x128_si256::<0x11>(scales, scales),
        ];
        let hm = load(wb.as_ptr());
        let (qs, aq) = (wb.as_ptr().add(q3_k::QS), ab.as_ptr().add(q8_k::QS));
        // −4 · Σ_g sc_g · bsum_g, as the lanes' starting value.
        let bsums = _mm256_madd_epi16(load(ab.as_ptr().add(q8_k::BSUMS)), scales);
        let mut acc = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<2>(bsums));
        for (h, &half) in halves.iter().enumerate() {
            let qv = load(qs.add(32 * h));
            for (s, &idx) in idx.iter().enumerate() {
                let j = 4 * h + s;
                let lo =
                    _mm256_and_si256(_mm256_srl_epi16(qv, _mm_cvtsi32_si128(2 * s as i32)), low2);
                // Bit `j` of each hmask byte moved to bit 2 (it stays inside its byte).
                let hb = if j >= 2 {
                    _mm256_srl_epi16(hm, _mm_cvtsi32_si128(j as i32 - 2))
                } else {
                    _mm256_sll_epi16(hm, _mm_cvtsi32_si128(2 - j as i32))
                };
                let q = _mm256_or_si256(lo, _mm256_and_si256(hb, four));
                let p = _mm256_maddubs_epi16(q, load(aq.add(32 * j)));
                let sc = _mm256_shuffle_epi8(half, idx);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
            }
        }
        sum += q8_k::d(ab) * f16_at(wb.as_ptr().add(q3_k::D)) * hsum(acc) as f32;
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q2_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wbb, abb) = (q2_k::BLOCK_BYTES, q8_k::BLOCK_BYTES);
    let nb = blocks(n, QK_K, w, wbb, a, abb);
    let mut sum = 0.0f32;
    let low2 = _mm256_set1_epi8(0x03);
    for i in 0..nb {
        let (wb, ab) = (&w[i * wbb..(i + 1) * wbb], &a[i * abb..(i + 1) * abb]);
        prefetch_ahead(wb.as_ptr(), wbb);
        let scales = &wb[..16];
        let (qs, aq) = (wb.as_ptr().add(16), ab.as_ptr().add(q8_k::QS));
        let mut acc = _mm256_setzero_si256();
        for h in 0..2 {
            let qv = load(qs.add(32 * h));
            for s in 0..4 {
                let j = 4 * h + s;
                let q =
                    _mm256_and_si256(_mm256_srl_epi16(qv, _mm_cvtsi32_si128(2 * s as i32)), low2);
                let p = _mm256_maddubs_epi16(q, load(aq.add(32 * j)));
                let sp = scale_pair(
                    (scales[2 * j] & 0x0F) as i32,
                    (scales[2 * j + 1] & 0x0F) as i32,
                );
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, sp));
            }
        }
        let msum: i32 = (0..16)
            .map(|g| (scales[g] >> 4) as i32 * q8_k::bsum(ab, g))
            .sum();
        let d_a = q8_k::d(ab);
        sum += d_a * f16_at(wb.as_ptr().add(80)) * hsum(acc) as f32
            - d_a * f16_at(wb.as_ptr().add(82)) * msum as f32;
    }
    sum
}

// ---- F32 / F16 / BF16: 16 lanes, as `formats::float` sums (F32 fused) ----

/// Lanes `0..8` and `8..16` folded as the scalar reduction does: `l + l+8`, `l + l+4`,
/// `l + l+2`, `l + l+1`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn reduce16(lo: __m256, hi: __m256) -> f32 {
    let v = _mm256_add_ps(lo, hi);
    let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)))
}

/// `Σ w·a` over 16 lanes, `load(p, i)` reading 8 f32s of row `p` at element `i`; each term
/// a fused multiply-add (`FUSED`, F32) or a multiply, then an add (F16, BF16), in the
/// lanes and in the tail alike, as `formats::float` computes it.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_lanes<const FUSED: bool>(
    n: usize,
    w: *const u8,
    a: *const u8,
    load8: impl Fn(*const u8, usize) -> __m256,
    tail: impl Fn(*const u8, usize) -> f32,
) -> f32 {
    let full = n / 16 * 16;
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i < full {
        if FUSED {
            lo = _mm256_fmadd_ps(load8(w, i), load8(a, i), lo);
            hi = _mm256_fmadd_ps(load8(w, i + 8), load8(a, i + 8), hi);
        } else {
            lo = _mm256_add_ps(lo, _mm256_mul_ps(load8(w, i), load8(a, i)));
            hi = _mm256_add_ps(hi, _mm256_mul_ps(load8(w, i + 8), load8(a, i + 8)));
        }
        i += 16;
    }
    let mut sum = reduce16(lo, hi);
    for i in full..n {
        sum = if FUSED {
            tail(w, i).mul_add(tail(a, i), sum)
        } else {
            sum + tail(w, i) * tail(a, i)
        };
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let n = n.min(w.len() / 4).min(a.len() / 4);
    dot_lanes::<true>(
        n,
        w.as_ptr(),
        a.as_ptr(),
        |p, i| _mm256_loadu_ps(p.add(4 * i) as *const f32),
        |p, i| f32_at(p.add(4 * i)),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let n = n.min(w.len() / 2).min(a.len() / 2);
    dot_lanes::<false>(
        n,
        w.as_ptr(),
        a.as_ptr(),
        |p, i| _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i) as *const __m128i)),
        |p, i| f16_at(p.add(2 * i)),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let n = n.min(w.len() / 2).min(a.len() / 2);
    dot_lanes::<false>(
        n,
        w.as_ptr(),
        a.as_ptr(),
        |p, i| {
            let h = _mm_loadu_si128(p.add(2 * i) as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
        },
        |p, i| f32::from_bits(((p.add(2 * i) as *const u16).read_unaligned() as u32) << 16),
    )
}

// ---- activation quantizers ----

/// `max |x|` of 8 lanes with NaNs ignored, as `f32::max` folds.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn abs_no_nan(v: __m256) -> __m256 {
    let abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0), v);
    _mm256_and_ps(abs, _mm256_cmp_ps(v, v, _CMP_ORD_Q))
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}

/// `x as i8` after rounding: saturates to −128..=127 and maps NaN to 0, as Rust's cast.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn saturate_i32(r: __m256) -> __m256i {
    let c = _mm256_min_ps(
        _mm256_max_ps(r, _mm256_set1_ps(-128.0)),
        _mm256_set1_ps(127.0),
    );
    let c = _mm256_and_ps(c, _mm256_cmp_ps(r, r, _CMP_ORD_Q));
    _mm256_cvttps_epi32(c)
}

/// Rounds half away from zero (`f32::round`): truncates `x + copysign(0.5⁻, x)`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn round_half_away(x: __m256) -> __m256 {
    let half = _mm256_or_ps(
        _mm256_and_ps(x, _mm256_set1_ps(-0.0)),
        _mm256_set1_ps(0.499_999_97),
    );
    _mm256_round_ps(
        _mm256_add_ps(x, half),
        _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC,
    )
}

/// Four vectors of 8 i32s (each in −128..=127) packed to 32 bytes in order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn pack32(q: [__m256i; 4]) -> __m256i {
    let a = _mm256_packs_epi32(q[0], q[1]);
    let b = _mm256_packs_epi32(q[2], q[3]);
    let p = _mm256_packs_epi16(a, b);
    _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// One 32-element Q8_0/Q8_1 block, as the scalar quantizers: `d = max|x| / 127`, quants
/// `round(x / d)` half away from zero, written at `q`; returns `(d, Σ q)`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn quantize_block32(x: *const f32, q: *mut u8) -> (f32, i32) {
    let v: [__m256; 4] = core::array::from_fn(|k| _mm256_loadu_ps(x.add(8 * k)));
    let m = _mm256_max_ps(
        _mm256_max_ps(abs_no_nan(v[0]), abs_no_nan(v[1])),
        _mm256_max_ps(abs_no_nan(v[2]), abs_no_nan(v[3])),
    );
    let d = hmax(m) / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let idv = _mm256_set1_ps(id);
    let qi: [__m256i; 4] =
        core::array::from_fn(|k| saturate_i32(round_half_away(_mm256_mul_ps(v[k], idv))));
    _mm256_storeu_si256(q as *mut __m256i, pack32(qi));
    let s = _mm256_add_epi32(
        _mm256_add_epi32(qi[0], qi[1]),
        _mm256_add_epi32(qi[2], qi[3]),
    );
    (d, hsum(s))
}

/// F32 → F16, round to nearest even: F16C's `vcvtps2ph`, which the `half` conversion of
/// the scalar quantizer is (it uses F16C itself where the CPU has it).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_f16(x: &[f32], out: &mut [u8]) {
    let n = x.len().min(out.len() / 2);
    let full = n / 8 * 8;
    for i in (0..full).step_by(8) {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(x.as_ptr().add(i)));
        _mm_storeu_si128(out.as_mut_ptr().add(2 * i) as *mut __m128i, h);
    }
    for (i, v) in x.iter().enumerate().take(n).skip(full) {
        crate::formats::put_f16(out, 2 * i, *v);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    let nb = (x.len() / 32).min(out.len() / q8_0::BLOCK_BYTES);
    for (i, block) in out.chunks_exact_mut(q8_0::BLOCK_BYTES).take(nb).enumerate() {
        let (d, _) = quantize_block32(x.as_ptr().add(32 * i), block.as_mut_ptr().add(2));
        put_f16(block, 0, d);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_1(x: &[f32], out: &mut [u8]) {
    let nb = (x.len() / 32).min(out.len() / q8_1::BLOCK_BYTES);
    for (i, block) in out.chunks_exact_mut(q8_1::BLOCK_BYTES).take(nb).enumerate() {
        let (d, qsum) = quantize_block32(x.as_ptr().add(32 * i), block.as_mut_ptr().add(4));
        put_f16(block, 0, d);
        put_f16(block, 2, qsum as f32 * d);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_k(x: &[f32], out: &mut [u8]) {
    let nb = (x.len() / QK_K).min(out.len() / q8_k::BLOCK_BYTES);
    for (xs, block) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(q8_k::BLOCK_BYTES))
        .take(nb)
    {
        let mut m = _mm256_setzero_ps();
        for k in 0..QK_K / 8 {
            m = _mm256_max_ps(m, abs_no_nan(_mm256_loadu_ps(xs.as_ptr().add(8 * k))));
        }
        let amax = hmax(m);
        if amax == 0.0 {
            block.fill(0);
            continue;
        }
        // The first element of largest magnitude, with its sign (as the scalar scan).
        let max = *xs.iter().find(|v| v.abs() == amax).unwrap_or(&amax);
        let iscale = -127.0 / max;
        let is = _mm256_set1_ps(iscale);
        let q = block.as_mut_ptr().add(q8_k::QS);
        for g in 0..QK_K / 32 {
            // The scalar `min(127, r as i32) as i8`: +∞ saturates to 127, while −∞ and NaN
            // (possible once `iscale` overflows) become i32::MIN, whose low byte is 0.
            let qi: [__m256i; 4] = core::array::from_fn(|k| {
                let v = _mm256_mul_ps(is, _mm256_loadu_ps(xs.as_ptr().add(32 * g + 8 * k)));
                let r = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                let i = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_set1_ps(127.0), r));
                _mm256_srai_epi32(_mm256_slli_epi32(i, 24), 24)
            });
            _mm256_storeu_si256(q.add(32 * g) as *mut __m256i, pack32(qi));
            let s0 = hsum(_mm256_add_epi32(qi[0], qi[1])) as i16;
            let s1 = hsum(_mm256_add_epi32(qi[2], qi[3])) as i16;
            let at = q8_k::BSUMS + 4 * g;
            block[at..at + 2].copy_from_slice(&s0.to_le_bytes());
            block[at + 2..at + 4].copy_from_slice(&s1.to_le_bytes());
        }
        block[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

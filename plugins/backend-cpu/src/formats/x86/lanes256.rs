//! AVX2 (+ FMA, F16C) primitives that the x86 kernels of both levels share: loads and
//! nibble/bit unpacks of 32 quants, byte dots (`maddubs` + `madd`), horizontal sums, the
//! in-order addition of four block terms, f16/f32 reads, the Q8 and Q8_K block-term
//! helpers, and the weight prefetch.
//!
//! Not for: kernels (they live by shape in `vec_dot`, `few`, `rows`, `panel`), or
//! choosing kernels (`levels`). Nothing here imports another x86 module.

use crate::formats::k_quants::q8_k;
use core::arch::x86_64::*;

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

/// `d · d_a · Σ q q_a + m · s_a`, the Q4_1/Q5_1 block term in the scalar order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q4_1_term(w: *const u8, a: *const u8, s: i32) -> f32 {
    let (d, m) = (f16_at(w), f16_at(w.add(2)));
    let (d_a, s_a) = (f16_at(a), f16_at(a.add(2)));
    d * d_a * s as f32 + m * s_a
}

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

//! IQ4_NL and IQ4_XS `vec_dot` (one row) at AVX2 and AVX-512: the 4-bit indices are turned into
//! their signed table values by one `vpshufb` through [`iq4_nl::KVALUES`] (16 bytes, so
//! one 128-bit lane holds the whole table), then dotted as signed bytes like Q8_0 (IQ4_NL)
//! or scaled per sub-block like Q4_K (IQ4_XS). The table's values lie in −127..=113, never
//! −128, so the `|x| · sign(y, x)` byte dots are exact and `maddubs` pairs stay below 2^15.
//! Same numerics contract as `formats::x86`: integer sums exact, float terms the scalar
//! kernels' operations in their order.
//!
//! Not for: IQ4 prompt panels (`panel::panel_iq4`) or decode (`rows::few_rows16`, `rows::kdec16`).

use crate::formats::k_quants::{q8_k, QK_K};
use crate::formats::x86::lanes256::{
    blocks, dot_i8_i8, f16_at, f16_x4, f32_at, hsum, load, nibbles32, prefetch_ahead, sum_blocks,
};
use crate::formats::x86::lanes512::{
    dot_i8_i8_512, fold, load_pair, nibbles32_pair, sum_block_pairs,
};
use crate::formats::{iq4_nl, iq4_xs, q8_0};
use core::arch::x86_64::*;

table_wrappers! {
    vec_dot vec_dot_iq4_nl_avx2 => dot_iq4_nl_avx2;
    vec_dot vec_dot_iq4_xs_avx2 => dot_iq4_xs_avx2;
    vec_dot vec_dot_iq4_nl_avx512 => dot_iq4_nl_avx512;
    vec_dot vec_dot_iq4_xs_avx512 => dot_iq4_xs_avx512;
}

/// The table in both 128-bit lanes, for `vpshufb`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn table256() -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(iq4_nl::KVALUES.as_ptr() as *const __m128i))
}

/// The 32 table values of the 16 nibble bytes at `p`, in element order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn values32(table: __m256i, p: *const u8) -> __m256i {
    _mm256_shuffle_epi8(table, nibbles32(p))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq4_nl_avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wb, ab) = (iq4_nl::BLOCK_BYTES, q8_0::BLOCK_BYTES);
    let nb = blocks(n, 32, w, wb, a, ab);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    let table = table256();
    sum_blocks(
        nb,
        |i| {
            prefetch_ahead(w.add(i * wb), wb);
            dot_i8_i8(values32(table, w.add(i * wb + 2)), load(a.add(i * ab + 2)))
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

/// The eight sub-block scales `ls − 32` of the IQ4_XS block at `wb`, as the scalar
/// [`iq4_xs::scales`] reads them.
///
/// # Safety
/// `wb` must point at a whole block (its first 8 bytes are read).
#[inline(always)]
unsafe fn xs_scales(wb: *const u8) -> [i32; 8] {
    // SAFETY: the caller passes a whole block.
    iq4_xs::scales(unsafe { std::slice::from_raw_parts(wb, 8) })
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq4_xs_avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wbb, abb) = (iq4_xs::BLOCK_BYTES, q8_k::BLOCK_BYTES);
    let nb = blocks(n, QK_K, w, wbb, a, abb);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    let table = table256();
    let mut sum = 0.0f32;
    for i in 0..nb {
        let (wb, ab) = (w.add(i * wbb), a.add(i * abb));
        prefetch_ahead(wb, wbb);
        let sc = xs_scales(wb);
        let (qs, aq) = (wb.add(iq4_xs::QS), ab.add(q8_k::QS));
        let mut acc = _mm256_setzero_si256();
        for (s, &ls) in sc.iter().enumerate() {
            let q = values32(table, qs.add(16 * s));
            let act = load(aq.add(32 * s));
            // |q| · (±a) pairs in i16 (≤ 2·127·127), then × the sub-block scale into i32.
            let p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(act, q));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(ls as i16)));
        }
        sum += f16_at(wb) * f32_at(ab) * hsum(acc) as f32;
    }
    sum
}

/// The table in all four 128-bit lanes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn table512() -> __m512i {
    _mm512_broadcast_i32x4(_mm_loadu_si128(iq4_nl::KVALUES.as_ptr() as *const __m128i))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_iq4_nl_avx512(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wb, ab) = (iq4_nl::BLOCK_BYTES, q8_0::BLOCK_BYTES);
    let nb = blocks(n, 32, w, wb, a, ab);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    let (t256, t512) = (table256(), table512());
    sum_block_pairs(
        nb,
        |i| {
            prefetch_ahead(w.add(i * wb), 2 * wb);
            let q = _mm512_shuffle_epi8(t512, nibbles32_pair(w.add(i * wb + 2), wb));
            dot_i8_i8_512(q, load_pair(a.add(i * ab + 2), ab))
        },
        |i| dot_i8_i8(values32(t256, w.add(i * wb + 2)), load(a.add(i * ab + 2))),
        |i, s| s as f32 * (f16_at(w.add(i * wb)) * f16_at(a.add(i * ab))),
        |i, s| {
            _mm_mul_ps(
                s,
                _mm_mul_ps(f16_x4(w.add(i * wb), wb), f16_x4(a.add(i * ab), ab)),
            )
        },
    )
}

/// IQ4_XS at AVX-512: two sub-blocks (64 values) per step, their `|q| · (±a)` pairs in
/// i16 then multiplied by `[scale(2c) × 16, scale(2c+1) × 16]` and summed into i32 by one
/// `vpdpwssd`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_iq4_xs_avx512(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wbb, abb) = (iq4_xs::BLOCK_BYTES, q8_k::BLOCK_BYTES);
    let nb = blocks(n, QK_K, w, wbb, a, abb);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    let table = table512();
    let mut sum = 0.0f32;
    for i in 0..nb {
        let (wb, ab) = (w.add(i * wbb), a.add(i * abb));
        prefetch_ahead(wb, wbb);
        let sc = xs_scales(wb);
        let (qs, aq) = (wb.add(iq4_xs::QS), ab.add(q8_k::QS));
        let mut acc = _mm512_setzero_si512();
        for c in 0..4 {
            let q = _mm512_shuffle_epi8(table, nibbles32_pair(qs.add(32 * c), 16));
            let act = _mm512_loadu_si512(aq.add(64 * c) as *const _);
            let neg = _mm512_movepi8_mask(q);
            let act = _mm512_mask_sub_epi8(act, neg, _mm512_setzero_si512(), act);
            let p = _mm512_maddubs_epi16(_mm512_abs_epi8(q), act);
            let s = _mm512_inserti64x4(
                _mm512_set1_epi16(sc[2 * c] as i16),
                _mm256_set1_epi16(sc[2 * c + 1] as i16),
                1,
            );
            acc = _mm512_dpwssd_epi32(acc, p, s);
        }
        sum += f16_at(wb) * f32_at(ab) * hsum(fold(acc)) as f32;
    }
    sum
}

//! AVX2 + FMA + F16C one-row kernels: every weight format's `vec_dot` (one weight row
//! against one activation row) and the four-token `vec_dot_x4` of Q4_0, Q4_1, Q5_0, Q8_0,
//! Q4_K and Q6_K.
//!
//! Not for: activation quantizers (`x86::quantize`), IQ4 formats (`vec_dot::iq4`), or the
//! kernels that take many rows or tokens a step (`few`, `rows`, `panel`).

use crate::formats::k_quants::{q2_k, q3_k, q4_k, q5_k, q6_k, q8_k, QK_K};
use crate::formats::x86::lanes256::{
    bits32, blocks, dot_i8_i8, dot_u8_i8, f16_at, f16_pairs4, f16_x4, f32_at, hsum, hsum4,
    k4_terms_x4, load, nibbles32, prefetch_ahead, q4_1_term, q6k_offset, q6k_terms_x4, reduce16,
    scales_mins_k4, sum_blocks, terms4_q4_1, terms4_sdd,
};
use crate::formats::{q4_0, q4_1, q5_0, q5_1, q8_0, q8_1};
use core::arch::x86_64::*;

table_wrappers! {
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
    x4 vec_dot_x4_q4_0 => dot_x4_q4_0, 32, q8_0::BLOCK_BYTES;
    x4 vec_dot_x4_q4_1 => dot_x4_q4_1, 32, q8_1::BLOCK_BYTES;
    x4 vec_dot_x4_q5_0 => dot_x4_q5_0, 32, q8_0::BLOCK_BYTES;
    x4 vec_dot_x4_q8_0 => dot_x4_q8_0, 32, q8_0::BLOCK_BYTES;
    x4 vec_dot_x4_q4_k => dot_x4_q4_k, QK_K, q8_k::BLOCK_BYTES;
    x4 vec_dot_x4_q6_k => dot_x4_q6_k, QK_K, q8_k::BLOCK_BYTES;
}

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
unsafe fn scale_pair(s0: i32, s1: i32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(s1 as i16), _mm_set1_epi16(s0 as i16))
}

/// `Σ_g mins[g] · (bsum(2g) + bsum(2g+1))` of the Q8_K block at `ab` (Q4_K, Q5_K mins).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn min_sum_k4(ab: *const u8, mn: [u8; 8]) -> i32 {
    let bsums = load(ab.add(q8_k::BSUMS));
    let m = _mm_cvtsi64_si128(i64::from_le_bytes(mn));
    let m = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m));
    hsum(_mm256_madd_epi16(bsums, m))
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
unsafe fn q3k_scales16(packed: *const u8) -> __m256i {
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
        // The scales of groups `8h ..= 8h + 7` (bytes `2j`, `2j + 1` at bits `16s`, `16s + 8`),
        // read as two u64s: taken byte by byte from the vector that the `msum` loop loads,
        // they cost 15 `vpextrb`s a super-block, ~20% of this kernel.
        let sc = [
            u64::from_le_bytes(scales[..8].try_into().unwrap()),
            u64::from_le_bytes(scales[8..].try_into().unwrap()),
        ];
        for (h, sc) in sc.into_iter().enumerate() {
            let qv = load(qs.add(32 * h));
            for s in 0..4 {
                let j = 4 * h + s;
                let q =
                    _mm256_and_si256(_mm256_srl_epi16(qv, _mm_cvtsi32_si128(2 * s as i32)), low2);
                let p = _mm256_maddubs_epi16(q, load(aq.add(32 * j)));
                let sp = scale_pair(
                    ((sc >> (16 * s)) & 0x0F) as i32,
                    ((sc >> (16 * s + 8)) & 0x0F) as i32,
                );
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, sp));
            }
        }
        // A loop, not `map(..).sum()`: moved here from `avx2.rs`, that closure stopped
        // being inlined (16 calls a super-block).
        let mut msum = 0i32;
        for (g, &sc) in scales.iter().enumerate() {
            msum += (sc >> 4) as i32 * q8_k::bsum(ab, g);
        }
        let d_a = q8_k::d(ab);
        sum += d_a * f16_at(wb.as_ptr().add(80)) * hsum(acc) as f32
            - d_a * f16_at(wb.as_ptr().add(82)) * msum as f32;
    }
    sum
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

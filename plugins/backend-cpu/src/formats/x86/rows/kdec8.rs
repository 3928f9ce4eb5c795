//! AVX2 decode kernels of the K-quants (see [`crate::formats::FormatKernels::decode`]):
//! one token against eight weight rows a step, one per i32 lane, as [`super::kdec16`] does
//! sixteen with AVX-512 (same pack, same transposes, same float terms).
//!
//! Without VNNI the products are `vpmaddubsw`'s: the unsigned quants against the signed
//! activations. A Q4_K 32-quant sub-block's eight pair sums per lane stay below 2^15
//! (`8 · 2 · 15 · 127`), so they are added in i16, and `vpmaddwd` against the sub-block's
//! scale (in both i16 halves of each lane) widens and scales them at once; Q2_K's do that
//! every 16-quant group.
//!
//! Measured (one thread, 2048 × 2048, from cache): Q4_K 27 GB/s against `vec_dot`'s 17,
//! Q2_K 11 / 7.3. Q5_K (21 / 18 from cache, its fifth bits widened every four pair sums)
//! measured 2–10% slower than `vec_dot` decoding the 1B Q5_K_M model, and Q3_K's high bits
//! cost too much without byte masks (as fast as `vec_dot` from cache): both stay on
//! `vec_dot`, as Q6_K does.
//!
//! Not for: Q6_K, Q5_K, Q3_K (`vec_dot`). Kept apart from `kdec16`, not folded: its
//! products are `vpmaddubsw` + `vpmaddwd` (scaled as they widen), not `vpdpbusd` + `vpmulld`,
//! so the inner loops differ; the pack, its layout constants and the wrappers are shared.

use super::few_rows8::{dwords4, store, ROWS};
use super::kdec16::{pack_bytes, pack_q8_k, prefetch_l2, D_A, GROUP_PAIRS, PACK_BLOCK, SUB_PAIRS};
use super::step_rows;
use crate::formats::k_quants::{q2_k, q4_k, QK_K};
use crate::formats::FewKernels;
use core::arch::x86_64::*;
use prima_abi::GgmlType;

/// The decode kernels of weight type `t` at this level, if it has them.
pub(in crate::formats) fn decode_kernels(t: GgmlType) -> Option<FewKernels> {
    let dot = match t {
        GgmlType::Q4K => dot_q4_k,
        GgmlType::Q2K => dot_q2_k,
        _ => return None,
    };
    Some(FewKernels {
        max_tokens: 1,
        pack_bytes,
        pack: pack_q8_k,
        dot,
        token_major: true,
    })
}

decode_wrappers! {
    QK_K;
    dot_q4_k => rows_q4_k, q4_k::BLOCK_BYTES;
    dot_q2_k => rows_q2_k, q2_k::BLOCK_BYTES;
}

/// The i32 at `p + 4k` broadcast to every lane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn bcast(p: *const u8, k: usize) -> __m256i {
    _mm256_set1_epi32((p as *const i32).add(k).read_unaligned())
}

/// Byte `b` of each lane's dword in both of its i16 halves, for `vpmaddwd`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn byte_pairs4(v: __m256i) -> [__m256i; 4] {
    let ff = _mm256_set1_epi32(0xFF);
    let both = |x: __m256i| _mm256_or_si256(x, _mm256_slli_epi32::<16>(x));
    [
        both(_mm256_and_si256(v, ff)),
        both(_mm256_and_si256(_mm256_srli_epi32::<8>(v), ff)),
        both(_mm256_and_si256(_mm256_srli_epi32::<16>(v), ff)),
        both(_mm256_srli_epi32::<24>(v)),
    ]
}

/// The f16 halves of each lane's dword as f32s: `(low, high)`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn f16_pair(x: __m256i) -> (__m256, __m256) {
    let lo = _mm256_and_si256(x, _mm256_set1_epi32(0xFFFF));
    let hi = _mm256_srli_epi32::<16>(x);
    // Per 128-bit lane [lo × 4, hi × 4] (no saturation: both below 2^16), then the lanes'
    // quarters in order: [lo 0..8 | hi 0..8].
    let both = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(lo, hi));
    (
        _mm256_cvtph_ps(_mm256_castsi256_si128(both)),
        _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(both)),
    )
}

/// Q4_K, as `kdec16::rows_k4`: per super-block, the 16-byte head (`d`, `dmin`, the packed
/// scales and mins), then the 128 quant bytes, 32 (two sub-blocks) at a time.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_q4_k(n: usize, w: &[u8], ws: usize, pack: &[u8], out: &mut [f32]) {
    let (nb, wb) = (n / QK_K, q4_k::BLOCK_BYTES);
    let rows = out.len();
    let low = _mm256_set1_epi8(0x0F);
    let (m6, top2) = (_mm256_set1_epi8(0x3F), _mm256_set1_epi8(0x30));
    let even16 = _mm256_set1_epi32(0x00FF_00FF);
    for first in (0..rows).step_by(ROWS) {
        let row = step_rows::<ROWS>(w, ws, first, rows);
        let mut acc = _mm256_setzero_ps();
        // The next step's rows, a super-block's share of them each super-block, into L2
        // (see `kdec16::prefetch_l2`).
        let next = w.as_ptr().wrapping_add((first + ROWS) * ws);
        for i in 0..nb {
            prefetch_l2(next.wrapping_add(i * ROWS * wb), ROWS * wb);
            let off = i * wb;
            let blk = pack.as_ptr().add(i * PACK_BLOCK);
            // As `kdec16::rows_q4_k`: dword 0 is d, dmin; dwords 1 ..= 3 the scale bytes.
            let [dm, s1, s2, s3] = dwords4(&row, off);
            let sc_lo = _mm256_and_si256(s1, m6);
            let mn_lo = _mm256_and_si256(s2, m6);
            let sc_hi = _mm256_or_si256(
                _mm256_and_si256(s3, low),
                _mm256_and_si256(_mm256_srli_epi32::<2>(s1), top2),
            );
            let mn_hi = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi32::<4>(s3), low),
                _mm256_and_si256(_mm256_srli_epi32::<2>(s2), top2),
            );
            let (sl, sh) = (byte_pairs4(sc_lo), byte_pairs4(sc_hi));
            let sc = [sl[0], sl[1], sl[2], sl[3], sh[0], sh[1], sh[2], sh[3]];
            let mut isum = _mm256_setzero_si256();
            for c in 0..4 {
                // Bytes 32c .. 32c + 32 of `qs`: dword j's low nibbles are elements
                // 64c + 4j .. (sub-block 2c), its high nibbles 64c + 32 + 4j .. (2c + 1).
                let q0 = dwords4(&row, off + 16 + 32 * c);
                let q1 = dwords4(&row, off + 32 + 32 * c);
                let (mut lo, mut hi) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for j in 0..8 {
                    let q = if j < 4 { q0[j] } else { q1[j - 4] };
                    let (ql, qh) = (
                        _mm256_and_si256(q, low),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(q), low),
                    );
                    lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(ql, bcast(blk, 16 * c + j)));
                    hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(qh, bcast(blk, 16 * c + 8 + j)));
                }
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(lo, sc[2 * c]));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(hi, sc[2 * c + 1]));
            }
            // msum: the mins as i16 pairs (m₀, m₂), (m₁, m₃), (m₄, m₆), (m₅, m₇).
            let sub = blk.add(SUB_PAIRS);
            let mins = [
                _mm256_and_si256(mn_lo, even16),
                _mm256_and_si256(_mm256_srli_epi32::<8>(mn_lo), even16),
                _mm256_and_si256(mn_hi, even16),
                _mm256_and_si256(_mm256_srli_epi32::<8>(mn_hi), even16),
            ];
            let mut msum = _mm256_setzero_si256();
            for (k, m) in mins.into_iter().enumerate() {
                msum = _mm256_add_epi32(msum, _mm256_madd_epi16(m, bcast(sub, k)));
            }
            let (d, dmin) = f16_pair(dm);
            let da = _mm256_set1_ps((blk.add(D_A) as *const f32).read_unaligned());
            // d_a·d·isum − d_a·dmin·msum, as the scalar kernel orders it.
            let term = _mm256_sub_ps(
                _mm256_mul_ps(_mm256_mul_ps(da, d), _mm256_cvtepi32_ps(isum)),
                _mm256_mul_ps(_mm256_mul_ps(da, dmin), _mm256_cvtepi32_ps(msum)),
            );
            acc = _mm256_add_ps(acc, term);
        }
        store(acc, first, out);
    }
}

/// Q2_K, as `kdec16::rows_q2_k`: a 16-quant group's four pair sums per lane stay far below
/// 2^15 (`4 · 2 · 3 · 127`), so they are added in i16 and scaled by one `vpmaddwd`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_q2_k(n: usize, w: &[u8], ws: usize, pack: &[u8], out: &mut [f32]) {
    let (nb, wb) = (n / QK_K, q2_k::BLOCK_BYTES);
    let rows = out.len();
    let (three, m4) = (_mm256_set1_epi8(3), _mm256_set1_epi8(0x0F));
    let even16 = _mm256_set1_epi32(0x00FF_00FF);
    for first in (0..rows).step_by(ROWS) {
        let row = step_rows::<ROWS>(w, ws, first, rows);
        let mut acc = _mm256_setzero_ps();
        let next = w.as_ptr().wrapping_add((first + ROWS) * ws);
        for i in 0..nb {
            let off = i * wb;
            prefetch_l2(next.wrapping_add(i * ROWS * wb), ROWS * wb);
            let blk = pack.as_ptr().add(i * PACK_BLOCK);
            let sv = dwords4(&row, off);
            let mut isum = _mm256_setzero_si256();
            for h in 0..2 {
                let (q0, q1) = (
                    dwords4(&row, off + q2_k::QS + 32 * h),
                    dwords4(&row, off + q2_k::QS + 32 * h + 16),
                );
                let mut q = [q0[0], q0[1], q0[2], q0[3], q1[0], q1[1], q1[2], q1[3]];
                for s in 0..4 {
                    let (mut g0, mut g1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                    for (j, qj) in q.iter_mut().enumerate() {
                        let u = _mm256_and_si256(*qj, three);
                        *qj = _mm256_srli_epi16::<2>(*qj);
                        let p = _mm256_maddubs_epi16(u, bcast(blk, 32 * h + 8 * s + j));
                        if j < 4 {
                            g0 = _mm256_add_epi16(g0, p);
                        } else {
                            g1 = _mm256_add_epi16(g1, p);
                        }
                    }
                    let g = 8 * h + 2 * s;
                    let sc = byte_pairs4(_mm256_and_si256(sv[g / 4], m4));
                    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(g0, sc[g % 4]));
                    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(g1, sc[g % 4 + 1]));
                }
            }
            let pairs = blk.add(GROUP_PAIRS);
            let mut msum = _mm256_setzero_si256();
            for (k, &v) in sv.iter().enumerate() {
                let mn = _mm256_and_si256(_mm256_srli_epi32::<4>(v), m4);
                let even = _mm256_and_si256(mn, even16);
                let odd = _mm256_and_si256(_mm256_srli_epi32::<8>(mn), even16);
                msum = _mm256_add_epi32(msum, _mm256_madd_epi16(even, bcast(pairs, 2 * k)));
                msum = _mm256_add_epi32(msum, _mm256_madd_epi16(odd, bcast(pairs, 2 * k + 1)));
            }
            let (d, dmin) = f16_pair(dwords4(&row, off + q2_k::D - 12)[3]);
            let da = _mm256_set1_ps((blk.add(D_A) as *const f32).read_unaligned());
            // d_a·d·isum − d_a·dmin·msum, as the scalar kernel orders it.
            let term = _mm256_sub_ps(
                _mm256_mul_ps(_mm256_mul_ps(da, d), _mm256_cvtepi32_ps(isum)),
                _mm256_mul_ps(_mm256_mul_ps(da, dmin), _mm256_cvtepi32_ps(msum)),
            );
            acc = _mm256_add_ps(acc, term);
        }
        store(acc, first, out);
    }
}

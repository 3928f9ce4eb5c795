//! AVX-512 VNNI decode kernels of the K-quants (see
//! [`crate::formats::FormatKernels::decode`]): one token against sixteen weight rows a
//! step, one per i32 lane, as [`super::few_rows16`] does for the 32-element formats.
//!
//! Each 16 bytes of the sixteen rows' super-blocks are transposed ([`dwords4`]), so vector
//! `j` holds dword `j` of every row, and the token's matching four activation quants are
//! broadcast against it: one `vpdpbusd` makes a four-quant product of every row, with no
//! horizontal sums. The quants are taken as stored, unsigned: Q4_K's nibbles, Q2_K's bit
//! pairs. The sub-block (Q4_K: 32 quants) or group (Q2_K: 16) sums are multiplied by their
//! rows' scales lane by lane (`vpmulld`), and the scales and mins are unpacked in the lanes
//! too, sixteen rows at once. The float terms are the scalar kernel's expression in its
//! order, one lane per row, added super-block after super-block to one running sum per
//! row, so every result equals the scalar `vec_dot` bit for bit.
//!
//! The mins meet the activations' `bsums` by `vpdpwssd`, against pairs the pack holds per
//! super-block: Q4_K's mins as i16 pairs `(m₀, m₂)`, `(m₁, m₃)`, … against `(P₀, P₂)`,
//! `(P₁, P₃)`, … (`P_s`: the 32-quant sums); Q2_K's as `(m_4k, m_4k+2)`,
//! `(m_4k+1, m_4k+3)` against the `bsums` paired alike.
//!
//! Decoding streams every weight once from memory, so the kernel's speed is mostly how
//! well the rows arrive: the next step's rows are prefetched into L2 ([`prefetch_l2`]).
//! Measured (one thread, 2048 × 2048): from cache, Q4_K 31 GB/s against `vec_dot`'s 21,
//! Q2_K 19 / 7.3; from DRAM, Q4_K about `vec_dot`'s rate.
//!
//! The other K-quants stay on `vec_dot`, their kernels in this design measured slower
//! (git history has them). Q6_K: 20 against 27 GB/s from cache (its six-bit quants cost
//! more to transpose and assemble than `vec_dot`'s 64-byte loads). Q5_K (Q4_K's kernel
//! with the fifth bits shifted in from the transposed `qh`, 25 / 18 GB/s from cache):
//! decoding the 1B Q5_K_M model 7% faster on one thread but 15% slower on two. Q3_K (bit
//! pairs with the high bit added by byte masks, the `−4` from the `bsums`; 16 / 12.5 GB/s
//! from cache): the 1B Q3_K_M model no faster on one thread, 13% slower on two.
//!
//! IQ4_XS takes Q4_K's path with its nibbles looked up in the IQ4_NL table (+ 128, by
//! `vpshufb`) and its six-bit signed scales unpacked in the lanes: its `vec_dot` is bound
//! by its per-row work, not by memory.
//!
//! [`pack_bytes`] and [`pack_q8_k`] are also [`super::kdec8`]'s (AVX2).
//!
//! Not for: the 32-element formats (`few_rows16`), or AVX2 (`kdec8`).

use super::few_rows16::{store, ROWS};
use super::step_rows;
use crate::formats::iq4_xs;
use crate::formats::k_quants::{q2_k, q4_k, q8_k, QK_K};
use crate::formats::x86::lanes512::{bytes4, dwords4, f16_pair, iq4_table, k4_scales_mins};
use crate::formats::FewKernels;
use core::arch::x86_64::*;
use prima_abi::GgmlType;

/// Pack bytes of one super-block of the token: its 256 quants, `d_a` (f32), the `bsums`
/// as eight i16 pairs (`GROUP_PAIRS`), and the 32-quant sums as four i16 pairs
/// (`SUB_PAIRS`).
pub(super) const PACK_BLOCK: usize = QK_K + 4 + 8 * 4 + 4 * 4;
/// Offset of `d_a` in a packed super-block.
pub(super) const D_A: usize = QK_K;
/// Offset of the `bsums` pairs: dword `2k` holds `(bsum[4k], bsum[4k + 2])`, dword
/// `2k + 1` holds `(bsum[4k + 1], bsum[4k + 3])` — the order in which a lane's four byte
/// scales `4k ..= 4k + 3` split into even and odd i16 pairs.
pub(super) const GROUP_PAIRS: usize = D_A + 4;
/// Offset of the 32-quant sums `P_s = bsum[2s] + bsum[2s + 1]` as pairs: `(P₀, P₂)`,
/// `(P₁, P₃)`, `(P₄, P₆)`, `(P₅, P₇)`.
pub(super) const SUB_PAIRS: usize = GROUP_PAIRS + 8 * 4;

/// The decode kernels of weight type `t` at this level, if it has them.
pub(in crate::formats) fn decode_kernels(t: GgmlType) -> Option<FewKernels> {
    let dot = match t {
        GgmlType::Q4K => dot_q4_k,
        GgmlType::Q2K => dot_q2_k,
        GgmlType::IQ4XS => dot_iq4_xs,
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

/// Bytes of the pack of one Q8_K activation row of `n` columns (see [`PACK_BLOCK`]).
pub(super) fn pack_bytes(n: usize, n_tokens: usize) -> usize {
    n / QK_K * n_tokens * PACK_BLOCK
}

/// Packs one Q8_K activation row (see [`PACK_BLOCK`]).
pub(super) fn pack_q8_k(n: usize, acts: &[u8], _a_stride: usize, n_tokens: usize, pack: &mut [u8]) {
    let (nb, ab) = (n / QK_K, q8_k::BLOCK_BYTES);
    assert!(
        n_tokens == 1 && pack.len() >= pack_bytes(n, 1) && acts.len() >= nb * ab,
        "K-quant decode pack: {n_tokens} tokens, or short row or buffer"
    );
    let blocks = acts.chunks_exact(ab).zip(pack.chunks_exact_mut(PACK_BLOCK));
    for (a, p) in blocks.take(nb) {
        p[..QK_K].copy_from_slice(&a[q8_k::QS..q8_k::QS + QK_K]);
        p[D_A..D_A + 4].copy_from_slice(&a[..4]);
        let bsum = |g: usize| q8_k::bsum(a, g) as i16;
        let pair = |lo: i16, hi: i16| (lo as u16 as u32 | (hi as u16 as u32) << 16).to_le_bytes();
        for k in 0..4 {
            let at = GROUP_PAIRS + 8 * k;
            p[at..at + 4].copy_from_slice(&pair(bsum(4 * k), bsum(4 * k + 2)));
            p[at + 4..at + 8].copy_from_slice(&pair(bsum(4 * k + 1), bsum(4 * k + 3)));
        }
        // Each 32-quant sum is at most 32 · 128 in magnitude: an i16.
        let sub = |s: usize| bsum(2 * s) + bsum(2 * s + 1);
        for (k, (lo, hi)) in [(0, 2), (1, 3), (4, 6), (5, 7)].into_iter().enumerate() {
            let at = SUB_PAIRS + 4 * k;
            p[at..at + 4].copy_from_slice(&pair(sub(lo), sub(hi)));
        }
    }
}

decode_wrappers! {
    QK_K;
    dot_q4_k => rows_q4_k, q4_k::BLOCK_BYTES;
    dot_q2_k => rows_q2_k, q2_k::BLOCK_BYTES;
    dot_iq4_xs => rows_iq4_xs, iq4_xs::BLOCK_BYTES;
}

/// Prefetches the cache lines of `p .. p + bytes` into L2, not L1: a step's next rows
/// fetched into L1 evict the rows it is reading (measured: half the bandwidth of
/// `vec_dot`, where L2 gives 10% more).
#[inline]
pub(super) fn prefetch_l2(p: *const u8, bytes: usize) {
    for off in (0..bytes).step_by(64) {
        // SAFETY: a prefetch never faults, wherever it points (wrapping: the address may
        // lie past the mapping); x86-64 always has SSE.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(off) as *const i8) };
    }
}

/// The i32 at `p + 4k` broadcast to every lane.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn bcast(p: *const u8, k: usize) -> __m512i {
    _mm512_set1_epi32((p as *const i32).add(k).read_unaligned())
}

/// Q4_K: per super-block, the 16-byte head (`d`, `dmin`, the packed scales and mins), then
/// the 128 quant bytes, 32 (two sub-blocks) at a time.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_q4_k(n: usize, w: &[u8], ws: usize, pack: &[u8], out: &mut [f32]) {
    let (nb, wb) = (n / QK_K, q4_k::BLOCK_BYTES);
    let rows = out.len();
    let low = _mm512_set1_epi8(0x0F);
    let even16 = _mm512_set1_epi32(0x00FF_00FF);
    for first in (0..rows).step_by(ROWS) {
        let row = step_rows::<ROWS>(w, ws, first, rows);
        let mut acc = _mm512_setzero_ps();
        // The next step's rows, a super-block's share of them each super-block (see
        // `few_rows16::rows_n`).
        let next = w.as_ptr().wrapping_add((first + ROWS) * ws);
        for i in 0..nb {
            let off = i * wb;
            prefetch_l2(next.wrapping_add(i * ROWS * wb), ROWS * wb);
            let blk = pack.as_ptr().add(i * PACK_BLOCK);
            // Dword 0: d, dmin; dwords 1 ..= 3: the 12 scale bytes (`unpack_scale_min_k4`,
            // four sub-blocks a dword, in the lanes).
            let [dm, s1, s2, s3] = dwords4(&row, off);
            let [sc_lo, sc_hi, mn_lo, mn_hi] = k4_scales_mins(s1, s2, s3);
            let (sl, sh) = (bytes4(sc_lo), bytes4(sc_hi));
            let sc = [sl[0], sl[1], sl[2], sl[3], sh[0], sh[1], sh[2], sh[3]];
            let mut isum = _mm512_setzero_si512();
            for c in 0..4 {
                // Bytes 32c .. 32c + 32 of `qs`: dword j's low nibbles are elements
                // 64c + 4j .. (sub-block 2c), its high nibbles 64c + 32 + 4j .. (2c + 1).
                let q0 = dwords4(&row, off + 16 + 32 * c);
                let q1 = dwords4(&row, off + 32 + 32 * c);
                let (mut lo, mut hi) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for j in 0..8 {
                    let q = if j < 4 { q0[j] } else { q1[j - 4] };
                    let (ql, qh) = (
                        _mm512_and_si512(q, low),
                        _mm512_and_si512(_mm512_srli_epi16::<4>(q), low),
                    );
                    lo = _mm512_dpbusd_epi32(lo, ql, bcast(blk, 16 * c + j));
                    hi = _mm512_dpbusd_epi32(hi, qh, bcast(blk, 16 * c + 8 + j));
                }
                isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(lo, sc[2 * c]));
                isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(hi, sc[2 * c + 1]));
            }
            // msum: the mins as i16 pairs (m₀, m₂), (m₁, m₃), (m₄, m₆), (m₅, m₇).
            let sub = blk.add(SUB_PAIRS);
            let mins = [
                _mm512_and_si512(mn_lo, even16),
                _mm512_and_si512(_mm512_srli_epi32::<8>(mn_lo), even16),
                _mm512_and_si512(mn_hi, even16),
                _mm512_and_si512(_mm512_srli_epi32::<8>(mn_hi), even16),
            ];
            let mut msum = _mm512_setzero_si512();
            for (k, m) in mins.into_iter().enumerate() {
                msum = _mm512_dpwssd_epi32(msum, m, bcast(sub, k));
            }
            let (d, dmin) = f16_pair(dm);
            let da = _mm512_set1_ps((blk.add(D_A) as *const f32).read_unaligned());
            // d_a·d·isum − d_a·dmin·msum, as the scalar kernel orders it.
            let term = _mm512_sub_ps(
                _mm512_mul_ps(_mm512_mul_ps(da, d), _mm512_cvtepi32_ps(isum)),
                _mm512_mul_ps(_mm512_mul_ps(da, dmin), _mm512_cvtepi32_ps(msum)),
            );
            acc = _mm512_add_ps(acc, term);
        }
        store(&[acc], first, rows, out);
    }
}

/// IQ4_XS: per super-block `d`, `scales_h`, `scales_l`, then 16 quant bytes a sub-block
/// (IQ4_NL's nibble order), each nibble an index into IQ4_NL's table
/// ([`crate::formats::iq4_nl::KVALUES`]). The table plus 128 (1 ..= 241, [`iq4_table`])
/// makes the quants unsigned for `vpdpbusd`; each sub-block's sums start
/// at `−128 · P_s` (its 32-quant sum), which takes the bias back exactly, and are scaled by
/// `ls − 32` lane by lane: the scalar kernel's exact `isum`, then `(d · d_a) · isum`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_iq4_xs(n: usize, w: &[u8], ws: usize, pack: &[u8], out: &mut [f32]) {
    let (nb, wb) = (n / QK_K, iq4_xs::BLOCK_BYTES);
    let rows = out.len();
    let low = _mm512_set1_epi8(0x0F);
    let table = iq4_table();
    let (four_bits, two_bits) = (_mm512_set1_epi32(0x0F), _mm512_set1_epi32(3));
    for first in (0..rows).step_by(ROWS) {
        let row = step_rows::<ROWS>(w, ws, first, rows);
        let mut acc = _mm512_setzero_ps();
        // The next step's rows, a super-block's share of them each super-block (see
        // `few_rows16::rows_n`).
        let next = w.as_ptr().wrapping_add((first + ROWS) * ws);
        for i in 0..nb {
            let off = i * wb;
            prefetch_l2(next.wrapping_add(i * ROWS * wb), ROWS * wb);
            let blk = pack.as_ptr().add(i * PACK_BLOCK);
            let sub = blk.add(SUB_PAIRS);
            // Dword 0: d and scales_h; dword 1: scales_l (sub-block s in its nibble s).
            let [dh, sl, _, _] = dwords4(&row, off);
            let sh = _mm512_srli_epi32::<16>(dh);
            let mut isum = _mm512_setzero_si512();
            for s in 0..8 {
                // Dword j's low nibbles are elements 32s + 4j .., its high ones 32s + 16 + 4j ..
                let q = dwords4(&row, off + iq4_xs::QS + 16 * s);
                let mut sums = _mm512_set1_epi32(-128 * sub_sum(sub, s));
                for (j, &q) in q.iter().enumerate() {
                    let ql = _mm512_shuffle_epi8(table, _mm512_and_si512(q, low));
                    let high = _mm512_and_si512(_mm512_srli_epi16::<4>(q), low);
                    let qh = _mm512_shuffle_epi8(table, high);
                    sums = _mm512_dpbusd_epi32(sums, ql, bcast(blk, 8 * s + j));
                    sums = _mm512_dpbusd_epi32(sums, qh, bcast(blk, 8 * s + 4 + j));
                }
                let ls_low = _mm512_and_si512(
                    _mm512_srlv_epi32(sl, _mm512_set1_epi32(4 * s as i32)),
                    four_bits,
                );
                let ls_high = _mm512_and_si512(
                    _mm512_srlv_epi32(sh, _mm512_set1_epi32(2 * s as i32)),
                    two_bits,
                );
                let ls = _mm512_or_si512(ls_low, _mm512_slli_epi32::<4>(ls_high));
                let scale = _mm512_sub_epi32(ls, _mm512_set1_epi32(32));
                isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(sums, scale));
            }
            let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dh));
            let da = _mm512_set1_ps((blk.add(D_A) as *const f32).read_unaligned());
            let term = _mm512_mul_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(isum));
            acc = _mm512_add_ps(acc, term);
        }
        store(&[acc], first, rows, out);
    }
}

/// The 32-quant sum `P_s` of sub-block `s` from the pack's pairs at `sub` (`(P₀, P₂)`,
/// `(P₁, P₃)`, `(P₄, P₆)`, `(P₅, P₇)`, see [`SUB_PAIRS`]).
#[inline]
unsafe fn sub_sum(sub: *const u8, s: usize) -> i32 {
    let pair = s / 4 * 2 + s % 2;
    let half = s % 4 / 2;
    (sub.add(4 * pair + 2 * half) as *const i16).read_unaligned() as i32
}

/// Q2_K: per super-block, the 16 scale/min bytes, the 64 bytes of 2-bit quants (16 at a
/// time), and `d`, `dmin`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_q2_k(n: usize, w: &[u8], ws: usize, pack: &[u8], out: &mut [f32]) {
    let (nb, wb) = (n / QK_K, q2_k::BLOCK_BYTES);
    let rows = out.len();
    let (three, m4) = (_mm512_set1_epi8(3), _mm512_set1_epi8(0x0F));
    let even16 = _mm512_set1_epi32(0x00FF_00FF);
    for first in (0..rows).step_by(ROWS) {
        let row = step_rows::<ROWS>(w, ws, first, rows);
        let mut acc = _mm512_setzero_ps();
        let next = w.as_ptr().wrapping_add((first + ROWS) * ws);
        for i in 0..nb {
            let off = i * wb;
            prefetch_l2(next.wrapping_add(i * ROWS * wb), ROWS * wb);
            let blk = pack.as_ptr().add(i * PACK_BLOCK);
            // Byte b of sv[k]: group 4k + b's scale (low nibble) and min (high nibble).
            let sv = dwords4(&row, off);
            let mut isum = _mm512_setzero_si512();
            for h in 0..2 {
                // qs dword j (< 8) of half h: bit pair s of each byte is the quant of
                // elements 128h + 32s + 4j .., activation dword 32h + 8s + j.
                let (q0, q1) = (
                    dwords4(&row, off + q2_k::QS + 32 * h),
                    dwords4(&row, off + q2_k::QS + 32 * h + 16),
                );
                let mut q = [q0[0], q0[1], q0[2], q0[3], q1[0], q1[1], q1[2], q1[3]];
                for s in 0..4 {
                    // Groups 8h + 2s (dwords j < 4) and 8h + 2s + 1.
                    let (mut g0, mut g1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                    for (j, qj) in q.iter_mut().enumerate() {
                        let u = _mm512_and_si512(*qj, three);
                        // What the shift drags across bytes lands above bit 1.
                        *qj = _mm512_srli_epi16::<2>(*qj);
                        let a = bcast(blk, 32 * h + 8 * s + j);
                        if j < 4 {
                            g0 = _mm512_dpbusd_epi32(g0, u, a);
                        } else {
                            g1 = _mm512_dpbusd_epi32(g1, u, a);
                        }
                    }
                    let g = 8 * h + 2 * s;
                    let sc = bytes4(_mm512_and_si512(sv[g / 4], m4));
                    isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(g0, sc[g % 4]));
                    isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(g1, sc[g % 4 + 1]));
                }
            }
            // msum: mins as i16 pairs (m_4k, m_4k+2), (m_4k+1, m_4k+3) against the pack's
            // `bsums` pairs.
            let pairs = blk.add(GROUP_PAIRS);
            let mut msum = _mm512_setzero_si512();
            for (k, &v) in sv.iter().enumerate() {
                let mn = _mm512_and_si512(_mm512_srli_epi32::<4>(v), m4);
                let even = _mm512_and_si512(mn, even16);
                let odd = _mm512_and_si512(_mm512_srli_epi32::<8>(mn), even16);
                msum = _mm512_dpwssd_epi32(msum, even, bcast(pairs, 2 * k));
                msum = _mm512_dpwssd_epi32(msum, odd, bcast(pairs, 2 * k + 1));
            }
            // d, dmin: the last dword of the block.
            let (d, dmin) = f16_pair(dwords4(&row, off + q2_k::D - 12)[3]);
            let da = _mm512_set1_ps((blk.add(D_A) as *const f32).read_unaligned());
            // d_a·d·isum − d_a·dmin·msum, as the scalar kernel orders it.
            let term = _mm512_sub_ps(
                _mm512_mul_ps(_mm512_mul_ps(da, d), _mm512_cvtepi32_ps(isum)),
                _mm512_mul_ps(_mm512_mul_ps(da, dmin), _mm512_cvtepi32_ps(msum)),
            );
            acc = _mm512_add_ps(acc, term);
        }
        store(&[acc], first, rows, out);
    }
}

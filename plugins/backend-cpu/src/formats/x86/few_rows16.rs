//! AVX-512 VNNI small-batch kernels that take sixteen weight rows a step, one per i32 lane
//! (see [`crate::formats::FewKernels`]): continuous batching's decode steps of 2 ..= 8
//! requests.
//!
//! [`super::few512`] gives each lane a group of four quants of one row, so every block's
//! sum needs a horizontal reduction: measured, those shuffles, not the `vpdpbusd`s, bound
//! it. Here each lane is a row: the sixteen rows' blocks are transposed (four 128-bit loads
//! per vector, a 4 × 4 dword transpose in each lane), so that vector `j` holds quant group
//! `j` of every row, and a token's group `j` is broadcast against it. Eight `vpdpbusd`s
//! make a block's sixteen integer sums for one token, with no reduction; the transpose is
//! paid once per block for all the tokens. The float terms are the scalar kernel's
//! expression in its order, one lane per row, added block after block to one running sum
//! per (row, token), so every result equals the scalar `vec_dot` bit for bit.
//!
//! The last step of a call takes its missing rows as copies of its last row and drops their
//! results.

use super::few::MAX_TOKENS;
use crate::formats::{f16_at, q4_1, q8_1, FewKernels};
use core::arch::x86_64::*;

/// Rows one step computes: one per i32 lane of a 512-bit vector.
const ROWS: usize = 16;

/// Pack bytes of one token's block: 32 quants, and its scales `d_a`, `s_a` as f32.
const TOKEN_BLOCK: usize = 32 + 4 + 4;

/// The kernels for Q4_1 weights.
pub(super) fn q4_1_kernels() -> FewKernels {
    FewKernels {
        max_tokens: MAX_TOKENS,
        pack_bytes,
        pack: pack_q8_1,
        dot: dot_q4_1,
    }
}

/// Bytes of the pack of `n_tokens` rows of `n` columns: per block, each token's 32 quants,
/// then each token's `d_a`, then each token's `s_a`.
fn pack_bytes(n: usize, n_tokens: usize) -> usize {
    n / 32 * n_tokens * TOKEN_BLOCK
}

/// Packs Q8_1 activation rows, `a_stride` bytes apart (see [`pack_bytes`]).
fn pack_q8_1(n: usize, acts: &[u8], a_stride: usize, n_tokens: usize, pack: &mut [u8]) {
    let (nb, ab) = (n / 32, q8_1::BLOCK_BYTES);
    assert!(
        (1..=MAX_TOKENS).contains(&n_tokens)
            && pack.len() >= pack_bytes(n, n_tokens)
            && a_stride >= nb * ab
            && acts.len() >= (n_tokens - 1) * a_stride + nb * ab,
        "few-token pack: short rows or buffer"
    );
    let blocks = pack[..pack_bytes(n, n_tokens)].chunks_exact_mut(n_tokens * TOKEN_BLOCK);
    for (i, dst) in blocks.enumerate() {
        let (quants, scales) = dst.split_at_mut(n_tokens * 32);
        let (d_a, s_a) = scales.split_at_mut(n_tokens * 4);
        for t in 0..n_tokens {
            let a = &acts[t * a_stride + i * ab..][..ab];
            quants[t * 32..][..32].copy_from_slice(&a[4..36]);
            d_a[t * 4..][..4].copy_from_slice(&f16_at(a, 0).to_le_bytes());
            s_a[t * 4..][..4].copy_from_slice(&f16_at(a, 2).to_le_bytes());
        }
    }
}

fn dot_q4_1(n: usize, w: &[u8], w_stride: usize, pack: &[u8], n_tokens: usize, out: &mut [f32]) {
    let (nb, wb) = (n / 32, q4_1::BLOCK_BYTES);
    assert!(
        (1..=MAX_TOKENS).contains(&n_tokens),
        "few-token dot: {n_tokens} tokens"
    );
    let rows = out.len() / n_tokens;
    assert!(
        out.len() == rows * n_tokens
            && pack.len() >= pack_bytes(n, n_tokens)
            && w_stride >= nb * wb
            && (rows == 0 || w.len() >= (rows - 1) * w_stride + nb * wb),
        "few-token dot: short rows, pack or output"
    );
    // SAFETY: only reachable through the AVX-512 `overlay` table, which `dispatch` hands out
    // after detecting the features `rows_q4_1` enables; the rows, the pack and `out` are in
    // bounds (above).
    unsafe { rows_q4_1(n, w, w_stride, pack, n_tokens, out) }
}

/// The 16 bytes at `off` of rows `k`, `4 + k`, `8 + k` and `12 + k` as the four 128-bit
/// lanes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn lanes(row: &[*const u8; ROWS], k: usize, off: usize) -> __m512i {
    let load = |r: usize| _mm_loadu_si128(row[r].add(off) as *const __m128i);
    let v = _mm512_castsi128_si512(load(k));
    let v = _mm512_inserti32x4::<1>(v, load(4 + k));
    let v = _mm512_inserti32x4::<2>(v, load(8 + k));
    _mm512_inserti32x4::<3>(v, load(12 + k))
}

/// Dwords `0 ..= 3` of the 16 bytes at `off` of each row: lane `r` of vector `j` is row
/// `r`'s dword `j` (a 4 × 4 transpose in each 128-bit lane of [`lanes`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn dwords4(row: &[*const u8; ROWS], off: usize) -> [__m512i; 4] {
    let z = [0, 1, 2, 3].map(|k| lanes(row, k, off));
    let (a, b) = (
        _mm512_unpacklo_epi32(z[0], z[1]),
        _mm512_unpackhi_epi32(z[0], z[1]),
    );
    let (c, d) = (
        _mm512_unpacklo_epi32(z[2], z[3]),
        _mm512_unpackhi_epi32(z[2], z[3]),
    );
    [
        _mm512_unpacklo_epi64(a, c),
        _mm512_unpackhi_epi64(a, c),
        _mm512_unpacklo_epi64(b, d),
        _mm512_unpackhi_epi64(b, d),
    ]
}

/// Dword 0 of the 16 bytes at `off` of each row: lane `r` is row `r`'s.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn dword0(row: &[*const u8; ROWS], off: usize) -> __m512i {
    let z = [0, 1, 2, 3].map(|k| lanes(row, k, off));
    _mm512_unpacklo_epi64(
        _mm512_unpacklo_epi32(z[0], z[1]),
        _mm512_unpacklo_epi32(z[2], z[3]),
    )
}

/// The f16 halves of each lane's dword as f32s: `(low, high)`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn f16_pair(x: __m512i) -> (__m512, __m512) {
    (
        _mm512_cvtph_ps(_mm512_cvtepi32_epi16(x)),
        _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(x))),
    )
}

/// Writes the sums `acc[t]` (lane `k`: row `first + k`) into row-major `out` (`N` tokens a
/// row), the rows below `rows` only.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn store<const N: usize>(acc: &[__m512; N], first: usize, rows: usize, out: &mut [f32]) {
    let mut lanes = [[0.0f32; ROWS]; N];
    for (l, a) in lanes.iter_mut().zip(acc) {
        _mm512_storeu_ps(l.as_mut_ptr(), *a);
    }
    for k in 0..ROWS.min(rows - first) {
        for (t, l) in lanes.iter().enumerate() {
            out[(first + k) * N + t] = l[k];
        }
    }
}

/// Prefetches the cache lines of `p .. p + bytes` into L1.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn prefetch(p: *const u8, bytes: usize) {
    for off in (0..bytes).step_by(64) {
        // Wrapping: the address may lie past the mapping; a prefetch never faults.
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off) as *const i8);
    }
}

/// The row pointers of the step at row `first`: past the last row, the last row again.
#[inline(always)]
fn step_rows(w: &[u8], ws: usize, first: usize, rows: usize) -> [*const u8; ROWS] {
    core::array::from_fn(|k| w[(first + k).min(rows - 1) * ws..].as_ptr())
}

/// Every row of `out` (`rows × N`, row-major) against the `N` tokens of `pack`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn rows_q4_1_n<const N: usize>(n: usize, w: &[u8], ws: usize, pack: &[u8], out: &mut [f32]) {
    let (nb, wb) = (n / 32, q4_1::BLOCK_BYTES);
    let rows = out.len() / N;
    let low = _mm512_set1_epi8(0x0F);
    for first in (0..rows).step_by(ROWS) {
        let row = step_rows(w, ws, first, rows);
        let mut acc = [_mm512_setzero_ps(); N];
        // The next step's rows (contiguous when `ws` is the row's bytes), a block's share
        // of them each block: sixteen rows read a few bytes at a time each are sixteen
        // streams, more than the hardware prefetcher follows.
        let next = w.as_ptr().wrapping_add((first + ROWS) * ws);
        for i in 0..nb {
            prefetch(next.wrapping_add(i * ROWS * wb), ROWS * wb);
            // Byte `b` of quant dword `j` holds element `4j + b` (low nibble) and
            // `16 + 4j + b` (high nibble).
            let q = dwords4(&row, i * wb + 4);
            let q_lo = q.map(|x| _mm512_and_si512(x, low));
            let q_hi = q.map(|x| _mm512_and_si512(_mm512_srli_epi16::<4>(x), low));
            let (d, m) = f16_pair(dword0(&row, i * wb));
            let blk = pack.as_ptr().add(i * N * TOKEN_BLOCK);
            let (d_a, s_a) = (blk.add(N * 32) as *const f32, blk.add(N * 36) as *const f32);
            for (t, acc) in acc.iter_mut().enumerate() {
                let a = blk.add(t * 32) as *const i32;
                let group = |j: usize| _mm512_set1_epi32(a.add(j).read_unaligned());
                let (mut lo, mut hi) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for j in 0..4 {
                    lo = _mm512_dpbusd_epi32(lo, q_lo[j], group(j));
                    hi = _mm512_dpbusd_epi32(hi, q_hi[j], group(4 + j));
                }
                let s = _mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi));
                // d · d_a · s + m · s_a, as the scalar kernel.
                let da = _mm512_set1_ps(d_a.add(t).read_unaligned());
                let sa = _mm512_set1_ps(s_a.add(t).read_unaligned());
                let term =
                    _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(d, da), s), _mm512_mul_ps(m, sa));
                *acc = _mm512_add_ps(*acc, term);
            }
        }
        store(&acc, first, rows, out);
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_q4_1(n: usize, w: &[u8], ws: usize, pack: &[u8], nt: usize, out: &mut [f32]) {
    match nt {
        1 => rows_q4_1_n::<1>(n, w, ws, pack, out),
        2 => rows_q4_1_n::<2>(n, w, ws, pack, out),
        3 => rows_q4_1_n::<3>(n, w, ws, pack, out),
        4 => rows_q4_1_n::<4>(n, w, ws, pack, out),
        5 => rows_q4_1_n::<5>(n, w, ws, pack, out),
        6 => rows_q4_1_n::<6>(n, w, ws, pack, out),
        7 => rows_q4_1_n::<7>(n, w, ws, pack, out),
        _ => rows_q4_1_n::<8>(n, w, ws, pack, out),
    }
}

//! AVX2 decode kernels (see [`crate::formats::FormatKernels::decode`]): one token against
//! eight weight rows a step, one per i32 lane, as [`super::few_rows16`] does sixteen with
//! AVX-512.
//!
//! The eight rows' blocks are transposed (two 128-bit loads per vector, a 4 × 4 dword
//! transpose in each lane), so vector `j` holds quant group `j` of every row; the token's
//! group `j` is broadcast against it. There are no per-block horizontal sums, and the
//! float terms are the scalar kernel's expression in its order, one lane per row, added
//! block after block to one running sum per row, so every result equals the scalar
//! `vec_dot` bit for bit.
//!
//! Q4_0's nibbles are unsigned (`q + 8`): `vpmaddubsw` takes them against the signed
//! activations, whose eight pair sums per lane stay below 2^15 (`8 · 2 · 15 · 127`), so
//! they are added in i16 and widened once; the sums start at the pack's `−8 · Σa`. The
//! activations are packed as for [`super::few_rows16`] (one token).
//!
//! Not for: small batches (AVX2 has `few::few256`). Kept apart from `few_rows16`, not
//! folded: its sums are `vpmaddubsw` pairs added in i16, not `vpdpbusd`, and it has no masked
//! stores; what is the same (the pack, `step_rows`, the wrappers) is shared.

use super::few_rows16::{pack_bytes, pack_q4_0, TOKEN_BLOCK};
use super::step_rows;
use crate::formats::{q4_0, FewKernels};
use core::arch::x86_64::*;
use prima_abi::GgmlType;

/// Rows one step computes: one per i32 lane of a 256-bit vector.
pub(super) const ROWS: usize = 8;

/// The decode kernels of weight type `t` at this level, if it has them.
pub(in crate::formats) fn decode_kernels(t: GgmlType) -> Option<FewKernels> {
    let dot = match t {
        GgmlType::Q4_0 => dot_q4_0,
        _ => return None,
    };
    Some(FewKernels {
        max_tokens: 1,
        pack_bytes,
        pack: pack_q4_0,
        dot,
        token_major: true,
    })
}

decode_wrappers! {
    32;
    dot_q4_0 => rows_q4_0, q4_0::BLOCK_BYTES;
}

/// The 16 bytes at `off` of rows `k` and `4 + k` as the two 128-bit lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn lanes(row: &[*const u8; ROWS], k: usize, off: usize) -> __m256i {
    let at = |r: usize| row[r].add(off) as *const __m128i;
    _mm256_loadu2_m128i(at(4 + k), at(k))
}

/// Dwords `0 ..= 3` of the 16 bytes at `off` of each row: lane `r` of vector `j` is row
/// `r`'s dword `j` (a 4 × 4 transpose in each 128-bit lane of [`lanes`]).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn dwords4(row: &[*const u8; ROWS], off: usize) -> [__m256i; 4] {
    let z = [
        lanes(row, 0, off),
        lanes(row, 1, off),
        lanes(row, 2, off),
        lanes(row, 3, off),
    ];
    let (a, b) = (
        _mm256_unpacklo_epi32(z[0], z[1]),
        _mm256_unpackhi_epi32(z[0], z[1]),
    );
    let (c, d) = (
        _mm256_unpacklo_epi32(z[2], z[3]),
        _mm256_unpackhi_epi32(z[2], z[3]),
    );
    [
        _mm256_unpacklo_epi64(a, c),
        _mm256_unpackhi_epi64(a, c),
        _mm256_unpacklo_epi64(b, d),
        _mm256_unpackhi_epi64(b, d),
    ]
}

/// The f16 at `off` of each row as f32s: lane `r` is row `r`'s.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn f16_rows(row: &[*const u8; ROWS], off: usize) -> __m256 {
    // Assembled in general registers: eight 16-bit loads cost less than the 128-bit
    // loads and shuffles of a transpose for two bytes a row.
    let at = |r: usize| (row[r].add(off) as *const u16).read_unaligned() as i64;
    let lo = at(0) | at(1) << 16 | at(2) << 32 | at(3) << 48;
    let hi = at(4) | at(5) << 16 | at(6) << 32 | at(7) << 48;
    _mm256_cvtph_ps(_mm_set_epi64x(hi, lo))
}

/// Writes the step's sums (lane `k`: row `first + k`) into `out`, the rows below its
/// length only.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn store(acc: __m256, first: usize, out: &mut [f32]) {
    let valid = ROWS.min(out.len() - first);
    if valid == ROWS {
        _mm256_storeu_ps(out.as_mut_ptr().add(first), acc);
    } else {
        let mut lanes = [0f32; ROWS];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        out[first..first + valid].copy_from_slice(&lanes[..valid]);
    }
}

/// Prefetches the cache lines of `p .. p + bytes` into L1.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn prefetch(p: *const u8, bytes: usize) {
    for off in (0..bytes).step_by(64) {
        // Wrapping: the address may lie past the mapping; a prefetch never faults.
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off) as *const i8);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_q4_0(n: usize, w: &[u8], ws: usize, pack: &[u8], out: &mut [f32]) {
    let (nb, wb) = (n / 32, q4_0::BLOCK_BYTES);
    let rows = out.len();
    let low = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    for first in (0..rows).step_by(ROWS) {
        let row = step_rows::<ROWS>(w, ws, first, rows);
        let mut acc = _mm256_setzero_ps();
        // The next step's rows (contiguous when `ws` is the row's bytes), a block's share
        // of them each block: eight rows read a few bytes at a time each are eight
        // streams, more than the hardware prefetcher follows.
        let next = w.as_ptr().wrapping_add((first + ROWS) * ws);
        for i in 0..nb {
            prefetch(next.wrapping_add(i * ROWS * wb), ROWS * wb);
            let off = i * wb;
            // Byte `b` of quant dword `j` holds element `4j + b` (low nibble) and
            // `16 + 4j + b` (high nibble): activation dwords `j` and `4 + j`.
            let q = dwords4(&row, off + 2);
            let blk = pack.as_ptr().add(i * TOKEN_BLOCK);
            let a = blk as *const i32;
            let group = |j: usize| _mm256_set1_epi32(a.add(j).read_unaligned());
            let mut p = _mm256_setzero_si256();
            for (j, &qj) in q.iter().enumerate() {
                let lo = _mm256_and_si256(qj, low);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(qj), low);
                p = _mm256_add_epi16(p, _mm256_maddubs_epi16(lo, group(j)));
                p = _mm256_add_epi16(p, _mm256_maddubs_epi16(hi, group(4 + j)));
            }
            let start = (blk.add(36) as *const i32).read_unaligned();
            let s = _mm256_add_epi32(_mm256_madd_epi16(p, ones), _mm256_set1_epi32(start));
            let d = f16_rows(&row, off);
            let da = _mm256_set1_ps((blk.add(32) as *const f32).read_unaligned());
            // `s · d · d_a`, as the scalar Q4_0 kernel.
            let term = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s), d), da);
            acc = _mm256_add_ps(acc, term);
        }
        store(acc, first, out);
    }
}

//! MXFP4 `vec_dot` at AVX2 and AVX-512: IQ4_NL's kernels (`x86::iq4`) with MXFP4's table
//! and scale. The 4-bit codes become their doubled E2M1 values by one `vpshufb` through
//! [`mxfp4::KVALUES`] (16 bytes: one 128-bit lane holds the table), then are dotted as
//! signed bytes against the Q8_0 activations. The values lie in −12..=12, so the
//! `|x| · sign(y, x)` byte dots are exact and `maddubs` pairs stay far below 2^15. The
//! AVX-512 level keeps 256-bit vectors and fuses the byte dot's sums with VNNI.
//!
//! The block scale is `2^(e − 128)` ([`mxfp4::e8m0_half`]); four blocks' scales are built
//! in vector lanes from their exponent bytes, the same f32s as the scalar function's.
//!
//! Prompts take the row panels (`panel::panel_iq4`, as Q8_0's); small batches (2 ..= 8
//! tokens) call `vec_dot` per row and token: there are no MXFP4 small-batch kernels yet.
//! Same numerics contract as `formats::x86`: integer
//! sums exact, float terms the scalar kernel's operations in its order.

use crate::formats::x86::lanes256::{
    blocks, dot_i8_i8, f16_at, f16_x4, load, nibbles32, prefetch_ahead, sum_blocks,
};
use crate::formats::{mxfp4, q8_0};
use core::arch::x86_64::*;

/// MXFP4 `vec_dot` at the AVX2 level.
pub(in crate::formats::x86) fn vec_dot_avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: only reachable through `levels::avx2`'s table, which `dispatch` hands out
    // after detecting avx2, fma and f16c (AVX-512 tables include it).
    unsafe { dot_avx2(n, w, a) }
}

/// MXFP4 `vec_dot` at the AVX-512 level.
pub(in crate::formats::x86) fn vec_dot_avx512(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: only reachable through `levels::avx512`'s table, which `dispatch` hands out
    // after detecting avx2, fma, f16c, avx512f, avx512bw, avx512vl and avx512vnni.
    unsafe { dot_avx512(n, w, a) }
}

/// The table in both 128-bit lanes, for `vpshufb`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn table256() -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(mxfp4::KVALUES.as_ptr() as *const __m128i))
}

/// The 32 table values of the 16 code bytes at `p`, in element order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn values32(table: __m256i, p: *const u8) -> __m256i {
    _mm256_shuffle_epi8(table, nibbles32(p))
}

/// [`mxfp4::e8m0_half`] of the exponent bytes at the start of four blocks `stride` bytes
/// apart, as f32 lanes: `2^(e − 127)` as the f32 whose exponent field is `e`, halved. The
/// halving is exact (`e` = 1 gives the subnormal 2^-127); the two ends are clamped into
/// place: `e` = 0 reads as 0 (wanted: 2^-128, below every other result, so a `max`) and
/// `e` = 255 as infinity (wanted: 2^127, above every other result, so a `min`). Building
/// the bits instead (a shift, a variable shift and a blend) left the AVX2 dot ~1.4× IQ4_NL's
/// time on the 8192×2048 matvec bench; this is within ~10% of it.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn e8m0_half_x4(p: *const u8, stride: usize) -> __m128 {
    // Assembled in a general register, as `f16_x4` does.
    let at = |k: usize| *p.add(k * stride) as u32;
    let x = at(0) | at(1) << 8 | at(2) << 16 | at(3) << 24;
    let e = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(x as i32));
    let pow = _mm_castsi128_ps(_mm_slli_epi32(e, 23));
    let half = _mm_mul_ps(pow, _mm_set1_ps(0.5));
    let lowest = _mm_set1_ps(f32::from_bits(0x0020_0000)); // 2^-128
    let highest = _mm_set1_ps(f32::from_bits(254 << 23)); // 2^127
    _mm_min_ps(_mm_max_ps(half, lowest), highest)
}

/// `isum · (e8m0_half(e) · d_a)` of blocks `i..i + 4` (the block pointers `w`, `a`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn terms4(w: *const u8, a: *const u8, s: __m128) -> __m128 {
    let (wb, ab) = (mxfp4::BLOCK_BYTES, q8_0::BLOCK_BYTES);
    _mm_mul_ps(s, _mm_mul_ps(e8m0_half_x4(w, wb), f16_x4(a, ab)))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wb, ab) = (mxfp4::BLOCK_BYTES, q8_0::BLOCK_BYTES);
    let nb = blocks(n, 32, w, wb, a, ab);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    let table = table256();
    sum_blocks(
        nb,
        |i| {
            prefetch_ahead(w.add(i * wb), wb);
            dot_i8_i8(values32(table, w.add(i * wb + 1)), load(a.add(i * ab + 2)))
        },
        |i, s| s as f32 * (mxfp4::e8m0_half(*w.add(i * wb)) * f16_at(a.add(i * ab))),
        |i, s| terms4(w.add(i * wb), a.add(i * ab), s),
    )
}

/// AVX2's walk, one block per step, with each block's byte dot and its widening sum fused
/// in one 256-bit `vpdpbusd` (AVX-512 VL + VNNI). Two blocks per 512-bit step, as IQ4_NL's
/// AVX-512 kernel takes them, measured ~20% slower than AVX2's kernel on the matvec bench
/// here; this is ~10% faster than it.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_avx512(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wb, ab) = (mxfp4::BLOCK_BYTES, q8_0::BLOCK_BYTES);
    let nb = blocks(n, 32, w, wb, a, ab);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    let table = table256();
    sum_blocks(
        nb,
        |i| {
            prefetch_ahead(w.add(i * wb), wb);
            let q = values32(table, w.add(i * wb + 1));
            let y = load(a.add(i * ab + 2));
            // |q| · sign(y, q), exact: |q| ≤ 12, y ≠ −128.
            let (u, s) = (_mm256_sign_epi8(q, q), _mm256_sign_epi8(y, q));
            _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
        },
        |i, s| s as f32 * (mxfp4::e8m0_half(*w.add(i * wb)) * f16_at(a.add(i * ab))),
        |i, s| terms4(w.add(i * wb), a.add(i * ab), s),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_half_x4_matches_scalar_for_every_byte() {
        if !crate::formats::dispatch::KernelLevel::Avx2.is_available() {
            return;
        }
        // Four blocks' worth of bytes, exponents at 0, 17, 34, 51.
        let mut blocks = [0u8; 4 * mxfp4::BLOCK_BYTES];
        for e in 0..=255u8 {
            for (k, b) in blocks.chunks_exact_mut(mxfp4::BLOCK_BYTES).enumerate() {
                b[0] = e.wrapping_add(k as u8 * 64);
            }
            let mut got = [0f32; 4];
            // SAFETY: AVX2, FMA and F16C were detected above; the four blocks are in bounds.
            unsafe {
                _mm_storeu_ps(
                    got.as_mut_ptr(),
                    e8m0_half_x4(blocks.as_ptr(), mxfp4::BLOCK_BYTES),
                )
            };
            for (k, g) in got.iter().enumerate() {
                let want = mxfp4::e8m0_half(blocks[k * mxfp4::BLOCK_BYTES]);
                assert_eq!(g.to_bits(), want.to_bits(), "e = {}", blocks[k * 17]);
            }
        }
    }
}

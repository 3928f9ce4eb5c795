//! AVX2 + FMA + F16C activation quantizers: a row of f32 activations to the F16, Q8_0,
//! Q8_1 or Q8_K bytes the scalar quantizers write (round half away from zero, the same
//! scale and sums), which the block-quant kernels of both levels read.
//!
//! Not for: dot kernels; weights are never quantized here.

use crate::formats::k_quants::{q8_k, QK_K};
use crate::formats::x86::lanes256::hsum;
use crate::formats::{put_f16, q8_0, q8_1};
use core::arch::x86_64::*;

table_wrappers! {
    quantize quantize_row_q8_0 => quantize_q8_0;
    quantize quantize_row_q8_1 => quantize_q8_1;
    quantize quantize_row_q8_k => quantize_q8_k;
    quantize quantize_row_f16 => quantize_f16;
}

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

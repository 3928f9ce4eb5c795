//! Attention's products for the query heads of one grouped-query (KV) head at once
//! ([`AttentionF16`]): each key or value row is loaded and widened once for all of them,
//! the queries once per call, and nothing goes through a call per row.
//!
//! Same bits as the one-row kernels: a score is the 16-lane F16 dot (element `i` in lane
//! `i % 16`, folded by halving, then the tail in order; F16 × F16 products are exact in
//! f32, so a fused multiply-add rounds like the scalar multiply-then-add), and a weighted
//! value sum adds `w · v` to each element row after row, a multiply then an add as
//! `axpy_f16` does (the weight need not be an F16 value). [`axpy_f16`], that one-row
//! weighted sum with F16C, is here too: `dispatch` hands it out at both levels.
//!
//! Not for: weight matmuls (`vec_dot`, `rows`, `panel`, `few`).

use crate::formats::x86::lanes256::{f16_at, f32_at, reduce16};
use crate::formats::{float, AttentionF16};
use core::arch::x86_64::*;

/// The AVX2 products.
pub const AVX2: AttentionF16 = AttentionF16 {
    dots: dots_avx2,
    axpys: axpys_avx2,
};

/// The AVX-512 products.
pub const AVX512: AttentionF16 = AttentionF16 {
    dots: dots_avx512,
    axpys: axpys_avx512,
};

/// Longest query row widened on the stack; longer rows take the one-row kernels.
const MAX_N: usize = 512;
/// Query heads per pass of the dots (their accumulators and widened queries).
const HEADS: usize = 4;

/// Checks the buffers every kernel reads and writes, as the one-row kernels' slicing would.
fn check(n: usize, rows: &[u8], stride: usize, n_rows: usize, other: usize, out: usize) {
    if n_rows > 0 {
        assert!(
            stride >= 2 * n && rows.len() >= (n_rows - 1) * stride + 2 * n,
            "attention: short key or value rows"
        );
    }
    assert!(other <= out, "attention: short buffers");
}

fn dots_avx2(
    n: usize,
    keys: &[u8],
    stride: usize,
    n_keys: usize,
    q: &[u8],
    n_q: usize,
    out: &mut [f32],
) {
    check(n, keys, stride, n_keys, n_q * n_keys, out.len());
    assert!(q.len() >= 2 * n * n_q, "attention: short queries");
    if n > MAX_N {
        return float::dots_f16(n, keys, stride, n_keys, q, n_q, out);
    }
    for h0 in (0..n_q).step_by(HEADS) {
        let (q, out) = (&q[2 * n * h0..], &mut out[h0 * n_keys..]);
        // SAFETY: reached only through `dispatch` (AVX2, FMA, F16C detected); `check` and
        // the asserts above cover every row read and every result written.
        unsafe {
            match n_q - h0 {
                1 => dots256::<1>(n, keys, stride, n_keys, q, out),
                2 => dots256::<2>(n, keys, stride, n_keys, q, out),
                3 => dots256::<3>(n, keys, stride, n_keys, q, out),
                _ => dots256::<HEADS>(n, keys, stride, n_keys, q, out),
            }
        }
    }
}

/// `H` queries' scores against every key: both 8-lane halves of a 16-element chunk per
/// head, the key's chunk widened once for all heads.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // h indexes the accumulators and the queries
unsafe fn dots256<const H: usize>(
    n: usize,
    keys: &[u8],
    stride: usize,
    n_keys: usize,
    q: &[u8],
    out: &mut [f32],
) {
    let full = n / 16 * 16;
    let mut qw = [0f32; HEADS * MAX_N];
    for (x, b) in qw[..H * n].iter_mut().zip(q.chunks_exact(2)) {
        *x = f16_at(b.as_ptr());
    }
    let qp = qw.as_ptr();
    for j in 0..n_keys {
        let k = keys.as_ptr().add(j * stride);
        let mut acc = [[_mm256_setzero_ps(); 2]; H];
        for c in (0..full).step_by(16) {
            let lo = _mm256_cvtph_ps(_mm_loadu_si128(k.add(2 * c) as *const __m128i));
            let hi = _mm256_cvtph_ps(_mm_loadu_si128(k.add(2 * c + 16) as *const __m128i));
            for h in 0..H {
                let x = qp.add(h * n + c);
                acc[h][0] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x), acc[h][0]);
                acc[h][1] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x.add(8)), acc[h][1]);
            }
        }
        for h in 0..H {
            let mut sum = reduce16(acc[h][0], acc[h][1]);
            for i in full..n {
                sum += f16_at(k.add(2 * i)) * *qp.add(h * n + i);
            }
            out[h * n_keys + j] = sum;
        }
    }
}

fn dots_avx512(
    n: usize,
    keys: &[u8],
    stride: usize,
    n_keys: usize,
    q: &[u8],
    n_q: usize,
    out: &mut [f32],
) {
    check(n, keys, stride, n_keys, n_q * n_keys, out.len());
    assert!(q.len() >= 2 * n * n_q, "attention: short queries");
    if n > MAX_N {
        return float::dots_f16(n, keys, stride, n_keys, q, n_q, out);
    }
    for h0 in (0..n_q).step_by(HEADS) {
        let (q, out) = (&q[2 * n * h0..], &mut out[h0 * n_keys..]);
        // SAFETY: reached only through `dispatch` (AVX-512 F/BW/VL detected); `check` and
        // the asserts above cover every row read and every result written.
        unsafe {
            match n_q - h0 {
                1 => dots512::<1>(n, keys, stride, n_keys, q, out),
                2 => dots512::<2>(n, keys, stride, n_keys, q, out),
                3 => dots512::<3>(n, keys, stride, n_keys, q, out),
                _ => dots512::<HEADS>(n, keys, stride, n_keys, q, out),
            }
        }
    }
}

/// [`dots256`] with one 16-lane accumulator per head.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
#[allow(clippy::needless_range_loop)] // h indexes the accumulators and the queries
unsafe fn dots512<const H: usize>(
    n: usize,
    keys: &[u8],
    stride: usize,
    n_keys: usize,
    q: &[u8],
    out: &mut [f32],
) {
    let full = n / 16 * 16;
    let mut qw = [0f32; HEADS * MAX_N];
    for (x, b) in qw[..H * n].iter_mut().zip(q.chunks_exact(2)) {
        *x = f16_at(b.as_ptr());
    }
    let qp = qw.as_ptr();
    for j in 0..n_keys {
        let k = keys.as_ptr().add(j * stride);
        let mut acc = [_mm512_setzero_ps(); H];
        for c in (0..full).step_by(16) {
            let kv = _mm512_cvtph_ps(_mm256_loadu_si256(k.add(2 * c) as *const __m256i));
            for h in 0..H {
                acc[h] = _mm512_fmadd_ps(kv, _mm512_loadu_ps(qp.add(h * n + c)), acc[h]);
            }
        }
        for h in 0..H {
            let v = acc[h];
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
            let mut sum = reduce16(_mm512_castps512_ps256(v), hi);
            for i in full..n {
                sum += f16_at(k.add(2 * i)) * *qp.add(h * n + i);
            }
            out[h * n_keys + j] = sum;
        }
    }
}

/// Columns per pass of the weighted sums: a block of each head's accumulators stays in
/// registers while every value row goes by.
const AXPY_COLS: usize = 32;

fn axpys_avx2(
    n: usize,
    values: &[u8],
    stride: usize,
    n_rows: usize,
    w: &[f32],
    n_q: usize,
    acc: &mut [f32],
) {
    check(n, values, stride, n_rows, n_q * n, acc.len());
    assert!(w.len() >= n_q * n_rows, "attention: short weights");
    // Two heads at a time: eight accumulators, four value vectors and a weight.
    for h0 in (0..n_q).step_by(2) {
        let (w, acc) = (&w[h0 * n_rows..], &mut acc[h0 * n..]);
        // SAFETY: reached only through `dispatch` (AVX2, FMA, F16C detected); `check` and
        // the assert above cover every row read and every element written.
        unsafe {
            match n_q - h0 {
                1 => axpys256::<1>(n, values, stride, n_rows, w, acc),
                _ => axpys256::<2>(n, values, stride, n_rows, w, acc),
            }
        }
    }
}

/// `H` heads' weighted sums, [`AXPY_COLS`] columns at a time, then the columns after the
/// last whole block one by one.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // h and c index the accumulators
unsafe fn axpys256<const H: usize>(
    n: usize,
    values: &[u8],
    stride: usize,
    n_rows: usize,
    w: &[f32],
    acc: &mut [f32],
) {
    let blocks = n / AXPY_COLS * AXPY_COLS;
    let (v0, w, a) = (values.as_ptr(), w.as_ptr(), acc.as_mut_ptr());
    for b in (0..blocks).step_by(AXPY_COLS) {
        let mut s = [[_mm256_setzero_ps(); AXPY_COLS / 8]; H];
        for h in 0..H {
            for c in 0..AXPY_COLS / 8 {
                s[h][c] = _mm256_loadu_ps(a.add(h * n + b + 8 * c));
            }
        }
        for j in 0..n_rows {
            let v = v0.add(j * stride + 2 * b);
            let x: [__m256; AXPY_COLS / 8] = core::array::from_fn(|c| {
                _mm256_cvtph_ps(_mm_loadu_si128(v.add(16 * c) as *const __m128i))
            });
            for h in 0..H {
                let wv = _mm256_set1_ps(*w.add(h * n_rows + j));
                for c in 0..AXPY_COLS / 8 {
                    s[h][c] = _mm256_add_ps(s[h][c], _mm256_mul_ps(wv, x[c]));
                }
            }
        }
        for h in 0..H {
            for c in 0..AXPY_COLS / 8 {
                _mm256_storeu_ps(a.add(h * n + b + 8 * c), s[h][c]);
            }
        }
    }
    axpys_tail::<H>(n, blocks, v0, stride, n_rows, w, a);
}

/// Columns `from ..` of [`axpys256`]/[`axpys512`], one element at a time.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpys_tail<const H: usize>(
    n: usize,
    from: usize,
    v0: *const u8,
    stride: usize,
    n_rows: usize,
    w: *const f32,
    a: *mut f32,
) {
    for h in 0..H {
        for i in from..n {
            let mut s = *a.add(h * n + i);
            for j in 0..n_rows {
                s += *w.add(h * n_rows + j) * f16_at(v0.add(j * stride + 2 * i));
            }
            *a.add(h * n + i) = s;
        }
    }
}

fn axpys_avx512(
    n: usize,
    values: &[u8],
    stride: usize,
    n_rows: usize,
    w: &[f32],
    n_q: usize,
    acc: &mut [f32],
) {
    check(n, values, stride, n_rows, n_q * n, acc.len());
    assert!(w.len() >= n_q * n_rows, "attention: short weights");
    // Up to four heads at a time: eight accumulators of two 16-lane vectors each.
    for h0 in (0..n_q).step_by(4) {
        let (w, acc) = (&w[h0 * n_rows..], &mut acc[h0 * n..]);
        // SAFETY: reached only through `dispatch` (AVX-512 F/BW/VL detected); `check` and
        // the assert above cover every row read and every element written.
        unsafe {
            match n_q - h0 {
                1 => axpys512::<1>(n, values, stride, n_rows, w, acc),
                2 => axpys512::<2>(n, values, stride, n_rows, w, acc),
                3 => axpys512::<3>(n, values, stride, n_rows, w, acc),
                _ => axpys512::<4>(n, values, stride, n_rows, w, acc),
            }
        }
    }
}

/// [`axpys256`] with 16-lane vectors.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
#[allow(clippy::needless_range_loop)] // h and c index the accumulators
unsafe fn axpys512<const H: usize>(
    n: usize,
    values: &[u8],
    stride: usize,
    n_rows: usize,
    w: &[f32],
    acc: &mut [f32],
) {
    let blocks = n / AXPY_COLS * AXPY_COLS;
    let (v0, w, a) = (values.as_ptr(), w.as_ptr(), acc.as_mut_ptr());
    for b in (0..blocks).step_by(AXPY_COLS) {
        let mut s = [[_mm512_setzero_ps(); AXPY_COLS / 16]; H];
        for h in 0..H {
            for c in 0..AXPY_COLS / 16 {
                s[h][c] = _mm512_loadu_ps(a.add(h * n + b + 16 * c));
            }
        }
        for j in 0..n_rows {
            let v = v0.add(j * stride + 2 * b);
            let x: [__m512; AXPY_COLS / 16] = core::array::from_fn(|c| {
                _mm512_cvtph_ps(_mm256_loadu_si256(v.add(32 * c) as *const __m256i))
            });
            for h in 0..H {
                let wv = _mm512_set1_ps(f32_at(w.add(h * n_rows + j) as *const u8));
                for c in 0..AXPY_COLS / 16 {
                    s[h][c] = _mm512_add_ps(s[h][c], _mm512_mul_ps(wv, x[c]));
                }
            }
        }
        for h in 0..H {
            for c in 0..AXPY_COLS / 16 {
                _mm512_storeu_ps(a.add(h * n + b + 16 * c), s[h][c]);
            }
        }
    }
    axpys_tail::<H>(n, blocks, v0, stride, n_rows, w, a);
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

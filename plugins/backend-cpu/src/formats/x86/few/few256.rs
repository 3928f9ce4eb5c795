//! AVX2 small-batch kernels (see [`crate::formats::FewKernels`] and the pack in
//! [`super`]): weight rows against 2 ..= 8 tokens, as the AVX-512 ones
//! (`super::few512`) but a block per 256-bit vector and `vpmaddubsw` + `vpmaddwd` for the
//! byte dots.
//!
//! Each weight block is unpacked once for all the tokens (signed formats as `|w|`, whose
//! sign moves onto each token's activations, as the one-token kernels do); each block's
//! eight partial sums of four lanes are reduced by one `vphaddd` tree, two blocks at a
//! time, and the pair's float terms are the shared lane-wise ones. Block sums are exact in
//! integers and each lane adds its terms in block order from 0.0, so every result equals
//! the scalar `vec_dot` bit for bit.
//!
//! Not for: AVX-512 CPUs (`few512`, `rows::few_rows16`). Kept apart from `few512`, not
//! folded: its byte dots are `vpmaddubsw` + `vpmaddwd` with a `vphaddd` tree per block pair,
//! where `few512` takes `vpdpbusd` on two blocks per vector, so the loops differ beyond width.

use super::{
    layout, pack_q8_0, pack_q8_1, terms4, weight_scales, MAX_TOKENS, MIN, PAIR_QUANTS, SDD, SPROD,
};
use crate::formats::x86::lanes256::{bits32, load, nibbles32, prefetch_ahead};
use crate::formats::{q4_0, q4_1, q5_0, q5_1, q8_0, FewKernels};
use core::arch::x86_64::*;
use prima_abi::GgmlType;

/// The small-batch kernels of weight type `t` at this level, if it has them.
pub(in crate::formats) fn kernels(t: GgmlType) -> Option<FewKernels> {
    use GgmlType as T;
    let few = |pack, dot| FewKernels {
        max_tokens: MAX_TOKENS,
        pack_bytes: super::pack_bytes,
        pack,
        dot,
        token_major: false,
    };
    Some(match t {
        T::Q4_0 => few(pack_q8_0, dot_q4_0),
        T::Q5_0 => few(pack_q8_0, dot_q5_0),
        T::Q8_0 => few(pack_q8_0, dot_q8_0),
        T::Q4_1 => few(pack_q8_1, dot_q4_1),
        T::Q5_1 => few(pack_q8_1, dot_q5_1),
        _ => return None,
    })
}

few_dot_wrappers! {
    dot_q4_0 => rows_q4_0, q4_0::BLOCK_BYTES;
    dot_q5_0 => rows_q5_0, q5_0::BLOCK_BYTES;
    dot_q8_0 => rows_q8_0, q8_0::BLOCK_BYTES;
    dot_q4_1 => rows_q4_1, q4_1::BLOCK_BYTES;
    dot_q5_1 => rows_q5_1, q5_1::BLOCK_BYTES;
}

/// One weight block's quants as the byte dots take them: `(u, s)` with `u` unsigned and
/// `s` the vector whose signs go onto the activations (`SIGNED`), or unused.
type Quants = (__m256i, __m256i);

/// `Σ w·a` of one weight block against 32 activation quants at `a`, as 8 i32s.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_block<const SIGNED: bool>(a: *const u8, (u, s): Quants) -> __m256i {
    let a = load(a);
    let a = if SIGNED { _mm256_sign_epi8(a, s) } else { a };
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1))
}

/// The sums of four vectors of 8 i32s (zero beyond `used`), in lanes `[0..4 | 4..8]` as
/// `[Σ z lo halves | Σ z hi halves]`; the two halves added give the four sums.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn hsum4_halves(used: usize, mut dot: impl FnMut(usize) -> __m256i) -> __m256i {
    let mut z = [_mm256_setzero_si256(); 4];
    for (k, z) in z.iter_mut().enumerate().take(used) {
        *z = dot(k);
    }
    _mm256_hadd_epi32(_mm256_hadd_epi32(z[0], z[1]), _mm256_hadd_epi32(z[2], z[3]))
}

/// `[block 0's four sums | block 1's four sums]` from their [`hsum4_halves`].
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn join_halves(h0: __m256i, h1: __m256i) -> __m256i {
    _mm256_add_epi32(
        _mm256_permute2x128_si256(h0, h1, 0x20),
        _mm256_permute2x128_si256(h0, h1, 0x31),
    )
}

/// What a step needs besides its rows (see `few512::Rows`).
struct Rows<'a, F> {
    nb: usize,
    ws: usize,
    wb: usize,
    q: *const u8,
    sc: *const f32,
    /// `quants(b)` unpacks the weight block at `b`.
    quants: &'a F,
}

/// `R` rows × `N` tokens, `R · N ≤ 4`, in four lanes (lane `k`: row `k / N`, token
/// `k % N`); writes `out[0 .. R·N]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn step4<const N: usize, const R: usize, const SIGNED: bool, const T: u8, F>(
    g: &Rows<'_, F>,
    w: *const u8,
    out: &mut [f32],
) where
    F: Fn(*const u8) -> Quants,
{
    let zero = (_mm256_setzero_si256(), _mm256_setzero_si256());
    let mut acc = _mm_setzero_ps();
    for p in 0..g.nb.div_ceil(2) {
        let (b, two) = (w.add(2 * p * g.wb), 2 * p + 1 < g.nb);
        let q = g.q.add(p * N * PAIR_QUANTS);
        let mut halves = [_mm256_setzero_si256(); 2];
        for (h, halves) in halves.iter_mut().enumerate().take(1 + two as usize) {
            let mut wq = [zero; R];
            for (j, wq) in wq.iter_mut().enumerate() {
                let bj = b.add(j * g.ws + h * g.wb);
                prefetch_ahead(bj, g.wb);
                *wq = (g.quants)(bj);
            }
            *halves = hsum4_halves(R * N, |k| {
                dot_block::<SIGNED>(q.add(k % N * PAIR_QUANTS + 32 * h), wq[k / N])
            });
        }
        let s = join_halves(halves[0], halves[1]);
        let dm = weight_scales(b, g.ws, g.wb, two, R > 1);
        let t = terms4::<T>(_mm256_cvtepi32_ps(s), dm, g.sc.add(p * 16), N, R);
        acc = _mm_add_ps(acc, _mm256_castps256_ps128(t));
        if two {
            acc = _mm_add_ps(acc, _mm256_extractf128_ps(t, 1));
        }
    }
    let mut res = [0.0f32; 4];
    _mm_storeu_ps(res.as_mut_ptr(), acc);
    out[..R * N].copy_from_slice(&res[..R * N]);
}

/// The float terms of block `h` of a pair for eight token lanes: `s` the block's sums,
/// `dm` the weight scales ([`weight_scales`]), `sc` the pair's packed activation scales.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn terms8<const T: u8>(s: __m256, dm: __m256, sc: *const f32, h: usize) -> __m256 {
    let dw = _mm256_permutevar8x32_ps(dm, _mm256_set1_epi32(2 * h as i32));
    let da = _mm256_loadu_ps(sc.add(8 * h));
    match T {
        SDD => _mm256_mul_ps(_mm256_mul_ps(s, dw), da),
        SPROD => _mm256_mul_ps(s, _mm256_mul_ps(dw, da)),
        _ => {
            let mw = _mm256_permutevar8x32_ps(dm, _mm256_set1_epi32(2 * h as i32 + 1));
            let sa = _mm256_loadu_ps(sc.add(16 + 8 * h));
            _mm256_add_ps(
                _mm256_mul_ps(_mm256_mul_ps(dw, da), s),
                _mm256_mul_ps(mw, sa),
            )
        }
    }
}

/// One row × `N` tokens, `4 < N ≤ 8`, in eight lanes (lane `k`: token `k`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn step8<const N: usize, const SIGNED: bool, const T: u8, F>(
    g: &Rows<'_, F>,
    w: *const u8,
    out: &mut [f32],
) where
    F: Fn(*const u8) -> Quants,
{
    let mut acc = _mm256_setzero_ps();
    for p in 0..g.nb.div_ceil(2) {
        let (b, two) = (w.add(2 * p * g.wb), 2 * p + 1 < g.nb);
        let q = g.q.add(p * N * PAIR_QUANTS);
        let dm = weight_scales(b, g.ws, g.wb, two, false);
        for h in 0..1 + two as usize {
            let bh = b.add(h * g.wb);
            prefetch_ahead(bh, g.wb);
            let wq = (g.quants)(bh);
            let dot = |t: usize| dot_block::<SIGNED>(q.add(t * PAIR_QUANTS + 32 * h), wq);
            let lo = hsum4_halves(4, dot);
            let hi = hsum4_halves(N - 4, |k| dot(4 + k));
            let s = join_halves(lo, hi);
            // `s` is [tokens 0..4 lo+hi | tokens 4..8 lo+hi]: the block's eight sums.
            let t = terms8::<T>(_mm256_cvtepi32_ps(s), dm, g.sc.add(p * 32), h);
            acc = _mm256_add_ps(acc, t);
        }
    }
    let mut res = [0.0f32; 8];
    _mm256_storeu_ps(res.as_mut_ptr(), acc);
    out[..N].copy_from_slice(&res[..N]);
}

/// Every row of `out` (`rows × N`, row-major) against the `N` tokens of `pack`: with
/// `pair_rows`, two rows a step for one or two tokens (so the four lanes are full), else
/// one.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_n<const N: usize, const SIGNED: bool, const T: u8>(
    n: usize,
    w: &[u8],
    ws: usize,
    wb: usize,
    pack: &[u8],
    out: &mut [f32],
    pair_rows: bool,
    quants: impl Fn(*const u8) -> Quants,
) {
    let (_, scale_off) = layout(n, N);
    let g = Rows {
        nb: n / 32,
        ws,
        wb,
        q: pack.as_ptr(),
        sc: pack.as_ptr().add(scale_off) as *const f32,
        quants: &quants,
    };
    let rows = out.len() / N;
    let w = w.as_ptr();
    let mut r = 0;
    if N <= 2 && pair_rows {
        while r + 2 <= rows {
            step4::<N, 2, SIGNED, T, _>(&g, w.add(r * ws), &mut out[r * N..]);
            r += 2;
        }
    }
    while r < rows {
        if N <= 4 {
            step4::<N, 1, SIGNED, T, _>(&g, w.add(r * ws), &mut out[r * N..]);
        } else {
            step8::<N, SIGNED, T, _>(&g, w.add(r * ws), &mut out[r * N..]);
        }
        r += 1;
    }
}

/// Dispatches `n_tokens` to the [`rows_n`] of that many tokens.
macro_rules! by_tokens {
    ($n_tokens:expr, $signed:expr, $terms:expr, ($($arg:expr),*)) => {
        match $n_tokens {
            1 => rows_n::<1, $signed, $terms>($($arg),*),
            2 => rows_n::<2, $signed, $terms>($($arg),*),
            3 => rows_n::<3, $signed, $terms>($($arg),*),
            4 => rows_n::<4, $signed, $terms>($($arg),*),
            5 => rows_n::<5, $signed, $terms>($($arg),*),
            6 => rows_n::<6, $signed, $terms>($($arg),*),
            7 => rows_n::<7, $signed, $terms>($($arg),*),
            _ => rows_n::<8, $signed, $terms>($($arg),*),
        }
    };
}

/// Signed weight quants `q` (never −128) as `(|q|, q)`: `|q| · sign(a, q)` is `q · a`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn signed(q: __m256i) -> Quants {
    (_mm256_sign_epi8(q, q), q)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_q4_0(n: usize, w: &[u8], ws: usize, pack: &[u8], nt: usize, out: &mut [f32]) {
    let wb = q4_0::BLOCK_BYTES;
    let quants = |b: *const u8| signed(_mm256_sub_epi8(nibbles32(b.add(2)), _mm256_set1_epi8(8)));
    by_tokens!(nt, true, SDD, (n, w, ws, wb, pack, out, true, quants))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_q5_0(n: usize, w: &[u8], ws: usize, pack: &[u8], nt: usize, out: &mut [f32]) {
    let wb = q5_0::BLOCK_BYTES;
    // A clear 5th bit means q − 16: OR-ing 0xF0 into the nibble is that in i8.
    let quants = |b: *const u8| {
        let high = _mm256_andnot_si256(bits32(b.add(2)), _mm256_set1_epi8(0xF0u8 as i8));
        signed(_mm256_or_si256(nibbles32(b.add(6)), high))
    };
    by_tokens!(nt, true, SDD, (n, w, ws, wb, pack, out, true, quants))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_q8_0(n: usize, w: &[u8], ws: usize, pack: &[u8], nt: usize, out: &mut [f32]) {
    let wb = q8_0::BLOCK_BYTES;
    // A weight of −128 has no positive |q| in i8: as u8 its 128 is the right magnitude,
    // and `sign` moves its (negative) sign onto the activation.
    let quants = |b: *const u8| signed(load(b.add(2)));
    // One row a step: two rows of Q8_0 (twice the bytes of the 4-bit formats) a step
    // measured slower on SmolLM2 Q8_0, two tokens: 121 against 182 tok/s at AVX-512, 122
    // against 178 at AVX2 (the 4- and 5-bit formats gain from two).
    by_tokens!(nt, true, SPROD, (n, w, ws, wb, pack, out, false, quants))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_q4_1(n: usize, w: &[u8], ws: usize, pack: &[u8], nt: usize, out: &mut [f32]) {
    let wb = q4_1::BLOCK_BYTES;
    let quants = |b: *const u8| (nibbles32(b.add(4)), _mm256_setzero_si256());
    by_tokens!(nt, false, MIN, (n, w, ws, wb, pack, out, true, quants))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_q5_1(n: usize, w: &[u8], ws: usize, pack: &[u8], nt: usize, out: &mut [f32]) {
    let wb = q5_1::BLOCK_BYTES;
    let quants = |b: *const u8| {
        let high = _mm256_and_si256(bits32(b.add(4)), _mm256_set1_epi8(0x10));
        (
            _mm256_or_si256(nibbles32(b.add(8)), high),
            _mm256_setzero_si256(),
        )
    };
    by_tokens!(nt, false, MIN, (n, w, ws, wb, pack, out, true, quants))
}

//! AVX-512 VNNI small-batch kernels (see [`crate::formats::FewKernels`] and the pack in
//! [`super`]): weight rows against 2 ..= 8 tokens, for continuous batching's decode
//! steps, where a batch holds one token per request and repacking weight panels costs
//! more than it saves.
//!
//! A weight row's pair of blocks is unpacked once into one 512-bit vector for all the
//! tokens; each token's dot with it is one `vpdpbusd` on its packed quants; the pair's
//! sums of four tokens (or of two rows × two tokens) are reduced together, and their
//! float terms computed in the lanes of one vector and added, block after block, to one
//! running sum per lane. Block sums are exact in integers; each lane adds its terms in
//! block order from 0.0, as the scalar loop does, so every result equals the scalar
//! `vec_dot` bit for bit, whatever the batch.
//!
//! Q4_1, Q8_0 and IQ4_NL take [`crate::formats::x86::rows::few_rows16`]'s kernels instead
//! (16 rows a step, no reductions; `levels` makes that choice).
//!
//! Signed formats (Q4_0, Q5_0) are packed with their activations biased to unsigned
//! (`a + 128`, as `vpdpbusd` takes them), and each weight pair's accumulators start at
//! `−128 · Σw`, which takes the bias back exactly.
//!
//! Not for: AVX2-only CPUs (`few256`), or Q4_1, Q8_0 and IQ4_NL (`rows::few_rows16`).

use super::{
    layout, pack_q8_0_biased, pack_q8_1, terms4, weight_scales, MAX_TOKENS, MIN, PAIR_QUANTS, SDD,
    SPROD,
};
use crate::formats::x86::lanes256::{nibbles32, prefetch_ahead};
use crate::formats::x86::lanes512::nibbles32_pair;
use crate::formats::{q4_0, q5_0, q5_1, FewKernels};
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
        T::Q4_0 => few(pack_q8_0_biased, dot_q4_0),
        T::Q5_0 => few(pack_q8_0_biased, dot_q5_0),
        T::Q5_1 => few(pack_q8_1, dot_q5_1),
        _ => return None,
    })
}

few_dot_wrappers! {
    dot_q4_0 => rows_q4_0, q4_0::BLOCK_BYTES;
    dot_q5_0 => rows_q5_0, q5_0::BLOCK_BYTES;
    dot_q5_1 => rows_q5_1, q5_1::BLOCK_BYTES;
}

/// The sums of the two 256-bit halves of four vectors of i32:
/// `[z0.lo, z1.lo, z2.lo, z3.lo, z0.hi, z1.hi, z2.hi, z3.hi]` (`lo`: lanes 0..8).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn reduce4(z: [__m512i; 4]) -> __m256i {
    let pair = |x: __m512i, y: __m512i| {
        _mm512_add_epi32(_mm512_unpacklo_epi32(x, y), _mm512_unpackhi_epi32(x, y))
    };
    let (t01, t23) = (pair(z[0], z[1]), pair(z[2], z[3]));
    // Each 128-bit lane L: [Σ z0_L, Σ z1_L, Σ z2_L, Σ z3_L].
    let u = _mm512_add_epi32(
        _mm512_unpacklo_epi64(t01, t23),
        _mm512_unpackhi_epi64(t01, t23),
    );
    // [L0, L2, L1, L3]: the low half's two lanes, then the high half's, added.
    let v = _mm512_shuffle_i64x2(u, u, 0b11_01_10_00);
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1))
}

/// The integer sums of a pair of blocks for the lanes `k` of a step: `dot(k)` gives lane
/// `k`'s (unreduced) `vpdpbusd` vector, for `k < used`. Returns `[block 2p: lanes 0..4 |
/// block 2p+1: lanes 0..4]`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn sums4(used: usize, mut dot: impl FnMut(usize) -> __m512i) -> __m256i {
    let mut z = [_mm512_setzero_si512(); 4];
    for (k, z) in z.iter_mut().enumerate().take(used) {
        *z = dot(k);
    }
    reduce4(z)
}

/// `vpdpbusd` of a weight operand against a token's packed pair quants at `a`: `SIGNED`,
/// the weights are signed and the packed activations biased; else the weights unsigned.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn dot_pair<const SIGNED: bool>(a: *const u8, (wq, start): (__m512i, __m512i)) -> __m512i {
    let a = _mm512_loadu_si512(a as *const _);
    if SIGNED {
        _mm512_dpbusd_epi32(start, a, wq)
    } else {
        _mm512_dpbusd_epi32(start, wq, a)
    }
}

/// As [`terms4`] for eight token lanes of one row: `s` is `[block 2p: 8 | block 2p+1: 8]`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn terms8<const T: u8>(s: __m512, dm: __m256, sc: *const f32) -> __m512 {
    let dm = _mm512_castps256_ps512(dm);
    let lo_hi = |a: i32, b: i32| _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b);
    let dw = _mm512_permutexvar_ps(lo_hi(0, 2), dm);
    let da = _mm512_loadu_ps(sc);
    match T {
        SDD => _mm512_mul_ps(_mm512_mul_ps(s, dw), da),
        SPROD => _mm512_mul_ps(s, _mm512_mul_ps(dw, da)),
        _ => {
            let mw = _mm512_permutexvar_ps(lo_hi(1, 3), dm);
            let sa = _mm512_loadu_ps(sc.add(16));
            _mm512_add_ps(
                _mm512_mul_ps(_mm512_mul_ps(dw, da), s),
                _mm512_mul_ps(mw, sa),
            )
        }
    }
}

/// What a step needs besides its rows: the row length, weight row and block strides, the
/// pack's quants and scales, and the format's weight unpacking.
struct Rows<'a, F> {
    nb: usize,
    ws: usize,
    wb: usize,
    q: *const u8,
    sc: *const f32,
    /// `quants(b, two)` unpacks the weight block at `b` (and the next, `wb` bytes on,
    /// when `two`) as `vpdpbusd`'s weight operand and the accumulator start.
    quants: &'a F,
}

/// `R` rows (`ws` bytes apart from `w`) × `N` tokens, `R · N ≤ 4`, in the four lanes of
/// one step: lane `k` is row `k / N`, token `k % N` (the pack repeats its tokens across
/// the lanes). Writes `out[0 .. R·N]`, which is `R` rows of `out`'s row-major layout.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn step4<const N: usize, const R: usize, const SIGNED: bool, const T: u8, F>(
    g: &Rows<'_, F>,
    w: *const u8,
    out: &mut [f32],
) where
    F: Fn(*const u8, bool) -> (__m512i, __m512i),
{
    let mut acc = _mm_setzero_ps();
    for p in 0..g.nb.div_ceil(2) {
        let (b, two) = (w.add(2 * p * g.wb), 2 * p + 1 < g.nb);
        let mut wq = [(_mm512_setzero_si512(), _mm512_setzero_si512()); R];
        for (j, wq) in wq.iter_mut().enumerate() {
            prefetch_ahead(b.add(j * g.ws), 2 * g.wb);
            *wq = (g.quants)(b.add(j * g.ws), two);
        }
        let q = g.q.add(p * N * PAIR_QUANTS);
        let s = sums4(R * N, |k| {
            dot_pair::<SIGNED>(q.add(k % N * PAIR_QUANTS), wq[k / N])
        });
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

/// One row × `N` tokens, `4 < N ≤ 8`, in eight lanes (lane `k`: token `k`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn step8<const N: usize, const SIGNED: bool, const T: u8, F>(
    g: &Rows<'_, F>,
    w: *const u8,
    out: &mut [f32],
) where
    F: Fn(*const u8, bool) -> (__m512i, __m512i),
{
    let mut acc = _mm256_setzero_ps();
    for p in 0..g.nb.div_ceil(2) {
        let (b, two) = (w.add(2 * p * g.wb), 2 * p + 1 < g.nb);
        prefetch_ahead(b, 2 * g.wb);
        let wq = (g.quants)(b, two);
        let q = g.q.add(p * N * PAIR_QUANTS);
        let s0 = sums4(4, |k| dot_pair::<SIGNED>(q.add(k * PAIR_QUANTS), wq));
        let s1 = sums4(N - 4, |k| {
            dot_pair::<SIGNED>(q.add((4 + k) * PAIR_QUANTS), wq)
        });
        // [b0 t0..4, b1 t0..4, b0 t4..8, b1 t4..8] → [b0 t0..8, b1 t0..8].
        let s = _mm512_inserti64x4(_mm512_castsi256_si512(s0), s1, 1);
        let s = _mm512_shuffle_i64x2(s, s, 0b11_01_10_00);
        let dm = weight_scales(b, g.ws, g.wb, two, false);
        let t = terms8::<T>(_mm512_cvtepi32_ps(s), dm, g.sc.add(p * 32));
        acc = _mm256_add_ps(acc, _mm512_castps512_ps256(t));
        if two {
            acc = _mm256_add_ps(acc, _mm512_extractf32x8_ps::<1>(t));
        }
    }
    let mut res = [0.0f32; 8];
    _mm256_storeu_ps(res.as_mut_ptr(), acc);
    out[..N].copy_from_slice(&res[..N]);
}

/// Every row of `out` (`rows × N`, row-major) against the `N` tokens of `pack`: with
/// `pair_rows`, two rows a step for one or two tokens (so the four lanes are full), else
/// one.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
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
    quants: impl Fn(*const u8, bool) -> (__m512i, __m512i),
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

/// 32 signed weight quants of one block (or 64 of two) prepared for biased activations:
/// the quants, and the accumulator start `−128 · Σq` per group of four.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn signed(q: __m512i) -> (__m512i, __m512i) {
    let zero = _mm512_setzero_si512();
    let bias = _mm512_set1_epi8(0x80u8 as i8);
    (
        q,
        _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, q)),
    )
}

/// The nibbles of the 16-byte runs at `p` and, when `two`, `p + stride`, as bytes in
/// element order (low nibbles, then high nibbles, of each block).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn nibbles(p: *const u8, stride: usize, two: bool) -> __m512i {
    if two {
        nibbles32_pair(p, stride)
    } else {
        _mm512_zextsi256_si512(nibbles32(p))
    }
}

/// The fifth bits of Q5 blocks (`qh` at `p` and, when `two`, `p + stride`) added to their
/// nibbles `nib` as 16.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn with_fifth(nib: __m512i, p: *const u8, stride: usize, two: bool) -> __m512i {
    let qh = |p: *const u8| (p as *const u32).read_unaligned() as u64;
    let fifth: __mmask64 = qh(p) | if two { qh(p.add(stride)) << 32 } else { 0 };
    _mm512_mask_add_epi8(nib, fifth, nib, _mm512_set1_epi8(16))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_q4_0(n: usize, w: &[u8], ws: usize, pack: &[u8], nt: usize, out: &mut [f32]) {
    let wb = q4_0::BLOCK_BYTES;
    let quants = |b: *const u8, two: bool| {
        signed(_mm512_sub_epi8(
            nibbles(b.add(2), wb, two),
            _mm512_set1_epi8(8),
        ))
    };
    by_tokens!(nt, true, SDD, (n, w, ws, wb, pack, out, true, quants))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_q5_0(n: usize, w: &[u8], ws: usize, pack: &[u8], nt: usize, out: &mut [f32]) {
    let wb = q5_0::BLOCK_BYTES;
    let quants = |b: *const u8, two: bool| {
        let q = with_fifth(nibbles(b.add(6), wb, two), b.add(2), wb, two);
        signed(_mm512_sub_epi8(q, _mm512_set1_epi8(16)))
    };
    by_tokens!(nt, true, SDD, (n, w, ws, wb, pack, out, true, quants))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_q5_1(n: usize, w: &[u8], ws: usize, pack: &[u8], nt: usize, out: &mut [f32]) {
    let wb = q5_1::BLOCK_BYTES;
    let quants = |b: *const u8, two: bool| {
        let q = with_fifth(nibbles(b.add(8), wb, two), b.add(4), wb, two);
        (q, _mm512_setzero_si512())
    };
    by_tokens!(nt, false, MIN, (n, w, ws, wb, pack, out, true, quants))
}

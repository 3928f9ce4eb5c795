//! AVX-512 VNNI small-batch kernels (see [`crate::formats::FewKernels`]): one weight row
//! against 2 ..= 8 tokens, for continuous batching's decode steps, where a batch holds one
//! token per request and repacking weight panels costs more than it saves.
//!
//! The tokens' activations are packed once per matmul: for each pair of blocks, each
//! token's 64 quant bytes (two blocks) contiguous, so a token's dot with a pair is one
//! `vpdpbusd` straight from memory; then per pair the blocks' scales as f32 lanes, one
//! lane per token (`[block 2p: tokens | block 2p+1: tokens]`). A weight row's pair of
//! blocks is unpacked once for all the tokens, the pair's integer sums of every token are
//! reduced together, and the float terms of every (block, token) are computed in the lanes
//! of one vector and added, block after block, to one running sum per token lane.
//!
//! Numerics as `formats::x86` promises: block sums are exact in integers; each lane's float
//! term is the scalar kernel's expression in its order, and each token's lane adds the
//! terms in block order starting from 0.0, as the scalar loop does. So every result equals
//! the scalar `vec_dot` bit for bit, whatever the batch.
//!
//! Signed formats (Q4_0, Q5_0, Q8_0) are packed with their activations biased to unsigned
//! (`a + 128`, as `vpdpbusd` takes them), and each weight pair's accumulators start at
//! `−128 · Σw`, which takes the bias back exactly.

use super::avx2::{load, nibbles32, prefetch_ahead};
use super::avx512::nibbles32_pair;
use crate::formats::{f16_at as f16_le, q4_0, q4_1, q5_0, q5_1, q8_0, q8_1, FewKernels};
use core::arch::x86_64::*;
use prima_core::gguf::GgmlType;

/// Most tokens a pack holds: two groups of four lanes.
const MAX_TOKENS: usize = 8;

/// Quant bytes of one token's pair of blocks.
const PAIR_QUANTS: usize = 64;

/// The small-batch kernels of weight type `t` at this level, if it has them.
pub(in crate::formats) fn kernels(t: GgmlType) -> Option<FewKernels> {
    use GgmlType as T;
    let few = |pack, dot| FewKernels {
        max_tokens: MAX_TOKENS,
        pack_bytes,
        pack,
        dot,
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

/// Token lanes of a pack of `n_tokens`: 4 or 8.
fn lanes(n_tokens: usize) -> usize {
    if n_tokens <= 4 {
        4
    } else {
        8
    }
}

/// Where a pack's parts start: `(pairs, scale section offset)`.
fn layout(n: usize, n_tokens: usize) -> (usize, usize) {
    let pairs = (n / 32).div_ceil(2);
    (pairs, pairs * n_tokens * PAIR_QUANTS)
}

/// Scale bytes of one pair: `d_a` lanes of both blocks, then `s_a` lanes of both blocks.
fn pair_scale_bytes(lanes: usize) -> usize {
    2 * 2 * lanes * 4
}

fn pack_bytes(n: usize, n_tokens: usize) -> usize {
    let (pairs, scales) = layout(n, n_tokens);
    scales + pairs * pair_scale_bytes(lanes(n_tokens))
}

/// Packs Q8_0/Q8_1 activation rows (`block_bytes` each block, quants at `quant_off`, the
/// f16 `d` at 0 and, with `sums`, the f16 `s` at 2), the quants XOR-ed with `bias`.
#[allow(clippy::too_many_arguments)]
fn pack_with(
    n: usize,
    acts: &[u8],
    a_stride: usize,
    n_tokens: usize,
    pack: &mut [u8],
    block_bytes: usize,
    quant_off: usize,
    bias: u8,
    sums: bool,
) {
    let nb = n / 32;
    assert!(
        (1..=MAX_TOKENS).contains(&n_tokens)
            && pack.len() >= pack_bytes(n, n_tokens)
            && a_stride >= nb * block_bytes
            && acts.len() >= (n_tokens - 1) * a_stride + nb * block_bytes,
        "few-token pack: short rows or buffer"
    );
    let (pairs, scale_off) = layout(n, n_tokens);
    let l = lanes(n_tokens);
    let (quants, scales) = pack.split_at_mut(scale_off);
    let block = |t: usize, i: usize| &acts[t * a_stride + i * block_bytes..][..block_bytes];
    for (p, pair) in quants.chunks_exact_mut(n_tokens * PAIR_QUANTS).enumerate() {
        for (t, dst) in pair.chunks_exact_mut(PAIR_QUANTS).enumerate() {
            for (h, half) in dst.chunks_exact_mut(32).enumerate() {
                match 2 * p + h {
                    // A missing last block: its sums are never used.
                    i if i >= nb => half.fill(bias),
                    i => {
                        let src = &block(t, i)[quant_off..quant_off + 32];
                        for (d, s) in half.iter_mut().zip(src) {
                            *d = s ^ bias;
                        }
                    }
                }
            }
        }
    }
    let scales = &mut scales[..pairs * pair_scale_bytes(l)];
    for (p, pair) in scales.chunks_exact_mut(pair_scale_bytes(l)).enumerate() {
        // Lane `h·l + t` of group `g` (0: d_a, 1: s_a): token `t`'s block `2p + h`, the
        // tokens repeated across the lanes (a step of two rows takes two tokens twice).
        for (k, lane) in pair.chunks_exact_mut(4).enumerate() {
            let (g, h, t) = (k / (2 * l), k / l % 2, k % l);
            let i = 2 * p + h;
            let v = if i < nb && (g == 0 || sums) {
                f16_le(block(t % n_tokens, i), 2 * g)
            } else {
                0.0
            };
            lane.copy_from_slice(&v.to_le_bytes());
        }
    }
}

fn pack_q8_0(n: usize, acts: &[u8], a_stride: usize, n_tokens: usize, pack: &mut [u8]) {
    pack_with(
        n,
        acts,
        a_stride,
        n_tokens,
        pack,
        q8_0::BLOCK_BYTES,
        2,
        0x80,
        false,
    )
}

fn pack_q8_1(n: usize, acts: &[u8], a_stride: usize, n_tokens: usize, pack: &mut [u8]) {
    pack_with(
        n,
        acts,
        a_stride,
        n_tokens,
        pack,
        q8_1::BLOCK_BYTES,
        4,
        0,
        true,
    )
}

/// How a format's block term is computed from its integer sum `s`, in the scalar order.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Terms {
    /// `s · d · d_a` (Q4_0, Q5_0).
    Sdd,
    /// `s · (d · d_a)` (Q8_0).
    SProd,
    /// `d · d_a · s + m · s_a` (Q4_1, Q5_1).
    Min,
}

/// Safe wrappers with the table's signature; they check the rows, the pack and `out`.
macro_rules! dot_wrappers {
    ($($name:ident => $imp:ident, $block:expr;)*) => {
        $(fn $name(n: usize, w: &[u8], w_stride: usize, pack: &[u8], n_tokens: usize, out: &mut [f32]) {
            let nb = n / 32;
            assert!((1..=MAX_TOKENS).contains(&n_tokens), "few-token dot: {n_tokens} tokens");
            let rows = out.len() / n_tokens;
            assert!(
                out.len() == rows * n_tokens
                    && pack.len() >= pack_bytes(n, n_tokens)
                    && w_stride >= nb * $block
                    && (rows == 0 || w.len() >= (rows - 1) * w_stride + nb * $block),
                "few-token dot: short rows, pack or output"
            );
            // SAFETY: only reachable through `overlay`'s table, which `dispatch` hands out
            // after detecting avx2, fma, f16c, avx512f, avx512bw, avx512vl and avx512vnni;
            // the rows, the pack and `out` are in bounds (above).
            unsafe { $imp(n, w, w_stride, pack, n_tokens, out) }
        })*
    };
}

dot_wrappers! {
    dot_q4_0 => rows_q4_0, q4_0::BLOCK_BYTES;
    dot_q5_0 => rows_q5_0, q5_0::BLOCK_BYTES;
    dot_q8_0 => rows_q8_0, q8_0::BLOCK_BYTES;
    dot_q4_1 => rows_q4_1, q4_1::BLOCK_BYTES;
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

/// The leading f16 pairs `[d, x]` of a pair of blocks of up to two rows as f32s:
/// `[d0, x0, d1, x1]` of row 0 at `b`, then of row 1 at `b + ws` when `two_rows`
/// (`x`: Q4_1's `m`, else whatever bytes follow `d`, unused). The second block of each
/// only when `two`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn weight_scales(b: *const u8, ws: usize, wb: usize, two: bool, two_rows: bool) -> __m256 {
    let word = |p: *const u8| (p as *const i32).read_unaligned();
    let second = |p: *const u8| if two { word(p.add(wb)) } else { 0 };
    let (w2, w3) = if two_rows {
        (word(b.add(ws)), second(b.add(ws)))
    } else {
        (0, 0)
    };
    _mm256_cvtph_ps(_mm_setr_epi32(word(b), second(b), w2, w3))
}

/// Indices into [`weight_scales`]' vector of lane `k`'s weight `d` (`+ 1`: its `x`) for a
/// step of `rows` rows × `n` tokens: lane `h·4 + k` is block `2p + h` of row `k / n`.
#[inline(always)]
fn scale_lanes(n: usize, rows: usize, plus: i32) -> [i32; 8] {
    core::array::from_fn(|k| (4 * (k % 4 / n).min(rows - 1) + 2 * (k / 4)) as i32 + plus)
}

/// The float terms of a pair for four lanes: `s` is `[block 2p | block 2p+1]`, `dm` the
/// weight scales ([`weight_scales`]), `sc` the pair's packed activation scales, and lane
/// `k` belongs to row `k / n` of the step's `rows`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn terms4<const T: u8>(
    s: __m256,
    dm: __m256,
    sc: *const f32,
    n: usize,
    rows: usize,
) -> __m256 {
    let lanes = |plus| _mm256_loadu_si256(scale_lanes(n, rows, plus).as_ptr() as *const __m256i);
    let dw = _mm256_permutevar8x32_ps(dm, lanes(0));
    let da = _mm256_loadu_ps(sc);
    match T {
        SDD => _mm256_mul_ps(_mm256_mul_ps(s, dw), da),
        SPROD => _mm256_mul_ps(s, _mm256_mul_ps(dw, da)),
        _ => {
            let mw = _mm256_permutevar8x32_ps(dm, lanes(1));
            let sa = _mm256_loadu_ps(sc.add(8));
            _mm256_add_ps(
                _mm256_mul_ps(_mm256_mul_ps(dw, da), s),
                _mm256_mul_ps(mw, sa),
            )
        }
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

const SDD: u8 = Terms::Sdd as u8;
const SPROD: u8 = Terms::SProd as u8;
const MIN: u8 = Terms::Min as u8;

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

/// Every row of `out` (`rows × N`, row-major) against the `N` tokens of `pack`: two rows
/// a step for one or two tokens (so the four lanes are full), else one.
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
    if N <= 2 {
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

/// The 32 bytes at `p` and, when `two`, at `p + stride`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn bytes64(p: *const u8, stride: usize, two: bool) -> __m512i {
    let hi = if two {
        load(p.add(stride))
    } else {
        _mm256_setzero_si256()
    };
    _mm512_inserti64x4(_mm512_castsi256_si512(load(p)), hi, 1)
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
    by_tokens!(nt, true, SDD, (n, w, ws, wb, pack, out, quants))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_q5_0(n: usize, w: &[u8], ws: usize, pack: &[u8], nt: usize, out: &mut [f32]) {
    let wb = q5_0::BLOCK_BYTES;
    let quants = |b: *const u8, two: bool| {
        let q = with_fifth(nibbles(b.add(6), wb, two), b.add(2), wb, two);
        signed(_mm512_sub_epi8(q, _mm512_set1_epi8(16)))
    };
    by_tokens!(nt, true, SDD, (n, w, ws, wb, pack, out, quants))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_q8_0(n: usize, w: &[u8], ws: usize, pack: &[u8], nt: usize, out: &mut [f32]) {
    let wb = q8_0::BLOCK_BYTES;
    let quants = |b: *const u8, two: bool| signed(bytes64(b.add(2), wb, two));
    by_tokens!(nt, true, SPROD, (n, w, ws, wb, pack, out, quants))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_q4_1(n: usize, w: &[u8], ws: usize, pack: &[u8], nt: usize, out: &mut [f32]) {
    let wb = q4_1::BLOCK_BYTES;
    let quants = |b: *const u8, two: bool| (nibbles(b.add(4), wb, two), _mm512_setzero_si512());
    by_tokens!(nt, false, MIN, (n, w, ws, wb, pack, out, quants))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_q5_1(n: usize, w: &[u8], ws: usize, pack: &[u8], nt: usize, out: &mut [f32]) {
    let wb = q5_1::BLOCK_BYTES;
    let quants = |b: *const u8, two: bool| {
        let q = with_fifth(nibbles(b.add(8), wb, two), b.add(4), wb, two);
        (q, _mm512_setzero_si512())
    };
    by_tokens!(nt, false, MIN, (n, w, ws, wb, pack, out, quants))
}

//! Small-batch kernels (see [`crate::formats::FewKernels`]): weight rows against 2 ..= 8
//! tokens, continuous batching's decode steps, with the weights read where they lie.
//! This module holds what both levels share: the activation pack, the per-pair float
//! terms and the safe wrappers; `few256` (AVX2) and `few512` (AVX-512 VNNI) the kernels.
//!
//! A pack holds, for each pair of blocks, each token's 64 quant bytes (two blocks)
//! contiguous, so a token's dot with a weight pair reads one run; then per pair the
//! blocks' scales as f32 lanes, one lane per token (`[block 2p: lanes | block 2p+1:
//! lanes]`, 4 lanes up to 4 tokens, else 8; the tokens repeat across spare lanes, so a
//! step of two rows can take two tokens twice). Each lane's float term is the scalar
//! kernel's expression in its order, so each result equals the scalar `vec_dot` bit for
//! bit.
//!
//! Not for: the formats whose small batches take one row per lane (`rows::few_rows16`), or
//! choosing kernels (`levels`).

use crate::formats::{f16_at as f16_le, q8_0, q8_1};
use core::arch::x86_64::*;

/// Most tokens a pack holds: two groups of four lanes.
pub(super) const MAX_TOKENS: usize = 8;

/// Quant bytes of one token's pair of blocks.
pub(super) const PAIR_QUANTS: usize = 64;

/// Token lanes of a pack of `n_tokens`: 4 or 8.
pub(super) fn lanes(n_tokens: usize) -> usize {
    if n_tokens <= 4 {
        4
    } else {
        8
    }
}

/// Where a pack's parts start: `(pairs, scale section offset)`.
pub(super) fn layout(n: usize, n_tokens: usize) -> (usize, usize) {
    let pairs = (n / 32).div_ceil(2);
    (pairs, pairs * n_tokens * PAIR_QUANTS)
}

/// Scale bytes of one pair: `d_a` lanes of both blocks, then `s_a` lanes of both blocks.
pub(super) fn pair_scale_bytes(lanes: usize) -> usize {
    2 * 2 * lanes * 4
}

/// Bytes of the pack of `n_tokens` rows of `n` columns (`FewKernels::pack_bytes`).
pub(super) fn pack_bytes(n: usize, n_tokens: usize) -> usize {
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

/// Q8_0 activations biased to unsigned (`a + 128`), for `vpdpbusd` against signed weights.
pub(super) fn pack_q8_0_biased(
    n: usize,
    acts: &[u8],
    a_stride: usize,
    n_tokens: usize,
    pack: &mut [u8],
) {
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

/// Q8_0 activations as they are (the AVX2 kernels move the weights' signs onto them).
pub(super) fn pack_q8_0(n: usize, acts: &[u8], a_stride: usize, n_tokens: usize, pack: &mut [u8]) {
    pack_with(
        n,
        acts,
        a_stride,
        n_tokens,
        pack,
        q8_0::BLOCK_BYTES,
        2,
        0,
        false,
    )
}

/// Q8_1 activations (of Q4_1 and Q5_1 weights), with their `s = d · Σq` lanes.
pub(super) fn pack_q8_1(n: usize, acts: &[u8], a_stride: usize, n_tokens: usize, pack: &mut [u8]) {
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

/// How a format's block term is computed from its integer sum `s`, in the scalar order;
/// `rows::few_rows16` takes the same three (its Q8_0, Q4_0 and IQ4_NL sums starting at the
/// pack's bias correction).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Terms {
    /// `s · d · d_a` (Q4_0, Q5_0).
    Sdd,
    /// `s · (d · d_a)` (Q8_0, IQ4_NL).
    SProd,
    /// `d · d_a · s + m · s_a` (Q4_1, Q5_1).
    Min,
}

pub(super) const SDD: u8 = Terms::Sdd as u8;
pub(super) const SPROD: u8 = Terms::SProd as u8;
pub(super) const MIN: u8 = Terms::Min as u8;

/// The leading f16 pairs `[d, x]` of a pair of blocks of up to two rows as f32s:
/// `[d0, x0, d1, x1]` of row 0 at `b`, then of row 1 at `b + ws` when `two_rows`
/// (`x`: Q4_1's `m`, else whatever bytes follow `d`, unused). The second block of each
/// only when `two`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn weight_scales(
    b: *const u8,
    ws: usize,
    wb: usize,
    two: bool,
    two_rows: bool,
) -> __m256 {
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
pub(super) fn scale_lanes(n: usize, rows: usize, plus: i32) -> [i32; 8] {
    core::array::from_fn(|k| (4 * (k % 4 / n).min(rows - 1) + 2 * (k / 4)) as i32 + plus)
}

/// The float terms of a pair for four lanes: `s` is `[block 2p | block 2p+1]`, `dm` the
/// weight scales ([`weight_scales`]), `sc` the pair's packed activation scales, and lane
/// `k` belongs to row `k / n` of the step's `rows`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn terms4<const T: u8>(
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

/// Safe wrappers with the table's signature around a level's kernels; they check the
/// rows, the pack and `out`.
macro_rules! few_dot_wrappers {
    ($($name:ident => $imp:ident, $block:expr;)*) => {
        $(fn $name(n: usize, w: &[u8], w_stride: usize, pack: &[u8], n_tokens: usize, out: &mut [f32]) {
            let nb = n / 32;
            assert!((1..=$crate::formats::x86::few::MAX_TOKENS).contains(&n_tokens), "few-token dot: {n_tokens} tokens");
            let rows = out.len() / n_tokens;
            assert!(
                out.len() == rows * n_tokens
                    && pack.len() >= $crate::formats::x86::few::pack_bytes(n, n_tokens)
                    && w_stride >= nb * $block
                    && (rows == 0 || w.len() >= (rows - 1) * w_stride + nb * $block),
                "few-token dot: short rows, pack or output"
            );
            // SAFETY: only reachable through the level's `levels` table, which `dispatch`
            // hands out after detecting the level's features (those `$imp` enables); the
            // rows, the pack and `out` are in bounds (above).
            unsafe { $imp(n, w, w_stride, pack, n_tokens, out) }
        })*
    };
}

pub(super) mod few256;
pub(super) mod few512;

//! AVX2 row-panel kernels for prefill: the layout of `panel512` with eight rows per panel,
//! one per 32-bit lane of a 256-bit vector.
//!
//! Without VNNI, four columns of eight rows against a token's broadcast quants are a
//! `vpmaddubsw` (pairs to i16) and a `vpmaddwd` (to i32). The i16 pairs of several column
//! groups are added before widening while they provably stay below 2^15 (eight groups of
//! 4-bit quants, four of 5-bit, two of 6-bit), and the K-quants' widening multiplies by
//! the lane's scale at once. Q8_0 keeps its signed quants and takes the sign trick
//! (`|w| · sign(a, w)`), since biased bytes would saturate `vpmaddubsw`. Same numerics
//! contract as `panel512`: exact integer block sums, the scalar float terms lane by lane.
//!
//! Not for: AVX-512 CPUs (`panel512`). Kept apart from `panel512`, not folded: its tiles add
//! `vpmaddubsw` pairs in i16 and widen by `vpmaddwd` where `panel512` has `vpdpbusd`, and its
//! float tiles are two 8-lane passes; the row packs, token side data and float layout are
//! `panel512`'s own, imported.

use super::panel512::{element, float_kernels, BF16, F16, F32, FLOAT_ROWS};
use super::panel512::{
    k4_block, k6_block, legacy_block, pack_k16, pack_legacy, pack_q4_k_imp, prep_q8_0, prep_q8_1,
    prep_q8_k, DDSM, K_AUX, Q2K, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0_SIGNED, SDD,
    S_DD,
};
use crate::formats::float::bf16_products_exact;
use crate::formats::k_quants::{q8_k, QK_K};
use crate::formats::x86::lanes256::f32_at;
use crate::formats::{q8_0, q8_1, PanelKernels};
use core::arch::x86_64::*;
use prima_abi::GgmlType;

/// Weight rows per panel: the lanes of a 256-bit vector of i32.
const ROWS: usize = 8;
/// Tokens per register tile (sixteen registers: partial sums, block sums and totals).
const TOKENS: usize = 4;

/// MXFP4's AVX2 panels: its rows rewritten as Q8_0 rows by `pack` (`panel_iq4`, which sits
/// above this module), run by a tile of their own (`gemm_mxfp4`).
pub(in crate::formats) fn mxfp4_kernels(
    pack: fn(usize, &[u8], usize, &mut [u8]),
) -> Option<PanelKernels> {
    kernels(GgmlType::Q8_0).map(|q8| PanelKernels {
        pack,
        gemm: gemm_mxfp4,
        ..q8
    })
}

/// The AVX2 panel kernels of weight type `t`, if it has them.
pub(in crate::formats) fn kernels(t: GgmlType) -> Option<PanelKernels> {
    use GgmlType as T;
    let legacy = |pack, prep, gemm| PanelKernels {
        rows: ROWS,
        tokens: TOKENS,
        panel_bytes: |n| n / 32 * legacy_block(ROWS),
        pack,
        aux_bytes: |n| n / 32 * 8,
        prep,
        gemm,
        reads_acts: true,
    };
    let k = |panel_bytes, pack, gemm| PanelKernels {
        rows: ROWS,
        tokens: TOKENS,
        panel_bytes,
        pack,
        aux_bytes: |n| n / QK_K * K_AUX,
        prep: prep_q8_k,
        gemm,
        reads_acts: true,
    };
    Some(match t {
        T::Q4_0 => legacy(pack_q4_0, prep_q8_0, gemm_q4_0),
        T::Q5_0 => legacy(pack_q5_0, prep_q8_0, gemm_q5_0),
        T::Q8_0 => legacy(pack_q8_0, prep_q8_0, gemm_q8_0),
        T::Q4_1 => legacy(pack_q4_1, prep_q8_1, gemm_q4_1),
        T::Q5_1 => legacy(pack_q5_1, prep_q8_1, gemm_q5_1),
        T::Q4K => k(|n| n / QK_K * k4_block(ROWS), pack_q4_k, gemm_q4_k),
        T::Q5K => k(|n| n / QK_K * k4_block(ROWS), pack_q5_k, gemm_q5_k),
        T::Q6K => k(|n| n / QK_K * k6_block(ROWS), pack_q6_k, gemm_q6_k),
        T::Q3K => k(|n| n / QK_K * k6_block(ROWS), pack_q3_k, gemm_q3_k),
        T::Q2K => k(|n| n / QK_K * k6_block(ROWS), pack_q2_k, gemm_q2_k),
        T::F16 => PanelKernels {
            rows: FLOAT_PANEL_ROWS,
            panel_bytes: |n| float_bytes::<F16>(n, FLOAT_PANEL_ROWS),
            ..float_kernels(FLOAT_TOKENS, pack_f16, prep_f16, gemm_f16)
        },
        // BF16 panels and tokens carry their magnitude bounds after the f32s.
        T::BF16 => PanelKernels {
            rows: FLOAT_PANEL_ROWS,
            panel_bytes: |n| float_bytes::<BF16>(n, FLOAT_PANEL_ROWS),
            aux_bytes: |n| float_bytes::<BF16>(n, 1),
            ..float_kernels(FLOAT_TOKENS, pack_bf16, prep_bf16, gemm_bf16)
        },
        T::F32 => PanelKernels {
            rows: FLOAT_PANEL_ROWS,
            panel_bytes: |n| float_bytes::<F32>(n, FLOAT_PANEL_ROWS),
            ..float_kernels(FLOAT_TOKENS, pack_f32, prep_f32, gemm_f32)
        },
        _ => return None,
    })
}

macro_rules! pack_wrappers {
    ($($name:ident => $imp:ident::<$($p:tt),*>;)*) => {
        $(fn $name(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]) {
            // SAFETY: reached only through `kernels`, which `dispatch` hands out after
            // detecting AVX2, FMA and F16C; the pack checks its buffers' lengths.
            unsafe { $imp::<$($p),*>(n, w, w_stride, panel) }
        })*
    };
}

pack_wrappers! {
    pack_q4_0 => pack_legacy::<Q4_0, ROWS>;
    pack_q5_0 => pack_legacy::<Q5_0, ROWS>;
    pack_q8_0 => pack_legacy::<Q8_0_SIGNED, ROWS>;
    pack_q4_1 => pack_legacy::<Q4_1, ROWS>;
    pack_q5_1 => pack_legacy::<Q5_1, ROWS>;
    pack_q4_k => pack_q4_k_imp::<ROWS, Q4K>;
    pack_q5_k => pack_q4_k_imp::<ROWS, Q5K>;
    pack_q6_k => pack_k16::<ROWS, Q6K>;
    pack_q3_k => pack_k16::<ROWS, Q3K>;
    pack_q2_k => pack_k16::<ROWS, Q2K>;
}

/// The four activation quants at `p`, in every lane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn bcast(p: *const u8) -> __m256i {
    _mm256_set1_epi32((p as *const i32).read_unaligned())
}

/// MXFP4 packed as Q8_0 (signed): Q8_0's tile, but its values (−12 ..= 12) let eight
/// groups' `vpmaddubsw` pairs (each at most 2·12·127) add in i16 before widening.
const MXFP4_SIGNED: u8 = 6;

/// `G` tokens against one legacy panel of format `F`; `out[8k ..]` gets token `k`.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn legacy_tile<const G: usize, const KIND: u8, const F: u8>(
    nb: usize,
    panel: *const u8,
    acts: *const u8,
    (a_stride, a_block, q_off): (usize, usize, usize),
    aux: *const u8,
    aux_stride: usize,
    offset: i32,
    out: *mut f32,
) {
    // Column groups whose i16 pair sums are added before widening: 2·15·127 per group for
    // 4-bit quants (×8 < 2^15), 2·31·127 for 5-bit (×4), 2·128·127 for Q8_0's sign trick,
    // 2·12·127 for MXFP4's (×8).
    let run = match F {
        Q4_0 | Q4_1 | MXFP4_SIGNED => 8,
        Q5_0 | Q5_1 => 4,
        _ => 1,
    };
    let ones = _mm256_set1_epi16(1);
    let pb = legacy_block(ROWS);
    let mut sums = [_mm256_setzero_ps(); G];
    for b in 0..nb {
        let p = panel.add(b * pb);
        let mut acc = [_mm256_setzero_si256(); G];
        let mut part = [_mm256_setzero_si256(); G];
        for g in 0..8 {
            let w = _mm256_loadu_si256(p.add(4 * ROWS * g) as *const __m256i);
            let signed = F == Q8_0_SIGNED || F == MXFP4_SIGNED;
            let u = if signed { _mm256_sign_epi8(w, w) } else { w };
            for k in 0..G {
                let x = bcast(acts.add(k * a_stride + b * a_block + q_off + 4 * g));
                let x = if signed { _mm256_sign_epi8(x, w) } else { x };
                let m = _mm256_maddubs_epi16(u, x);
                part[k] = if g % run == 0 {
                    m
                } else {
                    _mm256_add_epi16(part[k], m)
                };
                if g % run == run - 1 {
                    acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(part[k], ones));
                }
            }
        }
        let d = _mm256_loadu_ps(p.add(32 * ROWS) as *const f32);
        for (k, sum) in sums.iter_mut().enumerate() {
            let ax = aux.add(k * aux_stride + 8 * b);
            let d_a = _mm256_set1_ps(f32_at(ax));
            let term = match KIND {
                SDD | S_DD => {
                    let sa = (ax.add(4) as *const i32).read_unaligned();
                    let isum = _mm256_cvtepi32_ps(_mm256_sub_epi32(
                        acc[k],
                        _mm256_set1_epi32(offset.wrapping_mul(sa)),
                    ));
                    if KIND == SDD {
                        _mm256_mul_ps(_mm256_mul_ps(isum, d), d_a)
                    } else {
                        _mm256_mul_ps(isum, _mm256_mul_ps(d, d_a))
                    }
                }
                _ => {
                    let m = _mm256_loadu_ps(p.add(36 * ROWS) as *const f32);
                    let s_a = _mm256_set1_ps(f32_at(ax.add(4)));
                    _mm256_add_ps(
                        _mm256_mul_ps(_mm256_mul_ps(d, d_a), _mm256_cvtepi32_ps(acc[k])),
                        _mm256_mul_ps(m, s_a),
                    )
                }
            };
            *sum = _mm256_add_ps(*sum, term);
        }
    }
    for (k, sum) in sums.iter().enumerate() {
        _mm256_storeu_ps(out.add(ROWS * k), *sum);
    }
}

/// Checks a gemm call's buffers (as `panel512::check_gemm`) and returns the token count.
#[allow(clippy::too_many_arguments)]
pub(super) fn check_gemm(
    nb: usize,
    panel: &[u8],
    panel_block: usize,
    acts: &[u8],
    a_stride: usize,
    a_block: usize,
    aux: &[u8],
    aux_stride: usize,
    aux_block: usize,
    out: &[f32],
) -> usize {
    let nt = out.len() / ROWS;
    assert!(panel.len() >= nb * panel_block, "panel gemm: short panel");
    if nt > 0 {
        assert!(
            a_stride >= nb * a_block && acts.len() >= (nt - 1) * a_stride + nb * a_block,
            "panel gemm: short activation rows"
        );
        assert!(
            aux_stride >= nb * aux_block && aux.len() >= (nt - 1) * aux_stride + nb * aux_block,
            "panel gemm: short side data"
        );
    }
    nt
}

#[allow(clippy::too_many_arguments)]
fn legacy_gemm<const KIND: u8, const F: u8>(
    n: usize,
    panel: &[u8],
    acts: &[u8],
    a_stride: usize,
    aux: &[u8],
    aux_stride: usize,
    out: &mut [f32],
    (a_block, q_off, offset): (usize, usize, i32),
) {
    let nb = n / 32;
    let nt = check_gemm(
        nb,
        panel,
        legacy_block(ROWS),
        acts,
        a_stride,
        a_block,
        aux,
        aux_stride,
        8,
        out,
    );
    let shape = (a_stride, a_block, q_off);
    // SAFETY: reached only through `kernels`, handed out after detecting AVX2, FMA and
    // F16C; `check_gemm` checked that every block the tiles read is in bounds and that
    // `out` holds `nt` tokens' 8 lanes.
    unsafe {
        over_tokens!([ROWS, TOKENS] nt, a_stride, aux_stride, acts, aux, out, |g, a, x, o| {
            let p = panel.as_ptr();
            if g == TOKENS {
                legacy_tile::<TOKENS, KIND, F>(nb, p, a, shape, x, aux_stride, offset, o)
            } else {
                legacy_tile::<1, KIND, F>(nb, p, a, shape, x, aux_stride, offset, o)
            }
        });
    }
}

macro_rules! legacy_gemms {
    ($($name:ident => $kind:expr, $f:expr, $a_block:expr, $q_off:expr, $offset:expr;)*) => {
        $(fn $name(
            n: usize, panel: &[u8], acts: &[u8], a_stride: usize, aux: &[u8],
            aux_stride: usize, out: &mut [f32],
        ) {
            legacy_gemm::<{ $kind }, { $f }>(
                n, panel, acts, a_stride, aux, aux_stride, out, ($a_block, $q_off, $offset),
            )
        })*
    };
}

legacy_gemms! {
    gemm_q4_0 => SDD, Q4_0, q8_0::BLOCK_BYTES, 2, 8;
    gemm_q5_0 => SDD, Q5_0, q8_0::BLOCK_BYTES, 2, 16;
    gemm_q8_0 => S_DD, Q8_0_SIGNED, q8_0::BLOCK_BYTES, 2, 0;
    gemm_mxfp4 => S_DD, MXFP4_SIGNED, q8_0::BLOCK_BYTES, 2, 0;
    gemm_q4_1 => DDSM, Q4_1, q8_1::BLOCK_BYTES, 4, 0;
    gemm_q5_1 => DDSM, Q5_1, q8_1::BLOCK_BYTES, 4, 0;
}

/// `G` tokens against a Q4_K (Q5_K) panel: per sub-block, the i16 pair sums of eight
/// (four) groups, below 2^15, widened by `vpmaddwd` against the lane's `(scale, scale)`;
/// mins as in `panel512`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_tile<const G: usize, const F: u8>(
    nb: usize,
    panel: *const u8,
    acts: *const u8,
    a_stride: usize,
    aux: *const u8,
    aux_stride: usize,
    out: *mut f32,
) {
    let (pb, scales, mins, d_off) = (k4_block(ROWS), 64 * 32, 72 * 32, 76 * 32);
    let mut sums = [_mm256_setzero_ps(); G];
    for b in 0..nb {
        let p = panel.add(b * pb);
        let mut isums = [_mm256_setzero_si256(); G];
        let run = if F == Q5K { 4 } else { 8 };
        for s in 0..8 {
            let sc = _mm256_loadu_si256(p.add(scales + 32 * s) as *const __m256i);
            for g0 in (0..8).step_by(run) {
                let mut part = [_mm256_setzero_si256(); G];
                for g in g0..g0 + run {
                    let w = _mm256_loadu_si256(p.add(32 * (8 * s + g)) as *const __m256i);
                    for (k, part) in part.iter_mut().enumerate() {
                        let a = acts.add(k * a_stride + b * q8_k::BLOCK_BYTES + q8_k::QS);
                        let m = _mm256_maddubs_epi16(w, bcast(a.add(32 * s + 4 * g)));
                        *part = _mm256_add_epi16(*part, m);
                    }
                }
                for (isum, part) in isums.iter_mut().zip(part) {
                    *isum = _mm256_add_epi32(*isum, _mm256_madd_epi16(part, sc));
                }
            }
        }
        let d = _mm256_loadu_ps(p.add(d_off) as *const f32);
        let dmin = _mm256_loadu_ps(p.add(d_off + 32) as *const f32);
        for (k, sum) in sums.iter_mut().enumerate() {
            let ax = aux.add(k * aux_stride + b * K_AUX);
            let mut msum = _mm256_setzero_si256();
            for j in 0..4 {
                let mn = _mm256_loadu_si256(p.add(mins + 32 * j) as *const __m256i);
                msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mn, bcast(ax.add(4 + 4 * j))));
            }
            let d_a = _mm256_set1_ps(f32_at(ax));
            let term = _mm256_sub_ps(
                _mm256_mul_ps(_mm256_mul_ps(d_a, d), _mm256_cvtepi32_ps(isums[k])),
                _mm256_mul_ps(_mm256_mul_ps(d_a, dmin), _mm256_cvtepi32_ps(msum)),
            );
            *sum = _mm256_add_ps(*sum, term);
        }
    }
    for (k, sum) in sums.iter().enumerate() {
        _mm256_storeu_ps(out.add(ROWS * k), *sum);
    }
}

/// `G` tokens against a 16-group panel (Q6K, Q3K, Q2K): per 16-column group, two pairs of
/// groups' i16 sums (2·2·63·127 < 2^15) widened against the lane's `(scale, scale)`; the
/// offsets and Q2_K's mins as in `panel512`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k16_tile<const G: usize, const F: u8>(
    nb: usize,
    panel: *const u8,
    acts: *const u8,
    a_stride: usize,
    aux: *const u8,
    aux_stride: usize,
    out: *mut f32,
) {
    let (pb, scales, pairs, d_off) = (k6_block(ROWS), 64 * 32, 80 * 32, 88 * 32);
    let mut sums = [_mm256_setzero_ps(); G];
    for b in 0..nb {
        let p = panel.add(b * pb);
        let mut isums = [_mm256_setzero_si256(); G];
        for h in 0..16 {
            let sc = _mm256_loadu_si256(p.add(scales + 32 * h) as *const __m256i);
            for half in 0..2 {
                let g0 = 4 * h + 2 * half;
                let w0 = _mm256_loadu_si256(p.add(32 * g0) as *const __m256i);
                let w1 = _mm256_loadu_si256(p.add(32 * (g0 + 1)) as *const __m256i);
                for (k, isum) in isums.iter_mut().enumerate() {
                    let a = acts.add(k * a_stride + b * q8_k::BLOCK_BYTES + q8_k::QS + 4 * g0);
                    let part = _mm256_add_epi16(
                        _mm256_maddubs_epi16(w0, bcast(a)),
                        _mm256_maddubs_epi16(w1, bcast(a.add(4))),
                    );
                    *isum = _mm256_add_epi32(*isum, _mm256_madd_epi16(part, sc));
                }
            }
        }
        let d = _mm256_loadu_ps(p.add(d_off) as *const f32);
        for (k, sum) in sums.iter_mut().enumerate() {
            let ab = acts.add(k * a_stride + b * q8_k::BLOCK_BYTES);
            let mut off = _mm256_setzero_si256();
            for j in 0..8 {
                let sp = _mm256_loadu_si256(p.add(pairs + 32 * j) as *const __m256i);
                off = _mm256_add_epi32(
                    off,
                    _mm256_madd_epi16(sp, bcast(ab.add(q8_k::BSUMS + 4 * j))),
                );
            }
            let d_a = _mm256_set1_ps(f32_at(aux.add(k * aux_stride + b * K_AUX)));
            let term = match F {
                Q2K => {
                    let dmin = _mm256_loadu_ps(p.add(d_off + 32) as *const f32);
                    _mm256_sub_ps(
                        _mm256_mul_ps(_mm256_mul_ps(d_a, d), _mm256_cvtepi32_ps(isums[k])),
                        _mm256_mul_ps(_mm256_mul_ps(d_a, dmin), _mm256_cvtepi32_ps(off)),
                    )
                }
                _ => {
                    let shift = _mm_cvtsi32_si128(if F == Q6K { 5 } else { 2 });
                    let isum = _mm256_sub_epi32(isums[k], _mm256_sll_epi32(off, shift));
                    _mm256_mul_ps(_mm256_mul_ps(d_a, d), _mm256_cvtepi32_ps(isum))
                }
            };
            *sum = _mm256_add_ps(*sum, term);
        }
    }
    for (k, sum) in sums.iter().enumerate() {
        _mm256_storeu_ps(out.add(ROWS * k), *sum);
    }
}

macro_rules! k_gemms {
    ($($name:ident => $tile:ident::<$f:ident>, $block:expr;)*) => {
        $(fn $name(
            n: usize, panel: &[u8], acts: &[u8], a_stride: usize, aux: &[u8],
            aux_stride: usize, out: &mut [f32],
        ) {
            let nb = n / QK_K;
            let nt = check_gemm(
                nb, panel, $block, acts, a_stride, q8_k::BLOCK_BYTES, aux, aux_stride, K_AUX,
                out,
            );
            // SAFETY: as in `legacy_gemm`.
            unsafe {
                over_tokens!([ROWS, TOKENS] nt, a_stride, aux_stride, acts, aux, out, |g, a, x, o| {
                    if g == TOKENS {
                        $tile::<TOKENS, $f>(nb, panel.as_ptr(), a, a_stride, x, aux_stride, o)
                    } else {
                        $tile::<1, $f>(nb, panel.as_ptr(), a, a_stride, x, aux_stride, o)
                    }
                });
            }
        })*
    };
}

k_gemms! {
    gemm_q4_k => q4_k_tile::<Q4K>, k4_block(ROWS);
    gemm_q5_k => q4_k_tile::<Q5K>, k4_block(ROWS);
    gemm_q6_k => k16_tile::<Q6K>, k6_block(ROWS);
    gemm_q3_k => k16_tile::<Q3K>, k6_block(ROWS);
    gemm_q2_k => k16_tile::<Q2K>, k6_block(ROWS);
}

// ---- F16, BF16, F32: four rows × up to three tokens, in two 8-lane passes ----
//
// The float dot's lanes are fixed (element `i` in lane `i % 16`, folded by halving, see
// `formats::float`), and a lane's sum never meets another lane's before the fold, so the
// sixteen lanes run as two passes of eight (low half, then high half). Each pass holds all
// four rows × three tokens in one register each: every weight vector loaded feeds three
// accumulators and every activation vector four, against `panel512`'s two × two tiles of
// both halves that loaded one vector per two FMAs. Panels (four rows widened to f32) and
// the widened activations are laid out by half — all chunks' low eight lanes, then all
// their high eight — so a pass reads half the bytes, contiguously, and a panel of a long
// row and a tile's activations stay in L1 for both passes.
//
// F32's canonical terms are fused multiply-adds, so F32 tiles are `vfmadd`s. F16 products
// are exact in f32, so F16 tiles fuse too (rounding as the scalar multiply-then-add). BF16
// products are exact unless they leave the normal range, so BF16 panels and tokens carry
// their smallest nonzero and largest magnitudes, and a tile fuses where those bound every
// product into it (`float::bf16_products_exact`), else multiplies and adds.

/// Tokens per float tile: twelve accumulators of four rows, and the loads feeding them.
const FLOAT_TOKENS: usize = 3;

/// Rows per float panel: two tiles' four, which each token triple meets in turn, so its
/// activations come from L2 once for eight rows, and a chunk's bookkeeping (packing calls,
/// copying results out) is per eight rows.
const FLOAT_PANEL_ROWS: usize = 2 * FLOAT_ROWS;

/// Eight elements of format `F` at `p`, widened to f32 (exact).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn widen8<const F: u8>(p: *const u8) -> __m256 {
    match F {
        F32 => _mm256_loadu_ps(p as *const f32),
        F16 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
        _ => {
            let bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32(bits, 16))
        }
    }
}

/// Where element `i` of row `r` (of `rows`) goes in a half-split float row group: for the
/// `n / 16` whole 16-element chunks, `[half][chunk][row][8]`; then each row's `n % 16`
/// tail. With `rows = 1` this is a token's activation layout.
#[inline]
fn half_slot(n: usize, rows: usize, r: usize, i: usize) -> usize {
    let full = n / 16 * 16;
    if i < full {
        ((i % 16 / 8 * (full / 16) + i / 16) * rows + r) * 8 + i % 8
    } else {
        rows * full + r * (n - full) + (i - full)
    }
}

/// Widens a row of `n` elements of format `F` at `src` into row `r` of a half-split group
/// of `rows` rows at `dst` (see [`half_slot`]).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn widen_row<const F: u8>(n: usize, src: *const u8, dst: *mut f32, rows: usize, r: usize) {
    let size = if F == F32 { 4 } else { 2 };
    let chunks = n / 16;
    for c in 0..chunks {
        let at = (c * rows + r) * 8;
        _mm256_storeu_ps(dst.add(at), widen8::<F>(src.add(size * 16 * c)));
        let at = at + chunks * rows * 8;
        _mm256_storeu_ps(dst.add(at), widen8::<F>(src.add(size * (16 * c + 8))));
    }
    for i in 16 * chunks..n {
        dst.add(half_slot(n, rows, r, i))
            .write_unaligned(element::<F>(src, i));
    }
}

/// Bytes after a BF16 panel's (a token's) f32s: its elements' smallest nonzero and
/// largest magnitudes, two f32s, for [`bf16_products_exact`]; 64 keeps the next panel
/// (token) on a cache line.
const BOUNDS_BYTES: usize = 64;

/// Bytes of the f32s, and of their bounds (BF16 only), of `rows` rows of `n` elements.
const fn float_bytes<const F: u8>(n: usize, rows: usize) -> usize {
    rows * 4 * n + if F == BF16 { BOUNDS_BYTES } else { 0 }
}

/// Folds the magnitudes of the BF16 row of `n` elements at `p` into `(smallest nonzero,
/// largest)`, as magnitude bits (`0xFFFF`: no nonzero yet; NaNs order above infinity).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn bf16_bounds(n: usize, p: *const u8, (min, max): (u16, u16)) -> (u16, u16) {
    let (magnitude, zero) = (_mm256_set1_epi16(0x7FFF), _mm256_setzero_si256());
    let (mut lo, mut hi) = (_mm256_set1_epi16(-1), zero);
    for c in 0..n / 16 {
        let v = _mm256_and_si256(
            _mm256_loadu_si256(p.add(32 * c) as *const __m256i),
            magnitude,
        );
        hi = _mm256_max_epu16(hi, v);
        // Zeros become 0xFFFF, above every magnitude, so they never win the minimum.
        lo = _mm256_min_epu16(lo, _mm256_or_si256(v, _mm256_cmpeq_epi16(v, zero)));
    }
    let (mut los, mut his) = ([0u16; 16], [0u16; 16]);
    _mm256_storeu_si256(los.as_mut_ptr() as *mut __m256i, lo);
    _mm256_storeu_si256(his.as_mut_ptr() as *mut __m256i, hi);
    let tail = (n / 16 * 16..n).map(|i| (p.add(2 * i) as *const u16).read_unaligned() & 0x7FFF);
    los.into_iter()
        .zip(his)
        .chain(tail.map(|m| (if m == 0 { u16::MAX } else { m }, m)))
        .fold((min, max), |(min, max), (l, h)| (min.min(l), max.max(h)))
}

/// Writes bounds bits `(min, max)` as f32s at `dst` (`+∞` for "no nonzero").
#[inline]
unsafe fn put_bounds(dst: *mut u8, (min, max): (u16, u16)) {
    let f = |bits: u16| f32::from_bits((bits as u32) << 16);
    let min = if min == u16::MAX {
        f32::INFINITY
    } else {
        f(min)
    };
    (dst as *mut [f32; 2]).write_unaligned([min, f(max)]);
}

/// The bounds [`put_bounds`] wrote at `p`.
#[inline]
unsafe fn bounds_at(p: *const u8) -> (f32, f32) {
    let [min, max] = (p as *const [f32; 2]).read_unaligned();
    (min, max)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_float<const F: u8>(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]) {
    let size = if F == F32 { 4 } else { 2 };
    assert!(
        panel.len() >= float_bytes::<F>(n, FLOAT_PANEL_ROWS)
            && w.len() >= (FLOAT_PANEL_ROWS - 1) * w_stride + n * size,
        "panel pack: short buffers"
    );
    let mut bounds = (u16::MAX, 0);
    for r in 0..FLOAT_PANEL_ROWS {
        // Row `r` is row `r % 4` of the tile of rows `r / 4`, whose f32s come one after
        // the other.
        let dst = (panel.as_mut_ptr() as *mut f32).add(r / FLOAT_ROWS * FLOAT_ROWS * n);
        let src = w.as_ptr().add(r * w_stride);
        widen_row::<F>(n, src, dst, FLOAT_ROWS, r % FLOAT_ROWS);
        if F == BF16 {
            bounds = bf16_bounds(n, src, bounds);
        }
    }
    if F == BF16 {
        put_bounds(panel.as_mut_ptr().add(FLOAT_PANEL_ROWS * 4 * n), bounds);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn prep_float<const F: u8>(n: usize, act: &[u8], aux: &mut [u8]) {
    let size = if F == F32 { 4 } else { 2 };
    assert!(
        act.len() >= n * size && aux.len() >= float_bytes::<F>(n, 1),
        "panel prep: short rows"
    );
    widen_row::<F>(n, act.as_ptr(), aux.as_mut_ptr() as *mut f32, 1, 0);
    if F == BF16 {
        let bounds = bf16_bounds(n, act.as_ptr(), (u16::MAX, 0));
        put_bounds(aux.as_mut_ptr().add(4 * n), bounds);
    }
}

/// `T` tokens (widened activations `st` bytes apart from `a`) against four rows of a float
/// panel: `out[FLOAT_PANEL_ROWS·k + r]`, each the 16-lane fold of its two halves plus the
/// scalar tail, whose terms are fused as the lanes' are (`FUSED` tiles are F32's, or F16
/// and BF16 ones whose products are exact, where fused and unfused round alike).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float_tile<const T: usize, const FUSED: bool>(
    n: usize,
    panel: *const u8,
    a: *const u8,
    st: usize,
    out: *mut f32,
) {
    let at = |k: usize| out.add(FLOAT_PANEL_ROWS * k);
    let full = n / 16 * 16;
    // Each half of the chunks: 8 f32s per chunk of a token, per row of the panel.
    let (a_half, w_half) = (32 * (full / 16), FLOAT_ROWS * 32 * (full / 16));
    let lo = float_half::<T, FUSED>(full / 16, panel, a, st);
    float_high_half::<T, FUSED>(full / 16, panel.add(w_half), a.add(a_half), st, &lo, out);
    for r in 0..FLOAT_ROWS {
        for k in 0..T {
            let sum = &mut *at(k).add(r);
            for i in full..n {
                let w = f32_at(panel.add(4 * half_slot(n, FLOAT_ROWS, r, i)));
                let x = f32_at(a.add(k * st + 4 * half_slot(n, 1, 0, i)));
                *sum = if FUSED {
                    w.mul_add(x, *sum)
                } else {
                    *sum + w * x
                };
            }
        }
    }
}

/// Eight 8-lane vectors folded as the rest of [`reduce16`] folds one (`+4`, `+2`, `+1`),
/// but together, each step adding two vectors' halves side by side: 7 adds and 14 shuffles
/// for eight sums instead of eight horizontal folds. Lane `p` of the result is the fold
/// of `v[2p]` for `p < 4`, of `v[2p − 7]` above.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn fold8x8(v: [__m256; 8]) -> __m256 {
    // Lanes 0–3 `v[2i]`'s lanes 0–3 plus its lanes 4–7, lanes 4–7 `v[2i + 1]`'s.
    let t: [__m256; 4] = core::array::from_fn(|i| {
        let (x, y) = (v[2 * i], v[2 * i + 1]);
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(x, y),
            _mm256_permute2f128_ps::<0x31>(x, y),
        )
    });
    // 128-bit lane 0 of `u[i]`: `v[4i]`'s two sums (`+2`), then `v[4i + 2]`'s; lane 1 the
    // same of `v[4i + 1]` and `v[4i + 3]`.
    let u: [__m256; 2] = core::array::from_fn(|i| {
        let (x, y) = (_mm256_castps_pd(t[2 * i]), _mm256_castps_pd(t[2 * i + 1]));
        _mm256_add_ps(
            _mm256_castpd_ps(_mm256_unpacklo_pd(x, y)),
            _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)),
        )
    });
    _mm256_add_ps(
        _mm256_shuffle_ps::<0x88>(u[0], u[1]),
        _mm256_shuffle_ps::<0xDD>(u[0], u[1]),
    )
}

/// The low 8-lane half of [`float_tile`]'s sums over `chunks` chunks. Not inlined, nor
/// is [`float_high_half`]: each pass's twelve accumulators then own the registers, where
/// inlined the compiler kept one of the second pass's in memory.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline(never)]
unsafe fn float_half<const T: usize, const FUSED: bool>(
    chunks: usize,
    panel: *const u8,
    a: *const u8,
    st: usize,
) -> [[__m256; T]; FLOAT_ROWS] {
    half_sums::<T, FUSED>(chunks, panel, a, st)
}

/// The high half's sums (`panel` and `a` at the half), added to the low half's `lo` (the
/// first folding step, `l + l+8`) and folded, four rows of `T` tokens to
/// `out[FLOAT_PANEL_ROWS·k + r]`. Folding here saves the high half's trip through memory.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline(never)]
unsafe fn float_high_half<const T: usize, const FUSED: bool>(
    chunks: usize,
    panel: *const u8,
    a: *const u8,
    st: usize,
    lo: &[[__m256; T]; FLOAT_ROWS],
    out: *mut f32,
) {
    let hi = half_sums::<T, FUSED>(chunks, panel, a, st);
    // In order `4k + r`, then the rest of the fold eight results (two tokens' four) at a
    // time, four in the last group when `T` is odd.
    let mut s = [_mm256_setzero_ps(); 12];
    for r in 0..FLOAT_ROWS {
        for k in 0..T {
            s[FLOAT_ROWS * k + r] = _mm256_add_ps(lo[r][k], hi[r][k]);
        }
    }
    for g in (0..FLOAT_ROWS * T).step_by(8) {
        let o = |p: usize| s.get(g + p).copied().unwrap_or(_mm256_setzero_ps());
        let f = fold8x8([o(0), o(4), o(1), o(5), o(2), o(6), o(3), o(7)]);
        let at = out.add(FLOAT_PANEL_ROWS * (g / 4));
        _mm_storeu_ps(at, _mm256_castps256_ps128(f));
        if g + 8 <= FLOAT_ROWS * T {
            _mm_storeu_ps(at.add(FLOAT_PANEL_ROWS), _mm256_extractf128_ps::<1>(f));
        }
    }
}

/// One 8-lane half of [`float_tile`]'s sums over `chunks` chunks (`panel` and `a` at the
/// half), for [`float_half`] and [`float_high_half`].
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
#[allow(clippy::needless_range_loop)] // r and k index the accumulators, rows and tokens
unsafe fn half_sums<const T: usize, const FUSED: bool>(
    chunks: usize,
    panel: *const u8,
    a: *const u8,
    st: usize,
) -> [[__m256; T]; FLOAT_ROWS] {
    // Unfused (BF16 tiles whose products may not be exact), a full tile's sixteen registers
    // are short by one: twelve accumulators, three tokens, the weights and a product. Left
    // to itself the compiler kept an accumulator in memory, whose store and reload then sat
    // in every step's dependency chain (F32 and BF16, then unfused, at 0.6–0.75× llama.cpp).
    // The last token is read by its multiplies instead (a memory operand, four loads a step
    // that the load ports absorb), so the registers suffice.
    let from_memory = !FUSED && T == FLOAT_TOKENS;
    let mut acc = [[_mm256_setzero_ps(); T]; FLOAT_ROWS];
    for c in 0..chunks {
        // Plain loops: a closure here is not always inlined, and one that is not returns
        // its vectors through memory on every step (AVX2 F16 prefill ran at a tenth of its
        // speed that way).
        let mut x = [_mm256_setzero_ps(); T];
        for k in 0..T {
            if !(from_memory && k == T - 1) {
                x[k] = _mm256_loadu_ps(a.add(k * st + 32 * c) as *const f32);
            }
        }
        for r in 0..FLOAT_ROWS {
            let w = _mm256_loadu_ps(panel.add(32 * (c * FLOAT_ROWS + r)) as *const f32);
            for k in 0..T {
                acc[r][k] = if FUSED {
                    _mm256_fmadd_ps(w, x[k], acc[r][k])
                } else if from_memory && k == T - 1 {
                    let product = mul_from_memory(w, a.add(k * st + 32 * c) as *const f32);
                    _mm256_add_ps(acc[r][k], product)
                } else {
                    _mm256_add_ps(acc[r][k], _mm256_mul_ps(w, x[k]))
                };
            }
        }
    }
    acc
}

/// `w · x` for the eight floats `x` at `p`, read by the `vmulps` itself: no register holds
/// `x` (see [`half_sums`]), and the compiler cannot merge the reads into one load.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn mul_from_memory(w: __m256, p: *const f32) -> __m256 {
    let product: __m256;
    // SAFETY: the caller passes 32 readable bytes at `p` (VEX memory operands need no
    // alignment); the instruction only reads them and writes `product`.
    core::arch::asm!(
        "vmulps {product}, {w}, ymmword ptr [{p}]",
        product = lateout(ymm_reg) product,
        w = in(ymm_reg) w,
        p = in(reg) p,
        options(pure, readonly, nostack, preserves_flags),
    );
    product
}

/// The float tiles over `out.len() / 4` tokens. `FUSED`: always fused multiply-adds (F32,
/// whose canonical terms are fused; F16, whose products are exact); else BF16 (`F`) takes
/// them for each tile whose products [`bf16_products_exact`] finds exact, so they round as
/// the multiply-then-add the others keep.
fn float_gemm<const F: u8, const FUSED: bool>(
    n: usize,
    panel: &[u8],
    aux: &[u8],
    aux_stride: usize,
    out: &mut [f32],
) {
    let nt = out.len() / FLOAT_PANEL_ROWS;
    assert!(
        panel.len() >= float_bytes::<F>(n, FLOAT_PANEL_ROWS),
        "panel gemm: short panel"
    );
    if nt > 0 {
        let token = float_bytes::<F>(n, 1);
        assert!(
            aux_stride >= token && aux.len() >= (nt - 1) * aux_stride + token,
            "panel gemm: short side data"
        );
    }
    // SAFETY: the checks above cover the bounds after the panel and after every token.
    let exact = |t: usize| unsafe {
        F == BF16
            && bf16_products_exact(
                bounds_at(panel.as_ptr().add(FLOAT_PANEL_ROWS * 4 * n)),
                bounds_at(aux.as_ptr().add(t * aux_stride + 4 * n)),
            )
    };
    let mut t = 0;
    while t < nt {
        let x = aux[t * aux_stride..].as_ptr();
        let g = (nt - t).min(FLOAT_TOKENS);
        let fused = FUSED || (t..t + g).all(exact);
        // The two tiles of four rows in turn, while the tokens' activations are in L1.
        for half in 0..2 {
            let o = out[FLOAT_PANEL_ROWS * t + FLOAT_ROWS * half..].as_mut_ptr();
            // SAFETY: as above, the panel's second tile of rows starts after the first's f32s.
            let p = unsafe { panel.as_ptr().add(half * FLOAT_ROWS * 4 * n) };
            // SAFETY: reached only through `kernels` (AVX2, FMA, F16C detected); the checks
            // above cover every element the tile reads, and `out` holds `nt` tokens' 8 rows.
            unsafe {
                match (g, fused) {
                    (1, false) => float_tile::<1, false>(n, p, x, aux_stride, o),
                    (2, false) => float_tile::<2, false>(n, p, x, aux_stride, o),
                    (_, false) => float_tile::<FLOAT_TOKENS, false>(n, p, x, aux_stride, o),
                    (1, true) => float_tile::<1, true>(n, p, x, aux_stride, o),
                    (2, true) => float_tile::<2, true>(n, p, x, aux_stride, o),
                    (_, true) => float_tile::<FLOAT_TOKENS, true>(n, p, x, aux_stride, o),
                }
            }
        }
        t += g;
    }
}

macro_rules! float_wrappers {
    ($($pack:ident, $prep:ident, $gemm:ident => $f:ident, $fused:expr;)*) => {
        $(fn $pack(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]) {
            // SAFETY: reached only through `kernels` (AVX2 detected); the pack checks its
            // buffers' lengths.
            unsafe { pack_float::<$f>(n, w, w_stride, panel) }
        }
        fn $prep(n: usize, act: &[u8], aux: &mut [u8]) {
            // SAFETY: as for the pack.
            unsafe { prep_float::<$f>(n, act, aux) }
        }
        // The float tiles read the activations from `aux` (widened by `prep`), not `acts`.
        fn $gemm(
            n: usize, panel: &[u8], _acts: &[u8], _a_stride: usize, aux: &[u8],
            aux_stride: usize, out: &mut [f32],
        ) {
            float_gemm::<$f, { $fused }>(n, panel, aux, aux_stride, out)
        })*
    };
}

// F32's canonical dot is fused; F16 products are exact in f32, so the fused form rounds as
// the scalar mul-then-add; BF16 products are where they stay normal (checked per tile).
float_wrappers! {
    pack_f16, prep_f16, gemm_f16 => F16, true;
    pack_bf16, prep_bf16, gemm_bf16 => BF16, false;
    pack_f32, prep_f32, gemm_f32 => F32, true;
}

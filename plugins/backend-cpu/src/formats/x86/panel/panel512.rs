//! AVX-512 VNNI row-panel kernels for prefill (see [`crate::formats::PanelKernels`]):
//! sixteen weight rows per panel, one row per 32-bit lane of a 512-bit vector.
//!
//! Packing turns every block of the sixteen rows into unsigned byte quants, four
//! consecutive columns per lane (`panel[64·g + 4·r ..]` holds columns `4g .. 4g + 4` of row
//! `r`), followed by the block's per-row scales as lanes. A token then costs one
//! `vpdpbusd` per four columns for all sixteen rows, with its four activation quants
//! broadcast to every lane, and the block's integer sums land in the lanes that need
//! them: no horizontal sums, which is where the two-row tiles spend most of their time.
//! Signed formats are packed with an offset (Q4_0 `q + 8`, Q5_0 `q + 16`, Q8_0 `q + 128`)
//! that comes back exactly as `offset · Σa`, the token's block sum, which `prep` computes
//! once per token. The float terms are the scalar kernel's operations in its order, lane
//! by lane, so each result equals the scalar `vec_dot` bit for bit.
//!
//! The panel is a scratch copy of sixteen rows made once per matmul and used for every
//! token of the prompt; the model itself is never copied. Packing transposes the sixteen
//! rows in registers (`few_rows16::dwords4`: vector `j` of sixteen 16-byte loads is dword
//! `j` of every row), unpacking scales in the lanes: written four bytes at a time, row by
//! row, the packs took a sixth of a prompt's time. The row-at-a-time packs here
//! (`pack_legacy`, `pack_q4_k_imp`, `pack_k16`) are the AVX2 panels'.
//!
//! Not for: BF16 by `vdpbf16ps` (`panel512_bf16`), IQ4 (`panel_iq4`), or choosing between
//! them (`levels`).

use crate::formats::k_quants::{q2_k, q3_k, q4_k, q5_k, q6_k, q8_k, unpack_scale_min_k4, QK_K};
use crate::formats::x86::lanes256::{bits32, f32_at, load, nibbles32, reduce16};
use crate::formats::x86::lanes512::{bytes4, dwords4, f16_pair, k4_scales_mins, spread_byte};
use crate::formats::{q4_0, q4_1, q5_0, q5_1, q8_0, q8_1, PanelKernels};
use core::arch::x86_64::*;
use prima_abi::GgmlType;

/// Weight rows per panel: the lanes of a 512-bit vector of i32.
const ROWS: usize = 16;
/// Tokens per register tile: eight accumulators and eight weight vectors live at once.
const TOKENS: usize = 8;

/// The panel kernels of weight type `t` at this level, if it has them.
pub(in crate::formats) fn kernels(t: GgmlType) -> Option<PanelKernels> {
    use GgmlType as T;
    let legacy = |pack, prep, gemm| PanelKernels {
        rows: ROWS,
        tokens: TOKENS,
        panel_bytes: |n| n / 32 * LEGACY_BLOCK,
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
        T::Q4K => k(|n| n / QK_K * K4_BLOCK, pack_q4_k, gemm_q4_k),
        T::Q5K => k(|n| n / QK_K * K4_BLOCK, pack_q5_k, gemm_q4_k),
        T::Q6K => k(|n| n / QK_K * K6_BLOCK, pack_q6_k, gemm_k16::<Q6K>),
        T::Q3K => k(|n| n / QK_K * K6_BLOCK, pack_q3_k, gemm_k16::<Q3K>),
        T::Q2K => k(|n| n / QK_K * K6_BLOCK, pack_q2_k, gemm_k16::<Q2K>),
        T::F16 => float_kernels(FLOAT_TOKENS, pack_f16, prep_f16, gemm_f16),
        // `levels` takes `panel512_bf16`'s where this CPU has them.
        T::BF16 => float_kernels(FLOAT_TOKENS, pack_bf16, prep_bf16, gemm_bf16),
        T::F32 => float_kernels(FLOAT_TOKENS, pack_f32, prep_f32, gemm_f32),
        _ => return None,
    })
}

/// Writes the 32 quants `q` (column order) of one row's block into the quant area at `dst`
/// of a panel of `L` lanes, lane `r`: eight groups of four columns, `4·L` bytes apart.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn put_quants32<const L: usize>(dst: *mut u8, r: usize, q: __m256i) {
    let mut words = [0u32; 8];
    _mm256_storeu_si256(words.as_mut_ptr() as *mut __m256i, q);
    for (g, w) in words.into_iter().enumerate() {
        (dst.add(4 * L * g + 4 * r) as *mut u32).write_unaligned(w);
    }
}

/// Writes `v` at lane `r` of the `L`-lane vector at `off` of `dst`.
#[inline]
pub(super) fn put_lane<const L: usize>(dst: &mut [u8], off: usize, r: usize, v: [u8; 4]) {
    dst[off + 4 * r..off + 4 * r + 4].copy_from_slice(&v);
}

/// `(lo, hi)` as the two i16 halves of a 32-bit lane.
#[inline]
pub(super) fn i16_pair(lo: i32, hi: i32) -> [u8; 4] {
    (lo as i16 as u16 as u32 | (hi as i16 as u16 as u32) << 16).to_le_bytes()
}

#[inline]
fn put_f32(dst: &mut [u8], off: usize, v: f32) {
    dst[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

#[inline]
fn put_i32(dst: &mut [u8], off: usize, v: i32) {
    dst[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

// ---- 32-element formats: Q4_0, Q5_0, Q8_0 (against Q8_0), Q4_1, Q5_1 (against Q8_1) ----

/// One block of a legacy panel of `L` lanes: 8 groups of 4 columns, then `d` and `m` lanes.
pub(super) const fn legacy_block(l: usize) -> usize {
    10 * 4 * l
}
const LEGACY_BLOCK: usize = legacy_block(ROWS);
const LEGACY_D: usize = 8 * 64;
const LEGACY_M: usize = 9 * 64;

/// Legacy formats, as const parameters of the shared packing and tile code.
pub(super) const Q4_0: u8 = 0;
pub(super) const Q5_0: u8 = 1;
pub(super) const Q8_0: u8 = 2;
pub(super) const Q4_1: u8 = 3;
pub(super) const Q5_1: u8 = 4;
/// Q8_0 packed as stored (signed), for the AVX2 panels' sign trick.
pub(super) const Q8_0_SIGNED: u8 = 5;

/// Block bytes of a legacy format.
const fn legacy_block_bytes(f: u8) -> usize {
    match f {
        Q4_0 => q4_0::BLOCK_BYTES,
        Q5_0 => q5_0::BLOCK_BYTES,
        Q8_0 | Q8_0_SIGNED => q8_0::BLOCK_BYTES,
        Q4_1 => q4_1::BLOCK_BYTES,
        _ => q5_1::BLOCK_BYTES,
    }
}

/// The 32 quants of the block at `b` as unsigned bytes in column order: Q4_0 `q + 8`,
/// Q5_0 `q + 16`, Q8_0 `q + 128`, Q4_1/Q5_1 as stored.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn legacy_quants<const F: u8>(b: *const u8) -> __m256i {
    let fifth = |p: *const u8| _mm256_and_si256(bits32(p), _mm256_set1_epi8(0x10));
    match F {
        Q4_0 => nibbles32(b.add(2)),
        Q5_0 => _mm256_or_si256(nibbles32(b.add(6)), fifth(b.add(2))),
        Q8_0 => _mm256_xor_si256(load(b.add(2)), _mm256_set1_epi8(-128)),
        Q8_0_SIGNED => load(b.add(2)),
        Q4_1 => nibbles32(b.add(4)),
        _ => _mm256_or_si256(nibbles32(b.add(8)), fifth(b.add(4))),
    }
}

/// Packs `L` rows of a legacy format `F` for the AVX2 panels, a row at a time: per block,
/// the quants, `d` and (`_1` formats) `m`. The AVX-512 panels' pack is [`pack_legacy_16`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pack_legacy<const F: u8, const L: usize>(
    n: usize,
    w: &[u8],
    w_stride: usize,
    panel: &mut [u8],
) {
    let (nb, wbb, pb) = (n / 32, legacy_block_bytes(F), legacy_block(L));
    assert!(
        panel.len() >= nb * pb && w.len() >= (L - 1) * w_stride + nb * wbb,
        "panel pack: short buffers"
    );
    for r in 0..L {
        let row = &w[r * w_stride..r * w_stride + nb * wbb];
        for (b, block) in row.chunks_exact(wbb).enumerate() {
            let dst = &mut panel[b * pb..(b + 1) * pb];
            put_quants32::<L>(dst.as_mut_ptr(), r, legacy_quants::<F>(block.as_ptr()));
            let d = crate::formats::f16_at(block, 0);
            let m = if F == Q4_1 || F == Q5_1 {
                crate::formats::f16_at(block, 2)
            } else {
                0.0
            };
            put_lane::<L>(dst, 32 * L, r, d.to_le_bytes());
            put_lane::<L>(dst, 36 * L, r, m.to_le_bytes());
        }
    }
}

/// Packs sixteen rows of a legacy format `F` as [`pack_legacy`] does, transposed in
/// registers ([`dwords4`]: vector `j` of sixteen bytes is dword `j` of every row) rather
/// than written four bytes at a time (measured: 15–18% of a 1B Q4_0 or Q8_0 prompt).
/// Group `g` holds quants `4g .. 4g + 4`: Q4's low nibbles of quant dword `g` (`g < 4`)
/// or high nibbles of dword `g − 4`, Q8_0's dword `g`; Q5's fifth bits are bits
/// `4g .. 4g + 4` of `qh`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pack_legacy_16<const F: u8>(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]) {
    let (nb, wbb) = (n / 32, legacy_block_bytes(F));
    assert!(
        panel.len() >= nb * LEGACY_BLOCK && w.len() >= (ROWS - 1) * w_stride + nb * wbb,
        "panel pack: short buffers"
    );
    let row: [*const u8; ROWS] = core::array::from_fn(|r| w.as_ptr().add(r * w_stride));
    let (low, fifth) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x10));
    // Byte `k` of a dword tests bit `k` (even groups) or `4 + k` (odd) of its byte.
    let bit = [
        _mm512_set1_epi32(0x0804_0201),
        _mm512_set1_epi32(0x8040_2010u32 as i32),
    ];
    // Where the quants and (Q5) `qh` start in a block.
    let (qs, qh_at) = match F {
        Q4_0 | Q8_0 => (2, 0),
        Q5_0 => (6, 2),
        Q4_1 => (4, 0),
        _ => (8, 4),
    };
    for b in 0..nb {
        let off = b * wbb;
        let dst = panel.as_mut_ptr().add(b * LEGACY_BLOCK);
        let quants: [__m512i; 8] = if F == Q8_0 {
            let flip = _mm512_set1_epi8(-128);
            dwords8(&row, off + qs).map(|v| _mm512_xor_si512(v, flip))
        } else {
            let [v0, v1, v2, v3] = dwords4(&row, off + qs);
            let hi = |v: __m512i| _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
            let mut q = [
                _mm512_and_si512(v0, low),
                _mm512_and_si512(v1, low),
                _mm512_and_si512(v2, low),
                _mm512_and_si512(v3, low),
                hi(v0),
                hi(v1),
                hi(v2),
                hi(v3),
            ];
            if F == Q5_0 || F == Q5_1 {
                let qh = dwords4(&row, off + qh_at)[0];
                for (g, v) in q.iter_mut().enumerate() {
                    let set = _mm512_test_epi8_mask(
                        _mm512_shuffle_epi8(qh, spread_byte(g as i32 / 2)),
                        bit[g % 2],
                    );
                    *v = _mm512_or_si512(*v, _mm512_maskz_mov_epi8(set, fifth));
                }
            }
            q
        };
        for (g, v) in quants.into_iter().enumerate() {
            _mm512_storeu_si512(dst.add(64 * g) as *mut _, v);
        }
        // Dword 0 of the block: d, and the `_1` formats' m.
        let (d, m) = f16_pair(dwords4(&row, off)[0]);
        let m = if F == Q4_1 || F == Q5_1 {
            m
        } else {
            _mm512_setzero_ps()
        };
        _mm512_storeu_ps(dst.add(LEGACY_D) as *mut f32, d);
        _mm512_storeu_ps(dst.add(LEGACY_M) as *mut f32, m);
    }
}

macro_rules! pack_wrappers {
    ($($name:ident => $imp:ident::<$($p:tt),*>;)*) => {
        $(fn $name(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]) {
            // SAFETY: reached only through `kernels`, which `dispatch` hands out after
            // detecting AVX-512 (AVX2 included); the pack checks its buffers' lengths.
            unsafe { $imp::<$($p),*>(n, w, w_stride, panel) }
        })*
    };
}

pack_wrappers! {
    pack_q4_0 => pack_legacy_16::<Q4_0>;
    pack_q5_0 => pack_legacy_16::<Q5_0>;
    pack_q8_0 => pack_legacy_16::<Q8_0>;
    pack_q4_1 => pack_legacy_16::<Q4_1>;
    pack_q5_1 => pack_legacy_16::<Q5_1>;
    pack_q4_k => pack_q4_k_16::<Q4K>;
    pack_q5_k => pack_q4_k_16::<Q5K>;
    pack_q6_k => pack_k16_16::<Q6K>;
    pack_q3_k => pack_k16_16::<Q3K>;
    pack_q2_k => pack_k16_16::<Q2K>;
}

/// Per Q8_0 block of the token: `d` as f32 and the sum of its quants.
pub(super) fn prep_q8_0(n: usize, act: &[u8], aux: &mut [u8]) {
    for (ab, x) in act
        .chunks_exact(q8_0::BLOCK_BYTES)
        .zip(aux.chunks_exact_mut(8))
        .take(n / 32)
    {
        put_f32(x, 0, crate::formats::f16_at(ab, 0));
        put_i32(x, 4, ab[2..].iter().map(|&q| q as i8 as i32).sum());
    }
}

/// Per Q8_1 block of the token: `d` and `s` as f32.
pub(super) fn prep_q8_1(n: usize, act: &[u8], aux: &mut [u8]) {
    for (ab, x) in act
        .chunks_exact(q8_1::BLOCK_BYTES)
        .zip(aux.chunks_exact_mut(8))
        .take(n / 32)
    {
        put_f32(x, 0, crate::formats::f16_at(ab, 0));
        put_f32(x, 4, crate::formats::f16_at(ab, 2));
    }
}

/// How a legacy block's integer sum becomes its float term (each the scalar kernel's).
pub(super) const SDD: u8 = 0; // Q4_0, Q5_0: (isum · d) · d_a, isum = acc − offset · Σa
pub(super) const S_DD: u8 = 1; // Q8_0: isum · (d · d_a), isum = acc − 128 · Σa
pub(super) const DDSM: u8 = 2; // Q4_1, Q5_1: (d · d_a) · isum + m · s_a

/// `G` tokens against one legacy panel of `nb` blocks; `out[16k ..]` gets token `k`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn legacy_tile<const G: usize, const KIND: u8>(
    nb: usize,
    panel: *const u8,
    acts: *const u8,
    (a_stride, a_block, q_off): (usize, usize, usize),
    aux: *const u8,
    aux_stride: usize,
    offset: i32,
    out: *mut f32,
) {
    let zero = _mm512_setzero_si512();
    let mut sums = [_mm512_setzero_ps(); G];
    for b in 0..nb {
        let p = panel.add(b * LEGACY_BLOCK);
        let wq: [__m512i; 8] =
            core::array::from_fn(|g| _mm512_loadu_si512(p.add(64 * g) as *const _));
        let d = _mm512_loadu_ps(p.add(LEGACY_D) as *const f32);
        for (k, sum) in sums.iter_mut().enumerate() {
            let a = acts.add(k * a_stride + b * a_block + q_off);
            let x = |g: usize| _mm512_set1_epi32((a.add(4 * g) as *const i32).read_unaligned());
            let mut acc0 = _mm512_dpbusd_epi32(zero, wq[0], x(0));
            let mut acc1 = _mm512_dpbusd_epi32(zero, wq[1], x(1));
            acc0 = _mm512_dpbusd_epi32(acc0, wq[2], x(2));
            acc1 = _mm512_dpbusd_epi32(acc1, wq[3], x(3));
            acc0 = _mm512_dpbusd_epi32(acc0, wq[4], x(4));
            acc1 = _mm512_dpbusd_epi32(acc1, wq[5], x(5));
            acc0 = _mm512_dpbusd_epi32(acc0, wq[6], x(6));
            acc1 = _mm512_dpbusd_epi32(acc1, wq[7], x(7));
            let acc = _mm512_add_epi32(acc0, acc1);
            let ax = aux.add(k * aux_stride + 8 * b);
            let d_a = _mm512_set1_ps(f32_at(ax));
            let term = match KIND {
                SDD | S_DD => {
                    let sa = (ax.add(4) as *const i32).read_unaligned();
                    let isum =
                        _mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_set1_epi32(offset * sa)));
                    if KIND == SDD {
                        _mm512_mul_ps(_mm512_mul_ps(isum, d), d_a)
                    } else {
                        _mm512_mul_ps(isum, _mm512_mul_ps(d, d_a))
                    }
                }
                _ => {
                    let m = _mm512_loadu_ps(p.add(LEGACY_M) as *const f32);
                    let s_a = _mm512_set1_ps(f32_at(ax.add(4)));
                    _mm512_add_ps(
                        _mm512_mul_ps(_mm512_mul_ps(d, d_a), _mm512_cvtepi32_ps(acc)),
                        _mm512_mul_ps(m, s_a),
                    )
                }
            };
            *sum = _mm512_add_ps(*sum, term);
        }
    }
    for (k, sum) in sums.iter().enumerate() {
        _mm512_storeu_ps(out.add(ROWS * k), *sum);
    }
}

/// Checks a gemm call's buffers: `nb` blocks per row of `panel_block` panel bytes,
/// `a_block` activation and `aux_block` side bytes; returns the token count.
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

/// The legacy gemm of one format: `a_block`/`q_off` its activation block size and quant
/// offset, `offset` what packing added to its quants.
#[allow(clippy::too_many_arguments)]
fn legacy_gemm<const KIND: u8>(
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
        LEGACY_BLOCK,
        acts,
        a_stride,
        a_block,
        aux,
        aux_stride,
        8,
        out,
    );
    let shape = (a_stride, a_block, q_off);
    // SAFETY: reached only through `kernels`, handed out after detecting the AVX-512
    // features; `check_gemm` checked that every block the tiles read is in bounds and `out`
    // holds `nt` tokens' 16 lanes.
    unsafe {
        over_tokens!([ROWS, TOKENS] nt, a_stride, aux_stride, acts, aux, out, |g, a, x, o| {
            if g == TOKENS {
                legacy_tile::<TOKENS, KIND>(nb, panel.as_ptr(), a, shape, x, aux_stride, offset, o)
            } else {
                legacy_tile::<1, KIND>(nb, panel.as_ptr(), a, shape, x, aux_stride, offset, o)
            }
        });
    }
}

macro_rules! legacy_gemms {
    ($($name:ident => $kind:expr, $a_block:expr, $q_off:expr, $offset:expr;)*) => {
        $(fn $name(
            n: usize, panel: &[u8], acts: &[u8], a_stride: usize, aux: &[u8],
            aux_stride: usize, out: &mut [f32],
        ) {
            legacy_gemm::<{ $kind }>(
                n, panel, acts, a_stride, aux, aux_stride, out, ($a_block, $q_off, $offset),
            )
        })*
    };
}

legacy_gemms! {
    gemm_q4_0 => SDD, q8_0::BLOCK_BYTES, 2, 8;
    gemm_q5_0 => SDD, q8_0::BLOCK_BYTES, 2, 16;
    gemm_q8_0 => S_DD, q8_0::BLOCK_BYTES, 2, 128;
    gemm_q4_1 => DDSM, q8_1::BLOCK_BYTES, 4, 0;
    gemm_q5_1 => DDSM, q8_1::BLOCK_BYTES, 4, 0;
}

// ---- K-quants against Q8_K ----

/// Side data of one token's Q8_K super-block: `d`, then four lanes' worth of i16 pairs of
/// activation sums (Q4_K: per 32-column sub-block; Q6_K uses the 16 `bsums` directly).
pub(super) const K_AUX: usize = 4 + 4 * 4 + 12;
/// Q4_K panel super-block: 64 groups of quants, 8 sub-block scales, 4 min pairs, d, dmin.
const K4_BLOCK: usize = k4_block(ROWS);
const K4_SCALES: usize = 64 * 64;
const K4_MINS: usize = K4_SCALES + 8 * 64;
const K4_D: usize = K4_MINS + 4 * 64;
const K4_DMIN: usize = K4_D + 64;

pub(super) fn prep_q8_k(n: usize, act: &[u8], aux: &mut [u8]) {
    for (ab, x) in act
        .chunks_exact(q8_k::BLOCK_BYTES)
        .zip(aux.chunks_exact_mut(K_AUX))
        .take(n / QK_K)
    {
        put_f32(x, 0, q8_k::d(ab));
        // Sub-block sums, two per lane as i16 (|Σ| ≤ 32·128 fits).
        for j in 0..4 {
            let sb = |s: usize| (q8_k::bsum(ab, 2 * s) + q8_k::bsum(ab, 2 * s + 1)) as i16 as u16;
            let pair = sb(2 * j) as u32 | (sb(2 * j + 1) as u32) << 16;
            x[4 + 4 * j..8 + 4 * j].copy_from_slice(&pair.to_le_bytes());
        }
    }
}

/// Bytes of a Q4_K panel super-block of `L` lanes: 64 quant groups, 8 scales, 4 min
/// pairs, d, dmin.
pub(super) const fn k4_block(l: usize) -> usize {
    78 * 4 * l
}

/// K-quant formats, as const parameters of the shared packing and tile code.
pub(super) const Q4K: u8 = 0;
pub(super) const Q5K: u8 = 1;
pub(super) const Q6K: u8 = 2;
pub(super) const Q3K: u8 = 3;
pub(super) const Q2K: u8 = 4;

/// Packs `L` Q4_K (or, `F = Q5K`, Q5_K) rows for the AVX2 panels (`panel256`), a row at a
/// time: sub-block scales as the i16 pair `(s, s)` (for `vpmaddwd` against i16 partial
/// sums). The AVX-512 panels' pack is [`pack_q4_k_16`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pack_q4_k_imp<const L: usize, const F: u8>(
    n: usize,
    w: &[u8],
    w_stride: usize,
    panel: &mut [u8],
) {
    let wbb = if F == Q5K {
        q5_k::BLOCK_BYTES
    } else {
        q4_k::BLOCK_BYTES
    };
    let (nb, pb) = (n / QK_K, k4_block(L));
    assert!(
        panel.len() >= nb * pb && w.len() >= (L - 1) * w_stride + nb * wbb,
        "panel pack: short buffers"
    );
    let (scales, mins, d) = (64 * 4 * L, 72 * 4 * L, 76 * 4 * L);
    for r in 0..L {
        let row = &w[r * w_stride..r * w_stride + nb * wbb];
        for (b, wb) in row.chunks_exact(wbb).enumerate() {
            let dst = &mut panel[b * pb..(b + 1) * pb];
            let (sc, mn) = unpack_scale_min_k4(&wb[4..16]);
            if F == Q5K {
                // As Q4_K's nibbles below, each with its fifth bit: bit s of the 32 qh bytes
                // for sub-block s (quant i's byte i % 32), moved to bit 4.
                let qh = load(wb.as_ptr().add(q5_k::QH));
                let low = _mm256_set1_epi8(0x0F);
                let one = _mm256_set1_epi8(1);
                let fifth = |s: i32| {
                    let bit = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s));
                    _mm256_slli_epi16::<4>(_mm256_and_si256(bit, one))
                };
                for c in 0..4 {
                    let q = load(wb.as_ptr().add(q5_k::QS + 32 * c));
                    let lo = _mm256_or_si256(_mm256_and_si256(q, low), fifth(2 * c as i32));
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), low);
                    let hi = _mm256_or_si256(hi, fifth(2 * c as i32 + 1));
                    put_quants32::<L>(dst.as_mut_ptr().add(4 * L * 8 * (2 * c)), r, lo);
                    put_quants32::<L>(dst.as_mut_ptr().add(4 * L * 8 * (2 * c + 1)), r, hi);
                }
            } else {
                for c in 0..4 {
                    // 32 bytes of quants at 16 + 32c of the 144-byte block: sub-blocks 2c
                    // (low nibbles) and 2c + 1 (high nibbles), eight groups each.
                    let q = load(wb.as_ptr().add(16 + 32 * c));
                    let low = _mm256_set1_epi8(0x0F);
                    let lo = _mm256_and_si256(q, low);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
                    put_quants32::<L>(dst.as_mut_ptr().add(4 * L * 8 * (2 * c)), r, lo);
                    put_quants32::<L>(dst.as_mut_ptr().add(4 * L * 8 * (2 * c + 1)), r, hi);
                }
            }
            for (s, &v) in sc.iter().enumerate() {
                put_lane::<L>(dst, scales + 4 * L * s, r, i16_pair(v as i32, v as i32));
            }
            for j in 0..4 {
                let pair = i16_pair(mn[2 * j] as i32, mn[2 * j + 1] as i32);
                put_lane::<L>(dst, mins + 4 * L * j, r, pair);
            }
            put_lane::<L>(dst, d, r, crate::formats::f16_at(wb, 0).to_le_bytes());
            put_lane::<L>(
                dst,
                d + 4 * L,
                r,
                crate::formats::f16_at(wb, 2).to_le_bytes(),
            );
        }
    }
}

/// Packs sixteen Q4_K (or, `F = Q5K`, Q5_K) rows as [`pack_q4_k_imp`] does, with their
/// bytes transposed in registers ([`dwords4`]: vector `j` of sixteen bytes is dword `j` of
/// every row) rather than written four bytes at a time: the quant groups, the scales and
/// mins unpacked in the lanes (as `kdec16` does), `d` and `dmin` as f32 lanes. The scalar
/// stores took a sixth of a Q5_K_M prompt's time.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pack_q4_k_16<const F: u8>(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]) {
    let (wbb, qs) = if F == Q5K {
        (q5_k::BLOCK_BYTES, q5_k::QS)
    } else {
        (q4_k::BLOCK_BYTES, 16)
    };
    let nb = n / QK_K;
    assert!(
        panel.len() >= nb * K4_BLOCK && w.len() >= (ROWS - 1) * w_stride + nb * wbb,
        "panel pack: short buffers"
    );
    let row: [*const u8; ROWS] = core::array::from_fn(|r| w.as_ptr().add(r * w_stride));
    let (low, one) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(1));
    let (byte0, byte1) = (_mm512_set1_epi32(0xFF), _mm512_set1_epi32(0xFF00));
    for b in 0..nb {
        let off = b * wbb;
        let dst = panel.as_mut_ptr().add(b * K4_BLOCK);
        let put = |at: usize, v: __m512i| _mm512_storeu_si512(dst.add(at) as *mut _, v);
        // Dword 0: d, dmin; dwords 1 ..= 3: the 12 scale bytes (`unpack_scale_min_k4`).
        let [dm, s1, s2, s3] = dwords4(&row, off);
        let [sc_lo, sc_hi, mn_lo, mn_hi] = k4_scales_mins(s1, s2, s3);
        for (h, sc) in [sc_lo, sc_hi].into_iter().enumerate() {
            for (j, v) in bytes4(sc).into_iter().enumerate() {
                put(K4_SCALES + 64 * (4 * h + j), v);
            }
        }
        // Min pairs (m_2j, m_2j+1): bytes 0, 1 and 2, 3 of a dword as i16 halves.
        let pairs = |m: __m512i| {
            let hi = _mm512_srli_epi32::<16>(m);
            [
                _mm512_or_si512(
                    _mm512_and_si512(m, byte0),
                    _mm512_slli_epi32::<8>(_mm512_and_si512(m, byte1)),
                ),
                _mm512_or_si512(
                    _mm512_and_si512(hi, byte0),
                    _mm512_slli_epi32::<8>(_mm512_and_si512(hi, byte1)),
                ),
            ]
        };
        let [p0, p1] = pairs(mn_lo);
        let [p2, p3] = pairs(mn_hi);
        for (j, v) in [p0, p1, p2, p3].into_iter().enumerate() {
            put(K4_MINS + 64 * j, v);
        }
        let (d, dmin) = f16_pair(dm);
        _mm512_storeu_ps(dst.add(K4_D) as *mut f32, d);
        _mm512_storeu_ps(dst.add(K4_DMIN) as *mut f32, dmin);
        // Q5_K's fifth bits: dword g of `qh`, bit s of each byte for sub-block s.
        let qh = if F == Q5K {
            let [a0, a1, a2, a3] = dwords4(&row, off + q5_k::QH);
            let [a4, a5, a6, a7] = dwords4(&row, off + q5_k::QH + 16);
            [a0, a1, a2, a3, a4, a5, a6, a7]
        } else {
            [_mm512_setzero_si512(); 8]
        };
        let fifth = |g: usize, s: usize| {
            let bit = _mm512_srl_epi16(qh[g], _mm_cvtsi32_si128(s as i32));
            _mm512_slli_epi16::<4>(_mm512_and_si512(bit, one))
        };
        for c in 0..4 {
            // Bytes 32c .. 32c + 32 of the quants: dword g's low nibbles are group g of
            // sub-block 2c, its high nibbles group g of 2c + 1.
            for h in 0..2 {
                let v = dwords4(&row, off + qs + 32 * c + 16 * h);
                for (j, q) in v.into_iter().enumerate() {
                    let g = 4 * h + j;
                    let mut lo = _mm512_and_si512(q, low);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), low);
                    if F == Q5K {
                        lo = _mm512_or_si512(lo, fifth(g, 2 * c));
                        hi = _mm512_or_si512(hi, fifth(g, 2 * c + 1));
                    }
                    put(64 * (8 * (2 * c) + g), lo);
                    put(64 * (8 * (2 * c + 1) + g), hi);
                }
            }
        }
    }
}

/// The integer sums of `G` tokens against one super-block `p` of a panel laid out as
/// Q4_K's (64 groups of four columns, then eight sub-block scales as i32 lanes at
/// `scales`): per 32-column sub-block, `Σ q·a` by `vpdpbusd` times the lane's scale.
/// Q4_K's, Q5_K's and IQ4_XS's tiles (`panel_iq4`) share it.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn scaled_sub_block_sums<const G: usize>(
    p: *const u8,
    scales: usize,
    acts: *const u8,
    a_stride: usize,
    b: usize,
) -> [__m512i; G] {
    let zero = _mm512_setzero_si512();
    let mut isums = [zero; G];
    for s in 0..8 {
        let wq: [__m512i; 8] =
            core::array::from_fn(|g| _mm512_loadu_si512(p.add(64 * (8 * s + g)) as *const _));
        let sc = _mm512_loadu_si512(p.add(scales + 64 * s) as *const _);
        for (k, isum) in isums.iter_mut().enumerate() {
            let a = acts.add(k * a_stride + b * q8_k::BLOCK_BYTES + q8_k::QS + 32 * s);
            let x = |g: usize| _mm512_set1_epi32((a.add(4 * g) as *const i32).read_unaligned());
            let mut acc0 = _mm512_dpbusd_epi32(zero, wq[0], x(0));
            let mut acc1 = _mm512_dpbusd_epi32(zero, wq[1], x(1));
            acc0 = _mm512_dpbusd_epi32(acc0, wq[2], x(2));
            acc1 = _mm512_dpbusd_epi32(acc1, wq[3], x(3));
            acc0 = _mm512_dpbusd_epi32(acc0, wq[4], x(4));
            acc1 = _mm512_dpbusd_epi32(acc1, wq[5], x(5));
            acc0 = _mm512_dpbusd_epi32(acc0, wq[6], x(6));
            acc1 = _mm512_dpbusd_epi32(acc1, wq[7], x(7));
            let acc = _mm512_add_epi32(acc0, acc1);
            *isum = _mm512_add_epi32(*isum, _mm512_mullo_epi32(acc, sc));
        }
    }
    isums
}

/// `G` tokens against a Q4_K panel: per sub-block, `Σ q·a` by `vpdpbusd` times the lane's
/// scale; the mins by `vpdpwssd` of the lane's min pairs and the token's sub-block sums.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q4_k_tile<const G: usize>(
    nb: usize,
    panel: *const u8,
    acts: *const u8,
    a_stride: usize,
    aux: *const u8,
    aux_stride: usize,
    out: *mut f32,
) {
    let zero = _mm512_setzero_si512();
    let mut sums = [_mm512_setzero_ps(); G];
    for b in 0..nb {
        let p = panel.add(b * K4_BLOCK);
        let isums = scaled_sub_block_sums::<G>(p, K4_SCALES, acts, a_stride, b);
        let mins: [__m512i; 4] =
            core::array::from_fn(|j| _mm512_loadu_si512(p.add(K4_MINS + 64 * j) as *const _));
        let d = _mm512_loadu_ps(p.add(K4_D) as *const f32);
        let dmin = _mm512_loadu_ps(p.add(K4_DMIN) as *const f32);
        for (k, sum) in sums.iter_mut().enumerate() {
            let ax = aux.add(k * aux_stride + b * K_AUX);
            let pair =
                |j: usize| _mm512_set1_epi32((ax.add(4 + 4 * j) as *const i32).read_unaligned());
            let mut msum = _mm512_dpwssd_epi32(zero, mins[0], pair(0));
            msum = _mm512_dpwssd_epi32(msum, mins[1], pair(1));
            msum = _mm512_dpwssd_epi32(msum, mins[2], pair(2));
            msum = _mm512_dpwssd_epi32(msum, mins[3], pair(3));
            let d_a = _mm512_set1_ps(f32_at(ax));
            let term = _mm512_sub_ps(
                _mm512_mul_ps(_mm512_mul_ps(d_a, d), _mm512_cvtepi32_ps(isums[k])),
                _mm512_mul_ps(_mm512_mul_ps(d_a, dmin), _mm512_cvtepi32_ps(msum)),
            );
            *sum = _mm512_add_ps(*sum, term);
        }
    }
    for (k, sum) in sums.iter().enumerate() {
        _mm512_storeu_ps(out.add(ROWS * k), *sum);
    }
}

fn gemm_q4_k(
    n: usize,
    panel: &[u8],
    acts: &[u8],
    a_stride: usize,
    aux: &[u8],
    aux_stride: usize,
    out: &mut [f32],
) {
    let nb = n / QK_K;
    let nt = check_gemm(
        nb,
        panel,
        K4_BLOCK,
        acts,
        a_stride,
        q8_k::BLOCK_BYTES,
        aux,
        aux_stride,
        K_AUX,
        out,
    );
    // SAFETY: as in `legacy_gemm`.
    unsafe {
        over_tokens!([ROWS, TOKENS] nt, a_stride, aux_stride, acts, aux, out, |g, a, x, o| {
            if g == TOKENS {
                q4_k_tile::<TOKENS>(nb, panel.as_ptr(), a, a_stride, x, aux_stride, o)
            } else {
                q4_k_tile::<1>(nb, panel.as_ptr(), a, a_stride, x, aux_stride, o)
            }
        });
    }
}

/// Q6_K panel super-block: 64 groups of unsigned 6-bit quants, 16 group scales as i32
/// lanes, 8 scale pairs as i16 lanes (for the −32 offset), d.
const K6_BLOCK: usize = k6_block(ROWS);
const K6_SCALES: usize = 64 * 64;
const K6_PAIRS: usize = K6_SCALES + 16 * 64;
const K6_D: usize = K6_PAIRS + 8 * 64;

/// Bytes of a 16-group K-quant panel super-block (Q6_K, Q3_K, Q2_K) of `L` lanes: 64
/// quant groups, 16 group scales, 8 i16 pairs (Q6_K/Q3_K: the scales, for the offset;
/// Q2_K: the mins), d, dmin.
pub(super) const fn k6_block(l: usize) -> usize {
    90 * 4 * l
}

/// Packs `L` rows of a 16-group K-quant `F` (Q6K, Q3K, Q2K) as unsigned quants (Q6_K
/// `q + 32`, Q3_K `q + 4`, Q2_K as stored) for the AVX2 panels, a row at a time: group
/// scales as the i16 pair `(s, s)`. The AVX-512 panels' pack is [`pack_k16_16`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pack_k16<const L: usize, const F: u8>(
    n: usize,
    w: &[u8],
    w_stride: usize,
    panel: &mut [u8],
) {
    let wbb = match F {
        Q6K => q6_k::BLOCK_BYTES,
        Q3K => q3_k::BLOCK_BYTES,
        _ => q2_k::BLOCK_BYTES,
    };
    let (nb, pb) = (n / QK_K, k6_block(L));
    assert!(
        panel.len() >= nb * pb && w.len() >= (L - 1) * w_stride + nb * wbb,
        "panel pack: short buffers"
    );
    let (scales, pairs, d) = (64 * 4 * L, 80 * 4 * L, 88 * 4 * L);
    for r in 0..L {
        let row = &w[r * w_stride..r * w_stride + nb * wbb];
        for (b, wb) in row.chunks_exact(wbb).enumerate() {
            let dst = &mut panel[b * pb..(b + 1) * pb];
            for c in 0..8 {
                // Elements 32c .. 32c + 32 (eight groups): 128h + 32s + l for Q2_K/Q3_K,
                // 128h + r for Q6_K.
                let (h, s) = (c / 4, c % 4);
                let shift =
                    |v: __m256i, by: usize| _mm256_srl_epi16(v, _mm_cvtsi32_si128(by as i32));
                let bits = |v: __m256i, by: usize, mask: i8| {
                    _mm256_and_si256(shift(v, by), _mm256_set1_epi8(mask))
                };
                let p = wb.as_ptr();
                let q = match F {
                    Q6K => {
                        let low = bits(load(p.add(64 * h + 32 * (s % 2))), 4 * (s / 2), 0x0F);
                        let high = bits(load(p.add(q6_k::QH + 32 * h)), 2 * s, 0x03);
                        _mm256_or_si256(low, _mm256_slli_epi16(high, 4))
                    }
                    Q3K => {
                        let low = bits(load(p.add(q3_k::QS + 32 * h)), 2 * s, 0x03);
                        let high = bits(load(p), 4 * h + s, 0x01);
                        _mm256_or_si256(low, _mm256_slli_epi16(high, 2))
                    }
                    _ => bits(load(p.add(q2_k::QS + 32 * h)), 2 * s, 0x03),
                };
                put_quants32::<L>(dst.as_mut_ptr().add(4 * L * 8 * c), r, q);
            }
            let q3 = if F == Q3K { q3_k::scales(wb) } else { [0; 16] };
            // Group `g`'s scale, and what its pair lane holds (the scale, or Q2_K's min).
            let sc = |g: usize| match F {
                Q6K => q6_k::scale(wb, g),
                Q3K => q3[g],
                _ => (wb[g] & 0x0F) as i32,
            };
            let pair_of = |g: usize| match F {
                Q2K => (wb[g] >> 4) as i32,
                _ => sc(g),
            };
            for g in 0..16 {
                let s = sc(g);
                put_lane::<L>(dst, scales + 4 * L * g, r, i16_pair(s, s));
            }
            for j in 0..8 {
                let pair = i16_pair(pair_of(2 * j), pair_of(2 * j + 1));
                put_lane::<L>(dst, pairs + 4 * L * j, r, pair);
            }
            let (dv, dmin) = match F {
                Q6K => (crate::formats::f16_at(wb, q6_k::D), 0.0),
                Q3K => (crate::formats::f16_at(wb, q3_k::D), 0.0),
                _ => (
                    crate::formats::f16_at(wb, q2_k::D),
                    crate::formats::f16_at(wb, q2_k::D + 2),
                ),
            };
            put_lane::<L>(dst, d, r, dv.to_le_bytes());
            put_lane::<L>(dst, d + 4 * L, r, dmin.to_le_bytes());
        }
    }
}

/// Dwords `0 ..= 7` of the 32 bytes at `off` of each of sixteen rows, transposed: lane
/// `r` of vector `j` is row `r`'s dword `j`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn dwords8(row: &[*const u8; ROWS], off: usize) -> [__m512i; 8] {
    let [a0, a1, a2, a3] = dwords4(row, off);
    let [a4, a5, a6, a7] = dwords4(row, off + 16);
    [a0, a1, a2, a3, a4, a5, a6, a7]
}

/// Packs sixteen rows of a 16-group K-quant `F` as [`pack_k16`] does, the quants
/// transposed in registers ([`dwords8`]): each quant is a function of bytes at the same
/// index of its sources, so the byte operations commute with the transpose. Q6_K's and
/// Q2_K's scales are unpacked in the lanes too; Q3_K's twelve-byte scale packing is
/// unpacked row by row.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pack_k16_16<const F: u8>(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]) {
    let wbb = match F {
        Q6K => q6_k::BLOCK_BYTES,
        Q3K => q3_k::BLOCK_BYTES,
        _ => q2_k::BLOCK_BYTES,
    };
    let nb = n / QK_K;
    assert!(
        panel.len() >= nb * K6_BLOCK && w.len() >= (ROWS - 1) * w_stride + nb * wbb,
        "panel pack: short buffers"
    );
    let row: [*const u8; ROWS] = core::array::from_fn(|r| w.as_ptr().add(r * w_stride));
    let bits = |v: __m512i, by: usize, mask: i8| {
        _mm512_and_si512(
            _mm512_srl_epi16(v, _mm_cvtsi32_si128(by as i32)),
            _mm512_set1_epi8(mask),
        )
    };
    let low16 = _mm512_set1_epi32(0xFFFF);
    for b in 0..nb {
        let off = b * wbb;
        let dst = panel.as_mut_ptr().add(b * K6_BLOCK);
        let put = |at: usize, v: __m512i| _mm512_storeu_si512(dst.add(at) as *mut _, v);
        // Group c (elements 32c .. 32c + 32) is 128h + 32s + l for Q2_K/Q3_K, 128h + l for
        // Q6_K's, h = c / 4, s = c % 4.
        for h in 0..2 {
            match F {
                Q6K => {
                    let qh = dwords8(&row, off + q6_k::QH + 32 * h);
                    for half in 0..2 {
                        let ql = dwords8(&row, off + 64 * h + 32 * half);
                        for s in [half, half + 2] {
                            for g in 0..8 {
                                let q = _mm512_or_si512(
                                    bits(ql[g], 4 * (s / 2), 0x0F),
                                    _mm512_slli_epi16::<4>(bits(qh[g], 2 * s, 0x03)),
                                );
                                put(64 * (8 * (4 * h + s) + g), q);
                            }
                        }
                    }
                }
                Q3K => {
                    let (qs, hm) = (dwords8(&row, off + q3_k::QS + 32 * h), dwords8(&row, off));
                    for s in 0..4 {
                        for g in 0..8 {
                            let q = _mm512_or_si512(
                                bits(qs[g], 2 * s, 0x03),
                                _mm512_slli_epi16::<2>(bits(hm[g], 4 * h + s, 0x01)),
                            );
                            put(64 * (8 * (4 * h + s) + g), q);
                        }
                    }
                }
                _ => {
                    let qs = dwords8(&row, off + q2_k::QS + 32 * h);
                    for s in 0..4 {
                        for (g, &q) in qs.iter().enumerate() {
                            put(64 * (8 * (4 * h + s) + g), bits(q, 2 * s, 0x03));
                        }
                    }
                }
            }
        }
        // The 16 group scales as i32 lanes and the pair lanes (scales, or Q2_K's mins).
        let (sc, pair_of): ([__m512i; 16], [__m512i; 16]) = match F {
            Q6K => {
                let v = dwords4(&row, off + q6_k::SCALES);
                let sc = core::array::from_fn(|g| {
                    let shifted =
                        _mm512_sll_epi32(v[g / 4], _mm_cvtsi32_si128(24 - 8 * (g % 4) as i32));
                    _mm512_srai_epi32::<24>(shifted)
                });
                (sc, sc)
            }
            Q3K => {
                let mut lanes = [[0i32; ROWS]; 16];
                for (r, p) in row.iter().enumerate() {
                    let block = core::slice::from_raw_parts(p.add(off), wbb);
                    for (g, v) in q3_k::scales(block).into_iter().enumerate() {
                        lanes[g][r] = v;
                    }
                }
                let sc = lanes.map(|l| _mm512_loadu_si512(l.as_ptr() as *const _));
                (sc, sc)
            }
            _ => {
                let v = dwords4(&row, off);
                let nib = |g: usize, hi: i32| {
                    let by = _mm_cvtsi32_si128(8 * (g % 4) as i32 + hi);
                    _mm512_and_si512(_mm512_srl_epi32(v[g / 4], by), _mm512_set1_epi32(0x0F))
                };
                (
                    core::array::from_fn(|g| nib(g, 0)),
                    core::array::from_fn(|g| nib(g, 4)),
                )
            }
        };
        for (g, v) in sc.into_iter().enumerate() {
            put(K6_SCALES + 64 * g, v);
        }
        for j in 0..8 {
            let lo = _mm512_and_si512(pair_of[2 * j], low16);
            put(
                K6_PAIRS + 64 * j,
                _mm512_or_si512(lo, _mm512_slli_epi32::<16>(pair_of[2 * j + 1])),
            );
        }
        // The 16 bytes ending at the block's end hold d (and Q2_K's dmin) in dword 3, read
        // there so that no row is read past its last block.
        let tail = dwords4(&row, off + wbb - 16)[3];
        let (d, dmin) = match F {
            Q2K => f16_pair(tail),
            _ => (f16_pair(tail).1, _mm512_setzero_ps()),
        };
        _mm512_storeu_ps(dst.add(K6_D) as *mut f32, d);
        _mm512_storeu_ps(dst.add(K6_D + 64) as *mut f32, dmin);
    }
}

/// `G` tokens against a 16-group panel (`F`: Q6K, Q3K, Q2K): per 16-column group,
/// `Σ u·a` times the lane's scale; the pairs (scales or mins) against the bsums by
/// `vpdpwssd`, which give Q6_K's `32 · Σ scale·bsum` and Q3_K's `4 · Σ scale·bsum` offsets
/// and Q2_K's min sum.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::needless_range_loop)] // j indexes the pairs and the bsum words alike
unsafe fn k16_tile<const G: usize, const F: u8>(
    nb: usize,
    panel: *const u8,
    acts: *const u8,
    a_stride: usize,
    aux: *const u8,
    aux_stride: usize,
    out: *mut f32,
) {
    let zero = _mm512_setzero_si512();
    let mut sums = [_mm512_setzero_ps(); G];
    for b in 0..nb {
        let p = panel.add(b * K6_BLOCK);
        let mut isums = [zero; G];
        for h in 0..8 {
            // Two 16-column groups (8 lane groups) per step.
            let wq: [__m512i; 8] =
                core::array::from_fn(|g| _mm512_loadu_si512(p.add(64 * (8 * h + g)) as *const _));
            let sc0 = _mm512_loadu_si512(p.add(K6_SCALES + 64 * (2 * h)) as *const _);
            let sc1 = _mm512_loadu_si512(p.add(K6_SCALES + 64 * (2 * h + 1)) as *const _);
            for (k, isum) in isums.iter_mut().enumerate() {
                let a = acts.add(k * a_stride + b * q8_k::BLOCK_BYTES + q8_k::QS + 32 * h);
                let x = |g: usize| _mm512_set1_epi32((a.add(4 * g) as *const i32).read_unaligned());
                let mut acc0 = _mm512_dpbusd_epi32(zero, wq[0], x(0));
                let mut acc1 = _mm512_dpbusd_epi32(zero, wq[4], x(4));
                acc0 = _mm512_dpbusd_epi32(acc0, wq[1], x(1));
                acc1 = _mm512_dpbusd_epi32(acc1, wq[5], x(5));
                acc0 = _mm512_dpbusd_epi32(acc0, wq[2], x(2));
                acc1 = _mm512_dpbusd_epi32(acc1, wq[6], x(6));
                acc0 = _mm512_dpbusd_epi32(acc0, wq[3], x(3));
                acc1 = _mm512_dpbusd_epi32(acc1, wq[7], x(7));
                *isum = _mm512_add_epi32(*isum, _mm512_mullo_epi32(acc0, sc0));
                *isum = _mm512_add_epi32(*isum, _mm512_mullo_epi32(acc1, sc1));
            }
        }
        let pairs: [__m512i; 8] =
            core::array::from_fn(|j| _mm512_loadu_si512(p.add(K6_PAIRS + 64 * j) as *const _));
        let d = _mm512_loadu_ps(p.add(K6_D) as *const f32);
        for (k, sum) in sums.iter_mut().enumerate() {
            let ab = acts.add(k * a_stride + b * q8_k::BLOCK_BYTES);
            let bs = |j: usize| {
                _mm512_set1_epi32((ab.add(q8_k::BSUMS + 4 * j) as *const i32).read_unaligned())
            };
            let mut off = _mm512_dpwssd_epi32(zero, pairs[0], bs(0));
            for j in 1..8 {
                off = _mm512_dpwssd_epi32(off, pairs[j], bs(j));
            }
            let d_a = _mm512_set1_ps(f32_at(aux.add(k * aux_stride + b * K_AUX)));
            let term = match F {
                Q2K => {
                    let dmin = _mm512_loadu_ps(p.add(K6_D + 64) as *const f32);
                    _mm512_sub_ps(
                        _mm512_mul_ps(_mm512_mul_ps(d_a, d), _mm512_cvtepi32_ps(isums[k])),
                        _mm512_mul_ps(_mm512_mul_ps(d_a, dmin), _mm512_cvtepi32_ps(off)),
                    )
                }
                _ => {
                    let shift = if F == Q6K { 5 } else { 2 };
                    let offset = _mm512_sllv_epi32(off, _mm512_set1_epi32(shift));
                    let isum = _mm512_sub_epi32(isums[k], offset);
                    _mm512_mul_ps(_mm512_mul_ps(d_a, d), _mm512_cvtepi32_ps(isum))
                }
            };
            *sum = _mm512_add_ps(*sum, term);
        }
    }
    for (k, sum) in sums.iter().enumerate() {
        _mm512_storeu_ps(out.add(ROWS * k), *sum);
    }
}

fn gemm_k16<const F: u8>(
    n: usize,
    panel: &[u8],
    acts: &[u8],
    a_stride: usize,
    aux: &[u8],
    aux_stride: usize,
    out: &mut [f32],
) {
    let nb = n / QK_K;
    let nt = check_gemm(
        nb,
        panel,
        K6_BLOCK,
        acts,
        a_stride,
        q8_k::BLOCK_BYTES,
        aux,
        aux_stride,
        K_AUX,
        out,
    );
    // SAFETY: as in `legacy_gemm`.
    unsafe {
        over_tokens!([ROWS, TOKENS] nt, a_stride, aux_stride, acts, aux, out, |g, a, x, o| {
            if g == TOKENS {
                k16_tile::<TOKENS, F>(nb, panel.as_ptr(), a, a_stride, x, aux_stride, o)
            } else {
                k16_tile::<1, F>(nb, panel.as_ptr(), a, a_stride, x, aux_stride, o)
            }
        });
    }
}

// ---- F16, BF16, F32: four rows × four tokens of 16-lane accumulators ----
//
// The float dot's lanes are fixed (element `i` in lane `i % 16`, folded by halving, see
// `formats::float`), so here the lanes stay element lanes and the panel only saves work:
// its four rows are widened to f32 once (and each token's activations once, in `prep`)
// for all tokens, and each loaded vector feeds four accumulators. F32's canonical terms
// are fused multiply-adds; F16 products are exact in f32, so a fused multiply-add rounds
// like F16's scalar multiply-then-add; BF16 products may not be (underflow, overflow), so
// this fallback of `panel512_bf16` keeps the separate add.

pub(super) const FLOAT_ROWS: usize = 4;
const FLOAT_TOKENS: usize = 4;

/// Element formats, as const parameters.
pub(super) const F32: u8 = 0;
pub(super) const F16: u8 = 1;
pub(super) const BF16: u8 = 2;

pub(super) fn float_kernels(
    tokens: usize,
    pack: fn(usize, &[u8], usize, &mut [u8]),
    prep: fn(usize, &[u8], &mut [u8]),
    gemm: crate::formats::PanelGemmFn,
) -> PanelKernels {
    PanelKernels {
        rows: FLOAT_ROWS,
        tokens,
        panel_bytes: |n| FLOAT_ROWS * 4 * n,
        pack,
        aux_bytes: |n| 4 * n,
        prep,
        gemm,
        reads_acts: false,
    }
}

/// Element `i` of a row of format `F` at `p`, as f32 (exact).
#[inline]
pub(super) unsafe fn element<const F: u8>(p: *const u8, i: usize) -> f32 {
    match F {
        F32 => f32_at(p.add(4 * i)),
        F16 => half::f16::from_bits((p.add(2 * i) as *const u16).read_unaligned()).to_f32(),
        _ => f32::from_bits(((p.add(2 * i) as *const u16).read_unaligned() as u32) << 16),
    }
}

/// Where element `i` of row `r` goes in a float panel: 16-element chunks of the four rows
/// interleaved (`[chunk][row][16]`), then each row's `n % 16` tail.
#[inline]
pub(super) fn float_slot(n: usize, r: usize, i: usize) -> usize {
    let full = n / 16 * 16;
    if i < full {
        (i / 16 * FLOAT_ROWS + r) * 16 + i % 16
    } else {
        FLOAT_ROWS * full + r * (n - full) + (i - full)
    }
}

/// Sixteen elements of format `F` at `p`, widened to f32 (exact).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn widen16<const F: u8>(p: *const u8) -> __m512 {
    match F {
        F32 => _mm512_loadu_ps(p as *const f32),
        F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)),
        _ => {
            let bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
            _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16))
        }
    }
}

/// Widens `n` elements of format `F` at `src` to f32s at `dst`, 16 at a time with
/// `slot(i)` the f32 index of element `i` (16-element runs stay contiguous).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn widen_row<const F: u8>(
    n: usize,
    src: *const u8,
    dst: *mut f32,
    slot: impl Fn(usize) -> usize,
) {
    let size = if F == F32 { 4 } else { 2 };
    let full = n / 16 * 16;
    for i in (0..full).step_by(16) {
        _mm512_storeu_ps(dst.add(slot(i)), widen16::<F>(src.add(size * i)));
    }
    for i in full..n {
        dst.add(slot(i)).write_unaligned(element::<F>(src, i));
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pack_float<const F: u8>(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]) {
    let size = if F == F32 { 4 } else { 2 };
    assert!(
        panel.len() >= FLOAT_ROWS * 4 * n && w.len() >= (FLOAT_ROWS - 1) * w_stride + n * size,
        "panel pack: short buffers"
    );
    let dst = panel.as_mut_ptr() as *mut f32;
    for r in 0..FLOAT_ROWS {
        widen_row::<F>(n, w.as_ptr().add(r * w_stride), dst, |i| {
            float_slot(n, r, i)
        });
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn prep_float<const F: u8>(n: usize, act: &[u8], aux: &mut [u8]) {
    let size = if F == F32 { 4 } else { 2 };
    assert!(
        act.len() >= n * size && aux.len() >= 4 * n,
        "panel prep: short rows"
    );
    widen_row::<F>(n, act.as_ptr(), aux.as_mut_ptr() as *mut f32, |i| i);
}

/// The 16 lanes of `v` folded by halving (`l + l+8`, `+4`, `+2`, `+1`), the scalar order.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn fold16(v: __m512) -> f32 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    reduce16(_mm512_castps512_ps256(v), hi)
}

/// `G` tokens (f32 activations `aux_stride` bytes apart) against a float panel; token `k`'s
/// four results go to `out[4k ..]`. `FUSED`: every term, in the lanes and the tail, is a
/// fused multiply-add (F32's canonical dot, and F16's, whose products are exact).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::needless_range_loop)] // r and k index the accumulators, rows and tokens
unsafe fn float_tile<const G: usize, const FUSED: bool>(
    n: usize,
    panel: *const u8,
    aux: *const u8,
    aux_stride: usize,
    out: *mut f32,
) {
    let full = n / 16 * 16;
    let mut acc = [[_mm512_setzero_ps(); G]; FLOAT_ROWS];
    for c in 0..n / 16 {
        let w: [__m512; FLOAT_ROWS] = core::array::from_fn(|r| {
            _mm512_loadu_ps(panel.add(64 * (c * FLOAT_ROWS + r)) as *const f32)
        });
        for k in 0..G {
            let a = _mm512_loadu_ps(aux.add(k * aux_stride + 64 * c) as *const f32);
            for r in 0..FLOAT_ROWS {
                acc[r][k] = if FUSED {
                    _mm512_fmadd_ps(w[r], a, acc[r][k])
                } else {
                    _mm512_add_ps(acc[r][k], _mm512_mul_ps(w[r], a))
                };
            }
        }
    }
    if G == FLOAT_TOKENS {
        // All sixteen folded at once; lane `4k + r` is row `r`, token `k` (see `fold16x16`).
        let v = core::array::from_fn(|j| acc[j / G][j % G]);
        _mm512_storeu_ps(out, fold16x16(v));
    } else {
        for k in 0..G {
            for r in 0..FLOAT_ROWS {
                *out.add(FLOAT_ROWS * k + r) = fold16(acc[r][k]);
            }
        }
    }
    for k in 0..G {
        let a = aux.add(k * aux_stride);
        for r in 0..FLOAT_ROWS {
            let sum = &mut *out.add(FLOAT_ROWS * k + r);
            for i in full..n {
                let (w, x) = (
                    f32_at(panel.add(4 * float_slot(n, r, i))),
                    f32_at(a.add(4 * i)),
                );
                *sum = if FUSED {
                    w.mul_add(x, *sum)
                } else {
                    *sum + w * x
                };
            }
        }
    }
}

/// Sixteen vectors folded as [`fold16`] folds one — `l + l+8`, `+4`, `+2`, `+1` — but
/// together, each step adding two vectors' halves side by side, so sixteen sums cost 15
/// adds and 30 shuffles instead of sixteen horizontal folds. Lane `4q + m` of the result
/// is the fold of `v[4m + q]`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn fold16x16(v: [__m512; 16]) -> __m512 {
    // Lanes 0–7 the halves of `x` added (`l + l+8`), lanes 8–15 those of `y`.
    let s: [__m512; 8] = core::array::from_fn(|i| {
        let (x, y) = (v[2 * i], v[2 * i + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(x, y),
            _mm512_shuffle_f32x4::<0xEE>(x, y),
        )
    });
    // Quarter `j` of `t[i]`: `v[4i + j]`'s lanes 0–3 plus its lanes 4–7 (`+4`).
    let t: [__m512; 4] = core::array::from_fn(|i| {
        let (x, y) = (s[2 * i], s[2 * i + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(x, y),
            _mm512_shuffle_f32x4::<0xDD>(x, y),
        )
    });
    // Quarter `q` of `u[i]`: `v[8i + q]`'s two sums (`+2`), then `v[8i + 4 + q]`'s.
    let u: [__m512; 2] = core::array::from_fn(|i| {
        let (x, y) = (_mm512_castps_pd(t[2 * i]), _mm512_castps_pd(t[2 * i + 1]));
        _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)),
        )
    });
    // Quarter `q`: `v[q]`, `v[4 + q]`, `v[8 + q]`, `v[12 + q]` (`+1`).
    _mm512_add_ps(
        _mm512_shuffle_ps::<0x88>(u[0], u[1]),
        _mm512_shuffle_ps::<0xDD>(u[0], u[1]),
    )
}

fn float_gemm<const FUSED: bool>(
    n: usize,
    panel: &[u8],
    aux: &[u8],
    aux_stride: usize,
    out: &mut [f32],
) {
    let nt = out.len() / FLOAT_ROWS;
    assert!(panel.len() >= FLOAT_ROWS * 4 * n, "panel gemm: short panel");
    if nt > 0 {
        assert!(
            aux_stride >= 4 * n && aux.len() >= (nt - 1) * aux_stride + 4 * n,
            "panel gemm: short side data"
        );
    }
    let mut t = 0;
    while t < nt {
        let (x, o) = (
            aux[t * aux_stride..].as_ptr(),
            out[FLOAT_ROWS * t..].as_mut_ptr(),
        );
        // SAFETY: reached only through `kernels`, handed out after detecting the AVX-512
        // features; the checks above cover every element the tile reads and writes.
        unsafe {
            match nt - t {
                1 => float_tile::<1, FUSED>(n, panel.as_ptr(), x, aux_stride, o),
                2 => float_tile::<2, FUSED>(n, panel.as_ptr(), x, aux_stride, o),
                3 => float_tile::<3, FUSED>(n, panel.as_ptr(), x, aux_stride, o),
                4 => float_tile::<4, FUSED>(n, panel.as_ptr(), x, aux_stride, o),
                5 => float_tile::<5, FUSED>(n, panel.as_ptr(), x, aux_stride, o),
                _ => float_tile::<FLOAT_TOKENS, FUSED>(n, panel.as_ptr(), x, aux_stride, o),
            }
        }
        t += (nt - t).min(FLOAT_TOKENS);
    }
}

macro_rules! float_wrappers {
    ($($pack:ident, $prep:ident, $gemm:ident => $f:ident, $fused:expr;)*) => {
        $(fn $pack(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]) {
            // SAFETY: reached only through `kernels` (AVX-512 detected); the pack checks
            // its buffers' lengths.
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
            float_gemm::<{ $fused }>(n, panel, aux, aux_stride, out)
        })*
    };
}

float_wrappers! {
    pack_f16, prep_f16, gemm_f16 => F16, true;
    pack_bf16, prep_bf16, gemm_bf16 => BF16, false;
    pack_f32, prep_f32, gemm_f32 => F32, true;
}

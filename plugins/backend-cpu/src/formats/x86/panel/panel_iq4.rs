//! Row-panel prefill kernels of IQ4_NL and MXFP4, at AVX-512 and AVX2, as Q8_0's panels: an
//! IQ4_NL block is a Q8_0 block whose quants are table values (`d` the same f16, the values
//! in −127..=113), and its scalar term, `isum · (d · d_a)`, is Q8_0's. So packing turns the
//! panel's rows into Q8_0 rows (a per-thread scratch copy of `rows` rows, made once per
//! panel) and hands them to Q8_0's pack; the gemm, the token side data and the panel
//! layout are Q8_0's own (`panel512`, `panel256`), so every result is the Q8_0 panel's,
//! which equals the Q8_0 — hence the IQ4_NL — scalar `vec_dot` bit for bit.
//!
//! MXFP4 is the same shape (the doubled E2M1 values −12..=12 as quants, scalar term
//! `isum · (e8m0_half(e) · d_a)`), but its scale `2^(e − 128)` is an f16 only for
//! `e` in 104..=143. The panel holds each block's `d` as an f32 lane, though, so after
//! Q8_0's pack the MXFP4 pack writes `e8m0_half(e)` over those lanes: every exponent,
//! 0 and 255 included, gets the scalar kernel's f32, with no fallback to the row path. At
//! AVX2 its tile is `panel256`'s Q8_0 tile with wider i16 runs (the values are small).
//!
//! IQ4_XS's signed sub-block scales times table values do not fit a byte, so it has
//! panels of its own, laid out like Q4_K's: per super-block, 64 groups of four columns'
//! values (one row per 32-bit lane), then the eight sub-block scales `ls − 32` (i32 lanes
//! at AVX-512, `(s, s)` i16 pairs at AVX2), then the offset pairs (AVX-512 only), then `d`
//! as f32 lanes. The token side data is Q4_K's (`prep_q8_k`: `d_a` and the token's
//! 32-column sub-block sums as i16 pairs).
//!
//! - AVX-512 (16 rows, 8 tokens a tile): values packed unsigned, `v + 128`, so one
//!   `vpdpbusd` per group takes four columns of sixteen rows; per sub-block the lane's
//!   scale multiplies the sum, and the offset comes back exactly, once per super-block,
//!   as `Σ_s 128·ls_s·Σa_s` (a `vpdpwssd` of the packed pairs `128·ls` against the
//!   token's sub-block sums).
//! - AVX2 (8 rows, 4 tokens a tile): values packed signed, `|v| · (±a)` by `maddubs`
//!   (pairs ≤ 2·127·127 < 2^15), then `madd` by the lane's scale pair into i32.
//!
//! Each lane's integer is the scalar kernel's `isum` (|isum| < 2^31: 8·32·241·127·32), and
//! its float term `(d · d_a) · isum` the scalar kernel's operations in order.
//!
//! Not for: IQ4 and MXFP4 one-row dots (`vec_dot::iq4`, `vec_dot::mxfp4`).

use super::panel512::{
    i16_pair, legacy_block, prep_q8_k, put_lane, put_quants32, scaled_sub_block_sums, K_AUX,
};
use crate::formats::k_quants::{q8_k, QK_K};
use crate::formats::x86::lanes256::{f32_at, nibbles32};
use crate::formats::x86::lanes512::{dwords4, f16_pair};
use crate::formats::{iq4_nl, iq4_xs, mxfp4, q8_0, PanelKernels};
use core::arch::x86_64::*;
use prima_abi::GgmlType;
use std::cell::RefCell;

/// Q8_0's panel kernels at a level with IQ4_NL's (or MXFP4's) pack in place of Q8_0's.
pub(in crate::formats::x86) fn iq4_nl_kernels(
    q8: Option<PanelKernels>,
    pack: PackFn,
) -> Option<PanelKernels> {
    q8.map(|k| PanelKernels { pack, ..k })
}

type PackFn = fn(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]);

pub(in crate::formats::x86) fn pack_avx512(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]) {
    let q8 = super::panel512::kernels(GgmlType::Q8_0).expect("Q8_0 has AVX-512 panels");
    pack_as_q8_0::<IQ4_NL>(q8, n, w, w_stride, panel);
}

pub(in crate::formats::x86) fn pack_avx2(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]) {
    let q8 = super::panel256::kernels(GgmlType::Q8_0).expect("Q8_0 has AVX2 panels");
    pack_as_q8_0::<IQ4_NL>(q8, n, w, w_stride, panel);
}

pub(in crate::formats::x86) fn pack_mxfp4_avx512(
    n: usize,
    w: &[u8],
    w_stride: usize,
    panel: &mut [u8],
) {
    let q8 = super::panel512::kernels(GgmlType::Q8_0).expect("Q8_0 has AVX-512 panels");
    pack_as_q8_0::<MXFP4>(q8, n, w, w_stride, panel);
}

pub(in crate::formats::x86) fn pack_mxfp4_avx2(
    n: usize,
    w: &[u8],
    w_stride: usize,
    panel: &mut [u8],
) {
    let q8 = super::panel256::kernels(GgmlType::Q8_0).expect("Q8_0 has AVX2 panels");
    pack_as_q8_0::<MXFP4>(q8, n, w, w_stride, panel);
}

/// The table formats packed as Q8_0, as const parameters of [`pack_as_q8_0`].
const IQ4_NL: u8 = 0;
const MXFP4: u8 = 1;

thread_local! {
    /// The panel's rows as Q8_0, reused from panel to panel on each thread.
    static AS_Q8_0: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// `q8.rows` rows of table format `F` (IQ4_NL or MXFP4) of `n` columns, `w_stride` bytes
/// apart, rewritten as Q8_0 rows and packed by Q8_0's `pack`. MXFP4's scales are then
/// written over the panel's `d` lanes as the f32s `e8m0_half(e)` (the Q8_0 rows carry
/// `d` = 0): the legacy panel layout of both levels (`panel512::legacy_block`) keeps each
/// block's `d` as f32 lanes after its eight quant groups.
fn pack_as_q8_0<const F: u8>(
    q8: PanelKernels,
    n: usize,
    w: &[u8],
    w_stride: usize,
    panel: &mut [u8],
) {
    let (block_elems, block_bytes) = match F {
        IQ4_NL => (iq4_nl::BLOCK_ELEMS, iq4_nl::BLOCK_BYTES),
        _ => (mxfp4::BLOCK_ELEMS, mxfp4::BLOCK_BYTES),
    };
    let nb = n / block_elems;
    let (src_row, row) = (nb * block_bytes, nb * q8_0::BLOCK_BYTES);
    assert!(
        w.len() >= (q8.rows - 1) * w_stride + src_row,
        "panel pack: short weight rows"
    );
    AS_Q8_0.with_borrow_mut(|rows| {
        rows.resize(q8.rows * row, 0);
        for (r, dst) in rows.chunks_exact_mut(row).enumerate() {
            let src = &w[r * w_stride..r * w_stride + src_row];
            // SAFETY: both levels that reach this pack include avx2, fma and f16c.
            unsafe {
                if F == IQ4_NL {
                    row_as_q8_0(src, dst)
                } else {
                    mxfp4_row_as_q8_0(src, dst)
                }
            };
        }
        (q8.pack)(n, rows, row, panel);
    });
    if F == MXFP4 {
        let (l, pb) = (q8.rows, legacy_block(q8.rows));
        assert!(panel.len() >= nb * pb, "panel pack: short panel");
        for r in 0..l {
            let src = &w[r * w_stride..r * w_stride + src_row];
            for (b, sb) in src.chunks_exact(block_bytes).enumerate() {
                let at = b * pb + 32 * l + 4 * r;
                panel[at..at + 4].copy_from_slice(&mxfp4::e8m0_half(sb[0]).to_le_bytes());
            }
        }
    }
}

/// The IQ4_NL blocks of `src` as the Q8_0 blocks of `dst`: the same `d`, the table values
/// as quants.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_as_q8_0(src: &[u8], dst: &mut [u8]) {
    let t = table::<false>();
    let blocks = src.chunks_exact(iq4_nl::BLOCK_BYTES);
    for (sb, db) in blocks.zip(dst.chunks_exact_mut(q8_0::BLOCK_BYTES)) {
        db[..2].copy_from_slice(&sb[..2]);
        // `sb` holds 2 + 16 bytes and `db` 2 + 32 (whole blocks of each).
        let v = _mm256_shuffle_epi8(t, nibbles32(sb.as_ptr().add(2)));
        _mm256_storeu_si256(db.as_mut_ptr().add(2) as *mut __m256i, v);
    }
}

/// The MXFP4 blocks of `src` as the Q8_0 blocks of `dst`: `d` = 0 (the pack writes the
/// E8M0 scales into the panel), the doubled E2M1 values (−12 ..= 12) as quants.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mxfp4_row_as_q8_0(src: &[u8], dst: &mut [u8]) {
    let t = _mm256_broadcastsi128_si256(_mm_loadu_si128(mxfp4::KVALUES.as_ptr() as *const __m128i));
    let blocks = src.chunks_exact(mxfp4::BLOCK_BYTES);
    for (sb, db) in blocks.zip(dst.chunks_exact_mut(q8_0::BLOCK_BYTES)) {
        db[..2].fill(0);
        // `sb` holds 1 + 16 bytes and `db` 2 + 32 (whole blocks of each).
        let v = _mm256_shuffle_epi8(t, nibbles32(sb.as_ptr().add(1)));
        _mm256_storeu_si256(db.as_mut_ptr().add(2) as *mut __m256i, v);
    }
}

// ---- IQ4_XS ----

/// Bytes of an IQ4_XS panel super-block of `L` lanes: 64 value groups, 8 scales, 4 offset
/// pairs, d.
const fn xs_block(l: usize) -> usize {
    77 * 4 * l
}
/// Offsets, in units of `4·L` bytes, of the scales, offset pairs and `d`.
const XS_SCALES: usize = 64;
const XS_OFFS: usize = 72;
const XS_D: usize = 76;

/// IQ4_XS's panels at a level: `L` rows, `G` tokens a tile.
fn xs_kernels(
    rows: usize,
    tokens: usize,
    pack: PackFn,
    gemm: crate::formats::PanelGemmFn,
) -> PanelKernels {
    PanelKernels {
        rows,
        tokens,
        panel_bytes: match rows {
            16 => |n| n / QK_K * xs_block(16),
            _ => |n| n / QK_K * xs_block(8),
        },
        pack,
        aux_bytes: |n| n / QK_K * K_AUX,
        prep: prep_q8_k,
        gemm,
        reads_acts: true,
    }
}

pub(in crate::formats::x86) fn iq4_xs_avx512() -> PanelKernels {
    xs_kernels(16, 8, pack_xs_avx512, gemm_xs_avx512)
}

pub(in crate::formats::x86) fn iq4_xs_avx2() -> PanelKernels {
    xs_kernels(8, 4, pack_xs_avx2, gemm_xs_avx2)
}

/// The table (`UNSIGNED`: plus 128, as bytes) in both 128-bit lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn table<const UNSIGNED: bool>() -> __m256i {
    let t: [u8; 16] = core::array::from_fn(|i| {
        let v = iq4_nl::KVALUES[i] as i32 + if UNSIGNED { 128 } else { 0 };
        v as u8
    });
    _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr() as *const __m128i))
}

/// Packs `L` IQ4_XS rows for the AVX2 panels, a row at a time: values signed, scales as
/// `(ls, ls)` i16 pairs. The AVX-512 panels' pack is [`pack_xs_16`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_xs<const L: usize>(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]) {
    let (nb, wbb, pb) = (n / QK_K, iq4_xs::BLOCK_BYTES, xs_block(L));
    assert!(
        panel.len() >= nb * pb && w.len() >= (L - 1) * w_stride + nb * wbb,
        "panel pack: short buffers"
    );
    let t = table::<false>();
    let lane = 4 * L;
    for r in 0..L {
        let row = &w[r * w_stride..r * w_stride + nb * wbb];
        for (b, wb) in row.chunks_exact(wbb).enumerate() {
            let dst = &mut panel[b * pb..(b + 1) * pb];
            for s in 0..8 {
                let v = _mm256_shuffle_epi8(t, nibbles32(wb.as_ptr().add(iq4_xs::QS + 16 * s)));
                put_quants32::<L>(dst.as_mut_ptr().add(lane * 8 * s), r, v);
            }
            let ls = iq4_xs::scales(wb);
            for (s, &v) in ls.iter().enumerate() {
                put_lane::<L>(dst, lane * (XS_SCALES + s), r, i16_pair(v, v));
            }
            for j in 0..4 {
                let pair = i16_pair(128 * ls[2 * j], 128 * ls[2 * j + 1]);
                put_lane::<L>(dst, lane * (XS_OFFS + j), r, pair);
            }
            put_lane::<L>(
                dst,
                lane * XS_D,
                r,
                crate::formats::f16_at(wb, 0).to_le_bytes(),
            );
        }
    }
}

/// Packs sixteen IQ4_XS rows for the AVX-512 panels (values `v + 128`, scales as i32
/// lanes, the offset pairs, `d`), transposed in registers (`few_rows16::dwords4`: vector
/// `j` of sixteen 16-byte loads is dword `j` of every row) and the scales unpacked in the
/// lanes: row by row, four bytes a store, packing is what held the Q4_K-like panels back
/// (see `panel512`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pack_xs_16(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]) {
    const L: usize = 16;
    let (nb, wbb, pb) = (n / QK_K, iq4_xs::BLOCK_BYTES, xs_block(L));
    assert!(
        panel.len() >= nb * pb && w.len() >= (L - 1) * w_stride + nb * wbb,
        "panel pack: short buffers"
    );
    let row: [*const u8; L] = core::array::from_fn(|r| w.as_ptr().add(r * w_stride));
    let t = _mm512_broadcast_i32x4(_mm256_castsi256_si128(table::<true>()));
    let (low, two, pair_low) = (
        _mm512_set1_epi8(0x0F),
        _mm512_set1_epi32(3),
        _mm512_set1_epi32(0xFFFF),
    );
    for b in 0..nb {
        let off = b * wbb;
        let dst = panel.as_mut_ptr().add(b * pb);
        let put = |at: usize, v: __m512i| _mm512_storeu_si512(dst.add(64 * at) as *mut _, v);
        // Dword 0: d and scales_h; dword 1: scales_l.
        let [dh, sl, _, _] = dwords4(&row, off);
        // ls_s − 32: the low four bits at bit 4s of scales_l, the high two at bit 2s of
        // scales_h (bit 16 + 2s of dword 0).
        let ls: [__m512i; 8] = core::array::from_fn(|s| {
            let lo = _mm512_and_si512(
                _mm512_srl_epi32(sl, _mm_cvtsi32_si128(4 * s as i32)),
                _mm512_set1_epi32(0x0F),
            );
            let hi = _mm512_and_si512(
                _mm512_srl_epi32(dh, _mm_cvtsi32_si128(16 + 2 * s as i32)),
                two,
            );
            _mm512_sub_epi32(
                _mm512_or_si512(lo, _mm512_slli_epi32::<4>(hi)),
                _mm512_set1_epi32(32),
            )
        });
        for (s, &v) in ls.iter().enumerate() {
            put(XS_SCALES + s, v);
        }
        for j in 0..4 {
            let lo = _mm512_and_si512(_mm512_slli_epi32::<7>(ls[2 * j]), pair_low);
            let hi = _mm512_slli_epi32::<23>(ls[2 * j + 1]);
            put(XS_OFFS + j, _mm512_or_si512(lo, hi));
        }
        _mm512_storeu_ps(dst.add(64 * XS_D) as *mut f32, f16_pair(dh).0);
        for s in 0..8 {
            // Sub-block s: 16 bytes, dword g's low nibbles are group g, its high nibbles
            // group 4 + g.
            let v = dwords4(&row, off + iq4_xs::QS + 16 * s);
            for (g, q) in v.into_iter().enumerate() {
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), low);
                put(8 * s + g, _mm512_shuffle_epi8(t, _mm512_and_si512(q, low)));
                put(8 * s + 4 + g, _mm512_shuffle_epi8(t, hi));
            }
        }
    }
}

fn pack_xs_avx512(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]) {
    // SAFETY: reached only through the AVX-512 table, handed out after detecting its
    // features (AVX2 included); the pack checks its buffers.
    unsafe { pack_xs_16(n, w, w_stride, panel) }
}

fn pack_xs_avx2(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]) {
    // SAFETY: reached only through the AVX2 table, handed out after detecting avx2, fma
    // and f16c; the pack checks its buffers.
    unsafe { pack_xs::<8>(n, w, w_stride, panel) }
}

/// `G` tokens against a 16-row IQ4_XS panel; `out[16k ..]` gets token `k`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn xs_tile_512<const G: usize>(
    nb: usize,
    panel: *const u8,
    acts: *const u8,
    a_stride: usize,
    aux: *const u8,
    aux_stride: usize,
    out: *mut f32,
) {
    const LANE: usize = 64;
    let zero = _mm512_setzero_si512();
    let mut sums = [_mm512_setzero_ps(); G];
    for b in 0..nb {
        let p = panel.add(b * xs_block(16));
        let isums = scaled_sub_block_sums::<G>(p, LANE * XS_SCALES, acts, a_stride, b);
        let offs: [__m512i; 4] =
            core::array::from_fn(|j| _mm512_loadu_si512(p.add(LANE * (XS_OFFS + j)) as *const _));
        let d = _mm512_loadu_ps(p.add(LANE * XS_D) as *const f32);
        for (k, sum) in sums.iter_mut().enumerate() {
            let ax = aux.add(k * aux_stride + b * K_AUX);
            let pair =
                |j: usize| _mm512_set1_epi32((ax.add(4 + 4 * j) as *const i32).read_unaligned());
            let mut off = _mm512_dpwssd_epi32(zero, offs[0], pair(0));
            off = _mm512_dpwssd_epi32(off, offs[1], pair(1));
            off = _mm512_dpwssd_epi32(off, offs[2], pair(2));
            off = _mm512_dpwssd_epi32(off, offs[3], pair(3));
            let isum = _mm512_cvtepi32_ps(_mm512_sub_epi32(isums[k], off));
            let d_a = _mm512_set1_ps(f32_at(ax));
            *sum = _mm512_add_ps(*sum, _mm512_mul_ps(_mm512_mul_ps(d, d_a), isum));
        }
    }
    for (k, sum) in sums.iter().enumerate() {
        _mm512_storeu_ps(out.add(16 * k), *sum);
    }
}

fn gemm_xs_avx512(
    n: usize,
    panel: &[u8],
    acts: &[u8],
    a_stride: usize,
    aux: &[u8],
    aux_stride: usize,
    out: &mut [f32],
) {
    let nb = n / QK_K;
    let nt = super::panel512::check_gemm(
        nb,
        panel,
        xs_block(16),
        acts,
        a_stride,
        q8_k::BLOCK_BYTES,
        aux,
        aux_stride,
        K_AUX,
        out,
    );
    let p = panel.as_ptr();
    // SAFETY: reached only through the AVX-512 table, handed out after detecting its
    // features; `check_gemm` checked that every block the tiles read is in bounds and
    // `out` holds `nt` tokens' 16 lanes.
    unsafe {
        over_tokens!([16, 8] nt, a_stride, aux_stride, acts, aux, out, |g, a, x, o| {
            if g == 8 {
                xs_tile_512::<8>(nb, p, a, a_stride, x, aux_stride, o)
            } else {
                xs_tile_512::<1>(nb, p, a, a_stride, x, aux_stride, o)
            }
        });
    }
}

/// `G` tokens against an 8-row IQ4_XS panel (signed values); `out[8k ..]` gets token `k`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn xs_tile_256<const G: usize>(
    nb: usize,
    panel: *const u8,
    acts: *const u8,
    a_stride: usize,
    aux: *const u8,
    aux_stride: usize,
    out: *mut f32,
) {
    const LANE: usize = 32;
    let mut sums = [_mm256_setzero_ps(); G];
    for b in 0..nb {
        let p = panel.add(b * xs_block(8));
        let mut isums = [_mm256_setzero_si256(); G];
        for s in 0..8 {
            let sc = _mm256_loadu_si256(p.add(LANE * (XS_SCALES + s)) as *const __m256i);
            for g in 0..8 {
                let w = _mm256_loadu_si256(p.add(LANE * (8 * s + g)) as *const __m256i);
                let wabs = _mm256_sign_epi8(w, w);
                for (k, isum) in isums.iter_mut().enumerate() {
                    let a =
                        acts.add(k * a_stride + b * q8_k::BLOCK_BYTES + q8_k::QS + 32 * s + 4 * g);
                    let x = _mm256_set1_epi32((a as *const i32).read_unaligned());
                    let pr = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(x, w));
                    *isum = _mm256_add_epi32(*isum, _mm256_madd_epi16(pr, sc));
                }
            }
        }
        let d = _mm256_loadu_ps(p.add(LANE * XS_D) as *const f32);
        for (k, sum) in sums.iter_mut().enumerate() {
            let d_a = _mm256_set1_ps(f32_at(aux.add(k * aux_stride + b * K_AUX)));
            let isum = _mm256_cvtepi32_ps(isums[k]);
            *sum = _mm256_add_ps(*sum, _mm256_mul_ps(_mm256_mul_ps(d, d_a), isum));
        }
    }
    for (k, sum) in sums.iter().enumerate() {
        _mm256_storeu_ps(out.add(8 * k), *sum);
    }
}

fn gemm_xs_avx2(
    n: usize,
    panel: &[u8],
    acts: &[u8],
    a_stride: usize,
    aux: &[u8],
    aux_stride: usize,
    out: &mut [f32],
) {
    let nb = n / QK_K;
    let nt = super::panel256::check_gemm(
        nb,
        panel,
        xs_block(8),
        acts,
        a_stride,
        q8_k::BLOCK_BYTES,
        aux,
        aux_stride,
        K_AUX,
        out,
    );
    let p = panel.as_ptr();
    // SAFETY: reached only through the AVX2 table, handed out after detecting avx2, fma
    // and f16c; `check_gemm` checked that every block the tiles read is in bounds and
    // `out` holds `nt` tokens' 8 lanes.
    unsafe {
        over_tokens!([8, 4] nt, a_stride, aux_stride, acts, aux, out, |g, a, x, o| {
            if g == 4 {
                xs_tile_256::<4>(nb, p, a, a_stride, x, aux_stride, o)
            } else {
                xs_tile_256::<1>(nb, p, a, a_stride, x, aux_stride, o)
            }
        });
    }
}

//! AVX-512 VNNI small-batch kernels that take sixteen weight rows a step, one per i32 lane
//! (see [`crate::formats::FewKernels`]): continuous batching's decode steps of 2 ..= 8
//! requests.
//!
//! [`crate::formats::x86::few::few512`] gives each lane a group of four quants of one row, so every block's
//! sum needs a horizontal reduction: measured, those shuffles, not the `vpdpbusd`s, bound
//! it. Here each lane is a row: the sixteen rows' blocks are transposed (four 128-bit loads
//! per vector, a 4 × 4 dword transpose in each lane), so that vector `j` holds quant group
//! `j` of every row, and a token's group `j` is broadcast against it. Eight `vpdpbusd`s
//! make a block's sixteen integer sums for one token, with no reduction; the transpose is
//! paid once per block for all the tokens. The float terms are the scalar kernel's
//! expression in its order, one lane per row, added block after block to one running sum
//! per (row, token), so every result equals the scalar `vec_dot` bit for bit.
//!
//! Q8_0 weights are signed, and `vpdpbusd` wants one operand unsigned: their quants are
//! moved to unsigned (`w + 128`), and each token's sums start at `−128 · Σa` (per block,
//! in the pack), which takes the bias back exactly. Q4_0's nibbles are its quants `+ 8`,
//! so its sums start at `−8 · Σa`; Q5_0's 5-bit values are its quants `+ 16`: `−16 · Σa`.
//! IQ4_NL's nibbles index its table ([`iq4_nl::KVALUES`], −127 ..= 113): one `vpshufb`
//! through the table plus 128 gives unsigned values, corrected like Q8_0's.
//!
//! With one token there is nothing to share the transpose with, but the lanes being rows
//! still spare every block's reductions and add its float terms sixteen rows at once, so
//! these kernels are also the decode kernels of Q4_0, Q4_1, Q5_0, Q8_0 and IQ4_NL
//! ([`crate::formats::FormatKernels::decode`]); Q4_0 and Q5_0 only there (their small
//! batches keep [`crate::formats::x86::few::few512`]).
//!
//! The sums come out a vector per token, so `out` is written token-major, as `matmul` wants
//! it (`FewKernels::token_major`). The last step of a call takes its missing rows as copies
//! of its last row and drops their results.
//!
//! Not for: the K-quants and IQ4_XS (`kdec16`), or AVX2 (`few_rows8`).

use super::step_rows;
use crate::formats::x86::few::{MAX_TOKENS, MIN, SDD, SPROD};
use crate::formats::x86::lanes512::{dwords4_by, f16_pair, iq4_table, lane_rows, spread_byte};
use crate::formats::{iq4_nl, q4_0, q4_1, q5_0, q8_0, q8_1, FewKernels};
use core::arch::x86_64::*;
use prima_abi::GgmlType;

/// Rows one step computes: one per i32 lane of a 512-bit vector.
pub(super) const ROWS: usize = 16;

/// Pack bytes of one token's block: 32 quants, then two 4-byte lanes (see [`pack_bytes`]).
pub(super) const TOKEN_BLOCK: usize = 32 + 4 + 4;

/// The kernels for Q4_1 weights (Q8_1 activations).
pub(in crate::formats::x86) fn q4_1_kernels() -> FewKernels {
    FewKernels {
        max_tokens: MAX_TOKENS,
        pack_bytes,
        pack: pack_q8_1,
        dot: dot_q4_1,
        token_major: true,
    }
}

/// The decode kernels of weight type `t` (see the module notes), if this module has them.
pub(in crate::formats::x86) fn decode_kernels(t: GgmlType) -> Option<FewKernels> {
    use GgmlType as T;
    match t {
        T::Q4_0 => Some(q4_0_kernels()),
        T::Q4_1 => Some(q4_1_kernels()),
        T::Q5_0 => Some(FewKernels {
            max_tokens: MAX_TOKENS,
            pack_bytes,
            pack: pack_q5_0,
            dot: dot_q5_0,
            token_major: true,
        }),
        T::Q8_0 => Some(q8_0_kernels()),
        T::IQ4NL => Some(iq4_nl_kernels()),
        _ => None,
    }
}

/// The kernels for IQ4_NL weights (Q8_0 activations, as Q8_0's: the table's values are
/// moved to unsigned by `+ 128`).
pub(in crate::formats::x86) fn iq4_nl_kernels() -> FewKernels {
    FewKernels {
        max_tokens: MAX_TOKENS,
        pack_bytes,
        pack: pack_q8_0,
        dot: dot_iq4_nl,
        token_major: true,
    }
}

/// The kernels for Q4_0 weights (Q8_0 activations).
pub(super) fn q4_0_kernels() -> FewKernels {
    FewKernels {
        max_tokens: MAX_TOKENS,
        pack_bytes,
        pack: pack_q4_0,
        dot: dot_q4_0,
        token_major: true,
    }
}

/// The kernels for Q8_0 weights (Q8_0 activations).
pub(in crate::formats::x86) fn q8_0_kernels() -> FewKernels {
    FewKernels {
        max_tokens: MAX_TOKENS,
        pack_bytes,
        pack: pack_q8_0,
        dot: dot_q8_0,
        token_major: true,
    }
}

/// Bytes of the pack of `n_tokens` rows of `n` columns: per block, each token's 32 quants,
/// then each token's `d_a` as f32, then each token's second lane: Q8_1's `s_a` as f32, or
/// for Q8_0 activations the weights' bias correction `−bias · Σ q_a` as i32.
pub(super) fn pack_bytes(n: usize, n_tokens: usize) -> usize {
    n / 32 * n_tokens * TOKEN_BLOCK
}

/// The little-endian f16 `lo, hi` as f32, exactly (every f16 is an f32), by bit moves:
/// `half`'s conversion checks the CPU's features on every call.
/// Normal and subnormal values: the exponent and mantissa bits moved into an f32's place
/// (an f32 `2^−112` times the value), times `2^112`; infinities and NaNs (their payload,
/// made quiet, as `vcvtph2ps` and `half` do) by their bits.
#[inline(always)]
pub(super) fn f16_le_to_f32(lo: u8, hi: u8) -> f32 {
    let h = u16::from_le_bytes([lo, hi]) as u32;
    let sign = (h & 0x8000) << 16;
    let rest = h & 0x7FFF;
    let magnitude = if rest >= 0x7C00 {
        let quiet = if rest > 0x7C00 { 0x0040_0000 } else { 0 };
        f32::from_bits(0x7F80_0000 | quiet | ((rest & 0x03FF) << 13))
    } else {
        f32::from_bits(rest << 13) * f32::from_bits(0x7780_0000)
    };
    f32::from_bits(magnitude.to_bits() | sign)
}

/// Packs activation rows of `ab`-byte blocks, `a_stride` bytes apart, with `second(block)`
/// each token's second lane (see [`pack_bytes`]). Inlined, so that `ab` is a constant and
/// the 32- and 4-byte copies are moves, not `memcpy` calls (measured: those calls were half
/// of a 4-token step's `memmove` time).
#[inline(always)]
fn pack_with(
    n: usize,
    acts: &[u8],
    a_stride: usize,
    n_tokens: usize,
    pack: &mut [u8],
    ab: usize,
    second: impl Fn(&[u8]) -> [u8; 4],
) {
    let nb = n / 32;
    assert!(
        (1..=MAX_TOKENS).contains(&n_tokens)
            && pack.len() >= pack_bytes(n, n_tokens)
            && a_stride >= nb * ab
            && acts.len() >= (n_tokens - 1) * a_stride + nb * ab,
        "few-token pack: short rows or buffer"
    );
    let blocks = pack[..pack_bytes(n, n_tokens)].chunks_exact_mut(n_tokens * TOKEN_BLOCK);
    for (i, dst) in blocks.enumerate() {
        let (quants, lanes) = dst.split_at_mut(n_tokens * 32);
        let (d_a, seconds) = lanes.split_at_mut(n_tokens * 4);
        for t in 0..n_tokens {
            let a = &acts[t * a_stride + i * ab..][..ab];
            let q: &[u8; 32] = a[ab - 32..].try_into().expect("32 quants");
            let q_dst: &mut [u8; 32] = (&mut quants[t * 32..][..32]).try_into().expect("32");
            *q_dst = *q;
            let d_dst: &mut [u8; 4] = (&mut d_a[t * 4..][..4]).try_into().expect("4");
            *d_dst = f16_le_to_f32(a[0], a[1]).to_le_bytes();
            let s_dst: &mut [u8; 4] = (&mut seconds[t * 4..][..4]).try_into().expect("4");
            *s_dst = second(a);
        }
    }
}

/// Packs Q8_1 activation rows (of Q4_1 weights), with their `s_a`.
fn pack_q8_1(n: usize, acts: &[u8], a_stride: usize, n_tokens: usize, pack: &mut [u8]) {
    let s_a = |a: &[u8]| f16_le_to_f32(a[2], a[3]).to_le_bytes();
    pack_with(n, acts, a_stride, n_tokens, pack, q8_1::BLOCK_BYTES, s_a)
}

/// Packs Q8_0 activation rows of weights whose quants are biased by `bias` (Q8_0: 128,
/// Q4_0: 8), with the bias's correction `−bias · Σ q_a`.
fn pack_q8_0_unbias(
    n: usize,
    acts: &[u8],
    a_stride: usize,
    n_tokens: usize,
    pack: &mut [u8],
    bias: i32,
) {
    let unbias = |a: &[u8]| {
        let sum: i32 = a[2..34].iter().map(|&q| q as i8 as i32).sum();
        (-bias * sum).to_le_bytes()
    };
    pack_with(n, acts, a_stride, n_tokens, pack, q8_0::BLOCK_BYTES, unbias)
}

/// Packs Q8_0 activation rows (of Q8_0 and IQ4_NL weights), with the bias's correction
/// `−128 · Σ q_a`.
fn pack_q8_0(n: usize, acts: &[u8], a_stride: usize, n_tokens: usize, pack: &mut [u8]) {
    pack_q8_0_unbias(n, acts, a_stride, n_tokens, pack, 128)
}

/// Packs Q8_0 activation rows (of Q5_0 weights), with the bias's correction `−16 · Σ q_a`.
fn pack_q5_0(n: usize, acts: &[u8], a_stride: usize, n_tokens: usize, pack: &mut [u8]) {
    pack_q8_0_unbias(n, acts, a_stride, n_tokens, pack, 16)
}

/// Packs Q8_0 activation rows (of Q4_0 weights), with the bias's correction `−8 · Σ q_a`.
pub(super) fn pack_q4_0(n: usize, acts: &[u8], a_stride: usize, n_tokens: usize, pack: &mut [u8]) {
    pack_q8_0_unbias(n, acts, a_stride, n_tokens, pack, 8)
}

/// Safe wrappers with the table's signature around this module's kernels; they check the
/// rows, the pack and `out`.
macro_rules! dot_wrappers {
    ($($name:ident => $imp:ident, $block:expr;)*) => {
        $(fn $name(n: usize, w: &[u8], w_stride: usize, pack: &[u8], n_tokens: usize, out: &mut [f32]) {
            let (nb, wb) = (n / 32, $block);
            assert!((1..=MAX_TOKENS).contains(&n_tokens), "few-token dot: {n_tokens} tokens");
            let rows = out.len() / n_tokens;
            assert!(
                out.len() == rows * n_tokens
                    && pack.len() >= pack_bytes(n, n_tokens)
                    && w_stride >= nb * wb
                    && (rows == 0 || w.len() >= (rows - 1) * w_stride + nb * wb),
                "few-token dot: short rows, pack or output"
            );
            // SAFETY: only reachable through the AVX-512 `levels` table, which `dispatch`
            // hands out after detecting the features `$imp` enables; the rows, the pack and
            // `out` are in bounds (above).
            unsafe {
                if n_tokens == 1 {
                    $imp::<false>(n, w, w_stride, pack, n_tokens, out)
                } else {
                    $imp::<true>(n, w, w_stride, pack, n_tokens, out)
                }
            }
        })*
    };
}

dot_wrappers! {
    dot_q4_0 => rows_q4_0, q4_0::BLOCK_BYTES;
    dot_q4_1 => rows_q4_1, q4_1::BLOCK_BYTES;
    dot_q5_0 => rows_q5_0, q5_0::BLOCK_BYTES;
    dot_q8_0 => rows_q8_0, q8_0::BLOCK_BYTES;
    dot_iq4_nl => rows_iq4_nl, iq4_nl::BLOCK_BYTES;
}

/// Dword 0 of the 16 bytes at `off` of each row: lane `r` is row `r`'s.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn dword0<const HALVES: bool>(row: &[*const u8; ROWS], off: usize) -> __m512i {
    let z = [
        lane_rows::<HALVES>(row, 0, off),
        lane_rows::<HALVES>(row, 1, off),
        lane_rows::<HALVES>(row, 2, off),
        lane_rows::<HALVES>(row, 3, off),
    ];
    _mm512_unpacklo_epi64(
        _mm512_unpacklo_epi32(z[0], z[1]),
        _mm512_unpacklo_epi32(z[2], z[3]),
    )
}

/// Whether a step's scales can be gathered: the rows' offsets from its first row (at most
/// `ROWS − 1` strides) fit the gather's i32 lanes.
fn gathers(ws: usize) -> bool {
    ws <= i32::MAX as usize / ROWS
}

/// The f16 at `off` of each row as f32s (lane `r`: row `r`'s): one gather (measured a
/// little faster than [`dword0`]'s sixteen loads and shuffles for two bytes a row) where
/// [`gathers`] allows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn scales_f16<const HALVES: bool>(
    row: &[*const u8; ROWS],
    off: usize,
    gather: bool,
) -> __m512 {
    let dwords = if gather {
        gather_dwords(row, off)
    } else {
        dword0::<HALVES>(row, off)
    };
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dwords))
}

/// The dword at `off` of each row (lane `r`: row `r`'s) by one gather; only where
/// [`gathers`] allows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn gather_dwords(row: &[*const u8; ROWS], off: usize) -> __m512i {
    let base = row[0];
    let at = |r: usize| row[r].offset_from(base) as i32;
    let idx = _mm512_setr_epi32(
        0,
        at(1),
        at(2),
        at(3),
        at(4),
        at(5),
        at(6),
        at(7),
        at(8),
        at(9),
        at(10),
        at(11),
        at(12),
        at(13),
        at(14),
        at(15),
    );
    _mm512_i32gather_epi32::<1>(idx, base.add(off) as *const _)
}

/// Writes the sums `acc[t]` (lane `k`: row `first + k`) into token-major `out` (`rows` a
/// token), the rows below `rows` only.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn store<const N: usize>(
    acc: &[__m512; N],
    first: usize,
    rows: usize,
    out: &mut [f32],
) {
    let valid = ROWS.min(rows - first);
    let mask = ((1u32 << valid) - 1) as __mmask16;
    for (t, a) in acc.iter().enumerate() {
        let dst = &mut out[t * rows + first..][..valid];
        _mm512_mask_storeu_ps(dst.as_mut_ptr(), mask, *a);
    }
}

/// A step's weight bytes up to which the next step is prefetched into L1; above, into L2.
/// The current and the next step must both fit in L1 (32–48 KB) beside the pack, or the
/// prefetches evict the rows in use (as `kdec16` found). Measured (tg64, one thread,
/// AVX-512, interleaved medians): the 1B models' Q8_0 (35 KB steps) 9.6 → 16.2 tok/s and
/// Q4_0 (18 KB) 22.1 → 25.3 with L2; SmolLM2 Q4_1 (steps of 6–15 KB) keeps L1, and lost
/// ~5% until the L2 loop was moved out of line (see [`rows_n`]).
const L1_STEP_BYTES: usize = 16 << 10;

/// Prefetches the cache lines of `p .. p + bytes` into L1 (`NEAR`) or L2.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn prefetch<const NEAR: bool>(p: *const u8, bytes: usize) {
    for off in (0..bytes).step_by(64) {
        // Wrapping: the address may lie past the mapping; a prefetch never faults.
        let line = p.wrapping_add(off) as *const i8;
        if NEAR {
            _mm_prefetch::<_MM_HINT_T0>(line);
        } else {
            _mm_prefetch::<_MM_HINT_T1>(line);
        }
    }
}

/// One block of a step's rows as `block(rows, block offset)` returns it: quant vector `j`
/// (lane `r`: row `r`'s four quants that meet the activations' dword `j`, unsigned), and
/// the weight scales `d` and `m` (`m`: Q4_1 only) of each row.
type Block = ([__m512i; 8], __m512, __m512);

/// [`rows_hinted`] of one hint as a function pointer (its arguments in order).
type RowsFn<B> = unsafe fn(usize, &[u8], usize, usize, &[u8], &mut [f32], B);

/// Every row against the `N` tokens of `pack` into `out` (`N × rows`, token-major), the
/// weights' blocks `wb` bytes long.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_n<const N: usize, const T: u8, B: Fn(&[*const u8; ROWS], usize) -> Block>(
    n: usize,
    w: &[u8],
    ws: usize,
    wb: usize,
    pack: &[u8],
    out: &mut [f32],
    block: B,
) {
    // The hint is a type parameter: a flag tested in the block loop cost ~5% of a decode.
    if ROWS * (n / 32) * wb <= L1_STEP_BYTES {
        rows_hinted::<N, T, true, _>(n, w, ws, wb, pack, out, block)
    } else {
        // The L2 loop through an opaque pointer, so it is never inlined here. Inlined
        // beside the L1 loop, it changed how that loop was compiled (the same
        // instructions, registers and stack slots moved): SmolLM2's Q8_0 output head,
        // whose steps take the L1 loop, took ~25% more CPU time and tg64 on one thread
        // lost ~5% (`#[inline(never)]` on a wrapper was not honoured). Same arguments,
        // same contract as the call above.
        let far: RowsFn<B> = rows_hinted::<N, T, false, B>;
        std::hint::black_box(far)(n, w, ws, wb, pack, out, block)
    }
}

/// [`rows_n`], the next step prefetched into L1 (`NEAR`) or L2.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_hinted<
    const N: usize,
    const T: u8,
    const NEAR: bool,
    B: Fn(&[*const u8; ROWS], usize) -> Block,
>(
    n: usize,
    w: &[u8],
    ws: usize,
    wb: usize,
    pack: &[u8],
    out: &mut [f32],
    block: B,
) {
    let nb = n / 32;
    let rows = out.len() / N;
    for first in (0..rows).step_by(ROWS) {
        let row = step_rows::<ROWS>(w, ws, first, rows);
        let mut acc = [_mm512_setzero_ps(); N];
        // The next step's rows (contiguous when `ws` is the row's bytes), a block's share
        // of them each block: sixteen rows read a few bytes at a time each are sixteen
        // streams, more than the hardware prefetcher follows.
        let next = w.as_ptr().wrapping_add((first + ROWS) * ws);
        for i in 0..nb {
            prefetch::<NEAR>(next.wrapping_add(i * ROWS * wb), ROWS * wb);
            let (q, d, m) = block(&row, i * wb);
            let blk = pack.as_ptr().add(i * N * TOKEN_BLOCK);
            let (d_a, second) = (blk.add(N * 32) as *const f32, blk.add(N * 36));
            for (t, acc) in acc.iter_mut().enumerate() {
                let a = blk.add(t * 32) as *const i32;
                let group = |j: usize| _mm512_set1_epi32(a.add(j).read_unaligned());
                let (mut lo, mut hi) = match T {
                    MIN => (_mm512_setzero_si512(), _mm512_setzero_si512()),
                    _ => {
                        let start = (second as *const i32).add(t).read_unaligned();
                        (_mm512_set1_epi32(start), _mm512_setzero_si512())
                    }
                };
                for j in 0..4 {
                    lo = _mm512_dpbusd_epi32(lo, q[j], group(j));
                    hi = _mm512_dpbusd_epi32(hi, q[4 + j], group(4 + j));
                }
                let s = _mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi));
                let da = _mm512_set1_ps(d_a.add(t).read_unaligned());
                let term = match T {
                    MIN => {
                        let sa = _mm512_set1_ps((second as *const f32).add(t).read_unaligned());
                        _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(d, da), s), _mm512_mul_ps(m, sa))
                    }
                    SDD => _mm512_mul_ps(_mm512_mul_ps(s, d), da),
                    _ => _mm512_mul_ps(s, _mm512_mul_ps(d, da)),
                };
                *acc = _mm512_add_ps(*acc, term);
            }
        }
        store(&acc, first, rows, out);
    }
}

/// Dispatches `n_tokens` to the [`rows_n`] of that many tokens.
macro_rules! by_tokens {
    ($n_tokens:expr, $terms:expr, ($($arg:expr),*)) => {
        match $n_tokens {
            1 => rows_n::<1, $terms, _>($($arg),*),
            2 => rows_n::<2, $terms, _>($($arg),*),
            3 => rows_n::<3, $terms, _>($($arg),*),
            4 => rows_n::<4, $terms, _>($($arg),*),
            5 => rows_n::<5, $terms, _>($($arg),*),
            6 => rows_n::<6, $terms, _>($($arg),*),
            7 => rows_n::<7, $terms, _>($($arg),*),
            _ => rows_n::<8, $terms, _>($($arg),*),
        }
    };
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_q4_0<const HALVES: bool>(
    n: usize,
    w: &[u8],
    ws: usize,
    pack: &[u8],
    nt: usize,
    out: &mut [f32],
) {
    let wb = q4_0::BLOCK_BYTES;
    let low = _mm512_set1_epi8(0x0F);
    let gather = gathers(ws);
    let block = |row: &[*const u8; ROWS], off: usize| {
        // As Q4_1's nibbles (below), two bytes in; the `+ 8` is the pack's correction.
        let q = dwords4_by::<HALVES>(row, off + 2);
        let mut w = [_mm512_setzero_si512(); 8];
        for j in 0..4 {
            w[j] = _mm512_and_si512(q[j], low);
            w[4 + j] = _mm512_and_si512(_mm512_srli_epi16::<4>(q[j]), low);
        }
        let d = scales_f16::<HALVES>(row, off, gather);
        (w, d, d)
    };
    by_tokens!(nt, SDD, (n, w, ws, wb, pack, out, block))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_q5_0<const HALVES: bool>(
    n: usize,
    w: &[u8],
    ws: usize,
    pack: &[u8],
    nt: usize,
    out: &mut [f32],
) {
    let wb = q5_0::BLOCK_BYTES;
    let gather = gathers(ws);
    let low = _mm512_set1_epi8(0x0F);
    let sixteen = _mm512_set1_epi8(16);
    // Byte `b` of a dword tests bit `b` (even quant groups) or `4 + b` (odd) of its byte.
    let bits = [
        _mm512_set1_epi32(0x0804_0201),
        _mm512_set1_epi32(0x8040_2010u32 as i32),
    ];
    let spread = [
        spread_byte(0),
        spread_byte(1),
        spread_byte(2),
        spread_byte(3),
    ];
    let block = |row: &[*const u8; ROWS], off: usize| {
        // As Q4_0's nibbles, six bytes in; quant dword `j`'s fifth bits are bits
        // `4j .. 4j + 4` (low nibbles) and `16 + 4j ..` (high) of `qh`: byte `j / 2` or
        // `2 + j / 2`, copied to each byte and tested against that byte's bit.
        let q = dwords4_by::<HALVES>(row, off + 6);
        let qh = if gather {
            gather_dwords(row, off + 2)
        } else {
            dword0::<HALVES>(row, off + 2)
        };
        let mut w = [_mm512_setzero_si512(); 8];
        for j in 0..4 {
            let (lo, hi) = (
                _mm512_and_si512(q[j], low),
                _mm512_and_si512(_mm512_srli_epi16::<4>(q[j]), low),
            );
            let lo_set = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, spread[j / 2]), bits[j % 2]);
            let hi_set =
                _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, spread[2 + j / 2]), bits[j % 2]);
            // Nibbles are below 16: adding 16 sets the fifth bit.
            w[j] = _mm512_mask_add_epi8(lo, lo_set, lo, sixteen);
            w[4 + j] = _mm512_mask_add_epi8(hi, hi_set, hi, sixteen);
        }
        let d = scales_f16::<HALVES>(row, off, gather);
        (w, d, d)
    };
    by_tokens!(nt, SDD, (n, w, ws, wb, pack, out, block))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_q4_1<const HALVES: bool>(
    n: usize,
    w: &[u8],
    ws: usize,
    pack: &[u8],
    nt: usize,
    out: &mut [f32],
) {
    let wb = q4_1::BLOCK_BYTES;
    let low = _mm512_set1_epi8(0x0F);
    let block = |row: &[*const u8; ROWS], off: usize| {
        // Byte `b` of quant dword `j` holds element `4j + b` (low nibble) and `16 + 4j + b`
        // (high nibble): activation dwords `j` and `4 + j`.
        let q = dwords4_by::<HALVES>(row, off + 4);
        let mut w = [_mm512_setzero_si512(); 8];
        for j in 0..4 {
            w[j] = _mm512_and_si512(q[j], low);
            w[4 + j] = _mm512_and_si512(_mm512_srli_epi16::<4>(q[j]), low);
        }
        let (d, m) = f16_pair(dword0::<HALVES>(row, off));
        (w, d, m)
    };
    by_tokens!(nt, MIN, (n, w, ws, wb, pack, out, block))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_q8_0<const HALVES: bool>(
    n: usize,
    w: &[u8],
    ws: usize,
    pack: &[u8],
    nt: usize,
    out: &mut [f32],
) {
    let wb = q8_0::BLOCK_BYTES;
    let bias = _mm512_set1_epi8(0x80u8 as i8);
    let gather = gathers(ws);
    let block = |row: &[*const u8; ROWS], off: usize| {
        let (q0, q1) = (
            dwords4_by::<HALVES>(row, off + 2),
            dwords4_by::<HALVES>(row, off + 18),
        );
        let mut w = [_mm512_setzero_si512(); 8];
        for j in 0..4 {
            w[j] = _mm512_xor_si512(q0[j], bias);
            w[4 + j] = _mm512_xor_si512(q1[j], bias);
        }
        let d = scales_f16::<HALVES>(row, off, gather);
        (w, d, d)
    };
    by_tokens!(nt, SPROD, (n, w, ws, wb, pack, out, block))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_iq4_nl<const HALVES: bool>(
    n: usize,
    w: &[u8],
    ws: usize,
    pack: &[u8],
    nt: usize,
    out: &mut [f32],
) {
    let wb = iq4_nl::BLOCK_BYTES;
    let low = _mm512_set1_epi8(0x0F);
    let gather = gathers(ws);
    let table = iq4_table();
    let block = |row: &[*const u8; ROWS], off: usize| {
        // Q4_0's nibble layout, two bytes in; each nibble looked up in the table.
        let q = dwords4_by::<HALVES>(row, off + 2);
        let mut w = [_mm512_setzero_si512(); 8];
        for j in 0..4 {
            w[j] = _mm512_shuffle_epi8(table, _mm512_and_si512(q[j], low));
            let high = _mm512_and_si512(_mm512_srli_epi16::<4>(q[j]), low);
            w[4 + j] = _mm512_shuffle_epi8(table, high);
        }
        let d = scales_f16::<HALVES>(row, off, gather);
        (w, d, d)
    };
    // llama.cpp's order, as Q8_0's: `isum · (d_w · d_a)`.
    by_tokens!(nt, SPROD, (n, w, ws, wb, pack, out, block))
}

#[cfg(test)]
mod tests {
    #[test]
    fn f16_conversion_is_halfs_for_every_value() {
        for h in 0..=u16::MAX {
            let [lo, hi] = h.to_le_bytes();
            let want = half::f16::from_bits(h).to_f32();
            let got = super::f16_le_to_f32(lo, hi);
            assert_eq!(got.to_bits(), want.to_bits(), "f16 {h:#06x}");
        }
    }
}

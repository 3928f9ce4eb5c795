//! AVX-512 BF16 row-panel kernels for prefill with `vdpbf16ps`, which multiplies and adds
//! 32 BF16 pairs into 16 f32 lanes in one instruction (`panel512`'s float panels widen
//! BF16 to f32 and spend a multiply and an add per 16).
//!
//! The instruction keeps the scalar order. Lane `j` does `acc += a[2j+1]·b[2j+1]`, then
//! `acc += a[2j]·b[2j]`, each add rounded to nearest even, so panel and side data put
//! element `32c + j` at BF16 position `2j + 1` and element `32c + 16 + j` at `2j`: lane `j`
//! then accumulates elements `j, j+16, j+32, …` in order, as `formats::float::DOT_LANES`
//! does, and the `n % 16` tail is added after the fold in f32. BF16 products are exact in
//! f32, so two things remain that could differ from the scalar dot:
//! - the instruction reads subnormal inputs and writes subnormal results as zero (DAZ,
//!   FTZ). [`float::bf16_lane_sums_normal`] proves per tile, from the magnitude ranges
//!   that pack (per panel) and prep (per token) record, that no product or lane sum can
//!   be subnormal or infinite; where it cannot, that tile widens the same panel to f32
//!   and multiplies, then adds, in the same order.
//! - a vendor could implement it otherwise (the two adds fused, or the products summed
//!   first). [`probe_agrees`] checks the instruction once, on inputs that tell those apart;
//!   if it disagrees the kernels are not offered and `panel512`'s f32 panels run.
//!
//! Not for: F16 and F32 (`panel512`'s float panels).

use super::panel512::{fold16, fold16x16, FLOAT_ROWS as ROWS};
use crate::formats::float::{self, Bf16Range};
use crate::formats::x86::lanes256::f32_at;
use crate::formats::PanelKernels;
use core::arch::x86_64::*;
use std::sync::OnceLock;

/// Tokens per register tile: sixteen accumulators, four weight vectors.
const TOKENS: usize = 4;
/// Bytes before the chunks of a panel or a token's side data: the magnitude range, then
/// padding to a cache line.
const HEAD: usize = 64;

/// 32-element chunks of a row of `n`: its whole 16-element runs in pairs, the last one
/// maybe alone (with zeros in its second half).
fn chunks(n: usize) -> usize {
    (n / 16).div_ceil(2)
}

/// Panel: the range, then `[chunk][row]` vectors of interleaved BF16 pairs, then each
/// row's `n % 16` tail as f32 (one vector's room per row).
fn panel_bytes(n: usize) -> usize {
    HEAD + 64 * ROWS * (chunks(n) + usize::from(!n.is_multiple_of(16)))
}

/// A token's side data: the range, its interleaved chunks, then its tail as f32.
fn aux_bytes(n: usize) -> usize {
    HEAD + 64 * (chunks(n) + usize::from(!n.is_multiple_of(16)))
}

/// The kernels, where this CPU has `avx512bf16` and its `vdpbf16ps` computes as the
/// scalar order does (checked once).
pub(in crate::formats::x86) fn kernels() -> Option<PanelKernels> {
    available().then_some(PanelKernels {
        rows: ROWS,
        tokens: TOKENS,
        panel_bytes,
        pack,
        aux_bytes,
        prep,
        gemm,
        reads_acts: false,
    })
}

fn available() -> bool {
    static AGREES: OnceLock<bool> = OnceLock::new();
    *AGREES.get_or_init(|| {
        is_x86_feature_detected!("avx512bf16")
            && has_avx512()
            // SAFETY: the features it needs were detected just above.
            && probe_agrees(|acc, a, b| unsafe { dp_arrays(acc, a, b) })
    })
}

/// The other features the tiles use (`dispatch` checks them for the level, but the probe
/// runs on its own).
fn has_avx512() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// One `vdpbf16ps` on arrays: lane `j` of `acc` plus the products of BF16 positions
/// `2j + 1` and `2j` of `a` and `b`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn dp_arrays(acc: [f32; 16], a: [u16; 32], b: [u16; 32]) -> [f32; 16] {
    let bh = |v: [u16; 32]| core::mem::transmute::<[u16; 32], __m512bh>(v);
    let r = _mm512_dpbf16_ps(_mm512_loadu_ps(acc.as_ptr()), bh(a), bh(b));
    let mut out = [0.0f32; 16];
    _mm512_storeu_ps(out.as_mut_ptr(), r);
    out
}

fn widen(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// The scalar order: position `2j + 1`'s product added, rounded, then position `2j`'s.
fn dp_in_order(acc: [f32; 16], a: [u16; 32], b: [u16; 32]) -> [f32; 16] {
    core::array::from_fn(|j| {
        (acc[j] + widen(a[2 * j + 1]) * widen(b[2 * j + 1])) + widen(a[2 * j]) * widen(b[2 * j])
    })
}

/// Whether `dp` (one `vdpbf16ps`) returns [`dp_in_order`]'s bits on inputs where the other
/// ways to compute it differ: both adds in one rounding, the products summed first, the
/// even position first, truncation instead of round-to-nearest-even; then on random
/// normal inputs (products and sums far from the subnormals), chained as a dot chains them.
pub(super) fn probe_agrees(dp: impl Fn([f32; 16], [u16; 32], [u16; 32]) -> [f32; 16]) -> bool {
    let bf = |x: f32| (x.to_bits() >> 16) as u16;
    let p = |e: i32| 2f32.powi(e);
    // (acc, odd position's product, even position's product), each product `x · 1`.
    let crafted: [(f32, f32, f32); 16] = [
        (1.0, p(-24), p(-24)),       // in order: 1 (two ties to even); fused: 1 + 2^-23
        (1.0, -1.0, p(-30)),         // in order: 2^-30; even first: 0
        (1.0, p(-30), -1.0),         // in order: 0; even first: 2^-30
        (1.0, 3.0 * p(-25), 0.0),    // nearest: 1 + 2^-23; truncated: 1
        (1.0 + p(-23), p(-24), 0.0), // tie to even: 1 + 2^-22
        (-1.0, -3.0 * p(-25), 0.0),  // nearest, negative: -(1 + 2^-23)
        (-1.0, p(-24), p(-24)),      // below 1 the ulp halves: exact, -1 + 2^-23
        (p(20), 1.0, -p(20)),        // in order: 0 (1 lost, then cancelled); fused: 1
        (0.0, -0.0, -0.0),           // zero signs: +0
        (p(-100), p(-100), p(-101)), // small but normal
        (3.0, p(-22), -p(-23)),      // in order: 3 + 2^-22, then a tie back to 3
        (1.5, p(-24), p(-24)),       // in order: two ties to even, 1.5; fused: 1.5 + 2^-23
        (0.0, p(60), p(60)),         // large
        (1.0, -p(-25), -p(-25)),     // below 1: ulp 2^-24, each a tie to even
        (-p(-20), p(-20), p(-40)),   // cancellation to zero, then 2^-40
        (7.0, 0.0, 0.0),
    ];
    let mut acc = [0.0f32; 16];
    let (mut a, mut b) = ([0u16; 32], [bf(1.0); 32]);
    for (j, &(s, odd, even)) in crafted.iter().enumerate() {
        acc[j] = s;
        a[2 * j + 1] = bf(odd);
        a[2 * j] = bf(even);
    }
    let same =
        |x: [f32; 16], y: [f32; 16]| x.iter().zip(&y).all(|(x, y)| x.to_bits() == y.to_bits());
    if !same(dp(acc, a, b), dp_in_order(acc, a, b)) {
        return false;
    }
    // Random normal BF16 of magnitude 2^-8 .. 2^8, accumulated over 64 steps.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let r = (state >> 33) as u16;
        let exp = 119 + (r >> 7) % 17;
        (r & 0x8000) | exp << 7 | (r & 0x7F)
    };
    let (mut hw, mut sw) = ([0.0f32; 16], [0.0f32; 16]);
    for _ in 0..64 {
        a = core::array::from_fn(|_| next());
        b = core::array::from_fn(|_| next());
        hw = dp(hw, a, b);
        sw = dp_in_order(sw, a, b);
        if !same(hw, sw) {
            return false;
        }
    }
    true
}

/// Little-endian BF16 `i` of the row at `p`.
#[inline]
unsafe fn bf16_bits(p: *const u8, i: usize) -> u16 {
    (p.add(2 * i) as *const u16).read_unaligned()
}

fn put_range(dst: &mut [u8], r: Bf16Range) {
    dst[0..2].copy_from_slice(&r.max.to_le_bytes());
    dst[2..4].copy_from_slice(&r.min_nonzero.to_le_bytes());
}

fn range_at(src: &[u8]) -> Bf16Range {
    Bf16Range {
        max: u16::from_le_bytes([src[0], src[1]]),
        min_nonzero: u16::from_le_bytes([src[2], src[3]]),
    }
}

/// Writes the `n` BF16 of the row at `src` as interleaved chunks, chunk `c` at
/// `dst + step·c` (lane `j`: element `32c + j` high, `32c + 16 + j` low), and its `n % 16`
/// tail as f32 at `tail`; returns the row's magnitude range.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn interleave_row(
    n: usize,
    src: *const u8,
    dst: *mut u8,
    step: usize,
    tail: *mut f32,
) -> Bf16Range {
    let full = n / 16 * 16;
    let magnitude = _mm512_set1_epi16(0x7FFF);
    let (mut max, mut min) = (_mm512_setzero_si512(), magnitude);
    // BF16 position `2j + 1` takes element `j`, position `2j` element `16 + j`.
    let order: [u16; 32] = core::array::from_fn(|p| (p / 2 + 16 * (1 - p % 2)) as u16);
    let order = _mm512_loadu_si512(order.as_ptr() as *const _);
    for c in 0..chunks(n) {
        // A whole chunk, or the last run of 16 alone, its partner zeros.
        let mask: __mmask32 = if full - 32 * c >= 32 { !0 } else { 0xFFFF };
        let v = _mm512_maskz_loadu_epi16(mask, src.add(64 * c) as *const i16);
        let m = _mm512_and_si512(v, magnitude);
        max = _mm512_max_epu16(max, m);
        let zero = _mm512_cmpeq_epi16_mask(m, _mm512_setzero_si512());
        min = _mm512_min_epu16(min, _mm512_mask_mov_epi16(m, zero, magnitude));
        let pairs = _mm512_permutexvar_epi16(order, v);
        _mm512_storeu_si512(dst.add(step * c) as *mut _, pairs);
    }
    let (mut maxs, mut mins) = ([0u16; 32], [0u16; 32]);
    _mm512_storeu_si512(maxs.as_mut_ptr() as *mut _, max);
    _mm512_storeu_si512(mins.as_mut_ptr() as *mut _, min);
    let mut range = Bf16Range {
        max: maxs.into_iter().max().unwrap_or(0),
        min_nonzero: mins.into_iter().min().unwrap_or(0x7FFF),
    };
    for i in full..n {
        let b = bf16_bits(src, i);
        range = range.merge(Bf16Range::of([b]));
        tail.add(i - full).write_unaligned(widen(b));
    }
    range
}

fn pack(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]) {
    assert!(
        panel.len() >= panel_bytes(n) && w.len() >= (ROWS - 1) * w_stride + 2 * n,
        "panel pack: short buffers"
    );
    let tails = HEAD + 64 * ROWS * chunks(n);
    let mut range = Bf16Range::EMPTY;
    for r in 0..ROWS {
        let p = panel.as_mut_ptr();
        // SAFETY: reached only through `kernels`, handed out after detecting the features;
        // the row and every chunk and tail written lie inside the buffers checked above.
        let row = unsafe {
            interleave_row(
                n,
                w.as_ptr().add(r * w_stride),
                p.add(HEAD + 64 * r),
                64 * ROWS,
                // (past the end, never written, where the rows have no tail)
                p.wrapping_add(tails + 64 * r) as *mut f32,
            )
        };
        range = range.merge(row);
    }
    put_range(panel, range);
}

fn prep(n: usize, act: &[u8], aux: &mut [u8]) {
    assert!(
        act.len() >= 2 * n && aux.len() >= aux_bytes(n),
        "panel prep: short rows"
    );
    let p = aux.as_mut_ptr();
    // SAFETY: as for `pack`.
    let range = unsafe {
        interleave_row(
            n,
            act.as_ptr(),
            p.add(HEAD),
            64,
            p.add(HEAD + 64 * chunks(n)) as *mut f32,
        )
    };
    put_range(aux, range);
}

/// `G` tokens (side data `aux_stride` bytes apart) against a panel; token `k`'s four
/// results go to `out[4k ..]`. `DP`: by `vdpbf16ps`; otherwise each pair widened and
/// multiplied, then added, in f32 (any inputs).
// (VNNI too: `panel512`'s folds are compiled with it, and inline only into a superset.)
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16")]
#[allow(clippy::needless_range_loop)] // r and k index the accumulators, rows and tokens
unsafe fn tile<const G: usize, const DP: bool>(
    n: usize,
    panel: *const u8,
    aux: *const u8,
    aux_stride: usize,
    out: *mut f32,
) {
    let nc = chunks(n);
    let high = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
    // The pair's first element (high half) and second (low half) as f32.
    let first = |v: __m512i| _mm512_castsi512_ps(_mm512_and_si512(v, high));
    let second = |v: __m512i| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v));
    let mut acc = [[_mm512_setzero_ps(); G]; ROWS];
    for c in 0..nc {
        let w: [__m512i; ROWS] = core::array::from_fn(|r| {
            _mm512_loadu_si512(panel.add(HEAD + 64 * (c * ROWS + r)) as *const _)
        });
        for k in 0..G {
            let a = _mm512_loadu_si512(aux.add(k * aux_stride + HEAD + 64 * c) as *const _);
            for r in 0..ROWS {
                acc[r][k] = if DP {
                    let bh = |v: __m512i| core::mem::transmute::<__m512i, __m512bh>(v);
                    _mm512_dpbf16_ps(acc[r][k], bh(w[r]), bh(a))
                } else {
                    let s = _mm512_add_ps(acc[r][k], _mm512_mul_ps(first(w[r]), first(a)));
                    _mm512_add_ps(s, _mm512_mul_ps(second(w[r]), second(a)))
                };
            }
        }
    }
    if G == TOKENS {
        // Lane `4k + r` of the fold is row `r`, token `k` (see `fold16x16`).
        let v = core::array::from_fn(|j| acc[j / G][j % G]);
        _mm512_storeu_ps(out, fold16x16(v));
    } else {
        for k in 0..G {
            for r in 0..ROWS {
                *out.add(ROWS * k + r) = fold16(acc[r][k]);
            }
        }
    }
    let tails = HEAD + 64 * ROWS * nc;
    for k in 0..G {
        let a = aux.wrapping_add(k * aux_stride + HEAD + 64 * nc);
        for r in 0..ROWS {
            let sum = &mut *out.add(ROWS * k + r);
            for i in 0..n % 16 {
                *sum += f32_at(panel.add(tails + 64 * r + 4 * i)) * f32_at(a.add(4 * i));
            }
        }
    }
}

/// Tile `G` by `vdpbf16ps` or in f32.
fn tile_of<const G: usize>(dp: bool) -> unsafe fn(usize, *const u8, *const u8, usize, *mut f32) {
    if dp {
        tile::<G, true>
    } else {
        tile::<G, false>
    }
}

/// The gemm, with `force` choosing the tiles' arithmetic instead of the range bound (tests).
fn gemm_with(
    n: usize,
    panel: &[u8],
    aux: &[u8],
    aux_stride: usize,
    out: &mut [f32],
    force: Option<bool>,
) {
    let nt = out.len() / ROWS;
    assert!(panel.len() >= panel_bytes(n), "panel gemm: short panel");
    if nt > 0 {
        assert!(
            aux_stride >= aux_bytes(n) && aux.len() >= (nt - 1) * aux_stride + aux_bytes(n),
            "panel gemm: short side data"
        );
    }
    let w_range = range_at(panel);
    let a_range = |t: usize, g: usize| {
        (t..t + g).fold(Bf16Range::EMPTY, |r, k| {
            r.merge(range_at(&aux[k * aux_stride..]))
        })
    };
    // Usually every token of the block qualifies: one check, not one per tile.
    let all =
        force.or_else(|| float::bf16_lane_sums_normal(w_range, a_range(0, nt), n).then_some(true));
    let mut t = 0;
    while t < nt {
        let g = (nt - t).min(TOKENS);
        let dp = all.unwrap_or_else(|| float::bf16_lane_sums_normal(w_range, a_range(t, g), n));
        let (x, o) = (aux[t * aux_stride..].as_ptr(), out[ROWS * t..].as_mut_ptr());
        // SAFETY: reached only through `kernels`, handed out after detecting the features
        // (and checking the instruction's order); the checks above cover every byte the
        // tile reads and writes.
        unsafe {
            let f = match g {
                1 => tile_of::<1>(dp),
                2 => tile_of::<2>(dp),
                3 => tile_of::<3>(dp),
                _ => tile_of::<TOKENS>(dp),
            };
            f(n, panel.as_ptr(), x, aux_stride, o);
        }
        t += g;
    }
}

// The tiles read the activations from `aux` (interleaved by `prep`), not `acts`.
fn gemm(
    n: usize,
    panel: &[u8],
    _acts: &[u8],
    _a_stride: usize,
    aux: &[u8],
    aux_stride: usize,
    out: &mut [f32],
) {
    gemm_with(n, panel, aux, aux_stride, out, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::float::vec_dot_bf16;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Both adds rounded once, as a fused three-way sum would.
    fn fused(acc: [f32; 16], a: [u16; 32], b: [u16; 32]) -> [f32; 16] {
        core::array::from_fn(|j| {
            let p = |i: usize| widen(a[i]) as f64 * widen(b[i]) as f64;
            (acc[j] as f64 + p(2 * j + 1) + p(2 * j)) as f32
        })
    }

    fn products_first(acc: [f32; 16], a: [u16; 32], b: [u16; 32]) -> [f32; 16] {
        core::array::from_fn(|j| {
            let p = |i: usize| widen(a[i]) * widen(b[i]);
            acc[j] + (p(2 * j + 1) + p(2 * j))
        })
    }

    fn even_first(acc: [f32; 16], a: [u16; 32], b: [u16; 32]) -> [f32; 16] {
        core::array::from_fn(|j| {
            let p = |i: usize| widen(a[i]) * widen(b[i]);
            (acc[j] + p(2 * j)) + p(2 * j + 1)
        })
    }

    /// Each add rounded toward zero.
    fn truncating(acc: [f32; 16], a: [u16; 32], b: [u16; 32]) -> [f32; 16] {
        let add = |x: f32, y: f32| {
            let exact = x as f64 + y as f64;
            let r = exact as f32;
            if (r as f64).abs() > exact.abs() {
                f32::from_bits(r.to_bits() - 1)
            } else {
                r
            }
        };
        core::array::from_fn(|j| {
            let p = |i: usize| widen(a[i]) * widen(b[i]);
            add(add(acc[j], p(2 * j + 1)), p(2 * j))
        })
    }

    #[test]
    fn probe_tells_the_orders_apart() {
        assert!(probe_agrees(dp_in_order));
        assert!(!probe_agrees(fused));
        assert!(!probe_agrees(products_first));
        assert!(!probe_agrees(even_first));
        assert!(!probe_agrees(truncating));
        if is_x86_feature_detected!("avx512bf16") && has_avx512() {
            // SAFETY: the features were detected just above.
            let hw = probe_agrees(|acc, a, b| unsafe { dp_arrays(acc, a, b) });
            eprintln!("this CPU's vdpbf16ps keeps the scalar order: {hw}");
        }
    }

    fn bf16_row(rng: &mut ChaCha8Rng, n: usize, kind: &str) -> Vec<u8> {
        let mut v: Vec<f32> = (0..n)
            .map(|_| {
                let x = rng.gen_range(-1.0f32..1.0);
                match kind {
                    "random" => x * 2.0,
                    "wide" => x * 2f32.powi(rng.gen_range(-40..40)),
                    "subnormal" => x * 1e-39,
                    "tiny" => x * 1e-30,
                    // Products of two in f32's subnormal range: flushed by the instruction.
                    "small" => x * 1e-21,
                    "huge" => x * 1e37,
                    "zero" => 0.0,
                    _ => x,
                }
            })
            .collect();
        match kind {
            "inf" => v[n / 2] = f32::INFINITY,
            "nan" => v[n - 1] = f32::NAN,
            _ => {}
        }
        v.iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect()
    }

    const KINDS: [&str; 10] = [
        "random",
        "wide",
        "subnormal",
        "small",
        "tiny",
        "huge",
        "zero",
        "inf",
        "nan",
        "random",
    ];

    /// Panels of four rows of one kind against tokens of every kind, through `gemm_with`.
    fn check(force: Option<bool>, usable: impl Fn(&str, &str) -> bool) {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for n in [1, 2, 15, 16, 17, 31, 32, 33, 47, 48, 49, 64, 100, 576, 1000] {
            let acts: Vec<Vec<u8>> = KINDS.iter().map(|k| bf16_row(&mut rng, n, k)).collect();
            let aux_stride = aux_bytes(n) + 64;
            let mut aux = vec![0xAAu8; acts.len() * aux_stride];
            for (a, x) in acts.iter().zip(aux.chunks_exact_mut(aux_stride)) {
                prep(n, a, x);
            }
            for w_kind in KINDS {
                let w_stride = 2 * n + 6;
                let mut w = vec![0u8; ROWS * w_stride];
                for r in 0..ROWS {
                    let kind = if r == 3 { "random" } else { w_kind };
                    w[r * w_stride..r * w_stride + 2 * n]
                        .copy_from_slice(&bf16_row(&mut rng, n, kind));
                }
                let mut panel = vec![0x55u8; panel_bytes(n)];
                pack(n, &w, w_stride, &mut panel);
                for first in 0..KINDS.len() {
                    for count in 1..=TOKENS.min(KINDS.len() - first) {
                        let tokens = first..first + count;
                        if !tokens.clone().all(|t| usable(w_kind, KINDS[t])) {
                            continue;
                        }
                        let mut out = vec![f32::NAN; count * ROWS];
                        let x = &aux[first * aux_stride..];
                        gemm_with(n, &panel, x, aux_stride, &mut out, force);
                        for (k, t) in tokens.enumerate() {
                            for r in 0..ROWS {
                                let want = vec_dot_bf16(n, &w[r * w_stride..], &acts[t]);
                                let got = out[ROWS * k + r];
                                assert!(
                                    got.to_bits() == want.to_bits()
                                        || got.is_nan() && want.is_nan(),
                                    "{force:?} n={n} rows {w_kind} row {r} token {} \
                                     (tile of {count}): {got:e} vs scalar {want:e}",
                                    KINDS[t]
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn tiles_match_scalar() {
        if !available() {
            eprintln!("no avx512bf16 (or it keeps another order): vdpbf16ps panels skipped");
            return;
        }
        // Chosen by the range bound, any inputs.
        check(None, |_, _| true);
        // Widened f32 arithmetic, any inputs.
        check(Some(false), |_, _| true);
        // `vdpbf16ps` alone, where the inputs are normal and modest.
        let modest = |k: &str| matches!(k, "random" | "wide" | "zero");
        check(Some(true), |w, a| {
            modest(w) && modest(a) && (w, a) != ("wide", "wide")
        });
    }

    /// Normal products whose lane sum is subnormal: the instruction flushes it, so the
    /// range bound must send the tile to f32.
    #[test]
    fn subnormal_lane_sums_take_f32() {
        if !available() {
            return;
        }
        let n = 32;
        let bits = |x: f32| half::bf16::from_f32(x).to_le_bytes();
        let p = 2f32.powi(-60);
        // Lane 0: 2^-120·(1 + 2^-7), then −2^-120: 2^-127.
        let (mut w, mut a) = (vec![0u8; ROWS * 2 * n], vec![0u8; 2 * n]);
        for r in 0..ROWS {
            w[r * 2 * n..][..2].copy_from_slice(&bits(p * (1.0 + 2f32.powi(-7))));
            w[r * 2 * n + 32..][..2].copy_from_slice(&bits(-p));
        }
        a[..2].copy_from_slice(&bits(p));
        a[32..34].copy_from_slice(&bits(p));
        let want = vec_dot_bf16(n, &w, &a);
        assert_eq!(want, 2f32.powi(-127));
        let mut panel = vec![0u8; panel_bytes(n)];
        pack(n, &w, 2 * n, &mut panel);
        let mut aux = vec![0u8; aux_bytes(n)];
        prep(n, &a, &mut aux);
        let run = |force| {
            let mut out = [f32::NAN; ROWS];
            gemm_with(n, &panel, &aux, aux_bytes(n), &mut out, force);
            out[0]
        };
        assert_eq!(run(Some(true)), 0.0, "vdpbf16ps flushes the subnormal sum");
        assert_eq!(run(None).to_bits(), want.to_bits());
    }

    #[test]
    fn range_bound_picks_the_instruction_for_ordinary_inputs() {
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        let n = 576;
        let row = |rng: &mut ChaCha8Rng, kind| {
            let r = bf16_row(rng, n, kind);
            Bf16Range::of(r.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])))
        };
        let (w, a) = (row(&mut rng, "random"), row(&mut rng, "wide"));
        assert!(float::bf16_lane_sums_normal(w, a, n));
        for bad in ["subnormal", "inf", "nan"] {
            assert!(
                !float::bf16_lane_sums_normal(w, row(&mut rng, bad), n),
                "{bad}"
            );
        }
    }
}

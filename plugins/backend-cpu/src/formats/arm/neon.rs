//! NEON kernels for every quantized weight format (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K to
//! Q6_K, MXFP4; not yet IQ4_NL/IQ4_XS) and F32: each block's products in vector lanes, the block's float
//! term as the scalar kernel computes it. Each kernel comes in two builds that differ only
//! in how 16 byte products reach four i32 lanes ([`Products`]): plain NEON (`vmull_s8` /
//! `vmlal_high_s8` into i16, pairwise widening adds), or one `sdot` where the CPU has the
//! dot-product extension. Both give the same exact integer sums.
//!
//! Not here yet: the multi-token prefill tiles (prefill calls these per token). F32's dot
//! is [`dot_f32`] (the scalar one's `f32::mul_add` lanes stay scalar: measured, one
//! `fmadd` at a time); F16 and BF16 keep their scalar dot, whose 16-lane order the
//! compiler vectorises as it is.

use crate::formats::k_quants::{q2_k, q3_k, q4_k, q5_k, q6_k, q8_k, unpack_scale_min_k4, QK_K};
use crate::formats::{f16_at, f32_at, mxfp4, q4_0, q4_1, q5_0, q5_1, q8_0, q8_1, FormatKernels};
use core::arch::aarch64::*;
use prima_abi::GgmlType;

/// Replaces the functions of `k` (the scalar table) that have a NEON version; with
/// `dotprod`, the builds that use `sdot`.
///
/// The caller must only pass `dotprod` on a CPU that has the dot-product extension
/// (`dispatch` checks it): those kernels execute `sdot`.
pub(in crate::formats) fn overlay(mut k: FormatKernels, dotprod: bool) -> FormatKernels {
    k.vec_dot = if dotprod {
        kernel::<Sdot>(k.weight_type)
    } else {
        kernel::<Widening>(k.weight_type)
    }
    .unwrap_or(k.vec_dot);
    k
}

/// The kernel of weight type `t` built on `P`, where there is one.
fn kernel<P: Products>(t: GgmlType) -> Option<crate::formats::VecDotFn> {
    use GgmlType as T;
    Some(match t {
        T::Q4_0 => dot_q4_0::<P>,
        T::Q4_1 => dot_q4_1::<P>,
        T::Q5_0 => dot_q5_0::<P>,
        T::Q5_1 => dot_q5_1::<P>,
        T::Q8_0 => dot_q8_0::<P>,
        T::Q2K => dot_q2_k::<P>,
        T::Q3K => dot_q3_k::<P>,
        T::Q4K => dot_q4_k::<P>,
        T::Q5K => dot_q5_k::<P>,
        T::Q6K => dot_q6_k::<P>,
        T::MXFP4 => dot_mxfp4::<P>,
        T::F32 => dot_f32,
        _ => return None,
    })
}

/// F32's canonical dot (`formats::float::DOT_LANES`): lanes `0..16` as four vectors, each
/// term a fused multiply-add (`vfmaq_f32`, one rounding, as `f32::mul_add`), folded by
/// halving (`l + l+8`, `+4`, `+2`, `+1`), then the `n % 16` tail fused in order.
fn dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let n = n.min(w.len() / 4).min(a.len() / 4);
    let full = n / 16 * 16;
    let (wp, ap) = (w.as_ptr() as *const f32, a.as_ptr() as *const f32);
    // SAFETY: NEON is baseline; each load reads four f32s at element `i + 4k + 3 < full ≤ n`,
    // within both rows (`vld1q_f32` needs no alignment).
    let mut sum = unsafe {
        let mut acc = [vdupq_n_f32(0.0); 4];
        for i in (0..full).step_by(16) {
            for (k, acc) in acc.iter_mut().enumerate() {
                let (x, y) = (vld1q_f32(wp.add(i + 4 * k)), vld1q_f32(ap.add(i + 4 * k)));
                *acc = vfmaq_f32(*acc, x, y);
            }
        }
        // Lanes 0..4 after `l + l+8` and `+4`; then `+2` and `+1`.
        let v = vaddq_f32(vaddq_f32(acc[0], acc[2]), vaddq_f32(acc[1], acc[3]));
        let h = vadd_f32(vget_low_f32(v), vget_high_f32(v));
        vget_lane_f32::<0>(h) + vget_lane_f32::<1>(h)
    };
    for i in full..n {
        sum = f32_at(w, 4 * i).mul_add(f32_at(a, 4 * i), sum);
    }
    sum
}

/// How 16 signed-byte products `x·y` become four i32 lanes whose total is `Σ x·y`.
trait Products {
    fn products(x: int8x16_t, y: int8x16_t) -> int32x4_t;
}

/// Plain NEON: products in i16 lanes, summed in pairs and widened. The i16 lanes hold two
/// products each, at most 2 · 128 · 127 in size (activations from the quantizers are
/// within ±127), so nothing saturates.
struct Widening;

impl Products for Widening {
    #[inline(always)]
    fn products(x: int8x16_t, y: int8x16_t) -> int32x4_t {
        // SAFETY: NEON is part of the aarch64 baseline.
        unsafe {
            vpaddlq_s16(vmlal_high_s8(
                vmull_s8(vget_low_s8(x), vget_low_s8(y)),
                x,
                y,
            ))
        }
    }
}

/// The dot-product extension: one `sdot` sums each group of four products into a lane.
/// Only reachable through `overlay(_, true)`, which `dispatch` calls after detecting the
/// extension. (`vdotq_s32` is not stable Rust yet, hence the one-instruction `asm!`.)
struct Sdot;

impl Products for Sdot {
    #[inline(always)]
    fn products(x: int8x16_t, y: int8x16_t) -> int32x4_t {
        // SAFETY: `sdot` only reads its three vector registers and writes the first; the
        // CPU has the dot-product extension (see the type's comment).
        unsafe {
            let mut acc = vdupq_n_s32(0);
            core::arch::asm!(
                ".arch_extension dotprod",
                "sdot {acc:v}.4s, {x:v}.16b, {y:v}.16b",
                acc = inout(vreg) acc,
                x = in(vreg) x,
                y = in(vreg) y,
                options(pure, nomem, nostack, preserves_flags),
            );
            acc
        }
    }
}

/// The 16 activation bytes at `y` as signed bytes.
#[inline(always)]
fn act16(y: &[u8]) -> int8x16_t {
    assert!(y.len() >= 16);
    // SAFETY: NEON is baseline; `y` holds at least 16 bytes (above).
    unsafe { vld1q_s8(y.as_ptr() as *const i8) }
}

/// `Σ x·y` over 16 signed bytes against 16 activation bytes at `y`.
#[inline(always)]
fn dot16<P: Products>(x: int8x16_t, y: &[u8]) -> i32 {
    // SAFETY: NEON is baseline.
    unsafe { vaddvq_s32(P::products(x, act16(y))) }
}

/// `Σ x·y` over 16 + 16 signed bytes: `(x_lo, x_hi)` against 32 activation bytes at `y`.
#[inline(always)]
fn dot32<P: Products>(x_lo: int8x16_t, x_hi: int8x16_t, y: &[u8]) -> i32 {
    let (lo, hi) = (
        P::products(x_lo, act16(y)),
        P::products(x_hi, act16(&y[16..])),
    );
    // SAFETY: NEON is baseline.
    unsafe { vaddvq_s32(vaddq_s32(lo, hi)) }
}

/// The 16 quant bytes at `qs[..16]` as low nibbles (elements 0..16) and high nibbles
/// (elements 16..32), each minus `offset`.
#[inline]
fn nibbles(qs: &[u8], offset: i8) -> (int8x16_t, int8x16_t) {
    assert!(qs.len() >= 16);
    // SAFETY: NEON is baseline; `qs` holds at least 16 bytes (above).
    unsafe {
        let q = vld1q_u8(qs.as_ptr());
        let lo = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F)));
        let hi = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
        let off = vdupq_n_s8(offset);
        (vsubq_s8(lo, off), vsubq_s8(hi, off))
    }
}

fn dot_q4_0<P: Products>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(q4_0::BLOCK_BYTES)
        .zip(a.chunks_exact(q8_0::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / 32) {
        let (lo, hi) = nibbles(&wb[2..], 8);
        let isum = dot32::<P>(lo, hi, &ab[2..]);
        sum += isum as f32 * f16_at(wb, 0) * f16_at(ab, 0);
    }
    sum
}

fn dot_q4_1<P: Products>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(q4_1::BLOCK_BYTES)
        .zip(a.chunks_exact(q8_1::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / 32) {
        let (lo, hi) = nibbles(&wb[4..], 0);
        sum += q4_1_term(wb, ab, dot32::<P>(lo, hi, &ab[4..]));
    }
    sum
}

/// MXFP4: each nibble looked up in the doubled E2M1 table ([`mxfp4::KVALUES`], one
/// 16-byte `tbl`), then dotted as Q8_0 (values within ±12: the widening products cannot
/// saturate); the block term is the scalar kernel's `isum · (e8m0_half(e) · d_a)`.
fn dot_mxfp4<P: Products>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: NEON is baseline; the table holds 16 bytes.
    let table = unsafe { vld1q_s8(mxfp4::KVALUES.as_ptr()) };
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(mxfp4::BLOCK_BYTES)
        .zip(a.chunks_exact(q8_0::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / 32) {
        let (lo, hi) = nibbles(&wb[1..], 0);
        // SAFETY: NEON is baseline; the nibbles (0..16) index within the table.
        let (lo, hi) = unsafe {
            (
                vqtbl1q_s8(table, vreinterpretq_u8_s8(lo)),
                vqtbl1q_s8(table, vreinterpretq_u8_s8(hi)),
            )
        };
        let isum = dot32::<P>(lo, hi, &ab[2..]);
        sum += isum as f32 * (mxfp4::e8m0_half(wb[0]) * f16_at(ab, 0));
    }
    sum
}

fn dot_q5_0<P: Products>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(q5_0::BLOCK_BYTES)
        .zip(a.chunks_exact(q8_0::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / 32) {
        // Bit i of the 32-bit `qh` is the fifth bit of element i; the value is q − 16.
        let (lo, hi) = fifth_bit_quants(&wb[2..], &wb[6..]);
        // SAFETY: NEON is baseline.
        let (lo, hi) = unsafe {
            let sixteen = vdupq_n_s8(16);
            (vsubq_s8(lo, sixteen), vsubq_s8(hi, sixteen))
        };
        let isum = dot32::<P>(lo, hi, &ab[2..]);
        sum += isum as f32 * f16_at(wb, 0) * f16_at(ab, 0);
    }
    sum
}

/// The 32 five-bit quants (0..=31) of a Q5_0/Q5_1 block: the nibbles at `qs[..16]`
/// (elements 0..16 low, 16..32 high) with bit `i` of the little-endian u32 at `qh` as
/// element `i`'s fifth bit.
#[inline(always)]
fn fifth_bit_quants(qh: &[u8], qs: &[u8]) -> (int8x16_t, int8x16_t) {
    assert!(qh.len() >= 4);
    let (lo, hi) = nibbles(qs, 0);
    // SAFETY: NEON is baseline.
    unsafe {
        let bit = vld1q_u8([1u8, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128].as_ptr());
        // 0x10 in lane i where bit i of the two bytes is set.
        let fifth = |b: &[u8]| {
            let bytes = vcombine_u8(vdup_n_u8(b[0]), vdup_n_u8(b[1]));
            vreinterpretq_s8_u8(vandq_u8(vtstq_u8(bytes, bit), vdupq_n_u8(0x10)))
        };
        (
            vorrq_s8(lo, fifth(&qh[..2])),
            vorrq_s8(hi, fifth(&qh[2..4])),
        )
    }
}

/// `d · d_a · isum + m · s_a`, the Q4_1/Q5_1 block term in the scalar order (`wb` and
/// `ab` start with their f16 pairs).
#[inline(always)]
fn q4_1_term(wb: &[u8], ab: &[u8], isum: i32) -> f32 {
    let (d, m) = (f16_at(wb, 0), f16_at(wb, 2));
    let (d_a, s_a) = (f16_at(ab, 0), f16_at(ab, 2));
    d * d_a * isum as f32 + m * s_a
}

fn dot_q5_1<P: Products>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(q5_1::BLOCK_BYTES)
        .zip(a.chunks_exact(q8_1::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / 32) {
        // As Q5_0 without the −16: quants 0..=31 against Q8_1 activations.
        let (lo, hi) = fifth_bit_quants(&wb[4..], &wb[8..]);
        sum += q4_1_term(wb, ab, dot32::<P>(lo, hi, &ab[4..]));
    }
    sum
}

fn dot_q8_0<P: Products>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(q8_0::BLOCK_BYTES)
        .zip(a.chunks_exact(q8_0::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / 32) {
        // SAFETY: NEON is baseline; a Q8_0 block holds 2 + 32 bytes.
        let (lo, hi) = unsafe {
            (
                vld1q_s8(wb.as_ptr().add(2) as *const i8),
                vld1q_s8(wb.as_ptr().add(18) as *const i8),
            )
        };
        let isum = dot32::<P>(lo, hi, &ab[2..]);
        sum += isum as f32 * (f16_at(wb, 0) * f16_at(ab, 0));
    }
    sum
}

/// The 2-bit quants `(qs[k] >> 2s) & 3` of the 16 bytes at `qs`, as signed bytes.
#[inline(always)]
fn crumbs(qs: &[u8], s: usize) -> int8x16_t {
    assert!(qs.len() >= 16);
    // SAFETY: NEON is baseline; `qs` holds at least 16 bytes (above).
    unsafe {
        let q = vld1q_u8(qs.as_ptr());
        let q = match s {
            0 => q,
            1 => vshrq_n_u8(q, 2),
            2 => vshrq_n_u8(q, 4),
            _ => vshrq_n_u8(q, 6),
        };
        vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(3)))
    }
}

/// Q2_K: group `g` of 16 takes bits `2s..2s + 2` of `qs[32h + 16(g % 2) ..]` (h = g / 8,
/// s = (g % 8) / 2), with a 4-bit scale and a 4-bit min.
fn dot_q2_k<P: Products>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    use q2_k::{D, QS};
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(q2_k::BLOCK_BYTES)
        .zip(a.chunks_exact(q8_k::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / QK_K) {
        let aq = &ab[q8_k::QS..];
        let (mut isum, mut msum) = (0i32, 0i32);
        for g in 0..QK_K / 16 {
            let (h, s) = (g / 8, (g % 8) / 2);
            let q = crumbs(&wb[QS + 32 * h + 16 * (g % 2)..], s);
            let sc = wb[g];
            isum += (sc & 0x0F) as i32 * dot16::<P>(q, &aq[16 * g..]);
            msum += (sc >> 4) as i32 * q8_k::bsum(ab, g);
        }
        let d_a = q8_k::d(ab);
        sum += d_a * f16_at(wb, D) * isum as f32 - d_a * f16_at(wb, D + 2) * msum as f32;
    }
    sum
}

/// Q3_K: Q2_K's crumbs plus a high bit from `hmask` (bit `g / 2` of `hmask[16(g % 2) ..]`);
/// a clear bit means the quant is less 4. Signed 6-bit scales per group of 16.
fn dot_q3_k<P: Products>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    use q3_k::{D, QS};
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(q3_k::BLOCK_BYTES)
        .zip(a.chunks_exact(q8_k::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / QK_K) {
        let aq = &ab[q8_k::QS..];
        let sc = q3_k::scales(wb);
        let mut isum = 0i32;
        for (g, &scale) in sc.iter().enumerate() {
            let (h, s) = (g / 8, (g % 8) / 2);
            let low = crumbs(&wb[QS + 32 * h + 16 * (g % 2)..], s);
            let hmask = &wb[16 * (g % 2)..16 * (g % 2) + 16];
            // SAFETY: NEON is baseline; `hmask` is 16 bytes.
            let q = unsafe {
                let set = vtstq_u8(vld1q_u8(hmask.as_ptr()), vdupq_n_u8(1 << (g / 2)));
                let four = vreinterpretq_s8_u8(vandq_u8(set, vdupq_n_u8(4)));
                vsubq_s8(vorrq_s8(low, four), vdupq_n_s8(4))
            };
            isum += scale * dot16::<P>(q, &aq[16 * g..]);
        }
        sum += q8_k::d(ab) * f16_at(wb, D) * isum as f32;
    }
    sum
}

/// Q4_K: per 64-quant slice, the low nibbles of its 32 bytes are sub-block 2c and the high
/// nibbles sub-block 2c + 1; mins against the Q8_K `bsums`.
fn dot_q4_k<P: Products>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(q4_k::BLOCK_BYTES)
        .zip(a.chunks_exact(q8_k::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / QK_K) {
        let (sc, mn) = unpack_scale_min_k4(&wb[4..16]);
        let aq = &ab[q8_k::QS..];
        let (mut isum, mut msum) = (0i32, 0i32);
        for c in 0..4 {
            // Each 16-byte half gives its low nibbles to sub-block 2c, its high to 2c + 1.
            let qs = &wb[16 + 32 * c..];
            let ((lo0, hi0), (lo1, hi1)) = (nibbles(qs, 0), nibbles(&qs[16..], 0));
            let (lo, hi) = ((lo0, lo1), (hi0, hi1));
            isum += sc[2 * c] as i32 * dot32::<P>(lo.0, lo.1, &aq[64 * c..]);
            isum += sc[2 * c + 1] as i32 * dot32::<P>(hi.0, hi.1, &aq[64 * c + 32..]);
        }
        for (sb, &m) in mn.iter().enumerate() {
            msum += m as i32 * (q8_k::bsum(ab, 2 * sb) + q8_k::bsum(ab, 2 * sb + 1));
        }
        let d_a = q8_k::d(ab);
        sum += d_a * f16_at(wb, 0) * isum as f32 - d_a * f16_at(wb, 2) * msum as f32;
    }
    sum
}

/// Q5_K: Q4_K's nibbles, plus a fifth bit per element: bit `sb` of `qh[j]` for element
/// `j` of sub-block `sb`.
fn dot_q5_k<P: Products>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    const QH: usize = 16;
    const QS: usize = QH + QK_K / 8;
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(q5_k::BLOCK_BYTES)
        .zip(a.chunks_exact(q8_k::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / QK_K) {
        let (sc, mn) = unpack_scale_min_k4(&wb[4..16]);
        let aq = &ab[q8_k::QS..];
        let qh = &wb[QH..QH + 32];
        // SAFETY: NEON is baseline; `qh` is 32 bytes.
        let (qh_lo, qh_hi) = unsafe { (vld1q_u8(qh.as_ptr()), vld1q_u8(qh.as_ptr().add(16))) };
        let (mut isum, mut msum) = (0i32, 0i32);
        for sb in 0..8 {
            let qs = &wb[QS + 32 * (sb / 2)..];
            let ((lo0, hi0), (lo1, hi1)) = (nibbles(qs, 0), nibbles(&qs[16..], 0));
            let (q0, q1) = if sb % 2 == 0 { (lo0, lo1) } else { (hi0, hi1) };
            // SAFETY: NEON is baseline.
            let (q0, q1) = unsafe {
                let bit = vdupq_n_u8(1 << sb);
                let five = |h: uint8x16_t| {
                    vreinterpretq_s8_u8(vandq_u8(vtstq_u8(h, bit), vdupq_n_u8(0x10)))
                };
                (vorrq_s8(q0, five(qh_lo)), vorrq_s8(q1, five(qh_hi)))
            };
            isum += sc[sb] as i32 * dot32::<P>(q0, q1, &aq[32 * sb..]);
            msum += mn[sb] as i32 * (q8_k::bsum(ab, 2 * sb) + q8_k::bsum(ab, 2 * sb + 1));
        }
        let d_a = q8_k::d(ab);
        sum += d_a * f16_at(wb, 0) * isum as f32 - d_a * f16_at(wb, 2) * msum as f32;
    }
    sum
}

/// Q6_K: elements `128h + 32k .. + 32` take the low (k < 2) or high (k ≥ 2) nibbles of
/// `ql[64h + 32(k % 2) ..]` and bits `2k..2k + 2` of `qh[32h ..]`, less 32; each group of
/// 16 has its own scale.
fn dot_q6_k<P: Products>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    use q6_k::{D, QH, SCALES};
    let mut sum = 0.0f32;
    let blocks = w
        .chunks_exact(q6_k::BLOCK_BYTES)
        .zip(a.chunks_exact(q8_k::BLOCK_BYTES));
    for (wb, ab) in blocks.take(n / QK_K) {
        let aq = &ab[q8_k::QS..];
        let mut isum = 0i32;
        for h in 0..2 {
            let qh = &wb[QH + 32 * h..QH + 32 * h + 32];
            for k in 0..4 {
                let ql = &wb[64 * h + 32 * (k % 2)..64 * h + 32 * (k % 2) + 32];
                for half in 0..2 {
                    // SAFETY: NEON is baseline; `ql` and `qh` are 32 bytes, `half` < 2.
                    let q = unsafe {
                        let l = vld1q_u8(ql.as_ptr().add(16 * half));
                        let l = if k < 2 {
                            vandq_u8(l, vdupq_n_u8(0x0F))
                        } else {
                            vshrq_n_u8(l, 4)
                        };
                        let hb = vld1q_u8(qh.as_ptr().add(16 * half));
                        let hb = match k {
                            0 => hb,
                            1 => vshrq_n_u8(hb, 2),
                            2 => vshrq_n_u8(hb, 4),
                            _ => vshrq_n_u8(hb, 6),
                        };
                        let hb = vshlq_n_u8(vandq_u8(hb, vdupq_n_u8(0x03)), 4);
                        vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(l, hb)), vdupq_n_s8(32))
                    };
                    let first = 128 * h + 32 * k + 16 * half;
                    let scale = wb[SCALES + first / 16] as i8 as i32;
                    isum += scale * dot16::<P>(q, &aq[first..]);
                }
            }
        }
        sum += q8_k::d(ab) * f16_at(wb, D) * isum as f32;
    }
    sum
}

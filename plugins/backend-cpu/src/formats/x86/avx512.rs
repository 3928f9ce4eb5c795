//! AVX-512 (F/BW/VL) + VNNI kernels for the formats where they pay: VNNI's `vpdpbusd`
//! fuses the byte dot and its widening sum in the 32-element quants, and Q4_K/Q6_K walk
//! 64 quants per instruction (one token, and four tokens for prefill). For prefill the
//! 32-element signed formats (Q4_0, Q5_0, Q8_0) have two-row × four-token tiles. Everything
//! else keeps the AVX2 kernels (this level includes AVX2). Same numerics contract as `formats::x86`. (These intrinsics are stable since
//! Rust 1.89, the workspace's `rust-version`.)

use super::avx2::{
    add_in_order, bits32, blocks, f16_at, f16_pairs4, f16_x4, f32_at, hsum, hsum4, k4_terms_x4,
    load, mins_x2, nibbles32, prefetch_ahead, q4_1_term, q6k_offset, q6k_terms_x4, q8k_d_x4,
    scales_mins_k4, terms4_q4_1, terms4_sdd,
};
use crate::formats::k_quants::{q4_k, q6_k, q8_k, QK_K};
use crate::formats::{q4_0, q4_1, q5_0, q8_0, q8_1, FormatKernels};
use core::arch::x86_64::*;
use prima_abi::GgmlType;

/// Replaces the functions of `k` (the AVX2 table) that have an AVX-512 version.
pub(in crate::formats) fn overlay(mut k: FormatKernels) -> FormatKernels {
    use GgmlType as T;
    k.vec_dot = match k.weight_type {
        T::Q4_0 => vec_dot_q4_0,
        T::Q4_1 => vec_dot_q4_1,
        T::Q5_0 => vec_dot_q5_0,
        T::Q8_0 => vec_dot_q8_0,
        T::Q4K => vec_dot_q4_k,
        T::Q6K => vec_dot_q6_k,
        _ => k.vec_dot,
    };
    k.vec_dot_x4 = match k.weight_type {
        T::Q4K => Some(vec_dot_x4_q4_k),
        T::Q6K => Some(vec_dot_x4_q6_k),
        _ => k.vec_dot_x4,
    };
    k.vec_dot_2x8 = match k.weight_type {
        T::Q4_0 => Some(vec_dot_2x8_q4_0),
        T::Q5_0 => Some(vec_dot_2x8_q5_0),
        T::Q8_0 => Some(vec_dot_2x8_q8_0),
        T::Q4K => Some(vec_dot_2x8_q4_k),
        _ => k.vec_dot_2x8,
    };
    k.vec_dot_2x4 = match k.weight_type {
        T::Q4K => Some(vec_dot_2x4_q4_k),
        T::Q6K => Some(vec_dot_2x4_q6_k),
        T::Q4_0 => Some(vec_dot_2x4_q4_0),
        T::Q5_0 => Some(vec_dot_2x4_q5_0),
        T::Q8_0 => Some(vec_dot_2x4_q8_0),
        _ => k.vec_dot_2x4,
    };
    k.panel = super::panel512::kernels(k.weight_type).or(k.panel);
    k.few = super::few512::kernels(k.weight_type).or(k.few);
    k.decode = super::few_rows16::decode_kernels(k.weight_type)
        .or_else(|| super::kdec16::decode_kernels(k.weight_type))
        .or(k.decode);
    super::mxfp4::overlay_avx512(super::iq4::overlay_avx512(k))
}

macro_rules! wrappers {
    ($($name:ident => $imp:ident;)*) => {
        $(fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            // SAFETY: only reachable through `overlay`'s table, which `dispatch` hands out
            // after detecting avx2, fma, f16c, avx512f, avx512bw, avx512vl and avx512vnni.
            unsafe { $imp(n, w, a) }
        })*
    };
}

wrappers! {
    vec_dot_q4_0 => dot_q4_0;
    vec_dot_q4_1 => dot_q4_1;
    vec_dot_q5_0 => dot_q5_0;
    vec_dot_q8_0 => dot_q8_0;
    vec_dot_q4_k => dot_q4_k;
    vec_dot_q6_k => dot_q6_k;
}

/// Safe wrappers of the four-token K-quant kernels; they check that the four rows are in
/// bounds.
macro_rules! x4_wrappers {
    ($($name:ident => $imp:ident;)*) => {
        $(fn $name(n: usize, w: &[u8], a: &[u8], a_stride: usize) -> [f32; 4] {
            let row = (n / QK_K) * q8_k::BLOCK_BYTES;
            assert!(a_stride >= row && a.len() >= 3 * a_stride + row, "vec_dot_x4: short rows");
            // SAFETY: only reachable through `overlay`'s table, which `dispatch` hands out
            // after detecting the AVX-512 features (and AVX2's); the rows are in bounds.
            unsafe { $imp(n, w, a, a_stride) }
        })*
    };
}

x4_wrappers! {
    vec_dot_x4_q4_k => dot_x4_q4_k;
    vec_dot_x4_q6_k => dot_x4_q6_k;
}

/// Safe wrappers of the two-row, four-token kernels; they check that both weight rows and
/// the four activation rows are in bounds.
macro_rules! x2x4_wrappers {
    ($($name:ident => $imp:ident, $elems:expr, $w_block:expr, $act_block:expr;)*) => {
        $(fn $name(n: usize, w: &[u8], w_stride: usize, a: &[u8], a_stride: usize) -> [f32; 8] {
            let (w_row, a_row) = ((n / $elems) * $w_block, (n / $elems) * $act_block);
            assert!(
                w_stride >= w_row && w.len() >= w_stride + w_row,
                "vec_dot_2x4: short weight rows"
            );
            assert!(
                a_stride >= a_row && a.len() >= 3 * a_stride + a_row,
                "vec_dot_2x4: short activation rows"
            );
            // SAFETY: only reachable through `overlay`'s table, which `dispatch` hands out
            // after detecting the AVX-512 features (and AVX2's); the rows are in bounds.
            unsafe { $imp(n, w, w_stride, a, a_stride) }
        })*
    };
}

x2x4_wrappers! {
    vec_dot_2x4_q4_0 => dot_2x4_q4_0, 32, q4_0::BLOCK_BYTES, q8_0::BLOCK_BYTES;
    vec_dot_2x4_q5_0 => dot_2x4_q5_0, 32, q5_0::BLOCK_BYTES, q8_0::BLOCK_BYTES;
    vec_dot_2x4_q8_0 => dot_2x4_q8_0, 32, q8_0::BLOCK_BYTES, q8_0::BLOCK_BYTES;
    vec_dot_2x4_q4_k => dot_2x4_q4_k, QK_K, q4_k::BLOCK_BYTES, q8_k::BLOCK_BYTES;
    vec_dot_2x4_q6_k => dot_2x4_q6_k, QK_K, q6_k::BLOCK_BYTES, q8_k::BLOCK_BYTES;
}

/// Two-row tiles of one (`2x4`) and two (`2x8`) four-token groups, from one generic kernel
/// per format; the safe wrappers check bounds.
macro_rules! x2xg_wrappers {
    ($($name8:ident, $inner4:ident => $imp:ident, $elems:expr, $w_block:expr, $a_block:expr;)*) => {
        $(unsafe fn $inner4(n: usize, w: &[u8], ws: usize, a: &[u8], st: usize) -> [f32; 8] {
            // SAFETY: the caller (the `x2x4_wrappers` function) checked bounds and features.
            unsafe { $imp::<1>(n, w, ws, a, st)[0] }
        }
        fn $name8(n: usize, w: &[u8], w_stride: usize, a: &[u8], a_stride: usize) -> [[f32; 8]; 2] {
            let (w_row, a_row) = ((n / $elems) * $w_block, (n / $elems) * $a_block);
            assert!(
                w_stride >= w_row && w.len() >= w_stride + w_row,
                "vec_dot_2x8: short weight rows"
            );
            assert!(
                a_stride >= a_row && a.len() >= 7 * a_stride + a_row,
                "vec_dot_2x8: short activation rows"
            );
            // SAFETY: only reachable through `overlay`'s table, which `dispatch` hands out
            // after detecting the AVX-512 features (and AVX2's); the rows are in bounds.
            unsafe { $imp::<2>(n, w, w_stride, a, a_stride) }
        })*
    };
}

x2xg_wrappers! {
    vec_dot_2x8_q4_0, dot_2x4_q4_0 => dot_2x4g_q4_0, 32, q4_0::BLOCK_BYTES, q8_0::BLOCK_BYTES;
    vec_dot_2x8_q5_0, dot_2x4_q5_0 => dot_2x4g_q5_0, 32, q5_0::BLOCK_BYTES, q8_0::BLOCK_BYTES;
    vec_dot_2x8_q8_0, dot_2x4_q8_0 => dot_2x4g_q8_0, 32, q8_0::BLOCK_BYTES, q8_0::BLOCK_BYTES;
    vec_dot_2x8_q4_k, dot_2x4_q4_k => dot_2x4g_q4_k, QK_K, q4_k::BLOCK_BYTES, q8_k::BLOCK_BYTES;
}

/// `Σ u·s` of unsigned × signed bytes in groups of four, as 8 i32s (no i16 saturation).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn dot_u8_i8(u: __m256i, s: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
}

/// Signed × signed bytes (y ≠ −128) via `|x| · sign(y, x)`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn dot_i8_i8(x: __m256i, y: __m256i) -> __m256i {
    dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// `Σ term(i, Σ partial(i))` over blocks `0..nb` as `avx2::sum_blocks` computes it (float
/// terms added in block order), but taking two blocks' integer dots per 512-bit vector:
/// `pair(i)` holds block `i` in its low eight i32 lanes and block `i + 1` in its high eight.
/// `single(i)` serves the last block of an odd count.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn sum_block_pairs(
    nb: usize,
    mut pair: impl FnMut(usize) -> __m512i,
    mut single: impl FnMut(usize) -> __m256i,
    mut term: impl FnMut(usize, i32) -> f32,
    mut terms4: impl FnMut(usize, __m128) -> __m128,
) -> f32 {
    let halves = |v: __m512i| (_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    let mut sum = 0.0f32;
    let mut i = 0;
    while i + 4 <= nb {
        let (p0, p1) = halves(pair(i));
        let (p2, p3) = halves(pair(i + 2));
        sum = add_in_order(sum, terms4(i, _mm_cvtepi32_ps(hsum4([p0, p1, p2, p3]))));
        i += 4;
    }
    if i + 2 <= nb {
        let (p0, p1) = halves(pair(i));
        sum += term(i, hsum(p0));
        sum += term(i + 1, hsum(p1));
        i += 2;
    }
    if i < nb {
        sum += term(i, hsum(single(i)));
    }
    sum
}

/// The 32 nibbles of each of the 16-byte runs at `p` and `p + stride`, as
/// `[low nibbles, high nibbles]` of the first, then of the second (two blocks' quants in
/// element order).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn nibbles32_pair(p: *const u8, stride: usize) -> __m512i {
    let t0 = _mm_loadu_si128(p as *const __m128i);
    let t1 = _mm_loadu_si128(p.add(stride) as *const __m128i);
    let t = _mm512_inserti32x4(_mm512_castsi128_si512(t0), t1, 2);
    // [t0, t0, t1, t1], then the second copy of each shifted to its high nibbles.
    let t = _mm512_shuffle_i32x4(t, t, 0b10_10_00_00);
    let t = _mm512_mask_srli_epi16(t, 0xFF00_FF00, t, 4);
    _mm512_and_si512(t, _mm512_set1_epi8(0x0F))
}

/// The 32-byte runs at `p` and `p + stride` as one vector.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn load_pair(p: *const u8, stride: usize) -> __m512i {
    join(load(p), load(p.add(stride)))
}

/// `Σ x·y` of signed bytes (y ≠ −128) in groups of four, as 16 i32s: `|x| · (±y)` with the
/// sign moved onto y by a mask (AVX-512 has no `vpsignb`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn dot_i8_i8_512(x: __m512i, y: __m512i) -> __m512i {
    let neg = _mm512_movepi8_mask(x);
    let y = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(x), y)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_q4_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wb, ab) = (q4_0::BLOCK_BYTES, q8_0::BLOCK_BYTES);
    let nb = blocks(n, 32, w, wb, a, ab);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    sum_block_pairs(
        nb,
        |i| {
            prefetch_ahead(w.add(i * wb), 2 * wb);
            let q = _mm512_sub_epi8(nibbles32_pair(w.add(i * wb + 2), wb), _mm512_set1_epi8(8));
            dot_i8_i8_512(q, load_pair(a.add(i * ab + 2), ab))
        },
        |i| {
            let q = _mm256_sub_epi8(nibbles32(w.add(i * wb + 2)), _mm256_set1_epi8(8));
            dot_i8_i8(q, load(a.add(i * ab + 2)))
        },
        |i, s| s as f32 * f16_at(w.add(i * wb)) * f16_at(a.add(i * ab)),
        |i, s| terms4_sdd(w.add(i * wb), wb, a.add(i * ab), ab, s),
    )
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_q4_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wb, ab) = (q4_1::BLOCK_BYTES, q8_1::BLOCK_BYTES);
    let nb = blocks(n, 32, w, wb, a, ab);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    sum_block_pairs(
        nb,
        |i| {
            prefetch_ahead(w.add(i * wb), 2 * wb);
            let (q, act) = (
                nibbles32_pair(w.add(i * wb + 4), wb),
                load_pair(a.add(i * ab + 4), ab),
            );
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, act)
        },
        |i| dot_u8_i8(nibbles32(w.add(i * wb + 4)), load(a.add(i * ab + 4))),
        |i, s| q4_1_term(w.add(i * wb), a.add(i * ab), s),
        |i, s| terms4_q4_1(w.add(i * wb), wb, a.add(i * ab), ab, s),
    )
}

/// Q5_0 with VNNI, two blocks per vector: the 5-bit quants as unsigned bytes (0..=31), the
/// fifth bits added straight from the blocks' `qh` words used as a byte mask, so one
/// `vpdpbusd` does the products; the −16 offset comes back as `16·Σa` — integer-exact, so
/// the block sums equal the scalar kernel's.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_q5_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wb, ab) = (q5_0::BLOCK_BYTES, q8_0::BLOCK_BYTES);
    let nb = blocks(n, 32, w, wb, a, ab);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    let sixteen = _mm512_set1_epi8(16);
    sum_block_pairs(
        nb,
        |i| {
            let b = w.add(i * wb);
            prefetch_ahead(b, 2 * wb);
            let qh = |p: *const u8| (p as *const u32).read_unaligned() as u64;
            let fifth: __mmask64 = qh(b.add(2)) | (qh(b.add(wb + 2)) << 32);
            let nib = nibbles32_pair(b.add(6), wb);
            let q = _mm512_mask_add_epi8(nib, fifth, nib, sixteen);
            let act = load_pair(a.add(i * ab + 2), ab);
            let zero = _mm512_setzero_si512();
            _mm512_sub_epi32(
                _mm512_dpbusd_epi32(zero, q, act),
                _mm512_dpbusd_epi32(zero, sixteen, act),
            )
        },
        |i| {
            let b = w.add(i * wb);
            let high = _mm256_and_si256(bits32(b.add(2)), _mm256_set1_epi8(0x10));
            let q = _mm256_or_si256(nibbles32(b.add(6)), high);
            let act = load(a.add(i * ab + 2));
            let act_sum = dot_u8_i8(_mm256_set1_epi8(1), act);
            _mm256_sub_epi32(dot_u8_i8(q, act), _mm256_slli_epi32(act_sum, 4))
        },
        |i, s| s as f32 * f16_at(w.add(i * wb)) * f16_at(a.add(i * ab)),
        |i, s| terms4_sdd(w.add(i * wb), wb, a.add(i * ab), ab, s),
    )
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wb, ab) = (q8_0::BLOCK_BYTES, q8_0::BLOCK_BYTES);
    let nb = blocks(n, 32, w, wb, a, ab);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    sum_block_pairs(
        nb,
        |i| {
            prefetch_ahead(w.add(i * wb), 2 * wb);
            dot_i8_i8_512(
                load_pair(w.add(i * wb + 2), wb),
                load_pair(a.add(i * ab + 2), ab),
            )
        },
        |i| dot_i8_i8(load(w.add(i * wb + 2)), load(a.add(i * ab + 2))),
        |i, s| s as f32 * (f16_at(w.add(i * wb)) * f16_at(a.add(i * ab))),
        |i, s| {
            _mm_mul_ps(
                s,
                _mm_mul_ps(f16_x4(w.add(i * wb), wb), f16_x4(a.add(i * ab), ab)),
            )
        },
    )
}

/// `[lo | hi]` as one 512-bit vector.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// `vpshufb` indices that widen bytes `2c` and `2c + 1` of a broadcast u64 into
/// `[byte 2c × 16, byte 2c+1 × 16]` as i16s (0x80 zeroes the high bytes).
const K4_SCALE_IDX: [[u8; 64]; 4] = {
    let mut t = [[0x80u8; 64]; 4];
    let mut c = 0;
    while c < 4 {
        let mut i = 0;
        while i < 64 {
            t[c][i] = (2 * c + i / 32) as u8;
            i += 2;
        }
        c += 1;
    }
    t
};

/// For each 64-quant slice `c` of a Q4_K super-block, the scales of its two 32-element
/// sub-blocks as `[sc[2c] × 16, sc[2c+1] × 16]` i16s, for `vpdpwssd` against the slice's
/// `maddubs` result: one broadcast and four shuffles instead of per-pair scalar inserts.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn scale_vectors_k4(sc: [u8; 8]) -> [__m512i; 4] {
    let b = _mm512_set1_epi64(i64::from_le_bytes(sc));
    core::array::from_fn(|c| {
        let idx = _mm512_loadu_si512(K4_SCALE_IDX[c].as_ptr() as *const _);
        _mm512_shuffle_epi8(b, idx)
    })
}

/// Super-block `wb` of a Q4_K row against its Q8_K block `ab`: the quant products (scaled
/// by the sub-block scales) and the mins against the `bsums`, each as 8 i32 lanes whose sum
/// is the scalar kernel's integer.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn q4_k_sums(wb: *const u8, ab: *const u8) -> (__m256i, __m256i) {
    let low = _mm512_set1_epi8(0x0F);
    let (sc, mn) = scales_mins_k4(std::slice::from_raw_parts(wb.add(4), 12));
    let sv = scale_vectors_k4(sc);
    let (qs, aq) = (wb.add(16), ab.add(q8_k::QS));
    let mut acc = _mm512_setzero_si512();
    for (c, s) in sv.into_iter().enumerate() {
        // 32 bytes of quants are sub-blocks 2c (low nibbles) and 2c+1 (high nibbles),
        // which face 64 consecutive activations.
        let q = load(qs.add(32 * c));
        let q = _mm512_and_si512(join(q, _mm256_srli_epi16(q, 4)), low);
        let av = _mm512_loadu_si512(aq.add(64 * c) as *const _);
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(q, av), s);
    }
    let mins = _mm256_madd_epi16(load(ab.add(q8_k::BSUMS)), mins_x2(mn));
    (fold(acc), mins)
}

/// Q4_K: four super-blocks' integer sums reduced together (two `hsum4` trees instead of
/// eight horizontal sums) and their float terms computed in lanes, then added to the row
/// sum in block order, so the result is the scalar kernel's bit for bit.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_q4_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wbb, abb) = (q4_k::BLOCK_BYTES, q8_k::BLOCK_BYTES);
    let nb = blocks(n, QK_K, w, wbb, a, abb);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    let mut sum = 0.0f32;
    let mut i = 0;
    while i + 4 <= nb {
        prefetch_ahead(w.add(i * wbb), 4 * wbb);
        let (p0, m0) = q4_k_sums(w.add(i * wbb), a.add(i * abb));
        let (p1, m1) = q4_k_sums(w.add((i + 1) * wbb), a.add((i + 1) * abb));
        let (p2, m2) = q4_k_sums(w.add((i + 2) * wbb), a.add((i + 2) * abb));
        let (p3, m3) = q4_k_sums(w.add((i + 3) * wbb), a.add((i + 3) * abb));
        let isum = _mm_cvtepi32_ps(hsum4([p0, p1, p2, p3]));
        let msum = _mm_cvtepi32_ps(hsum4([m0, m1, m2, m3]));
        // [d, dmin] of the four weight blocks, as [d × 4 | dmin × 4].
        let dm = _mm256_permutevar8x32_ps(
            f16_pairs4(w.add(i * wbb), wbb),
            _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7),
        );
        let (d, dmin) = (_mm256_castps256_ps128(dm), _mm256_extractf128_ps(dm, 1));
        let d_a = q8k_d_x4(a.add(i * abb), abb);
        // d_a·d·isum − d_a·dmin·msum, as the scalar kernel orders it.
        let t = _mm_sub_ps(
            _mm_mul_ps(_mm_mul_ps(d_a, d), isum),
            _mm_mul_ps(_mm_mul_ps(d_a, dmin), msum),
        );
        sum = add_in_order(sum, t);
        i += 4;
    }
    while i < nb {
        let (wb, ab) = (w.add(i * wbb), a.add(i * abb));
        let (p, m) = q4_k_sums(wb, ab);
        let d_a = f32_at(ab);
        sum += d_a * f16_at(wb) * hsum(p) as f32 - d_a * f16_at(wb.add(2)) * hsum(m) as f32;
        i += 1;
    }
    sum
}

/// The 128 quants of half `h` of Q6_K super-block `wb` (offsets not removed), as two
/// 64-quant vectors: elements 128h + 0..64 take ql[64h..64h+64]'s low nibbles with qh bits
/// 0-1 (first 32) and 2-3 (next 32); elements 128h + 64..128 the high nibbles with bits
/// 4-7.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn q6k_half(wb: *const u8, h: usize) -> [__m512i; 2] {
    let (low4, low2) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x03));
    let l = _mm512_loadu_si512(wb.add(64 * h) as *const _);
    let qhv = load(wb.add(128 + 32 * h));
    let hb = [
        join(qhv, _mm256_srli_epi16(qhv, 2)),
        join(_mm256_srli_epi16(qhv, 4), _mm256_srli_epi16(qhv, 6)),
    ];
    let lj = [l, _mm512_srli_epi16(l, 4)];
    core::array::from_fn(|j| {
        _mm512_or_si512(
            _mm512_and_si512(lj[j], low4),
            _mm512_slli_epi16(_mm512_and_si512(hb[j], low2), 4),
        )
    })
}

/// Super-block `wb` of a Q6_K row against its Q8_K block `ab`: the scaled products less
/// the −32 offset, as 8 i32 lanes whose sum is the scalar kernel's integer.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn q6_k_sums(wb: *const u8, ab: *const u8) -> __m256i {
    let aq = ab.add(q8_k::QS);
    let scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.add(192) as *const __m128i));
    let mut acc = _mm512_setzero_si512();
    for h in 0..2 {
        for (k, q) in q6k_half(wb, h).into_iter().enumerate() {
            let av = _mm512_loadu_si512(aq.add(128 * h + 64 * k) as *const _);
            // The 64 quants are four 16-element groups: g = 8h + 4k + 0..4. Their −32
            // offset is applied once per block from the bsums (`q6k_offset`).
            let s = scale_quarters(scales16, 2 * h + k);
            acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(q, av), s);
        }
    }
    _mm256_sub_epi32(fold(acc), q6k_offset(ab, scales16))
}

/// Q6_K, four super-blocks reduced at a time as in [`dot_q4_k`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_q6_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (wbb, abb) = (q6_k::BLOCK_BYTES, q8_k::BLOCK_BYTES);
    let nb = blocks(n, QK_K, w, wbb, a, abb);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    let mut sum = 0.0f32;
    let mut i = 0;
    while i + 4 <= nb {
        prefetch_ahead(w.add(i * wbb), 4 * wbb);
        let p0 = q6_k_sums(w.add(i * wbb), a.add(i * abb));
        let p1 = q6_k_sums(w.add((i + 1) * wbb), a.add((i + 1) * abb));
        let p2 = q6_k_sums(w.add((i + 2) * wbb), a.add((i + 2) * abb));
        let p3 = q6_k_sums(w.add((i + 3) * wbb), a.add((i + 3) * abb));
        let isum = _mm_cvtepi32_ps(hsum4([p0, p1, p2, p3]));
        let d = f16_x4(w.add(i * wbb + 208), wbb);
        // d_a·d·isum, as the scalar kernel orders it.
        let t = _mm_mul_ps(_mm_mul_ps(q8k_d_x4(a.add(i * abb), abb), d), isum);
        sum = add_in_order(sum, t);
        i += 4;
    }
    while i < nb {
        let (wb, ab) = (w.add(i * wbb), a.add(i * abb));
        let d_a = f32_at(ab);
        sum += d_a * f16_at(wb.add(208)) * hsum(q6_k_sums(wb, ab)) as f32;
        i += 1;
    }
    sum
}

/// `vpermw` indices for quarter `q` of a Q6_K super-block: i16 lane `i` takes scale
/// `4q + i / 8`.
const Q6K_SCALE_IDX: [[u16; 32]; 4] = {
    let mut t = [[0u16; 32]; 4];
    let mut q = 0;
    while q < 4 {
        let mut i = 0;
        while i < 32 {
            t[q][i] = (4 * q + i / 8) as u16;
            i += 1;
        }
        q += 1;
    }
    t
};

/// `[s_g × 8, s_g+1 × 8, s_g+2 × 8, s_g+3 × 8]` as i16s with `g = 4q`: the scales of the four
/// 16-element groups of 64-quant slice `q`, facing its `maddubs` result (each i16 covers two
/// quants); `scales16` holds the block's 16 scales as i16s.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn scale_quarters(scales16: __m256i, q: usize) -> __m512i {
    let idx = _mm512_loadu_si512(Q6K_SCALE_IDX[q].as_ptr() as *const _);
    _mm512_permutexvar_epi16(idx, _mm512_castsi256_si512(scales16))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1))
}

/// One Q4_K row against four tokens, 64 quants per instruction: each 32-byte slice of
/// quants is split into its two sub-blocks once and dotted against all four tokens.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_x4_q4_k(n: usize, w: &[u8], a: &[u8], st: usize) -> [f32; 4] {
    let (wbb, abb) = (q4_k::BLOCK_BYTES, q8_k::BLOCK_BYTES);
    let nb = (n / QK_K).min(w.len() / wbb);
    let low = _mm512_set1_epi8(0x0F);
    let mut sum = _mm_setzero_ps();
    for i in 0..nb {
        let wb = &w[i * wbb..(i + 1) * wbb];
        let ab = a.as_ptr().add(i * abb);
        let (sc, mn) = scales_mins_k4(&wb[4..16]);
        let sv = scale_vectors_k4(sc);
        let qs = wb.as_ptr().add(16);
        let mut acc = [_mm512_setzero_si512(); 4];
        for (c, s) in sv.into_iter().enumerate() {
            let q = load(qs.add(32 * c));
            let q = _mm512_and_si512(join(q, _mm256_srli_epi16(q, 4)), low);
            for (k, acc) in acc.iter_mut().enumerate() {
                let av = _mm512_loadu_si512(ab.add(k * st + q8_k::QS + 64 * c) as *const _);
                *acc = _mm512_dpwssd_epi32(*acc, _mm512_maddubs_epi16(q, av), s);
            }
        }
        let isum = hsum4(acc.map(|v| fold(v)));
        sum = _mm_add_ps(sum, k4_terms_x4(wb.as_ptr(), ab, st, isum, mn));
    }
    let mut out = [0.0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), sum);
    out
}

/// One Q6_K row against four tokens, 64 quants per instruction; the −32 offset comes from
/// the activations' `bsums`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_x4_q6_k(n: usize, w: &[u8], a: &[u8], st: usize) -> [f32; 4] {
    let (wbb, abb) = (q6_k::BLOCK_BYTES, q8_k::BLOCK_BYTES);
    let nb = (n / QK_K).min(w.len() / wbb);
    let mut sum = _mm_setzero_ps();
    for i in 0..nb {
        let wb = &w[i * wbb..(i + 1) * wbb];
        let ab = a.as_ptr().add(i * abb);
        let scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.as_ptr().add(192) as *const _));
        let mut acc = [_mm512_setzero_si512(); 4];
        for h in 0..2 {
            for (j, q) in q6k_half(wb.as_ptr(), h).into_iter().enumerate() {
                let s = scale_quarters(scales16, 2 * h + j);
                for (k, acc) in acc.iter_mut().enumerate() {
                    let off = k * st + q8_k::QS + 128 * h + 64 * j;
                    let av = _mm512_loadu_si512(ab.add(off) as *const _);
                    *acc = _mm512_dpwssd_epi32(*acc, _mm512_maddubs_epi16(q, av), s);
                }
            }
        }
        let isum = hsum4(core::array::from_fn(|k| {
            _mm256_sub_epi32(fold(acc[k]), q6k_offset(ab.add(k * st), scales16))
        }));
        sum = _mm_add_ps(sum, q6k_terms_x4(wb.as_ptr(), ab, st, isum));
    }
    let mut out = [0.0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), sum);
    out
}

// ---- two rows × four tokens, 32-element blocks with signed quants ----
//
// (A one-row, four-token VNNI kernel measured no faster than AVX2's sign/maddubs one: the
// per-block reduction and scale terms dominate. Sharing each token's activation loads, bias
// and scales between two rows is what pays.)

/// The 32 activation quants at `a` of tokens 0, 1 and of tokens 2, 3 (`st` bytes apart),
/// each pair in one vector.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn act_pairs(a: *const u8, st: usize) -> [__m512i; 2] {
    [
        join(load(a), load(a.add(st))),
        join(load(a.add(2 * st)), load(a.add(3 * st))),
    ]
}

/// The token sums of a tile's four dot vectors `[row 0 × tokens 0,1; row 0 × tokens 2,3;
/// row 1 × tokens 0,1; row 1 × tokens 2,3]` (each token's 8 lanes in one 256-bit half),
/// as `[row 0 × tokens 0..4, row 1 × tokens 0..4]`. An unpack/add tree: single-µop
/// shuffles, where `phaddd` costs three.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn reduce_2x4(z: [__m512i; 4]) -> __m256i {
    let pair = |x: __m512i, y: __m512i| {
        _mm512_add_epi32(_mm512_unpacklo_epi32(x, y), _mm512_unpackhi_epi32(x, y))
    };
    let (t01, t23) = (pair(z[0], z[1]), pair(z[2], z[3]));
    // Each 128-bit lane L: [Σ z0_L, Σ z1_L, Σ z2_L, Σ z3_L].
    let u = _mm512_add_epi32(
        _mm512_unpacklo_epi64(t01, t23),
        _mm512_unpackhi_epi64(t01, t23),
    );
    // Lanes 0+1 are the first token of each pair, 2+3 the second.
    let v = _mm512_add_epi32(u, _mm512_shuffle_i64x2(u, u, 0b10_11_00_01));
    let order = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, v))
}

/// One weight block's signed quants `s` (any i8) prepared for [`signed_sums_2x4`]: `s` in
/// both 256-bit halves, and the accumulator start `−128·Σs` that takes back the bias of the
/// unsigned activations.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn signed_prep(s: __m256i) -> (__m512i, __m512i) {
    let (bias, zero) = (_mm512_set1_epi8(0x80u8 as i8), _mm512_setzero_si512());
    let s = _mm512_broadcast_i64x4(s);
    (
        s,
        _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, s)),
    )
}

/// `Σ s_r·a_k` of two weight rows' prepared block quants against four tokens' quants at
/// `a`: `[row 0 × tokens 0..4, row 1 × tokens 0..4]`. Each token's activations are biased
/// to unsigned (`a + 128`, an XOR) once for both rows so that `vpdpbusd` can take them; the
/// accumulators start at `−128·Σs`, so the integer sums are exact for any i8 quants (Q8_0
/// weights of −128 included).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn signed_sums_2x4(p: [(__m512i, __m512i); 2], a: *const u8, st: usize) -> __m256i {
    let bias = _mm512_set1_epi8(0x80u8 as i8);
    let acts = act_pairs(a, st).map(|x| _mm512_xor_si512(x, bias));
    let dots = |(s, start): (__m512i, __m512i)| acts.map(|x| _mm512_dpbusd_epi32(start, x, s));
    let (r0, r1) = (dots(p[0]), dots(p[1]));
    reduce_2x4([r0[0], r0[1], r1[0], r1[1]])
}

/// A two-row tile of `G` four-token groups over blocks `0..nb`: `quants(i)` gives block
/// `i`'s signed quants of both rows (prepared once for all groups), `act(i, g)` the quants
/// of group `g`'s first token in block `i`, and `terms(i, g, sums)` the block's float terms.
/// Per (row, token) lane, the terms are added in block order, as the one-token kernels do.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn tile_2x4g<const G: usize>(
    nb: usize,
    st: usize,
    mut quants: impl FnMut(usize) -> [__m256i; 2],
    mut act: impl FnMut(usize, usize) -> *const u8,
    mut terms: impl FnMut(usize, usize, __m256) -> __m256,
) -> [[f32; 8]; G] {
    let mut acc = [_mm256_setzero_ps(); G];
    for i in 0..nb {
        let p = quants(i).map(|s| signed_prep(s));
        for (g, acc) in acc.iter_mut().enumerate() {
            let sums = signed_sums_2x4(p, act(i, g), st);
            *acc = _mm256_add_ps(*acc, terms(i, g, _mm256_cvtepi32_ps(sums)));
        }
    }
    acc.map(|v| {
        let mut out = [0.0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), v);
        out
    })
}

/// `[d_w0 × 4, d_w1 × 4]` and `[d_a0..d_a3, d_a0..d_a3]`: the f16 scales at the starts of
/// two weight blocks `ws` apart and four activation blocks `st` apart, in the tile's lanes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn scales_2x4(w: *const u8, ws: usize, a: *const u8, st: usize) -> (__m256, __m256) {
    let dw = _mm256_set_m128(_mm_set1_ps(f16_at(w.add(ws))), _mm_set1_ps(f16_at(w)));
    let da = f16_x4(a, st);
    (dw, _mm256_set_m128(da, da))
}

/// `isum · dw · d_a` (Q4_0, Q5_0) of the tile's lanes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn terms_2x4_sdd(w: *const u8, ws: usize, a: *const u8, st: usize, s: __m256) -> __m256 {
    let (dw, da) = scales_2x4(w, ws, a, st);
    _mm256_mul_ps(_mm256_mul_ps(s, dw), da)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_2x4g_q4_0<const G: usize>(
    n: usize,
    w: &[u8],
    ws: usize,
    a: &[u8],
    st: usize,
) -> [[f32; 8]; G] {
    let (wb, ab) = (q4_0::BLOCK_BYTES, q8_0::BLOCK_BYTES);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    let quants = |b: *const u8| _mm256_sub_epi8(nibbles32(b.add(2)), _mm256_set1_epi8(8));
    tile_2x4g::<G>(
        n / 32,
        st,
        |i| [quants(w.add(i * wb)), quants(w.add(ws + i * wb))],
        |i, g| a.add(4 * g * st + i * ab + 2),
        |i, g, s| terms_2x4_sdd(w.add(i * wb), ws, a.add(4 * g * st + i * ab), st, s),
    )
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_2x4g_q5_0<const G: usize>(
    n: usize,
    w: &[u8],
    ws: usize,
    a: &[u8],
    st: usize,
) -> [[f32; 8]; G] {
    let (wb, ab) = (q5_0::BLOCK_BYTES, q8_0::BLOCK_BYTES);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    // A clear 5th bit means q − 16: OR-ing 0xF0 into the nibble is that in i8.
    let quants = |b: *const u8| {
        let high = _mm256_andnot_si256(bits32(b.add(2)), _mm256_set1_epi8(0xF0u8 as i8));
        _mm256_or_si256(nibbles32(b.add(6)), high)
    };
    tile_2x4g::<G>(
        n / 32,
        st,
        |i| [quants(w.add(i * wb)), quants(w.add(ws + i * wb))],
        |i, g| a.add(4 * g * st + i * ab + 2),
        |i, g, s| terms_2x4_sdd(w.add(i * wb), ws, a.add(4 * g * st + i * ab), st, s),
    )
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_2x4g_q8_0<const G: usize>(
    n: usize,
    w: &[u8],
    ws: usize,
    a: &[u8],
    st: usize,
) -> [[f32; 8]; G] {
    let (wb, ab) = (q8_0::BLOCK_BYTES, q8_0::BLOCK_BYTES);
    let (w, a) = (w.as_ptr(), a.as_ptr());
    tile_2x4g::<G>(
        n / 32,
        st,
        |i| [load(w.add(i * wb + 2)), load(w.add(ws + i * wb + 2))],
        |i, g| a.add(4 * g * st + i * ab + 2),
        |i, g, s| {
            let (dw, da) = scales_2x4(w.add(i * wb), ws, a.add(4 * g * st + i * ab), st);
            _mm256_mul_ps(s, _mm256_mul_ps(dw, da))
        },
    )
}

// ---- two rows × four tokens, Q4_K and Q6_K ----

/// Four tokens' 16-lane accumulators of one row folded pairwise to `[tokens 0,1; tokens 2,3]`
/// with each token's 8 partial sums in one 256-bit half, as [`reduce_2x4`] takes them.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn fold_pairs(acc: [__m512i; 4]) -> [__m512i; 2] {
    let pair = |x: __m512i, y: __m512i| {
        // [x.L0, x.L1, y.L0, y.L1] + [x.L2, x.L3, y.L2, y.L3]
        _mm512_add_epi32(
            _mm512_shuffle_i64x2(x, y, 0b01_00_01_00),
            _mm512_shuffle_i64x2(x, y, 0b11_10_11_10),
        )
    };
    [pair(acc[0], acc[1]), pair(acc[2], acc[3])]
}

/// Two Q4_K rows (`ws` bytes apart) against `G` groups of four tokens: the rows' quants
/// and scales are unpacked once for all groups, each token's activations, bsums and scale
/// are read once for both rows, and each group's sixteen sums (products and mins) are
/// reduced by two trees rather than per row.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::needless_range_loop)] // c, k and r index several parallel arrays
unsafe fn dot_2x4g_q4_k<const G: usize>(
    n: usize,
    w: &[u8],
    ws: usize,
    a: &[u8],
    st: usize,
) -> [[f32; 8]; G] {
    let (wbb, abb) = (q4_k::BLOCK_BYTES, q8_k::BLOCK_BYTES);
    let low = _mm512_set1_epi8(0x0F);
    let mut sum = [_mm256_setzero_ps(); G];
    for i in 0..n / QK_K {
        let wb = [
            &w[i * wbb..(i + 1) * wbb],
            &w[ws + i * wbb..ws + (i + 1) * wbb],
        ];
        let (sc0, mn0) = scales_mins_k4(&wb[0][4..16]);
        let (sc1, mn1) = scales_mins_k4(&wb[1][4..16]);
        let sv = [scale_vectors_k4(sc0), scale_vectors_k4(sc1)];
        // Each row's mins twice over, to face two tokens' bsums in one 512-bit madd.
        let m = [mins_x2(mn0), mins_x2(mn1)].map(|m| join(m, m));
        // Both rows' quants, unpacked once for every token group.
        let q: [[__m512i; 4]; 2] = core::array::from_fn(|r| {
            core::array::from_fn(|c| {
                let q = load(wb[r].as_ptr().add(16 + 32 * c));
                _mm512_and_si512(join(q, _mm256_srli_epi16(q, 4)), low)
            })
        });
        let per_row = |off: usize| {
            let (x0, x1) = (
                f16_at(wb[0].as_ptr().add(off)),
                f16_at(wb[1].as_ptr().add(off)),
            );
            _mm256_set_m128(_mm_set1_ps(x1), _mm_set1_ps(x0))
        };
        let (d, dmin) = (per_row(0), per_row(2));
        for (g, sum) in sum.iter_mut().enumerate() {
            let ab = a.as_ptr().add(4 * g * st + i * abb);
            let mut acc = [[_mm512_setzero_si512(); 4]; 2];
            for c in 0..4 {
                for k in 0..4 {
                    let av = _mm512_loadu_si512(ab.add(k * st + q8_k::QS + 64 * c) as *const _);
                    for r in 0..2 {
                        let p = _mm512_maddubs_epi16(q[r][c], av);
                        acc[r][k] = _mm512_dpwssd_epi32(acc[r][k], p, sv[r][c]);
                    }
                }
            }
            let [a0, a1] = fold_pairs(acc[0]);
            let [b0, b1] = fold_pairs(acc[1]);
            let isum = reduce_2x4([a0, a1, b0, b1]);
            // Tokens 0,1 and 2,3's bsums, joined once for both rows.
            let bsums = |k: usize| load(ab.add(k * st + q8_k::BSUMS));
            let b = [join(bsums(0), bsums(1)), join(bsums(2), bsums(3))];
            let msum = reduce_2x4([
                _mm512_madd_epi16(b[0], m[0]),
                _mm512_madd_epi16(b[1], m[0]),
                _mm512_madd_epi16(b[0], m[1]),
                _mm512_madd_epi16(b[1], m[1]),
            ]);
            let d_a = q8k_d_x4(ab, st);
            let d_a = _mm256_set_m128(d_a, d_a);
            let t = _mm256_sub_ps(
                _mm256_mul_ps(_mm256_mul_ps(d_a, d), _mm256_cvtepi32_ps(isum)),
                _mm256_mul_ps(_mm256_mul_ps(d_a, dmin), _mm256_cvtepi32_ps(msum)),
            );
            *sum = _mm256_add_ps(*sum, t);
        }
    }
    sum.map(|v| {
        let mut out = [0.0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), v);
        out
    })
}

/// Two Q6_K rows (`ws` bytes apart) against four tokens, sharing each token's activation
/// reads between the rows; the −32 offsets come from the bsums and are reduced as a tile.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::needless_range_loop)] // h, j, k and r index several parallel arrays
unsafe fn dot_2x4_q6_k(n: usize, w: &[u8], ws: usize, a: &[u8], st: usize) -> [f32; 8] {
    let (wbb, abb) = (q6_k::BLOCK_BYTES, q8_k::BLOCK_BYTES);
    let mut sum = _mm256_setzero_ps();
    for i in 0..n / QK_K {
        let ab = a.as_ptr().add(i * abb);
        let wb = [w.as_ptr().add(i * wbb), w.as_ptr().add(ws + i * wbb)];
        let scales16: [__m256i; 2] = core::array::from_fn(|r| {
            _mm256_cvtepi8_epi16(_mm_loadu_si128(wb[r].add(192) as *const __m128i))
        });
        let mut acc = [[_mm512_setzero_si512(); 4]; 2];
        for h in 0..2 {
            let halves = [q6k_half(wb[0], h), q6k_half(wb[1], h)];
            for j in 0..2 {
                let q = [halves[0][j], halves[1][j]];
                let s = [
                    scale_quarters(scales16[0], 2 * h + j),
                    scale_quarters(scales16[1], 2 * h + j),
                ];
                for k in 0..4 {
                    let off = k * st + q8_k::QS + 128 * h + 64 * j;
                    let av = _mm512_loadu_si512(ab.add(off) as *const _);
                    for r in 0..2 {
                        let p = _mm512_maddubs_epi16(q[r], av);
                        acc[r][k] = _mm512_dpwssd_epi32(acc[r][k], p, s[r]);
                    }
                }
            }
        }
        let [a0, a1] = fold_pairs(acc[0]);
        let [b0, b1] = fold_pairs(acc[1]);
        let offset = |r: usize, k: usize| q6k_offset(ab.add(k * st), scales16[r]);
        let isum = _mm256_sub_epi32(
            reduce_2x4([a0, a1, b0, b1]),
            reduce_2x4([
                join(offset(0, 0), offset(0, 1)),
                join(offset(0, 2), offset(0, 3)),
                join(offset(1, 0), offset(1, 1)),
                join(offset(1, 2), offset(1, 3)),
            ]),
        );
        let d_a = q8k_d_x4(ab, st);
        let d_a = _mm256_set_m128(d_a, d_a);
        let d = _mm256_set_m128(
            _mm_set1_ps(f16_at(wb[1].add(208))),
            _mm_set1_ps(f16_at(wb[0].add(208))),
        );
        sum = _mm256_add_ps(
            sum,
            _mm256_mul_ps(_mm256_mul_ps(d_a, d), _mm256_cvtepi32_ps(isum)),
        );
    }
    let mut out = [0.0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), sum);
    out
}

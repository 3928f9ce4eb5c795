//! AVX-512 (F/BW/VL) + VNNI primitives that the AVX-512 kernels share: two blocks per
//! 512-bit vector (loads, nibble unpacks, signed byte dots, their in-order block sums),
//! the sixteen-row transpose ([`dwords4`]: lane `r` of vector `j` is row `r`'s dword `j`)
//! and the per-lane unpacks that follow it (f16 pairs, K4 scales and mins, bytes).
//!
//! Not for: kernels or kernel choice (`levels`); the AVX2 primitives these build on are
//! in `lanes256`.

use crate::formats::iq4_nl;
use crate::formats::x86::lanes256::{add_in_order, hsum, hsum4, load};
use core::arch::x86_64::*;

/// Rows of the sixteen-row transpose: one per i32 lane of a 512-bit vector.
pub(super) const ROWS16: usize = 16;

/// `Σ term(i, Σ partial(i))` over blocks `0..nb` as `lanes256::sum_blocks` computes it (float
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

/// `[lo | hi]` as one 512-bit vector.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1))
}

/// The 16 bytes at `off` of rows `k`, `4 + k`, `8 + k` and `12 + k` as the four 128-bit
/// lanes. `HALVES`: two 256-bit halves joined by one 512-bit insert, else three 512-bit
/// inserts. On Zen 4 a 512-bit shuffle costs two 256-bit ones, and the halves made the
/// small batches faster (`few_1t` Q4_1 and Q8_0: 4–12% in cache; `prima bench --parallel
/// 4` 1.06×, 14 of 20 interleaved pairs) but one token's decode slower (0.955×, 23 of 30
/// pairs against): the small-batch kernels take the halves, one token and the other users
/// of [`dwords4`] the inserts.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn lane_rows<const HALVES: bool>(
    row: &[*const u8; ROWS16],
    k: usize,
    off: usize,
) -> __m512i {
    let at = |r: usize| row[r].add(off) as *const __m128i;
    if HALVES {
        let lo = _mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(at(k))),
            _mm_loadu_si128(at(4 + k)),
        );
        let hi = _mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(at(8 + k))),
            _mm_loadu_si128(at(12 + k)),
        );
        return _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
    }
    let v = _mm512_castsi128_si512(_mm_loadu_si128(at(k)));
    let v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(at(4 + k)));
    let v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(at(8 + k)));
    _mm512_inserti32x4::<3>(v, _mm_loadu_si128(at(12 + k)))
}

/// [`dwords4_by`] with the inserts: for the decode and panel kernels of other modules.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn dwords4(row: &[*const u8; ROWS16], off: usize) -> [__m512i; 4] {
    dwords4_by::<false>(row, off)
}

/// Dwords `0 ..= 3` of the 16 bytes at `off` of each row: lane `r` of vector `j` is row
/// `r`'s dword `j` (a 4 × 4 transpose in each 128-bit lane of [`lane_rows`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn dwords4_by<const HALVES: bool>(
    row: &[*const u8; ROWS16],
    off: usize,
) -> [__m512i; 4] {
    // Spelled out, not `map`ped: the closure was not always inlined (measured: a fifth of a
    // decode step in its calls).
    let z = [
        lane_rows::<HALVES>(row, 0, off),
        lane_rows::<HALVES>(row, 1, off),
        lane_rows::<HALVES>(row, 2, off),
        lane_rows::<HALVES>(row, 3, off),
    ];
    let (a, b) = (
        _mm512_unpacklo_epi32(z[0], z[1]),
        _mm512_unpackhi_epi32(z[0], z[1]),
    );
    let (c, d) = (
        _mm512_unpacklo_epi32(z[2], z[3]),
        _mm512_unpackhi_epi32(z[2], z[3]),
    );
    [
        _mm512_unpacklo_epi64(a, c),
        _mm512_unpackhi_epi64(a, c),
        _mm512_unpacklo_epi64(b, d),
        _mm512_unpackhi_epi64(b, d),
    ]
}

/// `vpshufb` indices that copy byte `c` of each dword into all four of its bytes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn spread_byte(c: i32) -> __m512i {
    _mm512_add_epi8(
        _mm512_set1_epi32(c * 0x0101_0101),
        _mm512_set4_epi32(0x0C0C_0C0C, 0x0808_0808, 0x0404_0404, 0),
    )
}

/// The f16 halves of each lane's dword as f32s: `(low, high)`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn f16_pair(x: __m512i) -> (__m512, __m512) {
    (
        _mm512_cvtph_ps(_mm512_cvtepi32_epi16(x)),
        _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(x))),
    )
}

/// IQ4_NL's table plus 128 (1 ..= 241, unsigned for `vpdpbusd`) in each 128-bit lane, for
/// `vpshufb` (IQ4_NL's and IQ4_XS's decode kernels).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn iq4_table() -> __m512i {
    let biased: [u8; 16] = core::array::from_fn(|i| (iq4_nl::KVALUES[i] as i32 + 128) as u8);
    _mm512_broadcast_i32x4(_mm_loadu_si128(biased.as_ptr() as *const __m128i))
}

/// The byte `b` of each lane's dword, zero-extended.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn bytes4(v: __m512i) -> [__m512i; 4] {
    let ff = _mm512_set1_epi32(0xFF);
    [
        _mm512_and_si512(v, ff),
        _mm512_and_si512(_mm512_srli_epi32::<8>(v), ff),
        _mm512_and_si512(_mm512_srli_epi32::<16>(v), ff),
        _mm512_srli_epi32::<24>(v),
    ]
}

/// A K4 super-block's six-bit scales and mins (`unpack_scale_min_k4`) from its scale
/// dwords 1 ..= 3 (`s1`, `s2`, `s3`), sixteen rows in the lanes: `[scales 0–3, scales 4–7,
/// mins 0–3, mins 4–7]`, one per byte of each lane's dword.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn k4_scales_mins(s1: __m512i, s2: __m512i, s3: __m512i) -> [__m512i; 4] {
    let (m6, m4, top2) = (
        _mm512_set1_epi8(0x3F),
        _mm512_set1_epi8(0x0F),
        _mm512_set1_epi8(0x30),
    );
    let high = |s: __m512i, low: __m512i| {
        _mm512_or_si512(low, _mm512_and_si512(_mm512_srli_epi32::<2>(s), top2))
    };
    [
        _mm512_and_si512(s1, m6),
        high(s1, _mm512_and_si512(s3, m4)),
        _mm512_and_si512(s2, m6),
        high(s2, _mm512_and_si512(_mm512_srli_epi32::<4>(s3), m4)),
    ]
}

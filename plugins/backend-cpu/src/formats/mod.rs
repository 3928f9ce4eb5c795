//! Tensor formats: how each GGUF type lays out its blocks, and the scalar kernels that read
//! them.
//!
//! Each format module owns one block layout and provides `dequantize_row` and a `vec_dot`
//! against the activation type llama.cpp pairs it with (its "vec_dot type"). Activation
//! types (Q8_0, Q8_1, Q8_K, F16, BF16, F32) also provide `quantize_row`, which turns an f32
//! activation row into that type. [`scalar`] gathers these functions into one
//! [`FormatKernels`] table per weight type, the reference every vectorised kernel is tested
//! against; [`dispatch`] picks the fastest level this CPU runs (`x86`: AVX2, AVX-512) and
//! returns the same table shape, so `ops::matmul` does not care which.
//!
//! This module is not for parallelism or validation: kernels trust the lengths they are
//! given (the ops check them) and only ever walk whole blocks with `chunks_exact`.

#[cfg(target_arch = "aarch64")]
mod arm;
pub mod dispatch;
pub mod float;
pub mod iq4_nl;
pub mod iq4_xs;
pub mod k_quants;
pub mod mxfp4;
pub mod q4_0;
pub mod q4_1;
pub mod q5_0;
pub mod q5_1;
pub mod q8_0;
pub mod q8_1;
pub mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

use prima_abi::GgmlType;

/// Every weight format this backend computes (the activation-only Q8_1/Q8_K are not).
pub const WEIGHT_TYPES: [GgmlType; 16] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::IQ4NL,
    GgmlType::IQ4XS,
    GgmlType::MXFP4,
];

/// `acc[i] += w · v[i]` with `v` an F16 row as little-endian bytes (see
/// [`float::axpy_f16`]).
pub type AxpyF16Fn = fn(acc: &mut [f32], w: f32, v: &[u8]);

/// Attention's two products for several query heads at once (a grouped-query head's
/// queries against its keys and values), each result the bits of the one-row kernels.
#[derive(Clone, Copy)]
pub struct AttentionF16 {
    /// The query heads' scores against the keys.
    pub dots: DotsF16Fn,
    /// The heads' outputs: value rows weighted by their probabilities.
    pub axpys: AxpysF16Fn,
}

/// `out[h·n_keys + j]` = the F16 `vec_dot` of key row `j` (`n`
/// F16 elements, little-endian, rows `stride` bytes apart from `keys[0]`) and query `h`
/// (`q`: `n_q` rows of `n` F16 elements, contiguous).
pub type DotsF16Fn =
    fn(n: usize, keys: &[u8], stride: usize, n_keys: usize, q: &[u8], n_q: usize, out: &mut [f32]);

/// For each head `h < n_q`, [`AxpyF16Fn`] of `acc[h·n ..][..n]`
/// with weight `w[h·n_rows + j]` and value row `j` (rows `stride` bytes apart from
/// `values[0]`), for `j` in order.
pub type AxpysF16Fn = fn(
    n: usize,
    values: &[u8],
    stride: usize,
    n_rows: usize,
    w: &[f32],
    n_q: usize,
    acc: &mut [f32],
);

/// Dequantizes a whole row: `src` holds `out.len() / block_elems` blocks.
pub type DequantizeRowFn = fn(src: &[u8], out: &mut [f32]);

/// Converts an f32 activation row into the blocks of an activation type.
pub type QuantizeRowFn = fn(x: &[f32], out: &mut [u8]);

/// Dot product of `n` elements: one weight row against one activation row already in the
/// weight type's vec_dot type.
pub type VecDotFn = fn(n: usize, weight_row: &[u8], activation_row: &[u8]) -> f32;

/// Dot products of one weight row against four activation rows `a_stride` bytes apart
/// (`a[k·a_stride ..]`); each result equals `VecDotFn` on that row, bit for bit. Prefill
/// uses it to unpack each weight block once for four tokens.
pub type VecDotX4Fn =
    fn(n: usize, weight_row: &[u8], activation_rows: &[u8], a_stride: usize) -> [f32; 4];

/// Dot products of two weight rows `w_stride` bytes apart against four activation rows
/// `a_stride` bytes apart: `[row 0 × tokens 0..4, row 1 × tokens 0..4]`, each equal to
/// `VecDotFn` on that pair, bit for bit. Prefill uses it to load each token's activations
/// once for two rows as well as unpack each weight block once for four tokens.
pub type VecDot2x4Fn = fn(
    n: usize,
    weight_rows: &[u8],
    w_stride: usize,
    activation_rows: &[u8],
    a_stride: usize,
) -> [f32; 8];

/// Two `VecDot2x4Fn` tiles at once, for tokens `0..4` and `4..8` of eight activation rows
/// `a_stride` bytes apart (each weight block unpacked once for all eight tokens).
pub type VecDot2x8Fn = fn(
    n: usize,
    weight_rows: &[u8],
    w_stride: usize,
    activation_rows: &[u8],
    a_stride: usize,
) -> [[f32; 8]; 2];

/// Prefill's row-panel kernels (see `ops::matmul`): `rows` weight rows are repacked once
/// per matmul into a panel whose vector lanes are the rows (quants of four consecutive
/// columns per 32-bit lane, the block scales as per-lane floats), so a token's dot with
/// all `rows` rows is a run of lane-wise integer multiply-adds against that token's
/// activation quants broadcast to every lane, with no horizontal sums. Every result still
/// equals `VecDotFn` on that (row, token) pair, bit for bit: per block, the integer sum is
/// exact and the float terms are the scalar kernel's operations in its order, one lane each.
#[derive(Clone, Copy)]
pub struct PanelKernels {
    /// Weight rows per panel.
    pub rows: usize,
    /// Tokens per register tile: `ops::matmul`'s token blocks are whole multiples of it,
    /// so only the prompt's last tokens take a narrower tile.
    pub tokens: usize,
    /// Bytes of a panel of rows of `n` columns.
    pub panel_bytes: fn(n: usize) -> usize,
    /// Repacks `rows` weight rows of `n` columns, `w_stride` bytes apart, into `panel`.
    pub pack: fn(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]),
    /// Bytes of one token's side data (per-block activation scales and sums).
    pub aux_bytes: fn(n: usize) -> usize,
    /// Fills a token's side data from its activation row (in the vec_dot type).
    pub prep: fn(n: usize, act_row: &[u8], aux: &mut [u8]),
    /// Dots a panel against `out.len() / rows` tokens, activation rows `a_stride` and side
    /// data `aux_stride` bytes apart; `out` is token-major: `out[t·rows + r]`.
    pub gemm: PanelGemmFn,
    /// Whether `gemm` reads the activation rows; where not (the float panels read only
    /// `prep`'s widened copy), `ops::matmul` need not keep them.
    pub reads_acts: bool,
}

/// See [`PanelKernels::gemm`].
pub type PanelGemmFn = fn(
    n: usize,
    panel: &[u8],
    acts: &[u8],
    a_stride: usize,
    aux: &[u8],
    aux_stride: usize,
    out: &mut [f32],
);

/// Small-batch kernels (2 ..= `max_tokens` tokens, continuous batching's decode steps),
/// where neither the tiles nor the panels pay: the few tokens' activations are packed
/// once per matmul (quants two blocks per vector, per-block scales as f32 lanes, one lane
/// per token), then each weight row is unpacked once and dotted against all the tokens,
/// with the float terms of every token computed and summed in the lanes of one vector.
/// Every result still equals `VecDotFn` on that (row, token) pair, bit for bit: per block
/// the integer sum is exact, and the float terms are the scalar kernel's operations in its
/// order, one lane each.
#[derive(Clone, Copy)]
pub struct FewKernels {
    /// Most tokens one pack holds.
    pub max_tokens: usize,
    /// Bytes of the pack of `n_tokens` activation rows of `n` columns.
    pub pack_bytes: fn(n: usize, n_tokens: usize) -> usize,
    /// Packs `n_tokens` activation rows (in the vec_dot type), `a_stride` bytes apart.
    pub pack: fn(n: usize, acts: &[u8], a_stride: usize, n_tokens: usize, pack: &mut [u8]),
    /// Dots weight rows of `n` columns, `w_stride` bytes apart, against every token of
    /// `pack`; `out` is row-major: `out[r·n_tokens + t]` (token-major, `out[t·rows + r]`,
    /// with `token_major`), and its length says how many rows.
    pub dot: FewDotFn,
    /// Whether `dot` writes `out` token-major, as `matmul`'s output is (kernels whose lanes
    /// are rows: no transposing back and forth).
    pub token_major: bool,
}

/// See [`FewKernels::dot`].
pub type FewDotFn =
    fn(n: usize, w: &[u8], w_stride: usize, pack: &[u8], n_tokens: usize, out: &mut [f32]);

/// Everything `matmul` and `get_rows` need to know about one weight type.
#[derive(Clone, Copy)]
pub struct FormatKernels {
    /// The weight type these kernels read.
    pub weight_type: GgmlType,
    /// The type activations are converted to before `vec_dot`.
    pub vec_dot_type: GgmlType,
    pub dequantize_row: DequantizeRowFn,
    /// Converts activations to `vec_dot_type`.
    pub quantize_activation: QuantizeRowFn,
    pub vec_dot: VecDotFn,
    /// A four-token `vec_dot`, where a kernel level has one.
    pub vec_dot_x4: Option<VecDotX4Fn>,
    /// A two-row, four-token `vec_dot`, where a kernel level has one.
    pub vec_dot_2x4: Option<VecDot2x4Fn>,
    /// A two-row, eight-token `vec_dot`, where a kernel level has one (only with a 2×4).
    pub vec_dot_2x8: Option<VecDot2x8Fn>,
    /// Row-panel prefill kernels, where a kernel level has them.
    pub panel: Option<PanelKernels>,
    /// Small-batch kernels, where a kernel level has them.
    pub few: Option<FewKernels>,
    /// One-token (decode) kernels that take many rows a step, one vector lane per row, so
    /// a block's integer sums need no horizontal reduction and its float terms are added
    /// in the lanes (`ops::matmul` calls them with one token, over whole chunks of rows),
    /// where a kernel level has them. Same pack and contract as [`FewKernels`].
    pub decode: Option<FewKernels>,
}

/// Reads a little-endian f16 at `off` as f32.
#[inline]
pub(crate) fn f16_at(bytes: &[u8], off: usize) -> f32 {
    half::f16::from_le_bytes([bytes[off], bytes[off + 1]]).to_f32()
}

/// Writes `v` rounded to f16, little-endian, at `off`.
#[inline]
pub(crate) fn put_f16(bytes: &mut [u8], off: usize, v: f32) {
    bytes[off..off + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
}

/// Reads a little-endian f32 at `off`.
#[inline]
pub(crate) fn f32_at(bytes: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([bytes[off], bytes[off + 1], bytes[off + 2], bytes[off + 3]])
}

/// Rounds half away from zero (C's `roundf`), which ggml's Q8_0/Q8_1 quantizers use.
#[inline]
pub(crate) fn round_half_away(x: f32) -> f32 {
    x.round()
}

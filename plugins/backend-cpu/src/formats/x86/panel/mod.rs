//! Row-panel kernels for prompts (see [`crate::formats::PanelKernels`]): once per
//! matmul a panel of weight rows (16 at AVX-512, 8 at AVX2) is repacked into a scratch
//! copy with one row per 32-bit lane, and each token's activations are broadcast against
//! it, so a tile of rows × tokens needs no horizontal sums.
//!
//! - `panel512`: AVX-512 VNNI, every block quant and the float formats; `panel512_bf16`:
//!   BF16 by `vdpbf16ps` where it keeps the scalar order; `panel256`: the same panels for
//!   AVX2 (reusing `panel512`'s row-at-a-time packs and token side data); `panel_iq4`:
//!   IQ4_NL and MXFP4 (as Q8_0 panels) and IQ4_XS at both levels.
//!
//! Not for: one-token or small-batch kernels (`vec_dot`, `rows`, `few`), or choosing
//! kernels (`levels`).

/// Walks the `$nt` tokens of a panel gemm whose tiles are `$rows` rows × `$tokens`
/// tokens: whole tiles while they fit, then one token at a time. `$call` runs with `$g`
/// (the tile's tokens) and the pointers of its first token's activations `$a`, side data
/// `$x` and output `$o` (`$rows` floats a token). Used by every panel gemm (panel512,
/// panel256, panel_iq4); the caller's `unsafe` block covers the pointer steps.
macro_rules! over_tokens {
    ([$rows:expr, $tokens:expr] $nt:expr, $a_stride:expr, $aux_stride:expr, $acts:expr,
     $aux:expr, $out:expr, |$g:ident, $a:ident, $x:ident, $o:ident| $call:expr) => {{
        let mut t = 0;
        while t < $nt {
            let ($a, $x, $o) = (
                $acts.as_ptr().add(t * $a_stride),
                $aux.as_ptr().add(t * $aux_stride),
                $out.as_mut_ptr().add(t * $rows),
            );
            let $g = if t + $tokens <= $nt { $tokens } else { 1 };
            $call;
            t += $g;
        }
    }};
}

pub(super) mod panel256;
pub(super) mod panel512;
pub(super) mod panel512_bf16;
pub(super) mod panel_iq4;

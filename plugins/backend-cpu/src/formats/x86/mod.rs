//! x86-64 kernels, one module per instruction-set level.
//!
//! Each level's `overlay` takes the table of the level below and replaces the functions it
//! accelerates. The kernels are `#[target_feature]` functions behind safe wrappers; the
//! wrappers are only reachable through those tables, which `formats::dispatch` hands out
//! only after detecting the features.
//!
//! Numerics: every kernel returns exactly what the scalar kernel returns. Block quants are
//! summed in integers (exact, any order) and the per-block float terms are added to one
//! f32 in block order with the scalar kernel's operation order (no FMA contraction). F32,
//! F16 and BF16 dots use 16 lanes reduced by halving, which is how the scalar
//! reference (`formats::float`) sums too; F32's terms there are fused multiply-adds, so
//! its kernels use `vfmadd` (and F16's and exact BF16's may, their products being exact). Activation quantizers write the scalar bytes.
//! Block-quant kernels assume activations came from the quantizers (|q| ≤ 127), as
//! `maddubs`-based dots need.

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

pub mod attention;
pub mod avx2;
pub mod avx512;
#[macro_use]
mod few;
mod few256;
mod few512;
mod few_rows16;
mod few_rows8;
mod iq4;
mod kdec16;
mod kdec8;
mod mxfp4;
mod panel256;
mod panel512;
mod panel512_bf16;
mod panel_iq4;

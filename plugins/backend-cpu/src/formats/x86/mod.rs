//! x86-64 kernels: AVX2 (+ FMA, F16C) and AVX-512 (F/BW/VL + VNNI) versions of the
//! scalar kernels in `formats`, bit for bit.
//!
//! Layered one way, so that no module imports one that imports it back:
//! - `lanes256`, `lanes512`: SIMD primitives (loads, unpacks, byte dots, horizontal and
//!   in-order sums, transposes); they import nothing else of x86.
//! - kernels by shape, importing the primitives: `vec_dot` (one weight row × one token,
//!   and the four-token and two-row tiles), `quantize` (activation rows), `few` (small
//!   batches, 2–8 tokens), `rows` (one weight row per lane: decode, and some small
//!   batches), `panel` (prompts, weights repacked into row panels), `attention`.
//! - `levels`: which kernel serves each weight format at each level, the only module that
//!   names kernels of several shapes; nothing in x86 imports it, and `formats::dispatch`
//!   takes the format tables from it (attention's products and `axpy_f16` from
//!   `attention`).
//!
//! Each level's table takes the table of the level below and replaces the functions it
//! accelerates. The kernels are `#[target_feature]` functions behind safe wrappers; the
//! wrappers are only reachable through those tables, which `formats::dispatch` hands out
//! only after detecting the features.
//!
//! Numerics: every kernel returns exactly what the scalar kernel returns. Block quants are
//! summed in integers (exact, any order) and the per-block float terms are added to one
//! f32 in block order with the scalar kernel's operation order (no FMA contraction). F32,
//! F16 and BF16 dots use 16 lanes reduced by halving, which is how the scalar
//! reference (`formats::float`) sums too; F32's terms there are fused multiply-adds, so
//! its kernels use `vfmadd` (and F16's and exact BF16's may, their products being exact).
//! Activation quantizers write the scalar bytes. Block-quant kernels assume activations
//! came from the quantizers (|q| ≤ 127), as `maddubs`-based dots need.
//!
//! Not for: feature detection or the choice of level (`formats::dispatch`), or the scalar
//! references the tests compare against (`formats::scalar`, `formats::float`).

/// Safe `fn` wrappers, with the table signatures, around `#[target_feature]` kernels of
/// either level: `vec_dot` (one row against one), `x4` (one row against four activation
/// rows `a_stride` apart, whose bounds they check; `$elems` and `$act_block` are the
/// activation type's block elements and bytes) and `quantize` (one activation row).
macro_rules! table_wrappers {
    ($(vec_dot $name:ident => $imp:ident;)*
     $(x4 $xname:ident => $ximp:ident, $elems:expr, $act_block:expr;)*
     $(quantize $qname:ident => $qimp:ident;)*) => {
        $(pub(in crate::formats::x86) fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            // SAFETY: only reachable through the `levels` table of a level that has the
            // features `$imp` enables, which `dispatch` hands out after detecting them.
            unsafe { $imp(n, w, a) }
        })*
        $(pub(in crate::formats::x86) fn $xname(n: usize, w: &[u8], a: &[u8], a_stride: usize) -> [f32; 4] {
            let row = (n / $elems) * $act_block;
            assert!(a_stride >= row && a.len() >= 3 * a_stride + row, "vec_dot_x4: short rows");
            // SAFETY: as for `vec_dot` above; the four rows are in bounds (above).
            unsafe { $ximp(n, w, a, a_stride) }
        })*
        $(pub(in crate::formats::x86) fn $qname(x: &[f32], out: &mut [u8]) {
            // SAFETY: as for `vec_dot` above.
            unsafe { $qimp(x, out) }
        })*
    };
}

pub mod attention;
mod few;
mod lanes256;
mod lanes512;
pub(in crate::formats) mod levels;
mod panel;
mod quantize;
mod rows;
mod vec_dot;

//! Kernels with one weight row per i32 lane: a step takes eight (AVX2) or sixteen
//! (AVX-512) rows, transposes their blocks in registers so that vector `j` holds quant
//! group `j` of every row, and broadcasts the token's quants against it, so no block needs
//! a horizontal sum. These are the decode kernels (`FormatKernels::decode`, one token)
//! and, for Q4_1, Q8_0 and IQ4_NL at AVX-512, the small-batch kernels too.
//!
//! - `few_rows16` (AVX-512) and `few_rows8` (AVX2): the 32-element formats; `kdec16` and
//!   `kdec8`: the K-quants (and IQ4_XS at AVX-512), sharing `kdec16`'s pack.
//!
//! Not for: the sixteen-row transpose itself (`lanes512::dwords4`, which the panels use
//! too), prompts (`panel`), or choosing kernels (`levels`).

/// Safe wrappers with the decode table's signature (one token) around `R`-row kernels of
/// `$elems`-element blocks: they check the token count, the rows, the pack (its size is
/// the calling module's `pack_bytes`) and `out`.
macro_rules! decode_wrappers {
    ($elems:expr; $($name:ident => $imp:ident, $block:expr;)*) => {
        $(fn $name(n: usize, w: &[u8], w_stride: usize, pack: &[u8], n_tokens: usize, out: &mut [f32]) {
            let (nb, wb) = (n / $elems, $block);
            assert_eq!(n_tokens, 1, "decode dot: {n_tokens} tokens");
            let rows = out.len();
            assert!(
                pack.len() >= pack_bytes(n, 1)
                    && w_stride >= nb * wb
                    && (rows == 0 || w.len() >= (rows - 1) * w_stride + nb * wb),
                "decode dot: short rows, pack or output"
            );
            // SAFETY: only reachable through the `levels` table of a level that has the
            // features `$imp` enables, which `dispatch` hands out after detecting them; the
            // rows, the pack and `out` are in bounds (above).
            unsafe { $imp(n, w, w_stride, pack, out) }
        })*
    };
}

pub(super) mod few_rows16;
pub(super) mod few_rows8;
pub(super) mod kdec16;
pub(super) mod kdec8;

/// The row pointers of the `R`-row step at row `first`: past the last row, the last row
/// again.
#[inline(always)]
fn step_rows<const R: usize>(w: &[u8], ws: usize, first: usize, rows: usize) -> [*const u8; R] {
    let mut row = [w.as_ptr(); R];
    for (k, r) in row.iter_mut().enumerate() {
        *r = w[(first + k).min(rows - 1) * ws..].as_ptr();
    }
    row
}

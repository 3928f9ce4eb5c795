//! Row-panel prefill kernels of IQ4_NL, at AVX-512 and AVX2, as Q8_0's panels: an IQ4_NL
//! block is a Q8_0 block whose quants are table values (`d` the same f16, the values in
//! −127..=113), and its scalar term, `isum · (d · d_a)`, is Q8_0's. So packing turns the
//! panel's rows into Q8_0 rows (a per-thread scratch copy of `rows` rows, made once per
//! panel) and hands them to Q8_0's pack; the gemm, the token side data and the panel
//! layout are Q8_0's own (`panel512`, `panel256`), so every result is the Q8_0 panel's,
//! which equals the Q8_0 — hence the IQ4_NL — scalar `vec_dot` bit for bit.
//!
//! IQ4_XS has no panel yet: its 6-bit signed sub-block scales times table values do not
//! fit a byte, so it needs Q4_K-like panels of its own; its prompts take the generic
//! path (`vec_dot` per row and token).

use crate::formats::{iq4_nl, q8_0, PanelKernels};
use prima_core::gguf::GgmlType;
use std::cell::RefCell;

/// Q8_0's panel kernels at a level with IQ4_NL's pack in place of Q8_0's.
pub(super) fn iq4_nl_kernels(q8: Option<PanelKernels>, pack: PackFn) -> Option<PanelKernels> {
    q8.map(|k| PanelKernels { pack, ..k })
}

type PackFn = fn(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]);

pub(super) fn pack_avx512(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]) {
    let q8 = super::panel512::kernels(GgmlType::Q8_0).expect("Q8_0 has AVX-512 panels");
    pack_as_q8_0(q8, n, w, w_stride, panel);
}

pub(super) fn pack_avx2(n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]) {
    let q8 = super::panel256::kernels(GgmlType::Q8_0).expect("Q8_0 has AVX2 panels");
    pack_as_q8_0(q8, n, w, w_stride, panel);
}

thread_local! {
    /// The panel's rows as Q8_0, reused from panel to panel on each thread.
    static AS_Q8_0: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// `q8.rows` IQ4_NL rows of `n` columns, `w_stride` bytes apart, rewritten as Q8_0 rows and
/// packed by Q8_0's `pack`.
fn pack_as_q8_0(q8: PanelKernels, n: usize, w: &[u8], w_stride: usize, panel: &mut [u8]) {
    let nb = n / iq4_nl::BLOCK_ELEMS;
    let (src_row, row) = (nb * iq4_nl::BLOCK_BYTES, nb * q8_0::BLOCK_BYTES);
    assert!(
        w.len() >= (q8.rows - 1) * w_stride + src_row,
        "panel pack: short weight rows"
    );
    AS_Q8_0.with_borrow_mut(|rows| {
        rows.resize(q8.rows * row, 0);
        for (r, dst) in rows.chunks_exact_mut(row).enumerate() {
            let src = &w[r * w_stride..r * w_stride + src_row];
            let blocks = src.chunks_exact(iq4_nl::BLOCK_BYTES);
            for (sb, db) in blocks.zip(dst.chunks_exact_mut(q8_0::BLOCK_BYTES)) {
                db[..2].copy_from_slice(&sb[..2]);
                for (i, q) in db[2..].iter_mut().enumerate() {
                    *q = iq4_nl::value(&sb[2..], i) as i8 as u8;
                }
            }
        }
        (q8.pack)(n, rows, row, panel);
    });
}

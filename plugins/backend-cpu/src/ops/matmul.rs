//! `out = x · wᵀ` against weights of any supported type.
//!
//! As in ggml, each activation row is first converted once to the weight type's vec_dot
//! type; then the weight rows are split into chunks, one task per chunk on the backend's
//! pool, and [`dot_rows`] runs the format's per-row `vec_dot` over its chunk for every
//! token. A vectorised kernel table drops in through [`FormatKernels`] without touching
//! this structure. Every output element is one `vec_dot` call, so results do not depend on
//! the thread count.

use super::{expect_len, mul, OpResult, Weight};
use crate::formats::FormatKernels;
use crate::pool::{sized, Scratch};
use prima_core::gguf::GgmlType;
use prima_core::plugin::backend_abi::TensorView;
use rayon::prelude::*;
use rayon::ThreadPool;

/// Chunks per thread: enough to balance uneven progress, few enough to keep tasks long.
const CHUNKS_PER_THREAD: usize = 4;

/// Picks the kernels for a weight type (scalar today, SIMD later).
pub type KernelLookup = fn(GgmlType) -> Option<FormatKernels>;

/// `x` is `n_tokens × w.cols`, `out` is `n_tokens × w.rows`.
pub fn matmul(
    pool: &ThreadPool,
    scratch: &mut Scratch,
    lookup: KernelLookup,
    w: &TensorView<'_>,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
) -> OpResult<()> {
    const OP: &str = "matmul";
    let w = Weight::from_view(OP, "weight", w)?;
    let kernels =
        lookup(w.ty).ok_or_else(|| format!("{OP}: weight type {} is not supported", w.ty))?;
    expect_len(
        OP,
        format_args!("x length ({n_tokens} tokens × {} cols)", w.cols),
        x.len(),
        mul(OP, n_tokens, w.cols)?,
    )?;
    expect_len(
        OP,
        format_args!("out length ({n_tokens} tokens × {} rows)", w.rows),
        out.len(),
        mul(OP, n_tokens, w.rows)?,
    )?;
    let act_row_bytes = kernels.vec_dot_type.row_bytes(w.cols).ok_or_else(|| {
        format!(
            "{OP}: row of {} columns is not a whole number of {}-element {} activation blocks",
            w.cols,
            kernels.vec_dot_type.block_elems(),
            kernels.vec_dot_type
        )
    })?;
    if n_tokens == 0 || w.rows == 0 {
        return Ok(());
    }
    if w.cols == 0 {
        out.fill(0.0);
        return Ok(());
    }

    let Scratch {
        activations,
        rows_by_token,
        ..
    } = scratch;
    let act = sized(activations, n_tokens * act_row_bytes);
    pool.install(|| {
        act.par_chunks_mut(act_row_bytes)
            .zip(x.par_chunks(w.cols))
            .for_each(|(a, xr)| (kernels.quantize_activation)(xr, a));
    });
    let act: &[u8] = act;

    let chunk = w
        .rows
        .div_ceil(pool.current_num_threads() * CHUNKS_PER_THREAD)
        .max(1);
    if n_tokens == 1 {
        // One token: row-major and token-major coincide, write straight into `out`.
        pool.install(|| {
            out.par_chunks_mut(chunk)
                .enumerate()
                .for_each(|(c, o)| dot_rows(&kernels, &w, c * chunk, act, act_row_bytes, 1, o));
        });
        return Ok(());
    }
    let by_row = sized(rows_by_token, w.rows * n_tokens);
    pool.install(|| {
        by_row
            .par_chunks_mut(chunk * n_tokens)
            .enumerate()
            .for_each(|(c, o)| dot_rows(&kernels, &w, c * chunk, act, act_row_bytes, n_tokens, o));
    });
    for (t, out_row) in out.chunks_exact_mut(w.rows).enumerate() {
        for (r, o) in out_row.iter_mut().enumerate() {
            *o = by_row[r * n_tokens + t];
        }
    }
    Ok(())
}

/// Dots weight rows `first_row ..` against every token's activation row; `out` is
/// `rows × n_tokens` (row-major by weight row) and its length says how many rows.
pub fn dot_rows(
    kernels: &FormatKernels,
    w: &Weight<'_>,
    first_row: usize,
    act: &[u8],
    act_row_bytes: usize,
    n_tokens: usize,
    out: &mut [f32],
) {
    for (i, out_row) in out.chunks_exact_mut(n_tokens).enumerate() {
        let w_row = w.row(first_row + i);
        for (o, a) in out_row.iter_mut().zip(act.chunks_exact(act_row_bytes)) {
            *o = (kernels.vec_dot)(w.cols, w_row, a);
        }
    }
}

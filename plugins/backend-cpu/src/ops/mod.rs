//! The backend's operations, as plain Rust over slices.
//!
//! Each op validates its arguments and returns an [`OpError`] message naming the op and the
//! mismatch; nothing here panics on bad input. The ABI glue in `crate::backend` only
//! converts types and resolves buffers to slices (`crate::buffers`). Ops that parallelise take the backend's persistent thread pool; ops on
//! the per-token path take reusable scratch buffers instead of allocating.

pub mod activation;
pub mod attention;
pub mod elementwise;
pub mod get_rows;
pub mod kv_cache;
pub mod matmul;
pub mod norm;
pub mod rope;

use prima_abi::backend::TensorView;
use prima_abi::GgmlType;

/// A message for people naming the op and what was wrong.
pub type OpError = String;
pub type OpResult<T> = Result<T, OpError>;

/// Fails with `op: what is got, expected want` unless the two lengths agree. `what` is only
/// formatted on failure (pass `format_args!`), keeping the per-token path allocation-free.
pub(crate) fn expect_len(
    op: &str,
    what: impl std::fmt::Display,
    got: usize,
    want: usize,
) -> OpResult<()> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{op}: {what} is {got}, expected {want}"))
    }
}

/// `a · b`, or an error naming the op when it overflows `usize`.
pub(crate) fn mul(op: &str, a: usize, b: usize) -> OpResult<usize> {
    a.checked_mul(b)
        .ok_or_else(|| format!("{op}: size {a} × {b} overflows"))
}

/// A [`TensorView`] whose shape and byte length have been checked.
#[derive(Clone, Copy, Debug)]
pub struct Weight<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub cols: usize,
    pub rows: usize,
    /// Bytes per row.
    pub row_bytes: usize,
}

impl<'a> Weight<'a> {
    /// Checks that `view` names a known type, that its rows are whole blocks and that its
    /// data is exactly `rows × row_bytes` long.
    pub fn from_view(op: &str, what: &str, view: &TensorView<'a>) -> OpResult<Weight<'a>> {
        let ty = GgmlType::from_id(view.ggml_type)
            .ok_or_else(|| format!("{op}: {what} has unknown GGUF type id {}", view.ggml_type))?;
        let cols =
            usize::try_from(view.cols).map_err(|_| format!("{op}: {what} has too many columns"))?;
        let rows =
            usize::try_from(view.rows).map_err(|_| format!("{op}: {what} has too many rows"))?;
        let row_bytes = ty.row_bytes(cols).ok_or_else(|| {
            format!("{op}: {what} row of {cols} {ty} elements is not a whole number of {}-element blocks", ty.block_elems())
        })?;
        let data = view.data.as_slice();
        expect_len(
            op,
            format_args!("{what} data length ({rows} rows of {cols} {ty})"),
            data.len(),
            mul(op, rows, row_bytes)?,
        )?;
        Ok(Weight {
            ty,
            data,
            cols,
            rows,
            row_bytes,
        })
    }

    /// Like [`Weight::from_view`], and requires F32 (norm weights, biases).
    pub fn f32_vector(op: &str, what: &str, view: &TensorView<'a>) -> OpResult<Weight<'a>> {
        let w = Weight::from_view(op, what, view)?;
        if w.ty != GgmlType::F32 {
            return Err(format!("{op}: {what} must be F32, got {}", w.ty));
        }
        if w.rows != 1 || w.cols == 0 {
            return Err(format!(
                "{op}: {what} must be one non-empty row, got {} × {}",
                w.rows, w.cols
            ));
        }
        Ok(w)
    }

    /// Row `r` (the caller keeps `r < rows`).
    pub fn row(&self, r: usize) -> &'a [u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Element `i` of an F32 tensor's data.
    pub fn f32_at(&self, i: usize) -> f32 {
        crate::formats::f32_at(self.data, 4 * i)
    }
}

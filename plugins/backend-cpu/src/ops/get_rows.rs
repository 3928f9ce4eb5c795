//! Row lookup (token embeddings): dequantizes whole rows of a table to f32.

use super::{expect_len, mul, OpResult, Weight};
use crate::formats::scalar;
use prima_abi::backend::TensorView;

/// `out[i] = dequantize(table row ids[i])`.
pub fn get_rows(table: &TensorView<'_>, ids: &[u32], out: &mut [f32]) -> OpResult<()> {
    let table = Weight::from_view("get_rows", "table", table)?;
    if scalar::kernels(table.ty).is_none() {
        return Err(format!(
            "get_rows: table type {} is not supported",
            table.ty
        ));
    }
    expect_len(
        "get_rows",
        "out length",
        out.len(),
        mul("get_rows", ids.len(), table.cols)?,
    )?;
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= table.rows) {
        return Err(format!(
            "get_rows: id {bad} is out of range for a table of {} rows",
            table.rows
        ));
    }
    let dequantize = scalar::dequantize_row(table.ty);
    if table.cols == 0 {
        return Ok(());
    }
    for (&id, out_row) in ids.iter().zip(out.chunks_exact_mut(table.cols)) {
        dequantize(table.row(id as usize), out_row);
    }
    Ok(())
}

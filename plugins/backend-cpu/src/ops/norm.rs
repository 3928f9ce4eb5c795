//! RMS normalisation, as ggml's `rms_norm` followed by `mul`: the mean of squares is summed
//! in f64, `scale = 1 / sqrt(mean + eps)` in f32, then `y = (x · scale) · weight`.

use super::{expect_len, OpResult, Weight};
use prima_core::plugin::backend_abi::TensorView;

/// Normalises each row of `x` (row length = `weight.cols`) into `out`.
pub fn rms_norm(x: &[f32], weight: &TensorView<'_>, eps: f32, out: &mut [f32]) -> OpResult<()> {
    let w = Weight::f32_vector("rms_norm", "weight", weight)?;
    let n = w.cols;
    if !x.len().is_multiple_of(n) {
        return Err(format!(
            "rms_norm: x length {} is not a multiple of the row length {n}",
            x.len()
        ));
    }
    expect_len("rms_norm", "out length", out.len(), x.len())?;
    for (xr, yr) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let sum: f64 = xr.iter().map(|&v| v as f64 * v as f64).sum();
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        // The weight's bytes in whole f32s (`f32_vector` checked the length), so the loop
        // vectorises.
        for ((y, &v), wb) in yr.iter_mut().zip(xr).zip(w.data.chunks_exact(4)) {
            *y = (v * scale) * f32::from_le_bytes([wb[0], wb[1], wb[2], wb[3]]);
        }
    }
    Ok(())
}

//! Argument checks shared by every GPU operation, worded as the CPU backend words them.

use prima_abi::backend::{RopeParams, TensorView};
use prima_abi::GgmlType;

/// An operation's result on the host side: errors are messages that name the operation.
pub type OpResult<T> = Result<T, String>;

/// `got == want`, else an error naming `what`.
pub fn expect_len(op: &str, what: &str, got: usize, want: usize) -> OpResult<()> {
    if got != want {
        return Err(format!("{op}: {what} is {got}, expected {want}"));
    }
    Ok(())
}

/// `a × b`, or an error where it overflows.
pub fn mul(op: &str, a: usize, b: usize) -> OpResult<usize> {
    a.checked_mul(b)
        .ok_or_else(|| format!("{op}: size {a} × {b} overflows"))
}

/// An F32 vector weight (norm weights, biases): its bytes and length.
pub fn f32_vector<'a>(op: &str, what: &str, w: &TensorView<'a>) -> OpResult<(&'a [u8], usize)> {
    if w.ggml_type != GgmlType::F32 as u32 {
        return Err(format!(
            "{op}: {what} must be F32 (type id {})",
            w.ggml_type
        ));
    }
    let n = usize::try_from(w.cols).map_err(|_| format!("{op}: {what} too long"))?;
    if w.rows != 1 || w.data.len() != 4 * n || n == 0 {
        return Err(format!(
            "{op}: {what} must be one row of {n} f32 ({} bytes), got {} rows and {} bytes",
            4 * n,
            w.rows,
            w.data.len()
        ));
    }
    Ok((w.data.as_slice(), n))
}

/// An `rms_norm` call's checks: an F32 weight row, `x` whole rows of it, `out` as long as
/// `x`. The weight's bytes and the row length.
pub fn rms_norm_args<'a>(
    x_len: usize,
    weight: &TensorView<'a>,
    out_len: usize,
) -> OpResult<(&'a [u8], usize)> {
    const OP: &str = "rms_norm";
    let (bytes, n) = f32_vector(OP, "weight", weight)?;
    if !x_len.is_multiple_of(n) {
        return Err(format!(
            "{OP}: x length {x_len} is not a multiple of the row length {n}"
        ));
    }
    expect_len(OP, "out length", out_len, x_len)?;
    Ok((bytes, n))
}

/// An `add_bias` call's checks: an F32 bias row, `x` whole rows of it. The bias's bytes
/// and length.
pub fn add_bias_args<'a>(x_len: usize, bias: &TensorView<'a>) -> OpResult<(&'a [u8], usize)> {
    const OP: &str = "add_bias";
    let (bytes, row) = f32_vector(OP, "bias", bias)?;
    if !x_len.is_multiple_of(row) {
        return Err(format!(
            "{OP}: x length {x_len} is not a multiple of the bias length {row}"
        ));
    }
    Ok((bytes, row))
}

/// A `rope` call's checks: `x` holding `n_positions × n_head × head_dim`, `n_rot` even and
/// within a head, one frequency factor per rotated pair. `n_rot`, or `None` where there is
/// nothing to rotate.
pub fn rope_args(
    x_len: usize,
    n_head: usize,
    head_dim: usize,
    n_positions: usize,
    p: &RopeParams<'_>,
) -> OpResult<Option<usize>> {
    const OP: &str = "rope";
    let row = mul(OP, n_head, head_dim)?;
    expect_len(OP, "x length", x_len, mul(OP, n_positions, row)?)?;
    let n_rot = p.n_rot as usize;
    if !n_rot.is_multiple_of(2) || n_rot > head_dim {
        return Err(format!(
            "{OP}: n_rot {n_rot} must be even and at most head_dim {head_dim}"
        ));
    }
    if let Some(f) = p.freq_factors.as_ref().into_option() {
        expect_len(OP, "freq_factors length", f.len(), n_rot / 2)?;
    }
    Ok((n_rot > 0 && row > 0 && n_positions > 0).then_some(n_rot))
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi_stable::std_types::RSlice;

    #[test]
    fn checks_name_what_is_wrong() {
        assert_eq!(
            expect_len("add", "x length", 3, 4).unwrap_err(),
            "add: x length is 3, expected 4"
        );
        assert!(mul("kv_create", usize::MAX, 2)
            .unwrap_err()
            .contains("overflows"));
        let bytes = [0u8; 12];
        let v = |ty: GgmlType, rows| TensorView {
            data: RSlice::from_slice(&bytes),
            ggml_type: ty as u32,
            cols: 3,
            rows,
        };
        assert_eq!(
            f32_vector("rms_norm", "weight", &v(GgmlType::F32, 1))
                .unwrap()
                .1,
            3
        );
        let e = f32_vector("rms_norm", "weight", &v(GgmlType::F16, 1)).unwrap_err();
        assert!(e.contains("must be F32"), "{e}");
        let e = f32_vector("add_bias", "bias", &v(GgmlType::F32, 2)).unwrap_err();
        assert!(e.contains("one row of 3 f32"), "{e}");
    }

    #[test]
    fn op_arguments_are_checked() {
        let w = [0u8; 16];
        let row = TensorView {
            data: RSlice::from_slice(&w),
            ggml_type: GgmlType::F32 as u32,
            cols: 4,
            rows: 1,
        };
        assert_eq!(rms_norm_args(8, &row, 8).unwrap().1, 4);
        let e = rms_norm_args(6, &row, 6).unwrap_err();
        assert!(e.contains("not a multiple of the row length 4"), "{e}");
        assert!(rms_norm_args(8, &row, 4)
            .unwrap_err()
            .contains("out length"));
        assert_eq!(add_bias_args(12, &row).unwrap().1, 4);
        assert!(add_bias_args(5, &row)
            .unwrap_err()
            .contains("bias length 4"));
        let p = RopeParams {
            n_rot: 4,
            freq_base: 10_000.0,
            freq_scale: 1.0,
            neox: false,
            freq_factors: None.into(),
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 4096,
        };
        assert_eq!(rope_args(2 * 3 * 8, 2, 8, 3, &p).unwrap(), Some(4));
        assert_eq!(rope_args(0, 2, 8, 0, &p).unwrap(), None);
        assert!(rope_args(10, 2, 8, 3, &p).unwrap_err().contains("x length"));
        let odd = RopeParams { n_rot: 3, ..p };
        assert!(rope_args(48, 2, 8, 3, &odd)
            .unwrap_err()
            .contains("must be even"));
        let factors = [1.0f32; 3];
        let bad = RopeParams {
            freq_factors: Some(RSlice::from_slice(&factors[..])).into(),
            ..p
        };
        assert!(rope_args(48, 2, 8, 3, &bad)
            .unwrap_err()
            .contains("freq_factors length"));
    }
}

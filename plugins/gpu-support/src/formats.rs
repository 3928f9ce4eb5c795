//! The weight formats a GPU reads, as the host sees them: which family of decoding code
//! each belongs to, what its matmul multiplies against, and the checks a weight passes
//! before it is uploaded. Block layouts themselves live in each plugin's kernels, checked
//! against the CPU backend by the conformance suite.

use prima_abi::backend::TensorView;
use prima_abi::GgmlType;

use crate::checks::{expect_len, mul};

/// What a format's matmul multiplies against: the CPU backend's "vec_dot type" for it
/// (plugins/backend-cpu/src/formats/scalar.rs), so both backends compute the same products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Activation {
    /// f32 activations, rounded in the kernel to F16/BF16 for F16/BF16 weights.
    Float,
    /// 32-element blocks, f16 scale: Q4_0, Q5_0, Q8_0 weights.
    Q8_0,
    /// Q8_0 plus the f16 `s = d·Σq`: Q4_1, Q5_1 weights.
    Q8_1,
    /// 256-element blocks, f32 scale and sums of 16: the K-quants.
    Q8K,
}

impl Activation {
    /// The GGUF type the CPU converts activations to.
    pub fn ggml_type(self) -> Option<GgmlType> {
        match self {
            Activation::Float => None,
            Activation::Q8_0 => Some(GgmlType::Q8_0),
            Activation::Q8_1 => Some(GgmlType::Q8_1),
            Activation::Q8K => Some(GgmlType::Q8K),
        }
    }

    /// Elements per activation block (quantized kinds).
    pub fn block_elems(self) -> usize {
        match self {
            Activation::Float => 1,
            Activation::Q8_0 | Activation::Q8_1 => 32,
            Activation::Q8K => 256,
        }
    }

    /// The quantize kernel that writes this kind (in each plugin's kernels), if it is
    /// quantized.
    pub fn quantize_kernel(self) -> Option<&'static str> {
        match self {
            Activation::Float => None,
            Activation::Q8_0 => Some("quantize_q8_0"),
            Activation::Q8_1 => Some("quantize_q8_1"),
            Activation::Q8K => Some("quantize_q8_k"),
        }
    }
}

/// Which decoding source holds a format's functions (`formats_float`, `formats_legacy`,
/// `formats_k` in each plugin's kernels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// F32, F16, BF16.
    Float,
    /// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
    Legacy,
    /// Q2_K … Q6_K.
    K,
}

/// One supported weight format.
#[derive(Debug, Clone, Copy)]
pub struct Format {
    pub ty: GgmlType,
    /// Suffix of its kernels and decoding functions: `get_rows_<kernel>`, `deq_<kernel>`, ….
    pub kernel: &'static str,
    /// `matmul_<kernel>` and `get_rows_<kernel>`.
    pub matmul: &'static str,
    pub get_rows: &'static str,
    pub family: Family,
    pub activation: Activation,
}

macro_rules! f {
    ($ty:expr, $kernel:literal, $family:ident, $act:ident) => {
        Format {
            ty: $ty,
            kernel: $kernel,
            matmul: concat!("matmul_", $kernel),
            get_rows: concat!("get_rows_", $kernel),
            family: Family::$family,
            activation: Activation::$act,
        }
    };
}

/// Every format `matmul` and `get_rows` accept: all that the CPU backend multiplies.
/// Q8_1 and Q8_K are activation formats and never weights.
pub const FORMATS: [Format; 13] = [
    f!(GgmlType::F32, "f32", Float, Float),
    f!(GgmlType::F16, "f16", Float, Float),
    f!(GgmlType::BF16, "bf16", Float, Float),
    f!(GgmlType::Q4_0, "q4_0", Legacy, Q8_0),
    f!(GgmlType::Q4_1, "q4_1", Legacy, Q8_1),
    f!(GgmlType::Q5_0, "q5_0", Legacy, Q8_0),
    f!(GgmlType::Q5_1, "q5_1", Legacy, Q8_1),
    f!(GgmlType::Q8_0, "q8_0", Legacy, Q8_0),
    f!(GgmlType::Q2K, "q2_k", K, Q8K),
    f!(GgmlType::Q3K, "q3_k", K, Q8K),
    f!(GgmlType::Q4K, "q4_k", K, Q8K),
    f!(GgmlType::Q5K, "q5_k", K, Q8K),
    f!(GgmlType::Q6K, "q6_k", K, Q8K),
];

/// The format of GGUF type id `id`, if the GPU reads it.
pub fn format_of(id: u32) -> Option<&'static Format> {
    FORMATS.iter().find(|f| f.ty as u32 == id)
}

/// The format whose kernels are suffixed `kernel` (`q4_1`, …).
pub fn format_of_kernel(kernel: &str) -> Option<&'static Format> {
    FORMATS.iter().find(|f| f.kernel == kernel)
}

impl Format {
    /// Elements per block as the kernels see it (1 for the float formats).
    pub fn qk(&self) -> u32 {
        self.ty.block_elems() as u32
    }

    /// Bytes per block as the kernels see it.
    pub fn block_bytes(&self) -> u32 {
        self.ty.block_bytes() as u32
    }
}

/// A weight matrix checked for the row kernels: its format, shape and row stride.
#[derive(Debug, Clone, Copy)]
pub struct WeightShape {
    pub format: &'static Format,
    pub cols: u32,
    pub rows: u32,
    pub row_bytes: u64,
}

impl WeightShape {
    /// Checks that `w` is a whole number of rows of a supported format whose rows are
    /// whole 32-element chunks (the unit the matmul kernels decode); `backend` names the
    /// plugin in the error for an unsupported type.
    pub fn of(op: &str, backend: &str, w: &TensorView<'_>) -> Result<WeightShape, String> {
        let format = format_of(w.ggml_type).ok_or_else(|| {
            let name = GgmlType::from_id(w.ggml_type).map_or("unknown", GgmlType::name);
            format!(
                "{op}: weight type {name} (id {}) is not supported by the {backend} backend",
                w.ggml_type
            )
        })?;
        let ty = format.ty;
        let cols = usize::try_from(w.cols).map_err(|_| format!("{op}: too many columns"))?;
        if cols % 32 != 0 || cols % ty.block_elems() != 0 {
            return Err(format!(
                "{op}: rows of {cols} elements are not whole {}-element {} blocks (and 32-element chunks)",
                ty.block_elems().max(32),
                ty.name()
            ));
        }
        let row_bytes = ty
            .row_bytes(cols)
            .ok_or_else(|| format!("{op}: row of {cols} {} elements overflows", ty.name()))?;
        let expected = (row_bytes as u128) * (w.rows as u128);
        if w.data.len() as u128 != expected {
            return Err(format!(
                "{op}: {} weight of {} × {cols} must be {expected} bytes, got {}",
                ty.name(),
                w.rows,
                w.data.len()
            ));
        }
        Ok(WeightShape {
            format,
            cols: u32::try_from(cols).map_err(|_| format!("{op}: too many columns"))?,
            rows: u32::try_from(w.rows).map_err(|_| format!("{op}: too many rows"))?,
            row_bytes: row_bytes as u64,
        })
    }

    /// A `get_rows` call's checks: the table, `out` holding `ids.len()` rows, every id a
    /// row of the table.
    pub fn for_get_rows(
        backend: &str,
        table: &TensorView<'_>,
        ids: &[u32],
        out_len: usize,
    ) -> Result<WeightShape, String> {
        const OP: &str = "get_rows";
        let shape = WeightShape::of(OP, backend, table)?;
        expect_len(
            OP,
            "out length",
            out_len,
            mul(OP, ids.len(), shape.cols as usize)?,
        )?;
        if let Some(&bad) = ids.iter().find(|&&i| i >= shape.rows) {
            return Err(format!(
                "{OP}: row id {bad} is out of range for {} rows",
                shape.rows
            ));
        }
        Ok(shape)
    }

    /// A `matmul` call's checks: the weight, `x` holding `n_tokens` rows of its columns and
    /// `out` `n_tokens` rows of its rows.
    pub fn for_matmul(
        backend: &str,
        w: &TensorView<'_>,
        x_len: usize,
        n_tokens: usize,
        out_len: usize,
    ) -> Result<WeightShape, String> {
        const OP: &str = "matmul";
        let shape = WeightShape::of(OP, backend, w)?;
        expect_len(
            OP,
            "x length",
            x_len,
            mul(OP, n_tokens, shape.cols as usize)?,
        )?;
        expect_len(
            OP,
            "out length",
            out_len,
            mul(OP, n_tokens, shape.rows as usize)?,
        )?;
        Ok(shape)
    }

    /// Bytes the weight occupies in VRAM: its stored blocks, unchanged.
    pub fn upload_bytes(&self) -> u64 {
        self.row_bytes * self.rows as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi_stable::std_types::RSlice;

    fn view(data: &[u8], ty: GgmlType, cols: u64, rows: u64) -> TensorView<'_> {
        TensorView {
            data: RSlice::from_slice(data),
            ggml_type: ty as u32,
            cols,
            rows,
        }
    }

    #[test]
    fn supported_formats_are_the_cpu_backends_weight_formats() {
        for ty in GgmlType::ALL {
            let activation_only = matches!(ty, GgmlType::Q8_1 | GgmlType::Q8K);
            // The non-linear IQ4 formats and MXFP4 have no GPU kernels yet: refused (see
            // below).
            let cpu_only = matches!(ty, GgmlType::IQ4NL | GgmlType::IQ4XS | GgmlType::MXFP4);
            assert_eq!(
                format_of(ty as u32).is_some(),
                !activation_only && !cpu_only,
                "{ty}"
            );
        }
        assert!(format_of(99).is_none());
        for f in FORMATS {
            assert_eq!(format_of_kernel(f.kernel).map(|g| g.ty), Some(f.ty));
        }
    }

    #[test]
    fn activation_kinds_are_the_cpu_backends_vec_dot_types() {
        // As plugins/backend-cpu/src/formats/scalar.rs pairs them (llama.cpp's pairing).
        use GgmlType as T;
        for (ty, want) in [
            (T::Q4_0, Some(T::Q8_0)),
            (T::Q5_0, Some(T::Q8_0)),
            (T::Q8_0, Some(T::Q8_0)),
            (T::Q4_1, Some(T::Q8_1)),
            (T::Q5_1, Some(T::Q8_1)),
            (T::Q2K, Some(T::Q8K)),
            (T::Q3K, Some(T::Q8K)),
            (T::Q4K, Some(T::Q8K)),
            (T::Q5K, Some(T::Q8K)),
            (T::Q6K, Some(T::Q8K)),
            (T::F32, None),
            (T::F16, None),
            (T::BF16, None),
        ] {
            let f = format_of(ty as u32).unwrap();
            assert_eq!(f.activation.ggml_type(), want, "{ty}");
            if let Some(a) = want {
                assert_eq!(f.activation.block_elems(), a.block_elems(), "{ty}");
                // The matmul kernels take one activation block per weight block.
                assert_eq!(ty.block_elems(), a.block_elems(), "{ty}");
            }
        }
    }

    #[test]
    fn upload_size_is_the_stored_block_size() {
        // 2 rows of 512 Q4_K elements: 2 super-blocks of 144 bytes per row.
        let data = vec![0u8; 2 * 2 * 144];
        let s = WeightShape::of("t", "test", &view(&data, GgmlType::Q4K, 512, 2)).unwrap();
        assert_eq!((s.row_bytes, s.upload_bytes()), (288, 576));
        let data = vec![0u8; 3 * 64 * 18];
        let s = WeightShape::of("t", "test", &view(&data, GgmlType::Q4_0, 2048, 3)).unwrap();
        assert_eq!(s.upload_bytes(), 3 * 64 * 18);
        let data = vec![0u8; 4 * 32 * 2];
        let s = WeightShape::of("t", "test", &view(&data, GgmlType::BF16, 32, 4)).unwrap();
        assert_eq!(s.row_bytes, 64);
    }

    #[test]
    fn bad_weights_are_refused_with_a_reason() {
        let data = vec![0u8; 144];
        let e = WeightShape::of("matmul", "test", &view(&data, GgmlType::Q4K, 128, 1)).unwrap_err();
        assert!(e.contains("whole 256-element Q4_K blocks"), "{e}");
        let e = WeightShape::of("matmul", "test", &view(&data, GgmlType::Q4K, 256, 2)).unwrap_err();
        assert!(e.contains("must be 288 bytes, got 144"), "{e}");
        let e = WeightShape::of("matmul", "test", &view(&data, GgmlType::Q8K, 256, 1)).unwrap_err();
        assert!(e.contains("Q8_K") && e.contains("not supported"), "{e}");
        for ty in [GgmlType::IQ4NL, GgmlType::IQ4XS, GgmlType::MXFP4] {
            let e = WeightShape::of("matmul", "test", &view(&data, ty, 256, 1)).unwrap_err();
            assert!(e.contains(ty.name()) && e.contains("not supported"), "{e}");
        }
        let data = vec![0u8; 48 * 4];
        let e = WeightShape::of("matmul", "test", &view(&data, GgmlType::F32, 48, 1)).unwrap_err();
        assert!(e.contains("32-element"), "{e}");
    }
}

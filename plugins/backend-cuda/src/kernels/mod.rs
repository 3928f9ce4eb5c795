//! The CUDA C kernel sources, one per operation or format family, and how a family's
//! compilation unit is assembled (shared header + row-kernel template + the family).
//!
//! Nothing here talks to a GPU: [`source`] is plain text that [`crate::compile`] hands to
//! NVRTC. The sources use no toolkit header (f16 conversions are inline PTX), so NVRTC
//! needs no include path.

use crate::formats;

/// Integer types, f16/bf16 conversions, byte loads, warp reductions.
const COMMON: &str = include_str!("common.cuh");
/// `GET_ROWS`, `FLOAT_MATMUL` and `QUANT_MATMUL` (the `matmul_q` template): the row
/// kernels each weight format instantiates.
const ROWS: &str = include_str!("rows.cuh");

/// A compilation unit: one NVRTC program, one CUDA module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// F32, F16, BF16 weights.
    FloatFormats,
    /// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
    LegacyQuants,
    /// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
    KQuants,
    /// Activations to Q8_0, Q8_1, Q8_K before a quantized matmul.
    Quantize,
    /// rms_norm, add, add_bias, scale, swiglu, geglu.
    Elementwise,
    Rope,
    /// store_f16 (KV cache writes) and attention.
    Attention,
}

/// The program that decodes a weight format's family.
impl From<formats::Family> for Family {
    fn from(f: formats::Family) -> Family {
        match f {
            formats::Family::Float => Family::FloatFormats,
            formats::Family::Legacy => Family::LegacyQuants,
            formats::Family::K => Family::KQuants,
        }
    }
}

impl Family {
    pub const ALL: [Family; 7] = [
        Family::FloatFormats,
        Family::LegacyQuants,
        Family::KQuants,
        Family::Quantize,
        Family::Elementwise,
        Family::Rope,
        Family::Attention,
    ];

    /// The program's name (NVRTC logs and the disk cache use it).
    pub fn name(self) -> &'static str {
        match self {
            Family::FloatFormats => "formats_float",
            Family::LegacyQuants => "formats_legacy",
            Family::KQuants => "formats_k",
            Family::Quantize => "quantize",
            Family::Elementwise => "elementwise",
            Family::Rope => "rope",
            Family::Attention => "attention",
        }
    }

    fn body(self) -> &'static str {
        match self {
            Family::FloatFormats => include_str!("formats_float.cu"),
            Family::LegacyQuants => include_str!("formats_legacy.cu"),
            Family::KQuants => include_str!("formats_k.cu"),
            Family::Quantize => include_str!("quantize.cu"),
            Family::Elementwise => include_str!("elementwise.cu"),
            Family::Rope => include_str!("rope.cu"),
            Family::Attention => include_str!("attention.cu"),
        }
    }

    /// Whether the family instantiates the shared row kernels.
    fn uses_rows(self) -> bool {
        matches!(
            self,
            Family::FloatFormats | Family::LegacyQuants | Family::KQuants
        )
    }
}

/// The complete CUDA C source of one family, as NVRTC compiles it.
pub fn source(family: Family) -> String {
    let mut src = String::with_capacity(16 * 1024);
    src.push_str(&format!("// prima backend-cuda: {}\n", family.name()));
    src.push_str(COMMON);
    if family.uses_rows() {
        src.push_str(ROWS);
    }
    src.push_str(family.body());
    src
}

/// Kernels per matmul thread block (must match `MATMUL_WARPS` in rows.cuh) and tokens per
/// warp (`MATMUL_TOKENS`).
pub const MATMUL_WARPS: u32 = 4;
pub const MATMUL_TOKENS: u32 = 8;
/// Warps per attention block (`ATT_WARPS` in attention.cu) and the largest head size.
pub const ATT_WARPS: u32 = 4;
pub const ATT_MAX_HEAD_DIM: u32 = 512;

#[cfg(test)]
mod tests {
    use super::*;

    fn define(src: &str, name: &str) -> u32 {
        let line = src
            .lines()
            .find(|l| l.starts_with(&format!("#define {name} ")))
            .unwrap_or_else(|| panic!("#define {name} missing"));
        line.split_whitespace().nth(2).unwrap().parse().unwrap()
    }

    #[test]
    fn every_family_starts_with_the_common_header() {
        for f in Family::ALL {
            let s = source(f);
            assert!(s.contains("f16_to_f32"), "{f:?}");
            assert!(s.contains(f.body()), "{f:?}");
            assert_eq!(s.contains("#define GET_ROWS"), f.uses_rows(), "{f:?}");
        }
    }

    #[test]
    fn launch_constants_match_the_kernels() {
        let rows = source(Family::KQuants);
        assert_eq!(define(&rows, "MATMUL_WARPS"), MATMUL_WARPS);
        assert_eq!(define(&rows, "MATMUL_TOKENS"), MATMUL_TOKENS);
        let att = source(Family::Attention);
        assert_eq!(define(&att, "ATT_WARPS"), ATT_WARPS);
        assert_eq!(define(&att, "ATT_MAX_HEAD_DIM"), ATT_MAX_HEAD_DIM);
    }

    #[test]
    fn every_format_kernel_is_instantiated() {
        for fmt in crate::formats::FORMATS {
            let s = source(fmt.family.into());
            assert!(
                s.contains(&format!("GET_ROWS({}, ", fmt.kernel)),
                "{}",
                fmt.kernel
            );
            let matmul = match fmt.activation {
                crate::formats::Activation::Float => format!("FLOAT_MATMUL({}, ", fmt.kernel),
                _ => format!("QUANT_MATMUL({}, dot_{})", fmt.kernel, fmt.kernel),
            };
            assert!(s.contains(&matmul), "{matmul}");
            if let Some(q) = fmt.activation.quantize_kernel() {
                assert!(
                    source(Family::Quantize).contains(&format!("void {q}(")),
                    "{q}"
                );
            }
            assert!(
                s.contains(&format!("deq_{}(", fmt.kernel)),
                "{}",
                fmt.kernel
            );
        }
    }

    #[test]
    fn no_toolkit_headers() {
        for f in Family::ALL {
            assert!(!source(f).contains("#include"), "{f:?}");
        }
    }
}

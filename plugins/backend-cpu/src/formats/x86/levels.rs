//! The level tables: which x86 kernel serves each weight format at each instruction-set
//! level. [`avx2`] takes the scalar table and replaces what AVX2 accelerates; [`avx512`]
//! takes the AVX2 table and replaces what AVX-512 accelerates, so a format without an
//! AVX-512 kernel of some shape keeps its AVX2 one.
//!
//! This is the only x86 module that picks between shapes (`vec_dot`, `few`, `rows`,
//! `panel`) and between a format's own kernels and another's (IQ4_NL's and MXFP4's panels
//! are Q8_0's);
//! nothing in x86 imports it, and only `formats::dispatch` calls it, after detecting the
//! level's features.
//!
//! Not for: kernels or their safe wrappers (the shape modules), feature detection
//! (`dispatch`), attention's products (`attention`, which dispatch reads directly).

use super::few::{few256, few512};
use super::panel::{panel256, panel512, panel512_bf16, panel_iq4};
use super::quantize;
use super::rows::{few_rows16, few_rows8, kdec16, kdec8};
use super::vec_dot::{dot256, dot512, iq4, mxfp4};
use crate::formats::FormatKernels;
use prima_abi::GgmlType;

/// Replaces the functions of `k` (the scalar table) that have an AVX2 version.
pub(in crate::formats) fn avx2(mut k: FormatKernels) -> FormatKernels {
    use GgmlType as T;
    k.vec_dot = match k.weight_type {
        T::F32 => dot256::vec_dot_f32,
        T::F16 => dot256::vec_dot_f16,
        T::BF16 => dot256::vec_dot_bf16,
        T::Q4_0 => dot256::vec_dot_q4_0,
        T::Q4_1 => dot256::vec_dot_q4_1,
        T::Q5_0 => dot256::vec_dot_q5_0,
        T::Q5_1 => dot256::vec_dot_q5_1,
        T::Q8_0 => dot256::vec_dot_q8_0,
        T::Q2K => dot256::vec_dot_q2_k,
        T::Q3K => dot256::vec_dot_q3_k,
        T::Q4K => dot256::vec_dot_q4_k,
        T::Q5K => dot256::vec_dot_q5_k,
        T::Q6K => dot256::vec_dot_q6_k,
        T::IQ4NL => iq4::vec_dot_iq4_nl_avx2,
        T::IQ4XS => iq4::vec_dot_iq4_xs_avx2,
        T::MXFP4 => mxfp4::vec_dot_avx2,
        T::Q8_1 | T::Q8K => k.vec_dot,
    };
    k.vec_dot_x4 = match k.weight_type {
        T::Q4_0 => Some(dot256::vec_dot_x4_q4_0),
        T::Q4_1 => Some(dot256::vec_dot_x4_q4_1),
        T::Q5_0 => Some(dot256::vec_dot_x4_q5_0),
        T::Q8_0 => Some(dot256::vec_dot_x4_q8_0),
        T::Q4K => Some(dot256::vec_dot_x4_q4_k),
        T::Q6K => Some(dot256::vec_dot_x4_q6_k),
        _ => k.vec_dot_x4,
    };
    k.quantize_activation = match k.vec_dot_type {
        T::Q8_0 => quantize::quantize_row_q8_0,
        T::Q8_1 => quantize::quantize_row_q8_1,
        T::Q8K => quantize::quantize_row_q8_k,
        T::F16 => quantize::quantize_row_f16,
        _ => k.quantize_activation,
    };
    k.panel = match k.weight_type {
        // IQ4_NL rows rewritten as Q8_0 rows run through Q8_0's panels.
        T::IQ4NL => panel_iq4::iq4_nl_kernels(panel256::kernels(T::Q8_0), panel_iq4::pack_avx2),
        T::IQ4XS => Some(panel_iq4::iq4_xs_avx2()),
        // MXFP4 likewise, with a tile of its own.
        T::MXFP4 => panel256::mxfp4_kernels(panel_iq4::pack_mxfp4_avx2),
        t => panel256::kernels(t),
    }
    .or(k.panel);
    k.few = few256::kernels(k.weight_type).or(k.few);
    k.decode = few_rows8::decode_kernels(k.weight_type)
        .or_else(|| kdec8::decode_kernels(k.weight_type))
        .or(k.decode);
    k
}

/// Replaces the functions of `k` (the AVX2 table) that have an AVX-512 version.
pub(in crate::formats) fn avx512(mut k: FormatKernels) -> FormatKernels {
    use GgmlType as T;
    k.vec_dot = match k.weight_type {
        T::Q4_0 => dot512::vec_dot_q4_0,
        T::Q4_1 => dot512::vec_dot_q4_1,
        T::Q5_0 => dot512::vec_dot_q5_0,
        T::Q8_0 => dot512::vec_dot_q8_0,
        T::Q4K => dot512::vec_dot_q4_k,
        T::Q6K => dot512::vec_dot_q6_k,
        T::IQ4NL => iq4::vec_dot_iq4_nl_avx512,
        T::IQ4XS => iq4::vec_dot_iq4_xs_avx512,
        T::MXFP4 => mxfp4::vec_dot_avx512,
        _ => k.vec_dot,
    };
    k.vec_dot_x4 = match k.weight_type {
        T::Q4K => Some(dot512::vec_dot_x4_q4_k),
        T::Q6K => Some(dot512::vec_dot_x4_q6_k),
        _ => k.vec_dot_x4,
    };
    k.vec_dot_2x8 = match k.weight_type {
        T::Q4_0 => Some(dot512::vec_dot_2x8_q4_0),
        T::Q5_0 => Some(dot512::vec_dot_2x8_q5_0),
        T::Q8_0 => Some(dot512::vec_dot_2x8_q8_0),
        T::Q4K => Some(dot512::vec_dot_2x8_q4_k),
        _ => k.vec_dot_2x8,
    };
    k.vec_dot_2x4 = match k.weight_type {
        T::Q4K => Some(dot512::vec_dot_2x4_q4_k),
        T::Q6K => Some(dot512::vec_dot_2x4_q6_k),
        T::Q4_0 => Some(dot512::vec_dot_2x4_q4_0),
        T::Q5_0 => Some(dot512::vec_dot_2x4_q5_0),
        T::Q8_0 => Some(dot512::vec_dot_2x4_q8_0),
        _ => k.vec_dot_2x4,
    };
    k.panel = match k.weight_type {
        T::IQ4NL => panel_iq4::iq4_nl_kernels(panel512::kernels(T::Q8_0), panel_iq4::pack_avx512),
        // MXFP4 likewise, its E8M0 scales written into the panel's f32 `d` lanes (AVX2's
        // panels, in `panel256`, have a tile of their own).
        T::MXFP4 => {
            panel_iq4::iq4_nl_kernels(panel512::kernels(T::Q8_0), panel_iq4::pack_mxfp4_avx512)
        }
        T::IQ4XS => Some(panel_iq4::iq4_xs_avx512()),
        // `vdpbf16ps` where this CPU has it and reproduces the scalar order.
        T::BF16 => panel512_bf16::kernels().or_else(|| panel512::kernels(T::BF16)),
        t => panel512::kernels(t),
    }
    .or(k.panel);
    k.few = match k.weight_type {
        // Sixteen rows a step, no reductions (see `rows::few_rows16`).
        T::Q8_0 => Some(few_rows16::q8_0_kernels()),
        T::Q4_1 => Some(few_rows16::q4_1_kernels()),
        T::IQ4NL => Some(few_rows16::iq4_nl_kernels()),
        t => few512::kernels(t),
    }
    .or(k.few);
    k.decode = few_rows16::decode_kernels(k.weight_type)
        .or_else(|| kdec16::decode_kernels(k.weight_type))
        .or(k.decode);
    k
}

//! The scalar kernel table: one [`FormatKernels`] per supported weight type.
//!
//! This is the reference every vectorised kernel is tested against. A SIMD dispatch sits
//! beside it with the same signature (`fn kernels(GgmlType) -> Option<FormatKernels>`) and
//! falls back to this table for what it does not accelerate.

use super::k_quants::{q2_k, q3_k, q4_k, q5_k, q6_k, q8_k};
use super::{
    float, iq4_nl, iq4_xs, mxfp4, q4_0, q4_1, q5_0, q5_1, q8_0, q8_1, DequantizeRowFn,
    FormatKernels,
};
use prima_abi::GgmlType;

/// The scalar kernels for weights of type `t`, or `None` when `t` is not a weight type
/// this backend computes with (Q8_1 and Q8_K are activation-only).
pub fn kernels(t: GgmlType) -> Option<FormatKernels> {
    use GgmlType as T;
    let k = |vec_dot_type, dequantize_row, quantize_activation, vec_dot| FormatKernels {
        weight_type: t,
        vec_dot_type,
        dequantize_row,
        quantize_activation,
        vec_dot,
        vec_dot_x4: None,
        vec_dot_2x4: None,
        vec_dot_2x8: None,
        panel: None,
        few: None,
        decode: None,
    };
    Some(match t {
        T::F32 => k(
            T::F32,
            float::dequantize_row_f32,
            float::quantize_row_f32,
            float::vec_dot_f32,
        ),
        T::F16 => k(
            T::F16,
            float::dequantize_row_f16,
            float::quantize_row_f16,
            float::vec_dot_f16,
        ),
        T::BF16 => k(
            T::BF16,
            float::dequantize_row_bf16,
            float::quantize_row_bf16,
            float::vec_dot_bf16,
        ),
        T::Q4_0 => k(
            T::Q8_0,
            q4_0::dequantize_row,
            q8_0::quantize_row,
            q4_0::vec_dot,
        ),
        T::Q4_1 => k(
            T::Q8_1,
            q4_1::dequantize_row,
            q8_1::quantize_row,
            q4_1::vec_dot,
        ),
        T::Q5_0 => k(
            T::Q8_0,
            q5_0::dequantize_row,
            q8_0::quantize_row,
            q5_0::vec_dot,
        ),
        T::Q5_1 => k(
            T::Q8_1,
            q5_1::dequantize_row,
            q8_1::quantize_row,
            q5_1::vec_dot,
        ),
        T::Q8_0 => k(
            T::Q8_0,
            q8_0::dequantize_row,
            q8_0::quantize_row,
            q8_0::vec_dot,
        ),
        T::Q2K => k(
            T::Q8K,
            q2_k::dequantize_row,
            q8_k::quantize_row,
            q2_k::vec_dot,
        ),
        T::Q3K => k(
            T::Q8K,
            q3_k::dequantize_row,
            q8_k::quantize_row,
            q3_k::vec_dot,
        ),
        T::Q4K => k(
            T::Q8K,
            q4_k::dequantize_row,
            q8_k::quantize_row,
            q4_k::vec_dot,
        ),
        T::Q5K => k(
            T::Q8K,
            q5_k::dequantize_row,
            q8_k::quantize_row,
            q5_k::vec_dot,
        ),
        T::Q6K => k(
            T::Q8K,
            q6_k::dequantize_row,
            q8_k::quantize_row,
            q6_k::vec_dot,
        ),
        T::IQ4NL => k(
            T::Q8_0,
            iq4_nl::dequantize_row,
            q8_0::quantize_row,
            iq4_nl::vec_dot,
        ),
        T::IQ4XS => k(
            T::Q8K,
            iq4_xs::dequantize_row,
            q8_k::quantize_row,
            iq4_xs::vec_dot,
        ),
        T::MXFP4 => k(
            T::Q8_0,
            mxfp4::dequantize_row,
            q8_0::quantize_row,
            mxfp4::vec_dot,
        ),
        T::Q8_1 | T::Q8K => return None,
    })
}

/// The row dequantizer of any readable type, activation types included (tests and tools
/// use it to read quantized activations back).
pub fn dequantize_row(t: GgmlType) -> DequantizeRowFn {
    use GgmlType as T;
    match t {
        T::F32 => float::dequantize_row_f32,
        T::F16 => float::dequantize_row_f16,
        T::BF16 => float::dequantize_row_bf16,
        T::Q4_0 => q4_0::dequantize_row,
        T::Q4_1 => q4_1::dequantize_row,
        T::Q5_0 => q5_0::dequantize_row,
        T::Q5_1 => q5_1::dequantize_row,
        T::Q8_0 => q8_0::dequantize_row,
        T::Q8_1 => q8_1::dequantize_row,
        T::Q2K => q2_k::dequantize_row,
        T::Q3K => q3_k::dequantize_row,
        T::Q4K => q4_k::dequantize_row,
        T::Q5K => q5_k::dequantize_row,
        T::Q6K => q6_k::dequantize_row,
        T::Q8K => q8_k::dequantize_row,
        T::IQ4NL => iq4_nl::dequantize_row,
        T::IQ4XS => iq4_xs::dequantize_row,
        T::MXFP4 => mxfp4::dequantize_row,
    }
}

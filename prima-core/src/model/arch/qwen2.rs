//! `qwen2`: Qwen 2 / 2.5, QwQ, DeepSeek-R1-Distill-Qwen.
//!
//! The llama layer with two differences: Q, K and V projections have biases, and RoPE
//! uses the NeoX ordering.

use super::{ArchSpec, AttentionBias};

pub const SPEC: ArchSpec = ArchSpec {
    name: "qwen2",
    rope_neox: true,
    attn_bias: AttentionBias::Qkv,
    ..ArchSpec::LLAMA_LIKE
};

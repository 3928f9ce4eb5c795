//! `qwen3`: Qwen 3 (dense).
//!
//! The llama layer with NeoX RoPE, no Q/K/V biases, and an RMSNorm over each query and
//! key head (`attn_q_norm`, `attn_k_norm`) before RoPE. The head size comes from
//! `qwen3.attention.key_length` and is independent of `n_embd / n_head`.

use super::ArchSpec;

pub const SPEC: ArchSpec = ArchSpec {
    name: "qwen3",
    rope_neox: true,
    qk_norm: true,
    ..ArchSpec::LLAMA_LIKE
};

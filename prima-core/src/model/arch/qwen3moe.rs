//! `qwen3moe`: Qwen 3 mixture of experts (Qwen3-30B-A3B, Qwen3-235B-A22B).
//!
//! Attention exactly as `qwen3` (NeoX RoPE, per-head Q/K RMSNorm, head size from
//! `qwen3moe.attention.key_length`). The feed-forward block is a mixture of
//! `qwen3moe.expert_count` SwiGLU experts of width `qwen3moe.expert_feed_forward_length`:
//! a router (`ffn_gate_inp`) gives each token a softmax over all experts, the token goes
//! to the `qwen3moe.expert_used_count` most probable ones, and their outputs are summed
//! weighted by those probabilities renormalised to sum to 1. No shared expert.

use super::{ArchSpec, ExpertGating, ExpertRouting};

pub const SPEC: ArchSpec = ArchSpec {
    name: "qwen3moe",
    rope_neox: true,
    qk_norm: true,
    experts: Some(ExpertRouting {
        gating: ExpertGating::Softmax,
        normalize_weights: true,
        biases: false,
    }),
    ..ArchSpec::LLAMA_LIKE
};

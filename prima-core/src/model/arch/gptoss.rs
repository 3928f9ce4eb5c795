//! `gpt-oss`: OpenAI's gpt-oss (20b, 120b); llama.cpp's `LLM_ARCH_OPENAI_MOE`.
//!
//! Differences from the llama layer, following llama.cpp's `openai-moe` graph:
//! - Q, K, V and the attention output carry biases;
//! - **attention sinks**: one learned logit per query head (`attn_sinks.weight`) joins each
//!   softmax's denominator, so a head may give little weight to every position;
//! - NeoX RoPE with YaRN (`gpt-oss.rope.scaling.*`) on every layer, local ones included;
//! - alternating sliding-window layers: in each pair the first is local (the window
//!   `gpt-oss.attention.sliding_window`), the second global (llama.cpp's
//!   `set_swa_pattern(2)`);
//! - the norm before the feed-forward block is `post_attention_norm.weight`;
//! - the feed-forward block is a mixture of experts whose router and experts carry
//!   biases; the `expert_used_count` largest router logits are kept and their softmax
//!   weighs the experts (no renormalisation); the experts' activation is the clamped
//!   SwiGLU ([`FfnActivation::SwigluOai`]). The experts are MXFP4 in the released files.

use super::{
    ArchSpec, AttentionBias, ExpertGating, ExpertRouting, FfnActivation, LocalRope,
    SlidingWindowSpec,
};

pub const SPEC: ArchSpec = ArchSpec {
    name: "gpt-oss",
    rope_neox: true,
    attn_bias: AttentionBias::QkvOutput,
    attn_sinks: true,
    ffn_norm: "post_attention_norm.weight",
    ffn: FfnActivation::SwigluOai,
    sliding_window: Some(SlidingWindowSpec {
        default_period: 2,
        local_rope: LocalRope::AsGlobal,
    }),
    experts: Some(ExpertRouting {
        gating: ExpertGating::SoftmaxOfTopK,
        normalize_weights: false,
        biases: true,
    }),
    ..ArchSpec::LLAMA_LIKE
};

//! `gemma3`: Gemma 3 (text).
//!
//! Differences from the llama layer, following llama.cpp's `gemma3` graph:
//! - token embeddings are multiplied by `sqrt(n_embd)`;
//! - an RMSNorm over each query and key head before RoPE (NeoX ordering);
//! - the queries are scaled before attention (see [`AttentionScale::Gemma3QueryPreAttn`]);
//! - post-norms: the attention and feed-forward outputs are RMS-normed
//!   (`attn_post_norm`, `ffn_post_norm`) before they are added to the residual;
//! - GeGLU (tanh-approximated GELU) instead of SwiGLU;
//! - local layers attend to the last `gemma3.attention.sliding_window` positions and use
//!   RoPE base `gemma3.rope.freq_base_swa` (10 000 when absent, llama.cpp's default);
//!   every sixth layer (or the period `gemma3.attention.sliding_window_pattern` gives) is
//!   global, with base `gemma3.rope.freq_base` and the model's RoPE scaling.
//!
//! The converter stores Gemma's norm weights with the `+1` already added, so the norms
//! are the plain RMSNorm of the other architectures. The output head is tied.

use super::{ArchSpec, AttentionScale, FfnActivation, LocalRope, SlidingWindowSpec};

pub const SPEC: ArchSpec = ArchSpec {
    name: "gemma3",
    rope_neox: true,
    qk_norm: true,
    post_norms: true,
    ffn: FfnActivation::GeluTanh,
    scale_embeddings: true,
    attention_scale: AttentionScale::Gemma3QueryPreAttn,
    sliding_window: Some(SlidingWindowSpec {
        default_period: 6,
        local_rope: LocalRope::Own {
            default_freq_base: 10_000.0,
        },
    }),
    ..ArchSpec::LLAMA_LIKE
};

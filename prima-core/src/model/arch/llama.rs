//! `llama`: Llama 1/2/3, SmolLM, Mistral-style models, DeepSeek-R1-Distill-Llama.
//!
//! RMSNorm → attention (GQA, RoPE on adjacent pairs: the GGUF converter permutes Q/K
//! so this ordering is right) → residual → RMSNorm → SwiGLU → residual. The output head
//! is `output.weight`, or the token embedding when tied. Llama 3.1+ ships per-dimension
//! RoPE frequency factors as `rope_freqs.weight`.

use super::ArchSpec;

pub const SPEC: ArchSpec = ArchSpec {
    name: "llama",
    ..ArchSpec::LLAMA_LIKE
};

//! The architectures Prima runs, as data: each file states how its family differs from
//! the shared decoder-only transformer in [`super::forward`].

mod gemma3;
mod llama;
mod qwen2;
mod qwen3;
mod qwen3moe;

/// A supported model architecture (`general.architecture` in GGUF).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    Gemma3,
}

/// The gated activation of the feed-forward block: `act(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnActivation {
    /// SwiGLU: `silu(gate) * up`.
    Silu,
    /// GeGLU: `gelu_tanh(gate) * up`.
    GeluTanh,
}

/// How a mixture-of-experts block turns router logits into expert weights. The router
/// always takes a softmax over every expert and keeps the `expert_used_count` largest
/// probabilities (the architectures Prima runs gate so).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertRouting {
    /// Divide the kept probabilities by their sum, so each token's weights add up to 1.
    pub normalize_weights: bool,
}

/// The multiplier of q·k before the softmax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionScale {
    /// `1 / sqrt(head_dim_k)`, applied inside the attention operation.
    InvSqrtHeadDim,
    /// Gemma's `query_pre_attn_scalar`, applied to the queries before attention (as
    /// llama.cpp does, so the F16 rounding of the queries matches): `1 / sqrt(head_dim_k)`,
    /// except for the 62-layer Gemma 3 27B, which uses `1 / sqrt(n_embd / n_head)`.
    Gemma3QueryPreAttn,
}

/// Sliding-window (local) attention on some layers, full (global) attention on the rest.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlidingWindowSpec {
    /// Period of the layer pattern when `<arch>.attention.sliding_window_pattern` is
    /// absent: in every `period` layers the last is global, the others local.
    pub default_period: u32,
    /// RoPE base of local layers when `<arch>.rope.freq_base_swa` is absent.
    pub default_local_freq_base: f32,
}

/// What distinguishes one architecture's decoder layer from another's.
#[derive(Debug, Clone, Copy)]
pub struct ArchSpec {
    /// The GGUF `general.architecture` value and key prefix.
    pub name: &'static str,
    /// NeoX rotates (i, i + n_rot/2); otherwise adjacent pairs (2i, 2i+1).
    pub rope_neox: bool,
    /// Whether Q, K and V projections carry bias vectors.
    pub qkv_bias: bool,
    /// RMSNorm of each query and key head (`attn_q_norm`, `attn_k_norm`, head_dim long)
    /// before RoPE.
    pub qk_norm: bool,
    /// RMSNorm of the attention and feed-forward outputs before each residual add
    /// (`attn_post_norm`, `ffn_post_norm`).
    pub post_norms: bool,
    pub ffn: FfnActivation,
    /// Multiply the token embeddings by `sqrt(n_embd)`.
    pub scale_embeddings: bool,
    pub attention_scale: AttentionScale,
    /// `None`: every layer attends to the whole context (the sliding-window keys are
    /// ignored).
    pub sliding_window: Option<SlidingWindowSpec>,
    /// `Some`: the feed-forward block is a mixture of experts (`ffn_gate_inp`,
    /// `ffn_{gate,up,down}_exps`) instead of one dense MLP (`ffn_{gate,up,down}`).
    pub experts: Option<ExpertRouting>,
}

impl ArchSpec {
    /// The shared llama-style layer; architecture files override what differs.
    pub const LLAMA_LIKE: ArchSpec = ArchSpec {
        name: "",
        rope_neox: false,
        qkv_bias: false,
        qk_norm: false,
        post_norms: false,
        ffn: FfnActivation::Silu,
        scale_embeddings: false,
        attention_scale: AttentionScale::InvSqrtHeadDim,
        sliding_window: None,
        experts: None,
    };
}

impl Architecture {
    pub const ALL: [Architecture; 5] = [
        Architecture::Llama,
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Qwen3Moe,
        Architecture::Gemma3,
    ];

    pub fn from_name(name: &str) -> Option<Architecture> {
        Architecture::ALL
            .into_iter()
            .find(|a| a.spec().name == name)
    }

    pub fn spec(self) -> ArchSpec {
        match self {
            Architecture::Llama => llama::SPEC,
            Architecture::Qwen2 => qwen2::SPEC,
            Architecture::Qwen3 => qwen3::SPEC,
            Architecture::Qwen3Moe => qwen3moe::SPEC,
            Architecture::Gemma3 => gemma3::SPEC,
        }
    }

    pub fn supported_names() -> String {
        Architecture::ALL.map(|a| a.spec().name).join(", ")
    }
}

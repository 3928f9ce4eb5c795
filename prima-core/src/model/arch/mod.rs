//! The architectures Prima runs, as data: each file states how its family differs from
//! the shared decoder-only transformer in [`super::forward`].

mod gemma3;
mod gptoss;
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
    GptOss,
}

/// The gated activation of the feed-forward block: `act(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnActivation {
    /// SwiGLU: `silu(gate) * up`.
    Silu,
    /// GeGLU: `gelu_tanh(gate) * up`.
    GeluTanh,
    /// gpt-oss's clamped SwiGLU (ggml's `swiglu_oai`): with `x = min(gate, LIMIT)` and
    /// `y = clamp(up, −LIMIT, LIMIT)`, `x · sigmoid(ALPHA · x) · (y + 1)`.
    SwigluOai,
}

impl FfnActivation {
    /// [`FfnActivation::SwigluOai`]'s sigmoid slope (llama.cpp's constant).
    pub const OAI_ALPHA: f32 = 1.702;
    /// [`FfnActivation::SwigluOai`]'s clamp.
    pub const OAI_LIMIT: f32 = 7.0;
}

/// How a mixture-of-experts block turns router logits into the chosen experts' weights
/// (llama.cpp's `llama_expert_gating_func_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertGating {
    /// A softmax over every expert; the `expert_used_count` largest probabilities are kept
    /// (`qwen3moe`).
    Softmax,
    /// The `expert_used_count` largest logits are kept, then a softmax over those alone
    /// (`gpt-oss`; llama.cpp's `SOFTMAX_WEIGHT`).
    SoftmaxOfTopK,
}

/// How a mixture-of-experts block routes its rows and what its experts carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertRouting {
    pub gating: ExpertGating,
    /// Divide the kept weights by their sum, so each token's weights add up to 1.
    pub normalize_weights: bool,
    /// The router and every expert matrix carry biases (`ffn_gate_inp.bias`,
    /// `ffn_{gate,up,down}_exps.bias`, one row per expert).
    pub biases: bool,
}

/// Which attention projections carry bias vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionBias {
    None,
    /// `attn_{q,k,v}.bias`.
    Qkv,
    /// `attn_{q,k,v}.bias` and `attn_output.bias`.
    QkvOutput,
}

/// The RoPE of sliding-window (local) layers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LocalRope {
    /// Their own base (`<arch>.rope.freq_base_swa`, else `default_freq_base`) and no
    /// position scaling (Gemma 3).
    Own { default_freq_base: f32 },
    /// The global layers' base unless `<arch>.rope.freq_base_swa` is set, and the same
    /// scaling (gpt-oss: YaRN on every layer).
    AsGlobal,
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
    pub local_rope: LocalRope,
}

/// What distinguishes one architecture's decoder layer from another's.
#[derive(Debug, Clone, Copy)]
pub struct ArchSpec {
    /// The GGUF `general.architecture` value and key prefix.
    pub name: &'static str,
    /// NeoX rotates (i, i + n_rot/2); otherwise adjacent pairs (2i, 2i+1).
    pub rope_neox: bool,
    /// Which attention projections carry bias vectors.
    pub attn_bias: AttentionBias,
    /// Attention sinks (`attn_sinks.weight`, one logit per query head in each softmax's
    /// denominator).
    pub attn_sinks: bool,
    /// RMSNorm of each query and key head (`attn_q_norm`, `attn_k_norm`, head_dim long)
    /// before RoPE.
    pub qk_norm: bool,
    /// RMSNorm of the attention and feed-forward outputs before each residual add
    /// (`attn_post_norm`, `ffn_post_norm`).
    pub post_norms: bool,
    /// The RMSNorm before the feed-forward block (`ffn_norm.weight`; gpt-oss names it
    /// `post_attention_norm.weight`).
    pub ffn_norm: &'static str,
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
        attn_bias: AttentionBias::None,
        attn_sinks: false,
        qk_norm: false,
        post_norms: false,
        ffn_norm: "ffn_norm.weight",
        ffn: FfnActivation::Silu,
        scale_embeddings: false,
        attention_scale: AttentionScale::InvSqrtHeadDim,
        sliding_window: None,
        experts: None,
    };
}

impl Architecture {
    pub const ALL: [Architecture; 6] = [
        Architecture::Llama,
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Qwen3Moe,
        Architecture::Gemma3,
        Architecture::GptOss,
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
            Architecture::GptOss => gptoss::SPEC,
        }
    }

    pub fn supported_names() -> String {
        Architecture::ALL.map(|a| a.spec().name).join(", ")
    }
}

//! Hyper-parameters read from GGUF metadata (`<arch>.*` keys).

use super::arch::{AttentionScale, LocalRope};
use super::{Architecture, ModelError};
use crate::gguf::GgufFile;

/// How RoPE positions are scaled beyond the trained context.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    None,
    Linear { factor: f32 },
    Yarn { factor: f32, original_context: u32 },
}

/// The shape of a mixture-of-experts feed-forward block (every layer's, in the
/// architectures Prima runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertParams {
    /// Experts per layer (`<arch>.expert_count`).
    pub n_expert: usize,
    /// Experts each token goes to (`<arch>.expert_used_count`), 1 to `n_expert`.
    pub n_expert_used: usize,
    /// Hidden width of one expert (`<arch>.expert_feed_forward_length`, or
    /// `feed_forward_length / n_expert_used` without it).
    pub n_ff_exp: usize,
}

impl ExpertParams {
    /// The expert shape of `arch`'s file, `None` for a dense architecture. A count of 0 or
    /// more experts used than there are is an error naming the key.
    pub fn from_gguf(g: &GgufFile, arch: Architecture) -> Result<Option<Self>, ModelError> {
        if arch.spec().experts.is_none() {
            return Ok(None);
        }
        let a = arch.spec().name;
        let key = |k: &str| format!("{a}.{k}");
        let bad = |what: String| ModelError::BadHyperParameter {
            path: g.path().to_path_buf(),
            what,
        };
        let req = |k: &str| -> Result<usize, ModelError> {
            let v = g.require_u64(&key(k))?;
            usize::try_from(v)
                .ok()
                .filter(|v| *v > 0)
                .ok_or_else(|| bad(format!("{} = {v} must be a positive size", key(k))))
        };
        let n_expert = req("expert_count")?;
        let n_expert_used = req("expert_used_count")?;
        if n_expert_used > n_expert {
            return Err(bad(format!(
                "{} = {n_expert_used} is larger than {} = {n_expert}",
                key("expert_used_count"),
                key("expert_count")
            )));
        }
        // Without its own key, an expert is the dense width split between the experts
        // used (llama.cpp's default).
        let n_ff_exp = match g.get_u64(&key("expert_feed_forward_length"))? {
            Some(_) => req("expert_feed_forward_length")?,
            None => req("feed_forward_length")? / n_expert_used,
        };
        if n_ff_exp == 0 {
            return Err(bad(format!(
                "{} is absent and {} is below {} = {n_expert_used}",
                key("expert_feed_forward_length"),
                key("feed_forward_length"),
                key("expert_used_count")
            )));
        }
        Ok(Some(ExpertParams {
            n_expert,
            n_expert_used,
            n_ff_exp,
        }))
    }
}

/// The shape of a decoder-only transformer.
#[derive(Debug, Clone)]
pub struct HyperParams {
    pub arch: Architecture,
    pub n_layers: usize,
    pub n_ctx_train: usize,
    pub n_embd: usize,
    /// Hidden width of the dense feed-forward block (for a mixture of experts, the
    /// file's `feed_forward_length`, else one expert's width: for budgets only; the
    /// expert shapes are [`ExpertParams`]).
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub n_vocab: usize,
    pub rms_eps: f32,
    pub rope_freq_base: f32,
    /// Rotated dimensions per head.
    pub n_rot: usize,
    pub rope_scaling: RopeScaling,
    /// Multiplier of q·k before the softmax.
    pub attention_scale: f32,
    /// Positions a local layer attends to (`<arch>.attention.sliding_window`); 0 when
    /// every layer is global.
    pub sliding_window: usize,
    /// Which layers are local (sliding-window); empty when every layer is global.
    pub local_layers: Vec<bool>,
    /// RoPE base of local layers (`<arch>.rope.freq_base_swa`).
    pub rope_freq_base_local: f32,
    /// Local layers scale positions as global ones do (`rope_scaling`); otherwise they
    /// do not scale.
    pub rope_scaling_local: bool,
    /// `<arch>.rope.scaling.attn_factor` (1 when absent): a multiplier of the rotated
    /// values, on top of YaRN's own.
    pub rope_attn_factor: f32,
}

impl HyperParams {
    pub fn from_gguf(g: &GgufFile, arch: Architecture) -> Result<HyperParams, ModelError> {
        let a = arch.spec().name;
        let key = |k: &str| format!("{a}.{k}");
        let bad = |what: String| ModelError::BadHyperParameter {
            path: g.path().to_path_buf(),
            what,
        };
        let req = |k: &str| -> Result<usize, ModelError> {
            let v = g.require_u64(&key(k))?;
            usize::try_from(v)
                .ok()
                .filter(|v| *v > 0)
                .ok_or_else(|| bad(format!("{} = {v} must be a positive size", key(k))))
        };
        let opt = |k: &str| -> Result<Option<usize>, ModelError> {
            Ok(g.get_u64(&key(k))?.map(|v| v as usize))
        };

        let n_layers = req("block_count")?;
        let n_embd = req("embedding_length")?;
        let spec = arch.spec();
        let n_ff = match ExpertParams::from_gguf(g, arch)? {
            Some(e) => opt("feed_forward_length")?
                .filter(|&n| n > 0)
                .unwrap_or(e.n_ff_exp),
            None => req("feed_forward_length")?,
        };
        let n_head = req("attention.head_count")?;
        let n_head_kv = opt("attention.head_count_kv")?.unwrap_or(n_head);
        let n_ctx_train = opt("context_length")?.unwrap_or(2048);
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(bad(format!(
                "{} = {n_head} is not a multiple of {} = {n_head_kv}",
                key("attention.head_count"),
                key("attention.head_count_kv")
            )));
        }
        let head_dim_k = opt("attention.key_length")?.unwrap_or(n_embd / n_head);
        let head_dim_v = opt("attention.value_length")?.unwrap_or(n_embd / n_head);
        if head_dim_k == 0 || head_dim_v == 0 {
            return Err(bad(format!(
                "the head size is 0 (key {head_dim_k}, value {head_dim_v}): {} and {} must \
                 be positive, or {} = {n_embd} at least {} = {n_head}",
                key("attention.key_length"),
                key("attention.value_length"),
                key("embedding_length"),
                key("attention.head_count"),
            )));
        }
        // The widths of the concatenated heads (`q_dim` …) must be sizes: a file cannot
        // hold tensors that wide anyway.
        let width =
            |heads: usize, dim: usize| heads.checked_mul(dim).filter(|&w| w <= u32::MAX as usize);
        if width(n_head, head_dim_k.max(head_dim_v)).is_none() {
            return Err(bad(format!(
                "{} = {n_head} heads of size {} is too wide",
                key("attention.head_count"),
                head_dim_k.max(head_dim_v)
            )));
        }
        // Each layer has at least its norm and attention tensors: a block count beyond the
        // tensor count is corrupt (and would be allocated for before any tensor is looked up).
        if n_layers > g.tensors().len() {
            return Err(bad(format!(
                "{} = {n_layers}, but the file has only {} tensors",
                key("block_count"),
                g.tensors().len()
            )));
        }
        let n_rot = opt("rope.dimension_count")?.unwrap_or(head_dim_k);
        if n_rot > head_dim_k || n_rot % 2 != 0 {
            return Err(bad(format!(
                "{} = {n_rot} must be even and at most the head size {head_dim_k}",
                key("rope.dimension_count")
            )));
        }
        let rms_eps = g.require_f32(&key("attention.layer_norm_rms_epsilon"))?;
        let rope_freq_base = g.get_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);

        let factor = g.get_f32(&key("rope.scaling.factor"))?.unwrap_or(1.0);
        let rope_scaling = match g.get_str(&key("rope.scaling.type"))?.unwrap_or("none") {
            "none" => RopeScaling::None,
            _ if factor == 1.0 || factor == 0.0 => RopeScaling::None,
            "linear" => RopeScaling::Linear { factor },
            "yarn" => RopeScaling::Yarn {
                factor,
                original_context: g
                    .get_u64(&key("rope.scaling.original_context_length"))?
                    .unwrap_or(n_ctx_train as u64) as u32,
            },
            other => {
                return Err(bad(format!(
                    "{} = '{other}' is not supported (none, linear, yarn)",
                    key("rope.scaling.type")
                )))
            }
        };

        let attention_scale = match spec.attention_scale {
            AttentionScale::InvSqrtHeadDim => 1.0 / (head_dim_k as f32).sqrt(),
            AttentionScale::Gemma3QueryPreAttn if n_layers == 62 => {
                1.0 / ((n_embd / n_head) as f32).sqrt()
            }
            AttentionScale::Gemma3QueryPreAttn => 1.0 / (head_dim_k as f32).sqrt(),
        };
        if let Some(cap) = g.get_f32(&key("final_logit_softcapping"))? {
            if cap != 0.0 {
                return Err(bad(format!(
                    "{} = {cap}: final logit soft-capping is not supported",
                    key("final_logit_softcapping")
                )));
            }
        }

        let mut sliding_window = 0;
        let mut local_layers = Vec::new();
        let mut rope_freq_base_local = rope_freq_base;
        let mut rope_scaling_local = true;
        if let Some(swa) = spec.sliding_window {
            let window = opt("attention.sliding_window")?.unwrap_or(0);
            if window > 0 {
                sliding_window = window;
                local_layers = local_layer_pattern(
                    g,
                    &key("attention.sliding_window_pattern"),
                    n_layers,
                    swa.default_period,
                )
                .map_err(bad)?;
                let (default_base, scaled) = match swa.local_rope {
                    LocalRope::Own { default_freq_base } => (default_freq_base, false),
                    LocalRope::AsGlobal => (rope_freq_base, true),
                };
                rope_freq_base_local = g
                    .get_f32(&key("rope.freq_base_swa"))?
                    .unwrap_or(default_base);
                rope_scaling_local = scaled;
            }
        }

        let n_vocab = match g.tensor("token_embd.weight") {
            Some(t) => t.rows() as usize,
            None => g.require_tensor("token_embd.weight").map(|_| 0)?,
        };

        Ok(HyperParams {
            arch,
            n_layers,
            n_ctx_train,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            n_vocab,
            rms_eps,
            rope_freq_base,
            n_rot,
            rope_scaling,
            attention_scale,
            sliding_window,
            local_layers,
            rope_freq_base_local,
            rope_scaling_local,
            rope_attn_factor: g.get_f32(&key("rope.scaling.attn_factor"))?.unwrap_or(1.0),
        })
    }

    /// Whether layer `il` attends through a sliding window.
    pub fn is_local(&self, il: usize) -> bool {
        self.local_layers.get(il).copied().unwrap_or(false)
    }

    /// Width of the concatenated query heads.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim_k
    }

    /// Width of the concatenated key heads.
    pub fn k_dim(&self) -> usize {
        self.n_head_kv * self.head_dim_k
    }

    /// Width of the concatenated value heads.
    pub fn v_dim(&self) -> usize {
        self.n_head_kv * self.head_dim_v
    }
}

/// Which layers are local: the per-layer bool array `key` holds, or its period (in each
/// `period` layers the last is global), or `default_period` when the key is absent —
/// llama.cpp's `set_swa_pattern` without `dense_first`.
fn local_layer_pattern(
    g: &GgufFile,
    key: &str,
    n_layers: usize,
    default_period: u32,
) -> Result<Vec<bool>, String> {
    let period = match g.get(key) {
        None => default_period as usize,
        Some(v) => {
            if let Some(items) = v.as_array() {
                let flags: Option<Vec<bool>> = items.iter().map(|x| x.as_bool()).collect();
                return match flags {
                    Some(flags) if flags.len() == n_layers => Ok(flags),
                    _ => Err(format!(
                        "{key} must be {n_layers} booleans (one per layer) or a period"
                    )),
                };
            }
            v.as_u64()
                .ok_or_else(|| format!("{key} must be a period or one boolean per layer"))?
                as usize
        }
    };
    Ok((0..n_layers)
        .map(|il| period == 0 || il % period < period - 1)
        .collect())
}

//! Hyper-parameters read from GGUF metadata (`<arch>.*` keys).

use super::{Architecture, ModelError};
use crate::gguf::GgufFile;

/// How RoPE positions are scaled beyond the trained context.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    None,
    Linear { factor: f32 },
    Yarn { factor: f32, original_context: u32 },
}

/// The shape of a decoder-only transformer.
#[derive(Debug, Clone)]
pub struct HyperParams {
    pub arch: Architecture,
    pub n_layers: usize,
    pub n_ctx_train: usize,
    pub n_embd: usize,
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
        let n_ff = req("feed_forward_length")?;
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
        })
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

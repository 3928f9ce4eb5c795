//! A loaded model: the GGUF mapping, its hyper-parameters, and the tensor index of every
//! weight the forward pass uses, each checked against the shape the architecture implies.

use std::path::Path;

use abi_stable::std_types::RSlice;

use super::arch::AttentionBias;
use super::ffn::{DenseFfn, ExpertBiases, FeedForward, MoeFfn};
use super::{Architecture, ExpertParams, HyperParams, ModelError};
use crate::gguf::{GgmlType, GgufError, GgufFile, TensorInfo};
use prima_abi::backend::{BackendBox, TensorView};

/// The weights of one decoder layer (tensor infos; the bytes stay in the mapping).
#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub attn_norm: TensorInfo,
    pub wq: TensorInfo,
    pub wk: TensorInfo,
    pub wv: TensorInfo,
    pub wo: TensorInfo,
    pub bq: Option<TensorInfo>,
    pub bk: Option<TensorInfo>,
    pub bv: Option<TensorInfo>,
    /// Bias of the attention output projection (gpt-oss).
    pub bo: Option<TensorInfo>,
    /// Attention sinks, one logit per query head (gpt-oss).
    pub attn_sinks: Option<AttentionSinks>,
    /// Per-head RMSNorm weights of queries and keys (head_dim_k long), when the
    /// architecture has them.
    pub attn_q_norm: Option<TensorInfo>,
    pub attn_k_norm: Option<TensorInfo>,
    /// RMSNorm of the attention output before the residual add (Gemma's post-norm).
    pub attn_post_norm: Option<TensorInfo>,
    pub ffn_norm: TensorInfo,
    /// The feed-forward block: one dense MLP, or a mixture of experts.
    pub ffn: FeedForward,
    /// RMSNorm of the feed-forward output before the residual add.
    pub ffn_post_norm: Option<TensorInfo>,
}

/// A layer's attention sinks: the `attn_sinks.weight` tensor (F32, `n_head` long) and its
/// values, copied at load (a few dozen floats) so they reach the backend as an f32 slice.
#[derive(Debug, Clone)]
pub struct AttentionSinks {
    pub tensor: TensorInfo,
    pub values: Vec<f32>,
}

/// A model ready to run: the mapped file plus a validated index of its weights.
pub struct Model {
    gguf: GgufFile,
    hparams: HyperParams,
    pub(crate) token_embd: TensorInfo,
    pub(crate) output_norm: TensorInfo,
    /// `output.weight`, or the token embedding when the head is tied.
    pub(crate) output: TensorInfo,
    /// Llama 3.1+ RoPE frequency factors (n_rot/2 floats, copied: a few hundred bytes).
    pub(crate) rope_freqs: Option<Vec<f32>>,
    pub(crate) layers: Vec<LayerWeights>,
    /// The expert shape of a mixture-of-experts model.
    experts: Option<ExpertParams>,
}

impl Model {
    /// Maps `path` and validates the architecture, hyper-parameters and every weight shape.
    pub fn load(path: impl AsRef<Path>) -> Result<Model, ModelError> {
        let gguf = GgufFile::open(path.as_ref())?;
        Model::from_gguf(gguf)
    }

    pub fn from_gguf(gguf: GgufFile) -> Result<Model, ModelError> {
        let arch_name = gguf.architecture()?;
        let arch = Architecture::from_name(arch_name).ok_or_else(|| {
            ModelError::UnsupportedArchitecture {
                path: gguf.path().to_path_buf(),
                arch: arch_name.to_string(),
                supported: Architecture::supported_names(),
            }
        })?;
        let hp = HyperParams::from_gguf(&gguf, arch)?;
        let experts = ExpertParams::from_gguf(&gguf, arch)?;
        let spec = arch.spec();
        let (d, ff) = (hp.n_embd as u64, hp.n_ff as u64);
        let (qd, kd, vd) = (hp.q_dim() as u64, hp.k_dim() as u64, hp.v_dim() as u64);
        let vocab = hp.n_vocab as u64;

        let token_embd = shaped(&gguf, "token_embd.weight", &[d, vocab])?;
        let output_norm = shaped(&gguf, "output_norm.weight", &[d])?;
        let output = match gguf.tensor("output.weight") {
            Some(_) => shaped(&gguf, "output.weight", &[d, vocab])?,
            None => token_embd.clone(),
        };
        let rope_freqs = match gguf.tensor("rope_freqs.weight") {
            Some(_) => {
                let t = shaped(&gguf, "rope_freqs.weight", &[hp.n_rot as u64 / 2])?;
                Some(f32_values(&gguf, &t)?)
            }
            None => None,
        };

        let mut layers = Vec::with_capacity(hp.n_layers);
        for i in 0..hp.n_layers {
            let name = |s: &str| format!("blk.{i}.{s}");
            let t = |s: &str, dims: &[u64]| shaped(&gguf, &name(s), dims);
            // A tensor the architecture has (`wanted`), or `None` when it has none.
            let opt = |wanted: bool, s: &str, len: u64| -> Result<Option<TensorInfo>, ModelError> {
                if wanted {
                    Ok(Some(t(s, &[len])?))
                } else {
                    Ok(None)
                }
            };
            let hk = hp.head_dim_k as u64;
            let qkv_bias = spec.attn_bias != AttentionBias::None;
            let attn_sinks = if spec.attn_sinks {
                let tensor = t("attn_sinks.weight", &[hp.n_head as u64])?;
                let values = f32_values(&gguf, &tensor)?;
                Some(AttentionSinks { tensor, values })
            } else {
                None
            };
            layers.push(LayerWeights {
                attn_norm: t("attn_norm.weight", &[d])?,
                wq: t("attn_q.weight", &[d, qd])?,
                wk: t("attn_k.weight", &[d, kd])?,
                wv: t("attn_v.weight", &[d, vd])?,
                wo: t(
                    "attn_output.weight",
                    &[qd / hp.head_dim_k as u64 * hp.head_dim_v as u64, d],
                )?,
                bq: opt(qkv_bias, "attn_q.bias", qd)?,
                bk: opt(qkv_bias, "attn_k.bias", kd)?,
                bv: opt(qkv_bias, "attn_v.bias", vd)?,
                bo: opt(
                    spec.attn_bias == AttentionBias::QkvOutput,
                    "attn_output.bias",
                    d,
                )?,
                attn_sinks,
                attn_q_norm: opt(spec.qk_norm, "attn_q_norm.weight", hk)?,
                attn_k_norm: opt(spec.qk_norm, "attn_k_norm.weight", hk)?,
                attn_post_norm: opt(spec.post_norms, "post_attention_norm.weight", d)?,
                ffn_norm: t(spec.ffn_norm, &[d])?,
                ffn: match (experts, spec.experts) {
                    (Some(shape), Some(routing)) => FeedForward::Moe(MoeFfn {
                        router: t("ffn_gate_inp.weight", &[d, shape.n_expert as u64])?,
                        gate_exps: expert_tensor(
                            &gguf,
                            &name("ffn_gate_exps.weight"),
                            [d, shape.n_ff_exp as u64],
                            arch,
                            shape,
                        )?,
                        up_exps: expert_tensor(
                            &gguf,
                            &name("ffn_up_exps.weight"),
                            [d, shape.n_ff_exp as u64],
                            arch,
                            shape,
                        )?,
                        down_exps: expert_tensor(
                            &gguf,
                            &name("ffn_down_exps.weight"),
                            [shape.n_ff_exp as u64, d],
                            arch,
                            shape,
                        )?,
                        shape,
                        gating: routing.gating,
                        normalize_weights: routing.normalize_weights,
                        biases: if routing.biases {
                            let (ne, ff) = (shape.n_expert as u64, shape.n_ff_exp as u64);
                            Some(Box::new(ExpertBiases {
                                router: f32_tensor(&gguf, &name("ffn_gate_inp.bias"), &[ne])?,
                                gate: f32_tensor(&gguf, &name("ffn_gate_exps.bias"), &[ff, ne])?,
                                up: f32_tensor(&gguf, &name("ffn_up_exps.bias"), &[ff, ne])?,
                                down: f32_tensor(&gguf, &name("ffn_down_exps.bias"), &[d, ne])?,
                            }))
                        } else {
                            None
                        },
                    }),
                    _ => FeedForward::Dense(DenseFfn {
                        gate: t("ffn_gate.weight", &[d, ff])?,
                        up: t("ffn_up.weight", &[d, ff])?,
                        down: t("ffn_down.weight", &[ff, d])?,
                    }),
                },
                ffn_post_norm: opt(spec.post_norms, "post_ffw_norm.weight", d)?,
            });
        }

        Ok(Model {
            gguf,
            hparams: hp,
            token_embd,
            output_norm,
            output,
            rope_freqs,
            layers,
            experts,
        })
    }

    pub fn hparams(&self) -> &HyperParams {
        &self.hparams
    }

    /// The expert shape, `None` for a dense model.
    pub fn experts(&self) -> Option<ExpertParams> {
        self.experts
    }

    pub fn gguf(&self) -> &GgufFile {
        &self.gguf
    }

    /// Every weight tensor the forward pass reads.
    pub fn weight_tensors(&self) -> impl Iterator<Item = &TensorInfo> {
        self.global_tensors()
            .chain((0..self.layers.len()).flat_map(|il| self.layer_tensors(il)))
    }

    /// [`Model::weight_tensors`] with a tied output head (the embedding's bytes) once:
    /// what the file holds, for sizes people read.
    pub fn distinct_weight_tensors(&self) -> impl Iterator<Item = &TensorInfo> {
        let tied = self.output.offset == self.token_embd.offset;
        self.weight_tensors()
            .enumerate()
            .filter(move |(i, _)| !(tied && *i == 2))
            .map(|(_, t)| t)
    }

    /// The tensors outside the layers: token embedding, final norm, output head.
    pub fn global_tensors(&self) -> impl Iterator<Item = &TensorInfo> {
        [&self.token_embd, &self.output_norm, &self.output].into_iter()
    }

    /// Bytes of the tensors outside the layers, a tied output head counted once (it is
    /// the embedding's bytes).
    pub fn global_bytes(&self) -> u64 {
        let mut seen = Vec::with_capacity(3);
        self.global_tensors()
            .filter(|t| {
                let new = !seen.contains(&t.offset);
                seen.push(t.offset);
                new
            })
            .map(|t| t.n_bytes)
            .sum()
    }

    /// The tensors outside the layers that every token reads whole: the final norm and the
    /// output head (the embedding when tied). The embedding itself is not among them: a
    /// token reads one row of it.
    pub fn read_whole_tensors(&self) -> impl Iterator<Item = &TensorInfo> {
        [&self.output_norm, &self.output].into_iter()
    }

    /// Bytes of [`Model::read_whole_tensors`]: what the device holding the output head
    /// keeps in memory besides its layers.
    pub fn read_whole_bytes(&self) -> u64 {
        self.read_whole_tensors().map(|t| t.n_bytes).sum()
    }

    /// The weight tensors of layer `il` (none when out of range).
    pub fn layer_tensors(&self, il: usize) -> impl Iterator<Item = &TensorInfo> {
        self.layers.get(il).into_iter().flat_map(|l| {
            [&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm]
                .into_iter()
                .chain(l.ffn.tensors())
                .chain(l.bq.iter())
                .chain(l.bk.iter())
                .chain(l.bv.iter())
                .chain(l.bo.iter())
                .chain(l.attn_sinks.iter().map(|s| &s.tensor))
                .chain(l.attn_q_norm.iter())
                .chain(l.attn_k_norm.iter())
                .chain(l.attn_post_norm.iter())
                .chain(l.ffn_post_norm.iter())
        })
    }

    /// Bytes of weights layer `il` reads per token.
    pub fn layer_bytes(&self, il: usize) -> u64 {
        self.layer_tensors(il).map(|t| t.n_bytes).sum()
    }

    /// Fails with the first weight whose type the backend cannot compute.
    pub fn check_backend(&self, backend: &BackendBox) -> Result<(), ModelError> {
        for t in self.weight_tensors() {
            if !backend.supports(t.ggml_type.id()) {
                return Err(ModelError::UnsupportedTensorType {
                    path: self.gguf.path().to_path_buf(),
                    tensor: t.name.clone(),
                    ty: t.ggml_type.name().to_string(),
                    backend: backend.name().into_string(),
                });
            }
        }
        Ok(())
    }

    /// The weight as the backend sees it: a slice of the mapping, no copy.
    pub fn view(&self, t: &TensorInfo) -> TensorView<'_> {
        TensorView {
            data: RSlice::from_slice(self.gguf.tensor_data(t)),
            ggml_type: t.ggml_type.id(),
            cols: t.cols(),
            rows: t.rows(),
        }
    }
}

impl Model {
    /// Expert `e`'s matrix of the 3-D expert tensor `t` (`[cols, rows, n_expert]`): its
    /// `e`-th slab of `rows` consecutive rows, a slice of the mapping as [`Model::view`].
    /// `t`'s shape was checked at load; an `e` out of range is a caller's bug.
    pub(crate) fn expert_view(&self, t: &TensorInfo, e: usize) -> TensorView<'_> {
        let data = self.gguf.tensor_data(t);
        let n_expert = t.dims.get(2).copied().unwrap_or(1).max(1) as usize;
        let slab = data.len() / n_expert;
        TensorView {
            data: RSlice::from_slice(&data[e * slab..(e + 1) * slab]),
            ggml_type: t.ggml_type.id(),
            cols: t.cols(),
            rows: t.dims.get(1).copied().unwrap_or(1),
        }
    }
}

impl Model {
    /// Row `e` of the 2-D F32 tensor `t` (an expert's bias): a one-row view of the
    /// mapping. `t`'s shape and type were checked at load; an `e` out of range is a
    /// caller's bug.
    pub(crate) fn row_view(&self, t: &TensorInfo, e: usize) -> TensorView<'_> {
        let data = self.gguf.tensor_data(t);
        let row = data.len() / t.rows().max(1) as usize;
        TensorView {
            data: RSlice::from_slice(&data[e * row..(e + 1) * row]),
            ggml_type: t.ggml_type.id(),
            cols: t.cols(),
            rows: 1,
        }
    }
}

/// Looks up a tensor that must be F32 (a bias) and checks its dimensions; another type is
/// an error naming the tensor.
fn f32_tensor(g: &GgufFile, name: &str, dims: &[u64]) -> Result<TensorInfo, ModelError> {
    let t = shaped(g, name, dims)?;
    if t.ggml_type != GgmlType::F32 {
        return Err(ModelError::UnsupportedTensorType {
            path: g.path().to_path_buf(),
            tensor: t.name.clone(),
            ty: t.ggml_type.name().to_string(),
            backend: "model loader (expects F32)".to_string(),
        });
    }
    Ok(t)
}

/// Looks up a 3-D expert tensor `name` and checks it is `[matrix[0], matrix[1],
/// n_expert]`: a third dimension other than `<arch>.expert_count` is an error naming
/// both the tensor and the key, any other shape a [`GgufError::BadShape`].
fn expert_tensor(
    g: &GgufFile,
    name: &str,
    matrix: [u64; 2],
    arch: Architecture,
    shape: ExpertParams,
) -> Result<TensorInfo, ModelError> {
    let t = g.require_tensor(name)?;
    if t.dims.len() == 3 && t.dims[..2] == matrix && t.dims[2] != shape.n_expert as u64 {
        return Err(ModelError::ExpertCount {
            path: g.path().to_path_buf(),
            tensor: name.to_string(),
            found: t.dims[2],
            key: format!("{}.expert_count", arch.spec().name),
            expected: shape.n_expert,
        });
    }
    Ok(shaped(
        g,
        name,
        &[matrix[0], matrix[1], shape.n_expert as u64],
    )?)
}

/// Looks up a tensor and checks its dimensions (GGUF order: row length first).
fn shaped(g: &GgufFile, name: &str, dims: &[u64]) -> Result<TensorInfo, GgufError> {
    let t = g.require_tensor(name)?;
    if t.dims != dims {
        return Err(GgufError::BadShape {
            path: g.path().to_path_buf(),
            tensor: name.to_string(),
            found: t.dims.clone(),
            expected: dims.to_vec(),
        });
    }
    Ok(t.clone())
}

/// Reads a small F32 tensor's values.
fn f32_values(g: &GgufFile, t: &TensorInfo) -> Result<Vec<f32>, ModelError> {
    if t.ggml_type != GgmlType::F32 {
        return Err(ModelError::UnsupportedTensorType {
            path: g.path().to_path_buf(),
            tensor: t.name.clone(),
            ty: t.ggml_type.name().to_string(),
            backend: "model loader (expects F32)".to_string(),
        });
    }
    Ok(g.tensor_data(t)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

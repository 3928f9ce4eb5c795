//! Random-weight `gpt-oss` GGUFs in F32 or F16: the sources of the gpt-oss test models
//! (F32) and of the gpt-oss benchmark model (F16), which llama-quantize then turns into
//! MXFP4_MOE (experts MXFP4, the other matrices Q8_0, as the released files) and Q8_0. Real gpt-oss weights are far too large to carry, so these
//! stand in, with every part of the architecture switched on:
//!
//! - **biases everywhere gpt-oss has them** (Q, K, V, attention output, router, each
//!   expert's gate, up and down rows), non-zero, and **attention sinks** of `SINK_MEAN`
//!   ± 1, large enough to take a real share of each head's softmax;
//! - **YaRN** (factor 32 over 4096 trained positions, as gpt-oss) and **alternating
//!   sliding-window layers** with a window shorter than the test context, so both matter;
//! - **skewed, decisive routing**: router row `e` of layer `il` has the standard deviation
//!   `ROUTER_SIGMA · ROUTER_DECAY^r`, `r` the expert's rank in that layer's (rotated)
//!   order, so a few experts take most tokens and the k-th and (k+1)-th logits usually
//!   differ clearly;
//! - **the clamp of the SwiGLU in use**: expert gate and up weights scaled by
//!   `EXPERT_GAIN`, so a few percent of their outputs pass the limit (7);
//! - **decisive output logits**: the output head scaled so the top-2 gap is usually well
//!   above float noise.
//!
//! Weights are N(0, 1/row length), norms 1 + N(0, 0.1²), each tensor from its own
//! SplitMix64 stream seeded by sha256(seed, tensor name). The tokenizer is the bench
//! models' stub (byte-level BPE; gpt-oss's o200k vocabulary is another task's). A
//! `<file>.recipe` beside each file names this generator's hash and the shape, so a change
//! here remakes them — and only them: the qwen3moe generator (`random_moe.rs`) is a file
//! of its own so that its models keep their recipes.

use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use anyhow::{Context, Result};
use prima_core::gguf::{GgmlType, GgufFile, GgufWriter, Value};

use crate::random_gguf::{add_stub_tokenizer, SplitMix64};

/// The generator's own source: part of each model's recipe.
pub const SOURCE: &str = include_str!("random_gptoss.rs");

const ROUTER_SIGMA: f32 = 3.0;
const ROUTER_DECAY: f32 = 0.85;
/// Output head scale: logits of standard deviation ≈ 3.
const OUTPUT_SCALE: f32 = 3.0;
/// Expert gate/up weight scale: their outputs have standard deviation ≈ 3.
const EXPERT_GAIN: f32 = 3.0;
/// Standard deviation of every bias.
const BIAS_SIGMA: f32 = 0.3;
/// Mean of the attention sinks.
const SINK_MEAN: f32 = 1.0;

/// The shape of a small gpt-oss decoder.
#[derive(Debug, Clone, Copy)]
pub struct GptOssShape {
    pub name: &'static str,
    pub n_layer: u64,
    pub n_embd: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub head_dim: u64,
    pub n_expert: u64,
    pub n_expert_used: u64,
    pub n_ff_exp: u64,
    pub n_vocab: u64,
    /// Positions a local layer attends to.
    pub sliding_window: u64,
    pub seed: u64,
    /// The type of the matrices: F32 (test sources) or F16 (a bench source). Norms,
    /// sinks, biases and the router stay F32.
    pub ftype: GgmlType,
}

impl GptOssShape {
    /// What the recipe records besides the generator's hash.
    pub fn describe(&self) -> String {
        format!("{self:?}")
    }

    fn header(&self) -> GgufWriter {
        let mut w = GgufWriter::new();
        let u = |n: u64| Value::U32(u32::try_from(n).expect("shape fits u32"));
        let a = |k: &str| format!("gpt-oss.{k}");
        w.add("general.architecture", Value::String("gpt-oss".into()))
            .add("general.name", Value::String(self.name.into()))
            // ALL_F32 or MOSTLY_F16.
            .add(
                "general.file_type",
                Value::U32(u32::from(self.ftype == GgmlType::F16)),
            )
            .add(&a("context_length"), u(131_072))
            .add(&a("embedding_length"), u(self.n_embd))
            .add(&a("block_count"), u(self.n_layer))
            .add(&a("feed_forward_length"), u(self.n_ff_exp))
            .add(&a("expert_feed_forward_length"), u(self.n_ff_exp))
            .add(&a("expert_count"), u(self.n_expert))
            .add(&a("expert_used_count"), u(self.n_expert_used))
            .add(&a("attention.head_count"), u(self.n_head))
            .add(&a("attention.head_count_kv"), u(self.n_head_kv))
            .add(&a("attention.key_length"), u(self.head_dim))
            .add(&a("attention.value_length"), u(self.head_dim))
            .add(&a("attention.sliding_window"), u(self.sliding_window))
            .add(&a("attention.layer_norm_rms_epsilon"), Value::F32(1e-5))
            .add(&a("rope.freq_base"), Value::F32(150_000.0))
            .add(&a("rope.scaling.type"), Value::String("yarn".into()))
            .add(&a("rope.scaling.factor"), Value::F32(32.0))
            .add(&a("rope.scaling.original_context_length"), u(4096));
        add_stub_tokenizer(&mut w, self.n_vocab);
        w
    }

    /// Every tensor as (name, dims with the row length first), in file order.
    fn tensors(&self) -> Vec<(String, Vec<u64>)> {
        let (d, v, ff, ne) = (self.n_embd, self.n_vocab, self.n_ff_exp, self.n_expert);
        let (q, kv) = (self.n_head * self.head_dim, self.n_head_kv * self.head_dim);
        let mut out = vec![("token_embd.weight".to_owned(), vec![d, v])];
        for il in 0..self.n_layer {
            let t = |s: &str, dims: Vec<u64>| (format!("blk.{il}.{s}"), dims);
            out.extend([
                t("attn_norm.weight", vec![d]),
                t("attn_q.weight", vec![d, q]),
                t("attn_q.bias", vec![q]),
                t("attn_k.weight", vec![d, kv]),
                t("attn_k.bias", vec![kv]),
                t("attn_v.weight", vec![d, kv]),
                t("attn_v.bias", vec![kv]),
                t("attn_output.weight", vec![q, d]),
                t("attn_output.bias", vec![d]),
                t("attn_sinks.weight", vec![self.n_head]),
                t("post_attention_norm.weight", vec![d]),
                t("ffn_gate_inp.weight", vec![d, ne]),
                t("ffn_gate_inp.bias", vec![ne]),
                t("ffn_gate_exps.weight", vec![d, ff, ne]),
                t("ffn_gate_exps.bias", vec![ff, ne]),
                t("ffn_up_exps.weight", vec![d, ff, ne]),
                t("ffn_up_exps.bias", vec![ff, ne]),
                t("ffn_down_exps.weight", vec![ff, d, ne]),
                t("ffn_down_exps.bias", vec![d, ne]),
            ]);
        }
        out.push(("output_norm.weight".to_owned(), vec![d]));
        out.push(("output.weight".to_owned(), vec![d, v]));
        out
    }

    /// Norms, sinks, biases and the router stay F32 (llama-quantize leaves them so).
    fn tensor_type(&self, name: &str, dims: &[u64]) -> GgmlType {
        if dims.len() == 1 || name.ends_with(".bias") || name.ends_with("ffn_gate_inp.weight") {
            GgmlType::F32
        } else {
            self.ftype
        }
    }

    /// Tensor `name`'s values, row after row.
    fn values(&self, name: &str, dims: &[u64]) -> Vec<f32> {
        let mut rng = Normal::new(self.seed, name);
        let cols = dims[0] as usize;
        let len: usize = dims.iter().map(|&n| n as usize).product();
        let sigma = (cols as f32).sqrt().recip();
        if name.ends_with(".bias") {
            return (0..len).map(|_| BIAS_SIGMA * rng.sample()).collect();
        }
        if name.ends_with("attn_sinks.weight") {
            return (0..len).map(|_| SINK_MEAN + rng.sample()).collect();
        }
        if dims.len() == 1 {
            return (0..len).map(|_| 1.0 + 0.1 * rng.sample()).collect();
        }
        if name.ends_with("ffn_gate_inp.weight") {
            let layer: u64 = name
                .split('.')
                .nth(1)
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let ne = self.n_expert;
            let mut out = Vec::with_capacity(len);
            for e in 0..ne {
                // Layer il's hottest expert is 3·il mod n_expert, and so on round.
                let rank = (e + ne - (3 * layer) % ne) % ne;
                let row_sigma = ROUTER_SIGMA * ROUTER_DECAY.powi(rank as i32) * sigma;
                out.extend((0..cols).map(|_| row_sigma * rng.sample()));
            }
            return out;
        }
        let scale = if name == "output.weight" {
            OUTPUT_SCALE
        } else if name == "token_embd.weight" {
            // Embeddings of RMS ≈ 1, like a normed residual stream.
            (cols as f32).sqrt()
        } else if name.ends_with("ffn_gate_exps.weight") || name.ends_with("ffn_up_exps.weight") {
            EXPERT_GAIN
        } else {
            1.0
        };
        (0..len).map(|_| scale * sigma * rng.sample()).collect()
    }
}

/// Writes the model to `path` (matrices in `shape.ftype`, the rest F32) and returns the
/// file's size. Tensor by tensor at the offsets of the index, so memory holds one tensor
/// whatever the model's size.
pub fn write(shape: &GptOssShape, path: &Path) -> Result<u64> {
    let mut w = shape.header();
    for (name, dims) in shape.tensors() {
        w.add_tensor_unallocated(&name, &dims, shape.tensor_type(&name, &dims))
            .with_context(|| format!("indexing tensor {name}"))?;
    }
    w.write(path)
        .with_context(|| format!("writing the header of {}", path.display()))?;
    let index = GgufFile::open(path)
        .with_context(|| format!("reading back the index of {}", path.display()))?
        .tensors()
        .to_vec();
    let mut file = OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    for t in &index {
        let values = shape.values(&t.name, &t.dims);
        let bytes: Vec<u8> = match t.ggml_type {
            GgmlType::F16 => values
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect(),
            _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        file.seek(SeekFrom::Start(t.offset))?;
        file.write_all(&bytes)
            .with_context(|| format!("writing tensor {} to {}", t.name, path.display()))?;
    }
    file.flush()?;
    Ok(file.metadata()?.len())
}

/// Standard normal draws (Box–Muller) from a per-tensor SplitMix64 stream (the sampler of
/// `random_moe`, kept here so that neither generator's recipe depends on the other).
struct Normal {
    rng: SplitMix64,
    spare: Option<f32>,
}

impl Normal {
    fn new(seed: u64, name: &str) -> Normal {
        Normal {
            rng: SplitMix64::for_tensor(seed, name),
            spare: None,
        }
    }

    fn sample(&mut self) -> f32 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        let bits = self.rng.next();
        // Two uniforms of 32 bits; u1 in (0, 1] so the log is finite.
        let u1 = ((bits >> 32) as f64 + 1.0) / 4_294_967_296.0;
        let u2 = (bits & 0xFFFF_FFFF) as f64 / 4_294_967_296.0;
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (2.0 * std::f64::consts::PI * u2).sin_cos();
        self.spare = Some((r * s) as f32);
        (r * c) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: GptOssShape = GptOssShape {
        name: "t",
        n_layer: 2,
        n_embd: 64,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 32,
        n_expert: 4,
        n_expert_used: 2,
        n_ff_exp: 64,
        n_vocab: 300,
        sliding_window: 8,
        seed: 7,
        ftype: GgmlType::F16,
    };

    #[test]
    fn writes_a_gpt_oss_file_prima_loads() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("prima-random-gptoss-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("t.gguf");
        write(&SMALL, &path)?;
        let model = prima_core::model::Model::load(&path)?;
        let experts = model.experts().context("no experts")?;
        assert_eq!((experts.n_expert, experts.n_expert_used), (4, 2));
        let hp = model.hparams();
        // Layer 0 local, layer 1 global (llama.cpp's pattern of period 2).
        assert_eq!((hp.is_local(0), hp.is_local(1)), (true, false));
        assert_eq!(hp.sliding_window, 8);
        assert!(model
            .layer_tensors(0)
            .any(|t| t.name == "blk.0.attn_sinks.weight"));
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}

//! Writes a Qwen3-MoE-shaped GGUF whose weights are random but valid Q4_K / Q6_K blocks in
//! llama-quantize's Q4_K_M mix, like [`super::random_llama`] does for Llama: the home lab's
//! mixture of experts is several GB, and an F16 intermediate three times that size plus a
//! quantizer pass would not fit this machine's disk and time.
//!
//! - Experts (`ffn_{gate,up,down}_exps`, 3-D) and attention are Q4_K, except Q6_K for
//!   attn_v and ffn_down_exps in the layers where llama.cpp's `use_more_bits` holds, and
//!   for the output head; norms and the router (`ffn_gate_inp`, which llama-quantize
//!   keeps as it is) are F32.
//! - **Skewed routing**, as in trained models and as [`crate::random_moe`] makes it: router
//!   row e of layer il has the standard deviation `ROUTER_SIGMA · ROUTER_DECAY^rank / √n_embd`
//!   (rank: e's place in the layer's rotated order), so a few experts take most tokens.
//! - Every tensor's bytes come from its own SplitMix64 stream seeded by sha256(seed, name);
//!   written tensor by tensor in chunks, so memory stays flat whatever the model's size.

use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use anyhow::{Context, Result};
use prima_core::gguf::{GgmlType, GgufFile, GgufWriter, Value};

use super::random_llama::{norm_weights, set_q4k_scales, set_q6k_scales, FILE_TYPE_Q4_K_M};
use crate::random_gguf::{add_stub_tokenizer, SplitMix64};

/// The generator's own source: part of each model's recipe.
pub const SOURCE: &str = include_str!("random_qwen3moe.rs");

const ROUTER_SIGMA: f32 = 3.0;
const ROUTER_DECAY: f32 = 0.93;

/// The shape of a Qwen3-MoE decoder written directly in Q4_K_M.
#[derive(Debug, Clone, Copy)]
pub struct Qwen3MoeShape {
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
    pub seed: u64,
}

impl Qwen3MoeShape {
    /// llama.cpp's `use_more_bits` (as [`super::random_llama`]'s).
    fn more_bits(&self, il: u64) -> bool {
        let n = self.n_layer;
        il < n / 8 || il >= 7 * n / 8 || (il - n / 8) % 3 == 2
    }

    /// Every tensor as (name, dims with the row length first, type), in file order.
    fn tensors(&self) -> Vec<(String, Vec<u64>, GgmlType)> {
        let (d, v, ff, ne) = (self.n_embd, self.n_vocab, self.n_ff_exp, self.n_expert);
        let (q, kv, hd) = (
            self.n_head * self.head_dim,
            self.n_head_kv * self.head_dim,
            self.head_dim,
        );
        let (q4, f32t) = (GgmlType::Q4K, GgmlType::F32);
        let mut out = vec![("token_embd.weight".to_owned(), vec![d, v], q4)];
        for il in 0..self.n_layer {
            let big = if self.more_bits(il) {
                GgmlType::Q6K
            } else {
                q4
            };
            let t = |s: &str, dims: Vec<u64>, ty| (format!("blk.{il}.{s}"), dims, ty);
            out.extend([
                t("attn_norm.weight", vec![d], f32t),
                t("attn_q.weight", vec![d, q], q4),
                t("attn_k.weight", vec![d, kv], q4),
                t("attn_v.weight", vec![d, kv], big),
                t("attn_q_norm.weight", vec![hd], f32t),
                t("attn_k_norm.weight", vec![hd], f32t),
                t("attn_output.weight", vec![q, d], q4),
                t("ffn_norm.weight", vec![d], f32t),
                t("ffn_gate_inp.weight", vec![d, ne], f32t),
                t("ffn_gate_exps.weight", vec![d, ff, ne], q4),
                t("ffn_up_exps.weight", vec![d, ff, ne], q4),
                t("ffn_down_exps.weight", vec![ff, d, ne], big),
            ]);
        }
        out.push(("output_norm.weight".to_owned(), vec![d], f32t));
        out.push(("output.weight".to_owned(), vec![d, v], GgmlType::Q6K));
        out
    }

    fn header(&self) -> Result<GgufWriter> {
        let mut w = GgufWriter::new();
        let u = |n: u64| Value::U32(u32::try_from(n).expect("shape fits u32"));
        let a = |k: &str| format!("qwen3moe.{k}");
        w.add("general.architecture", Value::String("qwen3moe".into()))
            .add("general.name", Value::String(self.name.into()))
            .add("general.file_type", Value::U32(FILE_TYPE_Q4_K_M))
            .add("general.quantization_version", Value::U32(2))
            .add(&a("context_length"), u(4096))
            .add(&a("embedding_length"), u(self.n_embd))
            .add(&a("block_count"), u(self.n_layer))
            .add(
                &a("feed_forward_length"),
                u(self.n_ff_exp * self.n_expert_used),
            )
            .add(&a("expert_feed_forward_length"), u(self.n_ff_exp))
            .add(&a("expert_count"), u(self.n_expert))
            .add(&a("expert_used_count"), u(self.n_expert_used))
            .add(&a("attention.head_count"), u(self.n_head))
            .add(&a("attention.head_count_kv"), u(self.n_head_kv))
            .add(&a("attention.key_length"), u(self.head_dim))
            .add(&a("attention.value_length"), u(self.head_dim))
            .add(&a("rope.freq_base"), Value::F32(1e6))
            .add(&a("attention.layer_norm_rms_epsilon"), Value::F32(1e-6));
        add_stub_tokenizer(&mut w, self.n_vocab);
        for (name, dims, ty) in self.tensors() {
            w.add_tensor_unallocated(&name, &dims, ty)
                .with_context(|| format!("indexing tensor {name}"))?;
        }
        Ok(w)
    }

    /// Router row `e`'s standard deviation in layer `il`: layer il's hottest expert is
    /// 3·il mod n_expert, and so on round.
    fn router_sigma(&self, il: u64, e: u64) -> f32 {
        let ne = self.n_expert;
        let rank = (e + ne - (3 * il) % ne) % ne;
        ROUTER_SIGMA * ROUTER_DECAY.powi(rank as i32) / (self.n_embd as f32).sqrt()
    }
}

/// Writes the model to `path` (which it truncates) and returns the file's size.
pub fn write(shape: &Qwen3MoeShape, path: &Path) -> Result<u64> {
    shape
        .header()?
        .write(path)
        .with_context(|| format!("writing the header of {}", path.display()))?;
    let index = GgufFile::open(path)
        .with_context(|| format!("reading back the index of {}", path.display()))?
        .tensors()
        .to_vec();
    let mut file = OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let mut chunk = Vec::new();
    for t in &index {
        let mut rng = SplitMix64::for_tensor(shape.seed, &t.name);
        file.seek(SeekFrom::Start(t.offset))?;
        if t.name.ends_with("ffn_gate_inp.weight") {
            let il: u64 = t
                .name
                .split('.')
                .nth(1)
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let cols = t.cols();
            chunk.clear();
            for e in 0..shape.n_expert {
                // Uniform on ±√3·σ: standard deviation σ.
                let half_width = 3.0f32.sqrt() * shape.router_sigma(il, e);
                for _ in 0..cols {
                    let u = (rng.next() >> 40) as f32 / (1u64 << 24) as f32;
                    chunk.extend_from_slice(&(half_width * (2.0 * u - 1.0)).to_le_bytes());
                }
            }
            file.write_all(&chunk)?;
            continue;
        }
        let block_bytes = t.ggml_type.block_bytes();
        let chunk_blocks = 8 * 4096;
        let n_blocks = usize::try_from(t.n_bytes).expect("tensor fits memory") / block_bytes;
        let sigma = (t.cols() as f32).sqrt().recip();
        let mut done = 0;
        while done < n_blocks {
            let blocks = chunk_blocks.min(n_blocks - done);
            chunk.resize(blocks * block_bytes, 0);
            rng.fill(&mut chunk);
            match t.ggml_type {
                GgmlType::Q4K => set_q4k_scales(&mut chunk, sigma),
                GgmlType::Q6K => set_q6k_scales(&mut chunk, sigma),
                GgmlType::F32 => norm_weights(&mut chunk),
                other => anyhow::bail!("tensor {}: no generator for {other}", t.name),
            }
            file.write_all(&chunk)
                .with_context(|| format!("writing tensor {} to {}", t.name, path.display()))?;
            done += blocks;
        }
    }
    file.flush()?;
    Ok(file.metadata()?.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_model_is_a_readable_skewed_qwen3moe() -> Result<()> {
        let shape = Qwen3MoeShape {
            name: "t",
            n_layer: 2,
            n_embd: 256,
            n_head: 2,
            n_head_kv: 1,
            head_dim: 128,
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 256,
            n_vocab: 300,
            seed: 7,
        };
        assert!(shape.router_sigma(0, 0) > shape.router_sigma(0, 7));
        let dir = std::env::temp_dir().join(format!("random-qwen3moe-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("t.gguf");
        write(&shape, &path)?;
        let model = prima_core::model::Model::load(&path)?;
        let experts = model.experts().context("no experts")?;
        assert_eq!((experts.n_expert, experts.n_expert_used), (8, 2));
        let f = GgufFile::open(&path)?;
        assert_eq!(
            f.require_tensor("blk.1.ffn_down_exps.weight")?.ggml_type,
            GgmlType::Q6K
        );
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}

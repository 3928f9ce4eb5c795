//! Writes a Llama-3-shaped GGUF whose weights are random but valid Q4_K / Q6_K blocks,
//! laid out as llama-quantize's Q4_K_M would lay them out — without an F16 intermediate.
//!
//! Why directly: quantizing an 8B F16 file would mean writing 16 GB and running the
//! quantizer over it on a small machine; here every byte is drawn once and written once.
//! The benchmark cares about the byte count and the format mix (which tensors are Q4_K,
//! which Q6_K), and that activations stay finite, not about what the weights mean.
//!
//! How:
//! - The header and tensor index come from prima-core's [`GgufWriter`], every tensor left
//!   unallocated (a sparse file); the data are then written tensor by tensor at the
//!   offsets the index gives, a few MiB at a time, so memory stays flat whatever the size.
//! - Each tensor's bytes come from its own SplitMix64 stream seeded by
//!   sha256(seed, tensor name): the output does not depend on the order of writing.
//! - The quantized values are uniform random; the per-block scales are fixed per tensor so
//!   that every weight has mean ≈ 0 and standard deviation σ = 1/√(row length), the same
//!   statistics as the F16 noise the 1B model starts from, so activations stay roughly
//!   unit-variance through the layers.
//!
//! The type mix follows llama.cpp's Q4_K_M rule (`llama_tensor_get_type_impl` in
//! `src/llama-quant.cpp`): Q4_K everywhere except Q6_K for the output head (or the tied
//! token embedding) and for attn_v and ffn_down in the layers where `use_more_bits` holds;
//! norms stay F32.

use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

#[cfg(test)]
use crate::random_gguf::byte_to_unicode;
use crate::random_gguf::{add_stub_tokenizer, SplitMix64};
use anyhow::{Context, Result};
use prima_core::gguf::{GgmlType, GgufFile, GgufWriter, Value, QK_K};

/// The generator's own source: part of each model's recipe, so a change here remakes them.
pub const SOURCE: &str = include_str!("random_llama.rs");

/// `general.file_type` for MOSTLY_Q4_K_M.
pub(crate) const FILE_TYPE_Q4_K_M: u32 = 15;

/// The shape of a Llama-3-style decoder (GQA, SwiGLU, RMSNorm, RoPE θ = 500 000).
#[derive(Debug, Clone, Copy)]
pub struct LlamaShape {
    /// `general.name`.
    pub name: &'static str,
    pub n_layer: u64,
    pub n_embd: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub n_ff: u64,
    pub n_vocab: u64,
    /// No `output.weight`: the token embedding doubles as the output head (Llama 3.2).
    pub tied_embeddings: bool,
}

impl LlamaShape {
    fn head_dim(&self) -> u64 {
        self.n_embd / self.n_head
    }

    /// llama.cpp's `use_more_bits`: the layers whose attn_v and ffn_down Q4_K_M keeps
    /// in Q6_K (the first and last eighth, and every third layer in between).
    fn more_bits(&self, il: u64) -> bool {
        let n = self.n_layer;
        il < n / 8 || il >= 7 * n / 8 || (il - n / 8) % 3 == 2
    }

    /// Every tensor as (name, dims with the row length first, type), in file order.
    fn tensors(&self) -> Vec<(String, Vec<u64>, GgmlType)> {
        let (e, ff, v) = (self.n_embd, self.n_ff, self.n_vocab);
        let kv = self.n_head_kv * self.head_dim();
        let embd_type = if self.tied_embeddings {
            GgmlType::Q6K
        } else {
            GgmlType::Q4K
        };
        let mut out = vec![("token_embd.weight".to_owned(), vec![e, v], embd_type)];
        for il in 0..self.n_layer {
            let big = if self.more_bits(il) {
                GgmlType::Q6K
            } else {
                GgmlType::Q4K
            };
            let t = |s: &str, dims: Vec<u64>, ty| (format!("blk.{il}.{s}"), dims, ty);
            out.extend([
                t("attn_norm.weight", vec![e], GgmlType::F32),
                t("attn_q.weight", vec![e, e], GgmlType::Q4K),
                t("attn_k.weight", vec![e, kv], GgmlType::Q4K),
                t("attn_v.weight", vec![e, kv], big),
                t("attn_output.weight", vec![e, e], GgmlType::Q4K),
                t("ffn_norm.weight", vec![e], GgmlType::F32),
                t("ffn_gate.weight", vec![e, ff], GgmlType::Q4K),
                t("ffn_up.weight", vec![e, ff], GgmlType::Q4K),
                t("ffn_down.weight", vec![ff, e], big),
            ]);
        }
        out.push(("output_norm.weight".to_owned(), vec![e], GgmlType::F32));
        if !self.tied_embeddings {
            out.push(("output.weight".to_owned(), vec![e, v], GgmlType::Q6K));
        }
        out
    }

    /// Metadata and tensor index, every tensor unallocated.
    fn header(&self) -> Result<GgufWriter> {
        let mut w = GgufWriter::new();
        let u32v = |n: u64| Value::U32(u32::try_from(n).expect("shape fits u32"));
        w.add("general.architecture", Value::String("llama".into()))
            .add("general.name", Value::String(self.name.into()))
            .add("general.file_type", Value::U32(FILE_TYPE_Q4_K_M))
            .add("general.quantization_version", Value::U32(2))
            .add("llama.context_length", Value::U32(8192))
            .add("llama.embedding_length", u32v(self.n_embd))
            .add("llama.block_count", u32v(self.n_layer))
            .add("llama.feed_forward_length", u32v(self.n_ff))
            .add("llama.attention.head_count", u32v(self.n_head))
            .add("llama.attention.head_count_kv", u32v(self.n_head_kv))
            .add("llama.rope.dimension_count", u32v(self.head_dim()))
            .add("llama.rope.freq_base", Value::F32(500_000.0))
            .add("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
        add_stub_tokenizer(&mut w, self.n_vocab);
        for (name, dims, ty) in self.tensors() {
            w.add_tensor_unallocated(&name, &dims, ty)
                .with_context(|| format!("indexing tensor {name}"))?;
        }
        Ok(w)
    }
}

/// Writes the model to `path` (which it truncates) and returns the file's size.
pub fn write(shape: &LlamaShape, seed: u64, path: &Path) -> Result<u64> {
    shape
        .header()?
        .write(path)
        .with_context(|| format!("writing the header of {}", path.display()))?;
    // The index as a reader sees it: the absolute offset of every tensor's data.
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
        let mut rng = SplitMix64::for_tensor(seed, &t.name);
        let block_bytes = t.ggml_type.block_bytes();
        // A whole number of blocks and of u64 draws per chunk, so the stream (and thus
        // the output) does not depend on the chunk size.
        let chunk_blocks = 8 * 4096;
        let n_blocks = usize::try_from(t.n_bytes).expect("tensor fits memory") / block_bytes;
        let row_len = t.cols() as f32;
        file.seek(SeekFrom::Start(t.offset))?;
        let mut done = 0;
        while done < n_blocks {
            let blocks = chunk_blocks.min(n_blocks - done);
            chunk.resize(blocks * block_bytes, 0);
            rng.fill(&mut chunk);
            match t.ggml_type {
                GgmlType::Q4K => set_q4k_scales(&mut chunk, row_len.sqrt().recip()),
                GgmlType::Q6K => set_q6k_scales(&mut chunk, row_len.sqrt().recip()),
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

/// Q4_K block: d (f16), dmin (f16), 12 bytes of packed 6-bit scales and mins for eight
/// sub-blocks of 32, then 128 bytes of 4-bit quants q. A weight is d·sc·q − dmin·m.
/// With sc = m = 16 and dmin = 7.5·d the mean is 0 (q is uniform on 0..=15, mean 7.5)
/// and the standard deviation d·16·√(255/12); d is chosen to make it σ.
pub(crate) fn set_q4k_scales(blocks: &mut [u8], sigma: f32) {
    const SC: f32 = 16.0;
    // sc = m = 16 for all eight sub-blocks, packed as ggml's get_scale_min_k4 unpacks:
    // bytes 0..4 hold sc[0..4] and the top bits of sc[4..8], bytes 4..8 likewise for m,
    // bytes 8..12 the low nibbles of sc[4..8] | m[4..8] << 4 (zero here).
    const PACKED: [u8; 12] = [80, 80, 80, 80, 80, 80, 80, 80, 0, 0, 0, 0];
    let d = sigma / (SC * (255.0f32 / 12.0).sqrt());
    let d16 = f16_bits(d);
    let dmin16 = f16_bits(7.5 * d);
    for block in blocks.chunks_exact_mut(GgmlType::Q4K.block_bytes()) {
        block[0..2].copy_from_slice(&d16.to_le_bytes());
        block[2..4].copy_from_slice(&dmin16.to_le_bytes());
        block[4..16].copy_from_slice(&PACKED);
    }
}

/// Q6_K block: 128 bytes of low nibbles, 64 of high bit pairs (6-bit q, uniform on
/// 0..=63), 16 int8 scales for sub-blocks of 16, then d (f16). A weight is
/// d·scale·(q − 32): standard deviation d·|scale|·√(4095/12). The scales alternate ±4,
/// so the −0.5 offset of q − 32 cancels along a row.
pub(crate) fn set_q6k_scales(blocks: &mut [u8], sigma: f32) {
    const SCALE: i8 = 4;
    let d = sigma / (f32::from(SCALE) * (4095.0f32 / 12.0).sqrt());
    let d16 = f16_bits(d);
    let scales: [u8; QK_K / 16] = std::array::from_fn(|i| {
        let s = if i % 2 == 0 { SCALE } else { -SCALE };
        s.to_le_bytes()[0]
    });
    for block in blocks.chunks_exact_mut(GgmlType::Q6K.block_bytes()) {
        block[192..208].copy_from_slice(&scales);
        block[208..210].copy_from_slice(&d16.to_le_bytes());
    }
}

/// RMSNorm weights: 1 + uniform noise of standard deviation 0.1 (the random bits in
/// `values` become the noise).
pub(crate) fn norm_weights(values: &mut [u8]) {
    for v in values.chunks_exact_mut(4) {
        let bits = u32::from_le_bytes([v[0], v[1], v[2], v[3]]);
        let u = (bits >> 8) as f32 / (1u32 << 24) as f32; // uniform on [0, 1)
        let w = 1.0 + 0.1 * 3.0f32.sqrt() * (2.0 * u - 1.0);
        v.copy_from_slice(&w.to_le_bytes());
    }
}

/// IEEE half-precision bits of a positive normal `x`, rounded to nearest.
fn f16_bits(x: f32) -> u16 {
    assert!(
        (6.2e-5..65504.0).contains(&x),
        "scale {x} is outside f16's normal range"
    );
    let bits = x.to_bits();
    let exp = ((bits >> 23) & 0xFF) as i32 - 127 + 15;
    let mant = bits & 0x7F_FFFF;
    // 13 mantissa bits are dropped; round half up (the values are not ties in practice).
    let rounded = ((exp as u32) << 10) + (mant >> 13) + ((mant >> 12) & 1);
    rounded as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::ensure;

    #[test]
    fn f16_bits_matches_known_values() {
        assert_eq!(f16_bits(1.0), 0x3C00);
        assert_eq!(f16_bits(0.5), 0x3800);
        assert_eq!(f16_bits(1.0e-4), 0x068E);
        assert_eq!(f16_bits(65000.0), 0x7BEF);
    }

    #[test]
    fn byte_tokens_are_gpt2s() {
        let t = byte_to_unicode();
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[b' ' as usize], '\u{0120}');
        assert_eq!(t[0], '\u{0100}');
        assert_eq!(t[0xAD], '\u{0143}');
    }

    #[test]
    fn q4_k_mix_follows_llama_quantize() {
        let shape = LlamaShape {
            name: "t",
            n_layer: 32,
            n_embd: 256,
            n_head: 2,
            n_head_kv: 1,
            n_ff: 512,
            n_vocab: 300,
            tied_embeddings: false,
        };
        let q6: Vec<u64> = (0..32).filter(|&il| shape.more_bits(il)).collect();
        assert_eq!(
            q6,
            [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
    }

    #[test]
    fn small_model_is_deterministic_and_readable() -> Result<()> {
        let shape = LlamaShape {
            name: "t",
            n_layer: 2,
            n_embd: 256,
            n_head: 4,
            n_head_kv: 2,
            n_ff: 512,
            n_vocab: 300,
            tied_embeddings: true,
        };
        let dir = std::env::temp_dir().join(format!("random-llama-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let (a, b) = (dir.join("a.gguf"), dir.join("b.gguf"));
        write(&shape, 7, &a)?;
        write(&shape, 7, &b)?;
        let (ba, bb) = (std::fs::read(&a)?, std::fs::read(&b)?);
        ensure!(ba == bb, "two runs differ");
        let f = GgufFile::open(&a)?;
        assert!(f.tensor("output.weight").is_none());
        assert_eq!(
            f.require_tensor("token_embd.weight")?.ggml_type,
            GgmlType::Q6K
        );
        assert_eq!(
            f.require_tensor("blk.1.ffn_down.weight")?.ggml_type,
            GgmlType::Q6K
        );
        let norm = f.tensor_data(f.require_tensor("output_norm.weight")?);
        let w = f32::from_le_bytes(norm[..4].try_into()?);
        assert!((0.8..1.2).contains(&w), "norm weight {w}");
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}

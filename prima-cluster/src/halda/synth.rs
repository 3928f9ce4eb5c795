//! Synthetic GGUF files with the real shapes of the paper's models (Llama 3 8B/14B/70B,
//! Qwen 2.5 32B/72B) and a Q4_K_M-like type mix, written sparse: the tensor index is real,
//! the data regions are holes. Planning needs only the index, so tests and
//! `cargo xtask synth-model` use the paper's models without their weights.

use std::io;
use std::path::Path;

use prima_core::gguf::{GgmlType, GgufWriter, Value};

/// The shape of a decoder-only transformer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SynthSpec {
    /// File stem, e.g. `llama3-70b-q4_k`.
    pub tag: &'static str,
    pub arch: &'static str,
    pub name: &'static str,
    pub n_layers: u64,
    pub n_embd: u64,
    pub n_ff: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub n_vocab: u64,
    /// Biases on q, k and v (Qwen 2).
    pub qkv_bias: bool,
}

/// The models the paper plans.
pub const PAPER_MODELS: [SynthSpec; 5] = [
    SynthSpec {
        tag: "llama3-8b-q4_k",
        arch: "llama",
        name: "Llama 3 8B (synthetic, Q4_K)",
        n_layers: 32,
        n_embd: 4096,
        n_ff: 14336,
        n_head: 32,
        n_head_kv: 8,
        n_vocab: 128256,
        qkv_bias: false,
    },
    SynthSpec {
        tag: "llama3-14b-q4_k",
        arch: "llama",
        name: "Llama 3 14B (synthetic, Q4_K)",
        n_layers: 48,
        n_embd: 5120,
        n_ff: 13824,
        n_head: 40,
        n_head_kv: 8,
        n_vocab: 128256,
        qkv_bias: false,
    },
    SynthSpec {
        tag: "llama3-70b-q4_k",
        arch: "llama",
        name: "Llama 3 70B (synthetic, Q4_K)",
        n_layers: 80,
        n_embd: 8192,
        n_ff: 28672,
        n_head: 64,
        n_head_kv: 8,
        n_vocab: 128256,
        qkv_bias: false,
    },
    SynthSpec {
        tag: "qwen2.5-32b-q4_k",
        arch: "qwen2",
        name: "Qwen 2.5 32B (synthetic, Q4_K)",
        n_layers: 64,
        n_embd: 5120,
        n_ff: 27648,
        n_head: 40,
        n_head_kv: 8,
        n_vocab: 152064,
        qkv_bias: true,
    },
    SynthSpec {
        tag: "qwen2.5-72b-q4_k",
        arch: "qwen2",
        name: "Qwen 2.5 72B (synthetic, Q4_K)",
        n_layers: 80,
        n_embd: 8192,
        n_ff: 29568,
        n_head: 64,
        n_head_kv: 8,
        n_vocab: 152064,
        qkv_bias: true,
    },
];

/// llama.cpp's fallback when a row is not a whole number of K-quant super-blocks (Qwen 2.5
/// 72B's n_ff = 29568): Q4_K → Q5_0, Q6_K → Q8_0, IQ4_XS → IQ4_NL.
fn fallback(t: GgmlType, cols: u64) -> GgmlType {
    if cols.is_multiple_of(prima_core::gguf::QK_K as u64) {
        return t;
    }
    match t {
        GgmlType::Q6K => GgmlType::Q8_0,
        GgmlType::Q4K | GgmlType::Q5K => GgmlType::Q5_0,
        GgmlType::IQ4XS => GgmlType::IQ4NL,
        other => other,
    }
}

/// Finds a paper model by tag.
pub fn spec(tag: &str) -> Option<&'static SynthSpec> {
    PAPER_MODELS.iter().find(|s| s.tag == tag)
}

impl SynthSpec {
    /// llama.cpp's Q4_K_M rule for the layers whose attn_v and ffn_down get more bits.
    fn more_bits(&self, il: u64) -> bool {
        let n = self.n_layers;
        il < n / 8 || il >= 7 * n / 8 || (il - n / 8) % 3 == 2
    }

    /// The GGUF image: metadata and tensor index, every tensor unallocated.
    pub fn writer(&self) -> io::Result<GgufWriter> {
        let a = self.arch;
        let head_dim = self.n_embd / self.n_head;
        let kv_dim = self.n_head_kv * head_dim;
        let mut w = GgufWriter::new();
        w.add("general.architecture", Value::String(a.into()))
            .add("general.name", Value::String(self.name.into()))
            .add(
                &format!("{a}.block_count"),
                Value::U32(self.n_layers as u32),
            )
            .add(&format!("{a}.context_length"), Value::U32(8192))
            .add(
                &format!("{a}.embedding_length"),
                Value::U32(self.n_embd as u32),
            )
            .add(
                &format!("{a}.feed_forward_length"),
                Value::U32(self.n_ff as u32),
            )
            .add(
                &format!("{a}.attention.head_count"),
                Value::U32(self.n_head as u32),
            )
            .add(
                &format!("{a}.attention.head_count_kv"),
                Value::U32(self.n_head_kv as u32),
            )
            .add(
                &format!("{a}.attention.layer_norm_rms_epsilon"),
                Value::F32(1e-5),
            )
            .add(&format!("{a}.rope.freq_base"), Value::F32(500_000.0));
        let (e, ff, v) = (self.n_embd, self.n_ff, self.n_vocab);
        w.add_tensor_unallocated("token_embd.weight", &[e, v], GgmlType::Q4K)?;
        for il in 0..self.n_layers {
            let t = |s: &str| format!("blk.{il}.{s}");
            let big = if self.more_bits(il) {
                GgmlType::Q6K
            } else {
                GgmlType::Q4K
            };
            w.add_tensor_unallocated(&t("attn_norm.weight"), &[e], GgmlType::F32)?;
            w.add_tensor_unallocated(&t("attn_q.weight"), &[e, e], GgmlType::Q4K)?;
            w.add_tensor_unallocated(&t("attn_k.weight"), &[e, kv_dim], GgmlType::Q4K)?;
            w.add_tensor_unallocated(&t("attn_v.weight"), &[e, kv_dim], big)?;
            if self.qkv_bias {
                w.add_tensor_unallocated(&t("attn_q.bias"), &[e], GgmlType::F32)?;
                w.add_tensor_unallocated(&t("attn_k.bias"), &[kv_dim], GgmlType::F32)?;
                w.add_tensor_unallocated(&t("attn_v.bias"), &[kv_dim], GgmlType::F32)?;
            }
            w.add_tensor_unallocated(&t("attn_output.weight"), &[e, e], GgmlType::Q4K)?;
            w.add_tensor_unallocated(&t("ffn_norm.weight"), &[e], GgmlType::F32)?;
            w.add_tensor_unallocated(&t("ffn_gate.weight"), &[e, ff], GgmlType::Q4K)?;
            w.add_tensor_unallocated(&t("ffn_up.weight"), &[e, ff], GgmlType::Q4K)?;
            w.add_tensor_unallocated(&t("ffn_down.weight"), &[ff, e], fallback(big, ff))?;
        }
        w.add_tensor_unallocated("output_norm.weight", &[e], GgmlType::F32)?;
        w.add_tensor_unallocated("output.weight", &[e, v], GgmlType::Q6K)?;
        Ok(w)
    }

    /// Writes the sparse file to `dir/<tag>.gguf` and returns its path.
    pub fn write_to(&self, dir: &Path) -> io::Result<std::path::PathBuf> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("{}.gguf", self.tag));
        self.writer()?.write(&path)?;
        Ok(path)
    }
}

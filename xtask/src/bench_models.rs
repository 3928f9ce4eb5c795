//! `cargo xtask bench-models`: the generated benchmark model — a ~1.1B-parameter
//! llama-architecture GGUF with seeded random weights, quantized to Q4_K_M — so that
//! generation speed is dominated by streaming weights, not per-operation overhead.
//! Deterministic (fixed seed, fixed llama-quantize), never committed, kept in the derived
//! model directory and made only when missing.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result};

use crate::layout::Layout;
use crate::llama_cpp::LlamaCpp;
use crate::shell;

/// Tag and file of the benchmark model (`cargo xtask bench --model bench-llama-1b-q4_k_m`).
pub const BENCH_1B: &str = "bench-llama-1b-q4_k_m";
/// The same model in Q8_0 (1.2 GB): big enough for the ring's memory-residency experiment.
pub const BENCH_1B_Q8: &str = "bench-llama-1b-q8_0";

pub fn path(layout: &Layout) -> PathBuf {
    layout.derived_models.join(format!("{BENCH_1B}.gguf"))
}

pub fn path_q8(layout: &Layout) -> PathBuf {
    layout.derived_models.join(format!("{BENCH_1B_Q8}.gguf"))
}

/// Makes the benchmark models if they are missing and returns the Q4_K_M one's path.
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
    std::fs::create_dir_all(&layout.derived_models)
        .with_context(|| format!("cannot create {}", layout.derived_models.display()))?;
    let f16 = layout.derived_models.join("bench-llama-1b-f16.gguf");
    let script = layout.workspace.join("xtask/scripts/make_bench_model.py");
    shell::run(Command::new("python3").arg(&script).arg("--out").arg(&f16))?;
    for (target, ty) in [(&out, "Q4_K_M"), (&q8, "Q8_0")] {
        let tmp = target.with_extension("gguf.tmp");
        shell::run(
            Command::new(llama.bin("llama-quantize"))
                .arg(&f16)
                .arg(&tmp)
                .arg(ty),
        )?;
        std::fs::rename(&tmp, target)?;
        println!("made      {}", target.display());
    }
    // The F16 source is 2.2 GB and only an intermediate.
    let _ = std::fs::remove_file(&f16);
    Ok(out)
}

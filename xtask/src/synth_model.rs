//! `cargo xtask synth-model`: sparse GGUF files with the real shapes of the paper's models
//! (Llama 3 8B/14B/70B, Qwen 2.5 32B/72B, Q4_K_M-like types) for planning with
//! `prima plan`: the tensor index is real, the data regions are holes, so a "40 GB" model
//! takes a few megabytes of disk. Written under `<derived models>/synth/`, never the repo.

use anyhow::{Context, Result};
use prima_cluster::halda::synth::PAPER_MODELS;

use crate::layout::Layout;

pub fn run(layout: &Layout, only: Option<&str>) -> Result<()> {
    let dir = layout.derived_models.join("synth");
    let mut made = 0;
    for spec in PAPER_MODELS
        .iter()
        .filter(|s| only.is_none_or(|o| s.tag.contains(o)))
    {
        let path = spec
            .write_to(&dir)
            .with_context(|| format!("writing {}", dir.join(spec.tag).display()))?;
        let size = std::fs::metadata(&path)?.len();
        println!(
            "wrote     {} ({:.1} GiB apparent, sparse)",
            path.display(),
            size as f64 / (1u64 << 30) as f64
        );
        made += 1;
    }
    if made == 0 {
        anyhow::bail!(
            "no synthetic model matches; tags: {}",
            PAPER_MODELS
                .iter()
                .map(|s| s.tag)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

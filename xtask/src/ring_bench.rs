//! `cargo xtask ring-bench`: the ring's experiments on this machine, by
//! `xtask/scripts/ring_bench.py` against a fresh release build.
//!
//! - overhead: TPOT of a 3-device loopback ring (head + 2 nodes, k = 1) against one
//!   process, same thread count, alternating; overhead per hop and the ring's speed as a
//!   fraction of one process (idle nodes must sleep for it to stay near 1).
//! - residency: one node in a cgroup-v1 memory limit well below its layers, with and
//!   without prefetch, k = 1, 2, 4, and MRU release: TPOT, major faults and disk bytes read
//!   per token on that node.
//! - secure: TPOT and per-hop time of the 3-device loopback ring with sealed links
//!   (the cluster key) against plain ones (`--insecure`), alternating.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::bench_models;
use crate::layout::Layout;
use crate::shell;

#[derive(clap::Args, Debug)]
pub struct RingBenchArgs {
    /// overhead, residency, secure or all.
    #[arg(default_value = "all")]
    what: String,
    /// Repetitions per configuration (medians are reported).
    #[arg(long, default_value_t = 5)]
    reps: u32,
    /// Threads per device.
    #[arg(short = 't', long, default_value_t = 2)]
    threads: u32,
    /// Where to write the JSON report.
    #[arg(long, default_value = "target/ring-bench.json")]
    json: PathBuf,
}

pub fn run(layout: &Layout, args: &RingBenchArgs) -> Result<()> {
    crate::build_tools::ensure_for_cargo(layout)?;
    let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["build", "--release", "--workspace", "--exclude", "xtask"])
        .current_dir(&layout.workspace)
        .status()
        .context("cannot run cargo build")?;
    if !status.success() {
        bail!("cargo build failed");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| layout.workspace.join("target"));
    let prima = target.join("release").join("prima");
    bench_models::run(layout)?;
    let smollm2 = [
        layout
            .workspace
            .join("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        layout.derived_models.join("smollm2-135m-q4_k_m.gguf"),
    ];
    for m in &smollm2 {
        if !m.exists() {
            bail!("{} is missing (run `cargo xtask test-models`)", m.display());
        }
    }
    let json = layout.workspace.join(&args.json);
    let mut cmd = Command::new("python3");
    cmd.arg(layout.workspace.join("xtask/scripts/ring_bench.py"))
        .arg(&args.what)
        .arg("--prima")
        .arg(&prima)
        .arg("--models")
        .args(&smollm2)
        .arg("--big-model")
        .arg(bench_models::path_q8(layout))
        .args(["--reps", &args.reps.to_string()])
        .args(["--threads", &args.threads.to_string()])
        .arg("--json")
        .arg(&json);
    shell::run(&mut cmd)?;
    println!("report    {}", json.display());
    Ok(())
}

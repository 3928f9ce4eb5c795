//! `cargo xtask bench`: Prima and llama.cpp side by side, in one run, on the same models,
//! thread counts, prompt and generation lengths.
//!
//! The two tools are run in alternation, the first of each round's pair alternating too
//! (llama-bench, prima bench; prima bench, llama-bench; …), so a disturbance on the machine
//! hits both; each reports the mean over `reps` repetitions and the table shows the median
//! round per tool and the Prima ÷ llama.cpp ratios of those medians.
//! Bandwidth efficiency = weight bytes read per generated token × generation tok/s ÷ the
//! memory read bandwidth measured (STREAM-style) in the same run.
//!
//! `--backend wgpu` puts the same comparison on a GPU API: Prima's wgpu backend
//! (`prima bench --backend wgpu`) beside llama.cpp's Vulkan build ([`llama_vulkan`]), both
//! on Mesa's lavapipe, the software Vulkan driver any Linux machine can install, so the
//! ratio says how Prima's shaders and dispatch compare with ggml's on the same device.
//! There `-t` also sets lavapipe's worker threads (`LP_NUM_THREADS`) for both sides.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::bench_models;
use crate::catalogue;
use crate::layout::Layout;
use crate::llama_cpp::LlamaCpp;
use crate::llama_vulkan;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Model tags (see the catalogue) or GGUF paths; default: the bench set.
    #[arg(long = "model", value_name = "TAG|PATH")]
    models: Vec<String>,
    /// Thread counts to measure, comma-separated.
    #[arg(short = 't', long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<u32>,
    #[arg(short = 'p', long = "n-prompt", default_value_t = 128)]
    n_prompt: usize,
    #[arg(short = 'n', long = "n-gen", default_value_t = 64)]
    n_gen: usize,
    /// Repetitions inside each tool run.
    #[arg(short = 'r', long, default_value_t = 3)]
    reps: usize,
    /// Alternating rounds of llama-bench and prima bench (the first of each pair
    /// alternates); the table shows each side's median round.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Cap both sides' kernels at this level: Prima through `PRIMA_CPU_KERNELS`, and with
    /// `avx2` llama.cpp through a second, AVX2-only build (AVX-512 and VNNI off).
    #[arg(long, value_name = "LEVEL")]
    kernels: Option<String>,
    /// `cpu`: Prima's CPU backend beside llama.cpp's CPU build. `wgpu`: Prima's wgpu
    /// backend beside llama.cpp's Vulkan build, both on lavapipe (software Vulkan).
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    backend: Backend,
}

/// The backend both sides run on.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Cpu,
    Wgpu,
}

/// What running both sides on lavapipe adds to their commands.
struct Lavapipe {
    /// The loader's variables that leave it lavapipe's driver only.
    env: Vec<(&'static str, String)>,
    /// Lavapipe's index among ggml's Vulkan devices (`GGML_VK_VISIBLE_DEVICES`).
    ggml_device: usize,
}

impl Lavapipe {
    /// The variables both sides get at `threads` threads: the loader's, and lavapipe's
    /// thread count unless the caller's environment sets one.
    fn env(&self, threads: u32) -> Vec<(&'static str, String)> {
        let mut env = self.env.clone();
        if std::env::var_os("LP_NUM_THREADS").is_none() {
            env.push(("LP_NUM_THREADS", threads.to_string()));
        }
        env
    }
}

/// Models measured when none are named: the bench set of the CPU-speed issue.
const DEFAULT_MODELS: &[&str] = &[
    catalogue::SMOLLM2_Q4_1,
    "smollm2-135m-q4_k_m",
    catalogue::GEMMA3_Q4_K_M,
    bench_models::BENCH_1B,
    bench_models::BENCH_MOE,
    bench_models::BENCH_GPTOSS,
    "tiny-qwen3moe-16x4-q4_k_m",
    "tiny-gptoss-8x4-mxfp4",
];

#[derive(Default, Clone, Copy)]
struct Throughput {
    pp: f64,
    tg: f64,
}

pub fn run(layout: &Layout, args: &BenchArgs) -> Result<()> {
    let names: Vec<String> = if args.models.is_empty() {
        DEFAULT_MODELS.iter().map(|s| s.to_string()).collect()
    } else {
        args.models.clone()
    };
    let models = names
        .iter()
        .map(|m| resolve_model(layout, m))
        .collect::<Result<Vec<_>>>()?;

    let llama = LlamaCpp::new(layout);
    let (llama_bench, lavapipe) = match args.backend {
        Backend::Cpu => {
            llama.ensure_built()?;
            let bench = match args.kernels.as_deref() {
                None | Some("avx512") => llama.bin("llama-bench"),
                Some("avx2") => llama.ensure_avx2_bench()?,
                Some(other) => bail!("--kernels {other}: llama.cpp can be capped at avx2 only"),
            };
            (bench, None)
        }
        Backend::Wgpu => {
            if args.kernels.is_some() {
                bail!("--kernels caps CPU kernels; it has no meaning with --backend wgpu");
            }
            let bench = llama_vulkan::ensure_bench(layout, &llama)?;
            let env = llama_vulkan::lavapipe_env()?;
            let (ggml_device, name) = llama_vulkan::lavapipe_device(&bench, &env)?;
            println!(
                "on lavapipe ({name}): Prima --backend wgpu, llama.cpp's Vulkan build ({})",
                bench.display()
            );
            (bench, Some(Lavapipe { env, ggml_device }))
        }
    };
    let prima = build_prima(layout, args.backend)?;
    if let Some(level) = &args.kernels {
        println!(
            "kernels capped at {level} (PRIMA_CPU_KERNELS; llama-bench: {})",
            llama_bench.display()
        );
    }

    println!(
        "| model | threads | llama.cpp pp{p} | Prima pp{p} | pp ratio | llama.cpp tg{n} | Prima tg{n} | tg ratio | BW eff. llama.cpp | BW eff. Prima |",
        p = args.n_prompt,
        n = args.n_gen
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for model in &models {
        if !model.exists() {
            println!(
                "| {} | – | missing (cargo xtask test-models) | | | | | | | |",
                model.display()
            );
            continue;
        }
        for &t in &args.threads {
            let lp = lavapipe.as_ref();
            let mut ours = Vec::new();
            let mut theirs = Vec::new();
            let mut mem_bw = 0.0f64;
            let mut bytes_per_token = 0.0f64;
            let mut prima_error = None;
            for round in 0..args.rounds {
                // Who goes first alternates, so neither side always runs on a cold or a
                // warmed-up machine.
                let reference_first = round % 2 == 0;
                if reference_first {
                    theirs.push(run_llama_bench(&llama_bench, model, t, args, lp)?);
                }
                let ran = run_prima_bench(&prima, model, t, args, round == 0, lp);
                if !reference_first && ran.is_ok() {
                    theirs.push(run_llama_bench(&llama_bench, model, t, args, lp)?);
                }
                match ran {
                    Ok((tp, bw, bytes)) => {
                        ours.push(tp);
                        if let Some(bw) = bw {
                            mem_bw = bw;
                            bytes_per_token = bytes;
                        }
                    }
                    Err(e) => {
                        prima_error = Some(e.to_string());
                        break;
                    }
                }
            }
            let name = model.file_name().unwrap_or_default().to_string_lossy();
            let l = median(&theirs);
            if let Some(err) = prima_error {
                let first_line = err.lines().next().unwrap_or("").to_string();
                println!("| {name} | {t} | {:.1} | – | – | {:.1} | – | – | | Prima failed: {first_line} |", l.pp, l.tg);
                continue;
            }
            let o = median(&ours);
            // A test left out (`-p 0`, `-n 0`) has no rate, so no ratio or efficiency.
            let ratio = |ours: f64, theirs: f64| match theirs > 0.0 {
                true => format!("{:.2}", ours / theirs),
                false => "–".into(),
            };
            let eff = |tg: f64| {
                if mem_bw > 0.0 && tg > 0.0 {
                    format!("{:.0}%", 100.0 * bytes_per_token * tg / mem_bw)
                } else {
                    "–".into()
                }
            };
            println!(
                "| {name} | {t} | {:.1} | {:.1} | {} | {:.1} | {:.1} | {} | {} | {} |",
                l.pp,
                o.pp,
                ratio(o.pp, l.pp),
                l.tg,
                o.tg,
                ratio(o.tg, l.tg),
                eff(l.tg),
                eff(o.tg)
            );
            if mem_bw > 0.0 {
                eprintln!(
                    "  {name} t={t}: memory read bandwidth {:.1} GB/s, {:.1} MB of weights per token",
                    mem_bw / 1e9,
                    bytes_per_token / 1e6
                );
            }
        }
    }
    Ok(())
}

/// A catalogue tag or a path to a GGUF file.
fn resolve_model(layout: &Layout, name: &str) -> Result<PathBuf> {
    if name.ends_with(".gguf") {
        return Ok(PathBuf::from(name));
    }
    if let Some(path) = bench_models::by_tag(layout, name) {
        return path;
    }
    match catalogue::MODELS.iter().find(|m| m.tag == name) {
        Some(spec) => Ok(spec.path(layout)),
        None => bail!(
            "no model tagged '{name}' (known: {}); or give a path ending in .gguf",
            catalogue::MODELS
                .iter()
                .map(|m| m.tag)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The median round of each throughput: on a shared machine, interference slows a few
/// rounds a lot, which a mean would carry into the ratio.
fn median(xs: &[Throughput]) -> Throughput {
    let mid = |f: fn(&Throughput) -> f64| {
        let mut v: Vec<f64> = xs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => 0.0,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    };
    Throughput {
        pp: mid(|x| x.pp),
        tg: mid(|x| x.tg),
    }
}

/// Builds the `prima` binary and the backend's plugin in release mode and returns the
/// binary.
fn build_prima(layout: &Layout, backend: Backend) -> Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let plugin = match backend {
        Backend::Cpu => "prima-backend-cpu",
        Backend::Wgpu => "prima-backend-metal",
    };
    let status = Command::new(&cargo)
        .args(["build", "--release", "-p", "prima-cli", "-p", plugin])
        .current_dir(&layout.workspace)
        .status()
        .context("cannot run cargo build")?;
    if !status.success() {
        bail!("cargo build failed");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| layout.workspace.join("target"));
    Ok(target.join("release").join("prima"))
}

/// With `lavapipe`, every layer on ggml's Vulkan device lavapipe.
fn run_llama_bench(
    bin: &Path,
    model: &Path,
    threads: u32,
    args: &BenchArgs,
    lavapipe: Option<&Lavapipe>,
) -> Result<Throughput> {
    let mut cmd = Command::new(bin);
    if let Some(lp) = lavapipe {
        cmd.envs(lp.env(threads))
            .env("GGML_VK_VISIBLE_DEVICES", lp.ggml_device.to_string())
            .args(["-ngl", "999"]);
    }
    let out = cmd
        .arg("-m")
        .arg(model)
        .args(["-t", &threads.to_string()])
        .args(["-p", &args.n_prompt.to_string()])
        .args(["-n", &args.n_gen.to_string()])
        .args(["-r", &args.reps.to_string()])
        .args(["-o", "json"])
        .output()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "llama-bench failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let rows: Value = serde_json::from_slice(&out.stdout).context("llama-bench printed no JSON")?;
    let mut tp = Throughput::default();
    for row in rows
        .as_array()
        .context("llama-bench JSON is not an array")?
    {
        let ts = row["avg_ts"].as_f64().unwrap_or(0.0);
        if row["n_gen"].as_u64() == Some(0) {
            tp.pp = ts;
        } else {
            tp.tg = ts;
        }
    }
    Ok(tp)
}

/// Returns throughput and, when `mem_bw` is asked for, the memory bandwidth and the weight
/// bytes per token.
fn run_prima_bench(
    bin: &Path,
    model: &Path,
    threads: u32,
    args: &BenchArgs,
    mem_bw: bool,
    lavapipe: Option<&Lavapipe>,
) -> Result<(Throughput, Option<f64>, f64)> {
    let mut cmd = Command::new(bin);
    if let Some(level) = &args.kernels {
        cmd.env("PRIMA_CPU_KERNELS", level);
    }
    cmd.arg("bench");
    if let Some(lp) = lavapipe {
        // The wgpu plugin takes a software adapter only when asked.
        cmd.envs(lp.env(threads))
            .env("PRIMA_WGPU_ALLOW_SOFTWARE", "1")
            .args(["--backend", "wgpu"]);
    }
    cmd.arg("-m")
        .arg(model)
        .args(["-t", &threads.to_string()])
        .args(["-p", &args.n_prompt.to_string()])
        .args(["-n", &args.n_gen.to_string()])
        .args(["-r", &args.reps.to_string()])
        .arg("--json");
    if mem_bw {
        cmd.arg("--mem-bw");
    }
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let v: Value = serde_json::from_slice(&out.stdout).context("prima bench printed no JSON")?;
    Ok((
        Throughput {
            pp: v["prompt_tokens_per_s"].as_f64().unwrap_or(0.0),
            tg: v["gen_tokens_per_s"].as_f64().unwrap_or(0.0),
        },
        v["mem_read_bytes_per_s"].as_f64(),
        v["weight_bytes_per_token"].as_f64().unwrap_or(0.0),
    ))
}

//! Prima's developer tasks: `cargo xtask <command>`.
//!
//! Everything downloaded or built (wheels, llama.cpp, derived models) lives
//! under `~/.cache/prima`; fetched upstream models go to the git-ignored
//! `<workspace>/models/`. Only fixtures under `tests/fixtures/` are meant to
//! be committed.

mod bench;
mod bench_models;
mod bench_serve;
mod browser;
mod build_tools;
mod catalogue;
mod cpu_features;
mod cross_check;
mod digest;
mod dist;
mod fetch_models;
mod fixture_cases;
mod fuzz;
mod homelab;
mod layering;
mod layout;
mod llama_cpp;
mod llama_vulkan;
mod o200k_vocab;
mod random_gguf;
mod random_gptoss;
mod random_moe;
mod reference;
mod ring_bench;
mod shell;
mod soak;
mod spec_bench;
mod synth_model;
mod test;
mod test_models;
mod vulkan;
mod wheel;
mod wine;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use crate::layout::Layout;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Prima's developer tasks")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Everything `cargo build` and `prima` need on a bare machine: the build tools it
    /// lacks (cmake, libclang, from PyPI), Mesa's software Vulkan driver for the wgpu
    /// backend's tests (apt-get, as root on Debian/Ubuntu) and the models (fetch-models).
    Setup,
    /// Put SmolLM2-135M-Instruct Q4_1 and Gemma-3-270M Q4_K_M into models/.
    FetchModels,
    /// Build llama.cpp, make every test model and regenerate the golden fixtures.
    Reference {
        /// Regenerate fixtures only; fail instead of building what is missing.
        #[arg(long)]
        fixtures_only: bool,
        /// Only the generation fixtures whose model tag contains this text.
        #[arg(long, value_name = "TEXT")]
        only: Option<String>,
    },
    /// Make every model the test suite needs (fetched, requantized, tiny).
    TestModels,
    /// Write gpt-oss's vocabulary (o200k_harmony, from the js-tiktoken npm package) and
    /// chat template as a vocabulary-only GGUF in the derived-model directory (also done
    /// by test-models).
    O200kVocab {
        /// Also regenerate its tokenizer and chat fixtures (as `reference` does).
        #[arg(long)]
        fixtures: bool,
    },
    /// test-models, then `cargo build --release` and `cargo test --release` on the workspace;
    /// the home-lab smoke bed and the aarch64 kernels where this machine can, else skipped.
    Test,
    /// Prima and llama-bench side by side on the bench models, with ratios.
    Bench(bench::BenchArgs),
    /// The server's aggregate tok/s at 1, 2, 4, 8 concurrent requests: `prima serve
    /// --parallel N` beside `llama-server -np N` (and a loopback ring with --ring).
    BenchServe(bench_serve::BenchServeArgs),
    /// Make the generated benchmark models (random weights): Llama-shaped 1B (Q4_K_M,
    /// Q8_0), 3B and 8B (Q4_K_M), and a Qwen3-MoE-shaped one (Q4_K_M).
    BenchModels(bench_models::BenchModelsArgs),
    /// Ring experiments on loopback: overhead per hop, idle nodes, prefetch and release
    /// under a cgroup memory limit (needs root for the cgroup).
    RingBench(ring_bench::RingBenchArgs),
    /// Speculative decoding on a 3-device loopback ring with added link latency and on
    /// one device: TPOT with and without a draft, acceptance, identical greedy text.
    SpecBench(spec_bench::SpecBenchArgs),
    /// Emulated home devices on this machine (cgroups, namespaces, link latency): up,
    /// down, status, check, exec (root, cgroup v1, iproute2).
    #[command(subcommand)]
    Homelab(homelab::HomelabCommand),
    /// Type-check every crate for macOS, Windows and Android (`cargo check --target`),
    /// adding the Rust targets if missing; a table of what builds where.
    CrossCheck(cross_check::CrossCheckArgs),
    /// Release archives with cargo-dist: `prima`, every plugin, README, licences and
    /// manifests/home.toml per target, in target/distrib/prima-<version>-<target>.tar.xz.
    Dist(dist::DistArgs),
    /// The server under a long mixed load on a loopback ring of three, a node killed and
    /// restarted in the middle: every answer judged, memory, threads and descriptors
    /// compared (non-zero exit on anything unexpected).
    Soak(soak::SoakArgs),
    /// Run every cargo-fuzz target in fuzz/ for a while (nightly; installs cargo-fuzz
    /// when missing), seeded from the real inputs; a crash fails.
    Fuzz(fuzz::FuzzArgs),
    /// Check the one-way flow: crate layers, each crate's module layers, no import
    /// circles anywhere, no plugin depending on the engine (also run by `test`).
    Layering,
    /// Write sparse GGUF files with the paper's model shapes (for `prima plan`).
    SynthModel {
        /// Only the models whose tag contains this text.
        #[arg(long, value_name = "TEXT")]
        only: Option<String>,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<u8> {
    let layout = Layout::discover()?;
    match cli.command {
        Task::Setup => {
            build_tools::ensure_for_cargo(&layout)?;
            vulkan::ensure_lavapipe();
            fetch_models::run(&layout)?;
        }
        Task::FetchModels => fetch_models::run(&layout)?,
        Task::Reference {
            fixtures_only,
            only,
        } => reference::run(&layout, fixtures_only, only.as_deref())?,
        Task::TestModels => test_models::run(&layout)?,
        Task::O200kVocab { fixtures } => {
            o200k_vocab::ensure(&layout)?;
            if fixtures {
                let llama = llama_cpp::LlamaCpp::new(&layout);
                llama.require_built()?;
                o200k_vocab::fixtures(&layout, &llama)?;
            }
        }
        Task::Bench(args) => bench::run(&layout, &args)?,
        Task::BenchServe(args) => bench_serve::run(&layout, &args)?,
        Task::RingBench(args) => ring_bench::run(&layout, &args)?,
        Task::SpecBench(args) => spec_bench::run(&layout, &args)?,
        Task::BenchModels(args) => bench_models::make(&layout, &args)?,
        Task::Homelab(command) => return homelab::run(&layout, command),
        Task::CrossCheck(args) => {
            let code = cross_check::run(&layout, &args)?;
            return Ok(u8::try_from(code).unwrap_or(1));
        }
        Task::Layering => layering::run(&layout)?,
        Task::SynthModel { only } => synth_model::run(&layout, only.as_deref())?,
        Task::Dist(args) => dist::run(&layout, &args)?,
        Task::Soak(args) => return soak::run(&layout, &args),
        Task::Fuzz(args) => fuzz::run(&layout, &args)?,
        Task::Test => {
            let code = test::run(&layout)?;
            return Ok(u8::try_from(code).unwrap_or(1));
        }
    }
    Ok(0)
}

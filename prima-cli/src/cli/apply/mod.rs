//! `prima apply MANIFEST`: validate the manifest, start the local nodes it owns, connect
//! the remote ones, plan the layer windows, print the plan, launch the ring, and then run
//! one prompt (`--prompt`) or serve until Ctrl-C — stopping the nodes it started.
//!
//! - `cluster.rs`: the controller's steps, from the manifest to a planned `Cluster`;
//! - `prompt.rs`: the `--prompt` path; `serve.rs`: the server path;
//! - `report.rs`: what a person reads on stderr while the cluster comes up.

mod cluster;
mod prompt;
mod report;

pub use report::ago;
mod serve;

use std::path::PathBuf;

use prima_cluster::prp::micro_batch::MicroBatches;

use cluster::{bring_up, Setup};

#[derive(clap::Args, Debug)]
pub struct ApplyArgs {
    /// The cluster manifest (default: the embedded manifests/home.toml).
    manifest: Option<PathBuf>,
    /// Run this GGUF file on every local device, instead of the manifest's `[model]`
    /// (e.g. from an unpacked release, whose home.toml expects `models/` beside it).
    #[arg(short = 'm', long, value_name = "PATH")]
    model: Option<PathBuf>,
    /// Like --model, a model from a Hugging Face repository (cached, else pulled).
    #[arg(long = "hf-repo", visible_alias = "hf", value_name = "REPO[:QUANT]",
          conflicts_with = "model", value_parser = super::pull::parse_model)]
    hf_repo: Option<crate::hub::name::ModelRef>,
    /// Stop after printing the plan.
    #[arg(long)]
    dry_run: bool,
    /// With --dry-run, print the plan as JSON.
    #[arg(long, requires = "dry_run")]
    json: bool,
    /// Run one generation from this prompt, print it with TTFT/TPOT, and exit.
    #[arg(short = 'p', long)]
    prompt: Option<String>,
    /// Wrap --prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Sampling for --prompt, with `prima run`'s defaults.
    #[command(flatten)]
    sampling: crate::cli::sampling::SamplingArgs,
    /// Print the plan with the paper's symbols, and per-device timing after --prompt.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// Leave the local nodes running on exit; the next apply of this manifest reuses
    /// those whose configuration is unchanged.
    #[arg(long)]
    keep_nodes: bool,
    /// After --prompt, write every device's per-pass statistics to this file as JSON.
    #[arg(long, requires = "prompt")]
    stats_json: Option<PathBuf>,
    /// A draft model for --prompt (speculative decoding on the head), instead of the
    /// manifest's `model.draft`.
    #[arg(long, value_name = "MODEL")]
    draft: Option<PathBuf>,
    /// Tokens the draft proposes per round at most (default: `model.draft_max`, else 8).
    #[arg(long)]
    draft_max: Option<usize>,
    /// Requests served at once, each with its own KV cache of policy.ctx positions
    /// (default: the manifest's [server] parallel, else 1).
    #[arg(long, value_parser = super::parse_parallel)]
    parallel: Option<usize>,
    /// Micro-batches the head keeps in the ring at once when several requests are served:
    /// N ≥ 1, or `tuned` to measure (default: the manifest's policy.micro_batches, else
    /// PRIMA_MICRO_BATCHES, else 1).
    #[arg(long, value_name = "N|tuned", value_parser = MicroBatches::parse)]
    micro_batches: Option<MicroBatches>,
}

pub fn run(args: ApplyArgs) -> anyhow::Result<()> {
    let setup = Setup {
        manifest: args.manifest,
        model: match &args.hf_repo {
            Some(m) => Some(crate::hub::resolve(m)?),
            None => args.model,
        },
        draft: args.draft,
        draft_max: args.draft_max,
        // One prompt needs one slot; a server keeps `parallel` on every device.
        parallel: match args.prompt {
            Some(_) => Some(1),
            None => args.parallel,
        },
        micro_batches: args.micro_batches,
        keep_nodes: args.keep_nodes,
        dry_run: args.dry_run,
        json: args.json,
        verbose: args.verbose,
    };
    let Some(cluster) = bring_up(&setup)? else {
        return Ok(());
    };
    let ring = cluster.launch()?;
    match args.prompt {
        Some(text) => prompt::run(
            &cluster,
            ring,
            &prompt::Prompt {
                text,
                chat: args.chat,
                sampling: args.sampling,
                verbose: args.verbose,
                stats_json: args.stats_json,
            },
        ),
        None => serve::run(&cluster, ring),
    }
}

/// `prima serve --manifest`: the cluster `manifest` declares, serving the API as
/// `prima apply` does without `--prompt`.
pub fn serve_manifest(manifest: PathBuf) -> anyhow::Result<()> {
    let setup = Setup {
        manifest: Some(manifest),
        ..Setup::default()
    };
    let Some(cluster) = bring_up(&setup)? else {
        return Ok(());
    };
    let ring = cluster.launch()?;
    serve::run(&cluster, ring)
}

//! Command-line front end: parses arguments, runs one command, and turns errors into
//! one-line messages with a non-zero exit code.

mod apply;
mod bench;
mod chat;
mod discover;
mod engine;
mod interactive;
mod kept;
mod keygen;
mod node;
mod perplexity;
mod plan;
mod plugins;
mod profile;
mod pull;
mod relay;
mod run;
mod sampling;
mod serve;
mod tokenize;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use prima_cluster::manifest::MAX_PARALLEL;

#[derive(Parser)]
#[command(
    name = "prima",
    version,
    about = "Run large language models across the devices you own"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt on this device (-i: chat in the terminal).
    Run(run::RunArgs),
    /// Print the token ids of a text as a JSON array.
    Tokenize(tokenize::TokenizeArgs),
    /// List the plugins found in the plugin directories.
    Plugins,
    /// Measure prompt-processing and generation throughput (like llama-bench).
    Bench(bench::BenchArgs),
    /// Perplexity of a text, or KL divergence from saved logits (like llama-perplexity).
    Perplexity(perplexity::PerplexityArgs),
    /// Run as a ring device: serve layer windows to a head.
    Node(node::NodeArgs),
    /// Start the cluster a manifest declares: profile, plan, launch the ring, serve.
    Apply(apply::ApplyArgs),
    /// Forward ring connections between two networks (a relay device's only job).
    Relay(relay::RelayArgs),
    /// Assign layers to devices (Halda, or the MemSched/PerfSched baselines).
    Plan(plan::PlanArgs),
    /// Measure this device for planning (cached per device and model).
    Profile(profile::ProfileArgs),
    /// Serve an OpenAI-compatible API (chat and completions) from this device.
    Serve(serve::ServeArgs),
    /// Chat in the terminal with a running server; with -m MODEL, with a model here
    /// (`prima run -i`).
    Chat(chat::ChatArgs),
    /// List the nodes announcing themselves on the LAN (`prima node --advertise`).
    Discover(discover::DiscoverArgs),
    /// Write a new cluster key: the secret that admits a device to the ring.
    Keygen(keygen::KeygenArgs),
    /// Download a GGUF model from a Hugging Face repository into the cache (checked
    /// against the repository's SHA-256, resumable); prints its path.
    Pull(pull::PullArgs),
    /// List the models in the cache.
    List(pull::ListArgs),
    /// Remove a model from the cache.
    Rm(pull::RmArgs),
    /// List the local nodes `prima apply --keep-nodes` left running.
    Status,
    /// Stop the nodes `prima apply --keep-nodes` left running (of one manifest, or all).
    Stop(kept::StopArgs),
}

pub fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(code) = prima_core::plugin::answer_probe(&args) {
        return ExitCode::from(code);
    }
    prima_core::plugin::probe_in_child_processes();
    let args = chat::local_alias(pull::hf_alias(args.into_iter()).collect());
    let cli = Cli::parse_from(engine::ngl_alias(args.into_iter()));
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("PRIMA_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Tokenize(args) => tokenize::run(args),
        Command::Plugins => plugins::run(),
        Command::Bench(args) => bench::run(args),
        Command::Perplexity(args) => perplexity::run(args),
        Command::Node(args) => node::run(args),
        Command::Apply(args) => apply::run(args),
        Command::Relay(args) => relay::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Profile(args) => profile::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Chat(args) => chat::run(args),
        Command::Discover(args) => discover::run(args),
        Command::Keygen(args) => keygen::run(args),
        Command::Pull(args) => pull::run_pull(args),
        Command::List(args) => pull::run_list(args),
        Command::Rm(args) => pull::run_rm(args),
        Command::Status => kept::status(),
        Command::Stop(args) => kept::stop(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The chain of causes, outermost first, on one line; a cause whose text the message
/// already contains (typed errors often embed their source) is not repeated.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line.replace('\n', " ")
}

/// A spinner on stderr while a step runs (cleared with `finish_and_clear`).
pub fn spinner(msg: String) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    bar.set_message(msg);
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

/// `--parallel`: 1 to [`MAX_PARALLEL`] slots.
pub fn parse_parallel(s: &str) -> Result<usize, String> {
    let n: usize = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number of slots"))?;
    if !(1..=MAX_PARALLEL).contains(&n) {
        return Err(format!("must be between 1 and {MAX_PARALLEL}"));
    }
    Ok(n)
}

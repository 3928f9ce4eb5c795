//! `prima serve`: the OpenAI-compatible server on this device alone (the ring head serves
//! the same API through `prima apply`).

use anyhow::Context;
use prima_core::prp::budget::MemBudget;
use prima_core::server::serve_blocking;

use super::engine::{Engine, EngineArgs, Streaming};

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// Address to listen on (port 0: any free port; the address is printed on stderr).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Context length in tokens, shared by the conversation and the reply.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    ctx_size: usize,
    /// Prompt tokens processed per batch.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    batch_size: usize,
    /// Bytes of weights to keep in memory (e.g. 1G), `auto` or `none`; layers beyond it
    /// are streamed from disk each token (see `prima run --mem-budget`).
    #[arg(long, default_value = "auto", value_parser = MemBudget::parse)]
    mem_budget: MemBudget,
    /// The model's name in `/v1/models` and in responses (default: the file name).
    #[arg(long)]
    alias: Option<String>,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let engine = Engine::open(&args.engine)?;
    let n_ctx = args.ctx_size.min(engine.model.hparams().n_ctx_train.max(1));
    let mut session = engine.local_session(
        args.mem_budget,
        n_ctx,
        args.batch_size,
        Streaming::default(),
    )?;
    let name = args
        .alias
        .clone()
        .unwrap_or_else(|| model_name(&args.engine.model));
    let listener = std::net::TcpListener::bind(&args.listen)
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    eprintln!(
        "serve: listening on http://{addr} (model {name}, context {n_ctx} tokens, {})",
        engine.backend.backend.describe()
    );
    serve_blocking(
        &mut session,
        &engine.tokenizer,
        &name,
        listener,
        None,
        |_| {},
    )
    .context("serving")?;
    eprintln!("serve: stopped");
    Ok(())
}

/// The file name without `.gguf`.
pub fn model_name(path: &std::path::Path) -> String {
    let file = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    file.strip_suffix(".gguf").unwrap_or(&file).to_string()
}

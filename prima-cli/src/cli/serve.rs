//! `prima serve`: the OpenAI-compatible server on this device alone, or (`--manifest`)
//! on the cluster a manifest declares, brought up as `prima apply` brings it up.

use anyhow::Context;
use prima_cluster::prp::budget::MemBudget;
use prima_server::{
    serve_blocking, serve_blocking_batch, serve_blocking_speculative, Drafting, SchedulerOptions,
};

use super::engine::{Engine, EngineArgs, Streaming};
use super::run::{DraftArgs, DraftModel};

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["model", "hf_repo", "manifest"])))]
pub struct ServeArgs {
    #[command(flatten)]
    engine: Option<EngineArgs>,
    /// Serve on the cluster this manifest declares (its local nodes started, planned and
    /// launched as by `prima apply`); its `[server]` and `[policy]` give the address,
    /// slots and context, so this device's flags do not apply.
    #[arg(long, value_name = "PATH", conflicts_with_all = [
        "listen", "ctx_size", "parallel", "batch_size", "mem_budget", "alias", "draft",
        "threads", "backend", "gpu_layers", "gpu_backend", "host", "port", "chat_template", "hf_repo",
    ])]
    manifest: Option<std::path::PathBuf>,
    /// Address to listen on (port 0: any free port; the address is printed on stderr).
    #[arg(long, default_value = "127.0.0.1:8080", conflicts_with_all = ["host", "port"])]
    listen: String,
    /// The host part of --listen, as llama-server takes it (default 127.0.0.1).
    #[arg(long)]
    host: Option<String>,
    /// The port part of --listen, as llama-server takes it (default 8080).
    #[arg(long)]
    port: Option<u16>,
    /// A chat template in place of the model's: a built-in name (chatml, llama3, gemma)
    /// or a Jinja file. A file with none uses its architecture's built-in one.
    #[arg(long, value_name = "NAME|FILE")]
    chat_template: Option<String>,
    /// Context length in tokens, shared by the conversation and the reply (per slot).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    ctx_size: usize,
    /// Requests generated at once, each in a slot with its own KV cache of --ctx-size
    /// positions, batched together every step (llama.cpp's -np); the others queue.
    #[arg(long, default_value_t = 1, value_parser = super::parse_parallel)]
    parallel: usize,
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
    /// Speculative decoding: with --parallel N, every slot drafts and one batch verifies
    /// all the slots' drafts.
    #[command(flatten)]
    draft: DraftArgs,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let engine_args = match (&args.manifest, &args.engine) {
        (Some(manifest), _) => return super::apply::serve_manifest(manifest.clone()),
        (None, Some(engine)) => engine,
        (None, None) => {
            anyhow::bail!("serve needs --model PATH, -hf REPO[:QUANT] or --manifest PATH")
        }
    };
    check_draft_args(&args.draft, args.batch_size)?;
    let mut engine = Engine::open(engine_args)?;
    if let Some(t) = &args.chat_template {
        engine.use_chat_template(t)?;
    }
    let draft = match &args.draft.draft {
        Some(path) => Some(DraftModel::open(path, args.draft.options(), &engine)?),
        None => None,
    };
    let n_ctx = args.ctx_size.min(engine.model.hparams().n_ctx_train.max(1));
    // The draft's weights and its KV cache per slot are kept out of the target's budget.
    let reserved = draft
        .as_ref()
        .map_or(0, |d| d.memory_bytes(n_ctx, args.batch_size, args.parallel));
    let mut session = engine.local_slots_beside(
        args.mem_budget,
        n_ctx,
        args.batch_size,
        args.parallel,
        Streaming::default(),
        reserved,
    )?;
    let name = args
        .alias
        .clone()
        .unwrap_or_else(|| model_name(&engine.path));
    let listen = match (&args.host, args.port) {
        (None, None) => args.listen.clone(),
        (host, port) => format!(
            "{}:{}",
            host.as_deref().unwrap_or("127.0.0.1"),
            port.unwrap_or(8080)
        ),
    };
    let listener = std::net::TcpListener::bind(&listen)
        .with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener.local_addr()?;
    let slots = match args.parallel {
        1 => String::new(),
        n => format!(" in each of {n} slots"),
    };
    eprintln!(
        "serve: listening on http://{addr} (model {name}, context {n_ctx} tokens{slots}, {})",
        engine.describe_backends()
    );
    prima_server::board::show_alone(
        &name,
        &prima_host::hostname(),
        &engine.describe_backends(),
        engine.model.hparams().n_layers,
        match args.mem_budget {
            MemBudget::Bytes(b) => Some(b),
            MemBudget::Auto | MemBudget::Off => None,
        },
    );
    if let Some(draft) = &draft {
        let mut draft_session = draft.session(&engine, n_ctx, args.batch_size, args.parallel)?;
        let model = Drafting {
            target: &mut session,
            draft: &mut draft_session,
            options: draft.options,
        };
        eprintln!("serve: drafting with {}", draft.path.display());
        serve_blocking_speculative(
            model,
            &engine.tokenizer,
            &name,
            listener,
            None,
            SchedulerOptions::default(),
            |_| {},
        )
    } else if args.parallel == 1 {
        serve_blocking(
            &mut session,
            &engine.tokenizer,
            &name,
            listener,
            None,
            |_| {},
        )
    } else {
        serve_blocking_batch(
            &mut session,
            &engine.tokenizer,
            &name,
            listener,
            None,
            SchedulerOptions::default(),
            |_| {},
        )
    }
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

/// Refuses draft settings that cannot work, before any model loads: a verification
/// batch holds a slot's last token and its drafts, so `--draft-max` must leave room in a
/// batch of `n_batch`. (With several slots decoding, each drafts at most its share of a
/// batch.)
pub fn check_draft_args(draft: &DraftArgs, n_batch: usize) -> anyhow::Result<()> {
    if draft.draft.is_none() {
        return Ok(());
    }
    anyhow::ensure!(
        (0.0..=1.0).contains(&draft.draft_p_min),
        "--draft-p-min {} is not a probability (0 to 1)",
        draft.draft_p_min
    );
    anyhow::ensure!(
        draft.draft_max >= 1,
        "--draft-max 0 drafts nothing: give at least 1, or no --draft"
    );
    anyhow::ensure!(
        draft.draft_max < n_batch,
        "--draft-max {} needs batches of {} tokens (the last token and its drafts), but \
         --batch-size is {n_batch}",
        draft.draft_max,
        draft.draft_max.saturating_add(1)
    );
    Ok(())
}

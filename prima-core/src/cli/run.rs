//! `prima run`: generate from a prompt on this device, streaming the continuation to
//! stdout and the timings to stderr.

use std::io::Write;
use std::ops::ControlFlow;

use anyhow::Context;
use prima_core::chat::{render_chat, ChatMessage};
use prima_core::generate::{generate, GenerateOptions};
use prima_core::model::Session;
use prima_core::sampler::{Sampler, SamplerConfig};

use super::engine::{Engine, EngineArgs};

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// The prompt.
    #[arg(short = 'p', long)]
    prompt: String,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    n_predict: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    temp: f32,
    /// Keep the K most likely tokens (0: all).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P (1: all).
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Drop tokens less likely than P × the most likely one (0: off).
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Penalise tokens seen in the last --repeat-last-n tokens (1: off).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    #[arg(long, default_value_t = 64)]
    repeat_last_n: usize,
    /// Subtract from the logit of every token already seen (0: off).
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    /// RNG seed (default: random); the same seed gives the same text.
    #[arg(long)]
    seed: Option<u64>,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Context length in tokens.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    ctx_size: usize,
    /// Prompt tokens processed per batch.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    batch_size: usize,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    ignore_eos: bool,
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let engine = Engine::open(&args.engine)?;
    let tok = &engine.tokenizer;

    let text = if args.chat {
        let template = tok.chat_template().with_context(|| {
            format!(
                "{}: --chat needs tokenizer.chat_template, which the model lacks",
                args.engine.model.display()
            )
        })?;
        let messages = [ChatMessage {
            role: "user".into(),
            content: args.prompt.clone(),
        }];
        render_chat(template, &messages, true, tok.bos_text(), tok.eos_text())?
    } else {
        args.prompt.clone()
    };
    // A chat template writes its own BOS text; parse it as the special token.
    let add_bos = tok.add_bos_default()
        && !(args.chat && text.starts_with(tok.bos_text()) && !tok.bos_text().is_empty());
    let prompt = tok.encode(&text, add_bos, true);
    anyhow::ensure!(!prompt.is_empty(), "the prompt is empty after tokenization");

    let n_ctx = args.ctx_size.min(engine.model.hparams().n_ctx_train.max(1));
    anyhow::ensure!(
        prompt.len() < n_ctx,
        "the prompt has {} tokens but the context holds {n_ctx} (raise --ctx-size)",
        prompt.len()
    );
    let mut session = Session::new(
        &engine.model,
        &engine.backend.backend,
        n_ctx,
        args.batch_size,
    )?;
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    });
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        repeat_last_n: args.repeat_last_n,
        presence_penalty: args.presence_penalty,
        frequency_penalty: 0.0,
        seed,
    });

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut write_error = None;
    let options = GenerateOptions {
        max_tokens: args.n_predict,
        ignore_eos: args.ignore_eos,
    };
    let (_, stats) = generate(&mut session, tok, &mut sampler, &prompt, options, |piece| {
        match out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                // A closed pipe (e.g. `| head`) ends generation quietly.
                write_error = Some(e);
                ControlFlow::Break(())
            }
        }
    })?;
    if write_error.is_none() {
        let _ = writeln!(out);
    }
    drop(out);

    eprintln!(
        "prompt: {} tokens, {:.1} tok/s | TTFT {:.1} ms | generated {} tokens, TPOT {:.2} ms ({:.1} tok/s) | seed {seed} | {}",
        stats.prompt_tokens,
        stats.prompt_tokens_per_s(),
        stats.time_to_first_token.as_secs_f64() * 1e3,
        stats.generated_tokens,
        stats.tpot_ms(),
        if stats.tpot_ms() > 0.0 { 1e3 / stats.tpot_ms() } else { 0.0 },
        engine.backend.backend.describe()
    );
    Ok(())
}

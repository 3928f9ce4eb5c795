//! `prima run`: generate from a prompt on this device, streaming the continuation to
//! stdout and the timings to stderr.

use std::io::Write;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use prima_abi::transport::TransportConfig;
use prima_cluster::controller::{connect, given_layout, ring_options, LaunchSettings, RingPolicy};
use prima_cluster::prp::alone::LocalSession;
use prima_cluster::prp::protocol::{PassStats, ReleaseMethod, ReleasePolicy, WireType};
use prima_cluster::prp::{DeviceStats, NextRoute, RingGpus, RingHead, RingOptions};
use prima_core::generate::{
    generate, Forward, GenerateOptions, GenerationStats, RowLogits, StopReason,
};
use prima_core::model::{Model, Session};
use prima_core::plugin::{load_transport, LoadedTransport};
use prima_core::sampler::Sampler;
use prima_core::speculative::{
    check_vocabularies, generate_speculative, DraftOptions, DraftStats, SpeculativeError,
};
use prima_core::tokenizer::Tokenizer;

use super::engine::{Engine, EngineArgs, Streaming};
use super::interactive::{chat_prompt, chat_template, encode_prompt};
use super::keygen::KeyArgs;
use super::sampling::SamplingArgs;
use prima_cluster::controller::MAX_FRAME_BYTES;
use prima_cluster::prp::budget::MemBudget;

/// Running the layers on a ring of devices instead of this one alone.
#[derive(clap::Args, Debug)]
pub struct RingArgs {
    /// Addresses of the other ring devices (`prima node`), in ring order after this head.
    #[arg(long, value_delimiter = ',')]
    ring: Vec<String>,
    /// Window size w_m of every device, the head's first (e.g. 10,10,10).
    #[arg(long, value_delimiter = ',', requires = "ring")]
    windows: Vec<usize>,
    /// Where the head accepts the last device's data connection (default: every
    /// address, a free port).
    #[arg(long, value_name = "ADDR", requires = "ring")]
    listen: Option<String>,
    /// How each node reaches the device after it (the last node: the head), one per
    /// node in ring order, where that is not its --ring address (a forwarded port, the
    /// head's --listen seen from elsewhere); `-` keeps it.
    #[arg(long, value_delimiter = ',', value_name = "ADDR", requires = "ring")]
    next_hop: Vec<String>,
    /// How the links to the ring devices are protected.
    #[command(flatten)]
    key: KeyArgs,
    /// Read each device's next streamed window ahead while others compute (alone: the
    /// streamed chunk after next while this one is computed).
    #[arg(long, value_enum, default_value = "on")]
    prefetch: OnOff,
    /// Release a streamed window (alone: chunk) right after use (mru) or leave eviction
    /// to the kernel.
    #[arg(long, value_enum, default_value = "mru")]
    release: ReleaseArg,
    /// How a release is asked of the kernel.
    #[arg(long, value_enum, default_value = "pageout")]
    release_method: ReleaseMethodArg,
    /// A mixture of experts that does not fit keeps its most used experts resident and
    /// streams the others per use (on), or streams whole layers (off).
    #[arg(long, value_enum, default_value = "on")]
    expert_residency: OnOff,
    /// With expert residency, guess each next layer's experts (its router on this
    /// layer's rows) and read the streamed ones ahead; prints how often the guess was right.
    #[arg(long, value_enum, default_value = "off")]
    expert_predict: OnOff,
    /// Activation format between devices (f16 halves the bytes but rounds).
    #[arg(long, value_enum, default_value = "f32")]
    wire: WireArg,
    /// Bytes of weights to keep in memory (e.g. 1G), `auto` or `none`. Alone, layers
    /// beyond it are streamed from disk each token; `auto` is what this device has
    /// available (inside its cgroup limits) less room for the KV cache, buffers and the
    /// process. On a ring, the head's budget for its own windows (`auto` also keeps room for
    /// the output head).
    #[arg(long, default_value = "auto", value_parser = MemBudget::parse)]
    mem_budget: MemBudget,
    /// Transport plugin (default: the first one found).
    #[arg(long)]
    transport: Option<String>,
    /// Print per-device timing (compute, send, wait, page faults, disk reads).
    #[arg(short = 'v', long)]
    verbose: bool,
    /// Write the timing of every device and pass as JSON to this file.
    #[arg(long)]
    stats_json: Option<std::path::PathBuf>,
}

impl RingArgs {
    /// Whether the layers run round a ring (`--ring`) rather than on this device alone.
    pub(super) fn is_ring(&self) -> bool {
        !self.ring.is_empty()
    }

    fn streaming(&self) -> Streaming {
        Streaming {
            prefetch: matches!(self.prefetch, OnOff::On),
            release: self.release_policy(),
            method: self.release_method(),
            experts: matches!(self.expert_residency, OnOff::On),
            expert_predict: matches!(self.expert_predict, OnOff::On),
        }
    }

    fn release_policy(&self) -> ReleasePolicy {
        match self.release {
            ReleaseArg::Mru => ReleasePolicy::Mru,
            ReleaseArg::None => ReleasePolicy::None,
        }
    }

    fn release_method(&self) -> ReleaseMethod {
        match self.release_method {
            ReleaseMethodArg::Pageout => ReleaseMethod::Pageout,
            ReleaseMethodArg::Cold => ReleaseMethod::Cold,
            ReleaseMethodArg::Dontneed => ReleaseMethod::Dontneed,
        }
    }

    /// This device alone, streaming what does not fit its memory budget less `reserved`
    /// bytes the process holds beside the model (a draft and its KV cache).
    pub(super) fn local_session<'e>(
        &self,
        engine: &'e Engine,
        n_ctx: usize,
        n_batch: usize,
        reserved: u64,
    ) -> anyhow::Result<LocalSession<'e>> {
        engine.local_slots_beside(
            self.mem_budget,
            n_ctx,
            n_batch,
            1,
            self.streaming(),
            reserved,
        )
    }

    /// The transport plugin the ring runs over (kept alive while the ring is).
    pub(super) fn transport(&self) -> anyhow::Result<LoadedTransport> {
        Ok(load_transport(
            self.transport.as_deref(),
            TransportConfig {
                max_frame_bytes: MAX_FRAME_BYTES,
            },
        )?)
    }

    /// Connects the ring this device heads, its window planned in its memory budget less
    /// `reserved` bytes the process holds beside the model (a draft and its KV cache).
    pub(super) fn connect<'e>(
        &self,
        engine: &'e Engine,
        transport: &LoadedTransport,
        n_ctx: usize,
        n_batch: usize,
        reserved: u64,
    ) -> anyhow::Result<RingHead<'e>> {
        anyhow::ensure!(
            !self.windows.is_empty(),
            "--ring needs --windows: one window size per device, the head's first"
        );
        let policy = RingPolicy {
            n_batch,
            n_slots: 1,
            prefetch: matches!(self.prefetch, OnOff::On),
            release: self.release_policy(),
            release_method: self.release_method(),
            wire: match self.wire {
                WireArg::F32 => WireType::F32,
                WireArg::F16 => WireType::F16,
            },
            mem_budget: self.mem_budget,
            listen: self.listen.clone(),
            output_top_k: 0,
        };
        let next_routes = self
            .next_hop
            .iter()
            .map(|a| match a.as_str() {
                "-" => NextRoute::AsHead,
                _ => NextRoute::Addr(a.clone()),
            })
            .collect();
        let layout = given_layout(&self.ring, &self.windows, next_routes);
        let options = ring_options(
            &policy,
            &layout,
            LaunchSettings {
                n_ctx,
                micro_batches: RingOptions::default().micro_batches,
                head_reserved: reserved,
                // Perplexity and a draft's verification take rows' logits after the fact.
                row_logits: true,
                security: self.key.security()?,
            },
        );
        // The head's own n_m (--gpu-layers); each node takes its own.
        let gpus = RingGpus {
            head: engine.gpu.as_ref().map(|g| &g.backend),
            n: engine
                .gpu_layers
                .map(|n| n.min(self.windows[0]))
                .into_iter()
                .collect(),
        };
        Ok(connect(
            &engine.model,
            &engine.backend.backend,
            &transport.transport,
            &layout,
            &gpus,
            &options,
        )?)
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum OnOff {
    On,
    Off,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum ReleaseArg {
    Mru,
    None,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum ReleaseMethodArg {
    Pageout,
    Cold,
    Dontneed,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum WireArg {
    F32,
    F16,
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// The prompt (with -i: the first message).
    #[arg(short = 'p', long, required_unless_present_any = ["file", "interactive"])]
    prompt: Option<String>,
    /// Read the prompt from this file.
    #[arg(short = 'f', long, value_name = "FILE", conflicts_with = "prompt")]
    file: Option<std::path::PathBuf>,
    /// Chat in the terminal: each line of stdin is a message, each reply streamed;
    /// /help, /reset and /bye are handled here, never sent to the model.
    #[arg(short = 'i', long, conflicts_with_all = ["file", "draft"])]
    interactive: bool,
    /// A system message that opens the conversation (`-sys` as in llama.cpp); implies --chat.
    #[arg(long = "system-prompt", alias = "system", value_name = "TEXT")]
    system_prompt: Option<String>,
    /// A chat template in place of the model's: a built-in name (chatml, llama3, gemma)
    /// or a Jinja file. A file with none uses its architecture's built-in one.
    #[arg(long, value_name = "NAME|FILE")]
    chat_template: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
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
    #[command(flatten)]
    draft: DraftArgs,
    #[command(flatten)]
    ring: RingArgs,
}

/// Speculative decoding: a small model with the target's vocabulary drafts on this device.
#[derive(clap::Args, Debug, Clone)]
pub struct DraftArgs {
    /// A draft model (GGUF) with the same vocabulary: it proposes tokens on this device
    /// and the model (or the ring) checks them all in one evaluation.
    #[arg(long, value_name = "MODEL")]
    pub draft: Option<std::path::PathBuf>,
    /// Tokens the draft proposes per round at most.
    #[arg(long, default_value_t = DraftOptions::default().max, requires = "draft")]
    pub draft_max: usize,
    /// Stop drafting when the draft's most likely token is less likely than this (0:
    /// always draft --draft-max).
    #[arg(long, default_value_t = DraftOptions::default().p_min, requires = "draft")]
    pub draft_p_min: f32,
}

impl DraftArgs {
    pub fn options(&self) -> DraftOptions {
        DraftOptions {
            max: self.draft_max,
            p_min: self.draft_p_min,
        }
    }
}

/// A draft model opened for a target, its vocabulary checked.
pub struct DraftModel {
    pub path: std::path::PathBuf,
    pub model: Model,
    pub options: DraftOptions,
}

impl DraftModel {
    /// Opens `path` and refuses it unless its vocabulary is `engine`'s.
    pub fn open(
        path: &std::path::Path,
        options: DraftOptions,
        engine: &Engine,
    ) -> anyhow::Result<DraftModel> {
        let model = Model::load(path)?;
        let tokenizer = Tokenizer::from_gguf(model.gguf())
            .with_context(|| format!("{}: reading the tokenizer", path.display()))?;
        check_vocabularies(
            &engine.tokenizer,
            engine.model.hparams().n_vocab,
            &tokenizer,
            model.hparams().n_vocab,
        )
        .with_context(|| {
            format!(
                "--draft {} cannot draft for {}",
                path.display(),
                engine.path.display()
            )
        })?;
        Ok(DraftModel {
            path: path.to_path_buf(),
            model,
            options,
        })
    }

    /// Bytes the draft holds on the head beside the target: see `prima_cluster::prp::budget::draft_memory`.
    pub fn memory_bytes(&self, n_ctx: usize, n_batch: usize, n_slots: usize) -> u64 {
        prima_cluster::prp::budget::draft_memory(&self.model, n_ctx, n_batch, n_slots)
    }

    /// A session of the draft on `engine`'s backend, with a slot (a KV cache) for each of
    /// the target's `n_slots`.
    pub fn session<'d>(
        &'d self,
        engine: &'d Engine,
        n_ctx: usize,
        n_batch: usize,
        n_slots: usize,
    ) -> anyhow::Result<Session<'d>> {
        let n_ctx = n_ctx.min(self.model.hparams().n_ctx_train.max(1));
        Session::with_slots(
            &self.model,
            &engine.backend.backend,
            n_ctx,
            n_batch,
            n_slots,
        )
        .with_context(|| format!("{}: the draft model's session", self.path.display()))
    }
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let distributed = args.ring.is_ring();
    let mut engine = Engine::open(&args.engine)?;
    if let Some(t) = &args.chat_template {
        engine.use_chat_template(t)?;
    }
    let engine = engine;
    let tok = &engine.tokenizer;
    let n_ctx = args.ctx_size.min(engine.model.hparams().n_ctx_train.max(1));
    if args.interactive {
        // Checked before any weight is read.
        chat_template(tok, &engine.path)?;
    }

    let chat = args.chat || args.system_prompt.is_some();
    let prompt = if args.interactive {
        Vec::new()
    } else {
        let given = match (&args.prompt, &args.file) {
            (Some(p), _) => p.clone(),
            (None, Some(file)) => std::fs::read_to_string(file)
                .with_context(|| format!("-f {}: cannot read the prompt", file.display()))?,
            (None, None) => anyhow::bail!("give a prompt: -p TEXT, -f FILE, or -i to chat"),
        };
        let text = if chat {
            chat_prompt(tok, &engine.path, args.system_prompt.as_deref(), &given)?
        } else {
            given
        };
        let prompt = encode_prompt(tok, &text, chat);
        anyhow::ensure!(!prompt.is_empty(), "the prompt is empty after tokenization");
        anyhow::ensure!(
            prompt.len() < n_ctx,
            "the prompt has {} tokens but the context holds {n_ctx} (raise --ctx-size)",
            prompt.len()
        );
        prompt
    };
    let seed = args.sampling.seed();
    let mut sampler = Sampler::new(args.sampling.config(seed));
    let options = GenerateOptions {
        max_tokens: args.sampling.max_tokens(),
        ignore_eos: args.ignore_eos,
    };
    let backend = engine.describe_backends();
    let ring = &args.ring;
    let draft = match &args.draft.draft {
        Some(path) => Some(DraftModel::open(path, args.draft.options(), &engine)?),
        None => None,
    };
    let mut draft_session = match &draft {
        Some(d) => Some(d.session(&engine, n_ctx, args.batch_size, 1)?),
        None => None,
    };
    // The draft's weights and KV cache are kept out of the target's memory budget.
    let reserved = draft
        .as_ref()
        .map_or(0, |d| d.memory_bytes(n_ctx, args.batch_size, 1));
    // Ctrl-C ends the generation; the figures so far are printed as at its end.
    let cancel = Arc::new(AtomicBool::new(false));
    if !args.interactive {
        let flag = cancel.clone();
        let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
    }
    if !distributed {
        let mut session = ring.local_session(&engine, n_ctx, args.batch_size, reserved)?;
        if args.interactive {
            return super::interactive::chat(
                &mut session,
                &engine,
                &mut sampler,
                &super::interactive::Conversation {
                    system: args.system_prompt.clone(),
                    first: args.prompt.clone(),
                    max_tokens: args.sampling.max_tokens(),
                    model: engine.path.clone(),
                },
            );
        }
        let (stats, draft_stats) = stream_maybe_draft(
            &mut session,
            draft_session
                .as_mut()
                .zip(draft.as_ref().map(|d| d.options)),
            tok,
            &mut sampler,
            &prompt,
            options,
            &cancel,
        )?;
        print_summary(&stats, seed, &backend);
        if let Some(d) = &draft_stats {
            print_draft_summary(d, &stats);
        }
        if let Some(e) = session.expert_stats() {
            eprintln!("{}", e.describe());
        }
        return Ok(());
    }

    let transport = ring.transport()?;
    let mut head = ring.connect(&engine, &transport, n_ctx, args.batch_size, reserved)?;
    if args.interactive {
        let result = super::interactive::chat(
            &mut head,
            &engine,
            &mut sampler,
            &super::interactive::Conversation {
                system: args.system_prompt.clone(),
                first: args.prompt.clone(),
                max_tokens: args.sampling.max_tokens(),
                model: engine.path.clone(),
            },
        );
        head.shutdown(false);
        return result;
    }
    let (stats, draft_stats) = stream_maybe_draft(
        &mut head,
        draft_session
            .as_mut()
            .zip(draft.as_ref().map(|d| d.options)),
        tok,
        &mut sampler,
        &prompt,
        options,
        &cancel,
    )?;
    print_summary(
        &stats,
        seed,
        &format!(
            "{backend} | ring of {} devices, k = {}",
            ring.windows.len(),
            head.rounds()
        ),
    );
    if let Some(d) = &draft_stats {
        print_draft_summary(d, &stats);
    }
    if ring.verbose || ring.stats_json.is_some() {
        let devices = head.collect_stats()?;
        if ring.verbose {
            print_device_table(&devices, &[]);
        }
        if let Some(path) = &ring.stats_json {
            let json = serde_json::json!({
                "prompt_tokens": stats.prompt_tokens,
                "generated_tokens": stats.generated_tokens,
                "ttft_ms": stats.time_to_first_token.as_secs_f64() * 1e3,
                "tpot_ms": stats.tpot_ms(),
                "rounds": head.rounds(),
                "draft": draft_stats.map(|d| serde_json::json!({
                    "drafted": d.drafted,
                    "accepted": d.accepted,
                    "target_evals": d.target_evals,
                })),
                "devices": devices,
            });
            std::fs::write(path, serde_json::to_vec_pretty(&json)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
    }
    head.shutdown(false);
    Ok(())
}

/// Generates, streaming the text to stdout, until done or `cancel` is set.
pub(super) fn stream<F: Forward>(
    forward: &mut F,
    tok: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    options: GenerateOptions,
    cancel: &AtomicBool,
) -> anyhow::Result<GenerationStats> {
    let mut out = StdoutText::new(cancel);
    let (_, stats) = generate(forward, tok, sampler, prompt, options, |piece| {
        out.push(piece)
    })?;
    out.finish();
    Ok(stats)
}

/// [`stream`], with a draft model and its options when given (speculative decoding).
pub(super) fn stream_maybe_draft<F: RowLogits>(
    forward: &mut F,
    draft: Option<(&mut Session<'_>, DraftOptions)>,
    tok: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    options: GenerateOptions,
    cancel: &AtomicBool,
) -> anyhow::Result<(GenerationStats, Option<DraftStats>)>
where
    anyhow::Error: From<F::Error>,
{
    let Some((draft, draft_options)) = draft else {
        return Ok((
            stream(forward, tok, sampler, prompt, options, cancel)?,
            None,
        ));
    };
    let mut out = StdoutText::new(cancel);
    let result = generate_speculative(
        forward,
        draft,
        tok,
        sampler,
        prompt,
        options,
        draft_options,
        |piece| out.push(piece),
    );
    let (_, stats, draft_stats) = match result {
        Ok(r) => r,
        // The target's errors as they are (apply names a lost ring device from them).
        Err(SpeculativeError::Target(e)) => return Err(e.into()),
        Err(e @ SpeculativeError::Draft(_)) => return Err(anyhow::anyhow!("{e}")),
    };
    out.finish();
    Ok((stats, Some(draft_stats)))
}

/// Generated text on stdout as it comes; a closed pipe or `cancel` ends generation.
struct StdoutText<'c> {
    out: std::io::StdoutLock<'static>,
    write_error: Option<std::io::Error>,
    cancel: &'c AtomicBool,
}

impl<'c> StdoutText<'c> {
    fn new(cancel: &'c AtomicBool) -> StdoutText<'c> {
        StdoutText {
            out: std::io::stdout().lock(),
            write_error: None,
            cancel,
        }
    }

    fn push(&mut self, piece: &str) -> ControlFlow<()> {
        if self.cancel.load(Ordering::Relaxed) {
            return ControlFlow::Break(());
        }
        match self
            .out
            .write_all(piece.as_bytes())
            .and_then(|_| self.out.flush())
        {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                // A closed pipe (e.g. `| head`) ends generation quietly.
                self.write_error = Some(e);
                ControlFlow::Break(())
            }
        }
    }

    fn finish(mut self) {
        if self.write_error.is_none() {
            let _ = writeln!(self.out);
        }
    }
}

pub(super) fn print_summary(stats: &GenerationStats, seed: u64, backend: &str) {
    if stats.generated_tokens == 0 && stats.time_to_first_token.is_zero() {
        // `-n 0`: the prompt was tokenized, never evaluated; there is no rate to give.
        eprintln!(
            "prompt: {} tokens, not evaluated (-n 0) | seed {seed} | {backend}",
            stats.prompt_tokens
        );
        return;
    }
    match stats.stop {
        StopReason::ContextFull => eprintln!(
            "stopped: the context is full after {} tokens (raise --ctx-size, or policy.ctx in a manifest)",
            // The last token sampled is printed but never evaluated into the cache.
            (stats.prompt_tokens + stats.generated_tokens).saturating_sub(1)
        ),
        StopReason::Cancelled => {
            eprintln!("stopped early (Ctrl-C, or stdout closed): the figures are for the tokens so far")
        }
        _ => {}
    }
    eprintln!(
        "prompt: {} tokens, {:.1} tok/s | TTFT {:.1} ms | generated {} tokens, TPOT {:.2} ms ({:.1} tok/s) | seed {seed} | {backend}",
        stats.prompt_tokens,
        stats.prompt_tokens_per_s(),
        stats.time_to_first_token.as_secs_f64() * 1e3,
        stats.generated_tokens,
        stats.tpot_ms(),
        if stats.tpot_ms() > 0.0 { 1e3 / stats.tpot_ms() } else { 0.0 },
    );
}

/// The draft's acceptance and what it saved: tokens per trip of the target (round the ring).
pub(super) fn print_draft_summary(draft: &DraftStats, stats: &GenerationStats) {
    let after_first = stats.generated_tokens.saturating_sub(1);
    eprintln!(
        "draft: accepted {}/{} drafted tokens ({:.1}%) | {} target evaluations for {} tokens after the first ({:.2} tokens each) | effective {:.1} tok/s",
        draft.accepted,
        draft.drafted,
        draft.acceptance() * 100.0,
        draft.target_evals,
        after_first,
        after_first as f64 / draft.target_evals.max(1) as f64,
        if stats.tpot_ms() > 0.0 { 1e3 / stats.tpot_ms() } else { 0.0 },
    );
}

/// Per device, the mean per generated token (one-token batches, all rounds summed).
/// Per-device timing of a ring run; `names` are the devices' names in ring order (where
/// none is given, the head is `head` and a node `node N`).
pub(super) fn print_device_table(devices: &[DeviceStats], names: &[String]) {
    let name = |m: usize| match (names.get(m), m) {
        (Some(n), _) => n.clone(),
        (None, 0) => "head".to_string(),
        (None, m) => format!("node {m}"),
    };
    let width = (0..devices.len())
        .map(|m| name(m).len())
        .max()
        .unwrap_or(0)
        .max(8);
    eprintln!(
        "{:<width$} {:<22} {:>8} {:>11} {:>9} {:>9} {:>12} {:>12} {:>10} {:>11}",
        "device",
        "address",
        "tokens",
        "compute ms",
        "send ms",
        "wait ms",
        "major flt",
        "disk MB",
        "mem press",
        "expert hit"
    );
    for d in devices {
        let mut per_token: std::collections::BTreeMap<u64, [f64; 5]> = Default::default();
        for p in d.passes.iter().filter(|p| p.n_tokens == 1) {
            let t = per_token.entry(p.seq).or_default();
            t[0] += p.compute_ms;
            t[1] += p.send_ms;
            t[2] += p.wait_ms;
            t[3] += p.major_faults as f64;
            t[4] += p.disk_read_bytes as f64 / 1e6;
        }
        let n = per_token.len().max(1) as f64;
        // The resident-expert cache, over every pass (prompt and generation).
        let (hits, misses) = d
            .passes
            .iter()
            .fold((0, 0), |(h, m), p| (h + p.expert_hits, m + p.expert_misses));
        let expert_hit = if hits + misses == 0 {
            "-".to_string()
        } else {
            format!("{:.1}%", 100.0 * hits as f64 / (hits + misses) as f64)
        };
        let mut sum = [0.0; 5];
        for t in per_token.values() {
            for i in 0..5 {
                sum[i] += t[i];
            }
        }
        eprintln!(
            "{:<width$} {:<22} {:>8} {:>11.3} {:>9.3} {:>9.3} {:>12.1} {:>12.2} {:>9.1}% {:>11}",
            name(d.device),
            d.addr,
            per_token.len(),
            sum[0] / n,
            sum[1] / n,
            sum[2] / n,
            sum[3] / n,
            sum[4] / n,
            d.peak_memory_pressure * 100.0,
            expert_hit
        );
    }
    // Where the time to the first token went: the prompt's passes (batches of more than
    // one token), summed per device.
    let prompt: Vec<String> = devices
        .iter()
        .filter_map(|d| {
            let passes: Vec<_> = d.passes.iter().filter(|p| p.n_tokens > 1).collect();
            (!passes.is_empty()).then(|| {
                let sum = |f: fn(&PassStats) -> f64| passes.iter().map(|p| f(p)).sum::<f64>();
                format!(
                    "{} compute {:.1} ms, wait {:.1} ms, send {:.1} ms",
                    name(d.device),
                    sum(|p| p.compute_ms),
                    sum(|p| p.wait_ms),
                    sum(|p| p.send_ms)
                )
            })
        })
        .collect();
    if !prompt.is_empty() {
        eprintln!("prompt passes: {}", prompt.join("; "));
    }
}

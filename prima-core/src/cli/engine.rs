//! Opening a model for the CLI: map it, warm its pages with a progress bar (or, when they
//! do not fit this device's memory, plan which stay resident and which are streamed), load
//! the backend plugin, read the tokenizer.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use prima_core::model::{Model, Session};
use prima_core::plugin::backend_abi::BackendConfig;
use prima_core::plugin::{load_backend, LoadedBackend};
use prima_core::prp::alone::{describe_plan, LocalSession};
use prima_core::prp::budget::{memory_margin, resolve_budget, MemBudget};
use prima_core::prp::protocol::{ReleaseMethod, ReleasePolicy};
use prima_core::prp::residency::Residency;
use prima_core::tokenizer::Tokenizer;

/// Options shared by every command that runs a model.
#[derive(clap::Args, Debug, Clone)]
pub struct EngineArgs {
    /// GGUF model file.
    #[arg(short = 'm', long)]
    pub model: std::path::PathBuf,
    /// Compute threads (default: the backend's choice; the CPU backend uses one per physical core).
    #[arg(short = 't', long)]
    pub threads: Option<u32>,
    /// Backend plugin to use, e.g. `cpu` or `cuda` (default: $PRIMA_BACKEND, else the
    /// first usable one found, in file-name order: the CPU backend).
    #[arg(long)]
    pub backend: Option<String>,
}

/// The page hints of a device alone whose weights do not fit.
#[derive(Debug, Clone, Copy)]
pub struct Streaming {
    pub prefetch: bool,
    pub release: ReleasePolicy,
    pub method: ReleaseMethod,
}

impl Default for Streaming {
    fn default() -> Self {
        Streaming {
            prefetch: true,
            release: ReleasePolicy::Mru,
            method: ReleaseMethod::Pageout,
        }
    }
}

/// Names the backend plugin when `--backend` does not.
pub const BACKEND_ENV: &str = "PRIMA_BACKEND";

/// `--backend`, else `$PRIMA_BACKEND` when set and not empty.
pub fn backend_choice(flag: Option<&str>) -> Option<String> {
    flag.map(str::to_owned).or_else(|| {
        std::env::var(BACKEND_ENV)
            .ok()
            .filter(|name| !name.is_empty())
    })
}

pub struct Engine {
    pub path: std::path::PathBuf,
    pub model: Model,
    pub backend: LoadedBackend,
    pub tokenizer: Tokenizer,
}

impl Engine {
    /// Opens the model without touching a weight page: a device alone reads them in
    /// [`Engine::local_session`], a ring device only its own layers, later.
    pub fn open(args: &EngineArgs) -> anyhow::Result<Engine> {
        let model = Model::load(&args.model)?;
        let config = BackendConfig {
            threads: args.threads.unwrap_or(0),
        };
        let backend = load_backend(backend_choice(args.backend.as_deref()).as_deref(), config)?;
        let tokenizer = Tokenizer::from_gguf(model.gguf())
            .with_context(|| format!("{}: reading the tokenizer", args.model.display()))?;
        tracing::info!(backend = %backend.backend.describe(), "engine ready");
        Ok(Engine {
            path: args.model.clone(),
            model,
            backend,
            tokenizer,
        })
    }
}

impl Engine {
    /// A session on this device alone, when the
    /// weights fit `budget` (see [`MemBudget`]) every page is read now, as always;
    /// otherwise the first layers are read now and the rest will be streamed each token,
    /// which stderr reports.
    pub fn local_session(
        &self,
        budget: MemBudget,
        n_ctx: usize,
        n_batch: usize,
        streaming: Streaming,
    ) -> anyhow::Result<LocalSession<'_>> {
        self.local_slots(budget, n_ctx, n_batch, 1, streaming)
    }

    /// [`Engine::local_session`] with `n_slots` independent contexts of `n_ctx`
    /// positions each (continuous batching): the budget leaves room for every slot's KV
    /// cache.
    pub fn local_slots(
        &self,
        budget: MemBudget,
        n_ctx: usize,
        n_batch: usize,
        n_slots: usize,
        streaming: Streaming,
    ) -> anyhow::Result<LocalSession<'_>> {
        let model = &self.model;
        let memory = match budget {
            MemBudget::Auto => match prima_core::profile::device_memory() {
                Ok(m) => Some(m),
                Err(e) => {
                    tracing::warn!(error = %e, "memory unreadable: no memory budget");
                    None
                }
            },
            _ => None,
        };
        let margin = memory_margin(model.hparams(), n_ctx, n_batch, n_slots);
        let plan = resolve_budget(budget, memory.as_ref(), margin).and_then(|b| {
            // Below the output head, which every token reads whole, there
            // is nothing to plan: streaming all layers measured slower than the LRU
            // (Gemma 3 270M in a 250 MiB cgroup: 396 vs 322 ms/token).
            if b.bytes < model.read_whole_bytes() && budget == MemBudget::Auto {
                eprintln!(
                    "memory: {b}; the output head alone ({} MiB) exceed it: \
                     no residency plan, the kernel decides",
                    model.read_whole_bytes() >> 20
                );
                return None;
            }
            let plan = Residency::plan_alone(
                model,
                b.bytes,
                streaming.prefetch,
                streaming.release,
                streaming.method,
            );
            plan.streams().then(|| {
                eprintln!(
                    "memory: {b}; {} does not fit: {}",
                    self.path.display(),
                    describe_plan(model, &plan)
                );
                plan
            })
        });
        match &plan {
            Some(plan) => plan.warm(model),
            None => warm_pages(model, &self.path),
        }
        let session = Session::with_slots(model, &self.backend.backend, n_ctx, n_batch, n_slots)?;
        Ok(LocalSession::new(session, plan))
    }
}

/// Reads every weight page once so the first token does not pay for disk reads; shows a
/// progress bar when that takes a noticeable time (a cold page cache, a slow disk).
/// The pages stay in the page cache, shared and reclaimable: nothing is copied.
fn warm_pages(model: &Model, path: &Path) {
    const PAGE: usize = 4096;
    let total: u64 = model.weight_tensors().map(|t| t.n_bytes).sum();
    let bar = ProgressBar::with_draw_target(Some(total), indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("loading {msg} {bar:30} {bytes}/{total_bytes} ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    // Draw only if loading is still going after a moment.
    bar.enable_steady_tick(Duration::from_millis(250));
    let mut checksum = 0u8;
    for t in model.weight_tensors() {
        let data = model.gguf().tensor_data(t);
        for page in data.chunks(PAGE) {
            checksum ^= page[0];
        }
        bar.inc(t.n_bytes);
    }
    std::hint::black_box(checksum);
    bar.finish_and_clear();
}

//! Opening a model for the CLI: map it, warm its pages with a progress bar (or, when they
//! do not fit this device's memory, plan which stay resident and which are streamed), load
//! the backend plugin, read the tokenizer.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use prima_abi::backend::BackendConfig;
use prima_cluster::prp::alone::{describe_plan, LocalSession};
use prima_cluster::prp::budget::{memory_margin_for_layers, resolve_budget, MemBudget};
use prima_cluster::prp::expert_cache::{ExpertCache, ExpertHints, PREDICT_DEFAULT};
use prima_cluster::prp::protocol::{ReleaseMethod, ReleasePolicy};
use prima_cluster::prp::residency::Residency;
use prima_core::chat::{builtin_for_architecture, builtin_template, BUILTIN_TEMPLATES};
use prima_core::model::{GpuLayers, Model, Session};
use prima_core::plugin::{first_gpu_backend, load_backend, LoadedBackend};
use prima_core::tokenizer::Tokenizer;

/// Options shared by every command that runs a model.
#[derive(clap::Args, Debug, Clone)]
pub struct EngineArgs {
    /// GGUF model file (or -hf REPO[:QUANT]; one of the two is needed).
    #[arg(short = 'm', long)]
    pub model: Option<std::path::PathBuf>,
    /// A model from a Hugging Face repository instead of --model: the cached copy, else
    /// downloaded (`prima pull`); QUANT picks the file (default Q4_K_M). `-hf` as in llama.cpp.
    #[arg(long = "hf-repo", visible_alias = "hf", value_name = "REPO[:QUANT]",
          conflicts_with = "model", value_parser = super::pull::parse_model)]
    pub hf_repo: Option<crate::hub::name::ModelRef>,
    /// Compute threads (default: the backend's choice; the CPU backend uses one per physical core).
    #[arg(short = 't', long)]
    pub threads: Option<u32>,
    /// Backend plugin to use, e.g. `cpu` or `cuda` (default: $PRIMA_BACKEND, else the
    /// first usable one found, in file-name order: the CPU backend).
    #[arg(long)]
    pub backend: Option<String>,
    /// Layers of each window to run on the GPU backend, the window's first ones (the
    /// paper's n_m; `-ngl` as in llama.cpp). Alone, the model is one window: its first N
    /// layers. On a node it overrides the head's plan. Default: none alone, the plan's on
    /// a node.
    #[arg(long = "gpu-layers", alias = "n-gpu-layers", value_name = "N")]
    pub gpu_layers: Option<usize>,
    /// Backend plugin for the GPU layers (default: $PRIMA_GPU_BACKEND, else the first
    /// usable GPU plugin found, e.g. `cuda`).
    #[arg(long, value_name = "NAME")]
    pub gpu_backend: Option<String>,
}

impl EngineArgs {
    /// The model file: `--model`, or `--hf-repo`'s cached copy (pulled first if missing).
    pub fn model_path(&self) -> anyhow::Result<std::path::PathBuf> {
        match (&self.model, &self.hf_repo) {
            (Some(path), _) => Ok(path.clone()),
            (None, Some(model)) => crate::hub::resolve(model),
            (None, None) => anyhow::bail!("give the model: --model PATH or -hf REPO[:QUANT]"),
        }
    }
}

/// llama.cpp's multi-letter short flags, which clap has not: `-ngl N` (and `-ngl=N`) as
/// `--gpu-layers N`, `-sys TEXT` as `--system-prompt TEXT`.
pub fn ngl_alias(
    args: impl Iterator<Item = std::ffi::OsString>,
) -> impl Iterator<Item = std::ffi::OsString> {
    args.map(|a| match a.to_str() {
        Some("-ngl") => "--gpu-layers".into(),
        Some(s) if s.starts_with("-ngl=") => format!("--gpu-layers={}", &s[5..]).into(),
        Some("-sys") => "--system-prompt".into(),
        Some(s) if s.starts_with("-sys=") => format!("--system-prompt={}", &s[5..]).into(),
        _ => a,
    })
}

/// The page hints of a device alone whose weights do not fit.
#[derive(Debug, Clone, Copy)]
pub struct Streaming {
    pub prefetch: bool,
    pub release: ReleasePolicy,
    pub method: ReleaseMethod,
    /// A mixture of experts keeps and streams experts, not whole layers, when its
    /// layers' shared parts fit.
    pub experts: bool,
    /// Guess the next layer's experts and read the streamed ones ahead.
    pub expert_predict: bool,
}

impl Default for Streaming {
    fn default() -> Self {
        Streaming {
            prefetch: true,
            release: ReleasePolicy::Mru,
            method: ReleaseMethod::Pageout,
            experts: true,
            expert_predict: PREDICT_DEFAULT,
        }
    }
}

/// Names the backend plugin when `--backend` does not.
pub const BACKEND_ENV: &str = "PRIMA_BACKEND";

/// Names the GPU backend plugin when `--gpu-backend` does not.
pub const GPU_BACKEND_ENV: &str = "PRIMA_GPU_BACKEND";

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
    /// The GPU backend beside `backend`, and `--gpu-layers` (n_m per window).
    pub gpu: Option<LoadedBackend>,
    pub gpu_layers: Option<usize>,
    pub tokenizer: Tokenizer,
}

/// Loads the GPU backend when one is asked for: by `--gpu-layers N > 0` or by name
/// (`--gpu-backend`, `$PRIMA_GPU_BACKEND`), or, with `auto` (a node, whose head's plan
/// may give it GPU layers), whenever a usable GPU plugin is found. A GPU asked for
/// explicitly that cannot be loaded is an error naming why.
fn open_gpu(
    args: &EngineArgs,
    config: BackendConfig,
    auto: bool,
) -> anyhow::Result<Option<LoadedBackend>> {
    let named = args.gpu_backend.clone().or_else(|| {
        std::env::var(GPU_BACKEND_ENV)
            .ok()
            .filter(|name| !name.is_empty())
    });
    let asked = args.gpu_layers.is_some_and(|n| n > 0);
    if args.gpu_layers == Some(0) || !(asked || auto || named.is_some()) {
        return Ok(None);
    }
    let Some(name) = named.or_else(first_gpu_backend) else {
        if asked {
            anyhow::bail!(
                "--gpu-layers {}: no usable GPU backend plugin found (`prima plugins` lists the plugins and why each is unavailable; --gpu-backend names one)",
                args.gpu_layers.unwrap_or(0)
            );
        }
        return Ok(None);
    };
    let gpu = load_backend(Some(&name), config).with_context(|| match args.gpu_layers {
        Some(n) => format!("--gpu-layers {n}: the GPU backend '{name}' cannot be used"),
        None => format!("the GPU backend '{name}' cannot be used"),
    })?;
    Ok(Some(gpu))
}

impl Engine {
    /// Opens the model without touching a weight page: a device alone reads them in
    /// [`Engine::local_slots`], a ring device only its own layers, later.
    pub fn open(args: &EngineArgs) -> anyhow::Result<Engine> {
        let model = Model::load(args.model_path()?)?;
        Engine::open_with(args, model, false)
    }

    /// [`Engine::open`] for a ring device (a node, or `prima apply`'s head): a usable GPU
    /// plugin is loaded even without `--gpu-layers`, for the GPU layers a plan may give it.
    pub fn open_planned(args: &EngineArgs) -> anyhow::Result<Engine> {
        let model = Model::load(args.model_path()?)?;
        Engine::open_with(args, model, true)
    }

    fn open_with(args: &EngineArgs, model: Model, auto_gpu: bool) -> anyhow::Result<Engine> {
        let config = BackendConfig {
            threads: args.threads.unwrap_or(0),
        };
        // More threads than cores only wait on each other (llama.cpp's -t too).
        if let (Some(t), Ok(cores)) = (args.threads, std::thread::available_parallelism()) {
            if t as usize > cores.get() {
                eprintln!(
                    "warning: -t {t} is more threads than this device's {cores} cores: they will wait on each other (leave -t out for one per physical core)"
                );
            }
        }
        let backend = load_backend(backend_choice(args.backend.as_deref()).as_deref(), config)?;
        let gpu = open_gpu(args, config, auto_gpu)?;
        let mut tokenizer = Tokenizer::from_gguf(model.gguf())
            .with_context(|| format!("{}: reading the tokenizer", model.gguf().path().display()))?;
        // A file without a chat template chats with the built-in one of its architecture.
        if tokenizer.chat_template().is_none() {
            let arch = model.gguf().architecture().unwrap_or_default();
            if let Some(name) = builtin_for_architecture(arch) {
                tracing::info!(
                    arch,
                    template = name,
                    "no chat template in the file: built-in"
                );
                tokenizer.set_chat_template(builtin_template(name).unwrap_or_default().into());
            }
        }
        tracing::info!(backend = %backend.backend.describe(), "engine ready");
        if let Some(gpu) = &gpu {
            tracing::info!(gpu = %gpu.backend.describe(), layers = ?args.gpu_layers, "GPU backend ready");
        }
        Ok(Engine {
            path: model.gguf().path().to_path_buf(),
            model,
            backend,
            gpu,
            gpu_layers: args.gpu_layers,
            tokenizer,
        })
    }

    /// `--chat-template NAME|FILE`: a built-in template by name, else a Jinja file, in
    /// place of the model's.
    pub fn use_chat_template(&mut self, given: &str) -> anyhow::Result<()> {
        let template = match builtin_template(given) {
            Some(t) => t.to_string(),
            None => std::fs::read_to_string(given).with_context(|| {
                let names: Vec<&str> = BUILTIN_TEMPLATES.iter().map(|(n, _)| *n).collect();
                format!(
                    "--chat-template {given}: neither a built-in template ({}) nor a readable file",
                    names.join(", ")
                )
            })?,
        };
        self.tokenizer.set_chat_template(template);
        Ok(())
    }

    /// A device alone's GPU layers: the first `--gpu-layers` of the model (one window),
    /// all of them when N exceeds the layer count.
    pub fn alone_gpu_layers(&self) -> Vec<usize> {
        match (&self.gpu, self.gpu_layers) {
            (Some(_), Some(n)) => (0..n.min(self.model.hparams().n_layers)).collect(),
            _ => Vec::new(),
        }
    }

    /// A session of every layer with slots (no residency plan), its first `gpu_layers` on
    /// the GPU backend when there is one: `prima apply`'s head alone, with Halda's n_m.
    pub fn session(
        &self,
        n_ctx: usize,
        n_batch: usize,
        n_slots: usize,
        gpu_layers: usize,
    ) -> Result<Session<'_>, prima_core::model::ModelError> {
        let n_layers = self.model.hparams().n_layers;
        let all: Vec<usize> = (0..n_layers).collect();
        let on_gpu: Vec<usize> = (0..gpu_layers.min(n_layers)).collect();
        Session::with_split(
            &self.model,
            &self.backend.backend,
            self.gpu.as_ref().map(|g| GpuLayers {
                backend: &g.backend,
                layers: &on_gpu,
            }),
            n_ctx,
            n_batch,
            n_slots,
            &all,
        )
    }

    /// One line for people: the backend, and the GPU's with its layers when there is one.
    pub fn describe_backends(&self) -> String {
        let main = self.backend.backend.describe().into_string();
        match &self.gpu {
            Some(gpu) => format!(
                "{main} + GPU {} ({})",
                gpu.backend.describe(),
                match self.gpu_layers {
                    Some(n) => format!("{n} layers per window"),
                    None => "layers as planned".into(),
                }
            ),
            None => main,
        }
    }
}

impl Engine {
    /// A session on this device alone with `n_slots` independent contexts of `n_ctx`
    /// positions each (continuous batching; the budget leaves room for every slot's KV
    /// cache). When the weights fit `budget` (see [`MemBudget`]) every page is read now,
    /// as always; otherwise the first layers are read now and the rest will be streamed
    /// each token, which stderr reports.
    pub fn local_slots(
        &self,
        budget: MemBudget,
        n_ctx: usize,
        n_batch: usize,
        n_slots: usize,
        streaming: Streaming,
    ) -> anyhow::Result<LocalSession<'_>> {
        self.local_slots_beside(budget, n_ctx, n_batch, n_slots, streaming, 0)
    }

    /// [`Engine::local_slots`] beside `reserved` bytes the process holds for something
    /// else (a draft model and its KV caches), kept out of an `auto` budget.
    pub fn local_slots_beside(
        &self,
        budget: MemBudget,
        n_ctx: usize,
        n_batch: usize,
        n_slots: usize,
        streaming: Streaming,
        reserved: u64,
    ) -> anyhow::Result<LocalSession<'_>> {
        let model = &self.model;
        let memory = match budget {
            MemBudget::Auto => match prima_cluster::profile::device_memory() {
                Ok(m) => Some(m),
                Err(e) => {
                    tracing::warn!(error = %e, "memory unreadable: no memory budget");
                    None
                }
            },
            _ => None,
        };
        // The GPU layers (the first ones) keep their KV cache in VRAM, and their weights
        // there too: out of the margin, and beside the budget, so the plan keeps them
        // resident (it keeps the first layers) and streams only CPU layers.
        let on_gpu = self.alone_gpu_layers();
        let gpu_bytes: u64 = on_gpu.iter().map(|&il| model.layer_bytes(il)).sum();
        let hp = model.hparams();
        let margin =
            memory_margin_for_layers(hp, hp.n_layers - on_gpu.len(), n_ctx, n_batch, n_slots)
                .saturating_add(reserved);
        let resolved = resolve_budget(budget, memory.as_ref(), margin);
        // A mixture of experts on the CPU alone: experts are the unit of residency.
        let expert_plan = resolved
            .as_ref()
            .filter(|_| streaming.experts && on_gpu.is_empty())
            .and_then(|b| {
                let hints = ExpertHints {
                    prefetch: streaming.prefetch,
                    release: streaming.release,
                    method: streaming.method,
                    predict: streaming.expert_predict,
                    persist: true,
                };
                let cache = ExpertCache::plan_alone(model, b.bytes, None, hints)?;
                eprintln!(
                    "memory: {b}; {} does not fit: {}",
                    self.path.display(),
                    cache.describe()
                );
                Some(cache)
            });
        let plan = resolved.filter(|_| expert_plan.is_none()).and_then(|b| {
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
                b.bytes.saturating_add(gpu_bytes),
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
        match (&plan, &expert_plan) {
            (_, Some(cache)) => cache.warm(),
            (Some(plan), None) => plan.warm(model),
            (None, None) => warm_pages(model, &self.path),
        }
        let all: Vec<usize> = (0..model.hparams().n_layers).collect();
        let session = Session::with_split(
            model,
            &self.backend.backend,
            self.gpu.as_ref().map(|g| GpuLayers {
                backend: &g.backend,
                layers: &on_gpu,
            }),
            n_ctx,
            n_batch,
            n_slots,
            &all,
        )?;
        if let Some(cache) = expert_plan {
            return Ok(LocalSession::with_experts(session, cache));
        }
        Ok(LocalSession::new(session, plan))
    }
}

/// Reads every weight page once so the first token does not pay for disk reads; shows a
/// progress bar when that takes a noticeable time (a cold page cache, a slow disk).
/// The pages stay in the page cache, shared and reclaimable: nothing is copied.
fn warm_pages(model: &Model, path: &Path) {
    const PAGE: usize = 4096;
    // A tied output head is the embedding's bytes: counted (and read) once.
    let total: u64 = model.distinct_weight_tensors().map(|t| t.n_bytes).sum();
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
    for t in model.distinct_weight_tensors() {
        let data = model.gguf().tensor_data(t);
        for page in data.chunks(PAGE) {
            checksum ^= page[0];
        }
        bar.inc(t.n_bytes);
    }
    std::hint::black_box(checksum);
    bar.finish_and_clear();
}

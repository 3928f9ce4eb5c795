//! Opening a model for the CLI: map it, warm its pages with a progress bar, load the
//! backend plugin, read the tokenizer.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use prima_core::model::Model;
use prima_core::plugin::backend_abi::BackendConfig;
use prima_core::plugin::{load_backend, LoadedBackend};
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
    pub model: Model,
    pub backend: LoadedBackend,
    pub tokenizer: Tokenizer,
}

impl Engine {
    /// Opens the model and reads all of its weights into the page cache.
    pub fn open(args: &EngineArgs) -> anyhow::Result<Engine> {
        Engine::open_with(args, true)
    }

    /// Opens the model; with `warm` false no weight page is touched (a ring device reads
    /// only its own layers, later).
    pub fn open_with(args: &EngineArgs, warm: bool) -> anyhow::Result<Engine> {
        let model = Model::load(&args.model)?;
        if warm {
            warm_pages(&model, &args.model);
        }
        let config = BackendConfig {
            threads: args.threads.unwrap_or(0),
        };
        let backend = load_backend(backend_choice(args.backend.as_deref()).as_deref(), config)?;
        let tokenizer = Tokenizer::from_gguf(model.gguf())
            .with_context(|| format!("{}: reading the tokenizer", args.model.display()))?;
        tracing::info!(backend = %backend.backend.describe(), "engine ready");
        Ok(Engine {
            model,
            backend,
            tokenizer,
        })
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

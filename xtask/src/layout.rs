//! Where xtask reads and writes: the workspace, the git-ignored `models/`
//! folder, and the cache under `~/.cache/prima` that holds everything built or
//! downloaded (wheels, the llama.cpp sdist and build, derived models).
//!
//! Overrides: `PRIMA_CACHE_DIR` moves the whole cache; `PRIMA_MODEL_DIR`
//! moves only the derived models (tests honour the same variable).

use std::env;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

pub struct Layout {
    /// The cargo workspace root.
    pub workspace: PathBuf,
    /// `~/.cache/prima` (or `$PRIMA_CACHE_DIR`).
    pub cache: PathBuf,
    /// Derived models: `~/.cache/prima/models` (or `$PRIMA_MODEL_DIR`).
    pub derived_models: PathBuf,
}

impl Layout {
    pub fn discover() -> Result<Self> {
        // xtask/ sits directly under the workspace root. `cargo run` passes the manifest
        // directory at run time too; prefer it, because with a build cache shared between
        // checkouts the binary may have been compiled in another checkout.
        let manifest_dir = env::var_os("CARGO_MANIFEST_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
        let workspace = manifest_dir
            .parent()
            .context("xtask has no parent directory")?
            .to_path_buf();
        let cache = match env::var_os("PRIMA_CACHE_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => {
                let home = env::var_os("HOME").context("HOME is not set")?;
                PathBuf::from(home).join(".cache").join("prima")
            }
        };
        let derived_models = match env::var_os("PRIMA_MODEL_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => cache.join("models"),
        };
        Ok(Layout {
            workspace,
            cache,
            derived_models,
        })
    }

    /// Fetched (upstream) models: `<workspace>/models`.
    pub fn fetched_models(&self) -> PathBuf {
        self.workspace.join("models")
    }

    pub fn wheels(&self) -> PathBuf {
        self.cache.join("wheels")
    }

    pub fn sdists(&self) -> PathBuf {
        self.cache.join("sdist")
    }

    /// llama.cpp build tree, logs and our reference tool.
    pub fn llama_cpp(&self) -> PathBuf {
        self.cache.join("llama.cpp")
    }

    pub fn generation_fixtures(&self) -> PathBuf {
        self.workspace.join("tests/fixtures/generation")
    }

    /// `path` relative to the workspace when it lies inside it, for messages
    /// and for the commands recorded in fixtures.
    pub fn display(&self, path: &Path) -> String {
        if let Ok(rel) = path.strip_prefix(&self.workspace) {
            return rel.display().to_string();
        }
        if let Ok(rel) = path.strip_prefix(&self.cache) {
            return format!("~/.cache/prima/{}", rel.display());
        }
        path.display().to_string()
    }
}

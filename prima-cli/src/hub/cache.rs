//! The model cache on disk, in the Hugging Face hub's layout (what `huggingface-cli` and
//! llama.cpp's `-hf` write), so a model fetched by one is found by the others:
//!
//! ```text
//! models--OWNER--NAME/refs/main                 the commit `main` pointed at
//! models--OWNER--NAME/blobs/SHA256              a file's bytes, named by their SHA-256
//! models--OWNER--NAME/blobs/SHA256.part         a download in progress (resumed from its length)
//! models--OWNER--NAME/snapshots/COMMIT/PATH     a link to its blob
//! ```
//! A split model's parts are joined into `snapshots/COMMIT/NAME.gguf` (a file of its own:
//! the engine maps one file), and the parts removed.

use std::path::{Path, PathBuf};

use super::name::RepoFile;

/// Where models fetched by name are kept.
#[derive(Debug, Clone)]
pub struct Cache {
    root: PathBuf,
}

/// Moves the whole of Prima's cache (the hub cache is its `hub/`), as for `cargo xtask`.
pub const CACHE_ENV: &str = "PRIMA_CACHE_DIR";

impl Cache {
    /// `$PRIMA_CACHE_DIR/hub`, else `$XDG_CACHE_HOME/prima/hub`, else `~/.cache/prima/hub`.
    pub fn from_env() -> Cache {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let root = match (var(CACHE_ENV), var("XDG_CACHE_HOME")) {
            (Some(dir), _) => dir.join("hub"),
            (None, Some(xdg)) => xdg.join("prima/hub"),
            (None, None) => {
                PathBuf::from(prima_cluster::profile::home_dir()).join(".cache/prima/hub")
            }
        };
        Cache { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.root
            .join(format!("models--{}", repo.replace('/', "--")))
    }

    pub fn blob(&self, repo: &str, sha256: &str) -> PathBuf {
        self.repo_dir(repo).join("blobs").join(sha256)
    }

    pub fn part(&self, repo: &str, sha256: &str) -> PathBuf {
        self.repo_dir(repo)
            .join("blobs")
            .join(format!("{sha256}.part"))
    }

    pub fn snapshot(&self, repo: &str, commit: &str) -> PathBuf {
        self.repo_dir(repo).join("snapshots").join(commit)
    }

    /// The commit `main` pointed at when the repository was last fetched.
    pub fn main_commit(&self, repo: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.repo_dir(repo).join("refs/main")).ok()?;
        let commit = text.trim();
        is_commit(commit).then(|| commit.to_string())
    }

    pub fn set_main_commit(&self, repo: &str, commit: &str) -> std::io::Result<()> {
        let refs = self.repo_dir(repo).join("refs");
        std::fs::create_dir_all(&refs)?;
        let tmp = refs.join(".main.tmp");
        std::fs::write(&tmp, commit)?;
        std::fs::rename(tmp, refs.join("main"))
    }

    /// Puts `path` of the snapshot at `commit` in place as a link to the blob `sha256`
    /// (a relative symbolic link, else a hard link where symbolic ones are not allowed).
    pub fn link(
        &self,
        repo: &str,
        commit: &str,
        path: &str,
        sha256: &str,
    ) -> std::io::Result<PathBuf> {
        let target = self.snapshot(repo, commit).join(path);
        if let Some(dir) = target.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let _ = std::fs::remove_file(&target);
        // snapshots/COMMIT/[dirs/]FILE → ../../[../]blobs/SHA
        let depth = path.split('/').count() + 1;
        let relative = PathBuf::from("../".repeat(depth))
            .join("blobs")
            .join(sha256);
        if symlink(&relative, &target).is_err() {
            std::fs::hard_link(self.blob(repo, sha256), &target)?;
        }
        Ok(target)
    }

    /// The model files of the snapshot `main` pointed at last: each `.gguf` with its size
    /// and, for a link to a blob, its SHA-256 (the blob's name).
    pub fn cached_files(&self, repo: &str) -> Vec<RepoFile> {
        let Some(commit) = self.main_commit(repo) else {
            return Vec::new();
        };
        let snapshot = self.snapshot(repo, &commit);
        let mut files = Vec::new();
        walk(&snapshot, &mut |p| {
            let Ok(rel) = p.strip_prefix(&snapshot) else {
                return;
            };
            let path = rel.to_string_lossy().replace('\\', "/");
            if !path.ends_with(".gguf") {
                return;
            }
            // A link whose blob is gone (removed by hand) is no cached file.
            let Ok(meta) = std::fs::metadata(p) else {
                return;
            };
            let sha256 = std::fs::read_link(p)
                .ok()
                .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
                .filter(|n| is_sha256(n));
            files.push(RepoFile {
                path,
                size: meta.len(),
                sha256,
            });
        });
        files.sort_by(|a, b| a.path.cmp(&b.path));
        files
    }

    /// Every repository with a cached snapshot, as `owner/name`.
    pub fn repos(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut repos: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let rest = name.strip_prefix("models--")?;
                let (owner, model) = rest.split_once("--")?;
                Some(format!("{owner}/{model}"))
            })
            .collect();
        repos.sort();
        repos
    }

    /// Removes files of the cached snapshot and the blobs they linked to.
    pub fn remove_files(&self, repo: &str, files: &[&RepoFile]) -> std::io::Result<u64> {
        let Some(commit) = self.main_commit(repo) else {
            return Ok(0);
        };
        let mut freed = 0;
        for f in files {
            let link = self.snapshot(repo, &commit).join(&f.path);
            freed += f.size;
            if let Some(sha) = &f.sha256 {
                remove_if_there(&self.blob(repo, sha))?;
                remove_if_there(&self.part(repo, sha))?;
            }
            remove_if_there(&link)?;
        }
        Ok(freed)
    }

    /// Removes the repository's whole cache directory; the bytes it held.
    pub fn remove_repo(&self, repo: &str) -> std::io::Result<u64> {
        let dir = self.repo_dir(repo);
        let mut bytes = 0;
        walk(&dir.join("blobs"), &mut |p| {
            bytes += std::fs::symlink_metadata(p).map_or(0, |m| m.len());
        });
        walk(&dir.join("snapshots"), &mut |p| {
            if let Ok(m) = std::fs::symlink_metadata(p) {
                if m.is_file() && m.len() > 0 {
                    bytes += m.len();
                }
            }
        });
        std::fs::remove_dir_all(&dir)?;
        Ok(bytes)
    }
}

fn remove_if_there(p: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Calls `f` on every file under `dir` (links included, not followed into directories).
fn walk(dir: &Path, f: &mut dyn FnMut(&Path)) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => walk(&p, f),
            Ok(_) => f(&p),
            Err(_) => {}
        }
    }
}

pub fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

pub fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(unix)]
fn symlink(original: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(original, link)
}

#[cfg(windows)]
fn symlink(original: &Path, link: &Path) -> std::io::Result<()> {
    std::os::windows::fs::symlink_file(original, link)
}

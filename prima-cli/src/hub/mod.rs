//! Models fetched by name from a Hugging Face repository (`prima pull`, `-hf REPO[:QUANT]`):
//! which file a quant names (`name.rs`), the Hub's API and resumable downloads (`api.rs`),
//! the cache in the Hub's own layout (`cache.rs`), and joining split models (`join.rs`).
//!
//! Every download is checked against the SHA-256 the Hub lists for the file before it
//! takes its place in the cache; a broken connection is resumed from the partial file.
//! This is I/O at the edge, so it lives in the binary, not in the engine.

pub mod api;
pub mod cache;
mod join;
pub mod name;

use std::path::PathBuf;

use anyhow::Context;
use sha2::Digest;

use api::{hash_prefix, Hub, HubError, Interrupted};
use cache::Cache;
use name::{choose, joined_name, split_of, ModelRef, RepoFile};

/// Attempts at one file before a pull gives up (the partial file is kept for the next).
const ATTEMPTS: u32 = 4;

/// `HF_HUB_OFFLINE=1`: never ask the Hub, use the cache alone.
pub fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The cached model `model` names, if every file of it is there: one file, or the
/// file its split parts were joined into (joined now if they were not yet).
pub fn cached(cache: &Cache, model: &ModelRef) -> anyhow::Result<Option<PathBuf>> {
    let files = cache.cached_files(&model.repo);
    let Some(commit) = cache.main_commit(&model.repo) else {
        return Ok(None);
    };
    let Ok(chosen) = choose(&files, model.quant.as_deref(), &model.repo) else {
        return Ok(None);
    };
    let snapshot = cache.snapshot(&model.repo, &commit);
    match split_of(&chosen[0].path) {
        None => Ok(Some(snapshot.join(&chosen[0].path))),
        Some(split) => Ok(Some(join_parts(
            cache,
            &model.repo,
            &commit,
            &chosen,
            &split,
        )?)),
    }
}

/// The local path of `model`: from the cache when it is there, else pulled.
pub fn resolve(model: &ModelRef) -> anyhow::Result<PathBuf> {
    let cache = Cache::from_env();
    if let Some(path) = cached(&cache, model)? {
        return Ok(path);
    }
    if offline() {
        anyhow::bail!(
            "{model} is not in the cache {} and HF_HUB_OFFLINE is set",
            cache.root().display()
        );
    }
    pull(&cache, &Hub::from_env(), model)
}

/// Fetches `model`'s files from the Hub (those not cached yet), checks each against the
/// Hub's SHA-256, and returns the model's path. When the Hub cannot be reached, a cached
/// copy is used with a note.
pub fn pull(cache: &Cache, hub: &Hub, model: &ModelRef) -> anyhow::Result<PathBuf> {
    let repo = &model.repo;
    let commit = match hub.main_commit(repo) {
        Ok(c) => c,
        Err(e @ HubError::Unreachable { .. }) => {
            if let Some(path) = cached(cache, model)? {
                eprintln!("pull: {e}; using the cached {}", path.display());
                return Ok(path);
            }
            return Err(anyhow::anyhow!("{e}")).with_context(|| {
                format!(
                    "pulling {model} (the Hub is {}; set HF_ENDPOINT for another)",
                    hub.endpoint()
                )
            });
        }
        Err(e) => return Err(anyhow::anyhow!("{e}")).with_context(|| format!("pulling {model}")),
    };
    let files = hub
        .files(repo, &commit)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("pulling {model}"))?;
    let chosen = choose(&files, model.quant.as_deref(), repo).map_err(anyhow::Error::msg)?;
    let snapshot = cache.snapshot(repo, &commit);
    let split = split_of(&chosen[0].path);
    if let Some(s) = &split {
        let joined = snapshot.join(joined_name(s));
        if joined.exists() {
            cache.set_main_commit(repo, &commit)?;
            eprintln!("pull: {} is up to date ({})", model, joined.display());
            return Ok(joined);
        }
    }
    for f in &chosen {
        fetch_file(cache, hub, repo, &commit, f)?;
    }
    cache.set_main_commit(repo, &commit)?;
    match split {
        None => Ok(snapshot.join(&chosen[0].path)),
        Some(s) => join_parts(cache, repo, &commit, &chosen, &s),
    }
}

/// One file into `blobs/SHA256` (resumed from `blobs/SHA256.part`), checked, linked into
/// the snapshot.
fn fetch_file(
    cache: &Cache,
    hub: &Hub,
    repo: &str,
    commit: &str,
    f: &RepoFile,
) -> anyhow::Result<()> {
    let Some(sha) = &f.sha256 else {
        anyhow::bail!(
            "{repo}: the Hub lists no SHA-256 for {} (not an LFS file), so it cannot be checked",
            f.path
        );
    };
    let blob = cache.blob(repo, sha);
    if std::fs::metadata(&blob).is_ok_and(|m| m.len() == f.size) {
        cache.link(repo, commit, &f.path, sha)?;
        eprintln!("pull: {} is cached ({})", f.path, size_text(f.size));
        return Ok(());
    }
    std::fs::create_dir_all(blob.parent().expect("a blob is in blobs/"))?;
    let part = cache.part(repo, sha);
    let (mut hasher, mut have) =
        hash_prefix(&part).with_context(|| format!("reading {}", part.display()))?;
    if have > f.size {
        std::fs::remove_file(&part)?;
        (hasher, have) = (sha2::Sha256::new(), 0);
    }
    if have > 0 {
        eprintln!(
            "pull: {}: resuming at {} of {}",
            f.path,
            size_text(have),
            size_text(f.size)
        );
    }
    let url = hub.file_url(repo, commit, &f.path);
    let bar = progress_bar(&f.path, f.size);
    let mut attempt = 1;
    loop {
        match hub.download_into(&url, f, &part, &mut hasher, &mut |n| bar.set_position(n)) {
            Ok(()) => break,
            Err(Interrupted::Failed(e)) => {
                bar.abandon();
                return Err(e.context(format!("downloading {}", f.path)));
            }
            Err(Interrupted::At { have, message }) if attempt < ATTEMPTS => {
                bar.suspend(|| {
                    eprintln!(
                        "pull: {}: interrupted at {} of {} ({message}); resuming",
                        f.path,
                        size_text(have),
                        size_text(f.size)
                    )
                });
                std::thread::sleep(std::time::Duration::from_millis(250 << attempt));
                attempt += 1;
            }
            Err(Interrupted::At { have, message }) => {
                bar.abandon();
                anyhow::bail!(
                    "downloading {}: interrupted at {} of {} ({message}); {} is kept: run the pull again to resume",
                    f.path,
                    size_text(have),
                    size_text(f.size),
                    part.display()
                );
            }
        }
    }
    bar.finish_and_clear();
    let got = hex::encode(hasher.finalize());
    if got != *sha {
        std::fs::remove_file(&part)?;
        anyhow::bail!(
            "{}: corrupted download refused: its SHA-256 is {got} but the Hub lists {sha}; the file was removed (pull again to fetch it anew)",
            f.path
        );
    }
    std::fs::rename(&part, &blob)?;
    cache.link(repo, commit, &f.path, sha)?;
    eprintln!(
        "pull: {} ({}) downloaded, SHA-256 ok",
        f.path,
        size_text(f.size)
    );
    Ok(())
}

/// Joins the parts of a split model into `NAME.gguf` in the snapshot and removes them.
fn join_parts(
    cache: &Cache,
    repo: &str,
    commit: &str,
    parts: &[&RepoFile],
    split: &name::Split,
) -> anyhow::Result<PathBuf> {
    let snapshot = cache.snapshot(repo, commit);
    let out = snapshot.join(joined_name(split));
    if out.exists() {
        return Ok(out);
    }
    let paths: Vec<PathBuf> = parts.iter().map(|p| snapshot.join(&p.path)).collect();
    let refs: Vec<&std::path::Path> = paths.iter().map(|p| p.as_path()).collect();
    join::join(&refs, &out)?;
    // The parts' bytes now live in the joined file; their links and blobs go.
    cache.remove_files(repo, parts)?;
    eprintln!("pull: joined {} parts into {}", parts.len(), out.display());
    Ok(out)
}

fn progress_bar(name: &str, size: u64) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(size);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message(name.to_string());
    bar
}

pub fn size_text(bytes: u64) -> String {
    const MIB: f64 = (1 << 20) as f64;
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", bytes as f64 / (MIB * 1024.0))
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB)
    }
}

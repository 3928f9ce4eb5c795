//! `prima pull`, `prima list`, `prima rm`: models fetched by name from a Hugging Face
//! repository into the cache (`crate::hub`), listed and removed.

use std::io::Read;

use anyhow::Context;
use sha2::Digest;

use crate::hub::api::Hub;
use crate::hub::cache::Cache;
use crate::hub::name::{choose, ModelRef};
use crate::hub::{self, size_text};

#[derive(clap::Args, Debug)]
pub struct PullArgs {
    /// The repository and, optionally, the quantization: the GGUF file whose name holds
    /// QUANT (case-insensitive; default Q4_K_M, then Q8_0, then the first GGUF). Split
    /// models are fetched whole and joined into one file.
    #[arg(value_name = "REPO[:QUANT]", value_parser = parse_model)]
    model: ModelRef,
}

#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// Hash every cached file again and compare it with the SHA-256 it was pulled under.
    #[arg(long)]
    verify: bool,
}

#[derive(clap::Args, Debug)]
pub struct RmArgs {
    /// The repository (all its cached files) or REPO:QUANT (the files that quant names).
    #[arg(value_name = "REPO[:QUANT]", value_parser = parse_model)]
    model: ModelRef,
}

pub fn parse_model(s: &str) -> Result<ModelRef, String> {
    ModelRef::parse(s)
}

/// `-hf REPO[:QUANT]` (and `--hf`) as `--hf-repo …`: clap has no two-letter short flags,
/// and `-hf` would otherwise be read as `-h -f` (the help text).
pub fn hf_alias(
    args: impl Iterator<Item = std::ffi::OsString>,
) -> impl Iterator<Item = std::ffi::OsString> {
    args.map(|a| match a.to_str() {
        Some("-hf") | Some("-hfr") => "--hf-repo".into(),
        Some(s) if s.starts_with("-hf=") => format!("--hf-repo={}", &s[4..]).into(),
        _ => a,
    })
}

pub fn run_pull(args: PullArgs) -> anyhow::Result<()> {
    let cache = Cache::from_env();
    let path = if hub::offline() {
        hub::cached(&cache, &args.model)?.with_context(|| {
            format!(
                "{} is not in the cache and HF_HUB_OFFLINE is set",
                args.model
            )
        })?
    } else {
        hub::pull(&cache, &Hub::from_env(), &args.model)?
    };
    println!("{}", path.display());
    Ok(())
}

pub fn run_list(args: ListArgs) -> anyhow::Result<()> {
    let cache = Cache::from_env();
    let mut rows = Vec::new();
    let mut total = 0;
    for repo in cache.repos() {
        for f in cache.cached_files(&repo) {
            let check = match (&f.sha256, args.verify) {
                (None, _) => "joined from checked parts".to_string(),
                (Some(_), false) => "sha ok at pull".to_string(),
                (Some(sha), true) => {
                    let commit = cache.main_commit(&repo).unwrap_or_default();
                    let path = cache.snapshot(&repo, &commit).join(&f.path);
                    match sha256_of(&path) {
                        Ok(got) if got == *sha => "sha ok".to_string(),
                        Ok(_) => "SHA-256 MISMATCH (prima rm, then pull again)".to_string(),
                        Err(e) => format!("unreadable: {e}"),
                    }
                }
            };
            total += f.size;
            rows.push((repo.clone(), f.path, size_text(f.size), check));
        }
    }
    if rows.is_empty() {
        eprintln!(
            "no models in {} (prima pull REPO[:QUANT] fetches one)",
            cache.root().display()
        );
        return Ok(());
    }
    let w0 = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(4);
    let w1 = rows.iter().map(|r| r.1.len()).max().unwrap_or(0).max(4);
    println!("{:<w0$}  {:<w1$}  {:>10}  check", "repo", "file", "size");
    for (repo, file, size, check) in &rows {
        println!("{repo:<w0$}  {file:<w1$}  {size:>10}  {check}");
    }
    eprintln!("{} in {}", size_text(total), cache.root().display());
    Ok(())
}

pub fn run_rm(args: RmArgs) -> anyhow::Result<()> {
    let cache = Cache::from_env();
    let model = &args.model;
    let not_cached = || {
        anyhow::anyhow!(
            "{model} is not in the cache {} (`prima list` shows what is)",
            cache.root().display()
        )
    };
    if !cache.repo_dir(&model.repo).exists() {
        return Err(not_cached());
    }
    let freed = match &model.quant {
        None => cache
            .remove_repo(&model.repo)
            .with_context(|| format!("removing {}", cache.repo_dir(&model.repo).display()))?,
        Some(q) => {
            let files = cache.cached_files(&model.repo);
            let chosen = choose(&files, Some(q), &model.repo).map_err(|_| not_cached())?;
            for f in &chosen {
                println!("removed {}", f.path);
            }
            cache.remove_files(&model.repo, &chosen)?
        }
    };
    eprintln!("rm: {model}: {} freed", size_text(freed));
    Ok(())
}

fn sha256_of(path: &std::path::Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

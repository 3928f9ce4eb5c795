//! `cargo xtask fuzz`: every cargo-fuzz target in `fuzz/` for a fixed time each, one
//! after another, with a figure per target (executions, executions per second).
//!
//! The targets (`prima_server::fuzzing`) take arbitrary bytes down each input path: the
//! GGUF reader and model loader, the manifest parser, the ring frames a node receives,
//! both tokenizers, and the OpenAI request parser. Each target's corpus
//! (`fuzz/corpus/<target>/`, git-ignored) is seeded first: the built-in seeds
//! (`prima_server::fuzzing::seeds`), the manifests under `manifests/`, and the header of the
//! fetched SmolLM2 model (its metadata and tensor index, the tensor data cut off) where
//! it has been fetched. A crash leaves its input in `fuzz/artifacts/<target>/` and fails
//! the run; its bytes then belong in `prima-cli/tests/fuzz_regressions.rs`.
//!
//! Built without a sanitizer (`-s none`): the code is safe Rust, so what the fuzzer looks
//! for is panics, overflows (debug assertions are on), hangs and runaway allocations,
//! and a sanitizer would halve the executions. Needs the nightly toolchain; installs
//! cargo-fuzz from crates.io into `~/.cargo/bin` when it is missing.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use prima_core::gguf::GgufFile;
use prima_server::fuzzing;

use crate::layout::Layout;

#[derive(clap::Args)]
pub struct FuzzArgs {
    /// Seconds per target.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Only these targets (default: all of them).
    #[arg(long = "target", value_name = "NAME")]
    pub targets: Vec<String>,
}

/// Options every build and run takes: no sanitizer, debug assertions on.
const BUILD_FLAGS: [&str; 3] = ["-s", "none", "-a"];

/// Why fuzzing cannot run on this machine, if it cannot: no nightly toolchain.
pub fn unavailable() -> Option<String> {
    let nightly = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--version"])
        .output();
    match nightly {
        Ok(o) if o.status.success() => None,
        _ => Some("needs the nightly toolchain (`rustup toolchain install nightly`)".into()),
    }
}

pub fn run(layout: &Layout, args: &FuzzArgs) -> Result<()> {
    if let Some(why) = unavailable() {
        bail!("cannot fuzz: {why}");
    }
    let targets: Vec<&str> = if args.targets.is_empty() {
        fuzzing::TARGETS.to_vec()
    } else {
        for t in &args.targets {
            if !fuzzing::TARGETS.contains(&t.as_str()) {
                bail!(
                    "no fuzz target '{t}' (there are: {})",
                    fuzzing::TARGETS.join(", ")
                );
            }
        }
        args.targets.iter().map(String::as_str).collect()
    };
    ensure_cargo_fuzz()?;
    let dir = layout.workspace.join("fuzz");
    for t in &targets {
        seed(layout, t)?;
    }
    let started = Instant::now();
    let status = cargo_fuzz(&dir)
        .arg("build")
        .args(BUILD_FLAGS)
        .status()
        .context("cannot start cargo fuzz build")?;
    if !status.success() {
        bail!("cargo fuzz build failed");
    }
    eprintln!(
        "fuzz targets built in {:.0} s",
        started.elapsed().as_secs_f64()
    );

    let mut lines = Vec::new();
    let mut failed = Vec::new();
    for t in &targets {
        let started = Instant::now();
        let out = cargo_fuzz(&dir)
            .args(["run", t])
            .args(BUILD_FLAGS)
            .arg("--")
            .arg(format!("-max_total_time={}", args.seconds))
            // A single input that takes 10 s, or 2 GiB, is a bug in itself.
            .args(["-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1"])
            .output()
            .with_context(|| format!("cannot start cargo fuzz run {t}"))?;
        let log = String::from_utf8_lossy(&out.stderr);
        let secs = started.elapsed().as_secs_f64();
        let execs = final_stat(&log, "stat::number_of_executed_units").unwrap_or(0);
        let rate = final_stat(&log, "stat::average_exec_per_sec").unwrap_or(0);
        if out.status.success() {
            lines.push(format!(
                "passed  {t}: {execs} executions in {secs:.0} s ({rate}/s)"
            ));
        } else {
            eprintln!("{log}");
            lines.push(format!(
                "FAILED  {t} after {execs} executions: its input is in fuzz/artifacts/{t}/ \
                 (replay: cargo +nightly fuzz run {t} -s none -a <file>)"
            ));
            failed.push(*t);
        }
    }
    for line in &lines {
        eprintln!("{line}");
    }
    if !failed.is_empty() {
        bail!("fuzz targets failed: {}", failed.join(", "));
    }
    Ok(())
}

/// `cargo +nightly fuzz` in the fuzz crate.
fn cargo_fuzz(dir: &Path) -> Command {
    let mut c = Command::new("cargo");
    c.args(["+nightly", "fuzz"]).current_dir(dir);
    c
}

fn ensure_cargo_fuzz() -> Result<()> {
    let installed = Command::new("cargo")
        .args(["+nightly", "fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if installed {
        return Ok(());
    }
    eprintln!("installing cargo-fuzz from crates.io into ~/.cargo/bin");
    let status = Command::new("cargo")
        .args(["install", "cargo-fuzz", "--locked"])
        .status()
        .context("cannot start cargo install")?;
    if !status.success() {
        bail!("cargo install cargo-fuzz failed");
    }
    Ok(())
}

/// Writes target `name`'s seeds into its corpus (existing entries are kept: the corpus
/// grows from run to run on one machine).
fn seed(layout: &Layout, name: &str) -> Result<()> {
    let corpus = layout.workspace.join("fuzz/corpus").join(name);
    fs::create_dir_all(&corpus).with_context(|| format!("cannot create {}", corpus.display()))?;
    let write = |file: &str, bytes: &[u8]| {
        fs::write(corpus.join(file), bytes)
            .with_context(|| format!("cannot write {}/{file}", corpus.display()))
    };
    for (i, s) in fuzzing::seeds(name).iter().enumerate() {
        write(&format!("seed-{i}"), s)?;
    }
    match name {
        "manifest" => {
            for path in toml_files(&layout.workspace.join("manifests"))? {
                let file = path
                    .strip_prefix(&layout.workspace)
                    .unwrap_or(&path)
                    .to_string_lossy()
                    .replace('/', "_");
                write(&file, &fs::read(&path)?)?;
            }
        }
        "gguf" => {
            if let Some(header) = smollm2_header(layout)? {
                write("smollm2-header.gguf", &header)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Every `.toml` under `dir`, recursively.
fn toml_files(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            out.extend(toml_files(&path)?);
        } else if path.extension().is_some_and(|e| e == "toml") {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// The fetched SmolLM2 file up to its tensor data (about 1.5 MB: the vocabulary, merges
/// and tensor index), if it has been fetched.
fn smollm2_header(layout: &Layout) -> Result<Option<Vec<u8>>> {
    let Ok(entries) = fs::read_dir(layout.fetched_models()) else {
        return Ok(None);
    };
    let mut models: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with("SmolLM2") && name.ends_with(".gguf")
        })
        .collect();
    models.sort();
    let Some(path) = models.first() else {
        return Ok(None);
    };
    let g = GgufFile::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let end = g.data_offset().min(g.file_size()) as usize;
    Ok(Some(g.bytes()[..end].to_vec()))
}

/// A `stat::NAME: VALUE` line of libFuzzer's final statistics.
fn final_stat(log: &str, name: &str) -> Option<u64> {
    log.lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_stats_are_read() {
        let log = "#1000 DONE cov: 3\nstat::number_of_executed_units: 123456\n\
                   stat::average_exec_per_sec:     4115\n";
        assert_eq!(
            final_stat(log, "stat::number_of_executed_units"),
            Some(123_456)
        );
        assert_eq!(final_stat(log, "stat::average_exec_per_sec"), Some(4115));
        assert_eq!(final_stat(log, "stat::peak_rss_mb"), None);
    }
}

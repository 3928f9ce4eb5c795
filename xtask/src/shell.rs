//! Running external programs (python3, pip, cmake, the compilers, llama.cpp's
//! tools) with their command line in every error message.

use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// A printable form of a command line.
pub fn describe(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| {
        let a = a.to_string_lossy();
        if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '"') {
            format!("{a:?}")
        } else {
            a.into_owned()
        }
    }));
    parts.join(" ")
}

/// Run with inherited stdio; fail unless it exits successfully.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot start `{}`", describe(cmd)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", describe(cmd));
    }
    Ok(())
}

/// Run and capture stdout; stderr passes through. Fails unless it exits successfully.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot start `{}`", describe(cmd)))?;
    if !out.status.success() {
        bail!("`{}` failed ({})", describe(cmd), out.status);
    }
    String::from_utf8(out.stdout).with_context(|| format!("`{}` printed non-UTF-8", describe(cmd)))
}

/// Run with stdout and stderr appended to `log`; on failure the error carries
/// the log's last lines.
pub fn run_logged(cmd: &mut Command, log: &Path) -> Result<()> {
    let file = File::options()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let status = cmd
        .stdout(file.try_clone()?)
        .stderr(file)
        .status()
        .with_context(|| format!("cannot start `{}`", describe(cmd)))?;
    if !status.success() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(30)..].join("\n");
        bail!(
            "`{}` failed ({status}); last lines of {}:\n{tail}",
            describe(cmd),
            log.display()
        );
    }
    Ok(())
}

/// Whether `program` can be found on PATH.
pub fn on_path(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `apt-get install` of `packages` (no recommends, no questions), updating the package
/// lists once and retrying if the first try fails: a fresh machine's lists may be empty
/// or stale. Whether it succeeded.
pub fn apt_install(packages: &[&str]) -> bool {
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    install()
        || (Command::new("apt-get")
            .args(["update", "-qq"])
            .status()
            .is_ok_and(|s| s.success())
            && install())
}

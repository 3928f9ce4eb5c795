//! `cargo xtask test`: the project's full test run — make the test models,
//! check formatting and lints, then build and test the whole workspace in
//! release mode (every test binary runs even when an earlier one fails).
//! Model-level tests are told that their models must exist
//! (`PRIMA_REQUIRE_MODELS=1`), so a missing model fails instead of skipping.

use std::env;
use std::process::Command;

use anyhow::{Context, Result};

use crate::layout::Layout;
use crate::test_models;

/// Returns the exit code of the first cargo step that fails, 0 otherwise.
pub fn run(layout: &Layout) -> Result<i32> {
    test_models::run(layout)?;
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let steps: [&[&str]; 4] = [
        &["fmt", "--all", "--check"],
        &[
            "clippy",
            "--release",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        &["build", "--release", "--workspace"],
        &["test", "--release", "--workspace", "--no-fail-fast"],
    ];
    for step in steps {
        let status = Command::new(&cargo)
            .args(step)
            .current_dir(&layout.workspace)
            .env("PRIMA_REQUIRE_MODELS", "1")
            .status()
            .with_context(|| format!("cannot start cargo {}", step.join(" ")))?;
        if !status.success() {
            return Ok(status.code().unwrap_or(1));
        }
    }
    Ok(0)
}

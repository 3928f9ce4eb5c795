//! `cargo xtask test`: the project's full test run — make the test models,
//! then build and test the whole workspace in release mode (every test
//! binary runs even when an earlier one fails).

use std::env;
use std::process::Command;

use anyhow::{Context, Result};

use crate::layout::Layout;
use crate::test_models;

/// Returns the exit code of the first cargo step that fails, 0 otherwise.
pub fn run(layout: &Layout) -> Result<i32> {
    test_models::run(layout)?;
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let steps: [&[&str]; 2] = [
        &["build", "--release", "--workspace"],
        &["test", "--release", "--workspace", "--no-fail-fast"],
    ];
    for step in steps {
        let status = Command::new(&cargo)
            .args(step)
            .current_dir(&layout.workspace)
            .status()
            .with_context(|| format!("cannot start cargo {}", step.join(" ")))?;
        if !status.success() {
            return Ok(status.code().unwrap_or(1));
        }
    }
    Ok(0)
}

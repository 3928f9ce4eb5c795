//! `cargo xtask test`: the project's full test run — make the test models,
//! check formatting and lints, then build and test the whole workspace in
//! release mode (every test binary runs even when an earlier one fails).
//! Model-level tests are told that their models must exist
//! (`PRIMA_REQUIRE_MODELS=1`), so a missing model fails instead of skipping.
//! Then the CPU backend's kernel tests run once more built for aarch64 under
//! qemu-user, so the NEON kernels are checked against the scalar ones on an
//! x86-64 machine (`.ci/run` installs the target, the cross linker and qemu;
//! without them this step is reported as skipped, never passed).

use std::env;
use std::process::Command;

use anyhow::{Context, Result};

use crate::build_tools;
use crate::layout::Layout;
use crate::test_models;

/// Returns the exit code of the first cargo step that fails, 0 otherwise.
pub fn run(layout: &Layout) -> Result<i32> {
    build_tools::ensure_for_cargo(layout)?;
    test_models::run(layout)?;
    // The server tests drive `prima serve` with the official client.
    test_models::ensure_python_modules(&[("openai", "openai")])?;
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
            return Ok(exit_code(status));
        }
    }
    aarch64_kernels(layout, &cargo)
}

const ARM_TARGET: &str = "aarch64-unknown-linux-gnu";
const ARM_LINKER: &str = "aarch64-linux-gnu-gcc";
const ARM_RUNNER: &str = "qemu-aarch64";

/// The backend's kernel tests (`tests/simd.rs`, scalar oracle against every level the
/// CPU runs) built for aarch64 and run under qemu-user, where the NEON level exists.
fn aarch64_kernels(layout: &Layout, cargo: &std::ffi::OsStr) -> Result<i32> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(ARM_TARGET))
        .unwrap_or(false);
    let have = |tool: &str| {
        Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !installed || !have(ARM_LINKER) || !have(ARM_RUNNER) {
        eprintln!(
            "SKIPPED: aarch64 (NEON) kernel tests: need the {ARM_TARGET} Rust target, \
             {ARM_LINKER} and {ARM_RUNNER} (`.ci/run` installs them)"
        );
        return Ok(0);
    }
    // `-cpu max` has the dot-product extension, so both NEON levels run.
    let runner = format!("{ARM_RUNNER} -cpu max -L /usr/aarch64-linux-gnu");
    let status = Command::new(cargo)
        .args(["test", "--release", "--target", ARM_TARGET])
        .args(["-p", "prima-backend-cpu", "--test", "simd"])
        .current_dir(&layout.workspace)
        .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", ARM_LINKER)
        .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER", runner)
        .status()
        .context("cannot start the aarch64 kernel tests")?;
    Ok(exit_code(status))
}

/// 0 for success, else the process's code (1 when a signal ended it).
fn exit_code(status: std::process::ExitStatus) -> i32 {
    if status.success() {
        0
    } else {
        status.code().unwrap_or(1)
    }
}

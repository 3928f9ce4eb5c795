//! `cargo xtask test`: the project's full test run — check the layering (`layering.rs`),
//! make the test models,
//! check formatting and lints, then build and test the whole workspace in
//! release mode (every test binary runs even when an earlier one fails).
//! Model-level tests are told that their models must exist
//! (`PRIMA_REQUIRE_MODELS=1`), so a missing model fails instead of skipping.
//! Then steps that need more than a build machine, each run where the machine
//! can and otherwise reported as skipped, never passed, in the closing summary:
//! the wgpu backend's tests on Mesa's software Vulkan driver (lavapipe, which
//! `cargo xtask setup` installs), the home-lab smoke bed (`xtask/tests/homelab.rs`,
//! `#[ignore]`d in a plain `cargo test`: it needs root, cgroup v1, iproute2 and no
//! bed up), and the CPU backend's kernel tests built for aarch64 under qemu-user, so
//! the NEON kernels are checked against the scalar ones on an x86-64 machine
//! (`.ci/run` installs the target, the cross linker and qemu). Likewise mDNS discovery between network
//! namespaces on a bridge (`prima-cli/tests/discovery_netns.rs`) and the ring across
//! two namespaces joined by a relay (`prima-cli/tests/two_lans.rs`), where root can
//! make namespaces. Last, the workspace type-checked for macOS, Windows and Android
//! (`cross_check.rs`), skipped where the Rust targets cannot be added, and every fuzz
//! target for 20 s (`fuzz.rs`), skipped without a nightly toolchain, and the web page in
//! headless Chromium (`browser.rs` installs it as root on Debian; skipped elsewhere).
//! And the Windows build under Wine (`wine.rs` installs it as root on Debian): the
//! release `.zip` unpacked and run, then a ring of a Linux node and a `prima.exe` node
//! (`prima-cli/tests/windows_ring.rs`); skipped without mingw-w64 or the Rust target.

use std::env;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::build_tools;
use crate::cross_check;
use crate::dist;
use crate::fuzz;
use crate::homelab;
use crate::layout::Layout;
use crate::test_models;
use crate::vulkan;

/// Returns the exit code of the first cargo step that fails, 0 otherwise.
pub fn run(layout: &Layout) -> Result<i32> {
    // The layout's one-way flow first: a wrong import fails in seconds, before any build.
    crate::layering::run(layout)?;
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
        // The wgpu backend's tests run below, as a step of their own.
        &[
            "test",
            "--release",
            "--workspace",
            "--no-fail-fast",
            "--exclude",
            WGPU_PLUGIN,
        ],
    ];
    // The tests' `prima apply` runs keep their clusters' state (kept nodes, last plans)
    // in the build's directory, not in the user's ~/.cache/prima/apply, where a test
    // cluster named like the user's home one would replace its last plan.
    let state = layout.workspace.join("target").join("test-state");
    for step in steps {
        let status = Command::new(&cargo)
            .args(step)
            .current_dir(&layout.workspace)
            .env("PRIMA_REQUIRE_MODELS", "1")
            .env("PRIMA_STATE_DIR", &state)
            .status()
            .with_context(|| format!("cannot start cargo {}", step.join(" ")))?;
        if !status.success() {
            return Ok(exit_code(status));
        }
    }
    // Each runs even when an earlier one fails, as the test binaries do.
    let [archive, arm_archive, arm_archive_qemu] = release_archives(layout)?;
    let [windows_archive, windows_ring] = windows_under_wine(layout, &cargo)?;
    let optional = [
        (
            "wgpu backend on lavapipe (every kernel and format, SmolLM2, Gemma 3)",
            wgpu_on_lavapipe(layout, &cargo)?,
        ),
        ("homelab smoke bed", homelab_smoke_bed(layout, &cargo)?),
        (
            "discovery across network namespaces",
            discovery_netns(layout, &cargo)?,
        ),
        (
            "ring across two networks (relay)",
            relay_two_lans(layout, &cargo)?,
        ),
        (
            "aarch64 (NEON) kernel tests",
            aarch64_kernels(layout, &cargo)?,
        ),
        (
            "macOS, Windows and Android type checks",
            cross_platform_checks(layout)?,
        ),
        ("web page in headless Chromium", web_page(layout, &cargo)?),
        ("fuzz targets, 20 s each", fuzz_briefly(layout)),
        ("release archive, unpacked and run (dist)", archive),
        ("aarch64 release archive (dist)", arm_archive),
        ("aarch64 release archive under qemu", arm_archive_qemu),
        ("Windows release archive under wine (dist)", windows_archive),
        ("Linux and Windows (wine) nodes in one ring", windows_ring),
    ];
    let (lines, code) = summary(&optional);
    for line in lines {
        eprintln!("{line}");
    }
    Ok(code)
}

/// How a step that needs more than a build machine ended.
enum Optional {
    /// It ran; the exit code of its cargo run.
    Ran(i32),
    /// This machine cannot run it, for this reason.
    Skipped(String),
}

/// The closing lines, one per step, and the exit code: the first failure's, 0 when
/// every step that ran passed. A skipped step fails nothing, but its line says so.
fn summary(steps: &[(&str, Optional)]) -> (Vec<String>, i32) {
    let mut lines = Vec::new();
    let mut code = 0;
    for (name, outcome) in steps {
        lines.push(match outcome {
            Optional::Ran(0) => format!("passed  {name}"),
            Optional::Ran(failed) => {
                if code == 0 {
                    code = *failed;
                }
                format!("FAILED  {name}")
            }
            Optional::Skipped(why) => format!("SKIPPED {name}: {why}"),
        });
    }
    (lines, code)
}

/// Every fuzz target for 20 s (`cargo xtask fuzz`), where nightly Rust is installed.
fn fuzz_briefly(layout: &Layout) -> Optional {
    if let Some(why) = fuzz::unavailable() {
        return Optional::Skipped(why);
    }
    let args = fuzz::FuzzArgs {
        seconds: 20,
        targets: Vec::new(),
    };
    match fuzz::run(layout, &args) {
        Ok(()) => Optional::Ran(0),
        Err(e) => {
            eprintln!("fuzz: {e:#}");
            Optional::Ran(1)
        }
    }
}

/// The wgpu backend's crate (`plugins/backend-metal`).
const WGPU_PLUGIN: &str = "prima-backend-metal";

/// The wgpu backend's tests: its unit tests, and `tests/lavapipe.rs` against the CPU
/// backend on Mesa's software Vulkan driver, required (`PRIMA_REQUIRE_VULKAN=1`) where
/// lavapipe is installed. Without it the GPU tests skip, and the step says so.
fn wgpu_on_lavapipe(layout: &Layout, cargo: &std::ffi::OsStr) -> Result<Optional> {
    let installed = vulkan::lavapipe_installed();
    let mut cmd = Command::new(cargo);
    cmd.args(["test", "--release", "-p", WGPU_PLUGIN])
        .current_dir(&layout.workspace)
        .env("PRIMA_REQUIRE_MODELS", "1");
    if installed {
        cmd.env("PRIMA_REQUIRE_VULKAN", "1");
    }
    let code = exit_code(
        cmd.status()
            .context("cannot start the wgpu backend's tests")?,
    );
    Ok(if installed || code != 0 {
        Optional::Ran(code)
    } else {
        Optional::Skipped(
            "lavapipe is not installed (`cargo xtask setup` installs it as root on Debian/Ubuntu); \
             only the unit tests ran"
                .into(),
        )
    })
}

/// The smoke test's name in `xtask/tests/homelab.rs`.
const SMOKE_TEST: &str = "smoke_bed_generates_and_leaves_nothing_behind";

/// The home-lab smoke bed (two devices on SmolLM2, one below its share of the model)
/// where `homelab::ready` says a bed can come up; the test is `#[ignore]`d, so the
/// workspace run above only lists it.
fn homelab_smoke_bed(layout: &Layout, cargo: &std::ffi::OsStr) -> Result<Optional> {
    if let Err(why) = homelab::ready() {
        return Ok(Optional::Skipped(format!("{why:#}")));
    }
    let status = Command::new(cargo)
        .args(["test", "--release", "-p", "xtask", "--test", "homelab"])
        .args(["--", "--ignored", "--exact", SMOKE_TEST])
        .current_dir(&layout.workspace)
        .env("PRIMA_REQUIRE_MODELS", "1")
        .status()
        .context("cannot start the home-lab smoke test")?;
    Ok(Optional::Ran(exit_code(status)))
}

/// `prima node --advertise` in namespaces on one bridge, found by `prima discover` and
/// `prima apply` (`prima-cli/tests/discovery_netns.rs`, `#[ignore]`d like the smoke
/// bed), where this machine can make network namespaces.
fn discovery_netns(layout: &Layout, cargo: &std::ffi::OsStr) -> Result<Optional> {
    if let Err(why) = can_make_namespaces() {
        return Ok(Optional::Skipped(why));
    }
    let status = Command::new(cargo)
        .args([
            "test",
            "--release",
            "-p",
            "prima-cli",
            "--test",
            "discovery_netns",
        ])
        .args(["--", "--ignored"])
        .current_dir(&layout.workspace)
        .env("PRIMA_REQUIRE_MODELS", "1")
        .status()
        .context("cannot start the discovery test")?;
    Ok(Optional::Ran(exit_code(status)))
}

/// Whether `ip netns add` works here (root, iproute2, a kernel that allows it).
fn can_make_namespaces() -> std::result::Result<(), String> {
    // SAFETY: geteuid only reads the process's effective user id.
    if unsafe { libc::geteuid() } != 0 {
        return Err("network namespaces need root".into());
    }
    let probe = "prima-dc-probe";
    let added = Command::new("ip")
        .args(["netns", "add", probe])
        .output()
        .map_err(|e| format!("`ip` cannot run ({e}): install iproute2"))?;
    if !added.status.success() {
        return Err(format!(
            "`ip netns add` fails: {}",
            String::from_utf8_lossy(&added.stderr).trim()
        ));
    }
    let _ = Command::new("ip").args(["netns", "delete", probe]).status();
    Ok(())
}

/// The ring across two network namespaces joined by a relay
/// (`prima-cli/tests/two_lans.rs`, `#[ignore]`d like the smoke bed), where this machine
/// can make network namespaces.
fn relay_two_lans(layout: &Layout, cargo: &std::ffi::OsStr) -> Result<Optional> {
    if let Err(why) = can_make_namespaces() {
        return Ok(Optional::Skipped(why));
    }
    let status = Command::new(cargo)
        .args(["test", "--release", "-p", "prima-cli", "--test", "two_lans"])
        .args(["--", "--ignored", "--nocapture"])
        .current_dir(&layout.workspace)
        .env("PRIMA_REQUIRE_MODELS", "1")
        .status()
        .context("cannot start the two-network relay test")?;
    Ok(Optional::Ran(exit_code(status)))
}

/// The web page driven in headless Chromium over chromedriver
/// (`prima-cli/tests/web_page.rs`, `#[ignore]`d in a plain `cargo test`): chat, a ring
/// of three losing a device and getting it back, screenshots in `target/web-screenshots`.
/// The browser is installed first where it is missing and can be (root on Debian).
fn web_page(layout: &Layout, cargo: &std::ffi::OsStr) -> Result<Optional> {
    if let Err(why) = crate::browser::ensure() {
        return Ok(Optional::Skipped(why));
    }
    let status = Command::new(cargo)
        .args(["test", "--release", "-p", "prima-cli", "--test", "web_page"])
        .args(["--", "--ignored", "--nocapture", "--test-threads", "1"])
        .current_dir(&layout.workspace)
        .env("PRIMA_REQUIRE_MODELS", "1")
        .env("PRIMA_REQUIRE_BROWSER", "1")
        .status()
        .context("cannot start the web page's browser tests")?;
    Ok(Optional::Ran(exit_code(status)))
}

const ARM_TARGET: &str = "aarch64-unknown-linux-gnu";
const ARM_LINKER: &str = "aarch64-linux-gnu-gcc";
const ARM_RUNNER: &str = "qemu-aarch64";

/// The backend's kernel tests (`tests/simd.rs`, scalar oracle against every level the
/// CPU runs) built for aarch64 and run under qemu-user, where the NEON level exists.
fn aarch64_kernels(layout: &Layout, cargo: &std::ffi::OsStr) -> Result<Optional> {
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
        return Ok(Optional::Skipped(format!(
            "need the {ARM_TARGET} Rust target, {ARM_LINKER} and {ARM_RUNNER} \
             (`.ci/run` installs them)"
        )));
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
    Ok(Optional::Ran(exit_code(status)))
}

/// `cargo xtask cross-check`: every crate type-checked for the other platforms; a crate
/// expected to build that fails is a failure. Skipped where the targets cannot be added.
fn cross_platform_checks(layout: &Layout) -> Result<Optional> {
    if let Err(why) = cross_check::ensure_targets() {
        return Ok(Optional::Skipped(format!("{why:#}")));
    }
    let args = cross_check::CrossCheckArgs::default();
    Ok(Optional::Ran(cross_check::run(layout, &args)?))
}

/// `cargo xtask dist --check` for this machine (unpacked in an empty directory and run)
/// and for aarch64 Linux (built with cargo-zigbuild, listed, its headers read, and
/// `prima plugins` run under qemu-aarch64 where it is installed).
fn release_archives(layout: &Layout) -> Result<[Optional; 3]> {
    let host = dist::host_target()?;
    let ran = |result: Result<()>| match result {
        Ok(()) => Optional::Ran(0),
        Err(err) => {
            eprintln!("error: {err:#}");
            Optional::Ran(1)
        }
    };
    let native = ran(dist::build(layout, &host, &host).and_then(|r| dist::check_host(layout, &r)));
    if host == ARM_TARGET {
        let why = || Optional::Skipped("this machine is aarch64: its archive was run above".into());
        return Ok([native, why(), why()]);
    }
    // A second whole build, cross-compiled with zig (HiGHS's C++ included): too long for
    // every test run on a 2-core machine, so it runs when asked.
    if env::var_os("PRIMA_TEST_ARM_ARCHIVE").is_none_or(|v| v != "1") {
        let why = || {
            Optional::Skipped(
                "a second whole build; set PRIMA_TEST_ARM_ARCHIVE=1 or run \
                 `cargo xtask dist --target aarch64-unknown-linux-gnu --check`"
                    .into(),
            )
        };
        return Ok([native, why(), why()]);
    }
    if !rust_target_installed(ARM_TARGET) {
        let why = || {
            Optional::Skipped(format!(
                "needs the {ARM_TARGET} Rust target (`.ci/run` adds it)"
            ))
        };
        return Ok([native, why(), why()]);
    }
    let (arm, qemu) =
        match dist::build(layout, &host, ARM_TARGET).and_then(|r| dist::check_cross(&r)) {
            Ok(dist::CrossCheck::RanUnderQemu | dist::CrossCheck::RanUnderWine) => {
                (Optional::Ran(0), Optional::Ran(0))
            }
            Ok(dist::CrossCheck::NotRun(why)) => (Optional::Ran(0), Optional::Skipped(why)),
            Err(err) => {
                eprintln!("error: {err:#}");
                (
                    Optional::Ran(1),
                    Optional::Skipped("the aarch64 archive did not build".into()),
                )
            }
        };
    Ok([native, arm, qemu])
}

const WINDOWS_TARGET: &str = "x86_64-pc-windows-gnu";

/// The Windows release archive (`cargo xtask dist --target x86_64-pc-windows-gnu
/// --check`: built with mingw-w64, unpacked, `prima.exe plugins` and `run` under wine
/// against the Linux build's text), then `prima-cli/tests/windows_ring.rs` with its
/// `prima.exe` beside a Linux node. Wine is installed first where it is missing and can
/// be (root on Debian); skipped without it, the Rust target or mingw-w64.
fn windows_under_wine(layout: &Layout, cargo: &std::ffi::OsStr) -> Result<[Optional; 2]> {
    let skipped = |why: String| Ok([Optional::Skipped(why.clone()), Optional::Skipped(why)]);
    if !rust_target_installed(WINDOWS_TARGET) {
        return skipped(format!(
            "needs the {WINDOWS_TARGET} Rust target (`.ci/run` adds it)"
        ));
    }
    if let Err(why) = cross_check::toolchain_env(WINDOWS_TARGET) {
        return skipped(format!("{why:#} (`.ci/run` installs it)"));
    }
    if let Err(why) = crate::wine::ensure() {
        return skipped(why);
    }
    let unpacked = layout.workspace.join("target").join("windows-release");
    let checked = dist::build(layout, &dist::host_target()?, WINDOWS_TARGET)
        .and_then(|r| dist::check_under_wine(layout, &r, Some(&unpacked)).map(|c| (r, c)));
    let release = match checked {
        Ok((release, dist::CrossCheck::RanUnderWine)) => release,
        Ok((_, dist::CrossCheck::NotRun(why))) => return skipped(why),
        Ok((_, dist::CrossCheck::RanUnderQemu)) => bail!("a Windows archive ran under qemu?"),
        Err(err) => {
            eprintln!("error: {err:#}");
            return Ok([
                Optional::Ran(1),
                Optional::Skipped("the Windows archive did not pass".into()),
            ]);
        }
    };
    let top = release
        .archive
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".zip"))
        .context("a Windows archive not named .zip")?;
    let status = Command::new(cargo)
        .args([
            "test",
            "--release",
            "-p",
            "prima-cli",
            "--test",
            "windows_ring",
        ])
        .args(["--", "--ignored", "--nocapture"])
        .current_dir(&layout.workspace)
        .env("PRIMA_REQUIRE_MODELS", "1")
        .env("PRIMA_REQUIRE_WINE", "1")
        .env("PRIMA_WINDOWS_DIR", unpacked.join(top))
        .status()
        .context("cannot start the mixed Linux/Windows ring test")?;
    Ok([Optional::Ran(0), Optional::Ran(exit_code(status))])
}

fn rust_target_installed(target: &str) -> bool {
    Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.trim() == target)
        })
        .unwrap_or(false)
}

/// 0 for success, else the process's code (1 when a signal ended it).
fn exit_code(status: std::process::ExitStatus) -> i32 {
    if status.success() {
        0
    } else {
        status.code().unwrap_or(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_is_reported_as_a_skip_and_a_failure_is_not_hidden() {
        let steps = [
            ("homelab smoke bed", Optional::Skipped("not root".into())),
            ("aarch64 (NEON) kernel tests", Optional::Ran(0)),
        ];
        assert_eq!(
            summary(&steps),
            (
                vec![
                    "SKIPPED homelab smoke bed: not root".to_string(),
                    "passed  aarch64 (NEON) kernel tests".to_string(),
                ],
                0
            )
        );
        let steps = [
            ("homelab smoke bed", Optional::Ran(101)),
            ("aarch64 (NEON) kernel tests", Optional::Ran(2)),
        ];
        assert_eq!(summary(&steps).1, 101);
    }
}

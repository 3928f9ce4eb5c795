//! `cargo xtask cross-check`: which parts of Prima build for the platforms this machine
//! cannot run — macOS on Apple silicon, Windows (GNU toolchain) and Android on ARM64.
//! The workspace's crates (xtask aside: a Linux developer tool) are type-checked with one
//! `cargo check --release --target T --keep-going --lib --bins` per platform, and cargo's
//! JSON messages say which crate failed; a warning fails a crate too, as clippy's `-D
//! warnings` does on Linux. `--release` shares the build scripts and proc macros with the
//! release build. A crate that cannot build for a platform on this machine, for a reason
//! stated here (a C++ library its build script compiles, with no cross compiler for it),
//! is listed as skipped, never as passed.
//!
//! With `--build`, platforms whose linker is installed (Windows: Debian's mingw-w64) are
//! also built in full — `prima.exe` and the plugin DLLs — and with `--run`, `prima
//! plugins` runs under wine where it is installed.
//!
//! Type-checking shows that the code compiles for a platform, not that it works there:
//! README's "Platforms" table says what was ever run where.

use std::env;
use std::ffi::OsString;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::layout::Layout;

/// A platform checked here.
pub struct Platform {
    pub triple: &'static str,
    pub name: &'static str,
    /// The C and C++ cross compilers its build scripts need, and the linker for a full
    /// build, when they can be installed here.
    toolchain: Option<Toolchain>,
}

struct Toolchain {
    cc: &'static str,
    cxx: &'static str,
    linker: &'static str,
}

pub const PLATFORMS: [Platform; 3] = [
    Platform {
        triple: "aarch64-apple-darwin",
        name: "macOS (Apple silicon)",
        toolchain: None,
    },
    Platform {
        triple: "x86_64-pc-windows-gnu",
        name: "Windows (x86-64, GNU)",
        toolchain: Some(MINGW),
    },
    Platform {
        triple: "aarch64-linux-android",
        name: "Android (ARM64)",
        toolchain: None,
    },
];

/// Debian's mingw-w64 (gcc-/g++-mingw-w64-x86-64), its POSIX-threads variant: the
/// default, win32-threads one has no `std::thread` or `std::mutex`, which HiGHS uses, and
/// the linker must be the same variant as the C++ compiler.
const MINGW: Toolchain = Toolchain {
    cc: "x86_64-w64-mingw32-gcc-posix",
    cxx: "x86_64-w64-mingw32-g++-posix",
    linker: "x86_64-w64-mingw32-gcc-posix",
};

/// The crate whose build script compiles a C++ library (HiGHS, with cmake).
const HIGHS_PLUGIN: &str = "prima-solver-highs";

impl Platform {
    /// Cargo's and the `cc` crate's variables naming this platform's toolchain, where
    /// it is installed (else none: the build scripts that need it are skipped).
    fn toolchain_env(&self) -> Vec<(String, &'static str)> {
        let Some(t) = self.toolchain.as_ref().filter(|t| installed(t.cxx)) else {
            return Vec::new();
        };
        let under = self.triple.replace('-', "_");
        vec![
            (format!("CC_{under}"), t.cc),
            (format!("CXX_{under}"), t.cxx),
            (
                format!("CARGO_TARGET_{}_LINKER", under.to_uppercase()),
                t.linker,
            ),
        ]
    }
}

/// The toolchain variables for building `triple` in full (`cargo xtask dist` for Windows):
/// an error naming what to install where its cross compilers are missing.
pub fn toolchain_env(triple: &str) -> Result<Vec<(String, &'static str)>> {
    let platform = PLATFORMS
        .iter()
        .find(|p| p.triple == triple)
        .with_context(|| format!("{triple}: not a platform cross-check knows"))?;
    let Some(t) = &platform.toolchain else {
        bail!("{triple}: no cross toolchain to be had here");
    };
    let env = platform.toolchain_env();
    if env.is_empty() {
        bail!(
            "{triple}: {} is not installed (Debian: gcc-mingw-w64-x86-64 g++-mingw-w64-x86-64)",
            t.cxx
        );
    }
    Ok(env)
}

#[derive(clap::Args, Default)]
pub struct CrossCheckArgs {
    /// Also build in full (release) where the platform's linker is installed.
    #[arg(long)]
    pub build: bool,
    /// With --build: run `prima plugins` from the Windows build under wine, if installed.
    #[arg(long, requires = "build")]
    pub run: bool,
    /// Only the platforms whose target triple contains this text.
    #[arg(long, value_name = "TEXT")]
    pub only: Option<String>,
}

/// How one crate fared on one platform.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Passed,
    /// The first lines of cargo's errors.
    Failed(String),
    /// Not checked, for this reason.
    Skipped(String),
}

/// Why `krate` cannot be checked for `triple` on this machine, if it cannot. `has` says
/// whether a program is installed.
pub fn skip_reason(krate: &str, triple: &str, has: &dyn Fn(&str) -> bool) -> Option<String> {
    if krate != HIGHS_PLUGIN {
        return None;
    }
    // Even `cargo check` runs build scripts, and highs-sys's compiles HiGHS for the target.
    let lacks = match triple {
        "x86_64-pc-windows-gnu" if has(MINGW.cxx) => return None,
        "x86_64-pc-windows-gnu" => {
            format!(
                "{} is not installed (Debian: g++-mingw-w64-x86-64)",
                MINGW.cxx
            )
        }
        "aarch64-apple-darwin" => "there is no macOS SDK or Apple C++ cross compiler here".into(),
        "aarch64-linux-android" => "there is no Android NDK (its C++ compiler) here".into(),
        _ => "there is no C++ cross compiler for it here".into(),
    };
    Some(format!(
        "its build script compiles HiGHS (C++) for the target, and {lacks}"
    ))
}

/// Whether `program --version` runs.
fn installed(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The Rust targets rustup has installed.
fn installed_targets() -> Result<String> {
    let out = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("cannot run rustup (the cross checks add Rust targets with it)")?;
    if !out.status.success() {
        bail!("`rustup target list --installed` failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Adds the platforms' Rust targets that are missing (`rustup target add`): `Err` says
/// why the checks cannot run here (no rustup, or the targets cannot be downloaded).
pub fn ensure_targets() -> Result<()> {
    let have = installed_targets()?;
    let missing: Vec<&str> = PLATFORMS
        .iter()
        .map(|p| p.triple)
        .filter(|t| !have.lines().any(|l| l.trim() == *t))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("cross-check: rustup target add {}", missing.join(" "));
    let status = Command::new("rustup")
        .args(["target", "add"])
        .args(&missing)
        .status()
        .context("cannot run rustup")?;
    if !status.success() {
        bail!(
            "`rustup target add {}` failed ({status}): offline?",
            missing.join(" ")
        );
    }
    Ok(())
}

/// A workspace crate: its name and cargo's package id (which JSON messages carry).
pub struct Crate {
    pub name: String,
    id: String,
}

/// The workspace's crates, xtask aside, from `cargo metadata`.
fn workspace_crates(layout: &Layout, cargo: &OsString) -> Result<Vec<Crate>> {
    let out = Command::new(cargo)
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(&layout.workspace)
        .output()
        .context("cannot run cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("cargo metadata printed no JSON")?;
    let mut crates: Vec<Crate> = meta["packages"]
        .as_array()
        .context("cargo metadata lists no packages")?
        .iter()
        .filter_map(|p| {
            Some(Crate {
                name: p["name"].as_str()?.to_string(),
                id: p["id"].as_str()?.to_string(),
            })
        })
        .filter(|c| c.name != "xtask")
        .collect();
    crates.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(crates)
}

/// What cargo's JSON messages said about the workspace crates of one run.
#[derive(Default)]
pub struct Messages {
    /// Package ids with a checked library or binary.
    checked: Vec<String>,
    /// Package id → rendered errors and warnings.
    diagnostics: Vec<(String, String)>,
}

impl Messages {
    /// Reads `cargo --message-format=json` output.
    pub fn parse(stdout: &str) -> Messages {
        let mut m = Messages::default();
        for line in stdout.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let Some(id) = v["package_id"].as_str() else {
                continue;
            };
            match v["reason"].as_str() {
                Some("compiler-artifact") => m.checked.push(id.to_string()),
                Some("compiler-message") => {
                    let level = v["message"]["level"].as_str().unwrap_or("");
                    if level == "error" || level == "warning" {
                        let text = v["message"]["rendered"].as_str().unwrap_or(level);
                        m.diagnostics
                            .push((id.to_string(), text.trim_end().to_string()));
                    }
                }
                _ => {}
            }
        }
        m
    }

    /// The outcome of crate `id`; `stderr` explains a crate that was never reached.
    pub fn outcome(&self, id: &str, stderr: &str) -> Outcome {
        let said: Vec<&str> = self
            .diagnostics
            .iter()
            .filter(|(p, _)| p == id)
            .map(|(_, text)| text.as_str())
            .collect();
        if !said.is_empty() {
            let text = said.join("\n");
            return Outcome::Failed(text.lines().take(40).collect::<Vec<_>>().join("\n"));
        }
        if self.checked.iter().any(|p| p == id) {
            return Outcome::Passed;
        }
        Outcome::Failed(format!(
            "not checked: something it depends on failed to build\n{}",
            error_excerpt(stderr)
        ))
    }
}

/// The first error lines of a failed cargo run, enough to see what broke.
fn error_excerpt(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .skip_while(|l| !l.starts_with("error"))
        .take(24)
        .collect();
    if lines.is_empty() {
        stderr.lines().rev().take(12).collect::<Vec<_>>().join("\n")
    } else {
        lines.join("\n")
    }
}

/// `cargo check` of `crates` for one platform, one outcome per crate.
fn check(
    layout: &Layout,
    cargo: &OsString,
    crates: &[&Crate],
    p: &Platform,
) -> Result<Vec<Outcome>> {
    if crates.is_empty() {
        return Ok(Vec::new());
    }
    let mut cmd = Command::new(cargo);
    cmd.args(["check", "--release", "--keep-going", "--lib", "--bins"])
        .args(["--message-format", "json", "--target", p.triple])
        .current_dir(&layout.workspace);
    for c in crates {
        cmd.args(["-p", &c.name]);
    }
    cmd.envs(p.toolchain_env());
    let out = cmd
        .output()
        .with_context(|| format!("cannot run cargo check for {}", p.triple))?;
    let messages = Messages::parse(&String::from_utf8_lossy(&out.stdout));
    let stderr = String::from_utf8_lossy(&out.stderr);
    Ok(crates
        .iter()
        .map(|c| messages.outcome(&c.id, &stderr))
        .collect())
}

/// The table: one row per crate, one column per platform, then the reasons and errors.
pub fn render(crates: &[&str], platforms: &[&Platform], cells: &[Vec<Outcome>]) -> String {
    let width = crates.iter().map(|c| c.len()).max().unwrap_or(5).max(5);
    let col = platforms.iter().map(|p| p.triple.len()).max().unwrap_or(8);
    let mut text = format!("{:width$}", "crate");
    for p in platforms {
        text += &format!("  {:col$}", p.triple);
    }
    text = text.trim_end().to_string() + "\n";
    let mut notes = Vec::new();
    for (krate, row) in crates.iter().zip(cells) {
        text += &format!("{krate:width$}");
        for (p, outcome) in platforms.iter().zip(row) {
            let cell = match outcome {
                Outcome::Passed => "ok",
                Outcome::Failed(errors) => {
                    notes.push(format!("FAILED  {krate} on {}:\n{errors}", p.triple));
                    "FAILED"
                }
                Outcome::Skipped(why) => {
                    notes.push(format!("skipped {krate} on {}: {why}", p.triple));
                    "skipped"
                }
            };
            text += &format!("  {cell:col$}");
        }
        text = text.trim_end().to_string() + "\n";
    }
    for note in notes {
        text += &format!("{note}\n");
    }
    text
}

/// Adds the targets, checks every crate for every platform (or those `only` names),
/// prints the table; with `build`, builds in full where a linker is installed. Returns
/// 1 when a crate expected to build failed, else 0.
pub fn run(layout: &Layout, args: &CrossCheckArgs) -> Result<i32> {
    ensure_targets()?;
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let crates = workspace_crates(layout, &cargo)?;
    let platforms: Vec<&Platform> = PLATFORMS
        .iter()
        .filter(|p| args.only.as_deref().is_none_or(|o| p.triple.contains(o)))
        .collect();
    if platforms.is_empty() {
        bail!("no platform's triple contains {:?}", args.only);
    }
    // cells[platform][crate]
    let mut cells = Vec::new();
    for p in &platforms {
        let start = Instant::now();
        let skips: Vec<Option<String>> = crates
            .iter()
            .map(|c| skip_reason(&c.name, p.triple, &installed))
            .collect();
        let wanted: Vec<&Crate> = crates
            .iter()
            .zip(&skips)
            .filter(|(_, skip)| skip.is_none())
            .map(|(c, _)| c)
            .collect();
        let mut checked = check(layout, &cargo, &wanted, p)?.into_iter();
        let row: Vec<Outcome> = skips
            .into_iter()
            .map(|skip| match skip {
                Some(why) => Outcome::Skipped(why),
                None => checked.next().unwrap_or(Outcome::Passed),
            })
            .collect();
        eprintln!(
            "cross-check: {} ({}) checked in {:.0} s",
            p.triple,
            p.name,
            start.elapsed().as_secs_f64()
        );
        cells.push(row);
    }
    let names: Vec<&str> = crates.iter().map(|c| c.name.as_str()).collect();
    let by_crate: Vec<Vec<Outcome>> = (0..crates.len())
        .map(|i| cells.iter().map(|row| row[i].clone()).collect())
        .collect();
    println!("{}", render(&names, &platforms, &by_crate));
    let mut failed = cells
        .iter()
        .flatten()
        .any(|o| matches!(o, Outcome::Failed(_)));
    if args.build {
        for (p, row) in platforms.iter().zip(&cells) {
            let passed: Vec<&str> = names
                .iter()
                .zip(row)
                .filter(|(_, o)| **o == Outcome::Passed)
                .map(|(name, _)| *name)
                .collect();
            failed |= !build(layout, &cargo, p, &passed, args.run)?;
        }
    }
    Ok(i32::from(failed))
}

/// The full release build of `crates` for `p`, where its toolchain is installed; then,
/// for Windows with `run`, `prima plugins` under wine. False when the build (or the
/// run) failed.
fn build(
    layout: &Layout,
    cargo: &OsString,
    p: &Platform,
    crates: &[&str],
    run: bool,
) -> Result<bool> {
    let toolchain = p.toolchain_env();
    if toolchain.is_empty() {
        let why = match &p.toolchain {
            Some(t) => format!("{} is not installed", t.linker),
            None => "no cross linker (SDK, NDK) to be had here".to_string(),
        };
        eprintln!("cross-check: no full build for {}: {why}", p.triple);
        return Ok(true);
    }
    let start = Instant::now();
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "--target", p.triple])
        .envs(toolchain)
        .current_dir(&layout.workspace);
    for krate in crates {
        cmd.args(["-p", krate]);
    }
    let status = cmd
        .status()
        .with_context(|| format!("cannot run cargo build for {}", p.triple))?;
    if !status.success() {
        eprintln!("cross-check: FAILED the full build for {}", p.triple);
        return Ok(false);
    }
    let dir = target_dir(layout).join(p.triple).join("release");
    eprintln!(
        "cross-check: built for {} in {:.0} s: {}",
        p.triple,
        start.elapsed().as_secs_f64(),
        artifacts(&dir).join(", ")
    );
    if run && p.triple.contains("windows") {
        return run_under_wine(&dir);
    }
    Ok(true)
}

fn target_dir(layout: &Layout) -> std::path::PathBuf {
    env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| layout.workspace.join("target"))
}

/// The executables and plugin libraries a build left in `dir`, with their sizes.
fn artifacts(dir: &Path) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let shipped = name.starts_with("prima")
                && [".exe", ".dll", ".so", ".dylib"]
                    .iter()
                    .any(|x| name.ends_with(x));
            let size = e.metadata().ok()?.len();
            shipped.then(|| format!("{name} ({} MiB)", size >> 20))
        })
        .collect();
    found.sort();
    found
}

/// `prima.exe plugins` under wine, the plugin DLLs beside it: shows that the Windows build
/// starts and loads its plugins. Skipped (true) without wine.
fn run_under_wine(dir: &Path) -> Result<bool> {
    let Some(wine) = crate::wine::loader() else {
        eprintln!("cross-check: prima.exe not run: wine is not installed");
        return Ok(true);
    };
    crate::wine::prepare(wine)?;
    let out = crate::wine::command(wine, &dir.join("prima.exe"))
        .arg("plugins")
        .env("WINEDEBUG", "err+module")
        .output()
        .with_context(|| format!("cannot run {wine}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("cross-check: {wine} prima.exe plugins:\n{stdout}");
    if !out.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
        return Ok(false);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_cxx_plugin_is_skipped_and_windows_checks_it_given_mingw() {
        let none = |_: &str| false;
        let mingw = |p: &str| p == MINGW.cxx;
        for p in &PLATFORMS {
            assert_eq!(skip_reason("prima-core", p.triple, &none), None);
            assert!(skip_reason(HIGHS_PLUGIN, p.triple, &none).is_some());
        }
        assert_eq!(
            skip_reason(HIGHS_PLUGIN, "x86_64-pc-windows-gnu", &mingw),
            None
        );
        let why = skip_reason(HIGHS_PLUGIN, "aarch64-apple-darwin", &mingw).unwrap();
        assert!(why.contains("HiGHS") && why.contains("macOS"), "{why}");
    }

    #[test]
    fn the_table_marks_each_cell_and_explains_skips_and_failures() {
        let crates = ["prima-core", HIGHS_PLUGIN];
        let platforms: Vec<&Platform> = PLATFORMS.iter().take(2).collect();
        let cells = vec![
            vec![Outcome::Passed, Outcome::Failed("error[E0425]: x".into())],
            vec![Outcome::Skipped("no SDK".into()), Outcome::Passed],
        ];
        let text = render(&crates, &platforms, &cells);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("crate") && lines[0].contains("aarch64-apple-darwin"));
        assert!(lines[1].starts_with("prima-core") && lines[1].contains("ok"));
        assert!(lines[1].ends_with("FAILED"), "{}", lines[1]);
        assert!(lines[2].contains("skipped") && lines[2].ends_with("ok"));
        assert!(text.contains("FAILED  prima-core on x86_64-pc-windows-gnu:\nerror[E0425]: x"));
        assert!(text.contains(&format!(
            "skipped {HIGHS_PLUGIN} on aarch64-apple-darwin: no SDK"
        )));
    }

    #[test]
    fn cargo_messages_decide_each_crates_outcome() {
        let stdout = [
            r#"{"reason":"compiler-artifact","package_id":"a#0.1.0","target":{"kind":["lib"]}}"#,
            r#"{"reason":"compiler-artifact","package_id":"b#0.1.0","target":{"kind":["lib"]}}"#,
            r#"{"reason":"compiler-message","package_id":"b#0.1.0","message":{"level":"warning","rendered":"warning: unused\n"}}"#,
            r#"{"reason":"compiler-message","package_id":"c#0.1.0","message":{"level":"error","rendered":"error[E0425]: libc::madvise\n"}}"#,
            "not json: cargo's own line",
        ]
        .join("\n");
        let m = Messages::parse(&stdout);
        assert_eq!(m.outcome("a#0.1.0", ""), Outcome::Passed);
        // A warning fails a crate, as `-D warnings` does on Linux.
        assert_eq!(
            m.outcome("b#0.1.0", ""),
            Outcome::Failed("warning: unused".into())
        );
        assert_eq!(
            m.outcome("c#0.1.0", ""),
            Outcome::Failed("error[E0425]: libc::madvise".into())
        );
        // Never reached: a dependency's build script failed; cargo's stderr says why.
        let stderr = "   Compiling x\nerror: failed to run custom build command for `highs-sys`\n";
        match m.outcome("d#0.1.0", stderr) {
            Outcome::Failed(why) => {
                assert!(
                    why.starts_with("not checked") && why.contains("highs-sys"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
    }
}

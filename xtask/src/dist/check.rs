//! The release check: what a user does with an archive, done by a script. This machine's
//! archive is unpacked in an empty directory and run from there — `prima plugins` finds
//! every plugin beside the binary and nothing outside it, `prima apply` runs the default
//! cluster on SmolLM2 given by `--model`, and a backend plugin built apart from the
//! release is installed into the directory and used without rebuilding `prima`. Another
//! target's archive is listed and its binaries' architecture read from their headers;
//! an aarch64 Linux one also runs `prima plugins` under qemu-aarch64 where it is
//! installed. Each command and what it printed is shown, as a transcript.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use super::{archive, Release, Workspace, BINARY, SUMS_FILE};
use crate::layout::Layout;
use crate::shell;

/// The model the release check runs (fetched by `cargo xtask setup`).
const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Long enough for a slow shared machine; only a hang reaches it.
const DEADLINE: Duration = Duration::from_secs(600);
const ARM_SYSROOT: &str = "/usr/aarch64-linux-gnu";

/// Unpacks this machine's archive in an empty directory and runs it there.
pub fn check_host(layout: &Layout, release: &Release) -> Result<()> {
    let model = layout.fetched_models().join(MODEL);
    ensure!(
        model.exists(),
        "{} is missing (cargo xtask fetch-models)",
        model.display()
    );
    let scratch = Scratch::new("host")?;
    let root = unpack(release, &scratch.0)?;
    let prima = |args: &[&str]| {
        let mut cmd = Command::new(root.join(BINARY));
        cmd.args(args)
            .current_dir(&root)
            .env_remove("PRIMA_PLUGIN_DIR");
        cmd
    };
    let model_arg = model.to_string_lossy().into_owned();

    // Every plugin is found beside the binary, and nothing from elsewhere.
    let listed = shown(&mut prima(&["plugins"]), "./prima plugins")?.success()?;
    let dirs = listed
        .lines()
        .find_map(|l| l.strip_prefix("plugin directories: "))
        .context("`prima plugins` printed no plugin directories")?;
    for dir in dirs.split(", ") {
        ensure!(
            Path::new(dir).starts_with(&root),
            "`prima plugins` searches {dir}, outside the unpacked release"
        );
    }
    for plugin in &release.plugins {
        let path = root.join(&plugin.file);
        ensure!(
            listed
                .lines()
                .any(|l| l.contains(&*path.to_string_lossy()) && !l.starts_with("refused")),
            "`prima plugins` does not list {} as usable",
            plugin.file
        );
    }

    // The default cluster, from the unpacked directory, on the model given.
    let apply = [
        "apply",
        "manifests/home.toml",
        "--model",
        &model_arg,
        "--prompt",
        "Write a haiku about autumn.",
        "--chat",
        "-n",
        "24",
        "--temp",
        "0",
    ];
    let shown_apply = format!("./prima apply manifests/home.toml --model {model_arg} --prompt \"Write a haiku about autumn.\" --chat -n 24");
    let text = shown(&mut prima(&apply), &shown_apply)?.success()?;
    ensure!(!text.trim().is_empty(), "`prima apply` generated no text");

    // Backends come and go without rebuilding prima: take them out, then install copies
    // built apart from the release (`cargo build --release`), and run again.
    let backends: Vec<&str> = listed
        .lines()
        .filter(|l| l.starts_with("backend"))
        .filter_map(|l| {
            release
                .plugins
                .iter()
                .find(|p| l.contains(&*root.join(&p.file).to_string_lossy()))
        })
        .map(|p| p.file.as_str())
        .collect();
    ensure!(!backends.is_empty(), "the release has no backend plugin");
    for file in &backends {
        println!("$ rm {file}");
        fs::remove_file(root.join(file))?;
    }
    let listed = shown(&mut prima(&["plugins"]), "./prima plugins")?.success()?;
    ensure!(
        !listed.lines().any(|l| l.starts_with("backend")),
        "`prima plugins` still lists a backend after they were removed"
    );
    let run = [
        "run",
        "-m",
        &model_arg,
        "-p",
        "The capital of France is",
        "-n",
        "8",
        "--temp",
        "0",
    ];
    let shown_run =
        format!("./prima run -m {model_arg} -p \"The capital of France is\" -n 8 --temp 0");
    let without = shown(&mut prima(&run), &shown_run)?;
    ensure!(
        !without.status.success() && without.stderr.contains("no backend plugin"),
        "`prima run` without a backend plugin should fail naming it"
    );

    let target_dir = Workspace::read(layout)?.target_dir;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args(["build", "--release"])
        .current_dir(&layout.workspace);
    for file in &backends {
        let plugin = release
            .plugins
            .iter()
            .find(|p| p.file == *file)
            .expect("listed above");
        build.args(["-p", &plugin.package]);
    }
    println!("$ {}", shell::describe(&build));
    shell::run(&mut build)?;
    for file in &backends {
        let from = target_dir.join("release").join(file);
        println!("$ cp {} .", from.display());
        fs::copy(&from, root.join(file)).with_context(|| format!("copying {}", from.display()))?;
    }
    let listed = shown(&mut prima(&["plugins"]), "./prima plugins")?.success()?;
    for file in &backends {
        ensure!(
            listed
                .lines()
                .any(|l| l.starts_with("backend") && l.contains(file)),
            "`prima plugins` does not list the installed {file}"
        );
    }
    let text = shown(&mut prima(&run), &shown_run)?.success()?;
    ensure!(
        !text.trim().is_empty(),
        "`prima run` with the installed backend generated no text"
    );
    println!("release check passed: {}", release.archive.display());
    Ok(())
}

/// What the check of another target's archive could run.
pub enum CrossCheck {
    /// `prima plugins` ran under qemu and listed every plugin.
    RanUnderQemu,
    /// `prima.exe plugins` and `run` ran under wine, with the Linux build's text.
    RanUnderWine,
    /// Listed and headers checked; running it here needs this.
    NotRun(String),
}

/// Lists another target's archive, checks its binaries are built for that target, and
/// on aarch64 Linux runs `prima plugins` under qemu-aarch64 where it is installed.
pub fn check_cross(release: &Release) -> Result<CrossCheck> {
    let entries = archive::read(&release.archive)?;
    archive::check_sums(SUMS_FILE, &entries)?;
    println!("$ list {}", release.archive.display());
    for e in &entries {
        println!(
            "{:>10}  {}{}",
            e.data.len(),
            e.path,
            if e.executable { " *" } else { "" }
        );
    }
    let arch = release.target.split('-').next().unwrap_or_default();
    let windows = release.target.contains("-windows");
    let binaries = entries.iter().filter(|e| {
        e.path == BINARY
            || e.path == format!("{BINARY}.exe")
            || release.plugins.iter().any(|p| p.file == e.path)
    });
    for e in binaries {
        let machine = if windows {
            pe_machine(&e.data)
        } else {
            elf_machine(&e.data)
        };
        let want = machine_name(arch);
        ensure!(
            machine == want,
            "{}: built for {}, not {} ({})",
            e.path,
            machine.unwrap_or("an unknown machine"),
            want.unwrap_or("?"),
            release.target
        );
        println!("{}: {}", e.path, machine.unwrap_or("?"));
    }
    if !release.target.starts_with("aarch64-unknown-linux") {
        return Ok(CrossCheck::NotRun(format!(
            "nothing runs {} here",
            release.target
        )));
    }
    if !shell::on_path("qemu-aarch64") || !Path::new(ARM_SYSROOT).is_dir() {
        return Ok(CrossCheck::NotRun(format!(
            "needs qemu-aarch64 and the aarch64 C library in {ARM_SYSROOT} \
             (`.ci/run` installs qemu-user and gcc-aarch64-linux-gnu)"
        )));
    }
    let scratch = Scratch::new("aarch64")?;
    let root = unpack(release, &scratch.0)?;
    let mut cmd = Command::new("qemu-aarch64");
    cmd.args(["-L", ARM_SYSROOT])
        .arg(root.join(BINARY))
        .arg("plugins")
        .current_dir(&root)
        .env_remove("PRIMA_PLUGIN_DIR");
    let shown_cmd = format!("qemu-aarch64 -L {ARM_SYSROOT} ./prima plugins");
    let listed = shown(&mut cmd, &shown_cmd)?.success()?;
    for plugin in &release.plugins {
        ensure!(
            listed
                .lines()
                .any(|l| l.contains(&plugin.file) && !l.starts_with("refused")),
            "`prima plugins` under qemu does not list {} as usable",
            plugin.file
        );
    }
    Ok(CrossCheck::RanUnderQemu)
}

/// The prompt the Windows build and the Linux build both complete, greedily.
const WINE_PROMPT: &str = "The capital of France is";
const WINE_TOKENS: &str = "32";

/// The Windows archive under wine: unpacked in an empty directory, its imports checked
/// (every non-Windows DLL is in it), `prima.exe plugins` lists every plugin beside it as
/// usable, and `prima.exe run` on SmolLM2 (greedy, 32 tokens) prints the text the Linux
/// build prints. `NotRun` where wine cannot be had. The unpacked directory is kept when
/// `keep` names one (the mixed ring test and the TPOT figures run it).
pub fn check_under_wine(
    layout: &Layout,
    release: &Release,
    keep: Option<&Path>,
) -> Result<CrossCheck> {
    check_cross(release)?;
    let wine = match crate::wine::ensure() {
        Ok(wine) => wine,
        Err(why) => return Ok(CrossCheck::NotRun(why)),
    };
    crate::wine::prepare(wine)?;
    let model = layout.fetched_models().join(MODEL);
    ensure!(
        model.exists(),
        "{} is missing (cargo xtask fetch-models)",
        model.display()
    );
    let scratch = Scratch::new("windows")?;
    let into = match keep {
        Some(dir) => std::path::absolute(dir)?,
        None => scratch.0.clone(),
    };
    let root = unpack(release, &into)?;
    let entries = archive::read(&release.archive)?;
    super::mingw::check_imports(&entries, &root)?;
    let exe = root.join(format!("{BINARY}.exe"));
    let prima = |args: &[&str]| {
        let mut cmd = crate::wine::command(wine, &exe);
        cmd.args(args)
            .current_dir(&root)
            .env_remove("PRIMA_PLUGIN_DIR");
        cmd
    };
    let listed = shown(
        &mut prima(&["plugins"]),
        &format!("{wine} prima.exe plugins"),
    )?
    .success()?;
    for plugin in &release.plugins {
        ensure!(
            listed
                .lines()
                .any(|l| l.contains(&plugin.file) && !l.starts_with("refused")),
            "`prima.exe plugins` under wine does not list {} as usable",
            plugin.file
        );
    }
    let model_arg = model.to_string_lossy().into_owned();
    let run = [
        "run",
        "-m",
        &model_arg,
        "-p",
        WINE_PROMPT,
        "-n",
        WINE_TOKENS,
        "--temp",
        "0",
    ];
    let shown_run = format!(
        "{wine} prima.exe run -m {model_arg} -p \"{WINE_PROMPT}\" -n {WINE_TOKENS} --temp 0"
    );
    let windows_text = shown(&mut prima(&run), &shown_run)?.success()?;

    let linux = linux_prima(layout)?;
    let mut cmd = Command::new(&linux);
    cmd.args(run).env_remove("PRIMA_PLUGIN_DIR");
    let shown_linux = format!(
        "{} run -m {model_arg} -p \"{WINE_PROMPT}\" -n {WINE_TOKENS} --temp 0",
        linux.display()
    );
    let linux_text = shown(&mut cmd, &shown_linux)?.success()?;
    ensure!(
        !linux_text.trim().is_empty() && windows_text == linux_text,
        "prima.exe under wine printed {windows_text:?}, the Linux build {linux_text:?}"
    );
    println!("prima.exe under wine generated the Linux build's text");
    Ok(CrossCheck::RanUnderWine)
}

/// This machine's release `prima` (built if it is not: `cargo build --release` of the
/// binary and the CPU backend).
fn linux_prima(layout: &Layout) -> Result<PathBuf> {
    let workspace = Workspace::read(layout)?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args(["build", "--release", "-p", &workspace.binary_package])
        .args(["-p", "prima-backend-cpu", "-p", "prima-os-memory"])
        .current_dir(&layout.workspace);
    shell::run(&mut build)?;
    Ok(workspace.target_dir.join("release").join(BINARY))
}

/// ELF e_machine of an executable or shared library.
fn elf_machine(data: &[u8]) -> Option<&'static str> {
    if data.get(..4)? != b"\x7fELF" || data.get(5)? != &1 {
        return None; // not little-endian ELF
    }
    machine_of(u16::from_le_bytes([*data.get(18)?, *data.get(19)?]))
}

/// PE machine of a Windows executable or DLL.
fn pe_machine(data: &[u8]) -> Option<&'static str> {
    if data.get(..2)? != b"MZ" {
        return None;
    }
    let pe = u32::from_le_bytes(data.get(0x3c..0x40)?.try_into().ok()?) as usize;
    if data.get(pe..pe + 4)? != b"PE\0\0" {
        return None;
    }
    match u16::from_le_bytes([*data.get(pe + 4)?, *data.get(pe + 5)?]) {
        0x8664 => Some("x86_64"),
        0xaa64 => Some("aarch64"),
        _ => None,
    }
}

fn machine_of(e_machine: u16) -> Option<&'static str> {
    match e_machine {
        62 => Some("x86_64"),
        183 => Some("aarch64"),
        _ => None,
    }
}

fn machine_name(arch: &str) -> Option<&'static str> {
    match arch {
        "x86_64" => Some("x86_64"),
        "aarch64" => Some("aarch64"),
        _ => None,
    }
}

/// Writes the archive's files under `dir`, as `tar xf` would, checking SHA256SUMS; the
/// unpacked top directory.
fn unpack(release: &Release, dir: &Path) -> Result<PathBuf> {
    let entries = archive::read(&release.archive)?;
    archive::check_sums(SUMS_FILE, &entries)?;
    let top = release
        .archive
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".tar.xz").or_else(|| n.strip_suffix(".zip")))
        .context("an archive name without .tar.xz or .zip")?;
    let root = dir.join(top);
    let unpack_cmd = if release.target.contains("-windows") {
        "unzip"
    } else {
        "tar xf"
    };
    println!(
        "$ cd {} && {unpack_cmd} {}",
        dir.display(),
        release.archive.display()
    );
    for e in &entries {
        let path = root.join(&e.path);
        fs::create_dir_all(path.parent().unwrap_or(&root))?;
        fs::write(&path, &e.data).with_context(|| format!("writing {}", path.display()))?;
        #[cfg(unix)]
        if e.executable {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
        }
        println!("{:>10}  {top}/{}", e.data.len(), e.path);
    }
    println!("$ cd {top}");
    Ok(root)
}

/// An empty directory of our own, removed afterwards.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Result<Scratch> {
        let dir =
            std::env::temp_dir().join(format!("prima-release-check-{what}-{}", std::process::id()));
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A finished command's status and output.
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    shown: String,
}

impl Finished {
    /// Its stdout, or an error quoting its stderr.
    fn success(self) -> Result<String> {
        if !self.status.success() {
            bail!(
                "`{}` failed ({}): {}",
                self.shown,
                self.status,
                self.stderr.trim()
            );
        }
        Ok(self.stdout)
    }
}

/// Runs `cmd`, printing `$ shown` and then what it printed; stopped (SIGTERM, so a
/// `prima apply` stops its nodes) if it has not finished by the deadline.
fn shown(cmd: &mut Command, shown: &str) -> Result<Finished> {
    println!("$ {shown}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start `{shown}`"))?;
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = read(Box::new(child.stdout.take().expect("piped")));
    let stderr = read(Box::new(child.stderr.take().expect("piped")));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if start.elapsed() > DEADLINE {
            // SAFETY: kill(2) on the pid of a child we have not reaped yet.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            std::thread::sleep(Duration::from_secs(10));
            let _ = child.kill();
            let _ = child.wait();
            bail!("`{shown}` did not finish in {} s", DEADLINE.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let finished = Finished {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
        shown: shown.to_string(),
    };
    print!("{}", finished.stdout);
    for line in finished.stderr.lines() {
        println!("[stderr] {line}");
    }
    if !finished.status.success() {
        println!("[exit: {}]", finished.status);
    }
    Ok(finished)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machines_are_read_from_elf_and_pe_headers() {
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[5] = 1;
        elf[18] = 183;
        assert_eq!(elf_machine(&elf), Some("aarch64"));
        elf[18] = 62;
        assert_eq!(elf_machine(&elf), Some("x86_64"));
        let mut pe = vec![0u8; 0x100];
        pe[..2].copy_from_slice(b"MZ");
        pe[0x3c] = 0x80;
        pe[0x80..0x84].copy_from_slice(b"PE\0\0");
        pe[0x84..0x86].copy_from_slice(&0x8664u16.to_le_bytes());
        assert_eq!(pe_machine(&pe), Some("x86_64"));
        assert_eq!(elf_machine(b"#!/bin/sh"), None);
    }
}

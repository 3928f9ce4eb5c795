//! Wine, on which the Windows build runs here (`cargo xtask dist --target
//! x86_64-pc-windows-gnu --check`, `prima-cli/tests/windows_ring.rs`): found, installed
//! with apt where it is missing and this is root on Debian, and its prefix made able to
//! start Rust programs.
//!
//! Rust's standard library imports `ProcessPrng` from `bcryptprimitives.dll` (Rust 1.78
//! and later); Windows 10 has it, Wine has it from 9.0 on, and Debian 12's Wine 8 does
//! not, so every Rust program fails to start there. Where the prefix lacks that DLL, a
//! stand-in (`wine/bcryptprimitives.c`, `RtlGenRandom` under that name) is built with
//! mingw-w64 into the prefix's system32 — the test machine's Wine, never the release.
//!
//! What Wine cannot show: Windows' own memory manager (working sets, the standby list,
//! how it pages mmapped weights), Defender scanning the DLLs, the firewall's prompt for a
//! listening `prima node`, real Windows' scheduler. Wine runs the Windows build on the
//! Linux kernel, so it shows that the binary loads, finds its plugins and computes
//! the same tokens — not how fast or how well it pages on Windows.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::shell;

/// Debian's wine64 package alone puts its loader outside PATH; `wine` alone prints a
/// warning about the 32-bit half on every start.
const LOADERS: [&str; 3] = ["wine64", "/usr/lib/wine/wine64", "wine"];
/// The Debian packages.
const PACKAGES: [&str; 2] = ["wine", "wine64"];
const SHIM_SOURCE: &str = include_str!("wine/bcryptprimitives.c");
const SHIM_DLL: &str = "bcryptprimitives.dll";
const MINGW_CC: &str = "x86_64-w64-mingw32-gcc-posix";

/// The wine loader installed here, if any.
pub fn loader() -> Option<&'static str> {
    LOADERS.into_iter().find(|w| {
        Command::new(w)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// The loader, installing Wine with apt first where it is missing and can be (root on
/// Debian/Ubuntu); `Err` says why Windows binaries cannot run here.
pub fn ensure() -> std::result::Result<&'static str, String> {
    if let Some(wine) = loader() {
        return Ok(wine);
    }
    // SAFETY: geteuid only reads the process's effective user id.
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !Path::new("/etc/debian_version").exists() {
        return Err(format!(
            "wine is not installed (Debian/Ubuntu: apt-get install {})",
            PACKAGES.join(" ")
        ));
    }
    eprintln!("installing wine (apt-get install {})", PACKAGES.join(" "));
    if !shell::apt_install(&PACKAGES) {
        return Err(format!("apt-get install {} failed", PACKAGES.join(" ")));
    }
    loader().ok_or_else(|| "wine was installed but no wine loader runs".into())
}

/// The prefix wine uses: `$WINEPREFIX`, else `~/.wine`.
pub fn prefix() -> PathBuf {
    std::env::var_os("WINEPREFIX")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".wine")
        })
}

/// Makes the prefix (`wineboot --init`) if it is new, and gives it the `ProcessPrng`
/// stand-in if its Wine has no `bcryptprimitives.dll`.
pub fn prepare(wine: &str) -> Result<()> {
    let system32 = prefix().join("drive_c/windows/system32");
    if !system32.is_dir() {
        eprintln!("wine: making the prefix {}", prefix().display());
        shell::run(
            Command::new(wine)
                .args(["wineboot", "--init"])
                .env("WINEDEBUG", "-all"),
        )?;
        // wineboot returns before the prefix is written; wineserver -w waits for it.
        let server = Path::new(wine).with_file_name("wineserver");
        let server = if server.exists() {
            server
        } else {
            PathBuf::from("wineserver")
        };
        let _ = Command::new(server).arg("-w").status();
    }
    if !system32.is_dir() {
        bail!("wineboot made no {}", system32.display());
    }
    let dll = system32.join(SHIM_DLL);
    if dll.exists() {
        return Ok(());
    }
    eprintln!(
        "wine: this Wine has no {SHIM_DLL} (Wine 9 added it; Rust programs need its \
         ProcessPrng): building a stand-in into {}",
        dll.display()
    );
    let dir = std::env::temp_dir().join(format!("prima-wine-shim-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let source = dir.join("bcryptprimitives.c");
    std::fs::write(&source, SHIM_SOURCE)?;
    let built = shell::run(
        Command::new(MINGW_CC)
            .args(["-O2", "-shared", "-o"])
            .arg(&dll)
            .arg(&source)
            .arg("-ladvapi32"),
    )
    .with_context(|| format!("building the {SHIM_DLL} stand-in with {MINGW_CC} (mingw-w64)"));
    let _ = std::fs::remove_dir_all(&dir);
    built
}

/// `wine EXE`, quiet (wine's own diagnostics off).
pub fn command(wine: &str, exe: &Path) -> Command {
    let mut cmd = Command::new(wine);
    cmd.arg(exe).env("WINEDEBUG", "-all");
    cmd
}

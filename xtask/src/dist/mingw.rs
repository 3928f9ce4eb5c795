//! The Windows (GNU) release's files, built with cargo and mingw-w64 instead of
//! cargo-dist (which would build Windows with `cargo xwin`, the MSVC libraries): the same
//! packages, the same `dist` profile, then `prima.exe`, each plugin's `.dll`, README,
//! licences and the mingw-w64 runtime DLLs those binaries import.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::archive::Entry;
use super::{PluginFile, Workspace, BINARY};
use crate::cross_check;
use crate::layout::Layout;
use crate::shell;

/// What cargo-dist puts beside the binary of every archive.
const DOC_FILES: [&str; 3] = ["README.md", "LICENSE-APACHE", "LICENSE-MIT"];
const OBJDUMP: &str = "x86_64-w64-mingw32-objdump";
const STRIP: &str = "x86_64-w64-mingw32-strip";
/// Where Debian's mingw-w64 keeps libwinpthread-1.dll (gcc does not list it).
const MINGW_SYSROOT_LIB: &str = "/usr/x86_64-w64-mingw32/lib";

/// Builds the binary and every plugin for `target` and reads their files, with the docs
/// and the runtime DLLs they need, as archive entries.
pub fn build(
    layout: &Layout,
    workspace: &Workspace,
    target: &str,
) -> Result<(Vec<Entry>, Vec<PluginFile>)> {
    let toolchain = cross_check::toolchain_env(target)?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--profile", "dist", "--target", target])
        .args(["-p", &workspace.binary_package])
        .current_dir(&layout.workspace)
        .envs(toolchain.iter().cloned());
    for package in &workspace.plugin_packages {
        cmd.args(["-p", package]);
    }
    eprintln!("dist: {}", shell::describe(&cmd));
    shell::run(&mut cmd)?;
    let out = workspace.target_dir.join(target).join("dist");

    let read = |name: &str, from: &Path, executable: bool| -> Result<Entry> {
        let path = from.join(name);
        Ok(Entry {
            path: name.to_string(),
            data: fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
            executable,
        })
    };
    let exe = format!("{BINARY}.exe");
    let mut entries = vec![read(&exe, &out, true)?];
    let mut plugins = Vec::new();
    for package in &workspace.plugin_packages {
        let lib = workspace
            .plugin_libraries
            .get(package)
            .with_context(|| format!("{package} builds no cdylib"))?;
        let file = format!("{lib}.dll");
        entries.push(read(&file, &out, true)?);
        plugins.push(PluginFile {
            package: package.clone(),
            file,
        });
    }
    let cxx = toolchain
        .iter()
        .find(|(k, _)| k.starts_with("CXX_"))
        .map(|(_, v)| *v)
        .context("the Windows toolchain names no C++ compiler")?;
    let binaries: Vec<PathBuf> = entries.iter().map(|e| out.join(&e.path)).collect();
    let stripped = out.join("mingw-runtime");
    fs::create_dir_all(&stripped)?;
    for dll in runtime_dlls(&binaries, cxx)? {
        let name = dll
            .file_name()
            .context("a runtime DLL without a name")?
            .to_string_lossy()
            .into_owned();
        // Debian ships them with their debug information (libstdc++-6.dll: 24 MB, 4 MB
        // without), which a release does not carry, as the dist profile strips prima's.
        shell::run(
            Command::new(STRIP)
                .arg("--strip-debug")
                .arg("-o")
                .arg(stripped.join(&name))
                .arg(&dll),
        )?;
        entries.push(read(&name, &stripped, true)?);
    }
    for doc in DOC_FILES {
        entries.push(read(doc, &layout.workspace, false)?);
    }
    Ok((entries, plugins))
}

/// The mingw-w64 runtime DLLs `binaries` import, directly or through each other
/// (`libstdc++-6.dll` imports `libgcc_s_seh-1.dll` and `libwinpthread-1.dll`), found where
/// `cxx` keeps them. Windows' own DLLs are not found there and are left out.
fn runtime_dlls(binaries: &[PathBuf], cxx: &str) -> Result<Vec<PathBuf>> {
    let mut found: BTreeSet<PathBuf> = BTreeSet::new();
    let mut queue: Vec<PathBuf> = binaries.to_vec();
    let mut seen_names = BTreeSet::new();
    while let Some(file) = queue.pop() {
        for name in imports(&file)? {
            if !seen_names.insert(name.to_ascii_lowercase()) {
                continue;
            }
            if let Some(path) = mingw_dll(&name, cxx) {
                found.insert(path.clone());
                queue.push(path);
            }
        }
    }
    Ok(found.into_iter().collect())
}

/// The DLL names a PE file imports (`objdump -p`'s "DLL Name:" lines).
fn imports(file: &Path) -> Result<Vec<String>> {
    let text = shell::output(Command::new(OBJDUMP).arg("-p").arg(file)).with_context(|| {
        format!(
            "reading the imports of {} (binutils-mingw-w64)",
            file.display()
        )
    })?;
    Ok(parse_imports(&text))
}

fn parse_imports(objdump: &str) -> Vec<String> {
    objdump
        .lines()
        .filter_map(|l| l.trim().strip_prefix("DLL Name:"))
        .map(|n| n.trim().to_string())
        .collect()
}

/// Where mingw-w64 keeps the DLL `name`, if it is one of its own.
fn mingw_dll(name: &str, cxx: &str) -> Option<PathBuf> {
    let out = Command::new(cxx)
        .arg(format!("-print-file-name={name}"))
        .output()
        .ok()?;
    let printed = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    // gcc prints the bare name back when it has no such file.
    if printed.is_absolute() && printed.exists() {
        return Some(printed);
    }
    let sysroot = Path::new(MINGW_SYSROOT_LIB).join(name);
    sysroot.exists().then_some(sysroot)
}

/// Fails naming the binary when the release would need a DLL it does not carry that
/// Windows lacks too: every import is either shipped or a Windows DLL.
pub fn check_imports(entries: &[Entry], dir: &Path) -> Result<()> {
    let shipped: BTreeSet<String> = entries
        .iter()
        .map(|e| e.path.to_ascii_lowercase())
        .collect();
    for e in entries
        .iter()
        .filter(|e| e.path.ends_with(".dll") || e.path.ends_with(".exe"))
    {
        for name in imports(&dir.join(&e.path))? {
            let lower = name.to_ascii_lowercase();
            if lower.starts_with("lib") && !shipped.contains(&lower) {
                bail!(
                    "{} imports {name}, which the archive does not carry",
                    e.path
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imports_are_the_dll_name_lines() {
        let text =
            "\tDLL Name: KERNEL32.dll\n\tvma:  Hint/Ord Member-Name\n\tDLL Name: libstdc++-6.dll\n";
        assert_eq!(parse_imports(text), ["KERNEL32.dll", "libstdc++-6.dll"]);
    }
}

//! `cargo xtask dist`: one release archive per target, `prima-<version>-<target>.tar.xz`
//! (`.zip` for Windows), holding `prima`, every plugin beside it, README, licences,
//! `manifests/home.toml` and a `SHA256SUMS` of it all, with `<archive>.sha256` beside.
//!
//! cargo-dist (`dist build --artifacts=local`, configured in `dist-workspace.toml`)
//! builds the workspace with the `dist` profile and packs one archive per crate: the
//! `prima` binary in prima-core's, each plugin's cdylib in its own. A release is one
//! directory a user unpacks and runs, so this merges them: prima-core's archive, then
//! the cdylib of every workspace member under `plugins/` (found by `cargo metadata`, so
//! a new plugin crate ships without a change here), then the manifests.
//!
//! Windows (`x86_64-pc-windows-gnu`) is built apart from cargo-dist: for a Windows target
//! cargo-dist wraps the build in `cargo xwin`, Microsoft's MSVC libraries, while Prima's
//! Windows build is the GNU one (the HiGHS plugin's C++ builds with mingw-w64). So cargo
//! builds the same packages with the same `dist` profile and mingw-w64's POSIX-threads
//! toolchain (`cross_check::toolchain_env`), and the `.zip` holds what the Linux archive
//! holds: `prima.exe`, every plugin `.dll` beside it, README, licences, the manifests,
//! `SHA256SUMS` — and the mingw-w64 runtime DLLs the binaries import (`libstdc++-6.dll`
//! and its kin), which Windows does not have.
//!
//! Not for: installers, hosting or CI generation (cargo-dist's other jobs, switched off).

mod archive;
mod check;
mod mingw;
mod tools;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::build_tools;
use crate::layout::Layout;
use crate::shell;

pub use check::{check_cross, check_host, check_under_wine, CrossCheck};
pub use tools::host_target;

#[derive(clap::Args, Debug)]
pub struct DistArgs {
    /// Target triple to build for (repeat for several); default: this machine's.
    #[arg(long = "target", value_name = "TRIPLE")]
    targets: Vec<String>,
    /// Then check each archive: this machine's is unpacked in an empty directory and run
    /// (plugins, `prima apply` on SmolLM2, a backend swapped in); another target's is
    /// listed, its binaries' architecture checked, and on aarch64 `prima plugins` run
    /// under qemu-aarch64 where it is installed; a Windows one is unpacked and run under
    /// wine (`prima.exe plugins`, `prima.exe run` on SmolLM2 against the Linux build).
    #[arg(long)]
    check: bool,
    /// With --check of a Windows archive: unpack it here and keep it (the mixed ring
    /// test, `prima-cli/tests/windows_ring.rs`, runs `prima.exe` from there).
    #[arg(long, value_name = "DIR", requires = "check")]
    unpack_to: Option<PathBuf>,
}

/// The files that name the binary's package, its plugins and where cargo puts things.
const SUMS_FILE: &str = "SHA256SUMS";
const BINARY: &str = "prima";
/// Shipped under `manifests/`, so that the default cluster runs from the unpacked directory.
const MANIFEST_FILES: [&str; 2] = ["home.toml", "README.md"];

/// One release archive `cargo xtask dist` made.
#[derive(Debug, Clone)]
pub struct Release {
    pub target: String,
    pub archive: PathBuf,
    /// The plugin library files in it, e.g. `libprima_backend_cpu.so`, with their crates.
    pub plugins: Vec<PluginFile>,
}

#[derive(Debug, Clone)]
pub struct PluginFile {
    pub package: String,
    pub file: String,
}

pub fn run(layout: &Layout, args: &DistArgs) -> Result<()> {
    let host = host_target()?;
    let targets = if args.targets.is_empty() {
        vec![host.clone()]
    } else {
        args.targets.clone()
    };
    for target in &targets {
        let release = build(layout, &host, target)?;
        if args.check {
            if *target == host {
                check_host(layout, &release)?;
            } else if target.contains("-windows") {
                let keep = args.unpack_to.as_deref();
                if let CrossCheck::NotRun(why) = check_under_wine(layout, &release, keep)? {
                    eprintln!("dist: not run: {why}");
                }
            } else {
                if let CrossCheck::NotRun(why) = check_cross(&release)? {
                    eprintln!("dist: not run: {why}");
                }
            }
        }
    }
    Ok(())
}

/// Builds the archive for `target` with cargo-dist and merges it into one release
/// (Windows GNU: with cargo and mingw-w64, [`mingw::build`]).
pub fn build(layout: &Layout, host: &str, target: &str) -> Result<Release> {
    build_tools::ensure_for_cargo(layout)?;
    let workspace = Workspace::read(layout)?;
    if target.ends_with("-windows-gnu") {
        let (entries, plugins) = mingw::build(layout, &workspace, target)?;
        let distrib = layout.workspace.join("target").join("distrib");
        return pack(layout, &workspace, entries, plugins, &distrib, target);
    }
    let dist = tools::cargo_dist(&layout.cache)?;
    let wrappers = tools::wrapper_path(&layout.cache, host, target)?;
    eprintln!("dist: building {target} with {}", dist.display());
    let mut cmd = Command::new(&dist);
    cmd.args([
        "build",
        "--artifacts=local",
        "--output-format=json",
        "--target",
        target,
    ])
    .current_dir(&layout.workspace)
    .env("PATH", tools::path_with(&wrappers)?);
    let printed = shell::output(&mut cmd)?;
    let manifest: DistManifest = serde_json::from_str(&printed)
        .with_context(|| format!("`{}` printed no dist manifest", shell::describe(&cmd)))?;
    // cargo-dist writes to `<workspace>/target/distrib` whatever CARGO_TARGET_DIR says.
    let distrib = layout.workspace.join("target").join("distrib");
    merge(layout, &workspace, &manifest, &distrib, target)
}

/// prima-core's archive + every plugin's cdylib + the manifests → one archive.
fn merge(
    layout: &Layout,
    workspace: &Workspace,
    manifest: &DistManifest,
    distrib: &Path,
    target: &str,
) -> Result<Release> {
    let (_, binary_archive) = manifest.archive_of(&workspace.binary_package, target)?;
    let mut entries = archive::read(&manifest.path_of(binary_archive, distrib))?;
    if !entries
        .iter()
        .any(|e| e.path == BINARY || e.path == format!("{BINARY}.exe"))
    {
        bail!("{binary_archive} holds no `{BINARY}` binary");
    }
    let mut plugins = Vec::new();
    for package in &workspace.plugin_packages {
        let (artifact, name) = manifest.archive_of(package, target)?;
        let libraries: Vec<&str> = artifact
            .assets
            .iter()
            .filter(|a| a.kind == "c_dynamic_library")
            .filter_map(|a| a.path.as_deref())
            .collect();
        if libraries.is_empty() {
            bail!("cargo-dist's {name} holds no cdylib of {package}");
        }
        for entry in archive::read(&manifest.path_of(name, distrib))? {
            if libraries.contains(&entry.path.as_str()) {
                plugins.push(PluginFile {
                    package: package.clone(),
                    file: entry.path.clone(),
                });
                entries.push(entry);
            }
        }
    }
    pack(layout, workspace, entries, plugins, distrib, target)
}

/// The binary's and plugins' files + the manifests + `SHA256SUMS` → the release archive
/// in `distrib`, with its `.sha256` beside.
fn pack(
    layout: &Layout,
    workspace: &Workspace,
    mut entries: Vec<archive::Entry>,
    plugins: Vec<PluginFile>,
    distrib: &Path,
    target: &str,
) -> Result<Release> {
    for file in MANIFEST_FILES {
        let path = layout.workspace.join("manifests").join(file);
        entries.push(archive::Entry {
            path: format!("manifests/{file}"),
            data: fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
            executable: false,
        });
    }
    let mut seen = std::collections::BTreeSet::new();
    if let Some(twice) = entries.iter().find(|e| !seen.insert(e.path.as_str())) {
        bail!("two files would be {} in the release archive", twice.path);
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    entries.push(archive::Entry {
        path: SUMS_FILE.into(),
        data: archive::sums_file(&entries).into_bytes(),
        executable: false,
    });

    let top = format!("{BINARY}-{}-{target}", workspace.version);
    let format = archive::Format::for_target(target);
    let path = distrib.join(format!("{top}.{}", format.extension()));
    fs::create_dir_all(distrib).with_context(|| format!("creating {}", distrib.display()))?;
    archive::write(&path, &top, &entries)?;
    let file_name = path.file_name().unwrap_or_default().to_string_lossy();
    let sum = archive::sha256_hex(&fs::read(&path)?);
    let sum_path = PathBuf::from(format!("{}.sha256", path.display()));
    fs::write(&sum_path, format!("{sum}  {file_name}\n"))
        .with_context(|| format!("writing {}", sum_path.display()))?;
    eprintln!(
        "dist: {} ({:.1} MB; {} files, plugins: {})",
        path.display(),
        fs::metadata(&path)?.len() as f64 / 1e6,
        entries.len(),
        plugins
            .iter()
            .map(|p| p.file.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(Release {
        target: target.to_string(),
        archive: path,
        plugins,
    })
}

/// What `cargo metadata` says the release is made of.
pub struct Workspace {
    pub target_dir: PathBuf,
    pub version: String,
    /// The package with the `prima` binary.
    pub binary_package: String,
    /// Every member under `plugins/` that builds a cdylib.
    pub plugin_packages: Vec<String>,
    /// Each plugin package's cdylib name (`prima-backend-cpu` → `prima_backend_cpu`).
    pub plugin_libraries: BTreeMap<String, String>,
}

impl Workspace {
    pub fn read(layout: &Layout) -> Result<Workspace> {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let json = shell::output(
            Command::new(cargo)
                .args(["metadata", "--no-deps", "--format-version", "1"])
                .current_dir(&layout.workspace),
        )?;
        Workspace::from_metadata(&json)
    }

    fn from_metadata(json: &str) -> Result<Workspace> {
        let meta: Metadata = serde_json::from_str(json).context("reading `cargo metadata`")?;
        let plugins_dir = meta.workspace_root.join("plugins");
        let binary = meta
            .packages
            .iter()
            .find(|p| {
                p.targets
                    .iter()
                    .any(|t| t.name == BINARY && t.kind.iter().any(|k| k == "bin"))
            })
            .with_context(|| format!("no workspace member builds the `{BINARY}` binary"))?;
        let mut plugin_packages: Vec<String> = meta
            .packages
            .iter()
            .filter(|p| p.manifest_path.starts_with(&plugins_dir))
            .filter(|p| {
                p.targets
                    .iter()
                    .any(|t| t.crate_types.iter().any(|c| c == "cdylib"))
            })
            .map(|p| p.name.clone())
            .collect();
        plugin_packages.sort();
        let plugin_libraries = meta
            .packages
            .iter()
            .filter(|p| plugin_packages.contains(&p.name))
            .filter_map(|p| {
                let lib = p
                    .targets
                    .iter()
                    .find(|t| t.crate_types.iter().any(|c| c == "cdylib"))?;
                Some((p.name.clone(), lib.name.clone()))
            })
            .collect();
        if plugin_packages.is_empty() {
            bail!(
                "no workspace member under {} builds a cdylib",
                plugins_dir.display()
            );
        }
        Ok(Workspace {
            target_dir: meta.target_directory,
            version: binary.version.clone(),
            binary_package: binary.name.clone(),
            plugin_packages,
            plugin_libraries,
        })
    }
}

#[derive(Deserialize)]
struct Metadata {
    packages: Vec<MetadataPackage>,
    target_directory: PathBuf,
    workspace_root: PathBuf,
}

#[derive(Deserialize)]
struct MetadataPackage {
    name: String,
    version: String,
    manifest_path: PathBuf,
    targets: Vec<MetadataTarget>,
}

#[derive(Deserialize)]
struct MetadataTarget {
    name: String,
    kind: Vec<String>,
    crate_types: Vec<String>,
}

/// The parts of cargo-dist's manifest (`dist build --output-format=json`) used here.
#[derive(Deserialize)]
struct DistManifest {
    releases: Vec<DistRelease>,
    artifacts: BTreeMap<String, DistArtifact>,
    /// Where the artifacts it built are, as absolute paths.
    #[serde(default)]
    upload_files: Vec<PathBuf>,
}

#[derive(Deserialize)]
struct DistRelease {
    app_name: String,
    artifacts: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct DistArtifact {
    kind: String,
    #[serde(default)]
    target_triples: Vec<String>,
    #[serde(default)]
    assets: Vec<DistAsset>,
}

#[derive(Debug, Deserialize)]
struct DistAsset {
    kind: String,
    path: Option<String>,
}

impl DistManifest {
    /// The path of the artifact `name`: where the manifest says, else in `distrib`.
    fn path_of(&self, name: &str, distrib: &Path) -> PathBuf {
        self.upload_files
            .iter()
            .find(|p| p.file_name().is_some_and(|f| f == name))
            .cloned()
            .unwrap_or_else(|| distrib.join(name))
    }

    /// The archive cargo-dist made of `package` for `target`, and its file name.
    fn archive_of(&self, package: &str, target: &str) -> Result<(&DistArtifact, &str)> {
        let release = self
            .releases
            .iter()
            .find(|r| r.app_name == package)
            .with_context(|| {
                format!(
                    "cargo-dist made no release of {package} (is `dist = false` set in its \
                     [package.metadata.dist]?)"
                )
            })?;
        release
            .artifacts
            .iter()
            .filter_map(|name| Some((self.artifacts.get(name)?, name.as_str())))
            .find(|(a, _)| {
                a.kind == "executable-zip" && a.target_triples.iter().any(|t| t == target)
            })
            .with_context(|| format!("cargo-dist made no {target} archive of {package}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugins_are_the_cdylibs_under_plugins() {
        let json = r#"{
          "workspace_root": "/w", "target_directory": "/w/target",
          "packages": [
            {"name": "prima-core", "version": "0.3.0", "manifest_path": "/w/prima-core/Cargo.toml",
             "targets": [{"name": "prima_core", "kind": ["lib"], "crate_types": ["lib"]},
                         {"name": "prima", "kind": ["bin"], "crate_types": ["bin"]}]},
            {"name": "prima-backend-cpu", "version": "0.3.0", "manifest_path": "/w/plugins/backend-cpu/Cargo.toml",
             "targets": [{"name": "prima_backend_cpu", "kind": ["cdylib", "rlib"], "crate_types": ["cdylib", "rlib"]}]},
            {"name": "prima-plugin-helpers", "version": "0.3.0", "manifest_path": "/w/plugins/helpers/Cargo.toml",
             "targets": [{"name": "helpers", "kind": ["lib"], "crate_types": ["lib"]}]},
            {"name": "xtask", "version": "0.3.0", "manifest_path": "/w/xtask/Cargo.toml",
             "targets": [{"name": "xtask", "kind": ["bin"], "crate_types": ["bin"]}]}
          ]}"#;
        let w = Workspace::from_metadata(json).unwrap();
        assert_eq!(w.binary_package, "prima-core");
        assert_eq!(w.version, "0.3.0");
        assert_eq!(w.plugin_packages, ["prima-backend-cpu"]);
        assert_eq!(w.plugin_libraries["prima-backend-cpu"], "prima_backend_cpu");
    }

    #[test]
    fn a_plugin_without_an_archive_is_named() {
        let json = r#"{
          "releases": [{"app_name": "prima-backend-cpu", "artifacts": ["cpu-x.tar.xz", "cpu-x.tar.xz.sha256"]}],
          "artifacts": {
            "cpu-x.tar.xz": {"kind": "executable-zip", "target_triples": ["x"],
                             "assets": [{"kind": "c_dynamic_library", "name": "prima_backend_cpu", "path": "libprima_backend_cpu.so"}]},
            "cpu-x.tar.xz.sha256": {"kind": "checksum"}
          }}"#;
        let m: DistManifest = serde_json::from_str(json).unwrap();
        assert_eq!(
            m.archive_of("prima-backend-cpu", "x").unwrap().1,
            "cpu-x.tar.xz"
        );
        let err = m
            .archive_of("prima-backend-cpu", "y")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no y archive of prima-backend-cpu"), "{err}");
        let err = m
            .archive_of("prima-transport-vpn-proxy", "x")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no release of prima-transport-vpn-proxy"),
            "{err}"
        );
    }
}

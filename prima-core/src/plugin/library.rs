//! Plugin libraries: where they are looked for, what each declares (its kind, ABI version,
//! name, version and, per kind, what it offers) and opening their root modules. The
//! loaders of each kind (`loader.rs` for backends and solvers, `transport_loader.rs`,
//! `os_loader.rs`) build on this; this module loads no plugin for use.

use std::path::{Path, PathBuf};

use abi_stable::library::{lib_header_from_path, RootModule};
use abi_stable::std_types::RString;

use super::PluginKind;
use prima_abi::backend::{BackendPluginRef, GpuMemory, BACKEND_ABI_VERSION};
use prima_abi::os::{OsMemoryPluginRef, OS_MEMORY_ABI_VERSION};
use prima_abi::solver::{SolverPluginRef, SOLVER_ABI_VERSION};
use prima_abi::transport::{TransportPluginRef, TRANSPORT_ABI_VERSION};

/// Environment variable naming the plugin directories (separated like `PATH`).
pub const PLUGIN_DIR_ENV: &str = "PRIMA_PLUGIN_DIR";

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("no {kind} plugin{which} found in {dirs} (set {PLUGIN_DIR_ENV} or put the plugin beside the prima binary)")]
    NotFound {
        kind: &'static str,
        which: String,
        dirs: String,
    },
    #[error("plugin {path}: {reason}")]
    Refused { path: PathBuf, reason: String },
    #[error("plugin {path}: creating an instance failed: {reason}")]
    Create { path: PathBuf, reason: String },
}

/// What the loader learned about one library in a plugin directory.
#[derive(Debug, Clone)]
pub struct PluginInfo {
    pub path: PathBuf,
    pub kind: Option<PluginKind>,
    pub abi_version: Option<u32>,
    pub name: Option<String>,
    pub version: Option<String>,
    /// `None` when the plugin can be used, else why not.
    pub refused: Option<String>,
    /// A loadable backend that cannot run on this machine (no driver, no device): why.
    /// Filled by [`discover`](super::discover), which asks each backend; `None` otherwise.
    pub unavailable: Option<String>,
    /// A usable GPU backend's memory (the plugin answers [`GpuMemory`]); `None` for other
    /// plugins. Filled by [`discover`](super::discover).
    pub gpu_memory: Option<GpuMemory>,
    /// The OS names an OS memory plugin covers (empty for other kinds).
    pub covers: Vec<String>,
}

/// The directories searched for plugins: `$PRIMA_PLUGIN_DIR` if set, else the directory of
/// the running binary and its `plugins/` subdirectory.
pub fn plugin_dirs() -> Vec<PathBuf> {
    if let Some(v) = std::env::var_os(PLUGIN_DIR_ENV) {
        return std::env::split_paths(&v)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
    }
    let mut dirs = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            dirs.push(dir.to_path_buf());
            dirs.push(dir.join("plugins"));
            // `cargo test` runs binaries from target/<profile>/deps; plugins sit one up.
            if dir.ends_with("deps") {
                if let Some(up) = dir.parent() {
                    dirs.push(up.to_path_buf());
                }
            }
        }
    }
    dirs
}

fn is_plugin_file(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    let ext_ok = [".so", ".dylib", ".dll"].iter().any(|e| name.ends_with(e));
    ext_ok && (name.starts_with("libprima_") || name.starts_with("prima_"))
}

/// Every plugin library in `dirs` with what it declares and what each backend says of
/// this machine's hardware, asked in this process (`probe.rs` decides where to ask).
pub(super) fn discover_here(dirs: &[PathBuf]) -> Vec<PluginInfo> {
    plugin_paths(dirs)
        .iter()
        .map(|path| inspect(path, Probe::Hardware))
        .collect()
}

/// Every plugin library in `dirs` with what it declares, no backend asked about the
/// hardware.
pub(super) fn declarations_here(dirs: &[PathBuf]) -> Vec<PluginInfo> {
    plugin_paths(dirs)
        .iter()
        .map(|path| inspect(path, Probe::DeclarationsOnly))
        .collect()
}

/// The plugins of `kind` in `dirs` with what they declare, without asking any about the
/// hardware; libraries whose names declare another kind are not opened.
pub(super) fn declared_in(dirs: &[PathBuf], kind: PluginKind) -> Vec<PluginInfo> {
    plugin_paths(dirs)
        .iter()
        .filter(|path| may_be(path, kind))
        .map(|path| inspect(path, Probe::DeclarationsOnly))
        .filter(|info| info.kind == Some(kind))
        .collect()
}

/// Whether the library at `path` may be a plugin of `kind`: its file name does not
/// declare another (`libprima_backend_metal.so` is a backend's). Opening a library maps
/// it for good, so a process looking for its transport leaves the GPU plugins unopened;
/// the library itself still says what it is.
fn may_be(path: &Path, kind: PluginKind) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return true;
    };
    let name = name.strip_prefix("lib").unwrap_or(name);
    let Some(rest) = name.strip_prefix("prima_") else {
        return true;
    };
    let named = [
        ("backend_", PluginKind::Backend),
        ("transport_", PluginKind::Transport),
        ("solver_", PluginKind::Solver),
        ("os_memory", PluginKind::OsMemory),
    ]
    .into_iter()
    .find(|(prefix, _)| rest.starts_with(prefix));
    named.is_none_or(|(_, k)| k == kind)
}

/// The plugin libraries in `dirs`, each directory's in file-name order.
fn plugin_paths(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| is_plugin_file(p))
            .collect();
        paths.sort();
        found.extend(paths);
    }
    found
}

/// Whether [`inspect`] asks a backend about its hardware (`unavailable`, `gpu_memory`):
/// a GPU plugin's probe opens drivers (and may print their noise), so loading a backend
/// probes only the plugins it considers, not every one it passes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Probe {
    Hardware,
    DeclarationsOnly,
}

/// Reads a library's kind and ABI version and, for a usable backend, its name and version.
fn inspect(path: &Path, probe: Probe) -> PluginInfo {
    let mut info = PluginInfo {
        path: path.to_path_buf(),
        kind: None,
        abi_version: None,
        name: None,
        version: None,
        refused: None,
        unavailable: None,
        gpu_memory: None,
        covers: Vec::new(),
    };
    match read_c_header(path) {
        Err(reason) => info.refused = Some(reason),
        Ok((kind, abi)) => {
            info.kind = PluginKind::from_id(kind);
            info.abi_version = Some(abi);
            match info.kind {
                None => info.refused = Some(format!("unknown plugin kind {kind}")),
                Some(PluginKind::Backend) if abi != BACKEND_ABI_VERSION => {
                    info.refused = Some(format!(
                        "built for backend ABI v{abi}, this prima speaks v{BACKEND_ABI_VERSION}; rebuild the plugin against this release"
                    ))
                }
                Some(PluginKind::Backend) => match open_root::<BackendPluginRef>(path) {
                    Ok(root) => {
                        info.name = Some(root.name()().into_string());
                        info.version = Some(root.plugin_version()().into_string());
                        if probe == Probe::Hardware {
                            info.unavailable = backend_unavailable(root);
                        }
                        if probe == Probe::Hardware && info.unavailable.is_none() {
                            info.gpu_memory =
                                root.gpu_memory().and_then(|probe| probe().into_option());
                        }
                    }
                    Err(reason) => info.refused = Some(reason),
                },
                Some(PluginKind::Transport) => {
                    match inspect_transport(path, abi) {
                        Ok((name, version)) => {
                            info.name = Some(name);
                            info.version = Some(version);
                        }
                        Err(reason) => info.refused = Some(reason),
                    }
                }
                Some(PluginKind::Solver) if abi != SOLVER_ABI_VERSION => {
                    info.refused = Some(format!(
                        "built for solver ABI v{abi}, this prima speaks v{SOLVER_ABI_VERSION}; rebuild the plugin against this release"
                    ))
                }
                Some(PluginKind::Solver) => match open_root::<SolverPluginRef>(path) {
                    Ok(root) => {
                        info.name = Some(root.name()().into_string());
                        info.version = Some(root.plugin_version()().into_string());
                    }
                    Err(reason) => info.refused = Some(reason),
                },
                Some(PluginKind::OsMemory) => {
                    match inspect_os_memory(path, abi) {
                        Ok((name, version, covers)) => {
                            info.name = Some(name);
                            info.version = Some(version);
                            info.covers = covers;
                        }
                        Err(reason) => info.refused = Some(reason),
                    }
                }
            }
        }
    }
    info
}

/// Asks a backend whether it can run here (a plugin built without the question can).
fn backend_unavailable(root: BackendPluginRef) -> Option<String> {
    let probe = root.unavailable()?;
    probe().into_option().map(RString::into_string)
}

fn read_c_header(path: &Path) -> Result<(u32, u32), String> {
    let lib = open_for_good(path).map_err(|e| format!("cannot open: {e}"))?;
    // SAFETY: both symbols are declared by `export_*_plugin!` as `extern "C" fn() -> u32`.
    let kind = unsafe { lib.get::<extern "C" fn() -> u32>(b"prima_plugin_kind\0") }
        .map_err(|_| "not a Prima plugin (no prima_plugin_kind symbol)".to_string())?;
    // SAFETY: as above.
    let abi = unsafe { lib.get::<extern "C" fn() -> u32>(b"prima_plugin_abi_version\0") }
        .map_err(|_| "not a Prima plugin (no prima_plugin_abi_version symbol)".to_string())?;
    Ok((kind(), abi()))
}

/// Opens a plugin library that stays mapped until the process ends, even after `lib` is
/// dropped. The header is read here and the root module loaded again by `abi_stable`
/// (which keeps it); unloading in between would run the library's termination routines
/// early, and a C++ runtime that registers its destructors with plain `atexit` (the HiGHS
/// plugin cross-built with `zig c++`) then jumps into unmapped code at exit (SIGSEGV).
fn open_for_good(path: &Path) -> Result<libloading::Library, libloading::Error> {
    #[cfg(unix)]
    {
        let flags = libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_NODELETE;
        // SAFETY: opening a library runs its initialisers. We only open files named like
        // Prima plugins found in the configured plugin directories, which the user controls.
        unsafe { libloading::os::unix::Library::open(Some(path), flags) }.map(Into::into)
    }
    #[cfg(not(unix))]
    {
        // SAFETY: as above. (Windows keeps a library loaded while a handle to it is open;
        // abi_stable holds one from the root module's load on.)
        unsafe { libloading::Library::new(path) }
    }
}

/// Loads a plugin's `abi_stable` root module of type `M`, checking every layout.
pub(super) fn open_root<M: RootModule>(path: &Path) -> Result<M, String> {
    let header = lib_header_from_path(path).map_err(|e| e.to_string())?;
    header
        .init_root_module::<M>()
        .map_err(|e| format!("incompatible plugin layout: {e}"))
}

/// The first usable plugin of `kind` in `dirs` (the one named `name`, when given), with
/// the root module opened; else the last refusal met, else a not-found error naming the
/// directories searched.
pub(super) fn find_plugin<M: RootModule>(
    dirs: &[PathBuf],
    kind: PluginKind,
    name: Option<&str>,
) -> Result<(PluginInfo, M), PluginError> {
    let mut last_refusal = None;
    let mut seen: Vec<String> = Vec::new();
    for path in plugin_paths(dirs).into_iter().filter(|p| may_be(p, kind)) {
        let mut info = inspect(&path, Probe::DeclarationsOnly);
        if info.kind != Some(kind) {
            continue;
        }
        seen.extend(info.name.clone());
        if let (Some(want), Some(have)) = (name, info.name.as_deref()) {
            if want != have {
                continue;
            }
        }
        if kind == PluginKind::Backend && info.refused.is_none() {
            info.unavailable = open_root::<BackendPluginRef>(&info.path)
                .ok()
                .and_then(backend_unavailable);
        }
        let unusable = info.refused.clone().or_else(|| {
            info.unavailable
                .as_ref()
                .map(|why| format!("unavailable: {why}"))
        });
        if let Some(reason) = unusable {
            last_refusal = Some(PluginError::Refused {
                path: info.path,
                reason,
            });
            continue;
        }
        let root = open_root::<M>(&info.path).map_err(|reason| PluginError::Refused {
            path: info.path.clone(),
            reason,
        })?;
        return Ok((info, root));
    }
    if let Some(refusal) = last_refusal {
        return Err(refusal);
    }
    let dirs = dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    Err(PluginError::NotFound {
        kind: kind.name(),
        which: match (name, seen.is_empty()) {
            (Some(n), true) => format!(" named '{n}'"),
            (Some(n), false) => format!(" named '{n}' (found: {})", seen.join(", ")),
            (None, _) => String::new(),
        },
        dirs,
    })
}

/// The name and version of a transport plugin, or why it cannot be used.
fn inspect_transport(path: &Path, abi: u32) -> Result<(String, String), String> {
    if abi != TRANSPORT_ABI_VERSION {
        return Err(format!(
            "built for transport ABI v{abi}, this prima speaks v{TRANSPORT_ABI_VERSION}; rebuild the plugin against this release"
        ));
    }
    let root = open_root::<TransportPluginRef>(path)?;
    Ok((
        root.name()().into_string(),
        root.plugin_version()().into_string(),
    ))
}

/// The name, version and covered OSes of an OS memory plugin, or why it cannot be used.
fn inspect_os_memory(path: &Path, abi: u32) -> Result<(String, String, Vec<String>), String> {
    if abi != OS_MEMORY_ABI_VERSION {
        return Err(format!(
            "built for os-memory ABI v{abi}, this prima speaks v{OS_MEMORY_ABI_VERSION}; rebuild the plugin against this release"
        ));
    }
    let root = open_root::<OsMemoryPluginRef>(path)?;
    Ok((
        root.name()().into_string(),
        root.plugin_version()().into_string(),
        root.covers()()
            .into_iter()
            .map(|os| os.into_string())
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_named_for_another_kind_is_not_opened_for_this_one() {
        let backend = Path::new("/p/libprima_backend_metal.so");
        assert!(may_be(backend, PluginKind::Backend));
        assert!(!may_be(backend, PluginKind::Transport));
        assert!(!may_be(
            Path::new("prima_transport_tcp.dll"),
            PluginKind::Backend
        ));
        assert!(may_be(
            Path::new("/p/libprima_os_memory.so"),
            PluginKind::OsMemory
        ));
        assert!(!may_be(
            Path::new("/p/libprima_os_memory.so"),
            PluginKind::Solver
        ));
        // A name that declares no kind may be anything: the library says.
        assert!(may_be(
            Path::new("/p/libprima_custom.so"),
            PluginKind::Solver
        ));
    }
}

//! Finds plugin libraries, checks what they declare, and loads backends and solvers
//! from them (transports: `transport_loader.rs`, over the same `find_plugin`; OS memory
//! models: `os_loader.rs`).

use std::path::{Path, PathBuf};

use abi_stable::library::{lib_header_from_path, RootModule};
use abi_stable::std_types::{RResult, RString};

use super::PluginKind;
use prima_abi::backend::{
    BackendBox, BackendConfig, BackendPluginRef, GpuMemory, BACKEND_ABI_VERSION,
};
use prima_abi::solver::{MilpProblem, MilpSolution, SolverPluginRef, SOLVER_ABI_VERSION};

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
    /// Filled by [`discover`]/[`discover_in`], which ask each backend; `None` otherwise.
    pub unavailable: Option<String>,
    /// A usable GPU backend's memory (the plugin answers [`GpuMemory`]); `None` for other
    /// plugins. Filled by [`discover`]/[`discover_in`].
    pub gpu_memory: Option<GpuMemory>,
    /// The OS names an OS memory plugin covers (empty for other kinds).
    pub covers: Vec<String>,
}

/// A backend loaded from a plugin, with where it came from.
pub struct LoadedBackend {
    pub backend: BackendBox,
    pub plugin_name: String,
    pub plugin_version: String,
    pub path: PathBuf,
    /// The plugin's GPU memory query, when it has one.
    gpu_memory: Option<extern "C" fn() -> abi_stable::std_types::ROption<GpuMemory>>,
}

impl LoadedBackend {
    /// The GPU's memory now, if this backend is a GPU's (its plugin answers the question).
    pub fn gpu_memory(&self) -> Option<GpuMemory> {
        self.gpu_memory.and_then(|probe| probe().into_option())
    }
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

/// Lists every plugin library in the plugin directories, with what it declares.
pub fn discover() -> Vec<PluginInfo> {
    discover_in(&plugin_dirs())
}

/// Lists every plugin library in `dirs`, with what it declares.
pub fn discover_in(dirs: &[PathBuf]) -> Vec<PluginInfo> {
    plugin_paths(dirs)
        .iter()
        .map(|path| inspect(path, Probe::Hardware))
        .collect()
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
                    match super::transport_loader::inspect_transport(path, abi) {
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
                    match super::os_loader::inspect_os_memory(path, abi) {
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
    for path in plugin_paths(dirs) {
        let mut info = inspect(&path, Probe::DeclarationsOnly);
        if info.kind != Some(kind) {
            continue;
        }
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
        which: name.map(|n| format!(" named '{n}'")).unwrap_or_default(),
        dirs,
    })
}

/// Loads the backend plugin named `name` (or the first usable one) and creates a backend.
pub fn load_backend(
    name: Option<&str>,
    config: BackendConfig,
) -> Result<LoadedBackend, PluginError> {
    let (info, root) = find_plugin::<BackendPluginRef>(&plugin_dirs(), PluginKind::Backend, name)?;
    match root.create()(config) {
        RResult::ROk(backend) => Ok(LoadedBackend {
            backend,
            plugin_name: info.name.unwrap_or_default(),
            plugin_version: info.version.unwrap_or_default(),
            path: info.path,
            gpu_memory: root.gpu_memory(),
        }),
        RResult::RErr(e) => Err(PluginError::Create {
            path: info.path,
            reason: e.into_string(),
        }),
    }
}

/// The name of the first usable GPU backend plugin (one that answers [`GpuMemory`]) in
/// the plugin directories, if any.
pub fn first_gpu_backend() -> Option<String> {
    discover()
        .into_iter()
        .find(|p| p.kind == Some(PluginKind::Backend) && p.gpu_memory.is_some())
        .and_then(|p| p.name)
}

/// A solver loaded from a plugin, with where it came from.
#[derive(Clone)]
pub struct LoadedSolver {
    root: SolverPluginRef,
    pub plugin_name: String,
    pub plugin_version: String,
    pub path: PathBuf,
}

impl std::fmt::Debug for LoadedSolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedSolver")
            .field("plugin_name", &self.plugin_name)
            .field("path", &self.path)
            .finish()
    }
}

impl LoadedSolver {
    /// Solves `problem` after checking its indices, so the plugin never sees a bad one.
    pub fn solve(&self, problem: &MilpProblem) -> Result<MilpSolution, String> {
        problem.validate()?;
        match self.root.solve()(problem) {
            RResult::ROk(solution)
                if solution.values.len() == problem.columns.len() || !solution.has_solution =>
            {
                Ok(solution)
            }
            RResult::ROk(solution) => Err(format!(
                "solver {} returned {} values for {} columns",
                self.plugin_name,
                solution.values.len(),
                problem.columns.len()
            )),
            RResult::RErr(e) => Err(e.into_string()),
        }
    }
}

/// Loads the solver plugin named `name` (or the first usable one).
pub fn load_solver(name: Option<&str>) -> Result<LoadedSolver, PluginError> {
    load_solver_from(&plugin_dirs(), name)
}

/// Loads the solver plugin named `name` (or the first usable one) from `dirs`.
pub fn load_solver_from(dirs: &[PathBuf], name: Option<&str>) -> Result<LoadedSolver, PluginError> {
    let (info, root) = find_plugin::<SolverPluginRef>(dirs, PluginKind::Solver, name)?;
    Ok(LoadedSolver {
        root,
        plugin_name: info.name.unwrap_or_default(),
        plugin_version: info.version.unwrap_or_default(),
        path: info.path,
    })
}

// `RootModule` must be in scope for the prefix accessors generated on `BackendPluginRef`.
#[allow(unused_imports)]
use RootModule as _;

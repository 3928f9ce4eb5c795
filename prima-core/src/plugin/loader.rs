//! Loads backends and solvers from the plugin libraries that `library.rs` finds
//! (transports: `transport_loader.rs`; OS memory models: `os_loader.rs`).

use std::path::PathBuf;

use abi_stable::std_types::RResult;

use super::library::{find_plugin, plugin_dirs, PluginError};
use super::probe::discover;
use super::PluginKind;
use prima_abi::backend::{BackendBox, BackendConfig, BackendPluginRef, GpuMemory};
use prima_abi::solver::{MilpProblem, MilpSolution, SolverPluginRef};

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

/// Loads the backend plugin named `name` (or the first usable one) and creates a backend.
pub fn load_backend(
    name: Option<&str>,
    config: BackendConfig,
) -> Result<LoadedBackend, PluginError> {
    let name = name.map(backend_for_platform);
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

/// The backend plugin that runs on a GPU platform named as people name it: `metal`,
/// `vulkan`, `dx12` and `webgpu` are the `wgpu` backend's (its library is
/// `libprima_backend_metal`); any other name is a plugin's own.
pub fn backend_for_platform(name: &str) -> &str {
    match name {
        "metal" | "vulkan" | "dx12" | "webgpu" => "wgpu",
        other => other,
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
use abi_stable::library::RootModule as _;

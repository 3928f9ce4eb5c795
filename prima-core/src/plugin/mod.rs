//! The plugin host: finds plugin libraries at run time and loads them through the ABIs
//! that `prima-abi` defines.
//!
//! Backends, transports, solvers and OS memory models are `cdylib`s loaded from a plugin
//! directory, so a user swaps or adds one without rebuilding `prima`. Each plugin exports
//! two plain C symbols, read with `libloading` before anything else:
//! `prima_plugin_kind() -> u32` and `prima_plugin_abi_version() -> u32`. Only when both
//! match does `abi_stable` load the root module and check every type's layout.

mod library;
mod loader;
mod os_loader;
mod probe;
mod transport_loader;

pub use library::{plugin_dirs, PluginError, PluginInfo, PLUGIN_DIR_ENV};
pub use loader::{
    first_gpu_backend, load_backend, load_solver, load_solver_from, LoadedBackend, LoadedSolver,
};
pub use os_loader::{load_os_models, load_os_models_from, LoadedOsModels};
pub use probe::{answer_probe, discover, discover_in, probe_in_child_processes, PROBE_ARG};
pub use transport_loader::{load_relay, load_transport, LoadedTransport};

pub use prima_abi::PluginKind;

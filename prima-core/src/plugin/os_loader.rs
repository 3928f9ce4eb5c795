//! Loads OS memory plugins (found by the same discovery as backends): every usable one,
//! since each covers its own OSes; the first found that covers an OS answers for it.

use std::path::PathBuf;

use abi_stable::library::RootModule;
use abi_stable::std_types::{RResult, RStr};

use super::library::{declared_in, open_root, plugin_dirs};
use super::PluginKind;
use prima_abi::os::{OsGpu, OsMemoryModelBox, OsMemoryPluginRef};

/// One usable OS memory plugin.
#[derive(Clone)]
struct OsPlugin {
    root: OsMemoryPluginRef,
    name: String,
    version: String,
    covers: Vec<String>,
    path: PathBuf,
}

/// Every usable OS memory plugin in the plugin directories, in discovery order, and what
/// was refused (for the message when no plugin covers a device's OS).
#[derive(Clone, Default)]
pub struct LoadedOsModels {
    plugins: Vec<OsPlugin>,
    refused: Vec<String>,
    dirs: Vec<PathBuf>,
}

impl std::fmt::Debug for LoadedOsModels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.found())
    }
}

impl LoadedOsModels {
    /// The memory model for `os` with `gpu` from the first plugin covering `os`, with that
    /// plugin's name; else a message naming the OS and every OS plugin found.
    pub fn model(&self, os: &str, gpu: OsGpu) -> Result<(OsMemoryModelBox, &str), String> {
        let Some(plugin) = self
            .plugins
            .iter()
            .find(|p| p.covers.iter().any(|c| c == os))
        else {
            return Err(format!(
                "no OS memory plugin covers os '{os}'; {}",
                self.found()
            ));
        };
        match plugin.root.model()(RStr::from_str(os), gpu) {
            RResult::ROk(model) => Ok((model, &plugin.name)),
            RResult::RErr(why) => Err(format!(
                "OS memory plugin {} ({}) has no model for os '{os}' with gpu {}: {why}",
                plugin.name,
                plugin.path.display(),
                gpu.name()
            )),
        }
    }

    /// The OS names covered, in discovery order (repeats removed).
    pub fn covered(&self) -> Vec<&str> {
        let mut all: Vec<&str> = Vec::new();
        for os in self.plugins.iter().flat_map(|p| p.covers.iter()) {
            if !all.contains(&os.as_str()) {
                all.push(os);
            }
        }
        all
    }

    /// What was found, for people: each plugin with the OSes it covers, and refusals.
    fn found(&self) -> String {
        let dirs = self
            .dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let mut parts: Vec<String> = self
            .plugins
            .iter()
            .map(|p| {
                format!(
                    "{} {} covers {} ({})",
                    p.name,
                    p.version,
                    p.covers.join(", "),
                    p.path.display()
                )
            })
            .collect();
        parts.extend(self.refused.iter().map(|r| format!("refused: {r}")));
        if parts.is_empty() {
            format!("no OS memory plugin found in {dirs} (set PRIMA_PLUGIN_DIR or put the plugin beside the prima binary)")
        } else {
            format!("OS memory plugins in {dirs}: {}", parts.join("; "))
        }
    }
}

/// Every usable OS memory plugin in the plugin directories.
pub fn load_os_models() -> LoadedOsModels {
    load_os_models_from(&plugin_dirs())
}

/// Every usable OS memory plugin in `dirs`. Finding none is not an error here: the
/// planner says so, naming the OS it needed.
pub fn load_os_models_from(dirs: &[PathBuf]) -> LoadedOsModels {
    let mut loaded = LoadedOsModels {
        dirs: dirs.to_vec(),
        ..LoadedOsModels::default()
    };
    for info in declared_in(dirs, PluginKind::OsMemory) {
        if let Some(reason) = info.refused {
            loaded
                .refused
                .push(format!("{} — {reason}", info.path.display()));
            continue;
        }
        match open_root::<OsMemoryPluginRef>(&info.path) {
            Ok(root) => loaded.plugins.push(OsPlugin {
                root,
                name: info.name.unwrap_or_default(),
                version: info.version.unwrap_or_default(),
                covers: info.covers,
                path: info.path,
            }),
            Err(reason) => loaded
                .refused
                .push(format!("{} — {reason}", info.path.display())),
        }
    }
    loaded
}

// `RootModule` must be in scope for the prefix accessors generated on `OsMemoryPluginRef`.
#[allow(unused_imports)]
use RootModule as _;

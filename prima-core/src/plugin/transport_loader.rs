//! Loads transport plugins (found by the same discovery as backends).

use std::path::{Path, PathBuf};

use abi_stable::library::{lib_header_from_path, RootModule};
use abi_stable::std_types::RResult;

use super::transport_abi::{
    TransportBox, TransportConfig, TransportPluginRef, TRANSPORT_ABI_VERSION,
};
use super::{discover, plugin_dirs, PluginError, PluginKind};

/// A transport loaded from a plugin, with where it came from.
pub struct LoadedTransport {
    pub transport: TransportBox,
    pub plugin_name: String,
    pub path: PathBuf,
}

fn open_root(path: &Path) -> Result<TransportPluginRef, String> {
    let header = lib_header_from_path(path).map_err(|e| e.to_string())?;
    header
        .init_root_module::<TransportPluginRef>()
        .map_err(|e| format!("incompatible plugin layout: {e}"))
}

/// The name and version of a transport plugin, or why it cannot be used.
pub(super) fn inspect_transport(path: &Path, abi: u32) -> Result<(String, String), String> {
    if abi != TRANSPORT_ABI_VERSION {
        return Err(format!(
            "built for transport ABI v{abi}, this prima speaks v{TRANSPORT_ABI_VERSION}; rebuild the plugin against this release"
        ));
    }
    let root = open_root(path)?;
    Ok((
        root.name()().into_string(),
        root.plugin_version()().into_string(),
    ))
}

/// Loads the transport plugin named `name` (or the first usable one).
pub fn load_transport(
    name: Option<&str>,
    config: TransportConfig,
) -> Result<LoadedTransport, PluginError> {
    let mut last_refusal = None;
    for info in discover() {
        if info.kind != Some(PluginKind::Transport) {
            continue;
        }
        if let (Some(want), Some(have)) = (name, info.name.as_deref()) {
            if want != have {
                continue;
            }
        }
        if let Some(reason) = info.refused {
            last_refusal = Some(PluginError::Refused {
                path: info.path,
                reason,
            });
            continue;
        }
        let root = open_root(&info.path).map_err(|reason| PluginError::Refused {
            path: info.path.clone(),
            reason,
        })?;
        return match root.create()(config) {
            RResult::ROk(transport) => Ok(LoadedTransport {
                transport,
                plugin_name: info.name.unwrap_or_default(),
                path: info.path,
            }),
            RResult::RErr(e) => Err(PluginError::Create {
                path: info.path,
                reason: e.into_string(),
            }),
        };
    }
    if let Some(refusal) = last_refusal {
        return Err(refusal);
    }
    let dirs = plugin_dirs()
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    Err(PluginError::NotFound {
        kind: "transport",
        which: name.map(|n| format!(" named '{n}'")).unwrap_or_default(),
        dirs,
    })
}

// `RootModule` must be in scope for the prefix accessors generated on `TransportPluginRef`.
#[allow(unused_imports)]
use RootModule as _;

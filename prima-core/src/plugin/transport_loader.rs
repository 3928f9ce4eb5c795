//! Loads transport plugins (found by the same discovery as backends).

use std::path::{Path, PathBuf};

use abi_stable::library::RootModule;
use abi_stable::std_types::RResult;

use super::loader::{find_plugin, open_root};
use abi_stable::std_types::{RString, RVec};

use super::{plugin_dirs, PluginError, PluginKind};
use prima_abi::transport::{
    RelayBox, TransportBox, TransportConfig, TransportPluginRef, TRANSPORT_ABI_VERSION,
};

/// A transport loaded from a plugin, with where it came from.
pub struct LoadedTransport {
    pub transport: TransportBox,
    pub plugin_name: String,
    pub path: PathBuf,
}

/// The name and version of a transport plugin, or why it cannot be used.
pub(super) fn inspect_transport(path: &Path, abi: u32) -> Result<(String, String), String> {
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

/// Loads the transport plugin named `name` (or the first usable one).
pub fn load_transport(
    name: Option<&str>,
    config: TransportConfig,
) -> Result<LoadedTransport, PluginError> {
    let (info, root) =
        find_plugin::<TransportPluginRef>(&plugin_dirs(), PluginKind::Transport, name)?;
    match root.create()(config) {
        RResult::ROk(transport) => Ok(LoadedTransport {
            transport,
            plugin_name: info.name.unwrap_or_default(),
            path: info.path,
        }),
        RResult::RErr(e) => Err(PluginError::Create {
            path: info.path,
            reason: e.into_string(),
        }),
    }
}

/// Starts a relay on `legs` with the transport plugin named `name`; a plugin built
/// before relays existed, or one that cannot relay, is refused with the reason.
pub fn load_relay(name: &str, legs: &[String]) -> Result<(RelayBox, PathBuf), PluginError> {
    let (info, root) =
        find_plugin::<TransportPluginRef>(&plugin_dirs(), PluginKind::Transport, Some(name))?;
    let Some(relay) = root.relay() else {
        return Err(PluginError::Create {
            path: info.path,
            reason: format!("the {name} transport was built without relay support"),
        });
    };
    let legs: RVec<RString> = legs.iter().map(|l| RString::from(l.as_str())).collect();
    match relay(legs) {
        RResult::ROk(relay) => Ok((relay, info.path)),
        RResult::RErr(e) => Err(PluginError::Create {
            path: info.path,
            reason: e.into_string(),
        }),
    }
}

// `RootModule` must be in scope for the prefix accessors generated on `TransportPluginRef`.
#[allow(unused_imports)]
use RootModule as _;

//! Loads transport plugins (found by the same discovery as backends).

use std::path::PathBuf;

use abi_stable::library::RootModule;
use abi_stable::std_types::RResult;

use super::library::find_plugin;
use abi_stable::std_types::{RString, RVec};

use super::library::{plugin_dirs, PluginError};
use super::PluginKind;
use prima_abi::transport::{RelayBox, TransportBox, TransportConfig, TransportPluginRef};

/// A transport loaded from a plugin, with where it came from.
pub struct LoadedTransport {
    pub transport: TransportBox,
    pub plugin_name: String,
    pub path: PathBuf,
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

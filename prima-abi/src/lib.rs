//! The contract between Prima and its plugins: the backend, transport, solver and OS-memory
//! ABIs, their shared types ([`GgmlType`]), version numbers and root modules.
//!
//! A plugin depends on this crate and never on the engine (`prima-core`): a plugin author
//! builds against these types alone. Each plugin exports two plain C symbols, read with
//! `libloading` before anything else: `prima_plugin_kind() -> u32` and
//! `prima_plugin_abi_version() -> u32`. Only when both match does `abi_stable` load the root
//! module and check every type's layout. Not here: finding and loading plugin libraries
//! (the engine's `plugin` module) and anything that computes.

pub mod backend;
mod ggml_type;
pub mod on_host;
pub mod os;
pub mod solver;
pub mod transport;

pub use ggml_type::{GgmlType, QK_K};

/// What a plugin library provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum PluginKind {
    Backend = 1,
    Transport = 2,
    Solver = 3,
    OsMemory = 4,
}

impl PluginKind {
    pub fn from_id(id: u32) -> Option<PluginKind> {
        match id {
            1 => Some(PluginKind::Backend),
            2 => Some(PluginKind::Transport),
            3 => Some(PluginKind::Solver),
            4 => Some(PluginKind::OsMemory),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PluginKind::Backend => "backend",
            PluginKind::Transport => "transport",
            PluginKind::Solver => "solver",
            PluginKind::OsMemory => "os-memory",
        }
    }
}

/// Used by [`export_backend_plugin!`] when a test builds a
/// plugin that claims another ABI version.
#[doc(hidden)]
pub const fn parse_fake_abi_version(s: &str) -> u32 {
    let bytes = s.as_bytes();
    let mut value = 0u32;
    let mut i = 0;
    while i < bytes.len() {
        let d = bytes[i];
        if d < b'0' || d > b'9' {
            return u32::MAX;
        }
        value = value.wrapping_mul(10).wrapping_add((d - b'0') as u32);
        i += 1;
    }
    value
}

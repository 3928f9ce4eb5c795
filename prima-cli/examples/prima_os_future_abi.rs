//! Test fixture (`tests/os_plugin.rs`): a library that declares itself an OS memory plugin
//! for an ABI version this `prima` does not speak. The loader reads the version before
//! anything else and refuses it, so nothing more is needed here.

/// Which kind of plugin this library is: an OS memory plugin.
#[no_mangle]
pub extern "C" fn prima_plugin_kind() -> u32 {
    prima_core::plugin::PluginKind::OsMemory as u32
}

/// An ABI version from the future.
#[no_mangle]
pub extern "C" fn prima_plugin_abi_version() -> u32 {
    999
}

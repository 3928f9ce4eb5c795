//! Transport plugin ABI, version 1: how ring devices exchange messages.
//!
//! The core speaks in whole messages (byte frames) and never touches a socket; a transport
//! plugin turns addresses into connections and carries frames over them, in order and
//! intact. Calls block the calling thread (which sleeps, it does not spin) until the frame
//! is sent or received or the timeout passes. Connections may be used from two threads at
//! once, one sending and one receiving.
//!
//! Addresses are `host:port`. A transport that can go through a relay (`vpn-proxy`) also
//! takes `TARGET via RELAY` ([`relayed`]): connect to the relay at `RELAY`, which
//! forwards the connection to `TARGET` on another network; others refuse that form.
//!
//! [`TRANSPORT_ABI_VERSION`] is checked before `abi_stable` checks the layouts and must be
//! bumped whenever anything in this file changes meaning.

// abi_stable's `sabi_trait` expands to impls inside a const block.
#![allow(non_local_definitions)]

use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    package_version_strings, sabi_trait,
    sabi_types::VersionStrings,
    std_types::{RBox, ROption, RResult, RSlice, RString, RVec},
    StableAbi,
};

/// Version of the transport ABI defined in this file.
pub const TRANSPORT_ABI_VERSION: u32 = 1;

/// Result type of every fallible transport call; the error names the peer and the cause.
pub type TransportResult<T> = RResult<T, RString>;

/// Wait forever.
pub const NO_TIMEOUT: u64 = u64::MAX;

/// How a transport instance is created.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct TransportConfig {
    /// Largest frame accepted from a peer, in bytes (protects against garbage lengths).
    pub max_frame_bytes: u64,
}

/// One bidirectional, ordered, message-framed connection.
#[sabi_trait]
pub trait Connection: Send + Sync {
    /// Sends one frame; returns when it has been handed to the operating system.
    fn send(&self, frame: RSlice<'_, u8>) -> TransportResult<()>;

    /// Receives the next frame; `RNone` when `timeout_ms` passed first. A closed
    /// connection is an error.
    fn recv(&self, timeout_ms: u64) -> TransportResult<ROption<RVec<u8>>>;

    /// The peer's address, for messages.
    fn peer(&self) -> RString;

    /// Shuts the connection down in both directions; later calls fail.
    fn close(&self);
}

/// An owned connection behind the ABI.
pub type ConnectionBox = Connection_TO<'static, RBox<()>>;

/// Accepts incoming connections on one address.
#[sabi_trait]
pub trait Listener: Send + Sync {
    /// The address actually bound (with the port chosen when asked for port 0).
    fn local_addr(&self) -> RString;

    /// Waits for the next connection; `RNone` when `timeout_ms` passed first.
    fn accept(&self, timeout_ms: u64) -> TransportResult<ROption<ConnectionBox>>;
}

pub type ListenerBox = Listener_TO<'static, RBox<()>>;

/// A transport: makes listeners and outgoing connections.
#[sabi_trait]
pub trait Transport: Send + Sync {
    /// Short name, e.g. `tcp`.
    fn name(&self) -> RString;

    fn listen(&self, addr: RString) -> TransportResult<ListenerBox>;

    /// Connects to `addr`, giving up after `timeout_ms`.
    fn connect(&self, addr: RString, timeout_ms: u64) -> TransportResult<ConnectionBox>;
}

pub type TransportBox = Transport_TO<'static, RBox<()>>;

/// A relay (`prima relay`): listens on two or more networks and forwards connections
/// from one to another, without reading what they carry.
#[sabi_trait]
pub trait Relay: Send + Sync {
    /// Each leg as bound, with the network it accepts targets on, e.g.
    /// `10.1.0.2:9100 (10.1.0.0/24)`.
    fn legs(&self) -> RVec<RString>;

    /// Forwards connections until [`Relay::stop`]; blocks the calling thread.
    fn serve(&self) -> TransportResult<()>;

    /// Ends `serve` (connections being forwarded are cut).
    fn stop(&self);
}

pub type RelayBox = Relay_TO<'static, RBox<()>>;

/// The separator of a relayed address, `TARGET via RELAY`.
pub const VIA: &str = " via ";

/// The address that reaches `target` through the relay leg at `relay`.
pub fn relayed(target: &str, relay: &str) -> String {
    format!("{target}{VIA}{relay}")
}

/// An address's target and, for a relayed one, the relay it goes through.
pub fn split_via(addr: &str) -> (&str, Option<&str>) {
    match addr.split_once(VIA) {
        Some((target, relay)) => (target.trim(), Some(relay.trim())),
        None => (addr.trim(), None),
    }
}

/// The root module a transport plugin exports.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = TransportPluginRef)))]
#[sabi(missing_field(panic))]
pub struct TransportPlugin {
    pub name: extern "C" fn() -> RString,
    pub plugin_version: extern "C" fn() -> RString,
    #[sabi(last_prefix_field)]
    pub create: extern "C" fn(TransportConfig) -> TransportResult<TransportBox>,
    /// Starts a relay on these legs (`host:port`, optionally `/prefix`: the network the
    /// leg accepts targets on), or says why this transport cannot relay. Appended after
    /// the prefix, so plugins built before it still load (and cannot relay).
    #[sabi(missing_field(option))]
    pub relay: extern "C" fn(RVec<RString>) -> TransportResult<RelayBox>,
}

impl RootModule for TransportPluginRef {
    declare_root_module_statics! {TransportPluginRef}
    const BASE_NAME: &'static str = "prima_transport";
    const NAME: &'static str = "prima_transport";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

/// Exports a transport plugin from a `cdylib` crate.
///
/// ```ignore
/// prima_abi::export_transport_plugin!(name = "tcp", create = my_create_fn);
/// ```
/// A transport that can relay also names `relay = my_relay_fn` (see
/// [`TransportPlugin::relay`]); without it `prima relay` is refused with the reason.
#[macro_export]
macro_rules! export_transport_plugin {
    (name = $name:expr, create = $create:path) => {
        extern "C" fn __prima_plugin_cannot_relay(
            _legs: ::abi_stable::std_types::RVec<::abi_stable::std_types::RString>,
        ) -> $crate::transport::TransportResult<$crate::transport::RelayBox> {
            ::abi_stable::std_types::RResult::RErr(::abi_stable::std_types::RString::from(concat!(
                "the ",
                $name,
                " transport cannot relay (use --transport vpn-proxy)"
            )))
        }
        $crate::export_transport_plugin!(
            name = $name,
            create = $create,
            relay = __prima_plugin_cannot_relay
        );
    };
    (name = $name:expr, create = $create:path, relay = $relay:path) => {
        /// Read by the loader with plain `libloading` before any `abi_stable` check.
        #[no_mangle]
        pub extern "C" fn prima_plugin_abi_version() -> u32 {
            $crate::transport::TRANSPORT_ABI_VERSION
        }

        /// Which kind of plugin this library is.
        #[no_mangle]
        pub extern "C" fn prima_plugin_kind() -> u32 {
            $crate::PluginKind::Transport as u32
        }

        extern "C" fn __prima_plugin_name() -> ::abi_stable::std_types::RString {
            ::abi_stable::std_types::RString::from($name)
        }

        extern "C" fn __prima_plugin_version() -> ::abi_stable::std_types::RString {
            ::abi_stable::std_types::RString::from(env!("CARGO_PKG_VERSION"))
        }

        #[::abi_stable::export_root_module]
        pub fn __prima_transport_root() -> $crate::transport::TransportPluginRef {
            use ::abi_stable::prefix_type::PrefixTypeTrait;
            $crate::transport::TransportPlugin {
                name: __prima_plugin_name,
                plugin_version: __prima_plugin_version,
                create: $create,
                relay: $relay,
            }
            .leak_into_prefix()
        }
    };
}

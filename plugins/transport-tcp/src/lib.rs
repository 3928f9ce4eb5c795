//! Prima's TCP transport plugin: length-delimited frames over TCP with `TCP_NODELAY`.
//! The transport itself lives in `prima-tcp-wire`, shared with the vpn-proxy plugin; this
//! crate exports it as the `tcp` plugin.

pub use prima_tcp_wire::*;

prima_abi::export_transport_plugin!(name = "tcp", create = create_transport);

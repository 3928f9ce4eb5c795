//! Opt-in discovery of ring nodes on the local network with mDNS / DNS-SD: a `prima node
//! --advertise` announces itself (`advertise.rs`), `prima discover` and a manifest's
//! `[discovery]` section look for such nodes (`browse.rs`), keep those of their cluster
//! (`membership.rs`); the manifest fills in the addresses it leaves out from what is found
//! (`manifest/addresses.rs`).
//!
//! Discovery is a LAN service beside the ring, like the HTTP server: it speaks multicast
//! DNS on its own sockets (the `mdns-sd` crate's thread) and never carries ring traffic,
//! which still goes through the transport plugin. Explicit addresses always work and
//! always win; discovery only fills in what a manifest leaves out, and fails where
//! multicast does not cross (VPNs, VLANs, one-way multicast).

mod advertise;
mod browse;
mod membership;
mod record;

pub use advertise::Advertiser;
pub use browse::{browse, classify, Discovery, FoundNode, IgnoredNode, Sighting};
pub use membership::{ClusterFilter, IgnoreReason};
pub use record::NodeRecord;

/// The DNS-SD service type every Prima node registers under.
pub const SERVICE_TYPE: &str = "_prima._tcp.local.";

/// The cluster a node or a search belongs to when none is named.
pub const DEFAULT_CLUSTER: &str = "prima";

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The mDNS daemon could not start or refused a request.
    #[error("mDNS: {0}")]
    Mdns(String),
    /// What `--advertise` was asked to announce cannot be announced.
    #[error("cannot advertise: {0}")]
    Advertise(String),
    /// A manifest device has no address and discovery did not find it.
    #[error("device '{device}' has no `address` and discovery (cluster \"{cluster}\", {timeout_s}s) did not find it; {seen}")]
    NotFound {
        device: String,
        cluster: String,
        timeout_s: f64,
        /// What was seen instead, for the person fixing it.
        seen: String,
    },
}

impl From<mdns_sd::Error> for DiscoveryError {
    fn from(e: mdns_sd::Error) -> Self {
        DiscoveryError::Mdns(e.to_string())
    }
}

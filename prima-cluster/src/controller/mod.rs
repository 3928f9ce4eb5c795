//! The cluster controller: manifest → profiles → plan → launch → ring, as a library that
//! `prima apply`, `prima serve`/`run` on a manifest and the tests call in-process.
//!
//! - [`plan`] profiles the manifest's devices (or reads its fixture profiles) and plans
//!   the windows (w_m, n_m, k) with Halda or the manifest's scheduler;
//! - [`LocalNodes`] starts (or reuses) the `prima node` processes of the `local` devices,
//!   one set per [`ClusterId`]; `applied.rs` keeps the cluster's last plan and speed;
//! - [`ring_options`] turns a [`RingPolicy`] (the manifest's, or `prima run --ring`'s
//!   flags) and the ring's layout into the head's
//!   [`RingOptions`](crate::prp::RingOptions), the one place they are built;
//! - [`launch`] connects the ring and wraps it for failover ([`replanner`] plans a
//!   lost device out and back in); [`connect`] connects a plain ring.
//!
//! Nothing here prints: what a person sees (the plan's [`Plan::table`], spinners, node
//! lines) is the CLI's. Errors are [`ControllerError`]s naming the manifest, device or
//! file at fault.

mod applied;
mod error;
mod failover;
mod links;
mod local_nodes;
mod node_process;
mod plan;
mod ring;

use crate::manifest::LoadedManifest;
use crate::prp::key::LinkSecurity;

pub use applied::{
    applied_clusters, last_applied, plan_changes, profile_changes, record_applied, record_measured,
    Applied,
};
pub use error::ControllerError;
pub use failover::{layout_of, replanner};
pub use local_nodes::{
    cluster_label, kept_nodes, stop_kept, ClusterId, LocalNodes, NodeSpec, RunningNode, LOGS_KEPT,
    STATE_DIR_ENV,
};
pub use plan::{plan, DevicePlan, Plan, PlanInputs};
pub use ring::{
    connect, given_layout, launch, name_devices, ring_options, LaunchSettings, RingPolicy,
};

/// The largest frame a ring link carries: a batch of hidden states, or a profile.
pub const MAX_FRAME_BYTES: u64 = 1 << 30;

/// The transport plugin the manifest's ring needs: its `policy.transport`, else one that
/// goes through relays when the ring crosses networks, else the first found (`None`).
pub fn transport_for(manifest: &LoadedManifest, head: usize) -> Option<String> {
    let m = &manifest.manifest;
    m.policy.transport.clone().or_else(|| {
        crate::manifest::routes::crosses_networks(m, head).then(|| "vpn-proxy".to_string())
    })
}

/// One [`NodeSpec`] per `local` device other than the head, run by the `prima` binary
/// `exe` with the cluster key at `key_file` (`None`: plain links).
pub fn local_node_specs(
    manifest: &LoadedManifest,
    head: usize,
    exe: &std::path::Path,
    transport: Option<&str>,
    key_file: Option<&std::path::Path>,
    security: &LinkSecurity,
) -> Vec<NodeSpec> {
    let m = &manifest.manifest;
    let head_name = &m.devices[head].name;
    let key_fingerprint = match security {
        LinkSecurity::Key(key) => Some(key.fingerprint()),
        LinkSecurity::Insecure => None,
    };
    m.devices
        .iter()
        .filter(|d| d.local && &d.name != head_name)
        .map(|d| NodeSpec {
            name: d.name.clone(),
            exe: exe.to_path_buf(),
            model: manifest.model_path(&d.name),
            threads: d.threads,
            mem_budget: d.mem_budget.map(|s| s.0),
            backend: d.backend.clone(),
            gpu_backend: d.gpu_backend.clone(),
            transport: transport.map(str::to_string),
            key_file: key_file.map(|p| p.to_path_buf()),
            key_fingerprint: key_fingerprint.clone(),
        })
        .collect()
}

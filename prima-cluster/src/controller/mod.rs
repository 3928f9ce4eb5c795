//! The cluster controller: manifest → profiles → plan → launch → ring, as a library that
//! `prima apply`, `prima serve`/`run` on a manifest and the tests call in-process.
//!
//! - [`plan`] profiles the manifest's devices (or reads its fixture profiles) and plans
//!   the windows (w_m, n_m, k) with Halda or the manifest's scheduler;
//! - [`LocalNodes`] starts (or reuses) the `prima node` processes of the `local` devices;
//! - [`ring_options`] turns the manifest's policy and the plan into the head's
//!   [`RingOptions`] (the one place they are built from a manifest);
//! - [`launch`] connects the ring and wraps it for failover ([`replanner`] plans a
//!   lost device out and back in).
//!
//! Nothing here prints: what a person sees (the plan's [`Plan::table`], spinners, node
//! lines) is the CLI's. Errors are `anyhow` messages naming the manifest, device or file,
//! since every step here is a composition of the typed layers below.

mod failover;
mod local_nodes;
mod node_process;
mod plan;

use prima_abi::backend::BackendBox;
use prima_abi::transport::TransportBox;
use prima_core::model::Model;

use crate::manifest::{LoadedManifest, Release};
use crate::prp::budget::MemBudget;
use crate::prp::failover::{Replan, ResilientRing};
use crate::prp::key::LinkSecurity;
use crate::prp::protocol::{ReleaseMethod, ReleasePolicy, WireType};
use crate::prp::{RingError, RingGpus, RingHead, RingOptions};

pub use failover::{layout_of, replanner};
pub use local_nodes::{LocalNodes, NodeSpec, RunningNode};
pub use plan::{plan, DevicePlan, Plan, PlanInputs};

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

/// What launching needs beyond the manifest and the plan.
pub struct LaunchSettings {
    /// Context positions per slot (the policy's, at most the model's training context).
    pub n_ctx: usize,
    /// Micro-batches the head keeps in flight (`None`: one at a time).
    pub micro_batches: Option<usize>,
    /// Bytes the head's process holds beside its windows (a draft model and its caches).
    pub head_reserved: u64,
    pub security: LinkSecurity,
}

/// The head's [`RingOptions`] for `plan` under the manifest's policy.
pub fn ring_options(
    manifest: &LoadedManifest,
    head: usize,
    plan: &Plan,
    settings: LaunchSettings,
) -> RingOptions {
    let m = &manifest.manifest;
    let policy = &m.policy;
    let head_device = &m.devices[head];
    RingOptions {
        n_ctx: settings.n_ctx,
        n_batch: policy.batch,
        n_slots: m.server.parallel,
        prefetch: policy.prefetch,
        release: match policy.release {
            Release::Mru => ReleasePolicy::Mru,
            Release::None => ReleasePolicy::None,
        },
        release_method: ReleaseMethod::Pageout,
        wire: WireType::F32,
        mem_budget: head_device
            .mem_budget
            .map_or(MemBudget::Auto, |s| MemBudget::Bytes(s.0)),
        // Across networks the last device reaches the head at its given address.
        listen: head_device
            .address
            .clone()
            .unwrap_or_else(|| RingOptions::default().listen),
        next_routes: plan.ring().skip(1).map(|d| d.next_route.clone()).collect(),
        security: settings.security,
        micro_batches: settings.micro_batches,
        head_reserved: settings.head_reserved,
    }
}

/// Connects the ring of `plan` from the head and wraps it so that a lost device is
/// planned out (and back in) without losing a request; `None` when the plan is the head
/// alone. `head_gpu` runs the head's GPU layers (n_m of the plan's first device).
#[allow(clippy::too_many_arguments)]
pub fn launch<'m>(
    model: &'m Model,
    backend: &'m BackendBox,
    head_gpu: Option<&'m BackendBox>,
    transport: &'m TransportBox,
    plan: &Plan,
    options: &RingOptions,
    replan: Replan<'m>,
) -> Result<Option<ResilientRing<'m>>, anyhow::Error> {
    let nodes: Vec<String> = plan.ring().skip(1).map(|d| d.addr.clone()).collect();
    if nodes.is_empty() {
        return Ok(None);
    }
    let windows: Vec<usize> = plan.ring().map(|d| d.w).collect();
    let head = RingHead::connect_with_gpus(
        model,
        backend,
        transport,
        &nodes,
        &windows,
        &RingGpus {
            head: head_gpu,
            n: plan.ring().map(|d| d.n).collect(),
        },
        options,
    )
    .map_err(|e| name_devices(e, plan))?;
    Ok(Some(ResilientRing::new(
        head,
        model,
        backend,
        transport,
        layout_of(plan),
        options.clone(),
        replan,
    )))
}

/// A ring error with its device index replaced by the device's manifest name.
pub fn name_devices(e: RingError, plan: &Plan) -> anyhow::Error {
    let ring: Vec<&DevicePlan> = plan.ring().collect();
    let name = |m: usize| ring.get(m).map(|d| d.name.clone()).unwrap_or_default();
    match e {
        RingError::DeviceLost {
            device,
            addr,
            reason,
        } => anyhow::anyhow!("device '{}' ({addr}) is gone: {reason}", name(device)),
        RingError::Refused {
            device,
            addr,
            reason,
        } => anyhow::anyhow!(
            "device '{}' ({addr}) refused the setup: {reason}",
            name(device)
        ),
        other => other.into(),
    }
}

//! From a plan to a connected ring: the head's [`RingOptions`], built here and nowhere
//! else, from a [`RingPolicy`] (a manifest's `[policy]`, or `prima run --ring`'s flags),
//! the ring's [`RingLayout`] and the [`LaunchSettings`]; then [`connect`] (a plain ring)
//! or [`launch`] (a ring that plans a lost device out and back in).

use prima_abi::backend::BackendBox;
use prima_abi::transport::TransportBox;
use prima_core::model::Model;

use crate::manifest::{LoadedManifest, Release};
use crate::prp::budget::MemBudget;
use crate::prp::failover::{Replan, ResilientRing, RingDevice, RingLayout};
use crate::prp::key::LinkSecurity;
use crate::prp::protocol::{ReleaseMethod, ReleasePolicy, WireType};
use crate::prp::{NextRoute, RingError, RingGpus, RingHead, RingOptions};

use super::failover::layout_of;
use super::plan::{DevicePlan, Plan};
use super::ControllerError;

/// How the ring runs, whoever decided it: a manifest ([`RingPolicy::of_manifest`]) or
/// `prima run --ring`'s flags.
#[derive(Debug, Clone)]
pub struct RingPolicy {
    /// Rows of one batch, all slots together.
    pub n_batch: usize,
    /// Slots (a KV cache each) every device keeps.
    pub n_slots: usize,
    pub prefetch: bool,
    pub release: ReleasePolicy,
    pub release_method: ReleaseMethod,
    pub wire: WireType,
    /// The head's budget for its own windows.
    pub mem_budget: MemBudget,
    /// Where the head accepts the last device's data connection (`None`: every address,
    /// a free port).
    pub listen: Option<String>,
    /// Logits per row the device that runs the output layer returns (0: all).
    pub output_top_k: u32,
}

impl RingPolicy {
    /// The policy of `manifest`'s ring headed by its device `head`: `[policy]`,
    /// `[server] parallel` and the head device's `mem_budget` and `address`.
    pub fn of_manifest(manifest: &LoadedManifest, head: usize) -> RingPolicy {
        let m = &manifest.manifest;
        let policy = &m.policy;
        let head_device = &m.devices[head];
        RingPolicy {
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
            listen: head_device.address.clone(),
            output_top_k: policy.output_top_k,
        }
    }
}

/// What launching needs beyond the policy and the ring.
pub struct LaunchSettings {
    /// Context positions per slot (at most the model's training context).
    pub n_ctx: usize,
    /// Micro-batches the head keeps in flight (`None`: one at a time).
    pub micro_batches: Option<usize>,
    /// Bytes the head's process holds beside its windows (a draft model and its caches).
    pub head_reserved: u64,
    /// The caller asks rows' logits after an evaluation (`RowLogits`: perplexity, a
    /// draft's verification), so an output device off the head sends the hidden states
    /// back with the logits.
    pub row_logits: bool,
    pub security: LinkSecurity,
}

/// The head's [`RingOptions`] for the ring `layout` under `policy`: the one place they
/// are built, for `apply`, `serve --manifest` and `run --ring` alike.
pub fn ring_options(
    policy: &RingPolicy,
    layout: &RingLayout,
    settings: LaunchSettings,
) -> RingOptions {
    RingOptions {
        n_ctx: settings.n_ctx,
        n_batch: policy.n_batch,
        n_slots: policy.n_slots,
        prefetch: policy.prefetch,
        release: policy.release,
        release_method: policy.release_method,
        wire: policy.wire,
        mem_budget: policy.mem_budget,
        listen: policy
            .listen
            .clone()
            .unwrap_or_else(|| RingOptions::default().listen),
        next_routes: layout.next_routes.clone(),
        security: settings.security,
        micro_batches: settings.micro_batches,
        head_reserved: settings.head_reserved,
        output: layout
            .output_on_last
            .then_some(crate::prp::protocol::OutputSetup {
                top_k: policy.output_top_k,
                hidden: settings.row_logits,
            }),
    }
}

/// A ring given by hand (`prima run --ring`): the head, then a node at each of `nodes`
/// (named by its address), with `windows` (the head's first) and how each node reaches
/// the next (`next_routes`, empty: as the head does). The counts are checked on connecting.
pub fn given_layout(
    nodes: &[String],
    windows: &[usize],
    next_routes: Vec<NextRoute>,
) -> RingLayout {
    let head = RingDevice {
        name: "head".to_string(),
        addr: "head".to_string(),
    };
    RingLayout {
        devices: std::iter::once(head)
            .chain(nodes.iter().map(|addr| RingDevice {
                name: addr.clone(),
                addr: addr.clone(),
            }))
            .collect(),
        windows: windows.to_vec(),
        next_routes,
        absent: Vec::new(),
        output_on_last: false,
    }
}

/// Connects the ring of `layout` from the head; `gpus` gives n_m of each device's windows
/// (the head's on its GPU backend). Errors name devices by their place in the ring.
pub fn connect<'m>(
    model: &'m Model,
    backend: &'m BackendBox,
    transport: &TransportBox,
    layout: &RingLayout,
    gpus: &RingGpus<'m>,
    options: &RingOptions,
) -> Result<RingHead<'m>, ControllerError> {
    let nodes: Vec<String> = layout
        .devices
        .iter()
        .skip(1)
        .map(|d| d.addr.clone())
        .collect();
    Ok(RingHead::connect_with_gpus(
        model,
        backend,
        transport,
        &nodes,
        &layout.windows,
        gpus,
        options,
    )?)
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
) -> Result<Option<ResilientRing<'m>>, ControllerError> {
    let mut layout = layout_of(plan);
    if layout.devices.len() <= 1 && layout.absent.is_empty() {
        return Ok(None);
    }
    if layout.devices.len() > 1 {
        let gpus = RingGpus {
            head: head_gpu,
            n: plan.ring().map(|d| d.n).collect(),
        };
        match connect(model, backend, transport, &layout, &gpus, options) {
            Ok(head) => {
                return Ok(Some(ResilientRing::new(
                    head,
                    model,
                    backend,
                    transport,
                    layout,
                    options.clone(),
                    replan,
                )))
            }
            // A node that does not answer (off, or not started yet) is planned out and
            // asked again between requests; one that answers and refuses is an error.
            Err(ControllerError::Ring(RingError::DeviceLost {
                device,
                addr,
                reason,
            })) if device > 0 && device < layout.devices.len() => {
                let absent = layout.devices[device].clone();
                eprintln!(
                    "ring: device '{}' ({addr}) did not join: {reason}; planning the ring \
                     without it (it is planned in when it answers)",
                    absent.name
                );
                layout.absent.push(absent);
            }
            Err(ControllerError::Ring(e)) => return Err(name_devices(e, plan)),
            Err(e) => return Err(e),
        }
    }
    Ok(Some(ResilientRing::connecting(
        model,
        backend,
        transport,
        layout,
        options.clone(),
        replan,
    )?))
}

/// A ring error with its device index replaced by the device's manifest name.
pub fn name_devices(e: RingError, plan: &Plan) -> ControllerError {
    let ring: Vec<&DevicePlan> = plan.ring().collect();
    let name = |m: usize| ring.get(m).map(|d| d.name.clone()).unwrap_or_default();
    match e {
        RingError::DeviceLost {
            device,
            addr,
            reason,
        } => ControllerError::DeviceLost {
            device: name(device),
            addr,
            reason,
        },
        RingError::Refused {
            device,
            addr,
            reason,
        } => ControllerError::Refused {
            device: name(device),
            addr,
            reason,
        },
        other => ControllerError::Ring(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifests_policy_and_a_given_ring_make_the_same_kind_of_options() {
        let text = r#"
[model]
path = "m.gguf"

[[device]]
name = "desktop"
head = true
address = "10.0.0.1:9000"
mem_budget = "2G"

[[device]]
name = "laptop"
address = "10.0.0.2:9000"

[policy]
batch = 64
prefetch = false
release = "none"

[server]
parallel = 3
"#;
        let manifest = LoadedManifest::parse(text, std::path::Path::new("cluster.toml")).unwrap();
        let policy = RingPolicy::of_manifest(&manifest, 0);
        let layout = given_layout(
            &["10.0.0.2:9000".to_string()],
            &[10, 20],
            vec![NextRoute::Addr("10.0.0.1:7000".to_string())],
        );
        let settings = LaunchSettings {
            n_ctx: 512,
            micro_batches: Some(2),
            head_reserved: 7,
            row_logits: false,
            security: LinkSecurity::Insecure,
        };
        let options = ring_options(&policy, &layout, settings);
        assert_eq!(
            (options.n_ctx, options.n_batch, options.n_slots),
            (512, 64, 3)
        );
        assert!(!options.prefetch);
        assert_eq!(options.release, ReleasePolicy::None);
        assert_eq!(options.mem_budget, MemBudget::Bytes(2 << 30));
        assert_eq!(options.listen, "10.0.0.1:9000");
        assert_eq!(options.next_routes, layout.next_routes);
        assert_eq!((options.micro_batches, options.head_reserved), (Some(2), 7));
        let names: Vec<&str> = layout.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["head", "10.0.0.2:9000"]);

        // No listen address given: every address, a free port, as by default.
        let policy = RingPolicy {
            listen: None,
            ..policy
        };
        let settings = LaunchSettings {
            n_ctx: 512,
            micro_batches: None,
            head_reserved: 0,
            row_logits: false,
            security: LinkSecurity::Insecure,
        };
        let options = ring_options(&policy, &layout, settings);
        assert_eq!(options.listen, RingOptions::default().listen);
    }
}

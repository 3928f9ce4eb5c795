//! What `prima apply` gives the ring so that a lost device costs no request: the plan as
//! a [`RingLayout`], and a [`Replan`] that plans again over the manifest's devices less
//! the lost ones — Halda with the profiles already collected, pruning and relays as
//! usual — and tells the caller the new plan.

use crate::manifest::LoadedManifest;
use crate::profile::{DeviceProfile, GIB};
use crate::prp::failover::{Replan, RingDevice, RingLayout};
use crate::prp::head::NextRoute;
use crate::prp::key::LinkSecurity;
use prima_core::model::Model;

use super::plan::{plan, Plan, PlanInputs};

/// The ring of `plan`, as the failover connects it.
pub fn layout_of(plan: &Plan) -> RingLayout {
    RingLayout {
        devices: plan
            .ring()
            .map(|d| RingDevice {
                name: d.name.clone(),
                addr: d.addr.clone(),
            })
            .collect(),
        windows: plan.ring().map(|d| d.w).collect(),
        next_routes: plan
            .ring()
            .skip(1)
            .map(|d| d.next_route.clone())
            .collect::<Vec<NextRoute>>(),
    }
}

/// Plans `manifest`'s devices less the lost ones with `profiles` (the first plan's).
/// A plan that leaves the head alone is taken only if the head's memory holds the
/// weights: a failover does not turn a ring into one device reading its layers from
/// disk every token; that request fails, and the ring waits for a device to come back.
pub fn replanner<'a>(
    manifest: &'a LoadedManifest,
    model: &'a Model,
    addr_of: &'a dyn Fn(&str) -> Option<String>,
    profiles: Vec<DeviceProfile>,
    security: &'a LinkSecurity,
    draft: Option<&'a Model>,
    on_replan: &'a dyn Fn(&[String], &Plan),
) -> Replan<'a> {
    Box::new(move |lost: &[String]| {
        let mut left = manifest.clone();
        let m = &mut left.manifest;
        // Manual windows are given per manifest device: they leave with their device.
        if let Some(windows) = &mut m.policy.windows {
            *windows = m
                .devices
                .iter()
                .enumerate()
                .filter(|(_, d)| !lost.contains(&d.name))
                .map(|(i, _)| windows.get(i).copied().unwrap_or(0))
                .collect();
        }
        m.devices.retain(|d| !lost.contains(&d.name));
        let head = left.head_index().map_err(|e| e.to_string())?;
        let planned = plan(&PlanInputs {
            manifest: &left,
            model,
            head,
            backend: None,
            gpu: None,
            transport: None,
            addr_of,
            known: &profiles,
            security,
            draft,
        })
        .map_err(|e| e.to_string())?;
        if planned.ring().count() == 1 {
            let head_name = &left.manifest.devices[head].name;
            let weights: u64 = model.weight_tensors().map(|t| t.n_bytes).sum();
            let memory = profiles
                .iter()
                .find(|p| &p.name == head_name)
                .map(|p| (p.ram_available_gib * GIB) as u64);
            if let Some(memory) = memory.filter(|&b| b < weights) {
                return Err(format!(
                    "the head '{head_name}' alone has {} MiB of memory for {} MiB of weights",
                    memory >> 20,
                    weights >> 20
                ));
            }
        }
        on_replan(lost, &planned);
        Ok(layout_of(&planned))
    })
}

//! What `prima apply` gives the ring so that a lost device costs no request: the plan as
//! a [`RingLayout`], and a [`Replan`] that plans again over the manifest's devices less
//! the lost ones — Halda with the profiles already collected, pruning and relays as
//! usual — and tells the caller the new plan.

use prima_abi::transport::TransportBox;

use crate::manifest::LoadedManifest;
use crate::profile::{DeviceProfile, GIB};
use crate::prp::failover::{Replan, RingDevice, RingLayout};
use crate::prp::head::NextRoute;
use crate::prp::key::LinkSecurity;
use prima_core::model::Model;

use super::plan::{plan, without_devices, Plan, PlanInputs};

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
        output_on_last: plan.output_on_last,
        absent: plan
            .devices
            .iter()
            .filter(|d| d.absent)
            .map(|d| RingDevice {
                name: d.name.clone(),
                addr: d.addr.clone(),
            })
            .collect(),
    }
}

/// Plans `manifest`'s devices less the lost ones with `profiles` (the first plan's); a
/// device the first plan had no profile of (it was off) is asked for one over `transport`.
/// A plan that leaves the head alone is taken only if the head's memory holds the
/// weights: a failover does not turn a ring into one device reading its layers from
/// disk every token; that request fails, and the ring waits for a device to come back.
#[allow(clippy::too_many_arguments)]
pub fn replanner<'a>(
    manifest: &'a LoadedManifest,
    model: &'a Model,
    addr_of: &'a dyn Fn(&str) -> Option<String>,
    profiles: Vec<DeviceProfile>,
    transport: &'a TransportBox,
    security: &'a LinkSecurity,
    draft: Option<&'a Model>,
    on_replan: &'a dyn Fn(&[String], &Plan),
) -> Replan<'a> {
    Box::new(move |lost: &[String]| {
        let left = without_devices(manifest, lost);
        let head = left.head_index().map_err(|e| e.to_string())?;
        let planned = plan(&PlanInputs {
            manifest: &left,
            model,
            head,
            backend: None,
            gpu: None,
            transport: Some(transport),
            addr_of,
            known: &profiles,
            security,
            draft,
        })
        .map_err(|e| e.to_string())?;
        if planned.ring().count() == 1 {
            let head_name = &left.manifest.devices[head].name;
            let weights: u64 = model.distinct_weight_tensors().map(|t| t.n_bytes).sum();
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

//! What `prima apply` (and `prima serve --manifest`) tell a person on stderr while the
//! cluster comes up: devices found, local nodes, the plan, re-plans after a loss.

use prima_cluster::controller::{LocalNodes, Plan};

/// A device that discovery found on the LAN.
pub fn found(name: &str, addr: &str) {
    eprintln!("found     {name} at {addr} (discovery)");
}

/// Each local node, started or reused from a `--keep-nodes` run.
pub fn nodes(nodes: &LocalNodes) {
    for n in nodes.running() {
        let how = if nodes.reused().contains(&n.name) {
            "reused "
        } else {
            "started"
        };
        eprintln!("{how}   {} on {} (pid {})", n.name, n.addr, n.pid);
    }
}

/// The plan: a table on stderr, or JSON on stdout.
pub fn plan(plan: &Plan, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&plan.to_json())?);
    } else {
        eprint!("{}", plan.table());
    }
    for d in plan.devices.iter().filter(|d| d.absent) {
        eprintln!(
            "absent    {} ({}): {} — planned without it; the ring plans it in when it answers",
            d.name,
            d.addr,
            d.pruned.as_deref().unwrap_or("no answer")
        );
    }
    Ok(())
}

/// GPU layers the plan gives a head whose GPU backend could not be loaded.
pub fn no_head_gpu(head_gpu_layers: usize) {
    if head_gpu_layers > 0 {
        eprintln!(
            "the plan puts {head_gpu_layers} layers per window on the head's GPU, but it has no usable GPU backend plugin: they run on its backend"
        );
    }
}

/// A new plan after a device was lost (or came back).
pub fn replanned(lost: &[String], planned: &Plan) {
    if lost.is_empty() {
        eprintln!("failover: new plan over every device");
    } else {
        eprintln!("failover: new plan without {}", lost.join(", "));
    }
    eprint!("{}", planned.table());
    prima_server::board::replanned(planned);
}

/// The manifest's `model.hf`, resolved through the cache; what a remote device needs.
pub fn hub_model(
    manifest: &prima_cluster::manifest::LoadedManifest,
    name: &crate::hub::name::ModelRef,
) {
    let m = &manifest.manifest;
    eprintln!("model     {name} → {}", m.model.path.display());
    let remote: Vec<&str> = m
        .devices
        .iter()
        .filter(|d| !d.local && !d.head && d.relay.is_none())
        .map(|d| d.name.as_str())
        .collect();
    if !remote.is_empty() {
        eprintln!(
            "          {} must hold the same file: start their nodes with `prima node -hf {name} …` (or `prima pull {name}` there first)",
            remote.join(", ")
        );
    }
}

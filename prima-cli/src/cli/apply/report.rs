//! What `prima apply` (and `prima serve --manifest`) tell a person on stderr while the
//! cluster comes up: devices found, local nodes, the plan, re-plans after a loss.

use prima_cluster::controller::{
    last_applied, plan_changes, profile_changes, ClusterId, LocalNodes, Plan,
};

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

/// The plan: a table on stderr (`verbose`: with the paper's symbols), or JSON on stdout;
/// then what changed against the plan the cluster last applied (JSON: `changes`).
pub fn plan(plan: &Plan, json: bool, verbose: bool, cluster: &ClusterId) -> anyhow::Result<()> {
    let last = last_applied(cluster);
    let changes = last.as_ref().map(|l| plan_changes(&l.plan, plan));
    if json {
        let mut value = plan.to_json();
        value["cluster"] = cluster.label.clone().into();
        value["changes"] = serde_json::json!(changes);
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        eprint!("{}", plan.table_with(verbose));
    }
    match (&last, &changes) {
        (Some(last), Some(changes)) if !json => {
            let against = format!(
                "the plan applied {} ago from {}",
                ago(last.applied_unix),
                last.manifest.display()
            );
            if changes.is_empty() {
                eprintln!("unchanged against {against}");
            } else {
                eprintln!("changes against {against}:");
                for c in changes {
                    eprintln!("  {c}");
                }
                let inputs = profile_changes(&last.profiles, &plan.profiles);
                if !inputs.is_empty() {
                    eprintln!("  planned from other figures (over 5 % apart):");
                    for c in inputs {
                        eprintln!("    {c}");
                    }
                }
            }
        }
        _ => {}
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

/// How long ago `unix` (seconds since the epoch) was, for a person.
pub fn ago(unix: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let s = now.saturating_sub(unix);
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} days", s / 86_400),
    }
}

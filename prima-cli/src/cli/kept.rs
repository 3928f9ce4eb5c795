//! `prima status` and `prima stop`: per cluster, the plan `prima apply` last launched
//! (where each device runs which layers, the predicted and last measured TPOT) and the
//! local nodes `--keep-nodes` left running; stopping them.

use std::path::PathBuf;

use prima_cluster::controller::{
    applied_clusters, cluster_label, kept_nodes, stop_kept, Applied, ClusterId,
};
use prima_cluster::manifest::LoadedManifest;

use super::apply::ago;
use super::keygen::manifest_security;

#[derive(clap::Args, Debug)]
pub struct StopArgs {
    /// Stop only the nodes kept for this manifest's cluster (default: every kept node).
    manifest: Option<PathBuf>,
}

/// Per cluster: its last applied plan and speed, then its kept nodes (name, address,
/// pid, whether it runs, and its log).
pub fn status() -> anyhow::Result<()> {
    let applied = applied_clusters();
    let kept = kept_nodes();
    let mut keys: Vec<String> = applied.iter().map(|(k, _)| k.clone()).collect();
    for (state, _) in &kept {
        let key = state
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    if keys.is_empty() {
        eprintln!("no cluster applied yet, and no kept nodes (`prima apply MANIFEST` runs one)");
        return Ok(());
    }
    for key in keys {
        let last = applied.iter().find(|(k, _)| *k == key).map(|(_, a)| a);
        match last {
            Some(a) => print_applied(a),
            None => {
                let label = kept
                    .iter()
                    .find(|(state, _)| state.file_stem().is_some_and(|s| *s == *key))
                    .and_then(|(state, _)| cluster_label(state))
                    .unwrap_or(key.clone());
                println!("cluster {label} (no plan applied yet)");
            }
        }
        let nodes: Vec<_> = kept
            .iter()
            .filter(|(state, _)| state.file_stem().is_some_and(|s| *s == *key))
            .flat_map(|(_, nodes)| nodes)
            .collect();
        if nodes.is_empty() {
            println!("  no kept nodes");
        } else {
            println!(
                "  {:<12} {:<22} {:>8}  {:<8} log",
                "node", "address", "pid", "state"
            );
        }
        for (node, alive) in nodes {
            println!(
                "  {:<12} {:<22} {:>8}  {:<8} {}",
                node.name,
                node.addr,
                node.pid,
                if *alive { "running" } else { "gone" },
                node.log.display()
            );
        }
    }
    eprintln!("`prima stop [MANIFEST]` stops the kept nodes");
    Ok(())
}

/// A cluster's last applied plan: from where and when, its ring, and its speed.
fn print_applied(a: &Applied) {
    let p = &a.plan;
    println!("cluster {}", a.cluster);
    let head = match a.head_running() {
        Some(true) => format!("running, pid {}", a.pid),
        Some(false) => format!("pid {}, exited since", a.pid),
        None => format!("pid {}", a.pid),
    };
    println!(
        "  applied {} ago from {} ({head}): {} scheduler, k = {}",
        ago(a.applied_unix),
        a.manifest.display(),
        p["scheduler"].as_str().unwrap_or("?"),
        p["k"]
    );
    let ring: Vec<String> = p["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["pruned"].as_bool() == Some(false) && d["forwards"].is_null())
        .map(|d| {
            format!(
                "{} {} layers",
                d["name"].as_str().unwrap_or("?"),
                d["layers"].as_u64().unwrap_or(0)
            )
        })
        .collect();
    println!("  ring: {}", ring.join(", "));
    let predicted = p["predicted_tpot_ms"]
        .as_f64()
        .map_or("-".to_string(), |t| format!("{t:.2} ms"));
    let measured = match (a.measured_tpot_ms, a.measured_unix) {
        (Some(t), Some(at)) => format!("{t:.2} ms ({} ago)", ago(at)),
        _ => "not yet (`prima apply MANIFEST --prompt …` measures it)".to_string(),
    };
    println!("  TPOT: predicted {predicted}, last measured {measured}");
}

pub fn stop(args: StopArgs) -> anyhow::Result<()> {
    let cluster = match &args.manifest {
        Some(m) => {
            anyhow::ensure!(m.exists(), "{}: no such manifest", m.display());
            let manifest = LoadedManifest::load(m)?;
            let (security, _) = manifest_security(&manifest)?;
            Some(ClusterId::of(&manifest, &security))
        }
        None => None,
    };
    let stopped = stop_kept(cluster.as_ref());
    if stopped.is_empty() {
        eprintln!("no kept node was running");
    }
    for node in stopped {
        eprintln!(
            "stopped   {} on {} (pid {})",
            node.name, node.addr, node.pid
        );
    }
    Ok(())
}

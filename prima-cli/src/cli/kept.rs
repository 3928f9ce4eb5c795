//! `prima status` and `prima stop`: the local nodes `prima apply --keep-nodes` left
//! running, listed and stopped.

use std::path::PathBuf;

use prima_cluster::controller::{kept_nodes, stop_kept};

#[derive(clap::Args, Debug)]
pub struct StopArgs {
    /// Stop only the nodes kept for this manifest (default: every kept node).
    manifest: Option<PathBuf>,
}

/// Lists every kept node: name, address, pid, whether it runs, and its log.
pub fn status() -> anyhow::Result<()> {
    let kept = kept_nodes();
    let nodes: Vec<_> = kept.iter().flat_map(|(_, nodes)| nodes).collect();
    if nodes.is_empty() {
        eprintln!(
            "no kept nodes (`prima apply --keep-nodes` leaves a cluster's local nodes running)"
        );
        return Ok(());
    }
    println!(
        "{:<12} {:<22} {:>8}  {:<8} log",
        "node", "address", "pid", "state"
    );
    for (node, alive) in nodes {
        println!(
            "{:<12} {:<22} {:>8}  {:<8} {}",
            node.name,
            node.addr,
            node.pid,
            if *alive { "running" } else { "gone" },
            node.log.display()
        );
    }
    eprintln!("`prima stop [MANIFEST]` stops them");
    Ok(())
}

pub fn stop(args: StopArgs) -> anyhow::Result<()> {
    if let Some(m) = &args.manifest {
        anyhow::ensure!(m.exists(), "{}: no such manifest", m.display());
    }
    let stopped = stop_kept(args.manifest.as_deref());
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

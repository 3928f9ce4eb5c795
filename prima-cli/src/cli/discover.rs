//! `prima discover`: lists the nodes announcing themselves on the LAN (`prima node
//! --advertise`) in one cluster, and every other node that answered with why it was
//! left out.

use std::time::Duration;

use prima_cluster::discovery::{browse, ClusterFilter, Discovery, DEFAULT_CLUSTER};

#[derive(clap::Args, Debug)]
pub struct DiscoverArgs {
    /// The cluster to look for (nodes announce theirs with `prima node --cluster`).
    #[arg(long, default_value = DEFAULT_CLUSTER)]
    cluster: String,
    /// Seconds to listen for announcements.
    #[arg(long, default_value_t = 3.0, value_parser = parse_timeout)]
    timeout: f64,
    /// Print what was seen as JSON.
    #[arg(long)]
    json: bool,
}

fn parse_timeout(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s > 0.0 && s <= 600.0 => Ok(s),
        _ => Err(format!("'{text}': give seconds above 0 and at most 600")),
    }
}

pub fn run(args: DiscoverArgs) -> anyhow::Result<()> {
    let filter = ClusterFilter::new(args.cluster.as_str());
    eprintln!(
        "discover: listening {}s for cluster '{}' on every interface (mDNS)",
        args.timeout, args.cluster
    );
    let seen = browse(&filter, Duration::from_secs_f64(args.timeout))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&seen)?);
    } else {
        print_table(&seen);
    }
    Ok(())
}

fn print_table(seen: &Discovery) {
    println!(
        "{} node(s) in cluster '{}', {} ignored",
        seen.found.len(),
        seen.cluster,
        seen.ignored.len()
    );
    if seen.found.is_empty() && seen.ignored.is_empty() {
        println!(
            "nothing answered: no node advertises here, or multicast does not reach this \
             network (VPN, VLAN, one-way Wi-Fi); give the devices' addresses in the manifest"
        );
    }
    if !seen.found.is_empty() {
        println!(
            "{:<16} {:<24} {:<12} {:>8} {:>8}",
            "name", "address", "cluster", "protocol", "prima"
        );
        for n in &seen.found {
            println!(
                "{:<16} {:<24} {:<12} {:>8} {:>8}",
                n.name, n.address, n.cluster, n.protocol, n.prima_version
            );
        }
    }
    for n in &seen.ignored {
        println!(
            "ignored {} at {}: {}",
            n.name,
            n.address.as_deref().unwrap_or("no address"),
            n.reason
        );
    }
}

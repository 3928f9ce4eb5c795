//! Network namespaces: one per emulated device (`prima-hl-<device>`), holding its TUN
//! interface from the link router, its address in the bed's /24 and a tbf qdisc that
//! caps its upload rate. Everything goes through `ip` and `tc` (iproute2).

use std::net::Ipv4Addr;
use std::process::Command;

use anyhow::{bail, Result};

use crate::shell;

/// Every home-lab namespace name starts with this.
pub const PREFIX: &str = "prima-hl-";

/// The bed's private network; device i (0-based) gets .(i + 1).
pub fn address(index: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 87, 0, index as u8 + 1)
}

/// The bed's network, in CIDR.
pub const SUBNET_PREFIX: u8 = 24;

/// The namespace of a device.
pub fn namespace(device: &str) -> String {
    format!("{PREFIX}{device}")
}

/// The TUN interface of device i: unique in the root namespace, where it is created.
pub fn interface(index: usize) -> String {
    format!("phl{index}")
}

/// Fails with the package to install when `ip` or `tc` is missing.
pub fn check_tools() -> Result<()> {
    for tool in ["ip", "tc"] {
        let found = Command::new(tool)
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            bail!(
                "`{tool}` is not on PATH: install the iproute2 package (apt-get install iproute2)"
            );
        }
    }
    Ok(())
}

/// Creates the namespace with loopback up and IPv6 off (the router carries IPv4 only).
pub fn create(ns: &str) -> Result<()> {
    shell::run(Command::new("ip").args(["netns", "add", ns]))?;
    exec(ns, &["ip", "link", "set", "lo", "up"])?;
    exec(
        ns,
        &["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"],
    )
    .ok();
    Ok(())
}

/// Moves the router's TUN interface into the namespace, addresses it and, when given,
/// shapes its egress with tbf at `mbit` Mbit/s.
pub fn attach(ns: &str, interface: &str, address: Ipv4Addr, mbit: Option<f64>) -> Result<()> {
    shell::run(Command::new("ip").args(["link", "set", interface, "netns", ns]))?;
    let cidr = format!("{address}/{SUBNET_PREFIX}");
    exec(ns, &["ip", "addr", "add", &cidr, "dev", interface])?;
    exec(ns, &["ip", "link", "set", interface, "up"])?;
    if let Some(mbit) = mbit {
        let (rate, burst) = tbf_rate_and_burst(mbit);
        exec(
            ns,
            &[
                "tc", "qdisc", "add", "dev", interface, "root", "tbf", "rate", &rate, "burst",
                &burst, "latency", "200ms",
            ],
        )?;
    }
    Ok(())
}

/// tbf's rate in kbit, and a burst of at least 10 ms of traffic and two full packets
/// (smaller bursts cap the rate below the one asked for).
fn tbf_rate_and_burst(mbit: f64) -> (String, String) {
    let kbit = (mbit * 1000.0).round().max(1.0) as u64;
    let bytes_per_10ms = kbit * 1000 / 8 / 100;
    let burst = bytes_per_10ms.max(2 * 1514);
    (format!("{kbit}kbit"), burst.to_string())
}

/// Runs `argv` inside the namespace.
pub fn exec(ns: &str, argv: &[&str]) -> Result<()> {
    shell::run(Command::new("ip").args(["netns", "exec", ns]).args(argv))
}

/// Every home-lab namespace that exists.
pub fn existing() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(PREFIX))
        .map(str::to_string)
        .collect()
}

/// Pids of processes inside a namespace.
pub fn pids(ns: &str) -> Vec<i32> {
    Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Deletes a namespace (its interfaces go with it).
pub fn delete(ns: &str) -> Result<()> {
    shell::run(Command::new("ip").args(["netns", "delete", ns]))
}

/// `tc qdisc` and `ip addr` of a namespace's interfaces, for `status`.
pub fn describe(ns: &str) -> String {
    let run = |argv: &[&str]| {
        Command::new("ip")
            .args(["netns", "exec", ns])
            .args(argv)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let addrs = run(&["ip", "-brief", "addr"]);
    let qdiscs = run(&["tc", "qdisc", "show"]);
    let mut lines: Vec<String> = addrs
        .lines()
        .filter(|l| !l.starts_with("lo "))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    lines.extend(
        qdiscs
            .lines()
            .filter(|l| l.contains("tbf"))
            .map(str::to_string),
    );
    lines.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_names_follow_the_convention() {
        assert_eq!(address(0), Ipv4Addr::new(10, 87, 0, 1));
        assert_eq!(namespace("d1"), "prima-hl-d1");
        assert!(interface(199).len() <= 15);
    }

    #[test]
    fn tbf_burst_covers_two_packets_and_ten_ms() {
        assert_eq!(tbf_rate_and_burst(1.0), ("1000kbit".into(), "3028".into()));
        assert_eq!(tbf_rate_and_burst(100.0).1, "125000");
    }
}

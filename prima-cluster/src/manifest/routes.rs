//! Routes of a ring across networks: which network each device is on, the ring order that
//! crosses between networks least (the head's network first, then one network after
//! another), and which relay each crossing goes through — a ring link or the head's
//! control channel to a node. Pure: the manifest in, addresses out; nothing is contacted.
//!
//! A relay is a manifest device with `relay = { NET = "host:port", … }`: a `prima relay`
//! with a leg in each of those networks. A device on another network than the one it
//! talks to is reached at `TARGET via LEG`, LEG being the relay's address on the
//! caller's network (the vpn-proxy transport's address form). A VPN address (WireGuard,
//! Tailscale) is an address on a network like any other: devices that all have one are
//! on one network and need no relay.

use std::collections::BTreeSet;

use crate::manifest::{Device, Manifest};
use prima_abi::transport::{relayed, VIA};

/// The network of a device that names none when the head names none either.
pub const DEFAULT_NETWORK: &str = "lan";

/// The network `d` is on: its own, else the head's, else [`DEFAULT_NETWORK`].
pub fn network_of<'m>(m: &'m Manifest, head: usize, d: &'m Device) -> &'m str {
    d.network
        .as_deref()
        .or(m.devices[head].network.as_deref())
        .unwrap_or(DEFAULT_NETWORK)
}

/// The first relay device with legs in both networks, and its leg in `from`.
pub fn relay_between<'m>(m: &'m Manifest, from: &str, to: &str) -> Option<(usize, &'m str)> {
    m.devices.iter().enumerate().find_map(|(i, d)| {
        let legs = d.relay.as_ref()?;
        match (legs.get(from), legs.contains_key(to)) {
            (Some(leg), true) => Some((i, leg.as_str())),
            _ => None,
        }
    })
}

/// Checks one relay device: legs on two networks or more, and nothing that only a node
/// takes.
pub fn check_relay(d: &Device) -> Result<(), String> {
    let legs = d.relay.as_ref().map(|l| l.len()).unwrap_or(0);
    if legs < 2 {
        return Err(format!(
            "a relay needs legs on at least two networks, e.g. relay = {{ lan-a = \"10.1.0.2:9100\", lan-b = \"10.2.0.2:9100\" }} (it has {legs})"
        ));
    }
    for (net, addr) in d.relay.iter().flatten() {
        if addr.contains(VIA) || !addr.contains(':') {
            return Err(format!(
                "relay.{net} = \"{addr}\": give the relay's address on that network as host:port"
            ));
        }
    }
    let node_only = [
        ("address", d.address.is_some()),
        ("local", d.local),
        ("head", d.head),
        ("relay_only", d.relay_only),
        ("network", d.network.is_some()),
        ("mem_budget", d.mem_budget.is_some()),
        ("vram_budget", d.vram_budget.is_some()),
        ("threads", d.threads.is_some()),
        ("backend", d.backend.is_some()),
        ("gpu_backend", d.gpu_backend.is_some()),
        ("gpu_layers", d.gpu_layers.is_some()),
    ];
    if let Some((field, _)) = node_only.iter().find(|(_, set)| *set) {
        return Err(format!(
            "a relay is a `prima relay` process, not a node: it takes no `{field}` (its networks are its legs; declare a node device to also run layers on that machine)"
        ));
    }
    Ok(())
}

/// Checks that every device's network is reached from the head's through one relay (the
/// head's control channels need that), that local nodes are on the head's network, and
/// that a ring across networks has an order and the head an address. Errors name the
/// field and what to do.
pub fn check_networks(m: &Manifest, head: usize) -> Result<(), (String, String)> {
    let home = network_of(m, head, &m.devices[head]);
    for (i, d) in m.devices.iter().enumerate() {
        if d.relay.is_some() {
            continue;
        }
        let field = format!("device[{i}] ({})", d.name);
        let net = network_of(m, head, d);
        if d.local && !d.head && net != home {
            return Err((
                format!("{field}.network"),
                format!("a local node runs on this machine, so it is on the head's network '{home}', not '{net}'"),
            ));
        }
        if net != home && relay_between(m, home, net).is_none() {
            return Err((
                format!("{field}.network"),
                format!("no relay joins network '{net}' to the head's network '{home}' (declare a device with relay = {{ {home} = \"host:port\", {net} = \"host:port\" }})"),
            ));
        }
    }
    if networks_in_ring_order(m, head).is_none() {
        return Err((
            "device.network".into(),
            "the networks cannot be chained into a ring: no order of them has a relay between each one and the next".into(),
        ));
    }
    let crosses = crosses_networks(m, head);
    if crosses && m.policy.transport.as_deref() == Some("tcp") {
        return Err((
            "policy.transport".into(),
            "the tcp transport cannot go through a relay, and this ring crosses networks: use \"vpn-proxy\" (the default then)".into(),
        ));
    }
    if crosses && m.devices[head].address.is_none() {
        return Err((
            format!("device[{head}] ({}).address", m.devices[head].name),
            format!("the ring crosses networks, so its last device reaches the head through a relay: give the head's address on '{home}' (e.g. \"10.1.0.1:0\"; port 0 picks one)"),
        ));
    }
    Ok(())
}

/// Whether some ring device is on another network than the head.
pub fn crosses_networks(m: &Manifest, head: usize) -> bool {
    let home = network_of(m, head, &m.devices[head]);
    m.devices
        .iter()
        .any(|d| d.relay.is_none() && network_of(m, head, d) != home)
}

/// The networks of the ring's devices, the head's first, in an order with a relay between
/// each one and the next (and from the last back to the head's); `None` when there is
/// no such order.
fn networks_in_ring_order(m: &Manifest, head: usize) -> Option<Vec<String>> {
    let home = network_of(m, head, &m.devices[head]).to_string();
    let mut others: Vec<String> = Vec::new();
    for d in m.devices.iter().filter(|d| d.relay.is_none()) {
        let net = network_of(m, head, d).to_string();
        if net != home && !others.contains(&net) {
            others.push(net);
        }
    }
    // Depth first over the orders, manifest order first: a home has a handful of networks.
    fn extend(m: &Manifest, path: &mut Vec<String>, left: &mut Vec<String>) -> bool {
        let last = path.last().cloned().unwrap_or_default();
        if left.is_empty() {
            return path.len() == 1 || relay_between(m, &last, &path[0]).is_some();
        }
        for i in 0..left.len() {
            if relay_between(m, &last, &left[i]).is_none() {
                continue;
            }
            let next = left.remove(i);
            path.push(next);
            if extend(m, path, left) {
                return true;
            }
            let back = path.pop().unwrap_or_default();
            left.insert(i, back);
        }
        false
    }
    let mut path = vec![home];
    extend(m, &mut path, &mut others).then_some(path)
}

/// The ring's devices (relays excluded) in ring order: the head, then the devices of its
/// network, then each other network's, in manifest order within a network (wrapping round
/// from the head, as a ring on one network is ordered).
pub fn ring_order(m: &Manifest, head: usize) -> Vec<usize> {
    let n = m.devices.len();
    let from_head: Vec<usize> = (0..n)
        .map(|i| (head + i) % n)
        .filter(|&i| m.devices[i].relay.is_none())
        .collect();
    let networks = networks_in_ring_order(m, head).unwrap_or_default();
    let mut order = Vec::with_capacity(from_head.len());
    for net in &networks {
        order.extend(
            from_head
                .iter()
                .copied()
                .filter(|&i| network_of(m, head, &m.devices[i]) == net),
        );
    }
    // Devices of a network with no order (refused by the checks) still appear.
    for i in from_head {
        if !order.contains(&i) {
            order.push(i);
        }
    }
    order
}

/// How a device on `from` reaches `addr` on `to`: directly, or through the relay
/// between them (its leg on `from`). The relay used, if any.
pub fn reach(m: &Manifest, from: &str, to: &str, addr: &str) -> (String, Option<usize>) {
    if from == to {
        return (addr.to_string(), None);
    }
    match relay_between(m, from, to) {
        Some((relay, leg)) => (relayed(addr, leg), Some(relay)),
        None => (addr.to_string(), None),
    }
}

/// The networks a relay joins, as `lan-a<->lan-b`.
pub fn legs_label(d: &Device) -> String {
    let nets: BTreeSet<&str> = d.relay.iter().flatten().map(|(n, _)| n.as_str()).collect();
    nets.into_iter().collect::<Vec<_>>().join("<->")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::LoadedManifest;
    use std::path::Path;

    const TWO_LANS: &str = r#"
[model]
path = "m.gguf"

[[device]]
name = "desk"
head = true
network = "lan-a"
address = "10.1.0.1:0"

[[device]]
name = "attic"
address = "10.2.0.3:9000"
network = "lan-b"

[[device]]
name = "laptop"
address = "10.1.0.5:9000"

[[device]]
name = "router"
relay = { lan-a = "10.1.0.2:9100", lan-b = "10.2.0.2:9100" }
"#;

    fn parse(text: &str) -> Result<LoadedManifest, String> {
        LoadedManifest::parse(text, Path::new("/m/c.toml")).map_err(|e| e.to_string())
    }

    #[test]
    fn the_ring_keeps_to_the_heads_network_first() {
        let m = parse(TWO_LANS).unwrap();
        let mm = &m.manifest;
        // desk, laptop (lan-a), then attic (lan-b); the relay is no ring device.
        assert_eq!(ring_order(mm, 0), vec![0, 2, 1]);
        assert_eq!(
            reach(mm, "lan-a", "lan-b", "10.2.0.3:9000"),
            ("10.2.0.3:9000 via 10.1.0.2:9100".to_string(), Some(3))
        );
        assert_eq!(
            reach(mm, "lan-b", "lan-a", "10.1.0.1:0").0,
            "10.1.0.1:0 via 10.2.0.2:9100"
        );
        assert_eq!(
            reach(mm, "lan-a", "lan-a", "x:1"),
            ("x:1".to_string(), None)
        );
        assert_eq!(legs_label(&mm.devices[3]), "lan-a<->lan-b");
    }

    #[test]
    fn network_mistakes_name_the_device_and_field() {
        let err = parse(&TWO_LANS.replace(", lan-b = \"10.2.0.2:9100\"", "")).unwrap_err();
        assert!(
            err.contains("router") && err.contains("at least two networks"),
            "{err}"
        );

        let err =
            parse(&TWO_LANS.replace("network = \"lan-b\"", "network = \"lan-c\"")).unwrap_err();
        assert!(
            err.contains("device[1] (attic).network: no relay joins network 'lan-c'"),
            "{err}"
        );

        let err = parse(&TWO_LANS.replace("address = \"10.1.0.1:0\"", "")).unwrap_err();
        assert!(
            err.contains("device[0] (desk).address") && err.contains("crosses networks"),
            "{err}"
        );

        let err = parse(&TWO_LANS.replace("name = \"router\"", "name = \"router\"\nthreads = 2"))
            .unwrap_err();
        assert!(err.contains("not a node: it takes no `threads`"), "{err}");

        let err = parse(&TWO_LANS.replace("\"10.2.0.2:9100\"", "\"nowhere\"")).unwrap_err();
        assert!(err.contains("relay.lan-b = \"nowhere\""), "{err}");

        let manual = "\n[policy]\nscheduler = \"manual\"\nwindows = [10, 10, 10, 2]\n";
        let err = parse(&format!("{TWO_LANS}{manual}")).unwrap_err();
        assert!(
            err.contains("policy.windows: a relay device runs no layers"),
            "{err}"
        );

        let err = parse(&TWO_LANS.replace("relay = {", "relays = {")).unwrap_err();
        assert!(err.contains("unknown field `relays`"), "{err}");
    }

    #[test]
    fn devices_without_a_network_are_on_the_heads() {
        let m = parse(&TWO_LANS.replace("network = \"lan-b\"", "")).unwrap();
        let mm = &m.manifest;
        assert!(mm.devices[..3]
            .iter()
            .all(|d| network_of(mm, 0, d) == "lan-a"));
        assert_eq!(ring_order(mm, 0), vec![0, 1, 2]);
    }
}

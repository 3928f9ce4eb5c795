//! Looking for announced nodes: collect what answers within a timeout (`browse`), then
//! sort it into the cluster's nodes and the others, each with its reason (`classify`,
//! pure, so the sorting is tested without a network).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use mdns_sd::{ServiceDaemon, ServiceEvent};
use serde::Serialize;

use super::membership::{ClusterFilter, IgnoreReason};
use super::record::NodeRecord;
use super::{DiscoveryError, SERVICE_TYPE};

/// One announcement as it arrived: nothing in it is trusted yet.
#[derive(Debug, Clone, PartialEq)]
pub struct Sighting {
    /// The DNS-SD instance name (`name@cluster._prima._tcp.local.`).
    pub instance: String,
    pub addresses: Vec<IpAddr>,
    pub port: u16,
    pub txt: BTreeMap<String, String>,
}

/// A node of the cluster, with the address to reach it at.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FoundNode {
    pub name: String,
    /// host:port for the manifest (`[v6]:port` for IPv6).
    pub address: String,
    /// Every address it announced.
    pub addresses: Vec<IpAddr>,
    pub cluster: String,
    pub protocol: u32,
    pub prima_version: String,
}

/// A node that answered but is left out, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IgnoredNode {
    /// Its announced name, or its instance name when the record is unreadable.
    pub name: String,
    pub address: Option<String>,
    pub cluster: Option<String>,
    #[serde(serialize_with = "as_text")]
    pub reason: IgnoreReason,
}

fn as_text<S: serde::Serializer>(reason: &IgnoreReason, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&reason.to_string())
}

/// What one search saw.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Discovery {
    pub cluster: String,
    pub found: Vec<FoundNode>,
    pub ignored: Vec<IgnoredNode>,
}

impl Discovery {
    pub fn find(&self, name: &str) -> Option<&FoundNode> {
        self.found.iter().find(|n| n.name == name)
    }
}

/// Listens for `timeout` for nodes announcing `SERVICE_TYPE` on every interface, then
/// sorts them with `classify`. Always waits the whole timeout: no answer means "not
/// yet" as much as "nobody".
pub fn browse(filter: &ClusterFilter, timeout: Duration) -> Result<Discovery, DiscoveryError> {
    let daemon = ServiceDaemon::new()?;
    let events = daemon.browse(SERVICE_TYPE)?;
    let deadline = Instant::now() + timeout;
    // By instance name: a later resolution of the same instance replaces the earlier.
    let mut seen: BTreeMap<String, Sighting> = BTreeMap::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match events.recv_timeout(left) {
            Ok(ServiceEvent::ServiceResolved(service)) => {
                let sighting = Sighting {
                    instance: service.fullname.clone(),
                    addresses: service.addresses.iter().map(|a| a.to_ip_addr()).collect(),
                    port: service.port,
                    txt: service
                        .txt_properties
                        .iter()
                        .map(|p| (p.key().to_string(), p.val_str().to_string()))
                        .collect(),
                };
                seen.insert(sighting.instance.clone(), sighting);
            }
            Ok(ServiceEvent::ServiceRemoved(_, instance)) => {
                seen.remove(&instance);
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    let _ = daemon.stop_browse(SERVICE_TYPE);
    if let Ok(done) = daemon.shutdown() {
        let _ = done.recv_timeout(Duration::from_secs(1));
    }
    Ok(classify(filter, seen.into_values().collect()))
}

/// Sorts sightings into the cluster's nodes (by name) and the ignored ones, each with
/// its reason; of two members with one name the first by address is kept.
pub fn classify(filter: &ClusterFilter, mut sightings: Vec<Sighting>) -> Discovery {
    sightings.sort_by(|a, b| a.instance.cmp(&b.instance));
    let mut found: Vec<FoundNode> = Vec::new();
    let mut ignored = Vec::new();
    for s in sightings {
        let record = match NodeRecord::from_txt(&s.txt) {
            Ok(r) => r,
            Err(why) => {
                ignored.push(IgnoredNode {
                    name: s.instance.clone(),
                    address: connect_address(None, &s.addresses, s.port),
                    cluster: None,
                    reason: IgnoreReason::Malformed(why),
                });
                continue;
            }
        };
        let address = connect_address(Some(&record.listen), &s.addresses, s.port);
        let verdict = filter
            .admits(&record)
            .and(address.clone().ok_or(IgnoreReason::NoAddress));
        match verdict {
            Ok(address) => found.push(FoundNode {
                name: record.name,
                address,
                addresses: s.addresses,
                cluster: record.cluster,
                protocol: record.protocol,
                prima_version: record.prima_version,
            }),
            Err(reason) => ignored.push(IgnoredNode {
                name: record.name,
                address,
                cluster: Some(record.cluster),
                reason,
            }),
        }
    }
    found.sort_by(|a, b| (&a.name, &a.address).cmp(&(&b.name, &b.address)));
    let mut kept: Vec<FoundNode> = Vec::new();
    for node in found {
        match kept.iter().find(|k| k.name == node.name) {
            Some(first) => ignored.push(IgnoredNode {
                reason: IgnoreReason::Duplicate {
                    name: node.name.clone(),
                    kept: first.address.clone(),
                },
                name: node.name,
                address: Some(node.address),
                cluster: Some(node.cluster),
            }),
            None => kept.push(node),
        }
    }
    Discovery {
        cluster: filter.cluster().to_string(),
        found: kept,
        ignored,
    }
}

/// The address another device connects to: the one the node listens on when it bound a
/// specific one, else the first announced address others can reach (IPv4 first; no
/// loopback, and no IPv6 link-local, which needs an interface to be usable).
fn connect_address(listen: Option<&str>, addresses: &[IpAddr], port: u16) -> Option<String> {
    let reachable = |ip: &IpAddr| {
        !ip.is_loopback()
            && !ip.is_unspecified()
            && !matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80)
    };
    if let Some(bound) = listen.and_then(|l| l.parse::<SocketAddr>().ok()) {
        if reachable(&bound.ip()) {
            return Some(bound.to_string());
        }
    }
    if port == 0 {
        return None;
    }
    let mut candidates: Vec<IpAddr> = addresses.iter().copied().filter(reachable).collect();
    candidates.sort_by_key(|ip| (ip.is_ipv6(), *ip));
    candidates
        .first()
        .map(|ip| SocketAddr::new(*ip, port).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prp::protocol::PROTOCOL_VERSION;

    fn sighting(name: &str, cluster: &str, ip: &str) -> Sighting {
        let record = NodeRecord {
            name: name.into(),
            cluster: cluster.into(),
            protocol: PROTOCOL_VERSION,
            prima_version: "0.1.0".into(),
            listen: "0.0.0.0:9000".into(),
            key: None,
        };
        Sighting {
            instance: format!("{name}@{cluster}.{SERVICE_TYPE}"),
            addresses: vec![ip.parse().unwrap(), "fe80::1".parse().unwrap()],
            port: 9000,
            txt: record
                .to_txt()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        }
    }

    #[test]
    fn members_are_kept_and_the_rest_say_why() {
        let mut broken = sighting("junk", "home", "10.0.0.9");
        broken.txt.remove("proto");
        let mut old = sighting("old", "home", "10.0.0.8");
        old.txt
            .insert("proto".into(), (PROTOCOL_VERSION + 7).to_string());
        let mut lonely = sighting("lonely", "home", "127.0.0.1");
        lonely.addresses.truncate(1);
        let seen = classify(
            &ClusterFilter::new("home"),
            vec![
                sighting("laptop", "home", "10.0.0.3"),
                sighting("desk", "home", "10.0.0.2"),
                sighting("phone", "other", "10.0.0.4"),
                sighting("desk", "home", "10.0.0.5"),
                broken,
                old,
                lonely,
            ],
        );
        let found: Vec<(&str, &str)> = seen
            .found
            .iter()
            .map(|n| (n.name.as_str(), n.address.as_str()))
            .collect();
        assert_eq!(
            found,
            [("desk", "10.0.0.2:9000"), ("laptop", "10.0.0.3:9000")]
        );
        let ignored: Vec<String> = seen
            .ignored
            .iter()
            .map(|n| format!("{}: {}", n.name, n.reason))
            .collect();
        assert_eq!(
            ignored,
            [
                format!("junk@home.{SERVICE_TYPE}: malformed announcement: TXT has no `proto`"),
                "lonely: no reachable address announced".to_string(),
                format!(
                    "old: incompatible ring protocol {} (this prima speaks {PROTOCOL_VERSION})",
                    PROTOCOL_VERSION + 7
                ),
                "phone: other cluster \"other\" (looking for \"home\")".to_string(),
                "desk: duplicate name 'desk' (kept the one at 10.0.0.2:9000)".to_string(),
            ]
        );
    }

    #[test]
    fn a_node_bound_to_one_address_is_reached_there() {
        let ips: Vec<IpAddr> = vec!["10.0.0.2".parse().unwrap(), "192.168.1.2".parse().unwrap()];
        assert_eq!(
            connect_address(Some("192.168.1.2:9000"), &ips, 9000).as_deref(),
            Some("192.168.1.2:9000")
        );
        assert_eq!(
            connect_address(Some("0.0.0.0:9000"), &ips, 9000).as_deref(),
            Some("10.0.0.2:9000")
        );
        let v6: Vec<IpAddr> = vec!["fd00::2".parse().unwrap()];
        assert_eq!(
            connect_address(Some("[::]:9000"), &v6, 9000).as_deref(),
            Some("[fd00::2]:9000")
        );
    }
}

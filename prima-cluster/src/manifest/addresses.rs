//! A manifest's `[discovery]`: the devices declared with no `address` (and not started
//! here) get the address of the discovered node of the same name. Explicit addresses are
//! never replaced, and nothing is looked for when every device has one.

use std::time::Duration;

use crate::discovery::{browse, ClusterFilter, Discovery, DiscoveryError};
use crate::prp::key::LinkSecurity;

use super::{Device, Manifest};

/// Fills in the missing addresses of `manifest`'s remote devices when its `[discovery]`
/// is enabled; returns (device, address) for each one filled. Only nodes announcing the
/// fingerprint of `security`'s key (none, for plain links) are taken.
pub fn fill_addresses(
    manifest: &mut Manifest,
    security: &LinkSecurity,
) -> Result<Vec<(String, String)>, DiscoveryError> {
    let Some(section) = manifest.discovery.clone().filter(|d| d.enabled) else {
        return Ok(Vec::new());
    };
    if !manifest.devices.iter().any(needs_address) {
        return Ok(Vec::new());
    }
    let key = match security {
        LinkSecurity::Key(key) => Some(key.fingerprint()),
        LinkSecurity::Insecure => None,
    };
    let filter = ClusterFilter::new(&section.cluster).with_key(key);
    let seen = browse(&filter, section.timeout.0)?;
    assign(&mut manifest.devices, &seen, section.timeout.0)
}

fn needs_address(d: &Device) -> bool {
    d.address.is_none() && !d.local && !d.head
}

/// Gives each device that needs one the address of the found node of its name.
fn assign(
    devices: &mut [Device],
    seen: &Discovery,
    timeout: Duration,
) -> Result<Vec<(String, String)>, DiscoveryError> {
    let mut filled = Vec::new();
    for d in devices.iter_mut().filter(|d| needs_address(d)) {
        let Some(node) = seen.find(&d.name) else {
            return Err(DiscoveryError::NotFound {
                device: d.name.clone(),
                cluster: seen.cluster.clone(),
                timeout_s: timeout.as_secs_f64(),
                seen: describe(seen),
            });
        };
        d.address = Some(node.address.clone());
        filled.push((d.name.clone(), node.address.clone()));
    }
    Ok(filled)
}

/// What a search saw, in one clause, for an error message.
fn describe(seen: &Discovery) -> String {
    if seen.found.is_empty() && seen.ignored.is_empty() {
        return "no node answered (multicast may not cross this network: give the device's \
                `address`)"
            .to_string();
    }
    let mut parts: Vec<String> = seen
        .found
        .iter()
        .map(|n| format!("{} at {}", n.name, n.address))
        .collect();
    parts.extend(seen.ignored.iter().map(|n| {
        let at = n.address.as_deref().unwrap_or("no address");
        format!("{} at {at} ignored: {}", n.name, n.reason)
    }));
    format!("it saw: {}", parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::{FoundNode, IgnoreReason, IgnoredNode};
    use crate::manifest::LoadedManifest;
    use std::path::Path;

    const MANIFEST: &str = r#"
[model]
path = "m.gguf"

[[device]]
name = "desk"
head = true
local = true

[[device]]
name = "laptop"

[[device]]
name = "phone"
address = "10.0.0.9:9000"

[discovery]
cluster = "home"
timeout = "2s"
"#;

    fn found(name: &str, address: &str) -> FoundNode {
        FoundNode {
            name: name.into(),
            address: address.into(),
            addresses: vec![],
            cluster: "home".into(),
            protocol: 1,
            prima_version: "0.1.0".into(),
        }
    }

    #[test]
    fn missing_addresses_come_from_discovery_and_given_ones_win() {
        let mut m = LoadedManifest::parse(MANIFEST, Path::new("/m.toml"))
            .unwrap()
            .manifest;
        let section = m.discovery.clone().unwrap();
        assert!(section.enabled);
        assert_eq!(section.timeout.0, Duration::from_secs(2));
        let seen = Discovery {
            cluster: "home".into(),
            found: vec![
                found("laptop", "10.0.0.3:9000"),
                found("phone", "10.0.0.4:9000"),
                found("desk", "10.0.0.2:9000"),
            ],
            ignored: vec![],
        };
        let filled = assign(&mut m.devices, &seen, section.timeout.0).unwrap();
        assert_eq!(
            filled,
            [("laptop".to_string(), "10.0.0.3:9000".to_string())]
        );
        let addresses: Vec<Option<&str>> = m.devices.iter().map(|d| d.address.as_deref()).collect();
        assert_eq!(
            addresses,
            [None, Some("10.0.0.3:9000"), Some("10.0.0.9:9000")]
        );
    }

    #[test]
    fn a_device_not_found_is_named_with_what_was_seen() {
        let mut m = LoadedManifest::parse(MANIFEST, Path::new("/m.toml"))
            .unwrap()
            .manifest;
        let seen = Discovery {
            cluster: "home".into(),
            found: vec![found("desk", "10.0.0.2:9000")],
            ignored: vec![IgnoredNode {
                name: "laptop".into(),
                address: Some("10.0.0.3:9000".into()),
                cluster: Some("work".into()),
                reason: IgnoreReason::OtherCluster {
                    theirs: "work".into(),
                    ours: "home".into(),
                },
            }],
        };
        let err = assign(&mut m.devices, &seen, Duration::from_secs(2)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "device 'laptop' has no `address` and discovery (cluster \"home\", 2s) did not \
             find it; it saw: desk at 10.0.0.2:9000; laptop at 10.0.0.3:9000 ignored: other \
             cluster \"work\" (looking for \"home\")"
        );
        let nothing = Discovery {
            cluster: "home".into(),
            found: vec![],
            ignored: vec![],
        };
        let err = assign(&mut m.devices, &nothing, Duration::from_secs(2)).unwrap_err();
        assert!(err.to_string().contains("no node answered"), "{err}");
    }
}

//! Announcing this node: a DNS-SD service `NAME@CLUSTER._prima._tcp.local.` whose TXT
//! record is a `NodeRecord`, answered by mdns-sd's thread until the `Advertiser` is
//! stopped or dropped, which sends the goodbye packets that take it off other caches.

use std::net::SocketAddr;
use std::time::Duration;

use mdns_sd::{ServiceDaemon, ServiceInfo};

use super::record::NodeRecord;
use super::{DiscoveryError, SERVICE_TYPE};

/// A running announcement; it ends when this is stopped or dropped.
pub struct Advertiser {
    daemon: Option<ServiceDaemon>,
    instance: String,
}

impl Advertiser {
    /// Announces `record` for a transport listening on `listen`: on that address when it
    /// is a specific one, else on every address of every interface (kept up to date as
    /// they change).
    pub fn start(record: &NodeRecord, listen: SocketAddr) -> Result<Advertiser, DiscoveryError> {
        if listen.ip().is_loopback() {
            return Err(DiscoveryError::Advertise(format!(
                "the node listens on {listen}, which no other device can reach \
                 (listen on 0.0.0.0 or a LAN address)"
            )));
        }
        if listen.port() == 0 {
            return Err(DiscoveryError::Advertise(format!(
                "the node listens on {listen}, with no port"
            )));
        }
        let daemon = ServiceDaemon::new()?;
        let instance_name = format!("{}@{}", record.name, record.cluster);
        let host = format!("prima-{}.local.", dns_label(&record.name));
        let ips = if listen.ip().is_unspecified() {
            String::new()
        } else {
            listen.ip().to_string()
        };
        let info = ServiceInfo::new(
            SERVICE_TYPE,
            &instance_name,
            &host,
            ips.as_str(),
            listen.port(),
            &record.to_txt()[..],
        )
        .map_err(|e| DiscoveryError::Advertise(e.to_string()))?;
        let info = if listen.ip().is_unspecified() {
            info.enable_addr_auto()
        } else {
            info
        };
        let instance = info.get_fullname().to_string();
        daemon.register(info)?;
        Ok(Advertiser {
            daemon: Some(daemon),
            instance,
        })
    }

    /// The full DNS-SD instance name announced.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Withdraws the announcement (goodbye packets, waited for up to a second) and stops
    /// the mDNS thread.
    pub fn stop(&mut self) {
        let Some(daemon) = self.daemon.take() else {
            return;
        };
        if let Ok(done) = daemon.unregister(&self.instance) {
            let _ = done.recv_timeout(Duration::from_secs(1));
        }
        if let Ok(done) = daemon.shutdown() {
            let _ = done.recv_timeout(Duration::from_secs(1));
        }
    }
}

impl Drop for Advertiser {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A device name as a DNS label: letters, digits and '-', at most 50 characters.
fn dns_label(name: &str) -> String {
    let label: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(50)
        .collect();
    match label.trim_matches('-') {
        "" => "node".to_string(),
        l => l.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_become_dns_labels() {
        assert_eq!(dns_label("desk"), "desk");
        assert_eq!(dns_label("Jo's laptop"), "Jo-s-laptop");
        assert_eq!(dns_label("_x_"), "x");
        assert_eq!(dns_label("__"), "node");
    }

    #[test]
    fn a_loopback_listener_is_not_announced() {
        let record = NodeRecord {
            name: "desk".into(),
            cluster: "home".into(),
            protocol: 1,
            prima_version: "0.1.0".into(),
            listen: "127.0.0.1:9000".into(),
            key: None,
        };
        let err = Advertiser::start(&record, "127.0.0.1:9000".parse().unwrap())
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("no other device can reach"),
            "{err}"
        );
    }
}

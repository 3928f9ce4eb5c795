//! Which announced nodes belong to the cluster being looked for, and why the others are
//! left out.
//!
//! Membership is decided here and nowhere else: by cluster name, ring protocol and, where
//! the searcher knows its cluster key, the key's fingerprint a node announces (a node
//! holding another key could not join the ring anyway: its links would be refused).

use crate::prp::protocol::PROTOCOL_VERSION;

use super::record::NodeRecord;

/// The cluster a search is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterFilter {
    cluster: String,
    /// `None`: any key; `Some(None)`: plain (`--insecure`) nodes only; `Some(Some(f))`:
    /// nodes announcing the key fingerprint `f`.
    key: Option<Option<String>>,
}

/// Why an announced node was left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IgnoreReason {
    /// Its TXT record could not be read (the message names the key).
    Malformed(String),
    OtherCluster {
        theirs: String,
        ours: String,
    },
    Protocol {
        theirs: u32,
        ours: u32,
    },
    /// Another cluster key (fingerprints; `None`: plain links).
    OtherKey {
        theirs: Option<String>,
        ours: Option<String>,
    },
    /// It announced no address another device can connect to.
    NoAddress,
    /// Another node of the cluster with the same name came first (by address).
    Duplicate {
        name: String,
        kept: String,
    },
}

impl std::fmt::Display for IgnoreReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IgnoreReason::Malformed(why) => write!(f, "malformed announcement: {why}"),
            IgnoreReason::OtherCluster { theirs, ours } => {
                write!(f, "other cluster \"{theirs}\" (looking for \"{ours}\")")
            }
            IgnoreReason::Protocol { theirs, ours } => write!(
                f,
                "incompatible ring protocol {theirs} (this prima speaks {ours})"
            ),
            IgnoreReason::OtherKey { theirs, ours } => {
                let name = |k: &Option<String>| match k {
                    Some(fingerprint) => format!("key {fingerprint}"),
                    None => "no key (--insecure)".to_string(),
                };
                write!(
                    f,
                    "another cluster key: {} (looking for {})",
                    name(theirs),
                    name(ours)
                )
            }
            IgnoreReason::NoAddress => write!(f, "no reachable address announced"),
            IgnoreReason::Duplicate { name, kept } => {
                write!(f, "duplicate name '{name}' (kept the one at {kept})")
            }
        }
    }
}

impl ClusterFilter {
    pub fn new(cluster: impl Into<String>) -> ClusterFilter {
        ClusterFilter {
            cluster: cluster.into(),
            key: None,
        }
    }

    /// Admits only nodes announcing this key fingerprint (`None`: plain nodes only).
    pub fn with_key(mut self, fingerprint: Option<String>) -> ClusterFilter {
        self.key = Some(fingerprint);
        self
    }

    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// Whether a node that announced `record` may join this cluster's ring.
    pub fn admits(&self, record: &NodeRecord) -> Result<(), IgnoreReason> {
        if record.cluster != self.cluster {
            return Err(IgnoreReason::OtherCluster {
                theirs: record.cluster.clone(),
                ours: self.cluster.clone(),
            });
        }
        if record.protocol != PROTOCOL_VERSION {
            return Err(IgnoreReason::Protocol {
                theirs: record.protocol,
                ours: PROTOCOL_VERSION,
            });
        }
        match &self.key {
            Some(ours) if record.key != *ours => Err(IgnoreReason::OtherKey {
                theirs: record.key.clone(),
                ours: ours.clone(),
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_cluster_s_nodes_with_our_protocol_are_admitted() {
        let filter = ClusterFilter::new("home");
        let mut r = NodeRecord {
            name: "desk".into(),
            cluster: "home".into(),
            protocol: PROTOCOL_VERSION,
            prima_version: "0.1.0".into(),
            listen: "0.0.0.0:9000".into(),
            key: Some("aa".into()),
        };
        assert_eq!(filter.admits(&r), Ok(()));
        let keyed = filter.clone().with_key(Some("aa".into()));
        assert_eq!(keyed.admits(&r), Ok(()));
        assert_eq!(
            keyed
                .clone()
                .with_key(None)
                .admits(&r)
                .unwrap_err()
                .to_string(),
            "another cluster key: key aa (looking for no key (--insecure))"
        );
        r.key = Some("bb".into());
        assert_eq!(
            keyed.admits(&r).unwrap_err().to_string(),
            "another cluster key: key bb (looking for key aa)"
        );
        r.protocol += 1;
        assert_eq!(
            filter.admits(&r).unwrap_err().to_string(),
            format!(
                "incompatible ring protocol {} (this prima speaks {PROTOCOL_VERSION})",
                PROTOCOL_VERSION + 1
            )
        );
        r.cluster = "other".into();
        assert_eq!(
            filter.admits(&r).unwrap_err().to_string(),
            "other cluster \"other\" (looking for \"home\")"
        );
    }
}

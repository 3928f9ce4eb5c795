//! What a node says about itself in its DNS-SD TXT record, and reading it back from
//! whatever a neighbour sent, which may be anything.

use std::collections::BTreeMap;

/// Version of the TXT layout below (`txtvers`, as RFC 6763 §6.7 suggests).
pub const TXT_VERSION: &str = "1";

/// A node's announcement: who it is, which cluster it serves, what it speaks.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NodeRecord {
    /// The device name a manifest calls it by.
    pub name: String,
    pub cluster: String,
    /// The ring protocol version (`prp::protocol::PROTOCOL_VERSION`) it speaks.
    pub protocol: u32,
    /// The `prima` release it runs.
    pub prima_version: String,
    /// The address its transport listens on, as it printed it (e.g. 0.0.0.0:9000).
    pub listen: String,
    /// The fingerprint of its cluster key ([`crate::prp::key::ClusterKey::fingerprint`],
    /// which reveals nothing of the key); `None`: plain links (`--insecure`).
    pub key: Option<String>,
}

impl NodeRecord {
    /// The TXT key/value pairs of this record.
    pub fn to_txt(&self) -> Vec<(&'static str, String)> {
        vec![
            ("txtvers", TXT_VERSION.to_string()),
            ("name", self.name.clone()),
            ("cluster", self.cluster.clone()),
            ("proto", self.protocol.to_string()),
            ("version", self.prima_version.clone()),
            ("listen", self.listen.clone()),
        ]
        .into_iter()
        .chain(self.key.clone().map(|k| ("key", k)))
        .collect()
    }

    /// Reads a record from TXT pairs; the error names the key that is missing or wrong.
    pub fn from_txt(txt: &BTreeMap<String, String>) -> Result<NodeRecord, String> {
        let get = |key: &str| -> Result<String, String> {
            match txt.get(key).map(|v| v.trim()) {
                Some(v) if !v.is_empty() => Ok(v.to_string()),
                Some(_) => Err(format!("TXT `{key}` is empty")),
                None => Err(format!("TXT has no `{key}`")),
            }
        };
        let txtvers = get("txtvers")?;
        if txtvers != TXT_VERSION {
            return Err(format!(
                "TXT layout version {txtvers}, this prima reads {TXT_VERSION}"
            ));
        }
        let proto = get("proto")?;
        let protocol = proto
            .parse()
            .map_err(|_| format!("TXT `proto` is {proto:?}, not a number"))?;
        Ok(NodeRecord {
            name: get("name")?,
            cluster: get("cluster")?,
            protocol,
            prima_version: get("version")?,
            listen: get("listen")?,
            key: get("key").ok(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> NodeRecord {
        NodeRecord {
            name: "laptop".into(),
            cluster: "home".into(),
            protocol: 1,
            prima_version: "0.1.0".into(),
            listen: "0.0.0.0:9000".into(),
            key: Some("0123456789abcdef".into()),
        }
    }

    fn txt(r: &NodeRecord) -> BTreeMap<String, String> {
        r.to_txt()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    #[test]
    fn a_record_survives_its_txt() {
        assert_eq!(NodeRecord::from_txt(&txt(&record())), Ok(record()));
    }

    #[test]
    fn a_bad_txt_names_the_key() {
        let mut t = txt(&record());
        t.remove("cluster");
        assert_eq!(
            NodeRecord::from_txt(&t).unwrap_err(),
            "TXT has no `cluster`"
        );
        let mut t = txt(&record());
        t.insert("proto".into(), "two".into());
        assert_eq!(
            NodeRecord::from_txt(&t).unwrap_err(),
            "TXT `proto` is \"two\", not a number"
        );
        let mut t = txt(&record());
        t.insert("name".into(), " ".into());
        assert_eq!(NodeRecord::from_txt(&t).unwrap_err(), "TXT `name` is empty");
        let mut t = txt(&record());
        t.insert("txtvers".into(), "9".into());
        assert!(NodeRecord::from_txt(&t).unwrap_err().contains("version 9"));
    }
}

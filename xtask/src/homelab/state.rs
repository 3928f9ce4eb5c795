//! What `homelab up` built, written down so `status`, `exec` and `down` can find it:
//! `<root>/<testbed>/state.json`, beside the devices' model copies, logs and the generated
//! manifest. `down` also works without it, from the naming conventions.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// Where every testbed's state directory lives (`PRIMA_HOMELAB_DIR` moves it).
pub fn root() -> PathBuf {
    std::env::var_os("PRIMA_HOMELAB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/prima-homelab"))
}

#[derive(Debug, Serialize, Deserialize)]
pub struct BedState {
    pub testbed: String,
    pub testbed_file: PathBuf,
    pub dir: PathBuf,
    pub router_pid: Option<i32>,
    pub devices: Vec<DeviceState>,
    /// The generated cluster manifest (for `prima apply` inside the head).
    pub manifest: PathBuf,
    /// What a user runs inside the head to use the bed.
    pub run_command: Vec<String>,
    pub apply_command: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct DeviceState {
    pub name: String,
    pub head: bool,
    pub namespace: String,
    pub address: String,
    /// `address:port` of its `prima node` (None for the head).
    pub node: Option<String>,
    pub pid: Option<i32>,
    pub model_copy: PathBuf,
    pub log: PathBuf,
    pub memory: u64,
    pub cpu: f64,
    pub disk_read: Option<u64>,
    /// The "major:minor" disk the read limit applies to.
    pub disk: Option<String>,
    pub link_mbit: Option<f64>,
    pub latency_ms: f64,
}

impl BedState {
    pub fn file(dir: &Path) -> PathBuf {
        dir.join("state.json")
    }

    pub fn save(&self) -> Result<()> {
        let path = Self::file(&self.dir);
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(&path, text + "\n").with_context(|| format!("writing {}", path.display()))
    }

    pub fn load(dir: &Path) -> Result<BedState> {
        let path = Self::file(dir);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    pub fn device(&self, name: &str) -> Option<&DeviceState> {
        self.devices.iter().find(|d| d.name == name)
    }
}

/// The testbeds that have a state directory.
pub fn beds_up() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(root()) else {
        return Vec::new();
    };
    let mut beds: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    beds.sort();
    beds
}

//! The local nodes `prima apply` runs: started on loopback for every `local` device, and
//! stopped when apply exits — unless `--keep-nodes`, which leaves them running and records
//! them, so the next apply of the same cluster ([`ClusterId`]: its `[cluster] name`, else
//! its head and key — not the manifest's path) reuses every node whose configuration is
//! unchanged and restarts or stops the others. [`kept_nodes`] and [`stop_kept`] are
//! `prima status` and `prima stop`. Each device keeps its last [`LOGS_KEPT`] logs.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::ControllerError;
use crate::manifest::LoadedManifest;
use crate::prp::key::LinkSecurity;

/// What a local node is started with; a node is reused only if all of it is unchanged.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NodeSpec {
    pub name: String,
    /// The `prima` binary that runs the node (the one running `apply`, as a rule).
    pub exe: PathBuf,
    pub model: PathBuf,
    pub threads: Option<u32>,
    pub mem_budget: Option<u64>,
    pub backend: Option<String>,
    /// GPU backend plugin for the GPU layers the plan gives the node.
    pub gpu_backend: Option<String>,
    /// Transport plugin (default: the node's choice, the first found).
    pub transport: Option<String>,
    /// The cluster key file, passed by path so the key never shows in `ps`; `None`:
    /// `--insecure`.
    pub key_file: Option<PathBuf>,
    /// The key's fingerprint: a node started with another key at the same path is not
    /// reused.
    pub key_fingerprint: Option<String>,
}

impl NodeSpec {
    fn config_hash(&self) -> String {
        let text = serde_json::to_string(self).unwrap_or_default();
        hex::encode(&Sha256::digest(text.as_bytes())[..8])
    }
}

/// A running node and how to reach it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunningNode {
    pub name: String,
    pub addr: String,
    pub pid: u32,
    pub config: String,
    pub log: PathBuf,
}

impl RunningNode {
    /// Whether the process is still the node we started (pid reuse is checked through its
    /// command line where the OS shows it: `node_process`).
    fn alive(&self) -> bool {
        super::node_process::is_node(self.pid)
    }

    fn stop(&self) {
        super::node_process::stop(self.pid);
    }
}

/// The local nodes of one apply.
pub struct LocalNodes {
    nodes: Vec<(RunningNode, Option<std::process::Child>)>,
    state: PathBuf,
    label: String,
    keep: bool,
    reused: Vec<String>,
}

/// Environment variable overriding where `prima apply` keeps its clusters' state (kept
/// nodes, last plans, node logs).
pub const STATE_DIR_ENV: &str = "PRIMA_STATE_DIR";

/// `$PRIMA_STATE_DIR`, else `~/.cache/prima/apply`.
pub(super) fn cache_dir() -> PathBuf {
    match std::env::var_os(STATE_DIR_ENV) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(crate::profile::home_dir()).join(".cache/prima/apply"),
    }
}

/// Which cluster a manifest describes: its `[cluster] name`, else its head device and
/// cluster key. Two manifest files of one cluster share its kept nodes and last plan.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterId {
    /// A file name: a hash of what identifies the cluster.
    pub key: String,
    /// What a person reads: the name, or `head DEVICE, key FINGERPRINT`.
    pub label: String,
}

impl ClusterId {
    pub fn of(manifest: &LoadedManifest, security: &LinkSecurity) -> ClusterId {
        let m = &manifest.manifest;
        let label = match &m.cluster.name {
            Some(name) => name.clone(),
            None => {
                let head = manifest
                    .head_index()
                    .map(|h| m.devices[h].name.clone())
                    .unwrap_or_default();
                match security {
                    LinkSecurity::Key(key) => format!("head {head}, key {}", key.fingerprint()),
                    LinkSecurity::Insecure => format!("head {head}, plain links"),
                }
            }
        };
        let key = hex::encode(&Sha256::digest(label.as_bytes())[..8]);
        ClusterId { key, label }
    }
}

/// Where the kept nodes of `cluster` are recorded.
fn state_path(cluster: &ClusterId) -> PathBuf {
    cache_dir().join(format!("{}.json", cluster.key))
}

/// The label of the cluster whose kept nodes are recorded at `state` (written beside it).
pub fn cluster_label(state: &Path) -> Option<String> {
    std::fs::read_to_string(state.with_extension("label")).ok()
}

impl LocalNodes {
    /// Starts (or, from a kept earlier run, reuses) one node per spec.
    pub fn start(
        cluster: &ClusterId,
        specs: &[NodeSpec],
        keep: bool,
    ) -> Result<LocalNodes, ControllerError> {
        let state = state_path(cluster);
        let recorded: Vec<RunningNode> = std::fs::read(&state)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let mut nodes = LocalNodes {
            nodes: Vec::new(),
            state,
            label: cluster.label.clone(),
            keep,
            reused: Vec::new(),
        };
        for old in &recorded {
            let wanted = specs
                .iter()
                .any(|s| s.name == old.name && s.config_hash() == old.config);
            if wanted && old.alive() {
                nodes.reused.push(old.name.clone());
                nodes.nodes.push((old.clone(), None));
            } else {
                old.stop();
            }
        }
        for spec in specs {
            if nodes.nodes.iter().any(|(n, _)| n.name == spec.name) {
                continue;
            }
            let (node, child) = spawn(spec, keep)?;
            nodes.nodes.push((node, Some(child)));
        }
        Ok(nodes)
    }

    pub fn addr_of(&self, name: &str) -> Option<String> {
        self.nodes
            .iter()
            .find(|(n, _)| n.name == name)
            .map(|(n, _)| n.addr.clone())
    }

    /// Names of the nodes reused from an earlier `--keep-nodes` run.
    pub fn reused(&self) -> &[String] {
        &self.reused
    }

    pub fn running(&self) -> impl Iterator<Item = &RunningNode> {
        self.nodes.iter().map(|(n, _)| n)
    }
}

impl Drop for LocalNodes {
    fn drop(&mut self) {
        if self.keep {
            let list: Vec<&RunningNode> = self.running().collect();
            let _ = std::fs::create_dir_all(cache_dir());
            if let Ok(json) = serde_json::to_vec_pretty(&list) {
                let _ = std::fs::write(&self.state, json);
                let _ = std::fs::write(self.state.with_extension("label"), &self.label);
            }
            return;
        }
        for (node, child) in &mut self.nodes {
            match child {
                Some(c) => {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                None => node.stop(),
            }
        }
        let _ = std::fs::remove_file(&self.state);
        let _ = std::fs::remove_file(self.state.with_extension("label"));
    }
}

/// Logs kept per device: older ones are removed when a node starts.
pub const LOGS_KEPT: usize = 5;

/// The nodes left running by `--keep-nodes`, per apply that kept them (its state file),
/// each with whether it still runs.
pub fn kept_nodes() -> Vec<(PathBuf, Vec<(RunningNode, bool)>)> {
    let Ok(dir) = std::fs::read_dir(cache_dir()) else {
        return Vec::new();
    };
    let mut states: Vec<PathBuf> = dir
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    states.sort();
    states
        .into_iter()
        .filter_map(|state| {
            let nodes: Vec<RunningNode> =
                serde_json::from_slice(&std::fs::read(&state).ok()?).ok()?;
            let nodes = nodes
                .into_iter()
                .map(|n| {
                    let alive = n.alive();
                    (n, alive)
                })
                .collect();
            Some((state, nodes))
        })
        .collect()
}

/// Stops the kept nodes (of `cluster`, or all) and forgets them; the nodes stopped.
pub fn stop_kept(cluster: Option<&ClusterId>) -> Vec<RunningNode> {
    let only = cluster.map(state_path);
    let mut stopped = Vec::new();
    for (state, nodes) in kept_nodes() {
        if only.as_ref().is_some_and(|o| *o != state) {
            continue;
        }
        for (node, alive) in nodes {
            if alive {
                node.stop();
                stopped.push(node);
            }
        }
        let _ = std::fs::remove_file(&state);
        let _ = std::fs::remove_file(state.with_extension("label"));
    }
    stopped
}

/// Removes the oldest logs of device `name` in `dir`, leaving room for a new one within
/// [`LOGS_KEPT`].
fn rotate_logs(dir: &Path, name: &str) {
    let prefix = format!("node-{name}-");
    let Ok(dir) = std::fs::read_dir(dir) else {
        return;
    };
    let mut logs: Vec<(std::time::SystemTime, PathBuf)> = dir
        .flatten()
        .filter(|e| {
            let file = e.file_name().to_string_lossy().into_owned();
            file.starts_with(&prefix)
                && file.ends_with(".log")
                // `node-NAME-PID.log`: not another device whose name continues this one.
                && file[prefix.len()..file.len() - 4].bytes().all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    logs.sort();
    let excess = (logs.len() + 1).saturating_sub(LOGS_KEPT);
    for (_, path) in logs.into_iter().take(excess) {
        let _ = std::fs::remove_file(path);
    }
}

/// Starts `prima node` for `spec` on a free loopback port, its log in the cache.
fn spawn(
    spec: &NodeSpec,
    keep: bool,
) -> Result<(RunningNode, std::process::Child), ControllerError> {
    let name = &spec.name;
    let io = |what: String| move |source| ControllerError::Io { what, source };
    std::fs::create_dir_all(cache_dir())
        .map_err(io(format!("cannot create {}", cache_dir().display())))?;
    rotate_logs(&cache_dir(), name);
    let log = cache_dir().join(format!("node-{name}-{}.log", std::process::id()));
    let log_file =
        std::fs::File::create(&log).map_err(io(format!("cannot create {}", log.display())))?;
    let mut cmd = Command::new(&spec.exe);
    cmd.args(["node", "--listen", "127.0.0.1:0", "-m"])
        .arg(&spec.model);
    if let Some(t) = spec.threads {
        cmd.args(["-t", &t.to_string()]);
    }
    if let Some(b) = spec.mem_budget {
        cmd.args(["--mem-budget", &b.to_string()]);
    }
    if let Some(b) = &spec.backend {
        cmd.args(["--backend", b]);
    }
    if let Some(b) = &spec.gpu_backend {
        cmd.args(["--gpu-backend", b]);
    }
    if let Some(t) = &spec.transport {
        cmd.args(["--transport", t]);
    }
    match &spec.key_file {
        Some(key) => cmd.arg("--key-file").arg(key),
        None => cmd.arg("--insecure"),
    };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log_file));
    // Elsewhere no signal follows the parent's death: only `LocalNodes`' drop stops them.
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = keep;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if !keep {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure runs in the forked child before exec and only calls prctl,
        // which is async-signal-safe; it makes the node die with this process.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
    }
    let mut child = cmd
        .spawn()
        .map_err(io(format!("device '{name}': cannot start a local node")))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        // Whole lines only: stderr is unbuffered, so the node's line may be half written.
        let whole = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
        if let Some(line) = whole
            .lines()
            .find_map(|l| l.strip_prefix("node: listening on "))
        {
            let addr = line.split(' ').next().unwrap_or_default().to_string();
            let node = RunningNode {
                name: name.clone(),
                addr,
                pid: child.id(),
                config: spec.config_hash(),
                log,
            };
            return Ok((node, child));
        }
        if let Ok(Some(status)) = child.try_wait() {
            let why = text
                .lines()
                .find_map(|l| l.strip_prefix("error: "))
                .unwrap_or("it exited")
                .to_string();
            return Err(ControllerError::NodeFailed {
                device: name.clone(),
                status,
                why,
            });
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(ControllerError::NodeTimeout {
                device: name.clone(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_keeps_its_last_logs_and_no_other_devices() {
        let dir = std::env::temp_dir().join(format!("prima-logs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for pid in 0..8u64 {
            let path = dir.join(format!("node-laptop-{pid}.log"));
            std::fs::write(&path, "").unwrap();
            // Modification times that order the logs whatever the clock's resolution.
            let file = std::fs::File::options().write(true).open(&path).unwrap();
            file.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(1_000 + pid))
                .unwrap();
        }
        std::fs::write(dir.join("node-laptop-2-9.log"), "").unwrap();
        rotate_logs(&dir, "laptop");
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        // Room for the new one: the LOGS_KEPT - 1 newest, and another device's.
        assert_eq!(
            left,
            [
                "node-laptop-2-9.log",
                "node-laptop-4.log",
                "node-laptop-5.log",
                "node-laptop-6.log",
                "node-laptop-7.log"
            ]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

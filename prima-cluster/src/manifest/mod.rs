//! Cluster manifests: the TOML file that declares a model, the candidate devices, the
//! scheduling policy and the server — what `prima apply` turns into a running ring.
//!
//! Parsing rejects unknown fields and names the line and column of every mistake; the
//! checks that need more than one field (one head, unique names, a window per device…)
//! come after parsing and name the device or field. Every field is documented in
//! `manifests/README.md`.

mod addresses;
pub mod routes;

pub use addresses::fill_addresses;
pub use prima_host::parse_size;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The embedded default: three local nodes on loopback whose memory budgets together hold
/// SmolLM2-135M but none alone does.
pub const DEFAULT_MANIFEST: &str = include_str!("../../../manifests/home.toml");
/// Where the embedded default says it lives (its relative paths resolve from there).
pub const DEFAULT_MANIFEST_PATH: &str = "manifests/home.toml";

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{path}: {message}")]
    Read { path: PathBuf, message: String },
    /// toml's message already carries the line, the column and the offending field.
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: {field}: {message}")]
    Invalid {
        path: PathBuf,
        field: String,
        message: String,
    },
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub model: ModelSection,
    #[serde(rename = "device")]
    pub devices: Vec<Device>,
    #[serde(default)]
    pub policy: Policy,
    #[serde(default)]
    pub server: Server,
    /// Opt-in: find devices that have no `address` on the LAN (mDNS).
    pub discovery: Option<DiscoverySection>,
    /// How the ring's links are protected (default: the cluster key file in
    /// `~/.cache/prima`, made on first use).
    #[serde(default)]
    pub security: Security,
    /// `[cluster]`: which cluster this manifest describes (default: its head and key).
    #[serde(default)]
    pub cluster: ClusterSection,
}

/// `[cluster]`: manifests with one name (or, unnamed, one head device and one key)
/// describe one cluster: they share its kept nodes and its last applied plan.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    pub name: Option<String>,
}

/// `[security]`: the key that authenticates and encrypts every link of the ring.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Security {
    /// The cluster key file (`prima keygen` writes one), relative to the manifest's
    /// directory unless absolute; every node must hold the same key.
    pub key_file: Option<PathBuf>,
    /// Plain, unauthenticated links: only for a network where every machine is trusted.
    #[serde(default)]
    pub insecure: bool,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// The GGUF file, relative to the manifest's directory unless absolute.
    #[serde(default)]
    pub path: PathBuf,
    /// Instead of `path`: a model from a Hugging Face repository, `OWNER/NAME[:QUANT]`,
    /// which `prima apply` takes from its cache or pulls (`prima pull`).
    pub hf: Option<String>,
    /// Per-device paths, by device name, where a device keeps its copy elsewhere.
    #[serde(default)]
    pub paths: BTreeMap<String, PathBuf>,
    /// A draft model with the same vocabulary, run on the head for speculative
    /// decoding; relative to the manifest's directory unless absolute.
    pub draft: Option<PathBuf>,
    /// Tokens the draft proposes per round at most (default: `prima run`'s).
    pub draft_max: Option<usize>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Device {
    pub name: String,
    /// Address of a running `prima node` (host:port).
    pub address: Option<String>,
    /// A node that `prima apply` starts on this machine (the head is always local).
    #[serde(default)]
    pub local: bool,
    /// This device is the head: it holds the tokenizer, the sampler and the server.
    #[serde(default)]
    pub head: bool,
    /// Keep the device in the ring as a hop, with no layers.
    #[serde(default)]
    pub relay_only: bool,
    /// Bytes of weights to keep resident (e.g. "2G"); the rest is streamed from disk.
    pub mem_budget: Option<Size>,
    /// Bytes of GPU memory to use (for GPU backends).
    pub vram_budget: Option<Size>,
    /// Compute threads (default: the backend's choice).
    pub threads: Option<u32>,
    /// Backend plugin name (default: the first one found).
    pub backend: Option<String>,
    /// GPU backend plugin for the device's GPU layers (default: the first usable GPU
    /// plugin the device finds, if any).
    pub gpu_backend: Option<String>,
    /// GPU layers per window n_m, in place of Halda's (at most the device's window).
    pub gpu_layers: Option<usize>,
    /// The network this device is on (default: the head's); devices on different
    /// networks reach each other through a relay (`routes.rs`).
    pub network: Option<String>,
    /// This device is a relay (`prima relay`), not a node: its address on each network
    /// it joins, by network name.
    pub relay: Option<BTreeMap<String, String>>,
}

/// A byte count, written as a number or a string with a unit ("512M", "2G").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "SizeText")]
pub struct Size(pub u64);

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeText {
    Bytes(u64),
    Text(String),
}

impl TryFrom<SizeText> for Size {
    type Error = String;

    fn try_from(v: SizeText) -> Result<Size, String> {
        match v {
            SizeText::Bytes(b) => Ok(Size(b)),
            SizeText::Text(t) => parse_size(&t).map(Size),
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Scheduler {
    /// Halda: the paper's layer-to-device assignment with device pruning.
    #[default]
    Halda,
    /// Layers in proportion to available memory (as exo does).
    Mem,
    /// Layers in proportion to compute, then moved off devices short of memory.
    Perf,
    /// The window sizes given in `policy.windows`.
    Manual,
}

/// Rounds per token: chosen by the scheduler, or fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Rounds {
    #[default]
    Auto,
    Fixed(usize),
}

impl<'de> Deserialize<'de> for Rounds {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Rounds, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(usize),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(0) => Err(serde::de::Error::custom("k must be at least 1")),
            Raw::N(n) => Ok(Rounds::Fixed(n)),
            Raw::S(s) if s == "auto" => Ok(Rounds::Auto),
            Raw::S(s) => Err(serde::de::Error::custom(format!(
                "k must be \"auto\" or a number, not \"{s}\""
            ))),
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Release {
    #[default]
    Mru,
    None,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    #[serde(default)]
    pub scheduler: Scheduler,
    /// Window size per device, in manifest order (manual scheduler only).
    pub windows: Option<Vec<usize>>,
    #[serde(default)]
    pub k: Rounds,
    #[serde(default = "yes")]
    pub prefetch: bool,
    #[serde(default)]
    pub release: Release,
    /// Context length in tokens.
    #[serde(default = "default_ctx")]
    pub ctx: usize,
    /// Prompt tokens per batch.
    #[serde(default = "default_batch")]
    pub batch: usize,
    /// Plan with these device profiles (a `prima plan --devices` file, matched by device
    /// name) instead of measuring the devices: for testbeds and `--dry-run`.
    pub profiles: Option<PathBuf>,
    /// Transport plugin of the head and the local nodes (default: `vpn-proxy` when a
    /// route goes through a relay, else the first found, `tcp`).
    pub transport: Option<String>,
    /// Micro-batches the head keeps in the ring at once when serving several requests:
    /// a number ≥ 1, or "tuned" (measured); default `PRIMA_MICRO_BATCHES`, else 1.
    pub micro_batches: Option<crate::prp::micro_batch::MicroBatches>,
    /// Where the output layer runs: "auto" (Halda: the head or the device that runs the
    /// last layer, whichever it predicts faster; the manual scheduler keeps it on the
    /// head), "head" or "last". Every device holds the model file, so a device that
    /// sees a hidden state can compute its logits anyway: the head keeps nothing from
    /// the others by running it, and "auto" is the default.
    #[serde(default)]
    pub output: crate::halda::OutputPolicy,
    /// Logits the device that runs the output layer sends the head per row: the
    /// `output_top_k` highest (the rest −∞: exact for greedy decoding and any sampler
    /// whose top_k is at most this), 0 for all of them.
    #[serde(default = "default_output_top_k")]
    pub output_top_k: u32,
}

fn default_output_top_k() -> u32 {
    64
}

fn yes() -> bool {
    true
}

fn default_ctx() -> usize {
    4096
}

fn default_batch() -> usize {
    512
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            scheduler: Scheduler::default(),
            windows: None,
            k: Rounds::Auto,
            prefetch: true,
            release: Release::Mru,
            ctx: default_ctx(),
            batch: default_batch(),
            profiles: None,
            transport: None,
            micro_batches: None,
            output: crate::halda::OutputPolicy::default(),
            output_top_k: default_output_top_k(),
        }
    }
}

/// Most parallel slots a server takes (each holds a whole KV cache).
pub const MAX_PARALLEL: usize = 256;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Server {
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Requests generated at once, each in its own slot (KV cache) of `policy.ctx`
    /// positions (`prima apply --parallel`, llama.cpp's `-np`).
    #[serde(default = "default_parallel")]
    pub parallel: usize,
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}

fn default_parallel() -> usize {
    1
}

impl Default for Server {
    fn default() -> Self {
        Server {
            listen: default_listen(),
            parallel: default_parallel(),
        }
    }
}

/// `[discovery]`: `prima apply` looks for the devices declared with no `address` among
/// the nodes that announce themselves (`prima node --advertise`) in this cluster.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DiscoverySection {
    /// Present means on, unless this says otherwise.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Only nodes announcing this cluster are used (`prima node --cluster`).
    #[serde(default = "default_cluster")]
    pub cluster: String,
    /// How long to listen for announcements ("3s", "500ms", or seconds as a number).
    #[serde(default = "default_discovery_timeout")]
    pub timeout: Timeout,
}

fn default_cluster() -> String {
    crate::discovery::DEFAULT_CLUSTER.into()
}

fn default_discovery_timeout() -> Timeout {
    Timeout(std::time::Duration::from_secs(3))
}

/// A duration written as seconds ("3s", 2.5) or milliseconds ("500ms").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "TimeoutText")]
pub struct Timeout(pub std::time::Duration);

#[derive(Deserialize)]
#[serde(untagged)]
enum TimeoutText {
    Seconds(f64),
    Text(String),
}

impl TryFrom<TimeoutText> for Timeout {
    type Error = String;

    fn try_from(v: TimeoutText) -> Result<Timeout, String> {
        let bad = |t: &str| format!("'{t}' is not a duration (try \"3s\" or \"500ms\")");
        let seconds = match v {
            TimeoutText::Seconds(s) => s,
            TimeoutText::Text(t) => match (t.strip_suffix("ms"), t.strip_suffix('s')) {
                (Some(ms), _) => ms.trim().parse::<f64>().map_err(|_| bad(&t))? / 1000.0,
                (None, Some(s)) => s.trim().parse::<f64>().map_err(|_| bad(&t))?,
                (None, None) => t.trim().parse::<f64>().map_err(|_| bad(&t))?,
            },
        };
        if !(seconds > 0.0 && seconds <= 600.0) {
            return Err(format!(
                "{seconds} s: a timeout must be above 0 and at most 600 s"
            ));
        }
        Ok(Timeout(std::time::Duration::from_secs_f64(seconds)))
    }
}

/// A manifest with its origin, checked as a whole.
#[derive(Debug, Clone)]
pub struct LoadedManifest {
    pub manifest: Manifest,
    /// The file it came from (or the embedded default's nominal path).
    pub path: PathBuf,
}

impl LoadedManifest {
    /// Reads and checks the manifest at `path`.
    pub fn load(path: &Path) -> Result<LoadedManifest, ManifestError> {
        let text = std::fs::read_to_string(path).map_err(|e| ManifestError::Read {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        LoadedManifest::parse(&text, path)
    }

    /// The embedded default manifest.
    pub fn embedded_default() -> Result<LoadedManifest, ManifestError> {
        LoadedManifest::parse(DEFAULT_MANIFEST, Path::new(DEFAULT_MANIFEST_PATH))
    }

    pub fn parse(text: &str, path: &Path) -> Result<LoadedManifest, ManifestError> {
        let manifest: Manifest = toml::from_str(text).map_err(|e| ManifestError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().replace('\n', " | "),
        })?;
        let loaded = LoadedManifest {
            manifest,
            path: path.to_path_buf(),
        };
        loaded.check()?;
        Ok(loaded)
    }

    fn invalid(&self, field: impl Into<String>, message: impl Into<String>) -> ManifestError {
        ManifestError::Invalid {
            path: self.path.clone(),
            field: field.into(),
            message: message.into(),
        }
    }

    fn check(&self) -> Result<(), ManifestError> {
        let m = &self.manifest;
        if !(1..=MAX_PARALLEL).contains(&m.server.parallel) {
            return Err(self.invalid(
                "server.parallel",
                format!("must be between 1 and {MAX_PARALLEL}"),
            ));
        }
        if m.devices.is_empty() {
            return Err(self.invalid("device", "declare at least one [[device]]"));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, d) in m.devices.iter().enumerate() {
            let field = format!("device[{i}] ({})", d.name);
            if d.name.trim().is_empty() {
                return Err(self.invalid(format!("device[{i}].name"), "must not be empty"));
            }
            if !seen.insert(d.name.as_str()) {
                return Err(self.invalid(field, "another device has the same name"));
            }
            if d.relay.is_some() {
                crate::manifest::routes::check_relay(d).map_err(|m| self.invalid(field, m))?;
                continue;
            }
            match (&d.address, d.local || d.head) {
                // The head's address: where it listens for the ring's last device, which
                // a ring across networks needs.
                (Some(_), true) if d.head && !d.local => {}
                (Some(_), true) => {
                    return Err(self.invalid(
                        field,
                        "has both `address` and `local`/`head`; a device is either a running node (address) or started here (local)",
                    ))
                }
                (None, false) if !m.discovery.as_ref().is_some_and(|d| d.enabled) => {
                    return Err(self.invalid(
                        field,
                        "needs `address = \"host:port\"` of a running `prima node`, or `local = true` (or a [discovery] section to find it on the LAN)",
                    ))
                }
                _ => {}
            }
            if d.head && d.relay_only {
                return Err(self.invalid(
                    field,
                    "the head cannot be relay-only: it embeds the tokens and samples",
                ));
            }
        }
        let heads = m.devices.iter().filter(|d| d.head).count();
        if heads > 1 {
            return Err(self.invalid("device.head", "only one device can be the head"));
        }
        if let Ok(head) = self.head_index() {
            crate::manifest::routes::check_networks(m, head)
                .map_err(|(field, message)| self.invalid(field, message))?;
        }
        match (&m.model.hf, m.model.path.as_os_str().is_empty()) {
            (None, true) => {
                return Err(self.invalid(
                    "model",
                    "give `path` (a GGUF file) or `hf` (OWNER/NAME[:QUANT])",
                ))
            }
            (Some(_), false) => {
                return Err(self.invalid("model", "`path` and `hf` both name the model; keep one"))
            }
            (Some(hf), true)
                if hf
                    .split(':')
                    .next()
                    .is_none_or(|r| r.split('/').count() != 2) =>
            {
                return Err(self.invalid("model.hf", format!("'{hf}' is not OWNER/NAME[:QUANT]")))
            }
            _ => {}
        }
        for name in m.model.paths.keys() {
            if !m.devices.iter().any(|d| &d.name == name) {
                return Err(self.invalid(format!("model.paths.{name}"), "names no declared device"));
            }
        }
        match (m.policy.scheduler, &m.policy.windows) {
            (Scheduler::Manual, None) => {
                return Err(self.invalid(
                    "policy.windows",
                    "the manual scheduler needs one window size per device, in manifest order",
                ))
            }
            (Scheduler::Manual, Some(w)) if w.len() != m.devices.len() => {
                return Err(self.invalid(
                    "policy.windows",
                    format!("{} window sizes for {} devices", w.len(), m.devices.len()),
                ))
            }
            (Scheduler::Manual, Some(w)) if w.iter().all(|&x| x == 0) => {
                return Err(self.invalid("policy.windows", "all window sizes are zero"))
            }
            (Scheduler::Manual, Some(w))
                if m.devices
                    .iter()
                    .zip(w)
                    .any(|(d, &x)| d.relay.is_some() && x > 0) =>
            {
                return Err(self.invalid(
                    "policy.windows",
                    "a relay device runs no layers: give it a window of 0",
                ))
            }
            (s, Some(_)) if s != Scheduler::Manual => {
                return Err(self.invalid(
                    "policy.windows",
                    "only the manual scheduler takes window sizes (set scheduler = \"manual\")",
                ))
            }
            _ => {}
        }
        if m.discovery
            .as_ref()
            .is_some_and(|d| d.cluster.trim().is_empty())
        {
            return Err(self.invalid("discovery.cluster", "must not be empty"));
        }
        if m.security.insecure && m.security.key_file.is_some() {
            return Err(self.invalid(
                "security",
                "`insecure = true` and `key_file` contradict each other; keep one",
            ));
        }
        if m.policy.ctx == 0 || m.policy.batch == 0 {
            return Err(self.invalid("policy.ctx", "ctx and batch must be positive"));
        }
        Ok(())
    }

    /// Index of the head device: the one marked `head`, else the first local one.
    pub fn head_index(&self) -> Result<usize, ManifestError> {
        let m = &self.manifest;
        if let Some(i) = m.devices.iter().position(|d| d.head) {
            return Ok(i);
        }
        m.devices.iter().position(|d| d.local && d.relay.is_none()).ok_or_else(|| {
            self.invalid(
                "device.head",
                "no device is local, so none can be the head; mark this machine's device `head = true`",
            )
        })
    }

    /// Replaces `[model]` (its `path` and every per-device `paths` entry) by one file,
    /// given relative to the working directory (`prima apply --model`).
    pub fn override_model(&mut self, path: &Path) -> Result<(), ManifestError> {
        let absolute = std::path::absolute(path).map_err(|e| ManifestError::Read {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        self.manifest.model.path = absolute;
        self.manifest.model.hf = None;
        self.manifest.model.paths.clear();
        Ok(())
    }

    /// The draft model's file (`model.draft`), resolved.
    pub fn draft_path(&self) -> Option<PathBuf> {
        self.manifest
            .model
            .draft
            .as_deref()
            .map(|p| self.resolve(p))
    }

    /// The model file of device `name`: its override, else `model.path`.
    pub fn model_path(&self, name: &str) -> PathBuf {
        let m = &self.manifest.model;
        self.resolve(m.paths.get(name).unwrap_or(&m.path))
    }

    /// A path from the manifest: `~/` is the home directory, and relative paths start at
    /// the manifest's directory.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if let Ok(rest) = p.strip_prefix("~") {
            return PathBuf::from(crate::profile::home_dir()).join(rest);
        }
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.path.parent().unwrap_or(Path::new(".")).join(p)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<LoadedManifest, ManifestError> {
        LoadedManifest::parse(text, Path::new("/m/home.toml"))
    }

    const GOOD: &str = r#"
[model]
path = "../models/x.gguf"

[[device]]
name = "desk"
head = true
local = true
mem_budget = "40M"

[[device]]
name = "laptop"
address = "10.0.0.2:9000"
threads = 4

[policy]
scheduler = "manual"
windows = [10, 20]
k = 2
"#;

    #[test]
    fn a_good_manifest_parses_with_defaults() {
        let m = parse(GOOD).unwrap();
        assert_eq!(m.head_index().unwrap(), 0);
        let d = &m.manifest.devices;
        assert_eq!(d[0].mem_budget, Some(Size(40 << 20)));
        assert_eq!(d[1].threads, Some(4));
        assert_eq!(m.manifest.policy.k, Rounds::Fixed(2));
        assert!(m.manifest.policy.prefetch);
        assert_eq!(m.manifest.server.listen, "127.0.0.1:8080");
        assert_eq!(m.manifest.server.parallel, 1);
        assert_eq!(m.model_path("desk"), PathBuf::from("/m/../models/x.gguf"));
    }

    #[test]
    fn a_draft_model_is_optional_and_resolved_like_the_model() {
        let m = parse(GOOD).unwrap();
        assert_eq!(m.draft_path(), None);
        assert_eq!(m.manifest.model.draft_max, None);
        let with = GOOD.replace(
            "path = \"../models/x.gguf\"",
            "path = \"../models/x.gguf\"\ndraft = \"small.gguf\"\ndraft_max = 4",
        );
        let m = parse(&with).unwrap();
        assert_eq!(m.draft_path(), Some(PathBuf::from("/m/small.gguf")));
        assert_eq!(m.manifest.model.draft_max, Some(4));
    }

    #[test]
    fn micro_batches_are_a_number_or_tuned() {
        use crate::prp::micro_batch::MicroBatches;
        assert_eq!(parse(GOOD).unwrap().manifest.policy.micro_batches, None);
        let with = |v: &str| GOOD.replace("[policy]", &format!("[policy]\nmicro_batches = {v}"));
        let m = parse(&with("2")).unwrap();
        assert_eq!(
            m.manifest.policy.micro_batches,
            Some(MicroBatches::Fixed(2))
        );
        let m = parse(&with("\"tuned\"")).unwrap();
        assert_eq!(m.manifest.policy.micro_batches, Some(MicroBatches::Tuned));
        for bad in ["0", "-2", "\"fast\""] {
            let err = parse(&with(bad)).unwrap_err().to_string();
            assert!(
                err.contains("micro_batches") && err.contains("tuned"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn a_model_given_on_the_command_line_replaces_every_path() {
        let mut m = LoadedManifest::embedded_default().unwrap();
        m.manifest
            .model
            .paths
            .insert("laptop".into(), PathBuf::from("/elsewhere/y.gguf"));
        m.override_model(Path::new("/models/z.gguf")).unwrap();
        for name in ["desktop", "laptop"] {
            assert_eq!(m.model_path(name), PathBuf::from("/models/z.gguf"));
        }
        m.override_model(Path::new("rel.gguf")).unwrap();
        assert!(m.model_path("laptop").is_absolute());
    }

    #[test]
    fn a_model_is_a_path_or_a_hub_name() {
        let hub = GOOD.replace(
            "path = \"../models/x.gguf\"",
            "hf = \"bartowski/SmolLM2-GGUF:Q8_0\"",
        );
        let m = parse(&hub).unwrap();
        assert_eq!(
            m.manifest.model.hf.as_deref(),
            Some("bartowski/SmolLM2-GGUF:Q8_0")
        );
        for (text, wanted) in [
            (
                GOOD.replace("path = \"../models/x.gguf\"", ""),
                "give `path`",
            ),
            (
                GOOD.replace("path = \"../models/x.gguf\"", "path = \"x\"\nhf = \"a/b\""),
                "keep one",
            ),
            (
                GOOD.replace("path = \"../models/x.gguf\"", "hf = \"smollm\""),
                "not OWNER/NAME",
            ),
        ] {
            let err = parse(&text).unwrap_err().to_string();
            assert!(err.contains(wanted), "{err}");
        }
    }

    #[test]
    fn the_embedded_default_is_valid() {
        let m = LoadedManifest::embedded_default().unwrap();
        assert!(m.manifest.devices.len() >= 3);
        assert!(m.manifest.devices.iter().all(|d| d.local || d.head));
    }

    #[test]
    fn mistakes_name_the_line_and_field() {
        let err = parse(&GOOD.replace("threads = 4", "threads = 4\ncolour = 1")).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("colour") && text.contains("line 15"),
            "{text}"
        );

        let err = parse(&GOOD.replace("\"40M\"", "\"40Q\""))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown size unit 'q'") && err.contains("line 9"),
            "{err}"
        );

        let err = parse(&GOOD.replace("windows = [10, 20]", "windows = [10]")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/m/home.toml: policy.windows: 1 window sizes for 2 devices"
        );

        let err = parse(&format!("{GOOD}\n[server]\nparallel = 0\n")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/m/home.toml: server.parallel: must be between 1 and 256"
        );

        let err = parse(&GOOD.replace("address = \"10.0.0.2:9000\"", "")).unwrap_err();
        assert!(
            err.to_string()
                .contains("device[1] (laptop): needs `address"),
            "{err}"
        );

        let err = parse(&GOOD.replace("name = \"laptop\"", "name = \"desk\"")).unwrap_err();
        assert!(err.to_string().contains("same name"), "{err}");

        let err = parse(&GOOD.replace("k = 2", "k = \"many\"")).unwrap_err();
        assert!(err.to_string().contains("\"auto\" or a number"), "{err}");
    }

    #[test]
    fn discovery_is_opt_in_and_its_fields_are_checked() {
        let without = GOOD.replace("address = \"10.0.0.2:9000\"", "");
        let m = parse(&format!("{without}\n[discovery]\ncluster = \"home\"\n")).unwrap();
        let d = m.manifest.discovery.unwrap();
        assert!(d.enabled);
        assert_eq!(d.timeout.0, std::time::Duration::from_secs(3));

        let off = format!("{without}\n[discovery]\nenabled = false\n");
        let err = parse(&off).unwrap_err().to_string();
        assert!(err.contains("device[1] (laptop): needs `address"), "{err}");

        for (line, wanted) in [
            ("colour = 1", "unknown field `colour`"),
            ("timeout = \"3 weeks\"", "'3 weeks' is not a duration"),
            ("timeout = \"0ms\"", "above 0"),
            ("timeout = 0.25", ""),
        ] {
            let text = format!("{without}\n[discovery]\n{line}\n");
            match parse(&text) {
                Ok(m) if wanted.is_empty() => assert_eq!(
                    m.manifest.discovery.unwrap().timeout.0,
                    std::time::Duration::from_millis(250)
                ),
                Ok(_) => panic!("{line} was accepted"),
                Err(e) => assert!(e.to_string().contains(wanted), "{line}: {e}"),
            }
        }
        let err = parse(&format!("{without}\n[discovery]\ncluster = \"\"\n")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/m/home.toml: discovery.cluster: must not be empty"
        );
    }

    #[test]
    fn security_takes_a_key_file_or_insecure_but_not_both() {
        let m = parse(GOOD).unwrap();
        assert_eq!(m.manifest.security, Security::default());
        let m = parse(&format!(
            "{GOOD}\n[security]\nkey_file = \"keys/home.key\"\n"
        ))
        .unwrap();
        let file = m.manifest.security.key_file.as_deref().unwrap();
        assert_eq!(m.resolve(file), PathBuf::from("/m/keys/home.key"));
        let m = parse(&format!("{GOOD}\n[security]\ninsecure = true\n")).unwrap();
        assert!(m.manifest.security.insecure);
        let err = parse(&format!(
            "{GOOD}\n[security]\ninsecure = true\nkey_file = \"k\"\n"
        ))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "/m/home.toml: security: `insecure = true` and `key_file` contradict each other; keep one"
        );
        let err = parse(&format!("{GOOD}\n[security]\nkey = \"00\"\n")).unwrap_err();
        assert!(err.to_string().contains("unknown field `key`"), "{err}");
    }
}

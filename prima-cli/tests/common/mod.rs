//! Helpers shared by the model-level tests: where models and fixtures live, and loading
//! the CPU backend plugin the way the binary does.

#![allow(dead_code)]

pub mod tokens;

use std::io::BufRead;
use std::path::{Path, PathBuf};

use prima_abi::backend::BackendConfig;
use prima_core::plugin::{load_backend, LoadedBackend};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Models fetched by `cargo xtask fetch-models`.
pub fn workspace_models() -> PathBuf {
    workspace_root().join("models")
}

/// Models derived by `cargo xtask test-models` (requantized and tiny random ones).
pub fn derived_models() -> PathBuf {
    match std::env::var_os("PRIMA_MODEL_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/prima/models")
        }
    }
}

/// Returns the model path, or `None` (with a note) when it is absent and absence is
/// allowed. `cargo xtask test` sets `PRIMA_REQUIRE_MODELS=1`, so in CI a missing model
/// fails the test instead of skipping it.
pub fn model_or_skip(path: PathBuf) -> Option<PathBuf> {
    if path.exists() {
        return Some(path);
    }
    if std::env::var_os("PRIMA_REQUIRE_MODELS").is_some() {
        panic!(
            "{} is missing (run `cargo xtask test-models`)",
            path.display()
        );
    }
    eprintln!(
        "note: skipping, {} is absent (run `cargo xtask test-models`)",
        path.display()
    );
    None
}

/// The speculative tests' target and draft: SmolLM2-135M's F16 conversion and the Q4_1
/// original it was made from (one vocabulary and tokenizer); `None` where one is absent
/// (see [`model_or_skip`]).
pub fn draft_pair() -> Option<(PathBuf, PathBuf)> {
    let target = model_or_skip(derived_models().join("smollm2-135m-f16.gguf"));
    let draft = model_or_skip(workspace_models().join("SmolLM2-135M-Instruct.Q4_1.gguf"));
    Some((target?, draft?))
}

/// The CPU backend plugin, found beside the test binary's target directory.
pub fn cpu_backend(threads: u32) -> LoadedBackend {
    load_backend(Some("cpu"), BackendConfig { threads })
        .unwrap_or_else(|e| panic!("{e} (build it with `cargo build --release --workspace`)"))
}

/// The TCP transport plugin, found beside the test binary's target directory, with frames
/// large enough for any test model's activations.
pub fn tcp_transport() -> prima_core::plugin::LoadedTransport {
    prima_core::plugin::load_transport(
        Some("tcp"),
        prima_abi::transport::TransportConfig {
            max_frame_bytes: 1 << 30,
        },
    )
    .expect("the tcp transport plugin (cargo build --workspace)")
}

/// A cluster key for this test process's rings, and the file its `prima node`s are given
/// (`--key-file`): made once per process.
pub fn test_key() -> &'static (PathBuf, prima_cluster::prp::key::ClusterKey) {
    static KEY: std::sync::OnceLock<(PathBuf, prima_cluster::prp::key::ClusterKey)> =
        std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("prima-test-{}.key", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let key = prima_cluster::prp::key::ClusterKey::generate();
        key.write_new(&path).expect("write the test cluster key");
        (path, key)
    })
}

/// Ring options' security for [`test_key`].
pub fn test_security() -> prima_cluster::prp::key::LinkSecurity {
    prima_cluster::prp::key::LinkSecurity::Key(test_key().1.clone())
}

/// A `prima node` process, killed when dropped.
pub struct Node {
    pub child: std::process::Child,
    pub addr: String,
}

impl Node {
    /// Starts one on a free loopback port with the test key and waits for its address.
    pub fn start(model: &Path) -> Node {
        Node::start_with(model, &[])
    }

    /// [`Node::start`] with more arguments for `prima node`.
    pub fn start_with(model: &Path, args: &[&str]) -> Node {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_prima"))
            .args(["node", "--listen", "127.0.0.1:0", "-t", "1", "-m"])
            .arg(model)
            .args(args)
            .arg("--key-file")
            .arg(&test_key().0)
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start prima node");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if let Some(rest) = line.strip_prefix("node: listening on ") {
                    let _ = tx.send(rest.split(' ').next().unwrap_or_default().to_string());
                }
            }
        });
        let addr = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the node prints its address");
        Node { child, addr }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A resilient ring of the head and `nodes` (devices `a`, `b`, … at their addresses) with
/// the model's layers shared evenly; after a loss the devices left share them evenly again.
pub fn resilient_ring<'m>(
    model: &'m prima_core::model::Model,
    backend: &'m prima_abi::backend::BackendBox,
    transport: &'m prima_abi::transport::TransportBox,
    nodes: &[Node],
    options: prima_cluster::prp::RingOptions,
) -> prima_cluster::prp::failover::ResilientRing<'m> {
    use prima_cluster::prp::failover::{ResilientRing, RingDevice, RingLayout};
    let n_layers = model.hparams().n_layers;
    let even = move |devices: Vec<RingDevice>| {
        let k = devices.len();
        let windows = (0..k)
            .map(|i| n_layers / k + usize::from(i < n_layers % k))
            .collect();
        RingLayout {
            devices,
            windows,
            next_routes: Vec::new(),
            absent: Vec::new(),
            output_on_last: false,
        }
    };
    let names = ["a", "b", "c", "d", "e", "f", "g", "h"];
    let mut all = vec![RingDevice {
        name: "head".into(),
        addr: String::new(),
    }];
    all.extend(nodes.iter().zip(names).map(|(n, name)| RingDevice {
        name: name.into(),
        addr: n.addr.clone(),
    }));
    let layout = even(all.clone());
    let addrs: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
    let head = prima_cluster::prp::RingHead::connect(
        model,
        backend,
        transport,
        &addrs,
        &layout.windows,
        &options,
    )
    .unwrap();
    let replan = Box::new(move |lost: &[String]| {
        Ok(even(
            all.iter()
                .filter(|d| !lost.contains(&d.name))
                .cloned()
                .collect(),
        ))
    });
    ResilientRing::new(head, model, backend, transport, layout, options, replan)
}

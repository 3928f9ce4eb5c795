//! `prima serve --manifest`: the cluster a manifest declares, brought up through the
//! controller as `prima apply` brings it up (local nodes, plan, ring), serves the
//! OpenAI API; its greedy completion is one device's, and Ctrl-C stops every node.

mod common;
mod server_support;

use std::path::PathBuf;
use std::process::Command;

use common::{model_or_skip, workspace_models};
use server_support::Server;

/// A scratch directory with a link to the model and a three-device manifest.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new(model: &std::path::Path) -> Scratch {
        let dir = std::env::temp_dir().join(format!("prima-serve-manifest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(model, dir.join("model.gguf")).unwrap();
        Scratch { dir }
    }

    /// Nodes whose command line mentions this directory.
    fn nodes_left(&self) -> Vec<String> {
        let needle = self.dir.to_string_lossy().into_owned();
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.contains(&needle) && c.contains(" node "))
            .collect()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const MANIFEST: &str = r#"
[model]
path = "model.gguf"

[[device]]
name = "desktop"
head = true
local = true
threads = 1

[[device]]
name = "laptop"
local = true
threads = 1

[[device]]
name = "tablet"
local = true
threads = 1

[policy]
scheduler = "manual"
windows = [10, 10, 10]
ctx = 256

[server]
listen = "127.0.0.1:0"
"#;

fn completion(server: &Server) -> String {
    let (status, reply) = server.post_json(
        "/v1/completions",
        &serde_json::json!({
            "model": "model",
            "prompt": "The three primary colours are",
            "max_tokens": 12,
            "temperature": 0
        }),
    );
    assert_eq!(status, 200, "{reply}");
    reply["choices"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text: {reply}"))
        .to_string()
}

#[test]
fn serve_manifest_runs_the_ring_and_answers_as_one_device() {
    let Some(model) = model_or_skip(workspace_models().join("SmolLM2-135M-Instruct.Q4_1.gguf"))
    else {
        return;
    };
    let scratch = Scratch::new(&model);
    let manifest = scratch.dir.join("cluster.toml");
    std::fs::write(&manifest, MANIFEST).unwrap();

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prima"));
    cmd.args(["serve", "--manifest", manifest.to_str().unwrap()]);
    let mut ring = Server::spawn(cmd);
    let text = completion(&ring);
    assert!(!text.is_empty());
    let log = ring.stderr_lines().join("\n");
    assert!(log.contains("plan (manual scheduler, k = 1)"), "{log}");
    assert!(log.contains("3 devices"), "{log}");
    assert_eq!(
        scratch.nodes_left().len(),
        2,
        "two local nodes while serving"
    );

    let alone = Server::start(&scratch.dir.join("model.gguf"), &["-c", "256"]);
    assert_eq!(
        text,
        completion(&alone),
        "the ring answers as one device does"
    );
    drop(alone);

    let (exit, lines) = ring.interrupt();
    assert!(exit.success(), "{exit}: {lines:?}");
    assert!(
        lines.iter().any(|l| l.contains("serve: stopped")),
        "{lines:?}"
    );
    assert!(
        scratch.nodes_left().is_empty(),
        "{:?}",
        scratch.nodes_left()
    );
}

/// A manifest that cannot be read is a one-line error naming it, before anything starts.
#[test]
fn serve_manifest_names_a_missing_manifest() {
    let out = Command::new(env!("CARGO_BIN_EXE_prima"))
        .args(["serve", "--manifest", "/nonexistent/cluster.toml"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("/nonexistent/cluster.toml"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

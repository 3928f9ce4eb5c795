//! A short `cargo xtask soak`: 100 requests at concurrency 8 against `prima apply`
//! serving a loopback ring of three, a node SIGKILLed and restarted in the middle. No
//! unexpected answer, no request lost across the restart, the node planned in again,
//! no thread, descriptor or memory growth in the head and the nodes.
//!
//! It runs the `prima` built beside this test's xtask (`cargo xtask test` builds the
//! workspace first) and SmolLM2 from models/ (skipped when absent unless
//! `PRIMA_REQUIRE_MODELS` is set).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn a_short_soak_with_a_node_restart_has_no_unexpected_answer_and_no_leak() {
    let model = workspace().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !model.exists() {
        assert!(
            std::env::var_os("PRIMA_REQUIRE_MODELS").is_none(),
            "{} is missing (run `cargo xtask fetch-models`)",
            model.display()
        );
        eprintln!("note: skipping, {} is absent", model.display());
        return;
    }
    let xtask = Path::new(env!("CARGO_BIN_EXE_xtask"));
    let prima = xtask.with_file_name("prima");
    assert!(
        prima.exists(),
        "{} is missing (cargo build --release -p prima-core -p prima-transport-tcp -p prima-backend-cpu)",
        prima.display()
    );
    let json = std::env::temp_dir().join(format!("prima-soak-test-{}.json", std::process::id()));
    let out = Command::new(xtask)
        .args([
            "soak",
            "--requests",
            "100",
            "--concurrency",
            "8",
            "--max-tokens",
            "8",
        ])
        .arg("--prima")
        .arg(&prima)
        .arg("--json")
        .arg(&json)
        .current_dir(workspace())
        .output()
        .expect("running xtask soak");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(out.status.success(), "the soak failed:\n{stdout}{stderr}");

    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    assert_eq!(report["requests"], 100);
    assert_eq!(report["unexpected"], 0);
    let kinds = report["kinds"].as_array().unwrap();
    let total: u64 = kinds.iter().map(|k| k["requests"].as_u64().unwrap()).sum();
    assert_eq!(total, 100);
    for kind in ["whole", "stream", "disconnect", "cancel", "bad_json"] {
        assert!(
            kinds.iter().any(|k| k["kind"] == kind),
            "the mix has no {kind} request: {report}"
        );
    }
    let restart = &report["node_restart"];
    assert_eq!(restart["lost"], 0, "{restart}");
    assert!(
        restart["requests_while_lost"].as_u64().unwrap() > 0,
        "{restart}"
    );
    let metrics = &report["metrics"];
    assert!(metrics["prima_ring_replans_total{cause=\"device_lost\"}"].as_f64() >= Some(1.0));
    assert!(metrics["prima_ring_replans_total{cause=\"device_back\"}"].as_f64() >= Some(1.0));
    assert_eq!(metrics["prima_ring_devices"], 3.0);
    let processes = report["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 3, "{report}");
    for p in processes {
        let (s, e) = (&p["start"], &p["end"]);
        assert!(e["threads"].as_u64() <= s["threads"].as_u64(), "{p}");
        assert!(e["fds"].as_u64() <= s["fds"].as_u64(), "{p}");
    }
}

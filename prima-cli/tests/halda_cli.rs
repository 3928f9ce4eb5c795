//! `prima plan` and `prima profile` end to end: the real binary, the solver and backend
//! plugins found through PRIMA_PLUGIN_DIR, errors that name the file and field.

mod halda_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use halda_support::{model_path, plugin_dir, testbed_path};

fn prima(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prima"));
    cmd.args(args).env("PRIMA_PLUGIN_DIR", plugin_dir());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("prima-halda-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn plan_json_has_the_documented_fields() {
    let model = model_path("llama3-8b-q4_k");
    let devices = testbed_path("d1-d6");
    for scheduler in ["halda", "mem", "perf"] {
        let out = prima(
            &[
                "plan",
                "-m",
                model.to_str().unwrap(),
                "--devices",
                devices.to_str().unwrap(),
                "--scheduler",
                scheduler,
                "--json",
            ],
            &[],
        );
        let v: serde_json::Value = serde_json::from_str(&halda_support::ok(&out)).unwrap();
        assert!(v["k"].as_u64().unwrap() >= 1);
        assert!(v["predicted_tpot_ms"].as_f64().unwrap() > 0.0);
        assert!(v["solve_ms"].as_f64().unwrap() >= 0.0);
        let devs = v["devices"].as_array().unwrap();
        assert_eq!(devs.len(), 6);
        let mut layers = 0;
        for d in devs {
            for field in ["name", "w", "n", "set", "pruned", "relay"] {
                assert!(d.get(field).is_some(), "{field} missing in {d}");
            }
            layers += d["w"].as_u64().unwrap() * v["k"].as_u64().unwrap();
        }
        if scheduler == "halda" {
            assert_eq!(layers, 32);
        }
    }
}

#[test]
fn plan_table_names_pruned_devices_and_the_breakdown() {
    let model = model_path("llama3-8b-q4_k");
    let devices = testbed_path("d1-d6");
    let out = prima(
        &[
            "plan",
            "-m",
            model.to_str().unwrap(),
            "--devices",
            devices.to_str().unwrap(),
        ],
        &[],
    );
    let text = halda_support::ok(&out);
    assert!(text.contains("pruned"), "{text}");
    assert!(text.contains("predicted TPOT"), "{text}");
    for part in ["compute", "memory", "disk", "network"] {
        assert!(text.contains(part), "{text}");
    }
}

#[test]
fn a_relay_device_stays_in_the_ring_without_layers() {
    let text = std::fs::read_to_string(testbed_path("d1-d6"))
        .unwrap()
        .replacen("name = \"D4\"", "name = \"D4\"\nrelay = true", 1);
    let devices = scratch("relay.toml");
    std::fs::write(&devices, text).unwrap();
    let model = model_path("llama3-8b-q4_k");
    let out = prima(
        &[
            "plan",
            "-m",
            model.to_str().unwrap(),
            "--devices",
            devices.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    let v: serde_json::Value = serde_json::from_str(&halda_support::ok(&out)).unwrap();
    let d4 = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "D4")
        .unwrap();
    assert_eq!(d4["pruned"], true);
    assert_eq!(d4["relay"], true);
    assert_eq!(d4["w"], 0);
}

#[test]
fn bad_profiles_are_errors_naming_file_and_field() {
    let model = model_path("llama3-8b-q4_k");
    let good = std::fs::read_to_string(testbed_path("d1-d6")).unwrap();
    let cases = [
        (
            "unknown.toml",
            good.replacen("cpu_cores = 8", "cpu_cores = 8\ncpu_kores = 8", 1),
            "cpu_kores",
        ),
        (
            "syntax.toml",
            good.replacen("name = \"D2\"", "name = D2", 1),
            "syntax.toml",
        ),
        (
            "negative.toml",
            good.replacen("disk_seq_gb_s = 3.0", "disk_seq_gb_s = -3.0", 1),
            "disk_seq_gb_s",
        ),
        (
            "nogpu.toml",
            good.replacen("gpu_read_gb_s = 380\n", "", 1),
            "gpu_read_gb_s",
        ),
        (
            "empty.toml",
            "description = \"nothing\"\n".to_string(),
            "device",
        ),
    ];
    for (name, text, needle) in cases {
        let path = scratch(name);
        std::fs::write(&path, text).unwrap();
        let out = prima(
            &[
                "plan",
                "-m",
                model.to_str().unwrap(),
                "--devices",
                path.to_str().unwrap(),
            ],
            &[],
        );
        let e = halda_support::err(&out);
        assert!(e.contains(name), "{name}: {e}");
        assert!(e.contains(needle), "{name}: {e}");
        assert!(!e.contains("panicked"), "{e}");
    }
}

#[test]
fn missing_model_and_profiles_files_are_named() {
    let devices = testbed_path("d1-d6");
    let out = prima(
        &[
            "plan",
            "-m",
            "/nonexistent/model.gguf",
            "--devices",
            devices.to_str().unwrap(),
        ],
        &[],
    );
    assert!(halda_support::err(&out).contains("/nonexistent/model.gguf"));
    let model = model_path("llama3-8b-q4_k");
    let out = prima(
        &[
            "plan",
            "-m",
            model.to_str().unwrap(),
            "--devices",
            "/nonexistent/devices.toml",
        ],
        &[],
    );
    assert!(halda_support::err(&out).contains("/nonexistent/devices.toml"));
    let out = prima(&["profile", "-m", "/nonexistent/model.gguf"], &[]);
    assert!(halda_support::err(&out).contains("/nonexistent/model.gguf"));
}

#[test]
fn profile_measures_then_answers_from_cache() {
    let cache = scratch("profiles");
    let model = model_path("llama3-8b-q4_k");
    let args = [
        "profile",
        "-m",
        model.to_str().unwrap(),
        "--json",
        "--name",
        "here",
    ];
    let first: serde_json::Value = serde_json::from_str(&halda_support::ok(&prima(
        &args,
        &[("PRIMA_PROFILE_DIR", &cache)],
    )))
    .unwrap();
    let second: serde_json::Value = serde_json::from_str(&halda_support::ok(&prima(
        &args,
        &[("PRIMA_PROFILE_DIR", &cache)],
    )))
    .unwrap();
    assert_eq!(first["cached"], false);
    assert_eq!(second["cached"], true);
    eprintln!(
        "profile: first run {:.0} ms (measurement {:.0} ms), cached run {:.0} ms",
        first["elapsed_ms"].as_f64().unwrap(),
        first["measure_ms"].as_f64().unwrap(),
        second["elapsed_ms"].as_f64().unwrap()
    );
    let p = &first["profile"];
    assert_eq!(p["name"], "here");
    for field in [
        "cpu_read_gb_s",
        "memcpy_gb_s",
        "ram_total_gib",
        "ram_available_gib",
        "disk_seq_gb_s",
        "disk_rand_gb_s",
    ] {
        assert!(p[field].as_f64().unwrap() > 0.0, "{field}: {p}");
    }
    for q in ["q4_k", "q5_k", "q6_k", "q8_0", "f16", "f32"] {
        assert!(p["cpu_gflops"][q].as_f64().unwrap() > 0.0, "{q}: {p}");
    }
    // The throughputs come from the cache; the memory figures are read fresh.
    assert_eq!(
        first["profile"]["cpu_gflops"],
        second["profile"]["cpu_gflops"]
    );
    // A profile written as TOML is a valid profiles file for `prima plan`.
    let toml_out = halda_support::ok(&prima(
        &["profile", "-m", model.to_str().unwrap(), "--toml"],
        &[("PRIMA_PROFILE_DIR", &cache)],
    ));
    let devices = scratch("me.toml");
    std::fs::write(&devices, toml_out).unwrap();
    halda_support::ok(&prima(
        &[
            "plan",
            "-m",
            model.to_str().unwrap(),
            "--devices",
            devices.to_str().unwrap(),
            "--json",
        ],
        &[],
    ));
}

#[test]
fn plugins_lists_the_solver() {
    let text = halda_support::ok(&prima(&["plugins"], &[]));
    let line = text
        .lines()
        .find(|l| l.starts_with("solver"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("highs") && line.contains("abi v1"), "{line}");
}

#[test]
fn halda_without_a_solver_plugin_says_so() {
    // Only the OS memory plugin, which every scheduler's latency model needs.
    let empty = scratch("no-solver");
    std::fs::create_dir_all(&empty).unwrap();
    let os_memory = halda_support::lib_name("prima_os_memory");
    std::fs::copy(plugin_dir().join(&os_memory), empty.join(&os_memory)).unwrap();
    let model = model_path("llama3-8b-q4_k");
    let devices = testbed_path("d1-d6");
    let out = Command::new(env!("CARGO_BIN_EXE_prima"))
        .args([
            "plan",
            "-m",
            model.to_str().unwrap(),
            "--devices",
            devices.to_str().unwrap(),
        ])
        .env("PRIMA_PLUGIN_DIR", &empty)
        .output()
        .unwrap();
    let e = halda_support::err(&out);
    assert!(e.contains("no solver plugin"), "{e}");
    // The baselines need no solver.
    let out = Command::new(env!("CARGO_BIN_EXE_prima"))
        .args([
            "plan",
            "-m",
            model.to_str().unwrap(),
            "--devices",
            devices.to_str().unwrap(),
            "--scheduler",
            "mem",
        ])
        .env("PRIMA_PLUGIN_DIR", &empty)
        .output()
        .unwrap();
    halda_support::ok(&out);
}

//! The backend plugin boundary, end to end: a plugin built separately from the `prima`
//! binary is picked up at run time without rebuilding the binary, and a plugin built for
//! another ABI version is refused with a message that says so.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The target directory this test binary was built in (…/target/<profile>/deps/this).
fn outer_target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).unwrap().to_path_buf()
}

fn plugin_file_name() -> &'static str {
    if cfg!(target_os = "macos") {
        "libprima_backend_cpu.dylib"
    } else if cfg!(windows) {
        "prima_backend_cpu.dll"
    } else {
        "libprima_backend_cpu.so"
    }
}

/// Builds the CPU backend plugin in its own target directory — a separate build from the
/// one that produced `prima` — optionally claiming a fake ABI version, and copies the
/// library into a fresh plugin directory.
fn build_plugin_separately(fake_abi: Option<&str>, plugin_dir: &Path) {
    let target = outer_target_dir().join("plugin-abi-test");
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(workspace_root())
        .args(["build", "--quiet", "-p", "prima-backend-cpu", "--lib"])
        .env("CARGO_TARGET_DIR", &target);
    match fake_abi {
        Some(v) => cmd.env("PRIMA_FAKE_PLUGIN_ABI_VERSION", v),
        None => cmd.env_remove("PRIMA_FAKE_PLUGIN_ABI_VERSION"),
    };
    let status = cmd.status().expect("cargo runs");
    assert!(status.success(), "building the plugin failed");
    std::fs::create_dir_all(plugin_dir).unwrap();
    std::fs::copy(
        target.join("debug").join(plugin_file_name()),
        plugin_dir.join(plugin_file_name()),
    )
    .unwrap();
}

fn prima_plugins(plugin_dir: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_prima"))
        .arg("plugins")
        .env("PRIMA_PLUGIN_DIR", plugin_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "prima plugins failed: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn separately_built_plugin_is_loaded_and_wrong_abi_is_refused() {
    let base = std::env::temp_dir().join(format!("prima-plugin-abi-{}", std::process::id()));
    let good_dir = base.join("good");
    let bad_dir = base.join("bad");

    build_plugin_separately(Some("999"), &bad_dir);
    let listing = prima_plugins(&bad_dir);
    assert!(listing.contains("refused"), "{listing}");
    assert!(listing.contains("built for backend ABI v999"), "{listing}");

    build_plugin_separately(None, &good_dir);
    let listing = prima_plugins(&good_dir);
    assert!(!listing.contains("refused"), "{listing}");
    assert!(
        listing.contains("backend") && listing.contains("cpu"),
        "{listing}"
    );

    // The binary computes with a plugin it has never seen: a model run needs one.
    let model = workspace_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if model.exists() {
        let out = Command::new(env!("CARGO_BIN_EXE_prima"))
            .args(["run", "-m"])
            .arg(&model)
            .args(["-p", "The capital of France is", "-n", "4", "--temp", "0"])
            .env("PRIMA_PLUGIN_DIR", &good_dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.stdout.is_empty());

        // With only the wrong-ABI plugin, a run fails and names the reason.
        let out = Command::new(env!("CARGO_BIN_EXE_prima"))
            .args(["run", "-m"])
            .arg(&model)
            .args(["-p", "hi", "-n", "1"])
            .env("PRIMA_PLUGIN_DIR", &bad_dir)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("ABI v999"), "{err}");
    } else {
        eprintln!(
            "note: {} absent; run `cargo xtask fetch-models` for the model half of this test",
            model.display()
        );
    }
    let _ = std::fs::remove_dir_all(&base);
}

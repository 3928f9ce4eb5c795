//! Shared by the `halda_*` tests: the solver, OS memory and backend plugins found (or
//! built) the way the binary finds them, the paper's models as sparse synthetic files, the
//! testbeds.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use prima_cluster::halda::synth::{spec, PAPER_MODELS};
use prima_cluster::halda::ModelProfile;
use prima_cluster::profile::{DeviceProfile, DeviceProfiles};
use prima_core::plugin::{load_os_models_from, load_solver_from, LoadedOsModels, LoadedSolver};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The target profile directory this test binary was built in (…/target/<profile>).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(2).unwrap().to_path_buf()
}

pub fn lib_name(stem: &str) -> String {
    if cfg!(target_os = "macos") {
        format!("lib{stem}.dylib")
    } else if cfg!(windows) {
        format!("{stem}.dll")
    } else {
        format!("lib{stem}.so")
    }
}

/// A directory holding the solver, OS memory and CPU backend plugins. They are taken from beside
/// this test binary when a workspace build put them there; otherwise built once, in a
/// target directory of their own (a separate build, as a user's plugin would be).
pub fn plugin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let wanted = [
            ("prima-solver-highs", "prima_solver_highs"),
            ("prima-os-memory", "prima_os_memory"),
            ("prima-backend-cpu", "prima_backend_cpu"),
        ];
        let here = profile_dir();
        if wanted
            .iter()
            .all(|(_, stem)| here.join(lib_name(stem)).exists())
        {
            return here;
        }
        let target = here.parent().unwrap().join("halda-plugins");
        let mut cmd = Command::new(env!("CARGO"));
        cmd.current_dir(workspace_root())
            .args(["build", "--quiet", "--release", "--lib"])
            .env("CARGO_TARGET_DIR", &target);
        for (package, _) in wanted {
            cmd.args(["-p", package]);
        }
        let status = cmd.status().expect("cargo runs");
        assert!(status.success(), "building the plugins failed");
        let dir = target.join("release");
        for (_, stem) in wanted {
            assert!(dir.join(lib_name(stem)).exists(), "{stem} was not built");
        }
        dir
    })
}

/// A plugin built from one of prima-core's `examples/` (test fixtures built apart from
/// `prima`): from beside this test binary when `cargo test` built the examples, else
/// built once in a target directory of its own.
pub fn example_plugin(stem: &str) -> PathBuf {
    let here = profile_dir().join("examples").join(lib_name(stem));
    if here.exists() {
        return here;
    }
    let target = profile_dir().parent().unwrap().join("halda-plugins");
    let status = Command::new(env!("CARGO"))
        .current_dir(workspace_root())
        .args([
            "build",
            "--quiet",
            "--release",
            "-p",
            "prima-cli",
            "--example",
            stem,
        ])
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building the example {stem} failed");
    let built = target.join("release/examples").join(lib_name(stem));
    assert!(built.exists(), "{} was not built", built.display());
    built
}

pub fn solver() -> LoadedSolver {
    load_solver_from(&[plugin_dir().to_path_buf()], Some("highs")).unwrap_or_else(|e| panic!("{e}"))
}

/// The OS memory models (Linux, macOS ± Metal, Android) from the plugin directory.
pub fn os_models() -> LoadedOsModels {
    let models = load_os_models_from(&[plugin_dir().to_path_buf()]);
    for os in ["linux", "macos", "android"] {
        assert!(
            models.covered().contains(&os),
            "no model for {os}: {models:?}"
        );
    }
    models
}

/// The paper's models as sparse files in a per-process temporary directory.
pub fn model_path(tag: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("prima-halda-models-{}", std::process::id()));
        for s in PAPER_MODELS.iter() {
            s.write_to(&dir).expect("writing a synthetic model");
        }
        dir
    });
    assert!(spec(tag).is_some(), "no synthetic model {tag}");
    dir.join(format!("{tag}.gguf"))
}

pub fn model(tag: &str) -> ModelProfile {
    ModelProfile::open(&model_path(tag)).unwrap()
}

pub fn testbed_path(name: &str) -> PathBuf {
    workspace_root()
        .join("manifests/testbeds")
        .join(format!("{name}.toml"))
}

pub fn testbed(name: &str) -> Vec<DeviceProfile> {
    DeviceProfiles::load(&testbed_path(name))
        .unwrap_or_else(|e| panic!("{e}"))
        .device
}

/// The named devices of a testbed, in the file's order.
pub fn devices(name: &str, names: &[&str]) -> Vec<DeviceProfile> {
    testbed(name)
        .into_iter()
        .filter(|d| names.contains(&d.name.as_str()))
        .collect()
}

/// The stdout of a `prima` run that must succeed (its stderr in the failure message).
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// The stderr of a `prima` run that must fail.
pub fn err(out: &Output) -> String {
    assert!(!out.status.success(), "unexpectedly succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

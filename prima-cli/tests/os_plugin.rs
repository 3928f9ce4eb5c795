//! The OS memory plugin boundary, end to end: a device whose OS no plugin covers is an
//! error naming the OS and the plugins found; a second plugin covering that OS, built
//! apart from `prima` (the `prima_os_freebsd` example), is picked up from the plugin
//! directory without rebuilding `prima`; a plugin built for another ABI version is refused
//! with a message that says so.

mod halda_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use halda_support::{example_plugin, lib_name, model_path, plugin_dir, testbed_path};

fn prima(args: &[&str], plugins: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_prima"))
        .args(args)
        .env("PRIMA_PLUGIN_DIR", plugins)
        .output()
        .unwrap()
}

/// A directory of this test run, removed when dropped (also when the test fails): the
/// plugin copies weigh ~60 MB each, and every run would otherwise leave them in /tmp.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("prima-os-plugin-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// A plugin directory holding copies of these libraries (a user's install).
fn plugin_dir_with(name: &str, libraries: &[PathBuf]) -> Scratch {
    let dir = scratch(name);
    for lib in libraries {
        std::fs::copy(lib, dir.join(lib.file_name().unwrap())).unwrap();
    }
    dir
}

fn standard(stem: &str) -> PathBuf {
    plugin_dir().join(lib_name(stem))
}

/// `prima plan --json` for the 70B on `devices`: k, T and each device's (w, n, set).
fn plan(devices: &Path, plugins: &Path) -> Result<serde_json::Value, String> {
    let model = model_path("llama3-70b-q4_k");
    let out = prima(
        &[
            "plan",
            "-m",
            model.to_str().unwrap(),
            "--devices",
            devices.to_str().unwrap(),
            "--json",
        ],
        plugins,
    );
    if !out.status.success() {
        return Err(halda_support::err(&out));
    }
    let mut v: serde_json::Value = serde_json::from_str(&halda_support::ok(&out)).unwrap();
    v.as_object_mut().unwrap().remove("solve_ms");
    Ok(v)
}

#[test]
fn a_new_os_ships_as_a_plugin_without_rebuilding_prima() {
    // The homogeneous bed with its second device on FreeBSD, which the standard plugin
    // does not cover.
    let linux_bed = testbed_path("homogeneous-4");
    let text = std::fs::read_to_string(&linux_bed).unwrap();
    let c2 = text.find("name = \"C2\"").unwrap();
    let os_at = c2 + text[c2..].find("os = \"linux\"").unwrap();
    let beds = scratch("beds");
    let freebsd_bed = beds.join("freebsd.toml");
    let edited = format!(
        "{}os = \"freebsd\"{}",
        &text[..os_at],
        &text[os_at + "os = \"linux\"".len()..]
    );
    std::fs::write(&freebsd_bed, edited).unwrap();

    let installed = plugin_dir_with(
        "installed",
        &[standard("prima_solver_highs"), standard("prima_os_memory")],
    );
    let listing = halda_support::ok(&prima(&["plugins"], &installed));
    assert!(
        listing.lines().any(|l| l.starts_with("os-memory")
            && l.contains("standard")
            && l.contains("abi v1")
            && l.ends_with("covers linux, macos, android, windows")),
        "{listing}"
    );

    let e = plan(&freebsd_bed, &installed).unwrap_err();
    assert!(
        e.contains("device 'C2'") && e.contains("no OS memory plugin covers os 'freebsd'"),
        "{e}"
    );
    assert!(
        e.contains("standard") && e.contains("covers linux, macos, android, windows"),
        "{e}"
    );

    // Installing the plugin that covers FreeBSD is all it takes.
    std::fs::copy(
        example_plugin("prima_os_freebsd"),
        installed.join(lib_name("prima_os_freebsd")),
    )
    .unwrap();
    let listing = halda_support::ok(&prima(&["plugins"], &installed));
    assert!(
        listing
            .lines()
            .any(|l| l.contains("freebsd-test") && l.ends_with("covers freebsd")),
        "{listing}"
    );
    let freebsd = plan(&freebsd_bed, &installed).unwrap_or_else(|e| panic!("{e}"));
    // Its stand-in model is Linux's, so the plan is the all-Linux bed's, to the bit; the
    // 70B overloads every device, so C2's reloads were priced by the new plugin.
    let linux = plan(&linux_bed, &installed).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(freebsd, linux);
    assert_eq!(freebsd["devices"][1]["set"], "M3", "{freebsd}");
}

#[test]
fn an_os_plugin_for_another_abi_is_refused_by_name() {
    let dir = plugin_dir_with(
        "future",
        &[
            standard("prima_solver_highs"),
            example_plugin("prima_os_future_abi"),
        ],
    );
    let listing = halda_support::ok(&prima(&["plugins"], &dir));
    assert!(
        listing.contains("refused")
            && listing.contains("built for os-memory ABI v999, this prima speaks v1"),
        "{listing}"
    );
    // Planning then has no model for any OS and says why.
    let e = plan(&testbed_path("homogeneous-4"), &dir).unwrap_err();
    assert!(
        e.contains("no OS memory plugin covers os 'linux'") && e.contains("ABI v999"),
        "{e}"
    );
}

//! A mixed ring: the Windows build's `prima.exe node` under Wine beside this Linux build
//! as the head, planned by `prima apply` with Halda. The Windows node profiles itself
//! through the Windows APIs (its profile says `os = "windows"`, which the OS memory
//! plugin's Windows model prices: the manifest names only its address), the links are sealed with a cluster key read by both
//! builds, and the ring's greedy text is the text of one Linux device alone.
//!
//! `#[ignore]`d: it needs Wine and the unpacked Windows release, which `cargo xtask test`
//! builds (`cargo xtask dist --target x86_64-pc-windows-gnu --check`) and names in
//! `PRIMA_WINDOWS_DIR`; without them it skips with a note, unless `PRIMA_REQUIRE_WINE` is set.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{model_or_skip, workspace_models};

const PROMPT: &str = "The capital of France is";
const TOKENS: &str = "32";

fn prima(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_prima"))
        .args(args)
        .env_remove("PRIMA_PLUGIN_DIR")
        .output()
        .unwrap()
}

/// The Wine loader (Debian's wine64 package keeps it off PATH).
fn wine() -> Option<&'static str> {
    ["wine64", "/usr/lib/wine/wine64", "wine"]
        .into_iter()
        .find(|w| {
            Command::new(w)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

/// The unpacked Windows release: `PRIMA_WINDOWS_DIR`, else the dist profile's build.
fn windows_dir() -> PathBuf {
    match std::env::var_os("PRIMA_WINDOWS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_BIN_EXE_prima"))
            .parent()
            .and_then(Path::parent)
            .unwrap()
            .join("x86_64-pc-windows-gnu/dist"),
    }
}

/// Wine and `prima.exe`, or `None` with a note (a panic under `PRIMA_REQUIRE_WINE`).
fn wine_or_skip() -> Option<(&'static str, PathBuf)> {
    let exe = windows_dir().join("prima.exe");
    let missing = match wine() {
        None => "wine is not installed (apt-get install wine wine64)".to_string(),
        Some(_) if !exe.exists() => format!(
            "{} is missing (cargo xtask dist --target x86_64-pc-windows-gnu --check)",
            exe.display()
        ),
        Some(wine) => return Some((wine, exe)),
    };
    if std::env::var_os("PRIMA_REQUIRE_WINE").is_some() {
        panic!("{missing}");
    }
    eprintln!("note: skipping, {missing}");
    None
}

/// `prima.exe node` under Wine; killed (with its wineserver's children) when dropped.
struct WindowsNode {
    child: Child,
    addr: String,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl WindowsNode {
    fn start(wine: &str, exe: &Path, model: &Path, key: &Path) -> WindowsNode {
        let mut child = Command::new(wine)
            .arg(exe)
            .args(["node", "--listen", "127.0.0.1:0", "-t", "1", "-m"])
            .arg(model)
            .arg("--key-file")
            .arg(key)
            .env("WINEDEBUG", "-all")
            .env_remove("PRIMA_PLUGIN_DIR")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start prima.exe node under wine");
        let stderr = child.stderr.take().unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let lines = log.clone();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("node: listening on ") {
                    let _ = tx.send(rest.split(' ').next().unwrap_or_default().to_string());
                }
                lines.lock().unwrap().push(line);
            }
        });
        // Wine's first start of a prefix takes a while; only a hang reaches this.
        let addr = rx
            .recv_timeout(Duration::from_secs(180))
            .unwrap_or_else(|_| {
                panic!(
                    "prima.exe node printed no address:\n{}",
                    log.lock().unwrap().join("\n")
                )
            });
        WindowsNode { child, addr, log }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for WindowsNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
#[ignore = "needs wine and the Windows release; cargo xtask test runs it"]
fn a_windows_node_under_wine_and_a_linux_head_generate_one_devices_text() {
    let Some(model) = model_or_skip(workspace_models().join("SmolLM2-135M-Instruct.Q4_1.gguf"))
    else {
        return;
    };
    let Some((wine, exe)) = wine_or_skip() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("prima-windows-ring-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("cluster.key");
    let out = prima(&["keygen", "--out", key.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The Windows build profiles itself through the Windows APIs (GlobalMemoryStatusEx,
    // an unbuffered read of the model): the profile the node gives the head says so.
    let profile = Command::new(wine)
        .arg(&exe)
        .args(["profile", "--toml", "--name", "windows", "-m"])
        .arg(&model)
        .env("WINEDEBUG", "-all")
        .output()
        .unwrap();
    let profile_text = String::from_utf8_lossy(&profile.stdout);
    assert!(
        profile.status.success() && profile_text.contains("os = \"windows\""),
        "{profile_text}{}",
        String::from_utf8_lossy(&profile.stderr)
    );
    eprintln!("{profile_text}");

    let node = WindowsNode::start(wine, &exe, &model, &key);
    eprintln!("prima.exe node under {wine} listening on {}", node.addr);
    // The head keeps 40 MB of SmolLM2's ~100 MB of weights resident, so Halda has reason
    // to give the Windows node layers.
    let manifest = dir.join("mixed.toml");
    std::fs::write(
        &manifest,
        format!(
            r#"[model]
path = "{model}"

[[device]]
name = "linux"
head = true
local = true
mem_budget = "40M"
threads = 1

[[device]]
name = "windows"
address = "{addr}"

[policy]
scheduler = "halda"
ctx = 256

[security]
key_file = "{key}"
"#,
            model = model.display(),
            addr = node.addr,
            key = key.display()
        ),
    )
    .unwrap();
    let manifest = manifest.to_str().unwrap();

    let out = prima(&["apply", manifest, "--dry-run", "--json"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}\nnode:\n{}", node.log());
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!("{err}");
    eprintln!("plan: {plan}");
    let windows = plan["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "windows")
        .cloned()
        .unwrap_or_else(|| panic!("no device 'windows' in {plan}"));
    assert!(
        windows["layers"].as_u64().unwrap_or(0) > 0,
        "Halda gave the Windows node no layers: {plan}"
    );

    let args = ["-p", PROMPT, "-n", TOKENS, "--temp", "0"];
    let mut apply = vec!["apply", manifest];
    apply.extend_from_slice(&args);
    let ring = prima(&apply);
    let ring_err = String::from_utf8_lossy(&ring.stderr).into_owned();
    assert!(ring.status.success(), "{ring_err}\nnode:\n{}", node.log());
    eprintln!("{ring_err}");
    let mut run = vec!["run", "-m", model.to_str().unwrap()];
    run.extend_from_slice(&args);
    let alone = prima(&run);
    assert!(alone.status.success());
    let (ring_text, alone_text) = (
        String::from_utf8_lossy(&ring.stdout),
        String::from_utf8_lossy(&alone.stdout),
    );
    eprintln!("ring:  {ring_text:?}\nalone: {alone_text:?}");
    assert!(!alone_text.trim().is_empty());
    assert_eq!(ring_text, alone_text, "node:\n{}", node.log());
    let _ = std::fs::remove_dir_all(&dir);
}

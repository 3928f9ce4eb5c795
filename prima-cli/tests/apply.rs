//! `prima apply` end to end: a manifest with three local devices generates what one device
//! generates and leaves no node behind; each kind of bad input is a one-line error that
//! names what is wrong.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{derived_models, model_or_skip, workspace_models};

/// A scratch directory holding a manifest and a link to the model, removed when dropped.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("prima-apply-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch { dir }
    }

    /// Links `model` into the scratch directory as `name`, so node command lines name it.
    fn link_model(&self, model: &Path, name: &str) -> PathBuf {
        let link = self.dir.join(name);
        std::os::unix::fs::symlink(model, &link).unwrap();
        link
    }

    /// Writes `text` as the manifest, naming its cluster after this directory: tests run
    /// in parallel, and clusters with one head and key would share their kept nodes.
    fn manifest(&self, text: &str) -> PathBuf {
        let path = self.dir.join("cluster.toml");
        let name = self.dir.file_name().unwrap().to_string_lossy();
        std::fs::write(&path, format!("{text}\n[cluster]\nname = \"{name}\"\n")).unwrap();
        path
    }

    /// Processes whose command line mentions this directory (nodes started for it).
    fn processes_left(&self) -> Vec<String> {
        let needle = self.dir.to_string_lossy().into_owned();
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(&needle) && cmdline.contains(" node ") {
                found.push(cmdline);
            }
        }
        found
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn state_dir() -> PathBuf {
    std::env::temp_dir().join(format!("prima-apply-state-{}", std::process::id()))
}

/// Runs prima with its cluster state (kept nodes, last plans, logs) in a directory of
/// this test run's, not the user's.
fn prima(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_prima"))
        .env("PRIMA_STATE_DIR", state_dir())
        .args(args)
        .output()
        .expect("run prima")
}

fn three_local(windows: &str) -> String {
    format!(
        r#"
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
mem_budget = "40M"

[[device]]
name = "tablet"
local = true
threads = 1

[policy]
{windows}
ctx = 256
"#
    )
}

fn smollm2() -> Option<PathBuf> {
    model_or_skip(workspace_models().join("SmolLM2-135M-Instruct.Q4_1.gguf"))
}

#[test]
fn apply_runs_a_prompt_on_three_local_devices_and_leaves_no_node_behind() {
    let Some(model) = smollm2() else { return };
    let scratch = Scratch::new("e2e");
    scratch.link_model(&model, "model.gguf");
    let manifest = scratch.manifest(&three_local("scheduler = \"manual\"\nwindows = [4, 3, 3]"));
    let prompt = "The three primary colours are";
    let out = prima(&[
        "apply",
        manifest.to_str().unwrap(),
        "--prompt",
        prompt,
        "-n",
        "16",
        "--temp",
        "0",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("plan (manual scheduler, k = 3)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("laptop") && stderr.contains("tablet"),
        "{stderr}"
    );
    assert!(stderr.contains("ring of 3 devices, k = 3"), "{stderr}");

    let single = prima(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        prompt,
        "-n",
        "16",
        "--temp",
        "0",
        "-t",
        "1",
        "-c",
        "256",
    ]);
    assert!(single.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&single.stdout),
        "the ring generates what one device generates"
    );
    assert!(
        scratch.processes_left().is_empty(),
        "{:?}",
        scratch.processes_left()
    );
}

#[test]
fn dry_run_prints_the_plan_as_json() {
    let Some(model) = smollm2() else { return };
    let scratch = Scratch::new("dry");
    scratch.link_model(&model, "model.gguf");
    let manifest = scratch.manifest(&three_local(
        "scheduler = \"manual\"\nwindows = [10, 10, 10]",
    ));
    let out = prima(&["apply", manifest.to_str().unwrap(), "--dry-run", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["k"], 1);
    let devices = plan["devices"].as_array().unwrap();
    let names: Vec<&str> = devices
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["desktop", "laptop", "tablet"]);
    assert!(devices.iter().all(|d| d["w"] == 10 && d["pruned"] == false));
    assert!(scratch.processes_left().is_empty());
}

#[test]
fn bad_manifests_are_named_errors() {
    let Some(model) = smollm2() else { return };
    let scratch = Scratch::new("bad");
    scratch.link_model(&model, "model.gguf");

    let apply = |text: &str| {
        let manifest = scratch.manifest(text);
        let out = prima(&["apply", manifest.to_str().unwrap(), "--dry-run"]);
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let good = three_local("scheduler = \"manual\"\nwindows = [10, 10, 10]");

    let err = apply(&good.replace(
        "threads = 1\nmem_budget",
        "threads = 1\ncolour = \"red\"\nmem_budget",
    ));
    assert!(
        err.contains("cluster.toml") && err.contains("colour") && err.contains("line 15"),
        "{err}"
    );

    let err = apply(&good.replace("model.gguf", "absent.gguf"));
    assert!(
        err.contains("device 'desktop': model file") && err.contains("absent.gguf"),
        "{err}"
    );

    let err = apply(&good.replace("windows = [10, 10, 10]", "windows = [10, 10]"));
    assert!(
        err.contains("policy.windows: 2 window sizes for 3 devices"),
        "{err}"
    );
}

/// A device that is off (nobody listens at its address: port 1 on loopback refuses at
/// once) stops nothing: the ring runs on the devices that answer, and a line names it.
#[test]
fn a_device_that_is_off_is_named_and_the_others_run_the_prompt() {
    let Some(model) = smollm2() else { return };
    let scratch = Scratch::new("off");
    scratch.link_model(&model, "model.gguf");
    let text = three_local("scheduler = \"manual\"\nwindows = [10, 10, 10]").replace(
        "name = \"tablet\"\nlocal = true",
        "name = \"tablet\"\naddress = \"127.0.0.1:1\"",
    );
    let manifest = scratch.manifest(&text);
    let out = prima(&[
        "apply",
        manifest.to_str().unwrap(),
        "--prompt",
        "hi",
        "-n",
        "2",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("device 'tablet' (127.0.0.1:1) did not join"),
        "{err}"
    );
    assert!(err.contains("ring of 2 connected"), "{err}");
    assert!(!out.stdout.is_empty(), "{err}");
    assert!(
        scratch.processes_left().is_empty(),
        "{:?}",
        scratch.processes_left()
    );

    // Planned by Halda, the dry run asks every device for its profile: the one that is
    // off is listed as absent, with why, and the plan is made over the others.
    let text = three_local("scheduler = \"halda\"").replace(
        "name = \"tablet\"\nlocal = true",
        "name = \"tablet\"\naddress = \"127.0.0.1:1\"",
    );
    let manifest = scratch.manifest(&text);
    let out = prima(&["apply", manifest.to_str().unwrap(), "--dry-run", "--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("absent    tablet (127.0.0.1:1): ")),
        "{err}"
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tablet = plan["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "tablet")
        .cloned()
        .unwrap();
    assert_eq!(tablet["absent"], true, "{plan}");
    assert_eq!(tablet["layers"], 0, "{plan}");
    assert!(scratch.processes_left().is_empty());
}

#[test]
fn a_device_with_another_model_is_refused_by_name() {
    let Some(model) = smollm2() else { return };
    let Some(other) = model_or_skip(derived_models().join("smollm2-135m-q8_0.gguf")) else {
        return;
    };
    let scratch = Scratch::new("mismatch");
    scratch.link_model(&model, "model.gguf");
    scratch.link_model(&other, "other.gguf");
    let text = three_local("scheduler = \"manual\"\nwindows = [10, 10, 10]").replace(
        "path = \"model.gguf\"",
        "path = \"model.gguf\"\npaths = { tablet = \"other.gguf\" }",
    );
    let manifest = scratch.manifest(&text);
    let out = prima(&[
        "apply",
        manifest.to_str().unwrap(),
        "--prompt",
        "hi",
        "-n",
        "2",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("device 'tablet'") && err.contains("model mismatch"),
        "{err}"
    );
    assert!(
        scratch.processes_left().is_empty(),
        "{:?}",
        scratch.processes_left()
    );
}

/// `name on ADDR (pid N)` lines of apply's stderr, as (verb, name, pid).
fn node_lines(stderr: &str) -> Vec<(String, String, u32)> {
    stderr
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let verb = words.next()?;
            if verb != "started" && verb != "reused" {
                return None;
            }
            let name = words.next()?.to_string();
            let pid = l
                .rsplit("(pid ")
                .next()?
                .trim_end_matches(')')
                .parse()
                .ok()?;
            Some((verb.to_string(), name, pid))
        })
        .collect()
}

#[test]
fn kept_nodes_are_reused_when_their_configuration_is_unchanged() {
    let Some(model) = smollm2() else { return };
    let scratch = Scratch::new("keep");
    scratch.link_model(&model, "model.gguf");
    let text = three_local("scheduler = \"manual\"\nwindows = [10, 10, 10]");
    let manifest = scratch.manifest(&text);
    let m = manifest.to_str().unwrap();

    let first = prima(&["apply", m, "--dry-run", "--keep-nodes"]);
    let first = node_lines(&String::from_utf8_lossy(&first.stderr));
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(first.iter().all(|(verb, _, _)| verb == "started"));
    assert_eq!(scratch.processes_left().len(), 2, "kept running");

    // Edit one device: the other node is reused, the edited one restarted.
    scratch.manifest(&text.replace(
        "threads = 1\n\n[policy]",
        "threads = 1\nmem_budget = \"30M\"\n\n[policy]",
    ));
    let second = prima(&["apply", m, "--dry-run", "--keep-nodes"]);
    let second = node_lines(&String::from_utf8_lossy(&second.stderr));
    let find = |lines: &[(String, String, u32)], name: &str| {
        lines.iter().find(|(_, n, _)| n == name).cloned().unwrap()
    };
    let (verb, _, pid) = find(&second, "laptop");
    assert_eq!((verb.as_str(), pid), ("reused", find(&first, "laptop").2));
    let (verb, _, pid) = find(&second, "tablet");
    assert_eq!(verb, "started");
    assert_ne!(pid, find(&first, "tablet").2);
    assert_eq!(
        scratch.processes_left().len(),
        2,
        "the old tablet node was stopped"
    );

    // Without --keep-nodes, apply stops every node when it exits, reused ones included.
    let last = prima(&["apply", m, "--dry-run"]);
    let last = node_lines(&String::from_utf8_lossy(&last.stderr));
    assert!(last.iter().all(|(verb, _, _)| verb == "reused"), "{last:?}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !scratch.processes_left().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        scratch.processes_left().is_empty(),
        "{:?}",
        scratch.processes_left()
    );
}

/// `prima status` lists the nodes `--keep-nodes` left running, `prima stop MANIFEST`
/// stops them.
#[test]
fn kept_nodes_are_listed_by_status_and_stopped_by_stop() {
    let Some(model) = smollm2() else { return };
    let scratch = Scratch::new("status");
    scratch.link_model(&model, "model.gguf");
    let manifest = scratch.manifest(&three_local(
        "scheduler = \"manual\"\nwindows = [10, 10, 10]",
    ));
    let m = manifest.to_str().unwrap();
    let kept = prima(&["apply", m, "--dry-run", "--keep-nodes"]);
    let kept = node_lines(&String::from_utf8_lossy(&kept.stderr));
    assert_eq!(kept.len(), 2, "{kept:?}");

    let status = prima(&["status"]);
    assert!(status.status.success());
    let listed = String::from_utf8_lossy(&status.stdout).into_owned();
    for (_, name, pid) in &kept {
        assert!(
            listed
                .lines()
                .any(|l| l.trim_start().starts_with(name.as_str())
                    && l.split_whitespace().nth(2) == Some(&pid.to_string())
                    && l.contains("running")),
            "{listed}"
        );
    }

    let stop = prima(&["stop", m]);
    let said = String::from_utf8_lossy(&stop.stderr).into_owned();
    assert!(stop.status.success(), "{said}");
    for (_, name, pid) in &kept {
        assert!(
            said.contains(&format!("stopped   {name} ")) && said.contains(&format!("(pid {pid})")),
            "{said}"
        );
    }
    assert!(
        scratch.processes_left().is_empty(),
        "{:?}",
        scratch.processes_left()
    );
}

/// An applied plan is kept per cluster: a dry run of the edited manifest prints what
/// changed against it, another manifest file of the same cluster compares with it too,
/// and `prima status` shows where the layers run and the TPOT measured.
#[test]
fn dry_runs_show_changes_against_the_applied_plan_and_status_shows_it() {
    let Some(model) = smollm2() else { return };
    let scratch = Scratch::new("diff");
    scratch.link_model(&model, "model.gguf");
    let manifest = scratch.manifest(&three_local(
        "scheduler = \"manual\"\nwindows = [10, 10, 10]",
    ));
    let m = manifest.to_str().unwrap();
    let applied = prima(&["apply", m, "--prompt", "Hi", "-n", "4", "--temp", "0"]);
    let said = String::from_utf8_lossy(&applied.stderr).into_owned();
    assert!(applied.status.success(), "{said}");

    let same = prima(&["apply", m, "--dry-run"]);
    let said = String::from_utf8_lossy(&same.stderr).into_owned();
    assert!(
        said.contains("unchanged against the plan applied"),
        "{said}"
    );

    // The same cluster (its [cluster] name) from another file, one device fewer and
    // other windows.
    let text = std::fs::read_to_string(&manifest).unwrap();
    let edited = text
        .replace("windows = [10, 10, 10]", "windows = [20, 10]")
        .replace(
            "[[device]]\nname = \"tablet\"\nlocal = true\nthreads = 1\n",
            "",
        );
    let other = scratch.dir.join("smaller.toml");
    std::fs::write(&other, edited).unwrap();
    let changed = prima(&["apply", other.to_str().unwrap(), "--dry-run"]);
    let said = String::from_utf8_lossy(&changed.stderr).into_owned();
    assert!(changed.status.success(), "{said}");
    assert!(said.contains("changes against the plan applied"), "{said}");
    for line in [
        "moved     desktop: layers 10 → 20, window 10 → 20",
        "removed   tablet (had 10 layers)",
    ] {
        assert!(said.contains(line), "{line}: {said}");
    }
    let json = prima(&["apply", other.to_str().unwrap(), "--dry-run", "--json"]);
    let plan: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(plan["changes"].as_array().map(Vec::len), Some(2), "{plan}");

    let status = prima(&["status"]);
    let listed = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(status.status.success(), "{listed}");
    let name = scratch
        .dir
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(listed.contains(&format!("cluster {name}")), "{listed}");
    assert!(
        listed.contains("ring: desktop 10 layers, laptop 10 layers, tablet 10 layers"),
        "{listed}"
    );
    assert!(listed.contains("last measured"), "{listed}");
}

mod server_support;

#[test]
fn apply_serves_the_openai_api_over_the_ring_and_stops_cleanly() {
    let Some(model) = smollm2() else { return };
    let scratch = Scratch::new("serve");
    scratch.link_model(&model, "model.gguf");
    let text = three_local("scheduler = \"manual\"\nwindows = [10, 10, 10]")
        + "\n[server]\nlisten = \"127.0.0.1:0\"\n";
    let manifest = scratch.manifest(&text);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prima"));
    cmd.env("PRIMA_STATE_DIR", state_dir());
    cmd.args(["apply", manifest.to_str().unwrap()]);
    let mut server = server_support::Server::spawn(cmd);
    let (status, reply) = server.post_json(
        "/v1/chat/completions",
        &serde_json::json!({
            "model": "model",
            "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 8,
            "temperature": 0
        }),
    );
    assert_eq!(status, 200, "{reply}");
    let content = reply["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!content.is_empty(), "{reply}");
    // Each device's compute time reaches the metrics after the request.
    let series = "prima_device_compute_microseconds_total{device=\"tablet\"}";
    assert!(server.wait_for_metric(series, 1.0) > 0.0, "{series}");
    assert_eq!(
        scratch.processes_left().len(),
        2,
        "two local nodes while serving"
    );

    let (exit, lines) = server.interrupt();
    assert!(exit.success(), "{exit}: {lines:?}");
    assert!(
        lines.iter().any(|l| l.contains("serve: stopped")),
        "{lines:?}"
    );
    assert!(
        scratch.processes_left().is_empty(),
        "{:?}",
        scratch.processes_left()
    );
}

/// Each device's GPU layers (`gpu_backend`, `gpu_layers`; a second CPU backend instance
/// stands in for the GPU) reach the head and, through the ring's setup, the nodes: the
/// plan shows them and the text is still exactly one device's.
#[test]
fn apply_runs_each_devices_gpu_layers() {
    let Some(model) = smollm2() else { return };
    let scratch = Scratch::new("gpu-layers");
    scratch.link_model(&model, "model.gguf");
    let mut text = three_local("scheduler = \"manual\"\nwindows = [4, 3, 3]");
    for (name, n) in [("desktop", 2), ("laptop", 1), ("tablet", 3)] {
        text = text.replace(
            &format!("name = \"{name}\"\n"),
            &format!("name = \"{name}\"\ngpu_backend = \"cpu\"\ngpu_layers = {n}\n"),
        );
    }
    let manifest = scratch.manifest(&text);
    let prompt = "The three primary colours are";
    let out = prima(&[
        "apply",
        manifest.to_str().unwrap(),
        "--prompt",
        prompt,
        "-n",
        "12",
        "--temp",
        "0",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for (name, w, n) in [("desktop", 4, 2), ("laptop", 3, 1), ("tablet", 3, 3)] {
        let row = stderr
            .lines()
            .find(|l| l.trim_start().starts_with(name) && l.contains('%'))
            .unwrap_or_else(|| panic!("no plan row for {name}: {stderr}"));
        // … layers share window GPU: counted on from the share column.
        let cols: Vec<&str> = row.split_whitespace().collect();
        let share = cols.iter().position(|c| c.ends_with('%')).unwrap();
        assert_eq!(
            (cols[share + 1], cols[share + 2]),
            (w.to_string().as_str(), n.to_string().as_str()),
            "{row}"
        );
    }
    let single = prima(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        prompt,
        "-n",
        "12",
        "--temp",
        "0",
        "-t",
        "1",
        "-c",
        "256",
    ]);
    assert!(single.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&single.stdout),
        "the ring with GPU layers generates what one device generates"
    );
    assert!(
        scratch.processes_left().is_empty(),
        "{:?}",
        scratch.processes_left()
    );
}

/// Halda plans with the links the head timed: every device of a live ring gets a hop
/// time (the head's pings to each node; a star model for the hops between nodes).
#[test]
fn halda_plans_with_the_links_the_head_timed() {
    let Some(model) = smollm2() else { return };
    let scratch = Scratch::new("links");
    scratch.link_model(&model, "model.gguf");
    let manifest = scratch.manifest(&three_local("scheduler = \"halda\""));
    let out = prima(&["apply", manifest.to_str().unwrap(), "--dry-run", "--json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for d in plan["devices"].as_array().unwrap() {
        let hop = d["hop_ms"].as_f64();
        assert!(hop.is_some_and(|t| t > 0.0 && t < 1000.0), "{d}");
    }
    assert!(scratch.processes_left().is_empty());
}

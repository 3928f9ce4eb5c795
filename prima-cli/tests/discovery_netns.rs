//! Discovery across network namespaces joined by a bridge, as devices on one LAN:
//! two `prima node --advertise --cluster home` and one in cluster "other", each in its
//! own namespace; from a fourth, `prima discover --cluster home` finds the two and lists
//! the third as ignored (other cluster), and `prima apply` with `[discovery]` finds its
//! remote devices by name and generates text through them.
//!
//! It needs root, iproute2, SmolLM2 (`cargo xtask setup`) and a release build with the
//! plugins (`cargo build --release --workspace`), so it is `#[ignore]`d: `cargo xtask
//! test` runs it with `--ignored` where it can and otherwise reports it skipped. Its
//! namespaces are `prima-dc-*`, apart from the home lab's `prima-hl-*`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const PRIMA: &str = env!("CARGO_BIN_EXE_prima");
const PREFIX: &str = "prima-dc-";
/// The namespace holding the bridge, the LAN every device's veth plugs into.
const LAN: &str = "prima-dc-lan";
const MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// The namespaces, bridge and processes of one run; dropping it removes them all.
struct Lan {
    devices: Vec<String>,
    nodes: Vec<Child>,
    logs: PathBuf,
}

impl Lan {
    /// A bridge in `LAN` and one namespace per device, device i at 10.88.0.(i + 1)/24,
    /// IPv4 only, with multicast routed out of its LAN interface.
    fn up(devices: &[&str]) -> Lan {
        remove_leftovers();
        let logs = std::env::temp_dir().join("prima-dc-logs");
        std::fs::create_dir_all(&logs).unwrap();
        // The cluster key every device of the test's ring holds.
        let key = logs.join("cluster.key");
        let _ = std::fs::remove_file(&key);
        prima_cluster::prp::key::ClusterKey::generate()
            .write_new(&key)
            .unwrap();
        let lan = Lan {
            devices: devices.iter().map(|d| format!("{PREFIX}{d}")).collect(),
            nodes: Vec::new(),
            logs,
        };
        ip(&["netns", "add", LAN]);
        ip(&["-n", LAN, "link", "add", "br0", "type", "bridge"]);
        // No IGMP snooping: nothing on this LAN answers IGMP queries.
        ip(&[
            "-n",
            LAN,
            "link",
            "set",
            "br0",
            "type",
            "bridge",
            "mcast_snooping",
            "0",
        ]);
        ip(&["-n", LAN, "link", "set", "br0", "up"]);
        for (i, ns) in lan.devices.iter().enumerate() {
            ip(&["netns", "add", ns]);
            let port = format!("port{i}");
            ip(&[
                "-n", LAN, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                ns,
            ]);
            ip(&["-n", LAN, "link", "set", &port, "master", "br0", "up"]);
            let sysctl = ["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"];
            let status = Command::new("ip")
                .args(["netns", "exec", ns])
                .args(sysctl)
                .status()
                .unwrap();
            assert!(status.success(), "sysctl in {ns}");
            let cidr = format!("10.88.0.{}/24", i + 1);
            ip(&["-n", ns, "addr", "add", &cidr, "dev", "eth0"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            ip(&["-n", ns, "link", "set", "eth0", "multicast", "on", "up"]);
            ip(&["-n", ns, "route", "add", "224.0.0.0/4", "dev", "eth0"]);
        }
        lan
    }

    fn namespace(&self, device: &str) -> String {
        format!("{PREFIX}{device}")
    }

    /// Starts `prima node --advertise` in `device`'s namespace and waits until it says it
    /// is advertising.
    fn start_node(&mut self, device: &str, cluster: &str) {
        let log = self.logs.join(format!("{device}.log"));
        let child = Command::new("ip")
            .args(["netns", "exec", &self.namespace(device), PRIMA, "node"])
            .args([
                "--listen",
                "0.0.0.0:9000",
                "--model",
                MODEL,
                "--threads",
                "1",
            ])
            .args(["--advertise", "--cluster", cluster, "--name", device])
            .arg("--key-file")
            .arg(self.logs.join("cluster.key"))
            .current_dir(workspace())
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .expect("starting prima node");
        self.nodes.push(child);
        // A readiness wait, not a timing check: a node that never says so fails here.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("node: advertising") {
                eprintln!("{device}: {}", text.trim());
                return;
            }
            let node = self.nodes.last_mut().unwrap();
            if let Some(status) = node.try_wait().unwrap() {
                panic!("prima node in {device} exited ({status}): {text}");
            }
            assert!(
                Instant::now() < deadline,
                "prima node in {device} did not start advertising: {text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `prima ARGS` in `device`'s namespace.
    fn prima(&self, device: &str, args: &[&str]) -> Output {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.namespace(device), PRIMA])
            .args(args)
            .current_dir(workspace())
            .output()
            .expect("running prima");
        eprintln!(
            "$ prima {}   (in {})\n{}{}",
            args.join(" "),
            self.namespace(device),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.kill();
            let _ = node.wait();
        }
        remove_leftovers();
    }
}

/// Deletes every `prima-dc-*` namespace (their veths go with them), after killing what
/// still runs inside.
fn remove_leftovers() {
    let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
    for ns in String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(PREFIX))
    {
        let pids = Command::new("ip")
            .args(["netns", "pids", ns])
            .output()
            .unwrap();
        for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
        let _ = Command::new("ip").args(["netns", "delete", ns]).status();
    }
}

fn require_a_machine_that_can() {
    // SAFETY: geteuid only reads the process's effective user id.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "creating network namespaces needs root");
    assert!(
        Command::new("ip")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success()),
        "`ip` is not on PATH (apt-get install iproute2)"
    );
    assert!(
        workspace().join(MODEL).exists(),
        "{MODEL} is missing (cargo xtask setup)"
    );
    let release = Path::new(PRIMA).parent().unwrap();
    for plugin in ["libprima_transport_tcp.so", "libprima_backend_cpu.so"] {
        assert!(
            release.join(plugin).exists(),
            "{} is missing (cargo build --release --workspace)",
            release.join(plugin).display()
        );
    }
}

/// `prima discover --json` in `device`, until it has seen `want_found` nodes and
/// `want_ignored` others (mDNS answers can miss one search; three are allowed).
fn discover(lan: &Lan, device: &str, want_found: usize, want_ignored: usize) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    for _ in 0..3 {
        let out = lan.prima(
            device,
            &["discover", "--cluster", "home", "--timeout", "3", "--json"],
        );
        assert!(out.status.success(), "prima discover failed");
        last = serde_json::from_slice(&out.stdout).expect("prima discover --json output");
        let count = |key: &str| last[key].as_array().map_or(0, |a| a.len());
        if count("found") >= want_found && count("ignored") >= want_ignored {
            break;
        }
    }
    last
}

#[test]
#[ignore = "needs root and network namespaces: cargo xtask test runs it"]
fn discovery_finds_its_cluster_across_namespaces_and_says_why_not_the_others() {
    require_a_machine_that_can();
    let mut lan = Lan::up(&["desk", "laptop", "phone", "head"]);
    lan.start_node("desk", "home");
    lan.start_node("laptop", "home");
    lan.start_node("phone", "other");

    let seen = discover(&lan, "head", 2, 1);
    let found: Vec<(String, String)> = seen["found"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap().to_string(),
                n["address"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            ("desk".to_string(), "10.88.0.1:9000".to_string()),
            ("laptop".to_string(), "10.88.0.2:9000".to_string()),
        ]
    );
    let ignored = seen["ignored"].as_array().unwrap();
    assert_eq!(ignored.len(), 1, "{seen}");
    assert_eq!(ignored[0]["name"], "phone");
    assert_eq!(ignored[0]["address"], "10.88.0.3:9000");
    assert_eq!(
        ignored[0]["reason"],
        "other cluster \"other\" (looking for \"home\")"
    );
    // The table a person reads, for the transcript.
    let table = lan.prima("head", &["discover", "--cluster", "home", "--timeout", "3"]);
    assert!(table.status.success());

    // A manifest whose remote devices have no address: found by name, then a ring.
    let manifest = lan.logs.join("discovered.toml");
    std::fs::write(
        &manifest,
        format!(
            r#"
[model]
path = "{}"

[[device]]
name = "head"
head = true
local = true
threads = 1

[[device]]
name = "desk"

[[device]]
name = "laptop"

[policy]
scheduler = "manual"
windows = [10, 10, 10]
ctx = 256

[discovery]
cluster = "home"
timeout = "3s"

[security]
key_file = "cluster.key"
"#,
            workspace().join(MODEL).display()
        ),
    )
    .unwrap();
    let manifest = manifest.to_str().unwrap();
    let mut applied = None;
    for _ in 0..3 {
        let out = lan.prima(
            "head",
            &[
                "apply",
                manifest,
                "--prompt",
                "The capital of France is",
                "-n",
                "8",
                "--temp",
                "0",
            ],
        );
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        // Only a missed mDNS answer is worth another try.
        if out.status.success() || !stderr.contains("did not find it") {
            applied = Some(out);
            break;
        }
    }
    let out = applied.expect("discovery missed a node three times");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "prima apply failed: {stderr}");
    assert!(
        stderr.contains("found     desk at 10.88.0.1:9000 (discovery)")
            && stderr.contains("found     laptop at 10.88.0.2:9000 (discovery)"),
        "{stderr}"
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).trim().is_empty(),
        "no text generated"
    );

    // A device nobody announces is an error that names it and what was seen.
    std::fs::write(
        lan.logs.join("missing.toml"),
        std::fs::read_to_string(manifest)
            .unwrap()
            .replace("name = \"laptop\"", "name = \"tablet\""),
    )
    .unwrap();
    let missing = lan.logs.join("missing.toml");
    let out = lan.prima("head", &["apply", missing.to_str().unwrap(), "--dry-run"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(
            "device 'tablet' has no `address` and discovery (cluster \"home\", 3s) did not find it"
        ) && stderr.contains("desk at 10.88.0.1:9000")
            && stderr.contains("phone at 10.88.0.3:9000 ignored: other cluster"),
        "{stderr}"
    );

    // SIGTERM withdraws the announcement and ends the node cleanly.
    let desk = &mut lan.nodes[0];
    // SAFETY: kill only sends a signal, to the node this test started.
    unsafe { libc::kill(desk.id() as libc::pid_t, libc::SIGTERM) };
    let status = desk.wait().unwrap();
    assert!(status.success(), "node desk ended with {status} on SIGTERM");
}

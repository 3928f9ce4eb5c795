//! A ring across two networks that cannot reach each other, joined only by a relay:
//! network namespaces A (the head, a node) and B (a node), and R with a veth leg in
//! each and no forwarding; C, a node one veth away from A, gives the direct hop to
//! compare with. The ring spans both networks through `prima relay` and generates
//! exactly what one device generates; the relay's CPU time and the time per hop,
//! relayed and direct, are printed (medians over the generated tokens).
//!
//! Needs root and iproute2, so it is `#[ignore]`d: `cargo xtask test` runs it where it
//! can (`xtask/src/test.rs`) and reports it SKIPPED otherwise.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const PROMPT: &str = "The capital of France is";

fn prima() -> &'static str {
    env!("CARGO_BIN_EXE_prima")
}

fn model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models")
        .join(MODEL)
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("cannot run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The namespaces, veths and processes of one run; all removed on drop.
struct Bed {
    tag: String,
    children: Vec<Child>,
    dir: PathBuf,
    /// The cluster key of the ring: its links are sealed end to end, through the relay.
    key: PathBuf,
}

impl Bed {
    fn ns(&self, which: &str) -> String {
        format!("prima-rl-{which}-{}", self.tag)
    }

    /// A (10.91.1.1) ─ R (10.91.1.2 | 10.91.2.2) ─ B (10.91.2.1); A (10.91.3.1) ─ C (10.91.3.2).
    fn up() -> Bed {
        let tag = std::process::id().to_string();
        let dir = std::env::temp_dir().join(format!("prima-two-lans-{tag}"));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("cluster.key");
        let _ = std::fs::remove_file(&key);
        prima_cluster::prp::key::ClusterKey::generate()
            .write_new(&key)
            .unwrap();
        let bed = Bed {
            tag,
            children: Vec::new(),
            dir,
            key,
        };
        for n in ["a", "b", "r", "c"] {
            ip(&["netns", "add", &bed.ns(n)]);
            ip(&["-n", &bed.ns(n), "link", "set", "lo", "up"]);
        }
        let t = &bed.tag;
        let link = |x: &str, nx: &str, ax: &str, y: &str, ny: &str, ay: &str| {
            let (vx, vy) = (format!("prl{x}{t}"), format!("prl{y}{t}"));
            ip(&["link", "add", &vx, "type", "veth", "peer", "name", &vy]);
            for (v, n, a) in [(&vx, nx, ax), (&vy, ny, ay)] {
                ip(&["link", "set", v, "netns", &bed.ns(n)]);
                ip(&["-n", &bed.ns(n), "addr", "add", a, "dev", v]);
                ip(&["-n", &bed.ns(n), "link", "set", v, "up"]);
            }
        };
        link("a", "a", "10.91.1.1/24", "x", "r", "10.91.1.2/24");
        link("b", "b", "10.91.2.1/24", "y", "r", "10.91.2.2/24");
        link("c", "a", "10.91.3.1/24", "z", "c", "10.91.3.2/24");
        bed
    }

    fn exec(&self, ns: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns(ns)]).args(args);
        cmd
    }

    /// Starts `prima ARGS` in `ns`, logging to `name`.log; waits for `ready` in the log.
    fn start(&mut self, ns: &str, name: &str, args: &[&str], ready: &str) -> u32 {
        let log = self.dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let mut full = vec![prima()];
        full.extend_from_slice(args);
        let child = self
            .exec(ns, &full)
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        let pid = child.id();
        self.children.push(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains(ready) {
                return pid;
            }
            assert!(Instant::now() < deadline, "{name} did not start: {text}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn node(&mut self, ns: &str, name: &str, listen: &str) {
        let m = model();
        let key = self.key.clone();
        self.start(
            ns,
            name,
            &[
                "node",
                "--listen",
                listen,
                "-m",
                m.to_str().unwrap(),
                "-t",
                "1",
                "--transport",
                "vpn-proxy",
                "--key-file",
                key.to_str().unwrap(),
            ],
            "node: listening",
        );
    }

    /// `prima apply` in A on a manifest of these devices, plus the relay.
    fn apply(&self, name: &str, devices: &str, windows: &str, n: usize) -> (Output, PathBuf) {
        let manifest = self.dir.join(format!("{name}.toml"));
        let text = format!(
            r#"[model]
path = "{model}"

[[device]]
name = "desk"
head = true
network = "lan-a"
{head_address}threads = 1
{devices}
[[device]]
name = "router"
relay = {{ lan-a = "10.91.1.2:9100", lan-b = "10.91.2.2:9100" }}

[policy]
scheduler = "manual"
windows = {windows}
ctx = 256

[security]
key_file = "{key}"
"#,
            key = self.key.display(),
            model = model().display(),
            // Where the last device reaches the head through the relay; a ring on one
            // network has the head listen everywhere (C reaches it on another address).
            head_address = if devices.contains("lan-b") {
                "address = \"10.91.1.1:0\"\n"
            } else {
                ""
            }
        );
        std::fs::write(&manifest, text).unwrap();
        let stats = self.dir.join(format!("{name}.json"));
        let out = self
            .exec(
                "a",
                &[
                    prima(),
                    "apply",
                    manifest.to_str().unwrap(),
                    "--temp",
                    "0",
                    "-p",
                    PROMPT,
                    "-n",
                    &n.to_string(),
                    "--stats-json",
                    stats.to_str().unwrap(),
                ],
            )
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "apply {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (out, stats)
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in ["a", "b", "r", "c"] {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(n)])
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// utime + stime of a process, in milliseconds.
fn cpu_ms(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf only reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks * 1000.0 / hz
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Per generated token of a two-device ring: from the head's send to the frame's return,
/// less the node's compute, halved — the time of one hop (both hops of the ring are
/// alike). The node's send is part of its hop; on a loaded machine a send may also hold
/// the time the sender waits for a core once it has woken the receiver.
fn hop_ms(stats: &Path) -> f64 {
    let all: serde_json::Value = serde_json::from_slice(&std::fs::read(stats).unwrap()).unwrap();
    let devices = all.as_array().unwrap();
    assert_eq!(devices.len(), 2, "a two-device ring");
    let one_token = |d: &serde_json::Value| -> Vec<(u64, f64, f64, f64)> {
        d["passes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["n_tokens"] == 1)
            .map(|p| {
                (
                    p["seq"].as_u64().unwrap(),
                    p["send_ms"].as_f64().unwrap() + p["wait_ms"].as_f64().unwrap(),
                    p["compute_ms"].as_f64().unwrap(),
                    p["send_ms"].as_f64().unwrap(),
                )
            })
            .collect()
    };
    let head = one_token(&devices[0]);
    let node = one_token(&devices[1]);
    let hops: Vec<f64> = head
        .iter()
        .filter_map(|&(seq, round_trip, _, _)| {
            let &(_, _, compute, _) = node.iter().find(|p| p.0 == seq)?;
            Some((round_trip - compute) / 2.0)
        })
        .collect();
    assert!(hops.len() > 8, "too few tokens measured: {}", hops.len());
    median(hops)
}

#[test]
#[ignore = "needs root and iproute2: cargo xtask test runs it where it can"]
fn a_ring_spans_two_networks_through_a_relay() {
    assert!(
        model().exists(),
        "{} missing: cargo xtask fetch-models",
        model().display()
    );
    let mut bed = Bed::up();
    // A cannot reach B: no route, so even B's open port cannot be connected to.
    let route = bed
        .exec("a", &["ip", "route", "get", "10.91.2.1"])
        .output()
        .unwrap();
    assert!(!route.status.success(), "A has a route to B");

    let relay = bed.start(
        "r",
        "relay",
        &[
            "relay",
            "--listen",
            "10.91.1.2:9100",
            "--listen",
            "10.91.2.2:9100",
        ],
        "relay: vpn-proxy",
    );
    bed.node("b", "attic", "10.91.2.1:9000");
    bed.node("a", "laptop", "10.91.1.1:9001");
    bed.node("c", "shed", "10.91.3.2:9002");
    let reach = bed
        .exec("a", &["bash", "-c", "exec 3<>/dev/tcp/10.91.2.1/9000"])
        .output()
        .unwrap();
    assert!(
        !reach.status.success(),
        "A reached B's node without the relay"
    );

    let single = Command::new(prima())
        .args([
            "run",
            "-m",
            model().to_str().unwrap(),
            "-p",
            PROMPT,
            "-n",
            "48",
        ])
        .args(["--temp", "0", "-t", "1", "-c", "256"])
        .output()
        .unwrap();
    assert!(single.status.success());
    let expected = String::from_utf8_lossy(&single.stdout).to_string();

    // Head and laptop in A, attic in B: the ring crosses to B and back through R.
    let attic = "[[device]]\nname = \"attic\"\naddress = \"10.91.2.1:9000\"\nnetwork = \"lan-b\"\n";
    let laptop = "[[device]]\nname = \"laptop\"\naddress = \"10.91.1.1:9001\"\n";
    let (out, _) = bed.apply("three", &format!("{attic}{laptop}"), "[10, 10, 10, 0]", 48);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(stderr.contains("relay lan-a<->lan-b"), "{stderr}");
    assert!(stderr.contains("ring of 3 devices"), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        expected,
        "the ring across two networks generates what one device generates"
    );

    // Two-device rings, alike but for the link: B through the relay, C over one veth.
    let n = 128;
    let before = cpu_ms(relay);
    let (relayed, relayed_stats) = bed.apply("relayed", attic, "[15, 15, 0]", n);
    let relay_cpu = cpu_ms(relay) - before;
    let shed = "[[device]]\nname = \"shed\"\naddress = \"10.91.3.2:9002\"\n";
    let (direct, direct_stats) = bed.apply("direct", shed, "[15, 15, 0]", n);
    let direct_err = String::from_utf8_lossy(&direct.stderr);
    assert!(
        direct_err.contains("pruned: no route of the ring needs it"),
        "an unneeded relay is pruned: {direct_err}"
    );
    assert_eq!(relayed.stdout, direct.stdout);
    let (hop_relayed, hop_direct) = (hop_ms(&relayed_stats), hop_ms(&direct_stats));
    eprintln!(
        "relay CPU: {relay_cpu:.0} ms over {n} tokens ({:.3} ms a token)",
        relay_cpu / n as f64
    );
    eprintln!(
        "per hop (median over {n} tokens): relayed {hop_relayed:.3} ms, direct {hop_direct:.3} ms, added by the relay {:.3} ms",
        hop_relayed - hop_direct
    );
}

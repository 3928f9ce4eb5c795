//! A lost device costs no request: `prima apply` serving a three-device ring on loopback
//! (the head and two `prima node` processes at fixed addresses), one node killed (or
//! frozen) in the middle of a greedy generation. The request must finish with exactly
//! the text of an undisturbed run, the server must answer the next request, and a node
//! that restarts at its address is planned back in between requests. A sampled request
//! goes on from the same RNG state; a head left alone goes on alone where it holds the
//! model. Where the devices left cannot hold the model, the request fails with a clear
//! error and the server stays up. A device off when the cluster comes up is planned in
//! when its node starts. Also: replaying a context in one batch gives the bits its token-by-token
//! evaluation gave, which is what lets the failover replay in one call.

mod common;
mod server_support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::cpu_backend;
use prima_core::model::{Model, Session};
use serde_json::{json, Value};
use server_support::{smollm2, Server};

/// A `prima node` at a fixed loopback address, which it can be restarted at.
struct Node {
    child: Child,
    addr: String,
    model: PathBuf,
}

impl Node {
    fn start(model: &Path) -> Node {
        // A free port now; the node binds it a moment later (and again on restart).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        Node {
            child: spawn_node(model, &addr),
            addr,
            model: model.to_path_buf(),
        }
    }

    fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {sig}");
    }

    /// SIGKILL, and wait for it to be gone.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// A new node process at the same address.
    fn restart(&mut self) {
        self.kill();
        self.child = spawn_node(&self.model, &self.addr);
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // SIGKILL ends a frozen node too.
        self.kill();
    }
}

/// Starts `prima node` at `addr` and waits for it to listen.
fn spawn_node(model: &Path, addr: &str) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_prima"))
        .args(["node", "--listen", addr, "-t", "1", "-m"])
        .arg(model)
        .arg("--key-file")
        .arg(&common::test_key().0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start prima node");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.starts_with("node: listening on ") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the node prints its address");
    child
}

/// A device's pinned profile: `ram_gib` of memory (SmolLM2 has 94 MiB of weights) and
/// `gflops` for the quantized weights.
fn profile(name: &str, ram_gib: f64, gflops: f64) -> String {
    format!(
        r#"
[[device]]
name = "{name}"
os = "linux"
cpu_cores = 1
cpu_gflops = {{ q4_k = {gflops}, q5_k = {gflops}, q6_k = {gflops}, q8_0 = {gflops}, f16 = 10, f32 = 5 }}
cpu_read_gb_s = 10
memcpy_gb_s = 5
ram_total_gib = {ram_gib}
ram_available_gib = {ram_gib}
disk_seq_gb_s = 0.5
disk_rand_gb_s = 0.2
link = {{ rtt_ms = 0.1, bytes_per_s = 1.0e9 }}
"#
    )
}

/// A scratch directory with a manifest: the head here, `nodes` remote at their
/// addresses, the profiles pinned (so the plan does not depend on this machine's load).
struct Cluster {
    dir: PathBuf,
    manifest: PathBuf,
}

impl Cluster {
    /// `devices`: name, address (none: the head), memory in GiB, GFLOP/s.
    fn new(tag: &str, model: &Path, devices: &[(&str, Option<&str>, f64, f64)]) -> Cluster {
        let dir = std::env::temp_dir().join(format!("prima-failover-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut manifest = format!("[model]\npath = {:?}\n", model.display().to_string());
        let mut profiles = String::new();
        for (i, (name, addr, ram, gflops)) in devices.iter().enumerate() {
            manifest.push_str(&format!("\n[[device]]\nname = \"{name}\"\nthreads = 1\n"));
            match addr {
                Some(a) => manifest.push_str(&format!("address = \"{a}\"\n")),
                None => {
                    assert_eq!(i, 0);
                    manifest.push_str("head = true\nlocal = true\n");
                }
            }
            profiles.push_str(&profile(name, *ram, *gflops));
        }
        manifest.push_str(
            "\n[policy]\nscheduler = \"halda\"\nprofiles = \"profiles.toml\"\nctx = 512\nbatch = 64\n\n[server]\nlisten = \"127.0.0.1:0\"\n",
        );
        manifest.push_str(&format!(
            "\n[security]\nkey_file = {:?}\n",
            common::test_key().0.display().to_string()
        ));
        std::fs::write(dir.join("profiles.toml"), profiles).unwrap();
        let path = dir.join("cluster.toml");
        std::fs::write(&path, manifest).unwrap();
        Cluster {
            dir,
            manifest: path,
        }
    }

    fn apply(&self) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_prima"));
        cmd.arg("apply").arg(&self.manifest);
        Server::spawn(cmd)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const PROMPT: &str = "Once upon a time, in a small village by the sea,";
const TOKENS: usize = 96;

/// The request: greedy at temperature 0, else sampled with a fixed seed.
fn body(stream: bool, temperature: f64) -> Value {
    json!({
        "prompt": PROMPT,
        "max_tokens": TOKENS,
        "temperature": temperature,
        "seed": 7,
        "ignore_eos": true,
        "stream": stream,
    })
}

/// The whole completion of `body(false, temperature)`.
fn complete(server: &Server, temperature: f64) -> String {
    let (status, v) = server.post_json("/v1/completions", &body(false, temperature));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], TOKENS, "{v}");
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

/// What a streamed request delivered around a disturbance.
struct Disturbed {
    text: String,
    /// An error event, if the stream carried one.
    error: Option<Value>,
    /// The longest wait for a piece of text after the disturbance (from the disturbance
    /// for the first): the stall, from the loss to the first token of the new ring.
    stall: Duration,
    /// Pieces of text received after the disturbance.
    pieces_after: usize,
}

/// Streams `body(true, temperature)` and calls `disturb` once `after` pieces of text
/// have arrived.
fn stream_and_disturb(
    server: &Server,
    temperature: f64,
    after: usize,
    disturb: impl FnOnce(),
) -> Disturbed {
    let r = server_support::post(
        &format!("{}/v1/completions", server.url),
        &body(true, temperature).to_string(),
    )
    .unwrap();
    let mut lines = BufReader::new(server_support::reader(r)).lines();
    let mut out = Disturbed {
        text: String::new(),
        error: None,
        stall: Duration::ZERO,
        pieces_after: 0,
    };
    let mut pieces = 0;
    let mut disturbed_at: Option<Instant> = None;
    let mut disturb = Some(disturb);
    for line in lines.by_ref() {
        let line = line.unwrap();
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        if v.get("error").is_some() {
            out.error = Some(v);
            continue;
        }
        let Some(text) = v["choices"][0]["text"].as_str() else {
            continue;
        };
        out.text.push_str(text);
        pieces += 1;
        if let Some(at) = &mut disturbed_at {
            out.pieces_after += 1;
            out.stall = out.stall.max(at.elapsed());
            *at = Instant::now();
        }
        if pieces == after {
            if let Some(f) = disturb.take() {
                f();
                disturbed_at = Some(Instant::now());
            }
        }
    }
    out
}

/// The head's own figure: "failover: first logits N ms after the loss".
fn head_recovery_ms(lines: &[String]) -> Option<f64> {
    lines.iter().find_map(|l| {
        l.strip_prefix("failover: first logits ")?
            .split(' ')
            .next()?
            .parse()
            .ok()
    })
}

/// Sends small requests until the head has planned `series` in again (bounded).
fn wait_for_readmission(server: &Server, series: &str) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        // Until the device is back this may fail (a ring that cannot hold the model).
        let _ = server.post_json(
            "/v1/completions",
            &json!({"prompt": "Hi", "max_tokens": 1, "temperature": 0}),
        );
        let n = server.metric(series);
        if n >= 1.0 || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Polls `series` until it reads `want` (the server records after it answers; bounded).
fn settled(server: &Server, series: &str, want: f64) -> f64 {
    settled_within(server, series, want, 30)
}

/// [`settled`] within `seconds`.
fn settled_within(server: &Server, series: &str, want: f64, seconds: u64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        let v = server.metric(series);
        if v == want || Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

const LOST: &str = "prima_ring_replans_total{cause=\"device_lost\"}";
const BACK: &str = "prima_ring_replans_total{cause=\"device_back\"}";

/// Runs the three-device scenario at `temperature`, disturbing `victim` (0 or 1) with
/// `how`.
fn survive(tag: &str, victim: usize, how: &str, temperature: f64) {
    let Some(model) = smollm2() else { return };
    let mut nodes = [Node::start(&model), Node::start(&model)];
    let cluster = Cluster::new(
        tag,
        &model,
        &[
            // Equal devices, none of which holds the model alone: a ring of three.
            ("desktop", None, 0.045, 20.0),
            ("laptop", Some(&nodes[0].addr), 0.045, 20.0),
            ("tablet", Some(&nodes[1].addr), 0.045, 20.0),
        ],
    );
    let server = cluster.apply();
    let startup = server.stderr_lines();
    let want = complete(&server, temperature);
    assert_eq!(
        settled(&server, "prima_ring_devices", 3.0),
        3.0,
        "{startup:?}"
    );

    let got = stream_and_disturb(&server, temperature, 8, || match how {
        "kill" => nodes[victim].kill(),
        sig => nodes[victim].signal(sig),
    });
    let replans = settled(&server, LOST, 1.0);
    let log = server.stderr_lines();
    assert!(got.error.is_none(), "{:?}\n{}", got.error, log.join("\n"));
    assert_eq!(
        got.text,
        want,
        "the disturbed run differs:\n{}",
        log.join("\n")
    );
    assert!(
        got.pieces_after > 0,
        "the generation ended before the {how}"
    );
    assert_eq!(replans, 1.0, "{}", log.join("\n"));
    assert_eq!(settled(&server, "prima_ring_devices", 2.0), 2.0);
    let name = ["laptop", "tablet"][victim];
    assert!(
        log.iter()
            .any(|l| l.starts_with(&format!("failover: device '{name}'")) && l.contains("lost")),
        "{}",
        log.join("\n")
    );
    eprintln!(
        "{how}: stall at the client {:.0} ms; head: first logits {:?} ms after the loss was reported",
        got.stall.as_secs_f64() * 1e3,
        head_recovery_ms(&log)
    );

    // The next request, on the ring of two.
    assert_eq!(complete(&server, temperature), want);

    // The node comes back at its address: planned in again between requests.
    nodes[victim].restart();
    assert_eq!(wait_for_readmission(&server, BACK), 1.0);
    assert_eq!(settled(&server, "prima_ring_devices", 3.0), 3.0);
    assert_eq!(complete(&server, temperature), want);
    // What the head said (seen with --nocapture).
    let said: Vec<String> = log.into_iter().chain(server.stderr_lines()).collect();
    eprintln!("{}", said.join("\n"));
}

#[test]
fn a_node_killed_mid_generation_costs_no_token() {
    survive("kill", 1, "kill", 0.0);
}

/// The sampler lives outside the ring: a sampled generation goes on from the same RNG
/// state, so a seeded request is the undisturbed one too.
#[test]
fn a_sampled_generation_survives_a_killed_node_with_the_same_text() {
    survive("sampled", 0, "kill", 0.9);
}

#[test]
fn a_node_frozen_mid_generation_costs_no_token() {
    survive("stop", 0, "-STOP", 0.0);
}

#[test]
fn when_the_devices_left_cannot_hold_the_model_the_request_fails_and_the_server_stays_up() {
    let Some(model) = smollm2() else { return };
    let mut node = Node::start(&model);
    let cluster = Cluster::new(
        "nohold",
        &model,
        &[
            ("desktop", None, 0.05, 20.0),
            ("laptop", Some(&node.addr), 0.2, 20.0),
        ],
    );
    let server = cluster.apply();
    let want = complete(&server, 0.0);

    let got = stream_and_disturb(&server, 0.0, 4, || node.kill());
    let error = got.error.expect("the stream reports the failure");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("device 'laptop' lost, and the devices left cannot hold the model")
            && message.contains("the head 'desktop' alone has"),
        "{error}"
    );
    // Up, and saying the same to the next request.
    assert_eq!(server.get("/v1/models").0, 200);
    let (status, v) = server.post_json("/v1/completions", &body(false, 0.0));
    assert_eq!(status, 500, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("cannot hold the model"),
        "{v}"
    );
    assert!(server.wait_for_metric("prima_ring_no_plan_total", 2.0) >= 2.0);

    // The node comes back: the ring is planned again and answers as before.
    node.restart();
    assert_eq!(wait_for_readmission(&server, BACK), 1.0);
    assert_eq!(complete(&server, 0.0), want);
}

/// A device that is off when the cluster comes up: the ring runs on the others, the
/// head names it, and when a node starts at its address a later request uses it.
#[test]
fn a_device_off_at_start_is_planned_in_when_its_node_starts() {
    let Some(model) = smollm2() else { return };
    let laptop = Node::start(&model);
    // A free port nobody listens on yet.
    let tablet = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let cluster = Cluster::new(
        "off",
        &model,
        &[
            ("desktop", None, 0.045, 20.0),
            ("laptop", Some(&laptop.addr), 0.045, 20.0),
            ("tablet", Some(&tablet), 0.045, 20.0),
        ],
    );
    let server = cluster.apply();
    let want = complete(&server, 0.0);
    let log = server.stderr_lines();
    assert!(
        log.iter()
            .any(|l| l.starts_with(&format!("ring: device 'tablet' ({tablet}) did not join"))),
        "{}",
        log.join("\n")
    );
    assert_eq!(
        settled(&server, "prima_ring_devices", 2.0),
        2.0,
        "{}",
        log.join("\n")
    );

    // The tablet is switched on: planned in while the server is idle, so the very next
    // request runs on three devices.
    let _tablet_node = Node {
        child: spawn_node(&model, &tablet),
        addr: tablet.clone(),
        model: model.clone(),
    };
    assert_eq!(settled_within(&server, BACK, 1.0, 60), 1.0);
    assert_eq!(settled(&server, "prima_ring_devices", 3.0), 3.0);
    assert_eq!(complete(&server, 0.0), want);
    let said = server.stderr_lines();
    assert!(
        said.iter()
            .any(|l| l == "failover: device 'tablet' answers again; planning the ring with it"),
        "{}",
        said.join("\n")
    );
}

#[test]
fn a_head_left_alone_that_holds_the_model_goes_on_alone() {
    let Some(model) = smollm2() else { return };
    let mut node = Node::start(&model);
    let cluster = Cluster::new(
        "alone",
        &model,
        // The head holds the model, but the laptop computes faster: a ring of two.
        &[
            ("desktop", None, 0.2, 5.0),
            ("laptop", Some(&node.addr), 0.2, 40.0),
        ],
    );
    let server = cluster.apply();
    let want = complete(&server, 0.0);
    assert_eq!(settled(&server, "prima_ring_devices", 2.0), 2.0);

    let got = stream_and_disturb(&server, 0.0, 4, || node.kill());
    let replans = settled(&server, LOST, 1.0);
    let log = server.stderr_lines();
    assert!(got.error.is_none(), "{:?}\n{}", got.error, log.join("\n"));
    assert_eq!(got.text, want, "{}", log.join("\n"));
    assert_eq!(replans, 1.0, "{}", log.join("\n"));
    assert_eq!(settled(&server, "prima_ring_devices", 1.0), 1.0);
    assert_eq!(complete(&server, 0.0), want);
}

/// The failover replays a context in one call (batches of n_batch). That is exact only
/// if a batch computes each row as the row evaluated alone: checked here on one device,
/// the logits after the replay against those of the token-by-token run, bit for bit.
#[test]
fn replaying_a_context_in_one_batch_gives_the_same_logits() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let backend = cpu_backend(1);
    let be = &backend.backend;
    let prompt: Vec<u32> = (0..21).map(|i| 100 + 37 * i).collect();

    // Undisturbed: the prompt in batches of 8, then 12 greedy tokens one at a time.
    let mut run = Session::new(&model, be, 256, 8).unwrap();
    let mut tokens = prompt.clone();
    let mut logits = run.eval(&prompt).unwrap().to_vec();
    for _ in 0..12 {
        let next = argmax(&logits);
        tokens.push(next);
        logits = run.eval(&[next]).unwrap().to_vec();
    }
    let last = *tokens.last().unwrap();

    // Replayed: everything but the last token in one call (batches of 8 that cut the
    // context elsewhere), then the last token, as the failover retries it.
    let mut replay = Session::new(&model, be, 256, 8).unwrap();
    replay.eval(&tokens[..tokens.len() - 1]).unwrap();
    let again = replay.eval(&[last]).unwrap().to_vec();
    let same = logits
        .iter()
        .zip(&again)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same, "the replayed cache gives other logits");

    // And with the retried token in the replay's last batch.
    let mut joined = Session::new(&model, be, 256, 8).unwrap();
    let together = joined.eval(&tokens).unwrap().to_vec();
    assert!(
        logits
            .iter()
            .zip(&together)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "a batch's last row differs from the same token evaluated alone"
    );
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

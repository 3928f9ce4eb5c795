//! The ring's links on loopback: with the cluster key a ring computes exactly what one
//! device does and its wire shows none of the activations a plain ring's wire shows; a
//! peer without the key (another key, plain frames, `--insecure` on one side) and a
//! replayed frame are refused, with the reason on both sides.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use abi_stable::std_types::{RSlice, RString};
use common::{cpu_backend, model_or_skip, test_key, test_security, workspace_models};
use prima_cluster::prp::key::{ClusterKey, LinkSecurity};
use prima_cluster::prp::protocol::{decode, encode_control, Control, Frame, Role};
use prima_cluster::prp::{RingHead, RingOptions};
use prima_core::generate::Forward;
use prima_core::model::{Model, Session};
use prima_core::tokenizer::Tokenizer;

const PROMPT: &str = "The secret recipe for grandmother's plum cake starts with";

/// A `prima node` process whose log is kept; killed when dropped.
struct NodeProcess {
    child: Child,
    addr: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl NodeProcess {
    /// A node given the test key (`Some`), or `--insecure` (`None`).
    fn start(model: &Path, key_file: Option<&Path>) -> NodeProcess {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_prima"));
        cmd.args(["node", "--listen", "127.0.0.1:0", "-t", "1", "-m"])
            .arg(model);
        match key_file {
            Some(file) => cmd.arg("--key-file").arg(file),
            None => cmd.arg("--insecure"),
        };
        let mut child = cmd
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start prima node");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("node: listening on ") {
                    let _ = tx.send(rest.split(' ').next().unwrap_or_default().to_string());
                }
                lines.lock().unwrap().push(line);
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the node prints its address");
        NodeProcess { child, addr, log }
    }

    /// The first log line containing `needle`, waiting for it a while.
    fn log_line(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let log = self.log.lock().unwrap().clone();
            if let Some(line) = log.iter().find(|l| l.contains(needle)) {
                return line.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {needle:?}:\n{}",
                log.join("\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP proxy in front of one node that records every byte, each connection and
/// direction apart, and can send one frame of the tcp transport twice.
struct Proxy {
    addr: String,
    streams: Arc<Streams>,
}

/// (connection index, from the head?, the bytes) of every connection and direction.
type Streams = Mutex<Vec<(usize, bool, Vec<u8>)>>;

/// Send frame `frame` (counted from 0 after the transport's hello) of connection `conn`
/// twice.
#[derive(Clone, Copy)]
struct Replay {
    conn: usize,
    frame: usize,
}

impl Proxy {
    fn start(target: &str, replay: Option<Replay>) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let streams = Arc::new(Mutex::new(Vec::new()));
        let target = target.to_string();
        let record = streams.clone();
        std::thread::spawn(move || {
            for (i, client) in listener.incoming().enumerate() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(&target) else {
                    return;
                };
                let replay = replay.filter(|r| r.conn == i);
                let up = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (rec_up, rec_down) = (record.clone(), record.clone());
                std::thread::spawn(move || forward_frames(up.0, up.1, i, replay, &rec_up));
                std::thread::spawn(move || copy_bytes(server, client, i, &rec_down));
            }
        });
        Proxy { addr, streams }
    }

    /// Every recorded stream.
    fn captured(&self) -> Vec<(usize, bool, Vec<u8>)> {
        self.streams.lock().unwrap().clone()
    }
}

/// Appends `bytes` to the record of connection `i` in one direction.
fn record(streams: &Streams, i: usize, up: bool, bytes: &[u8]) {
    let mut all = streams.lock().unwrap();
    match all.iter_mut().find(|(c, u, _)| *c == i && *u == up) {
        Some((_, _, b)) => b.extend_from_slice(bytes),
        None => all.push((i, up, bytes.to_vec())),
    }
}

/// Head → node: the transport's 8-byte hello, then big-endian-length frames, one of which
/// may be sent twice.
fn forward_frames(
    mut from: TcpStream,
    mut to: TcpStream,
    i: usize,
    replay: Option<Replay>,
    streams: &Streams,
) {
    let mut hello = [0u8; 8];
    if from.read_exact(&mut hello).is_err() || to.write_all(&hello).is_err() {
        return;
    }
    for n in 0.. {
        let mut len = [0u8; 4];
        if from.read_exact(&mut len).is_err() {
            break;
        }
        let mut frame = len.to_vec();
        frame.resize(4 + u32::from_be_bytes(len) as usize, 0);
        if from.read_exact(&mut frame[4..]).is_err() {
            break;
        }
        record(streams, i, true, &frame);
        let times = if replay.is_some_and(|r| r.frame == n) {
            2
        } else {
            1
        };
        for _ in 0..times {
            if to.write_all(&frame).is_err() {
                return;
            }
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

fn copy_bytes(mut from: TcpStream, mut to: TcpStream, i: usize, streams: &Streams) {
    let mut buf = vec![0u8; 1 << 16];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
        record(streams, i, false, &buf[..n]);
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// The activation payloads a plain ring sent head → node (tcp frames after the hello).
fn plain_activations(streams: &[(usize, bool, Vec<u8>)]) -> Vec<Vec<u8>> {
    let mut found = Vec::new();
    for (_, up, bytes) in streams.iter().filter(|(_, up, _)| *up) {
        assert!(up);
        let mut at = 0;
        while at + 4 <= bytes.len() {
            let len = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            let frame = &bytes[at + 4..at + 4 + len];
            if let Ok(Frame::Activations(_, _, payload)) = decode(frame) {
                found.push(payload.to_vec());
            }
            at += 4 + len;
        }
    }
    found
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn smollm2() -> Option<PathBuf> {
    model_or_skip(workspace_models().join("SmolLM2-135M-Instruct.Q4_1.gguf"))
}

fn options(security: LinkSecurity) -> RingOptions {
    RingOptions {
        n_ctx: 256,
        n_batch: 64,
        listen: "127.0.0.1:0".into(),
        security,
        ..RingOptions::default()
    }
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

/// Greedy tokens and the logits of every step, bit for bit; the first error ends it.
fn greedy<F: Forward>(f: &mut F, prompt: &[u32], n: usize) -> Result<Vec<Vec<f32>>, String>
where
    F::Error: std::fmt::Display,
{
    let mut all = Vec::new();
    let mut logits = f.eval(prompt).map_err(|e| e.to_string())?.to_vec();
    for _ in 0..n {
        let t = argmax(&logits);
        all.push(logits);
        logits = f.eval(&[t]).map_err(|e| e.to_string())?.to_vec();
    }
    Ok(all)
}

#[test]
fn with_the_key_the_ring_matches_one_device_and_its_wire_shows_no_plaintext() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let backend = cpu_backend(1);
    let be = &backend.backend;
    let transport = common::tcp_transport();
    let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
    let prompt = tok.encode(PROMPT, true, true);
    let mut single = Session::new(&model, be, 256, 64).unwrap();
    let want = greedy(&mut single, &prompt, 6).unwrap();

    // The same ring twice, each with a recording proxy in front of device 1: plain,
    // then sealed. Both compute bit for bit what one device does.
    let mut captures = Vec::new();
    for key in [None, Some(test_key())] {
        let nodes = [
            NodeProcess::start(&path, key.map(|k| k.0.as_path())),
            NodeProcess::start(&path, key.map(|k| k.0.as_path())),
        ];
        let proxy = Proxy::start(&nodes[0].addr, None);
        let security = match key {
            Some(_) => test_security(),
            None => LinkSecurity::Insecure,
        };
        let addrs = [proxy.addr.clone(), nodes[1].addr.clone()];
        let mut head = RingHead::connect(
            &model,
            be,
            &transport.transport,
            &addrs,
            &[10, 10, 10],
            &options(security),
        )
        .unwrap();
        let got = greedy(&mut head, &prompt, 6).unwrap();
        assert!(got == want, "sealed: {}: logits differ", key.is_some());
        head.shutdown(false);
        captures.push(proxy.captured());
    }
    let (plain, sealed) = (&captures[0], &captures[1]);

    // What a plain ring shows on the wire: control messages and the activations (the
    // same values the sealed ring sent, as both computed the same).
    let activations = plain_activations(plain);
    assert!(
        activations.len() >= 7,
        "{} activation frames",
        activations.len()
    );
    let setup = b"\"type\":\"setup\"";
    assert!(plain.iter().any(|(_, _, b)| contains(b, setup)));
    let sealed_bytes: usize = sealed.iter().map(|(_, _, b)| b.len()).sum();
    assert!(sealed_bytes > activations.iter().map(Vec::len).sum::<usize>());
    let token_bytes: Vec<u8> = prompt.iter().flat_map(|t| t.to_le_bytes()).collect();
    for (conn, _, bytes) in sealed {
        assert!(
            !contains(bytes, setup),
            "connection {conn}: a control message"
        );
        assert!(!contains(bytes, b"\"type\""), "connection {conn}: JSON");
        assert!(!contains(bytes, &PROMPT.as_bytes()[..12]));
        assert!(!contains(bytes, &token_bytes[..8]));
        for payload in &activations {
            // 16 bytes (four f32s) from several places of every activation frame.
            for at in (0..payload.len().saturating_sub(16)).step_by(payload.len() / 8 + 1) {
                assert!(
                    !contains(bytes, &payload[at..at + 16]),
                    "connection {conn}: activation bytes at {at} in the clear"
                );
            }
        }
    }
}

#[test]
fn peers_without_the_key_are_refused_with_the_reason_on_both_sides() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let backend = cpu_backend(1);
    let be = &backend.backend;
    let transport = common::tcp_transport();
    let keyed = NodeProcess::start(&path, Some(&test_key().0));
    let plain = NodeProcess::start(&path, None);
    let ring = |node: &NodeProcess, security: LinkSecurity| {
        RingHead::connect(
            &model,
            be,
            &transport.transport,
            std::slice::from_ref(&node.addr),
            &[15, 15],
            &options(security),
        )
    };

    // Another key.
    let other = LinkSecurity::Key(ClusterKey::generate());
    let err = ring(&keyed, other).err().unwrap().to_string();
    assert!(
        err.contains(&keyed.addr) && err.contains("another cluster key"),
        "{err}"
    );
    keyed.log_line("another cluster key");

    // A head that runs --insecure.
    let err = ring(&keyed, LinkSecurity::Insecure)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("requires the cluster key"), "{err}");
    keyed.log_line("the peer runs --insecure");

    // A client that speaks the ring protocol in plain frames, no handshake.
    let conn = transport
        .transport
        .connect(RString::from(keyed.addr.as_str()), 5_000)
        .unwrap();
    let hello = encode_control(&Control::Hello {
        protocol: 1,
        role: Role::Control,
    });
    conn.send(RSlice::from_slice(&hello)).unwrap();
    let answer = conn.recv(10_000).unwrap().unwrap();
    let Ok(Frame::Control(Control::Refused { reason })) = decode(&answer) else {
        panic!("expected a refusal");
    };
    assert!(reason.contains("cluster key"), "{reason}");
    keyed.log_line("plain ring frames");

    // A node that runs --insecure, a head with the key.
    let err = ring(&plain, test_security()).err().unwrap().to_string();
    assert!(err.contains("runs --insecure"), "{err}");
    plain.log_line("wants an encrypted link");

    // The node refused them all and still serves a head with the key.
    let mut head = ring(&keyed, test_security()).unwrap();
    let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
    head.eval(&tok.encode(PROMPT, true, true)).unwrap();
    head.shutdown(false);
}

#[test]
fn a_replayed_frame_is_refused_on_both_sides() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let backend = cpu_backend(1);
    let transport = common::tcp_transport();
    let nodes = [
        NodeProcess::start(&path, Some(&test_key().0)),
        NodeProcess::start(&path, Some(&test_key().0)),
    ];
    // Connection 1 is the head's data connection to device 1 (control first); its frame
    // 0 is the link handshake, 1 the hello, 2 the first activations: sent twice.
    let proxy = Proxy::start(&nodes[0].addr, Some(Replay { conn: 1, frame: 2 }));
    let addrs = [proxy.addr.clone(), nodes[1].addr.clone()];
    let mut head = RingHead::connect(
        &model,
        &backend.backend,
        &transport.transport,
        &addrs,
        &[10, 10, 10],
        &options(test_security()),
    )
    .unwrap();
    let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
    let err = greedy(&mut head, &tok.encode(PROMPT, true, true), 8)
        .expect_err("the ring breaks after the replay");
    let line = nodes[0].log_line("failed to authenticate");
    assert!(line.contains("replayed"), "{line}");
    // The head names device 1 and why; device 2 merely lost its neighbour, and the
    // verdict names it only if its report was seen first.
    assert!(
        (err.contains("device 1") && err.contains("replayed")) || err.contains("device 2"),
        "{err}"
    );
}

#[test]
fn keygen_writes_a_key_and_a_node_without_one_refuses_to_start() {
    let home = std::env::temp_dir().join(format!("prima-keygen-home-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let prima = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_prima"))
            .args(args)
            .env("HOME", &home)
            .output()
            .unwrap()
    };
    let stderr = |out: &std::process::Output| String::from_utf8_lossy(&out.stderr).into_owned();

    // No key anywhere: the node says what to do instead of starting.
    let out = prima(&["node", "--listen", "127.0.0.1:0", "-m", "absent.gguf"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no cluster key: give --key-file FILE"),
        "{}",
        stderr(&out)
    );
    let out = prima(&[
        "node",
        "--listen",
        "127.0.0.1:0",
        "-m",
        "absent.gguf",
        "--key-file",
        "absent.key",
    ]);
    assert!(stderr(&out).contains("absent.key"), "{}", stderr(&out));

    // keygen writes the default key once, and never over an existing one.
    let out = prima(&["keygen"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let path = home.join(".cache/prima/cluster.key");
    let key = ClusterKey::read(&path).unwrap();
    assert!(
        stderr(&out).contains(&key.fingerprint()),
        "{}",
        stderr(&out)
    );
    let out = prima(&["keygen"]);
    assert!(!out.status.success());
    assert_eq!(ClusterKey::read(&path).unwrap(), key);
    let _ = std::fs::remove_dir_all(&home);
}

//! The ring on loopback: a head in this process and two `prima node` processes must
//! compute exactly what one device computes, for every window plan; a node with another
//! model is refused by name; a node that dies is named and the head stops in seconds.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{cpu_backend, derived_models, model_or_skip, workspace_models};
use prima_cluster::prp::protocol::OutputSetup;
use prima_cluster::prp::{RingError, RingHead, RingOptions};
use prima_core::generate::Forward;
use prima_core::model::{Model, Session};
use prima_core::tokenizer::Tokenizer;

/// A `prima node` process, killed when dropped.
struct NodeProcess {
    child: Child,
    addr: String,
}

impl NodeProcess {
    fn start(model: &Path) -> NodeProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_prima"))
            .args(["node", "--listen", "127.0.0.1:0", "-t", "1", "-m"])
            .arg(model)
            .arg("--key-file")
            .arg(&common::test_key().0)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start prima node");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("node: listening on ") {
                    let addr = rest.split(' ').next().unwrap_or_default().to_string();
                    let _ = tx.send(addr);
                }
                // Keep draining so the node never blocks on a full pipe.
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the node prints its address");
        NodeProcess { child, addr }
    }

    /// CPU time (user + system) the process has used, in clock ticks.
    fn cpu_ticks(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = after_comm.split(' ').collect();
        // utime and stime are fields 14 and 15 of stat, 12 and 13 after the command.
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn smollm2() -> Option<PathBuf> {
    model_or_skip(workspace_models().join("SmolLM2-135M-Instruct.Q4_1.gguf"))
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

/// Greedy tokens and the logits of every step, bit for bit.
fn greedy<F: Forward>(f: &mut F, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>)
where
    F::Error: std::fmt::Debug,
{
    let mut tokens = Vec::new();
    let mut all_logits = Vec::new();
    let mut logits = f.eval(prompt).unwrap().to_vec();
    for _ in 0..n {
        let t = argmax(&logits);
        tokens.push(t);
        all_logits.push(logits);
        logits = f.eval(&[t]).unwrap().to_vec();
    }
    (tokens, all_logits)
}

fn prompts(model: &Model) -> Vec<Vec<u32>> {
    let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
    let long_text = "The history of the printing press begins in the fifteenth century, when \
        Johannes Gutenberg combined movable metal type, oil-based ink and a wooden screw press \
        into a system that could produce books quickly and cheaply. Within decades, presses \
        spread across Europe, and the number of books in circulation grew from thousands to \
        millions, changing religion, science, politics and everyday life for everyone.";
    let long = tok.encode(&format!("{long_text} {long_text}"), true, true);
    assert!(long.len() >= 100, "{} tokens", long.len());
    vec![
        tok.encode("Hello", false, true)[..1].to_vec(),
        tok.encode("Hello, my name is Ada and I", true, true)[..7].to_vec(),
        long[..100].to_vec(),
    ]
}

fn options() -> RingOptions {
    RingOptions {
        n_ctx: 256,
        n_batch: 64,
        listen: "127.0.0.1:0".into(),
        security: common::test_security(),
        ..RingOptions::default()
    }
}

#[test]
fn three_devices_compute_exactly_what_one_does() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    assert_eq!(model.hparams().n_layers, 30);
    let backend = cpu_backend(1);
    let be = &backend.backend;
    let transport = common::tcp_transport();
    let nodes = [NodeProcess::start(&path), NodeProcess::start(&path)];
    let addrs: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();

    const GENERATE: usize = 8;
    // 64-token batches, so the 100-token prompt also crosses a batch boundary.
    for prompt in prompts(&model) {
        let mut single = Session::new(&model, be, 256, 64).unwrap();
        let (want_tokens, want_logits) = greedy(&mut single, &prompt, GENERATE);
        for windows in [
            [10, 10, 10],
            [5, 5, 5],
            [4, 3, 3],
            [2, 2, 1],
            [4, 4, 4],
            [0, 15, 15],
        ] {
            let mut head = RingHead::connect(
                &model,
                be,
                &transport.transport,
                &addrs,
                &windows,
                &options(),
            )
            .unwrap_or_else(|e| panic!("windows {windows:?}: {e}"));
            let (tokens, logits) = greedy(&mut head, &prompt, GENERATE);
            assert_eq!(
                tokens,
                want_tokens,
                "windows {windows:?}, prompt of {} tokens",
                prompt.len()
            );
            assert!(
                logits == want_logits,
                "windows {windows:?}, prompt of {}: logits differ from one device's",
                prompt.len()
            );
            let stats = head.collect_stats().unwrap();
            assert_eq!(stats.len(), 3);
            let k = head.rounds();
            for d in &stats {
                // Every device sees every round of every batch (relays included).
                let batches = prompt.len().div_ceil(64) + GENERATE;
                assert_eq!(d.passes.len(), batches * k, "device {} passes", d.device);
            }
            head.shutdown(false);
        }
    }
}

/// With the output layer on the device that runs the last layer (issue 38), the ring
/// still gives one device's logits: bit for bit when every logit comes back, and the
/// same greedy text with the top 64 (the rest −∞, each kept logit one device's). The
/// windows put the last layer on the last node, on the middle one with the last a relay
/// that passes the logits on, and everything on one node (the head only embeds and
/// samples).
#[test]
fn three_devices_with_the_output_layer_off_the_head_compute_what_one_does() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let backend = cpu_backend(1);
    let be = &backend.backend;
    let transport = common::tcp_transport();
    let nodes = [NodeProcess::start(&path), NodeProcess::start(&path)];
    let addrs: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
    const GENERATE: usize = 6;
    for prompt in prompts(&model) {
        let mut single = Session::new(&model, be, 256, 64).unwrap();
        let (want_tokens, want_logits) = greedy(&mut single, &prompt, GENERATE);
        for windows in [[10, 10, 10], [4, 3, 3], [0, 30, 0], [0, 0, 30]] {
            // Every logit with the hidden states back; the top 64 alone (as `apply` runs).
            for (top_k, hidden) in [(0u32, true), (64, false)] {
                let options = RingOptions {
                    output: Some(OutputSetup { top_k, hidden }),
                    ..options()
                };
                let mut head =
                    RingHead::connect(&model, be, &transport.transport, &addrs, &windows, &options)
                        .unwrap_or_else(|e| panic!("windows {windows:?}: {e}"));
                let (tokens, logits) = greedy(&mut head, &prompt, GENERATE);
                let case = format!(
                    "windows {windows:?}, top_k {top_k}, hidden {hidden}, prompt of {} tokens",
                    prompt.len()
                );
                assert_eq!(tokens, want_tokens, "{case}");
                if top_k == 0 {
                    assert!(
                        logits == want_logits,
                        "{case}: logits differ from one device's"
                    );
                } else {
                    for (got, want) in logits.iter().zip(&want_logits) {
                        let kept: Vec<usize> =
                            (0..got.len()).filter(|&i| got[i].is_finite()).collect();
                        assert_eq!(kept.len(), top_k as usize, "{case}");
                        assert!(kept.iter().all(|&i| got[i] == want[i]), "{case}");
                        // Nothing left out is above what was kept.
                        let low = kept.iter().map(|&i| want[i]).fold(f32::INFINITY, f32::min);
                        assert!(
                            (0..want.len()).all(|i| got[i].is_finite() || want[i] <= low),
                            "{case}"
                        );
                    }
                }
                head.shutdown(false);
            }
        }
    }
}

/// The same on mixtures of experts (qwen3moe: router, top-k, per-expert batches): a ring
/// of three on loopback gives exactly one device's tokens and logits, Q8_0 and Q4_K_M,
/// for windows that cut the layers every way, relays included.
#[test]
fn three_devices_compute_exactly_what_one_does_on_a_mixture_of_experts() {
    let cases: [(&str, &[[usize; 3]]); 2] = [
        (
            "tiny-qwen3moe-8x2-q8_0.gguf",
            &[[2, 1, 1], [1, 1, 1], [0, 2, 2], [1, 2, 1], [2, 2, 2]],
        ),
        (
            "tiny-qwen3moe-16x4-q4_k_m.gguf",
            &[[1, 1, 0], [0, 1, 1], [1, 0, 1], [1, 1, 1]],
        ),
    ];
    let backend = cpu_backend(1);
    let be = &backend.backend;
    let transport = common::tcp_transport();
    const GENERATE: usize = 6;
    for (file, plans) in cases {
        let Some(path) = model_or_skip(derived_models().join(file)) else {
            continue;
        };
        let model = Model::load(&path).unwrap();
        assert!(model.experts().is_some(), "{file} is a mixture of experts");
        let nodes = [NodeProcess::start(&path), NodeProcess::start(&path)];
        let addrs: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
        for prompt in prompts(&model) {
            let mut single = Session::new(&model, be, 256, 64).unwrap();
            let (want_tokens, want_logits) = greedy(&mut single, &prompt, GENERATE);
            for windows in plans {
                let mut head = RingHead::connect(
                    &model,
                    be,
                    &transport.transport,
                    &addrs,
                    windows,
                    &options(),
                )
                .unwrap_or_else(|e| panic!("{file}, windows {windows:?}: {e}"));
                let (tokens, logits) = greedy(&mut head, &prompt, GENERATE);
                assert_eq!(
                    tokens,
                    want_tokens,
                    "{file}, windows {windows:?}, prompt of {} tokens",
                    prompt.len()
                );
                assert!(
                    logits == want_logits,
                    "{file}, windows {windows:?}, prompt of {}: logits differ from one device's",
                    prompt.len()
                );
                head.shutdown(false);
            }
        }
    }
}

/// gpt-oss (MXFP4 experts, sinks, biases, alternating sliding windows) on a ring of three:
/// the same greedy tokens and logits, bit for bit, as one device, with one round and two.
#[test]
fn three_devices_compute_exactly_what_one_does_on_gpt_oss() {
    let Some(path) = model_or_skip(derived_models().join("tiny-gptoss-8x4-mxfp4.gguf")) else {
        return;
    };
    let model = Model::load(&path).unwrap();
    assert_eq!(model.hparams().n_layers, 4);
    let backend = cpu_backend(1);
    let be = &backend.backend;
    let transport = common::tcp_transport();
    let nodes = [NodeProcess::start(&path), NodeProcess::start(&path)];
    let addrs: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
    for prompt in prompts(&model) {
        let mut single = Session::new(&model, be, 256, 64).unwrap();
        let (want_tokens, want_logits) = greedy(&mut single, &prompt, 8);
        for windows in [[2, 1, 1], [1, 0, 1]] {
            let mut head = RingHead::connect(
                &model,
                be,
                &transport.transport,
                &addrs,
                &windows,
                &options(),
            )
            .unwrap_or_else(|e| panic!("windows {windows:?}: {e}"));
            let (tokens, logits) = greedy(&mut head, &prompt, 8);
            assert_eq!(tokens, want_tokens, "windows {windows:?}");
            assert!(
                logits == want_logits,
                "windows {windows:?}, prompt of {}: logits differ from one device's",
                prompt.len()
            );
            head.shutdown(false);
        }
    }
}

#[test]
fn idle_nodes_sleep() {
    let Some(path) = smollm2() else { return };
    let node = NodeProcess::start(&path);
    std::thread::sleep(Duration::from_millis(300));
    let before = node.cpu_ticks();
    std::thread::sleep(Duration::from_secs(2));
    let used = node.cpu_ticks() - before;
    // 200 ticks would be one core busy; an idle node should use next to none.
    assert!(used <= 10, "an idle node used {used} ticks of CPU in 2 s");
}

/// A node asks the GPU plugins about the hardware in a child process, so a GPU plugin it
/// does not use (and the driver libraries its probe opened: libLLVM for lavapipe) is not
/// mapped in it, where its pages would count against the node's memory.
#[test]
fn a_node_maps_no_gpu_plugin_it_does_not_use() {
    let Some(path) = smollm2() else { return };
    let node = NodeProcess::start(&path);
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", node.child.id())).unwrap();
    let listing = Command::new(env!("CARGO_BIN_EXE_prima"))
        .arg("plugins")
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    let mut mapped: Vec<&str> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.contains("libprima_backend_") && !p.contains("libprima_backend_cpu"))
        .collect();
    mapped.dedup();
    for plugin in mapped {
        let line = listing
            .lines()
            .find(|l| l.contains(plugin))
            .unwrap_or_default();
        assert!(
            line.contains("— GPU,"),
            "the node maps {plugin}, which is no usable GPU here:\n{listing}"
        );
    }
}

#[test]
fn a_node_with_another_model_is_refused_by_name() {
    let Some(path) = smollm2() else { return };
    let Some(other) = model_or_skip(derived_models().join("smollm2-135m-q8_0.gguf")) else {
        return;
    };
    let model = Model::load(&path).unwrap();
    let backend = cpu_backend(1);
    let transport = common::tcp_transport();
    let good = NodeProcess::start(&path);
    let wrong = NodeProcess::start(&other);
    let addrs = [good.addr.clone(), wrong.addr.clone()];
    let err = RingHead::connect(
        &model,
        &backend.backend,
        &transport.transport,
        &addrs,
        &[10, 10, 10],
        &options(),
    )
    .err()
    .expect("the mismatch is refused");
    let text = err.to_string();
    assert!(
        matches!(err, RingError::Refused { device: 2, .. }),
        "{text}"
    );
    assert!(text.contains("model mismatch"), "{text}");
    assert!(text.contains(&wrong.addr), "{text}");
    assert!(text.contains("smollm2-135m-q8_0.gguf"), "{text}");

    // Both nodes go back to waiting: a ring of the head and the good node works.
    let mut head = RingHead::connect(
        &model,
        &backend.backend,
        &transport.transport,
        &addrs[..1],
        &[15, 15],
        &options(),
    )
    .unwrap();
    head.eval(&[1, 2, 3]).unwrap();
}

#[test]
fn a_dead_node_is_named_within_seconds() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let backend = cpu_backend(1);
    let transport = common::tcp_transport();
    let first = NodeProcess::start(&path);
    let mut second = NodeProcess::start(&path);
    let addrs = [first.addr.clone(), second.addr.clone()];
    let mut head = RingHead::connect(
        &model,
        &backend.backend,
        &transport.transport,
        &addrs,
        &[10, 10, 10],
        &options(),
    )
    .unwrap();
    head.eval(&[1, 2, 3]).unwrap();
    second.child.kill().unwrap();
    second.child.wait().unwrap();
    let started = Instant::now();
    let mut err = None;
    for t in 0..50 {
        if let Err(e) = head.eval(&[t + 4]) {
            err = Some(e);
            break;
        }
    }
    let err = err.expect("the ring fails once a node is dead");
    assert_names_lost_device(err, 2, &second.addr, started.elapsed());
}

/// `err` names device `device` at `addr` as lost, and came within 15 s of the loss.
fn assert_names_lost_device(err: RingError, device: usize, addr: &str, elapsed: Duration) {
    let text = err.to_string();
    assert!(
        matches!(err, RingError::DeviceLost { device: d, .. } if d == device),
        "names device {device}: {text}"
    );
    assert!(text.contains(addr), "{text}");
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}");
}

#[test]
fn a_frozen_node_is_named_even_while_the_head_is_sending() {
    // A node that stops (a suspended laptop, a frozen phone) while the head sends it a
    // prompt batch larger than the socket buffers: the head's send cannot finish, and the
    // head must still name the node within seconds instead of waiting for ever.
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let backend = cpu_backend(1);
    let transport = common::tcp_transport();
    let mut first = NodeProcess::start(&path);
    let second = NodeProcess::start(&path);
    let addrs = [first.addr.clone(), second.addr.clone()];
    let batch = 4096;
    let options = RingOptions {
        n_ctx: 4200,
        n_batch: batch,
        ..options()
    };
    let mut head = RingHead::connect(
        &model,
        &backend.backend,
        &transport.transport,
        &addrs,
        &[1, 1, 28],
        &options,
    )
    .unwrap();
    head.eval(&[1, 2, 3]).unwrap();
    // SAFETY: kill(2) with the pid of a child we own and a valid signal number.
    assert_eq!(
        unsafe { libc::kill(first.child.id() as i32, libc::SIGSTOP) },
        0
    );
    let started = Instant::now();
    let prompt: Vec<u32> = (0..batch as u32).map(|t| 100 + t % 1000).collect();
    let result = head.eval(&prompt).map(|_| ());
    let elapsed = started.elapsed();
    // SAFETY: as above.
    unsafe { libc::kill(first.child.id() as i32, libc::SIGCONT) };
    let _ = first.child.kill();
    let err = result.expect_err("the ring fails while a node is frozen");
    assert_names_lost_device(err, 1, &first.addr, elapsed);
}

fn prima(args: &[&str], model: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_prima"))
        .args([
            "run", "-t", "1", "--temp", "0", "-n", "12", "-c", "256", "-m",
        ])
        .arg(model)
        .arg("--key-file")
        .arg(&common::test_key().0)
        .args(args)
        .output()
        .expect("run prima")
}

#[test]
fn prima_run_on_a_ring_prints_what_one_device_prints() {
    let Some(path) = smollm2() else { return };
    let nodes = [NodeProcess::start(&path), NodeProcess::start(&path)];
    let ring = format!("{},{}", nodes[0].addr, nodes[1].addr);
    let stats = std::env::temp_dir().join(format!("prima-ring-stats-{}.json", std::process::id()));
    let prompt = ["-p", "The three primary colours are"];
    let single = prima(&prompt, &path);
    assert!(single.status.success());
    let mut args = prompt.to_vec();
    let stats_arg = stats.to_string_lossy().into_owned();
    args.extend([
        "--ring",
        &ring,
        "--windows",
        "4,3,3",
        "-v",
        "--stats-json",
        &stats_arg,
    ]);
    let ringed = prima(&args, &path);
    let stderr = String::from_utf8_lossy(&ringed.stderr);
    assert!(ringed.status.success(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&ringed.stdout),
        String::from_utf8_lossy(&single.stdout)
    );
    assert!(stderr.contains("ring of 3 devices, k = 3"), "{stderr}");
    assert!(stderr.contains("compute ms"), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let _ = std::fs::remove_file(&stats);
    let devices = json["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 3);
    for d in devices {
        let passes = d["passes"].as_array().unwrap();
        // A one-batch prompt and 11 more tokens, 3 rounds each (unless EOS came early).
        assert!(passes.len() % 3 == 0 && !passes.is_empty(), "{d}");
        assert!(passes
            .iter()
            .all(|p| p["compute_ms"].as_f64().unwrap() >= 0.0));
    }
}

#[test]
fn prima_run_names_an_unreachable_device_and_a_missing_windows_list() {
    let Some(path) = smollm2() else { return };
    // Nothing listens on port 1.
    let out = prima(
        &["-p", "hi", "--ring", "127.0.0.1:1", "--windows", "15,15"],
        &path,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("device 1 (127.0.0.1:1)"), "{stderr}");

    let out = prima(&["-p", "hi", "--ring", "127.0.0.1:1"], &path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--windows"), "{stderr}");

    let out = prima(
        &["-p", "hi", "--ring", "127.0.0.1:1", "--windows", "10,10,10"],
        &path,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("3 window sizes for 2 devices"), "{stderr}");
}

#[test]
fn a_head_speaking_another_protocol_is_refused() {
    use prima_cluster::prp::protocol::{
        decode, encode_control, Control, Frame, ModelFingerprint, NextHop, ReleaseMethod,
        ReleasePolicy, Role, RoundWindow, Setup, WireType,
    };
    use prima_cluster::prp::secure::Link;
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let node = NodeProcess::start(&path);
    let transport = common::tcp_transport();
    let conn = Link::connect(
        &transport.transport,
        &node.addr,
        5_000,
        &common::test_security(),
    )
    .unwrap();
    let send = |msg: &Control| conn.send(&encode_control(msg)).unwrap();
    send(&Control::Hello {
        protocol: 999,
        role: Role::Control,
    });
    send(&Control::Setup(Box::new(Setup {
        protocol: 999,
        model: ModelFingerprint::of(model.gguf()),
        device: 1,
        n_devices: 2,
        rounds: 1,
        windows: vec![RoundWindow {
            round: 0,
            layers: 15..30,
        }],
        gpu_layers: Vec::new(),
        n_ctx: 64,
        n_batch: 8,
        n_slots: 1,
        next: NextHop::Head { port: 1 },
        prefetch: true,
        release: ReleasePolicy::Mru,
        release_method: ReleaseMethod::Pageout,
        wire: WireType::F32,
        output: None,
    })));
    let frame = conn.recv(10_000).unwrap().unwrap();
    let Ok(Frame::Control(Control::Refused { reason })) = decode(&frame) else {
        panic!("expected a refusal");
    };
    assert!(reason.contains("ring protocol v999"), "{reason}");
}

#[test]
fn a_node_answers_profile_requests_between_sessions() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let backend = cpu_backend(1);
    let transport = common::tcp_transport();
    let node = NodeProcess::start(&path);
    let profile = prima_cluster::prp::head::request_profile(
        &transport.transport,
        &node.addr,
        30_000,
        &common::test_security(),
    )
    .unwrap();
    assert!(
        profile["ram_total_gib"].as_f64().unwrap_or(0.0) > 0.0,
        "{profile}"
    );
    let mut head = RingHead::connect(
        &model,
        &backend.backend,
        &transport.transport,
        std::slice::from_ref(&node.addr),
        &[15, 15],
        &options(),
    )
    .unwrap();
    head.eval(&[1, 2, 3]).unwrap();
}

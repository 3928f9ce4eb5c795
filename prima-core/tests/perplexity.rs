//! `prima perplexity` against llama.cpp's `llama-perplexity` on the same text and models:
//! the same chunks are scored, so the running estimates and the final perplexity agree
//! within [`TOLERANCE`]; the KL-divergence reference files of the two tools are read by
//! the other.
//!
//! The text is `tests/fixtures/perplexity/python-types.txt`; two chunks of 128 tokens
//! keep each model's run to seconds. Needs the models (`cargo xtask test-models`) and
//! llama.cpp's build (`cargo xtask setup`); skipped without them unless
//! PRIMA_REQUIRE_MODELS is set.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The bound on |PPL(prima) / PPL(llama.cpp) − 1|. Measured on this text at
/// -c 128, 2 chunks: see the `perplexity` section of ARCHITECTURE.md.
const TOLERANCE: f64 = 0.005;
const CTX: &str = "128";
const CHUNKS: &str = "2";

fn corpus() -> PathBuf {
    common::workspace_root().join("tests/fixtures/perplexity/python-types.txt")
}

fn llama_perplexity() -> Option<PathBuf> {
    let cache = match std::env::var_os("PRIMA_CACHE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/prima"),
    };
    common::model_or_skip(cache.join("llama.cpp/build/bin/llama-perplexity"))
}

/// Runs a command and returns stdout and stderr together, failing on a non-zero exit.
fn output(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

/// A fresh directory for one test's files.
fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("prima-perplexity-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn prima() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prima"));
    cmd.args(["perplexity", "-t", "2"]);
    cmd
}

fn llama(tool: &Path) -> Command {
    let mut cmd = Command::new(tool);
    cmd.args(["-t", "2", "--no-warmup"]);
    cmd
}

/// The number after `key` in `text` (the first one).
fn number_after(text: &str, key: &str) -> f64 {
    let at = text
        .find(key)
        .unwrap_or_else(|| panic!("no {key:?} in:\n{text}"));
    let rest = text[at + key.len()..].trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == 'e'))
        .unwrap_or(rest.len());
    rest[..end]
        .parse()
        .unwrap_or_else(|e| panic!("{key:?} followed by {:?}: {e}", &rest[..end]))
}

/// The running estimates `[1]x,[2]y,…`.
fn running(text: &str) -> Vec<f64> {
    (1..)
        .map_while(|i| {
            let key = format!("[{i}]");
            text.contains(&key).then(|| number_after(text, &key))
        })
        .collect()
}

fn models() -> Vec<PathBuf> {
    vec![
        common::workspace_models().join("SmolLM2-135M-Instruct.Q4_1.gguf"),
        common::derived_models().join("smollm2-135m-q4_k_m.gguf"),
        common::derived_models().join("smollm2-135m-q8_0.gguf"),
        common::workspace_models().join("gemma-3-270m-q4_k_m.gguf"),
    ]
}

#[test]
fn perplexity_matches_llama_perplexity() {
    let Some(tool) = llama_perplexity() else {
        return;
    };
    for model in models() {
        let Some(model) = common::model_or_skip(model) else {
            continue;
        };
        let args = ["-c", CTX, "--chunks", CHUNKS, "-f"];
        let ours = output(prima().arg("-m").arg(&model).args(args).arg(corpus()));
        let theirs = output(llama(&tool).arg("-m").arg(&model).args(args).arg(corpus()));
        let key = "Final estimate: PPL = ";
        let (p, l) = (number_after(&ours, key), number_after(&theirs, key));
        let name = model.file_name().unwrap().to_string_lossy();
        eprintln!(
            "{name}: prima {p:.4}, llama-perplexity {l:.4}, ratio {:.5}",
            p / l
        );
        assert!(
            (p / l - 1.0).abs() < TOLERANCE,
            "{name}: PPL {p} vs llama-perplexity's {l}"
        );
        let (rp, rl) = (running(&ours), running(&theirs));
        assert_eq!(rp.len(), 2, "{name}: running estimates in:\n{ours}");
        assert_eq!(rp.len(), rl.len(), "{name}: chunks scored");
        for (a, b) in rp.iter().zip(&rl) {
            assert!(
                (a / b - 1.0).abs() < TOLERANCE,
                "{name}: running {rp:?} vs {rl:?}"
            );
        }
    }
}

/// Each tool writes a reference from SmolLM2 Q8_0 and reads the other's to compare Q4_1
/// with it: the files share header and tokens byte for byte, and both tools measure the
/// same divergence.
#[test]
fn kl_divergence_files_are_llama_perplexitys() {
    let Some(tool) = llama_perplexity() else {
        return;
    };
    let (Some(base_model), Some(model)) = (
        common::model_or_skip(common::derived_models().join("smollm2-135m-q8_0.gguf")),
        common::model_or_skip(common::workspace_models().join("SmolLM2-135M-Instruct.Q4_1.gguf")),
    ) else {
        return;
    };
    let dir = scratch("kld");
    let (ours, theirs) = (dir.join("prima.kld"), dir.join("llama.kld"));
    let save = ["-c", CTX, "--chunks", CHUNKS, "--kl-divergence-base"];
    output(
        prima()
            .arg("-m")
            .arg(&base_model)
            .args(save)
            .arg(&ours)
            .arg("-f")
            .arg(corpus()),
    );
    output(
        llama(&tool)
            .arg("-m")
            .arg(&base_model)
            .args(save)
            .arg(&theirs)
            .arg("-f")
            .arg(corpus()),
    );
    let (a, b) = (
        std::fs::read(&ours).unwrap(),
        std::fs::read(&theirs).unwrap(),
    );
    assert_eq!(a.len(), b.len(), "file sizes");
    let header = 20 + 4 * 2 * 128;
    assert_eq!(a[..header], b[..header], "header and tokens");

    // Q4_1 against each reference, each tool reading the other's file.
    let compare = ["-c", CTX, "--kl-divergence", "--kl-divergence-base"];
    let by_prima = output(prima().arg("-m").arg(&model).args(compare).arg(&theirs));
    let by_llama = output(llama(&tool).arg("-m").arg(&model).args(compare).arg(&ours));
    for key in [
        "Mean PPL(base)                : ",
        "Mean PPL(Q)                   : ",
    ] {
        let (p, l) = (number_after(&by_prima, key), number_after(&by_llama, key));
        assert!((p / l - 1.0).abs() < TOLERANCE, "{key}: {p} vs {l}");
    }
    let kld = "Mean    KLD: ";
    let (p, l) = (number_after(&by_prima, kld), number_after(&by_llama, kld));
    eprintln!("Q4_1 from Q8_0: mean KLD prima {p:.6}, llama-perplexity {l:.6}");
    assert!(p > 0.0 && (p / l - 1.0).abs() < 0.1, "mean KLD {p} vs {l}");
    let top = "Same top p: ";
    let (p, l) = (number_after(&by_prima, top), number_after(&by_llama, top));
    assert!((p - l).abs() < 5.0, "same top token {p}% vs {l}%");
    let _ = std::fs::remove_dir_all(dir);
}

/// A `prima node` on loopback, killed when dropped.
struct Node {
    child: Child,
    addr: String,
}

impl Node {
    fn start(model: &Path) -> Node {
        let mut child = Command::new(env!("CARGO_BIN_EXE_prima"))
            .args(["node", "--listen", "127.0.0.1:0", "-t", "1", "-m"])
            .arg(model)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start prima node");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("node: listening on ") {
                    let _ = tx.send(rest.split(' ').next().unwrap_or_default().to_string());
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the node prints its address");
        Node { child, addr }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A ring of three scores exactly what one device scores: the head computes every
/// scored row's logits from the hidden states the last device sends back.
#[test]
fn a_ring_scores_as_one_device() {
    let Some(model) =
        common::model_or_skip(common::workspace_models().join("SmolLM2-135M-Instruct.Q4_1.gguf"))
    else {
        return;
    };
    let stdout = |cmd: &mut Command| {
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let args = ["-c", CTX, "--chunks", CHUNKS, "-b", "48", "-f"];
    let alone = stdout(prima().arg("-m").arg(&model).args(args).arg(corpus()));
    let nodes = [Node::start(&model), Node::start(&model)];
    let ring = format!("{},{}", nodes[0].addr, nodes[1].addr);
    let on_ring = stdout(
        prima()
            .arg("-m")
            .arg(&model)
            .args(["--ring", &ring, "--windows", "10,10,10"])
            .args(args)
            .arg(corpus()),
    );
    assert!(alone.contains("Final estimate: PPL = "), "{alone}");
    assert_eq!(on_ring, alone);
}

#[test]
fn bad_input_is_a_clear_error() {
    let Some(model) =
        common::model_or_skip(common::workspace_models().join("SmolLM2-135M-Instruct.Q4_1.gguf"))
    else {
        return;
    };
    let dir = scratch("errors");
    let short = dir.join("short.txt");
    std::fs::write(&short, "Too short to score.\n").unwrap();
    let not_logits = dir.join("not.kld");
    std::fs::write(&not_logits, "hello").unwrap();
    for (args, expected) in [
        (
            vec!["-f".as_ref(), short.as_os_str()],
            "needs at least 1024 (two chunks)",
        ),
        (
            vec![
                "--kl-divergence".as_ref(),
                "--kl-divergence-base".as_ref(),
                not_logits.as_os_str(),
            ],
            "not a file of log-probabilities",
        ),
    ] {
        let out = prima().arg("-m").arg(&model).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains(expected), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

//! Flags and defaults that agree: the ranges `prima run` and `prima apply` check are the
//! server's, in its words; llama.cpp's spellings work (`-f`, `-sys`, `--n-gpu-layers`,
//! `--host`/`--port`, platform names for `--backend`); and long work says how it ended
//! (`-n 0`, a full context, too many threads).

mod common;
mod server_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use server_support::{smollm2, Server};

fn prima(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_prima"))
        .args(args)
        .output()
        .expect("run prima")
}

fn run(model: &Path, args: &[&str]) -> Output {
    let mut all = vec!["run", "-m", model.to_str().unwrap(), "-t", "1", "-c", "256"];
    all.extend(args);
    prima(&all)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn out_of_range_sampling_is_refused_in_the_servers_words() {
    let Some(model) = smollm2() else { return };
    for (args, want) in [
        (
            ["--temp", "-1"],
            "--temp must be a number from 0 to 2, not -1",
        ),
        (
            ["--top-p", "2"],
            "--top-p must be a number from 0 to 1, not 2",
        ),
        (
            ["--min-p", "-0.5"],
            "--min-p must be a number from 0 to 1, not -0.5",
        ),
        (["-n", "-2"], "-n must be a number of tokens, or -1"),
    ] {
        let out = run(&model, &[&["-p", "hi"][..], &args[..]].concat());
        assert!(!out.status.success());
        assert!(stderr(&out).contains(want), "{}", stderr(&out));
        // apply takes the same flags, checked the same way, before anything starts.
        let out = prima(&[&["apply", "--dry-run"][..], &args[..]].concat());
        assert!(stderr(&out).contains(want), "{}", stderr(&out));
    }
    // The server says the same of the same value.
    let server = Server::start(&model, &["-c", "256"]);
    let (status, v) = server.post_json(
        "/v1/completions",
        &serde_json::json!({"prompt": "hi", "temperature": -1}),
    );
    assert_eq!(status, 400);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("temperature must be a number from 0 to 2, not -1"),
        "{v}"
    );
}

#[test]
fn llama_cpp_spellings_work() {
    let Some(model) = smollm2() else { return };
    let dir = std::env::temp_dir().join(format!("prima-flags-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file: PathBuf = dir.join("prompt.txt");
    std::fs::write(&file, "The capital of France is").unwrap();
    let greedy = ["-n", "4", "--temp", "0"];
    let given = run(
        &model,
        &[&["-p", "The capital of France is"][..], &greedy].concat(),
    );
    let read = run(
        &model,
        &[
            &["-f", file.to_str().unwrap(), "--n-gpu-layers", "0"][..],
            &greedy,
        ]
        .concat(),
    );
    assert!(read.status.success(), "{}", stderr(&read));
    assert_eq!(read.stdout, given.stdout);
    let sys = run(
        &model,
        &[&["-sys", "Answer in French.", "-p", "Hi"][..], &greedy].concat(),
    );
    assert!(sys.status.success(), "{}", stderr(&sys));
    let _ = std::fs::remove_dir_all(&dir);

    // A backend named by its platform is the plugin that runs there; an unknown name
    // lists the plugins found.
    let out = run(&model, &["-p", "hi", "-n", "1", "--backend", "nosuch"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("named 'nosuch' (found: ") && stderr(&out).contains("cpu"),
        "{}",
        stderr(&out)
    );
    let out = run(&model, &["-p", "hi", "-n", "1", "--backend", "metal"]);
    assert!(
        out.status.success() || !stderr(&out).contains("named 'metal'"),
        "{}",
        stderr(&out)
    );

    // serve --host/--port, as llama-server takes them.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prima"));
    cmd.args([
        "serve",
        "-t",
        "1",
        "-c",
        "256",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "-m",
    ])
    .arg(&model);
    let server = Server::spawn(cmd);
    assert_eq!(server.get("/v1/models").0, 200);
}

#[test]
fn long_work_says_how_it_ended() {
    let Some(model) = smollm2() else { return };
    // -n 0: the prompt is not evaluated, and no rate is made up.
    let out = run(&model, &["-p", "hi", "-n", "0"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not evaluated (-n 0)"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("tok/s"), "{}", stderr(&out));

    // A generation that fills the context says so.
    let out = prima(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-t",
        "1",
        "-c",
        "24",
        "-p",
        "Once upon a time",
        "--temp",
        "0",
        "--ignore-eos",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("stopped: the context is full after 24 tokens"),
        "{}",
        stderr(&out)
    );

    // More threads than cores: a warning, and the run goes on.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let many = (cores * 4).to_string();
    let out = prima(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "hi",
        "-n",
        "1",
        "-t",
        &many,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("warning: -t {many} is more threads than")),
        "{}",
        stderr(&out)
    );
}

#[test]
fn keygen_over_an_existing_key_names_it_and_what_to_do() {
    let dir = std::env::temp_dir().join(format!("prima-flags-key-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let key = dir.join("cluster.key");
    let first = prima(&["keygen", "--out", key.to_str().unwrap()]);
    assert!(first.status.success(), "{}", stderr(&first));
    let fingerprint = stderr(&first)
        .split("fingerprint ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .unwrap()
        .to_string();
    let again = prima(&["keygen", "--out", key.to_str().unwrap()]);
    assert!(!again.status.success());
    let err = stderr(&again);
    assert!(
        err.contains(&format!(
            "{} already holds the cluster key with fingerprint {fingerprint}",
            key.display()
        )) && err.contains("--out OTHER_FILE"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_prints_each_row_as_it_finishes() {
    let Some(model) = smollm2() else { return };
    let out = prima(&[
        "bench",
        "-m",
        model.to_str().unwrap(),
        "-t",
        "1",
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "1",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("| ")).collect();
    assert_eq!(rows.len(), 4, "{stdout}");
    assert!(
        rows[2].starts_with("| pp8 ") && rows[3].starts_with("| tg4 "),
        "{stdout}"
    );
}

/// The load bar's total is what the file holds: SmolLM2's output head is its embedding
/// (tied), read and counted once.
#[test]
fn the_load_bar_counts_a_tied_embedding_once() {
    let Some(path) = smollm2() else { return };
    let model = prima_core::model::Model::load(&path).unwrap();
    let distinct: u64 = model.distinct_weight_tensors().map(|t| t.n_bytes).sum();
    let every: u64 = model.weight_tensors().map(|t| t.n_bytes).sum();
    let file = std::fs::metadata(&path).unwrap().len();
    assert!(
        distinct <= file,
        "{distinct} bytes of weights in a {file}-byte file"
    );
    assert!(
        every > file,
        "SmolLM2's head is tied: counted twice it exceeds the file"
    );
}

/// Ctrl-C on `prima run` ends the generation and prints the figures so far.
#[test]
fn ctrl_c_on_run_prints_the_stats_so_far() {
    use std::io::Read;
    let Some(model) = smollm2() else { return };
    let mut child = Command::new(env!("CARGO_BIN_EXE_prima"))
        .args([
            "run",
            "-t",
            "1",
            "-c",
            "2048",
            "--ignore-eos",
            "-p",
            "Once upon a time",
            "-m",
        ])
        .arg(&model)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Some text first: the generation is under way.
    let mut stdout = child.stdout.take().unwrap();
    let mut byte = [0u8; 1];
    stdout.read_exact(&mut byte).unwrap();
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("stopped early (Ctrl-C") && err.contains("generated "),
        "{err}"
    );
}

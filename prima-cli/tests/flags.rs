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

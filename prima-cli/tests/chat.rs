//! Chat in one command: `prima chat -m MODEL` (= `prima run -i`) reads messages from
//! stdin and answers each, handling `/help`, `/reset` and `/bye` itself; a model file
//! without a chat template (Gemma 3 270M) chats with its architecture's built-in one, on
//! the command line and through `prima serve`'s /v1/chat/completions alike.

mod common;
mod server_support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{model_or_skip, workspace_models};
use serde_json::json;
use server_support::Server;

fn gemma() -> Option<PathBuf> {
    model_or_skip(workspace_models().join("gemma-3-270m-q4_k_m.gguf"))
}

/// `prima ARGS` with `input` on stdin.
fn prima_with_stdin(args: &[&str], input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_prima"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run prima");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn one_reply(model: &Path, message: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_prima"))
        .args([
            "run", "--chat", "-n", "6", "--temp", "0", "-t", "1", "-c", "512",
        ])
        .args(["-p", message, "-m"])
        .arg(model)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    String::from_utf8_lossy(&out.stdout).trim_end().to_string()
}

#[test]
fn a_model_without_a_template_chats_in_one_command() {
    let Some(model) = gemma() else { return };
    let want = one_reply(&model, "Hi");
    let m = model.to_str().unwrap();
    let out = prima_with_stdin(
        &[
            "chat", "-m", m, "-n", "6", "--temp", "0", "-t", "1", "-c", "512",
        ],
        "/help\nHi\n/reset\n\nHi\n/nope\n/bye\nnever read\n",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("/reset  forget the conversation"), "{err}");
    assert!(err.contains("(conversation forgotten)"), "{err}");
    assert!(err.contains("unknown command /nope"), "{err}");
    // Two replies, the same one each time: /reset forgot the first turn, and the
    // commands never reached the model.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let replies: Vec<&str> = stdout.lines().filter(|l| !l.is_empty()).collect();
    assert!(!want.is_empty());
    assert_eq!(stdout.trim_end(), format!("{want}\n{want}"), "{err}");
    assert!(replies.len() >= 2, "{stdout}");

    // A name no template has: the error lists the built-in ones.
    let out = prima_with_stdin(&["run", "-i", "-m", m, "--chat-template", "vicuna"], "");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--chat-template vicuna") && err.contains("chatml, llama3, gemma"),
        "{err}"
    );
}

#[test]
fn the_server_chats_with_the_built_in_template_too() {
    let Some(model) = gemma() else { return };
    let want = one_reply(&model, "Hi");
    let server = Server::start(&model, &["-c", "512"]);
    let (status, v) = server.post_json(
        "/v1/chat/completions",
        &json!({
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 6,
            "temperature": 0,
        }),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .trim_end(),
        want,
        "{v}"
    );
}

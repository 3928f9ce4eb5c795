//! Real clients against `prima serve`: the official `openai` Python package, curl, and
//! `prima chat`.

mod server_support;

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use server_support::{smollm2, sse_events, Server};

/// Whether an optional tool is there; where models are required (CI), it must be.
fn available(what: &str, probe: &mut Command) -> bool {
    let ok = probe
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        if std::env::var_os("PRIMA_REQUIRE_MODELS").is_some() {
            panic!("{what} is required here (PRIMA_REQUIRE_MODELS is set) but is not available");
        }
        eprintln!("note: skipping, {what} is not available");
    }
    ok
}

const OPENAI_SCRIPT: &str = r#"
import json, sys
from openai import OpenAI

client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
messages = [{"role": "user", "content": "Say hello in French."}]
stream = client.chat.completions.create(
    model="smol", messages=messages, temperature=0, max_tokens=16, stream=True,
)
pieces, finish = [], None
for chunk in stream:
    if chunk.choices:
        pieces.append(chunk.choices[0].delta.content or "")
        finish = chunk.choices[0].finish_reason or finish
whole = client.chat.completions.create(
    model="smol", messages=messages, temperature=0, max_tokens=16,
)
models = [m.id for m in client.models.list()]
print(json.dumps({
    "streamed": "".join(pieces),
    "stream_finish": finish,
    "whole": whole.choices[0].message.content,
    "finish": whole.choices[0].finish_reason,
    "completion_tokens": whole.usage.completion_tokens,
    "models": models,
}))
"#;

#[test]
fn the_openai_python_client_streams_and_gets_a_whole_reply() {
    let Some(model) = smollm2() else { return };
    if !available(
        "the `openai` Python package",
        Command::new("python3").args(["-c", "import openai"]),
    ) {
        return;
    }
    let server = Server::start(&model, &["-c", "512", "--alias", "smol"]);
    let out = Command::new("python3")
        .args(["-c", OPENAI_SCRIPT, &server.url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let whole = result["whole"].as_str().unwrap();
    assert!(!whole.trim().is_empty(), "{result}");
    assert_eq!(result["streamed"], whole, "{result}");
    assert_eq!(result["stream_finish"], result["finish"], "{result}");
    assert!(result["completion_tokens"].as_u64().unwrap() >= 1);
    assert_eq!(result["models"], json!(["smol"]));
}

#[test]
fn curl_streams_and_gets_a_whole_reply() {
    let Some(model) = smollm2() else { return };
    if !available("curl", Command::new("curl").arg("--version")) {
        return;
    }
    let server = Server::start(&model, &["-c", "512"]);
    let curl = |body: &Value| {
        let out = Command::new("curl")
            .args(["-sS", "-N", "-H", "Content-Type: application/json", "-d"])
            .arg(body.to_string())
            .arg(format!("{}/v1/chat/completions", server.url))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let body = json!({
        "messages": [{"role": "user", "content": "What is 2 + 2?"}],
        "temperature": 0,
        "max_tokens": 12,
    });
    let whole: Value = serde_json::from_str(&curl(&body)).unwrap();
    let text = whole["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!text.is_empty(), "{whole}");

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (events, done) = sse_events(&curl(&streamed));
    assert!(done);
    let joined: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(joined, text);
}

#[test]
fn prima_chat_streams_replies_and_keeps_the_conversation() {
    let Some(model) = smollm2() else { return };
    let server = Server::start(&model, &["-c", "1024"]);
    let mut chat = Command::new(env!("CARGO_BIN_EXE_prima"))
        .args(["chat", "--temp", "0", "-n", "12", "--url", &server.url])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    chat.stdin
        .take()
        .unwrap()
        .write_all(b"My name is Ada.\n\nWhat is my name?\n/exit\nnever sent\n")
        .unwrap();
    let out = chat.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let replies: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(replies.len() >= 2, "two replies expected: {stdout:?}");

    // Two requests: the second carried the first exchange, so its prompt was longer
    // and its shared beginning came from the cache.
    assert_eq!(
        server.metric(r#"prima_requests_total{endpoint="/v1/chat/completions"}"#),
        2.0
    );
    assert!(server.metric("prima_prompt_tokens_cached_total") > 10.0);
}

#[test]
fn prima_chat_names_a_server_it_cannot_reach() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let out = Command::new(env!("CARGO_BIN_EXE_prima"))
        .args(["chat", "--url", &url])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("cannot reach the server at {url}")),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

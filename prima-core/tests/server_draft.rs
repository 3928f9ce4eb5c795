//! `prima serve --draft` over HTTP: the F16 SmolLM2 served with its Q4_1 as the draft
//! gives the greedy text it gives without a draft, reuses the previous request's cache,
//! and counts drafted and accepted tokens in `/metrics`.

mod common;
mod server_support;

use serde_json::{json, Value};
use server_support::Server;

fn request(prompt: &str) -> Value {
    json!({"prompt": prompt, "max_tokens": 40, "temperature": 0, "ignore_eos": true})
}

/// The replies to a first prompt and to one that continues it (prefix reuse).
fn replies(server: &Server) -> Vec<Value> {
    let first = "The capital of France is";
    let (status, a) = server.post_json("/v1/completions", &request(first));
    assert_eq!(status, 200, "{a}");
    let continued = format!(
        "{first}{} And the capital of Italy is",
        a["choices"][0]["text"].as_str().unwrap()
    );
    let (status, b) = server.post_json("/v1/completions", &request(&continued));
    assert_eq!(status, 200, "{b}");
    vec![a, b]
}

fn text_of(reply: &Value) -> &str {
    reply["choices"][0]["text"].as_str().unwrap()
}

#[test]
fn a_served_draft_gives_the_text_without_one_and_counts_its_tokens() {
    let Some(target) =
        common::model_or_skip(common::derived_models().join("smollm2-135m-f16.gguf"))
    else {
        return;
    };
    let Some(draft) = server_support::smollm2() else {
        return;
    };
    let draft = draft.to_string_lossy().into_owned();

    let plain = replies(&Server::start(&target, &["-c", "512"]));
    let server = Server::start(&target, &["-c", "512", "--draft", &draft]);
    let drafted = replies(&server);
    for (p, d) in plain.iter().zip(&drafted) {
        assert_eq!(text_of(d), text_of(p), "greedy text with a draft differs");
        assert_eq!(d["usage"]["completion_tokens"], 40, "{d}");
    }
    let proposed = server.metric("prima_draft_tokens_total");
    let accepted = server.metric("prima_draft_accepted_total");
    assert!(
        proposed > 0.0 && accepted > 0.0,
        "drafted {proposed}, accepted {accepted}"
    );
    assert!(accepted <= proposed);
    // The second request continued the first: its prompt came from the cache.
    let cached = server.metric("prima_prompt_tokens_cached_total");
    assert!(cached > 0.0, "no prompt tokens were reused");
}

#[test]
fn a_draft_with_several_slots_is_refused() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_prima"))
        .args([
            "serve",
            "-m",
            "x.gguf",
            "--draft",
            "y.gguf",
            "--parallel",
            "2",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--draft") && stderr.contains("--parallel 2"),
        "{stderr}"
    );
}

//! `prima serve --parallel 4` over HTTP on SmolLM2: requests generated at the same time,
//! in one batch per step, each get the greedy text they get alone.

mod server_support;

use std::io::{BufRead, BufReader};

use serde_json::{json, Value};
use server_support::{smollm2, Server};

const PROMPTS: &[&str] = &[
    "The capital of France is",
    "Water boils at a temperature of",
    "A short poem about the sea:\n",
];

fn request(prompt: &str) -> Value {
    json!({"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": true})
}

fn text_of(reply: &Value) -> String {
    reply["choices"][0]["text"].as_str().unwrap().to_string()
}

#[test]
fn concurrent_requests_get_the_text_each_gets_alone() {
    let Some(model) = smollm2() else { return };
    let server = Server::start(&model, &["-c", "512", "--parallel", "4"]);

    let alone: Vec<String> = PROMPTS
        .iter()
        .map(|p| {
            let (status, reply) = server.post_json("/v1/completions", &request(p));
            assert_eq!(status, 200, "{reply}");
            assert_eq!(reply["usage"]["completion_tokens"], 24, "{reply}");
            text_of(&reply)
        })
        .collect();

    // A request that generates until its client leaves, so the others are certainly
    // batched with it (and, sent at once, with each other).
    let endless = json!({
        "prompt": "Once upon a time",
        "max_tokens": 100000,
        "ignore_eos": true,
        "stream": true,
        "temperature": 0,
    });
    let response = server_support::post(
        &format!("{}/v1/completions", server.url),
        &endless.to_string(),
    )
    .unwrap();
    let mut reader = BufReader::new(server_support::reader(response));
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the stream ended");
    }

    let together: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = PROMPTS
            .iter()
            .map(|p| {
                let url = format!("{}/v1/completions", server.url);
                scope.spawn(move || {
                    let mut response = server_support::post(&url, &request(p).to_string()).unwrap();
                    assert_eq!(response.status(), 200);
                    text_of(&response.body_mut().read_json::<Value>().unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone, "batched greedy replies differ from alone");

    assert_eq!(server.metric("prima_slots"), 4.0);
    // Steps ran several sequences: more sequences than steps in all.
    let steps = server.metric("prima_batch_sequences_count");
    let sequences = server.metric("prima_batch_sequences_sum");
    assert!(sequences > steps, "{sequences} sequences in {steps} steps");

    drop(reader); // the endless request's client leaves
    let cancelled =
        server.wait_for_metric(r#"prima_generations_total{finish_reason="cancelled"}"#, 1.0);
    assert_eq!(cancelled, 1.0);
    let busy = server.wait_for_metric_at_most("prima_slots_busy", 0.0);
    assert_eq!(busy, 0.0);
    assert_eq!(server.metric("prima_queue_length"), 0.0);
}

#[test]
fn a_parallel_of_zero_is_refused() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_prima"))
        .args(["serve", "-m", "x.gguf", "--parallel", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--parallel") && stderr.contains("between 1 and 256"),
        "{stderr}"
    );
}

//! Continuous batching round a ring: `serve_blocking_batch` with a `RingHead` of four
//! slots and two `prima node` processes; requests generated together (one batch per
//! trip round the ring) each get the greedy text one device gives them alone.

mod common;
mod server_support;

use std::io::{BufRead, BufReader};

use common::{cpu_backend, Node};
use prima_cluster::prp::{RingHead, RingOptions};
use prima_core::model::{Model, Session};
use prima_server::{serve_blocking, serve_blocking_batch, SchedulerOptions};
use serde_json::{json, Value};
use server_support::smollm2;

const PROMPTS: &[&str] = &[
    "The capital of France is",
    "Water boils at a temperature of",
    "A short poem about the sea:\n",
];

fn request(prompt: &str) -> String {
    json!({"prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": true}).to_string()
}

fn complete(url: &str, prompt: &str) -> String {
    let mut r = server_support::post(&format!("{url}/v1/completions"), &request(prompt)).unwrap();
    let v: Value = r.body_mut().read_json().unwrap();
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

/// Runs `client` against a server on a fresh port while `serve` serves it on this thread.
fn with_server<T: Send + 'static>(
    serve: impl FnOnce(std::net::TcpListener, prima_server::Shutdown),
    client: impl FnOnce(String) -> T + Send + 'static,
) -> T {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let client = std::thread::spawn(move || {
        let out = client(url);
        let _ = stop_tx.send(());
        out
    });
    serve(
        listener,
        Box::pin(async move {
            let _ = stop_rx.await;
        }),
    );
    client.join().unwrap()
}

#[test]
fn concurrent_requests_round_a_ring_get_what_one_device_gives_each_alone() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let tok = prima_core::tokenizer::Tokenizer::from_gguf(model.gguf()).unwrap();
    let backend = cpu_backend(1);
    let be = &backend.backend;

    // One device, one request at a time.
    let mut single = Session::new(&model, be, 512, 64).unwrap();
    let alone = with_server(
        |listener, shutdown| {
            serve_blocking(&mut single, &tok, "smol", listener, Some(shutdown), |_| {}).unwrap()
        },
        |url| {
            PROMPTS
                .iter()
                .map(|p| complete(&url, p))
                .collect::<Vec<_>>()
        },
    );

    let transport = common::tcp_transport();
    let nodes = [Node::start(&path), Node::start(&path)];
    let addrs: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
    let options = RingOptions {
        n_ctx: 512,
        n_batch: 64,
        n_slots: 4,
        listen: "127.0.0.1:0".into(),
        security: common::test_security(),
        ..RingOptions::default()
    };
    let mut head = RingHead::connect(
        &model,
        be,
        &transport.transport,
        &addrs,
        &[4, 3, 3],
        &options,
    )
    .unwrap();
    let (together, sequences, steps) = with_server(
        |listener, shutdown| {
            let options = SchedulerOptions::default();
            serve_blocking_batch(
                &mut head,
                &tok,
                "smol",
                listener,
                Some(shutdown),
                options,
                |_| {},
            )
            .unwrap()
        },
        |url| {
            // A request that runs until its client leaves, so the others certainly share
            // its batches.
            let endless = json!({"prompt": "Once upon a time", "max_tokens": 100000,
                "ignore_eos": true, "stream": true, "temperature": 0});
            let response =
                server_support::post(&format!("{url}/v1/completions"), &endless.to_string())
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
                        let url = &url;
                        scope.spawn(move || complete(url, p))
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            drop(reader);
            let page = server_support::agent()
                .get(format!("{url}/metrics"))
                .call()
                .unwrap()
                .body_mut()
                .read_to_string()
                .unwrap();
            let value = |series: &str| -> f64 {
                page.lines()
                    .find_map(|l| l.strip_prefix(&format!("{series} ")))
                    .map_or(0.0, |v| v.parse().unwrap())
            };
            (
                together,
                value("prima_batch_sequences_sum"),
                value("prima_batch_sequences_count"),
            )
        },
    );
    head.shutdown(false);
    assert!(alone.iter().all(|t| !t.is_empty()), "{alone:?}");
    assert_eq!(
        together, alone,
        "batched round the ring differs from one device alone"
    );
    assert!(sequences > steps, "{sequences} sequences in {steps} steps");
}

//! The server in front of a ring, as `prima apply` runs it: `serve_blocking` with a
//! `RingHead` on this thread and two `prima node` processes must answer exactly what it
//! answers with one device, and record every device's time in `/metrics`.

mod common;
mod server_support;

use common::cpu_backend;
use common::Node;
use prima_cluster::prp::{RingHead, RingOptions};
use prima_core::generate::Forward;
use prima_core::model::{Model, Session};
use prima_core::tokenizer::Tokenizer;
use prima_server::{metrics, serve_blocking};
use serde_json::{json, Value};
use server_support::smollm2;

/// A conversation sent twice (the second time from the cache), then a raw completion.
fn requests() -> Vec<(&'static str, Value)> {
    let chat = json!({
        "messages": [{"role": "user", "content": "Write a haiku about rivers."}],
        "temperature": 0,
        "max_tokens": 16,
    });
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    vec![
        ("/v1/chat/completions", chat),
        ("/v1/chat/completions", streamed),
        (
            "/v1/completions",
            json!({"prompt": "The three primary colours are", "temperature": 0, "max_tokens": 12}),
        ),
    ]
}

/// Serves `forward` until the client thread has sent `requests()`; returns the texts
/// and the `/metrics` page read at the end.
fn serve_and_ask<F: Forward>(
    forward: &mut F,
    tok: &Tokenizer,
    after_job: impl FnMut(&mut F),
) -> (Vec<String>, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let client = std::thread::spawn(move || {
        let mut texts = Vec::new();
        for (path, body) in requests() {
            let r = server_support::post(&format!("{url}{path}"), &body.to_string())
                .unwrap()
                .body_mut()
                .read_to_string()
                .unwrap();
            texts.push(if body["stream"] == true {
                let (events, done) = server_support::sse_events(&r);
                assert!(done);
                events
                    .iter()
                    .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
                    .collect()
            } else {
                let v: Value = serde_json::from_str(&r).unwrap();
                let c = &v["choices"][0];
                c["message"]["content"]
                    .as_str()
                    .or(c["text"].as_str())
                    .unwrap()
                    .to_string()
            });
        }
        let metrics = server_support::agent()
            .get(format!("{url}/metrics"))
            .call()
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap();
        let _ = stop_tx.send(());
        (texts, metrics)
    });
    let shutdown = Box::pin(async move {
        let _ = stop_rx.await;
    });
    serve_blocking(forward, tok, "smol", listener, Some(shutdown), after_job).unwrap();
    client.join().unwrap()
}

#[test]
fn a_ring_head_serves_what_one_device_serves() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
    let backend = cpu_backend(1);
    let be = &backend.backend;

    let mut single = Session::new(&model, be, 512, 64).unwrap();
    let (want, _) = serve_and_ask(&mut single, &tok, |_| {});
    assert!(want.iter().all(|t| !t.is_empty()), "{want:?}");
    assert_eq!(
        want[0], want[1],
        "the cached conversation answered differently"
    );

    let transport = common::tcp_transport();
    let nodes = [Node::start(&path), Node::start(&path)];
    let addrs: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
    let options = RingOptions {
        n_ctx: 512,
        n_batch: 64,
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
    let names: Vec<String> = ["head", "node-a", "node-b"].map(String::from).to_vec();
    let mut collected = 0;
    let (got, page) = serve_and_ask(&mut head, &tok, |head| {
        let stats = head.collect_stats().unwrap();
        metrics::record_ring_stats(&stats, &names);
        collected += 1;
    });
    head.shutdown(false);
    assert_eq!(got, want, "the ring answered differently from one device");
    assert_eq!(collected, 3);
    for name in &names {
        let series = format!("prima_device_compute_microseconds_total{{device=\"{name}\"}}");
        let value = page
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{series} ")))
            .unwrap_or_else(|| panic!("no {series} in:\n{page}"));
        assert!(value.parse::<f64>().unwrap() > 0.0, "{series} {value}");
        assert!(page.contains(&format!(
            "prima_device_memory_pressure{{device=\"{name}\"}}"
        )));
    }
}

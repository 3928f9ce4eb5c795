//! `prima serve` end to end over HTTP on SmolLM2: the OpenAI endpoints, streaming,
//! stop strings and limits, metrics, bad requests, and cancellation.

mod server_support;

use std::io::{BufRead, BufReader, Read, Write};

use serde_json::{json, Value};
use server_support::{smollm2, sse_events, Server};

fn greeting(extra: Value) -> Value {
    let mut body = json!({
        "model": "anything",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Name three colours of the rainbow."},
        ],
        "temperature": 0,
        "max_tokens": 24,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// The concatenated text of chat (`delta.content`) or completion (`text`) chunks.
fn streamed_text(events: &[Value]) -> String {
    events
        .iter()
        .filter_map(|e| {
            let c = &e["choices"][0];
            c["delta"]["content"].as_str().or(c["text"].as_str())
        })
        .collect()
}

#[test]
fn streamed_chat_equals_the_whole_reply_and_usage_is_counted() {
    let Some(model) = smollm2() else { return };
    let server = Server::start(&model, &["-c", "512"]);

    let (status, whole) = server.post_json("/v1/chat/completions", &greeting(json!({})));
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["model"], "SmolLM2-135M-Instruct.Q4_1");
    let choice = &whole["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    let text = choice["message"]["content"].as_str().unwrap().to_string();
    assert!(!text.trim().is_empty(), "{whole}");
    let usage = &whole["usage"];
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    let completion_tokens = usage["completion_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 10, "{usage}");
    assert!((1..=24).contains(&completion_tokens), "{usage}");
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(prompt_tokens + completion_tokens)
    );
    let finish = choice["finish_reason"].as_str().unwrap();
    assert_eq!(finish == "length", completion_tokens == 24, "{whole}");

    let (status, body) = server.post(
        "/v1/chat/completions",
        &greeting(json!({"stream": true, "stream_options": {"include_usage": true}})).to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let (events, done) = sse_events(&body);
    assert!(done, "no [DONE]: {body}");
    assert!(events.len() >= 3, "{body}");
    assert!(events
        .iter()
        .all(|e| e["object"] == "chat.completion.chunk"));
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(
        streamed_text(&events),
        text,
        "streamed and whole greedy replies differ"
    );
    let last_choice = events
        .iter()
        .rev()
        .find(|e| !e["choices"].as_array().unwrap().is_empty());
    assert_eq!(last_choice.unwrap()["choices"][0]["finish_reason"], finish);
    let usage_chunk = events.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"], whole["usage"]);

    // The raw-text API: the same text streamed and whole.
    let prompt = json!({"prompt": "The capital of France is", "temperature": 0, "max_tokens": 12});
    let (status, whole) = server.post_json("/v1/completions", &prompt);
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "text_completion");
    let text = whole["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(!text.is_empty(), "{whole}");
    let mut streamed = prompt.clone();
    streamed["stream"] = json!(true);
    let (status, body) = server.post("/v1/completions", &streamed.to_string());
    assert_eq!(status, 200, "{body}");
    let (events, done) = sse_events(&body);
    assert!(done);
    assert_eq!(streamed_text(&events), text);
}

#[test]
fn stop_strings_and_max_tokens_end_the_reply() {
    let Some(model) = smollm2() else { return };
    let server = Server::start(&model, &["-c", "512"]);
    let prompt = json!({"prompt": "1, 2, 3, 4, 5,", "temperature": 0, "max_tokens": 20});
    let (status, free) = server.post_json("/v1/completions", &prompt);
    assert_eq!(status, 200, "{free}");
    let text = free["choices"][0]["text"].as_str().unwrap();
    assert!(text.contains('8'), "the model should count on: {text:?}");

    // Stop at "8": what comes before it, and finish_reason "stop".
    let mut with_stop = prompt.clone();
    with_stop["stop"] = json!(["8", "never appears"]);
    let (status, stopped) = server.post_json("/v1/completions", &with_stop);
    assert_eq!(status, 200, "{stopped}");
    assert_eq!(
        stopped["choices"][0]["text"],
        text[..text.find('8').unwrap()]
    );
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");

    // The same, streamed: the stop string never reaches the client.
    with_stop["stream"] = json!(true);
    let (_, body) = server.post("/v1/completions", &with_stop.to_string());
    let (events, done) = sse_events(&body);
    assert!(done);
    assert_eq!(streamed_text(&events), text[..text.find('8').unwrap()]);
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );

    // max_tokens: exactly that many tokens, finish_reason "length".
    let mut short = prompt.clone();
    short["max_tokens"] = json!(3);
    short["ignore_eos"] = json!(true);
    let (status, cut) = server.post_json("/v1/completions", &short);
    assert_eq!(status, 200, "{cut}");
    assert_eq!(cut["usage"]["completion_tokens"], 3);
    assert_eq!(cut["choices"][0]["finish_reason"], "length");
    assert!(text.starts_with(cut["choices"][0]["text"].as_str().unwrap()));
}

#[test]
fn models_health_and_metrics() {
    let Some(model) = smollm2() else { return };
    let server = Server::start(&model, &["-c", "512", "--alias", "smol"]);
    let (status, health) = server.get("/health");
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&health).unwrap()["status"],
        "ok"
    );

    let (status, models) = server.get("/v1/models");
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "smol");
    assert_eq!(models["data"][0]["object"], "model");

    let (status, reply) = server.post_json("/v1/chat/completions", &greeting(json!({})));
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["model"], "smol");
    let generated = reply["usage"]["completion_tokens"].as_f64().unwrap();
    let prompt = reply["usage"]["prompt_tokens"].as_f64().unwrap();

    let (status, text) = server.get("/metrics");
    assert_eq!(status, 200);
    for needle in [
        "# TYPE prima_time_to_first_token_seconds histogram",
        "# TYPE prima_time_per_output_token_seconds histogram",
        "prima_time_to_first_token_seconds_bucket{le=",
        "prima_time_to_first_token_seconds_count 1",
    ] {
        assert!(text.contains(needle), "no {needle:?} in:\n{text}");
    }
    assert_eq!(server.metric("prima_generated_tokens_total"), generated);
    assert_eq!(server.metric("prima_prompt_tokens_total"), prompt);
    assert_eq!(
        server.metric(r#"prima_requests_total{endpoint="/v1/chat/completions"}"#),
        1.0
    );
    let finished: f64 = ["stop", "length"]
        .iter()
        .map(|r| {
            server.metric(&format!(
                r#"prima_generations_total{{finish_reason="{r}"}}"#
            ))
        })
        .sum();
    assert_eq!(finished, 1.0);

    // The same conversation again reuses the cached prompt.
    let (status, again) = server.post_json("/v1/chat/completions", &greeting(json!({})));
    assert_eq!(status, 200);
    assert_eq!(
        again["choices"][0]["message"],
        reply["choices"][0]["message"]
    );
    assert_eq!(
        again["timings"]["prompt_cached_n"].as_f64(),
        Some(prompt - 1.0)
    );
    assert_eq!(
        server.metric("prima_prompt_tokens_cached_total"),
        prompt - 1.0
    );
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let Some(model) = smollm2() else { return };
    let server = Server::start(&model, &["-c", "128"]);
    let long_prompt = "tell me a story about a dragon ".repeat(40);
    for (path, body, param, needle) in [
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "#.to_string(),
            None,
            "not valid JSON",
        ),
        (
            "/v1/chat/completions",
            "[]".to_string(),
            None,
            "JSON object",
        ),
        (
            "/v1/chat/completions",
            r#"{"model": "x"}"#.to_string(),
            Some("messages"),
            "messages",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}"#
                .to_string(),
            Some("temperature"),
            "temperature",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "max_tokens": -5}"#.to_string(),
            Some("max_tokens"),
            "max_tokens",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "stop": 7}"#.to_string(),
            Some("stop"),
            "stop",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": long_prompt}]}).to_string(),
            Some("messages"),
            "context holds 128",
        ),
        (
            "/v1/completions",
            json!({"prompt": long_prompt, "stream": true}).to_string(),
            Some("prompt"),
            "context holds 128",
        ),
    ] {
        let (status, text) = server.post(path, &body);
        assert_eq!(status, 400, "{path} {body}: {text}");
        let error: Value = serde_json::from_str(&text).unwrap();
        let error = &error["error"];
        assert_eq!(error["type"], "invalid_request_error", "{text}");
        assert!(
            error["message"].as_str().unwrap().contains(needle),
            "{text}"
        );
        assert_eq!(error["param"].as_str(), param, "{text}");
        assert!(error.get("code").is_some(), "{text}");
    }
    let (status, text) = server.post(
        "/v1/completions",
        &json!({"prompt": long_prompt}).to_string(),
    );
    assert_eq!(status, 400);
    assert!(text.contains("context_length_exceeded"), "{text}");

    let (status, text) = server.get("/v1/nothing");
    assert_eq!(status, 404);
    assert!(text.contains("unknown endpoint: GET /v1/nothing"), "{text}");
    let (status, text) = server.get("/v1/chat/completions");
    assert_eq!(status, 405);
    assert!(
        text.contains("/v1/chat/completions does not accept GET"),
        "{text}"
    );

    // Still serving.
    let (status, reply) = server.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
    );
    assert_eq!(status, 200, "{reply}");
    assert!(reply["usage"]["completion_tokens"].as_u64().unwrap() >= 1);
    assert_eq!(
        server.metric(
            r#"prima_request_errors_total{endpoint="/v1/chat/completions",type="invalid_request_error"}"#
        ),
        5.0
    );
}

/// A request that would run to the end of the context if nothing stopped it.
fn endless(stream: bool) -> Value {
    json!({
        "prompt": "Once upon a time",
        "max_tokens": 100000,
        "ignore_eos": true,
        "stream": stream,
        "temperature": 0,
    })
}

const ENDLESS_CTX: &str = "2048";

#[test]
fn a_client_that_disconnects_cancels_its_generation() {
    let Some(model) = smollm2() else { return };
    let server = Server::start(&model, &["-c", ENDLESS_CTX]);
    let response = server_support::post(
        &format!("{}/v1/completions", server.url),
        &endless(true).to_string(),
    )
    .unwrap();
    let mut reader = BufReader::new(server_support::reader(response));
    let mut chunks = 0;
    let mut line = String::new();
    while chunks < 3 {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "the stream ended early"
        );
        if line.starts_with("data: ") {
            chunks += 1;
        }
    }
    drop(reader); // closes the connection

    let cancelled =
        server.wait_for_metric(r#"prima_generations_total{finish_reason="cancelled"}"#, 1.0);
    assert_eq!(cancelled, 1.0, "the streamed generation was not cancelled");

    // Not streamed: the client leaves while waiting for the whole reply.
    let mut client =
        std::net::TcpStream::connect(server.url.trim_start_matches("http://")).unwrap();
    let body = endless(false).to_string();
    write!(
        client,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let seen = server.wait_for_metric(r#"prima_requests_total{endpoint="/v1/completions"}"#, 2.0);
    assert_eq!(seen, 2.0);
    drop(client);
    let cancelled =
        server.wait_for_metric(r#"prima_generations_total{finish_reason="cancelled"}"#, 2.0);
    assert_eq!(
        cancelled, 2.0,
        "the whole-reply generation was not cancelled"
    );

    // Far fewer tokens than the two requests would have generated to the end.
    let generated = server.metric("prima_generated_tokens_total");
    assert!(
        generated < 2000.0,
        "{generated} tokens generated after the clients left"
    );

    // The next request is served.
    let (status, reply) = server.post_json(
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 2}),
    );
    assert_eq!(status, 200, "{reply}");
}

#[test]
fn post_cancel_stops_the_running_generation() {
    let Some(model) = smollm2() else { return };
    let server = Server::start(&model, &["-c", ENDLESS_CTX]);
    let (status, idle) = server.post("/v1/cancel", "");
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&idle).unwrap()["cancelled"],
        false
    );

    // Streamed: the stream ends with finish_reason "cancelled" and [DONE].
    let response = server_support::post(
        &format!("{}/v1/completions", server.url),
        &endless(true).to_string(),
    )
    .unwrap();
    let mut reader = BufReader::new(server_support::reader(response));
    let mut first = String::new();
    while !first.starts_with("data: ") {
        first.clear();
        reader.read_line(&mut first).unwrap();
    }
    let (status, text) = server.post("/v1/cancel", "");
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["cancelled"],
        true
    );
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    let (events, done) = sse_events(&rest);
    assert!(done, "{rest}");
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "cancelled"
    );
    let generated = events.last().unwrap()["timings"]["predicted_n"]
        .as_u64()
        .unwrap();
    assert!(
        generated < 1000,
        "{generated} tokens generated after the cancel"
    );

    // Not streamed: the reply so far, finish_reason "cancelled".
    let url = server.url.clone();
    let waiter = std::thread::spawn(move || {
        let r = server_support::post(
            &format!("{url}/v1/completions"),
            &endless(false).to_string(),
        );
        r.unwrap().body_mut().read_json::<Value>().unwrap()
    });
    let started =
        server.wait_for_metric(r#"prima_requests_total{endpoint="/v1/completions"}"#, 2.0);
    assert_eq!(started, 2.0);
    // Cancel once the generation is under way (the request may still be queued).
    let mut cancelled = false;
    for _ in 0..2400 {
        let (_, text) = server.post("/v1/cancel", "");
        if serde_json::from_str::<Value>(&text).unwrap()["cancelled"] == true {
            cancelled = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(cancelled);
    let reply = waiter.join().unwrap();
    assert_eq!(reply["choices"][0]["finish_reason"], "cancelled", "{reply}");
}

#[test]
fn ctrl_c_ends_the_running_generation_and_the_server() {
    let Some(model) = smollm2() else { return };
    let mut server = Server::start(&model, &["-c", ENDLESS_CTX]);
    let response = server_support::post(
        &format!("{}/v1/completions", server.url),
        &endless(true).to_string(),
    )
    .unwrap();
    let mut reader = BufReader::new(server_support::reader(response));
    let mut first = String::new();
    while !first.starts_with("data: ") {
        first.clear();
        reader.read_line(&mut first).unwrap();
    }
    let (status, stderr) = server.interrupt();
    assert!(status.success(), "{status}: {stderr:?}");
    assert!(stderr.iter().any(|l| l == "serve: stopped"), "{stderr:?}");
    // The stream was finished, not cut.
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    let (events, done) = sse_events(&rest);
    assert!(done, "{rest}");
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "cancelled"
    );
}

//! The HTTP front end (axum): routes, streaming, errors. It submits work to the
//! [`JobQueue`] and never touches the model.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{json, Value};

use super::metrics::{record_request, record_request_error};
use super::openai::{error_body, parse_request, Api, BadRequest, ResponseHeader};
use crate::harmony::{Delta, Reply, ReplyFormat, ReplyReader};
use crate::job::{Event, WorkerError};
use crate::queue::{JobQueue, Submitted};

/// What every request handler shares.
#[derive(Clone)]
pub struct ServerState {
    inner: Arc<Inner>,
}

struct Inner {
    model_name: String,
    queue: JobQueue,
    metrics: Option<PrometheusHandle>,
    /// How chat replies are read (gpt-oss's harmony channels, or plain text).
    reply_format: ReplyFormat,
    /// Unix seconds when the server started (the model's `created`).
    started: u64,
    next_id: AtomicU64,
}

impl ServerState {
    /// `model_name` is what `/v1/models` lists and responses name; `metrics` renders
    /// `/metrics` (from [`super::metrics::install`]; `None` serves an empty page).
    pub fn new(
        model_name: impl Into<String>,
        queue: JobQueue,
        metrics: Option<PrometheusHandle>,
    ) -> ServerState {
        ServerState {
            inner: Arc::new(Inner {
                model_name: model_name.into(),
                queue,
                metrics,
                reply_format: ReplyFormat::Plain,
                started: unix_now(),
                next_id: AtomicU64::new(1),
            }),
        }
    }

    /// Chat replies read in `format` (from [`ReplyFormat::of`] the model's tokenizer);
    /// plain text unless set. Call before the state is cloned.
    pub fn with_reply_format(mut self, format: ReplyFormat) -> ServerState {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.reply_format = format,
            None => tracing::warn!("the reply format is set on a state already shared"),
        }
        self
    }

    pub fn queue(&self) -> &JobQueue {
        &self.inner.queue
    }
}

/// Serves the API on `listener` until `shutdown` completes; then cancels the running
/// generation, refuses queued ones, and returns once open connections have finished.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ServerState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let queue = state.inner.queue.clone();
    let app = Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/cancel", post(cancel))
        .route("/metrics", get(metrics))
        .merge(crate::web::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            tracing::info!("shutting down: cancelling the running generation");
            queue.close();
            crate::board::board().close_streams();
        })
        .await
}

async fn health() -> Json<Value> {
    record_request("/health");
    Json(json!({"status": "ok"}))
}

async fn models(State(state): State<ServerState>) -> Json<Value> {
    record_request("/v1/models");
    Json(json!({
        "object": "list",
        "data": [{
            "id": state.inner.model_name,
            "object": "model",
            "created": state.inner.started,
            "owned_by": "prima",
        }],
    }))
}

async fn cancel(State(state): State<ServerState>) -> Json<Value> {
    record_request("/v1/cancel");
    Json(json!({"cancelled": state.inner.queue.cancel_running()}))
}

async fn metrics(State(state): State<ServerState>) -> Response {
    record_request("/metrics");
    let text = match &state.inner.metrics {
        Some(handle) => {
            handle.run_upkeep();
            handle.render()
        }
        None => String::new(),
    };
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn not_found(method: Method, uri: Uri) -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        &format!("unknown endpoint: {method} {}", uri.path()),
        "invalid_request_error",
        None,
        None,
    )
}

async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        &format!("{} does not accept {method}", uri.path()),
        "invalid_request_error",
        None,
        None,
    )
}

async fn chat_completions(
    State(state): State<ServerState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    complete(state, Api::Chat, body).await
}

async fn completions(
    State(state): State<ServerState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    complete(state, Api::Text, body).await
}

/// Parses, queues, and answers one generation request.
async fn complete(state: ServerState, api: Api, body: Result<Bytes, BytesRejection>) -> Response {
    let endpoint = api.endpoint();
    record_request(endpoint);
    let body = match body {
        Ok(b) => b,
        Err(rejection) => {
            // Too large (over axum's 2 MB default), or the connection failed mid-body.
            record_request_error(endpoint, "invalid_request_error");
            return error_response(
                rejection.status(),
                &format!("cannot read the request body: {}", rejection.body_text()),
                "invalid_request_error",
                None,
                None,
            );
        }
    };
    let request = match parse_request(api, &body) {
        Ok(r) => r,
        Err(BadRequest { message, param }) => {
            record_request_error(endpoint, "invalid_request_error");
            return error_response(
                StatusCode::BAD_REQUEST,
                &message,
                "invalid_request_error",
                param,
                None,
            );
        }
    };
    let mut submitted = match state.inner.queue.submit(request.generation) {
        Ok(s) => s,
        Err(e) => return worker_error(api, &e),
    };
    // Wait for the worker to accept the prompt, so a prompt that does not fit is an HTTP
    // error rather than an error inside a stream that has already begun.
    loop {
        match submitted.events.recv().await {
            Some(Event::Started { .. }) => break,
            Some(Event::Failed(e)) => return worker_error(api, &e),
            Some(_) => continue,
            None => return worker_error(api, &WorkerError::ShuttingDown),
        }
    }
    let reader = ReplyReader::new(match api {
        Api::Chat => state.inner.reply_format,
        Api::Text => ReplyFormat::Plain,
    });
    let header = Header {
        api,
        id: state.inner.next_id.fetch_add(1, Ordering::Relaxed),
        created: unix_now(),
        model: state.inner.model_name.clone(),
    };
    if request.stream {
        stream_response(header, submitted, reader, request.include_usage)
    } else {
        whole_response(header, submitted, reader).await
    }
}

/// [`ResponseHeader`] with an owned model name, to live inside a stream.
struct Header {
    api: Api,
    id: u64,
    created: u64,
    model: String,
}

impl Header {
    fn view(&self) -> ResponseHeader<'_> {
        ResponseHeader {
            api: self.api,
            id: self.id,
            created: self.created,
            model: &self.model,
        }
    }
}

async fn whole_response(
    header: Header,
    mut submitted: Submitted,
    mut reader: ReplyReader,
) -> Response {
    let mut reply = Reply::default();
    while let Some(event) = submitted.events.recv().await {
        match event {
            Event::Text(t) => reader.push(&t).into_iter().for_each(|d| reply.add(d)),
            Event::Done(c) => {
                reader.finish().into_iter().for_each(|d| reply.add(d));
                return Json(header.view().complete(&reply, &c)).into_response();
            }
            Event::Failed(e) => return worker_error(header.api, &e),
            Event::Started { .. } => {}
        }
    }
    worker_error(header.api, &WorkerError::ShuttingDown)
}

/// Server-sent events: one `data: {chunk}` per delta of the reply (reasoning, content,
/// tool call), then the finish chunk, the usage chunk if asked, and `data: [DONE]`.
/// Dropping the stream (the client went away) drops `submitted`, which cancels the
/// generation.
fn stream_response(
    header: Header,
    submitted: Submitted,
    reader: ReplyReader,
    include_usage: bool,
) -> Response {
    let state = Stream {
        header,
        submitted,
        reader,
        include_usage,
        first: true,
        tool_calls: false,
        finished: false,
    };
    let body = futures_util::stream::unfold(state, |mut s| async move {
        // Events that give no delta (a marker, text held back) send nothing.
        while !s.finished {
            let out = s.next_events().await;
            if !out.is_empty() {
                return Some((Ok::<_, Infallible>(Bytes::from(out)), s));
            }
        }
        None
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// One streamed response in progress.
struct Stream {
    header: Header,
    submitted: Submitted,
    reader: ReplyReader,
    include_usage: bool,
    /// No chunk sent yet: the next carries the assistant role.
    first: bool,
    /// A tool call was sent: the finish reason is "tool_calls".
    tool_calls: bool,
    finished: bool,
}

impl Stream {
    /// The server-sent events of the next worker event (possibly none).
    async fn next_events(&mut self) -> String {
        let event = loop {
            match self.submitted.events.recv().await {
                Some(Event::Started { .. }) => continue,
                other => break other,
            }
        };
        let mut out = String::new();
        match event {
            Some(Event::Text(t)) => {
                let deltas = self.reader.push(&t);
                self.deltas(&mut out, deltas);
            }
            Some(Event::Done(c)) => {
                let deltas = self.reader.finish();
                self.deltas(&mut out, deltas);
                let h = self.header.view();
                push_event(
                    &mut out,
                    &h.chunk(None, self.first, Some((&c, self.tool_calls))),
                );
                if self.include_usage {
                    push_event(&mut out, &h.usage_chunk(&c.usage));
                }
                out.push_str("data: [DONE]\n\n");
                self.finished = true;
            }
            Some(Event::Failed(e)) => {
                push_event(&mut out, &worker_error_body(&e));
                record_request_error(self.header.api.endpoint(), error_type(&e));
                out.push_str("data: [DONE]\n\n");
                self.finished = true;
            }
            Some(Event::Started { .. }) | None => {
                push_event(&mut out, &worker_error_body(&WorkerError::ShuttingDown));
                out.push_str("data: [DONE]\n\n");
                self.finished = true;
            }
        }
        out
    }

    fn deltas(&mut self, out: &mut String, deltas: Vec<Delta>) {
        let h = self.header.view();
        for d in &deltas {
            push_event(out, &h.chunk(Some(d), self.first, None));
            self.first = false;
            self.tool_calls |= matches!(d, Delta::ToolCall(_));
        }
    }
}

fn push_event(out: &mut String, value: &Value) {
    out.push_str("data: ");
    out.push_str(&value.to_string());
    out.push_str("\n\n");
}

fn error_type(e: &WorkerError) -> &'static str {
    if e.is_client_error() {
        "invalid_request_error"
    } else {
        "server_error"
    }
}

fn worker_error_body(e: &WorkerError) -> Value {
    error_body(&e.to_string(), error_type(e), None, e.code())
}

fn worker_error(api: Api, e: &WorkerError) -> Response {
    let status = match e {
        _ if e.is_client_error() => StatusCode::BAD_REQUEST,
        WorkerError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    record_request_error(api.endpoint(), error_type(e));
    let param = match (e, api) {
        (WorkerError::PromptTooLong { .. } | WorkerError::EmptyPrompt, Api::Chat) => {
            Some("messages")
        }
        (WorkerError::PromptTooLong { .. } | WorkerError::EmptyPrompt, Api::Text) => Some("prompt"),
        _ => None,
    };
    error_response(status, &e.to_string(), error_type(e), param, e.code())
}

fn error_response(
    status: StatusCode,
    message: &str,
    kind: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Response {
    (status, Json(error_body(message, kind, param, code))).into_response()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::time::Duration;

    use serde_json::Value;

    use super::*;
    use crate::job::{Completion, FinishReason, Usage};
    use crate::queue::{job_queue, JobReceiver};

    /// A gpt-oss reply as the worker sends it: one piece per token.
    const THINK_THEN_ANSWER: &[&str] = &[
        "<|channel|>",
        "analysis",
        "<|message|>",
        "Say",
        " hi",
        ".",
        "<|end|>",
        "<|start|>",
        "assistant",
        "<|channel|>",
        "final",
        "<|message|>",
        "Hi",
        "!",
    ];
    const CALL: &[&str] = &[
        "<|channel|>",
        "commentary",
        " to",
        "=functions",
        ".get_weather",
        " ",
        "<|constrain|>",
        "json",
        "<|message|>",
        "{\"city\":",
        "\"Paris\"}",
    ];

    /// Serves `format` over HTTP with a worker that answers every job with `pieces` and
    /// `reason`; runs `client` with the address, then shuts down.
    fn with_server(
        format: ReplyFormat,
        pieces: &'static [&'static str],
        reason: FinishReason,
        client: impl FnOnce(std::net::SocketAddr),
    ) {
        let (queue, jobs) = job_queue();
        let state = ServerState::new("gpt-oss", queue, None).with_reply_format(format);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let http = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                serve(listener, state, async move {
                    let _ = stop_rx.await;
                })
                .await
                .unwrap();
            });
        });
        let worker = std::thread::spawn(move || fake_worker(jobs, pieces, reason));
        client(addr);
        stop_tx.send(()).unwrap();
        http.join().unwrap();
        worker.join().unwrap();
    }

    fn fake_worker(jobs: JobReceiver, pieces: &[&str], reason: FinishReason) {
        while let Ok(job) = jobs.rx.recv() {
            let _ = job.send(Event::Started { prompt_tokens: 3 });
            for p in pieces {
                let _ = job.send(Event::Text(p.to_string()));
            }
            let _ = job.send(Event::Done(Completion {
                usage: Usage {
                    prompt_tokens: 3,
                    completion_tokens: pieces.len(),
                },
                finish_reason: reason,
                cached_prompt_tokens: 0,
                time_to_first_token: Duration::ZERO,
                tpot_ms: 0.0,
                draft: None,
            }));
        }
    }

    /// The body of an HTTP/1.0 POST (the server closes the connection after it).
    fn post(addr: std::net::SocketAddr, path: &str, body: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut response = String::new();
        s.read_to_string(&mut response).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        assert!(
            head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
            "{head}"
        );
        body.to_string()
    }

    fn chat(stream: bool) -> String {
        serde_json::json!({"messages": [{"role": "user", "content": "Hi"}], "stream": stream})
            .to_string()
    }

    /// The `data:` events of a server-sent stream, up to `[DONE]`.
    fn events(body: &str) -> Vec<Value> {
        let data: Vec<&str> = body
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .collect();
        assert_eq!(data.last(), Some(&"[DONE]"), "{body}");
        data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    /// The response to an HTTP/1.0 GET: head and body (of a stream that does not end,
    /// what came until the response holds `until`).
    fn get(addr: std::net::SocketAddr, path: &str, until: Option<&str>) -> (String, String) {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(s, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
        let mut response = Vec::new();
        let mut buf = [0u8; 4096];
        while until.is_none_or(|u| !String::from_utf8_lossy(&response).contains(u)) {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => response.extend_from_slice(&buf[..n]),
            }
        }
        let response = String::from_utf8_lossy(&response).into_owned();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        (head.to_string(), body.to_string())
    }

    #[test]
    fn the_page_is_served_with_its_files_and_the_board_streams_a_snapshot_first() {
        with_server(ReplyFormat::Plain, &[], FinishReason::Stop, |addr| {
            let (head, body) = get(addr, "/", None);
            assert!(head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"));
            assert!(
                head.contains("content-security-policy: default-src 'self'"),
                "{head}"
            );
            assert!(body.contains("<script src=\"app.js\""), "{body}");
            // Every file the page names is served, from here.
            for path in ["/app.js", "/app.css"] {
                let (head, body) = get(addr, path, None);
                assert!(head.contains(" 200 "), "{path}: {head}");
                assert!(!body.is_empty());
                assert!(
                    !body.contains("http://") && !body.contains("https://"),
                    "{path}"
                );
            }
            let (_, body) = get(addr, "/v1/cluster", None);
            let board: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(board["type"], "snapshot");
            // The stream's first event is a snapshot (read until it has come whole).
            let (head, body) = get(addr, "/v1/cluster/events", Some("\n\n"));
            assert!(head.contains("text/event-stream"), "{head}");
            assert!(body.starts_with("data: {"), "{body}");
        });
    }

    #[test]
    fn a_harmony_reply_is_split_into_reasoning_and_content() {
        with_server(
            ReplyFormat::Harmony,
            THINK_THEN_ANSWER,
            FinishReason::Stop,
            |addr| {
                let whole: Value =
                    serde_json::from_str(&post(addr, "/v1/chat/completions", &chat(false)))
                        .unwrap();
                let choice = &whole["choices"][0];
                assert_eq!(choice["message"]["reasoning_content"], "Say hi.", "{whole}");
                assert_eq!(choice["message"]["content"], "Hi!", "{whole}");
                assert_eq!(choice["finish_reason"], "stop");

                let events = events(&post(addr, "/v1/chat/completions", &chat(true)));
                let deltas: Vec<&Value> =
                    events.iter().map(|e| &e["choices"][0]["delta"]).collect();
                assert_eq!(deltas[0]["role"], "assistant");
                let text = |field: &str| -> String {
                    deltas.iter().filter_map(|d| d[field].as_str()).collect()
                };
                assert_eq!(text("reasoning_content"), "Say hi.");
                assert_eq!(text("content"), "Hi!");
                // Reasoning first, and no chunk without a delta but the last.
                let first_content = deltas.iter().position(|d| d["content"].is_string());
                let last_reasoning = deltas
                    .iter()
                    .rposition(|d| d["reasoning_content"].is_string());
                assert!(last_reasoning < first_content, "{events:?}");
                let (last, rest) = events.split_last().unwrap();
                assert_eq!(last["choices"][0]["finish_reason"], "stop");
                assert!(rest.iter().all(|e| e["choices"][0]["delta"]
                    .as_object()
                    .is_some_and(|d| !d.is_empty())));

                // The completions API reads the text as it is.
                let text: Value =
                    serde_json::from_str(&post(addr, "/v1/completions", r#"{"prompt": "x"}"#))
                        .unwrap();
                assert_eq!(text["choices"][0]["text"], THINK_THEN_ANSWER.concat());
            },
        );
    }

    #[test]
    fn a_call_to_a_function_is_answered_with_tool_calls() {
        with_server(ReplyFormat::Harmony, CALL, FinishReason::Stop, |addr| {
            let whole: Value =
                serde_json::from_str(&post(addr, "/v1/chat/completions", &chat(false))).unwrap();
            let choice = &whole["choices"][0];
            assert_eq!(choice["finish_reason"], "tool_calls", "{whole}");
            assert_eq!(choice["message"]["content"], Value::Null);
            let call = &choice["message"]["tool_calls"][0];
            assert_eq!(call["type"], "function");
            assert_eq!(call["function"]["name"], "get_weather");
            assert_eq!(call["function"]["arguments"], r#"{"city":"Paris"}"#);
            assert!(call["id"].as_str().unwrap().starts_with("call_"));

            let events = events(&post(addr, "/v1/chat/completions", &chat(true)));
            let calls: Vec<&Value> = events
                .iter()
                .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].get(0))
                .collect();
            assert_eq!(calls.len(), 1, "{events:?}");
            assert_eq!(calls[0]["index"], 0);
            assert_eq!(calls[0]["function"]["name"], "get_weather");
            assert_eq!(
                events.last().unwrap()["choices"][0]["finish_reason"],
                "tool_calls"
            );
        });
    }

    #[test]
    fn without_harmony_the_markers_are_plain_text() {
        with_server(
            ReplyFormat::Plain,
            THINK_THEN_ANSWER,
            FinishReason::Length,
            |addr| {
                let whole: Value =
                    serde_json::from_str(&post(addr, "/v1/chat/completions", &chat(false)))
                        .unwrap();
                let message = &whole["choices"][0]["message"];
                assert_eq!(message["content"], THINK_THEN_ANSWER.concat());
                assert!(message.get("reasoning_content").is_none(), "{whole}");
                assert_eq!(whole["choices"][0]["finish_reason"], "length");
            },
        );
    }
}

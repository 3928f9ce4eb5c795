//! The soak's requests: what each kind sends, what it reads back, and whether what came
//! back is what that kind should get.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// How long one request may take before it counts as hung (the machine is shared and
/// slow; a whole response of 24 tokens takes a few seconds at worst).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(180);

/// What one request of the soak does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `/v1/completions`, the whole response.
    Whole,
    /// `/v1/chat/completions`, the whole response.
    ChatWhole,
    /// `/v1/completions` streamed to the end.
    Stream,
    /// `/v1/chat/completions` streamed to the end, with the usage chunk.
    ChatStream,
    /// A stream the client drops after a few pieces.
    Disconnect,
    /// A stream, then `POST /v1/cancel` after its first piece.
    Cancel,
    /// Not JSON.
    BadJson,
    /// A field of the wrong type.
    WrongType,
    /// `max_tokens: 0`.
    ZeroMaxTokens,
    /// A prompt longer than the context.
    TooLong,
    /// Fields the server does not know, which it ignores (a success).
    UnknownFields,
    /// A body over the server's 2 MB limit.
    Oversized,
    /// An endpoint that does not exist.
    UnknownEndpoint,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Whole => "whole",
            Kind::ChatWhole => "chat_whole",
            Kind::Stream => "stream",
            Kind::ChatStream => "chat_stream",
            Kind::Disconnect => "disconnect",
            Kind::Cancel => "cancel",
            Kind::BadJson => "bad_json",
            Kind::WrongType => "wrong_type",
            Kind::ZeroMaxTokens => "zero_max_tokens",
            Kind::TooLong => "too_long",
            Kind::UnknownFields => "unknown_fields",
            Kind::Oversized => "oversized",
            Kind::UnknownEndpoint => "unknown_endpoint",
        }
    }

    /// A kind drawn with the soak's mix: mostly generations, a fifth malformed.
    fn draw(r: u64) -> Kind {
        const MIX: [(Kind, u64); 13] = [
            (Kind::Whole, 20),
            (Kind::ChatWhole, 10),
            (Kind::Stream, 18),
            (Kind::ChatStream, 10),
            (Kind::Disconnect, 10),
            (Kind::Cancel, 8),
            (Kind::BadJson, 5),
            (Kind::WrongType, 5),
            (Kind::ZeroMaxTokens, 2),
            (Kind::TooLong, 4),
            (Kind::UnknownFields, 5),
            (Kind::Oversized, 1),
            (Kind::UnknownEndpoint, 2),
        ];
        let total: u64 = MIX.iter().map(|(_, w)| w).sum();
        let mut at = r % total;
        for (kind, weight) in MIX {
            if at < weight {
                return kind;
            }
            at -= weight;
        }
        unreachable!("the weights sum to the total")
    }
}

/// One planned request: its kind and its random choices, fixed up front by the seed.
#[derive(Debug, Clone)]
pub struct Plan {
    pub kind: Kind,
    pub max_tokens: u64,
    /// 0 (greedy) or a sampled temperature.
    pub temperature: f64,
    pub seed: u64,
    /// Which prompt, which wrong type.
    pub variant: usize,
    /// For [`Kind::Disconnect`]: the pieces read before dropping the stream.
    pub read_before_drop: usize,
}

/// SplitMix64: a small seeded generator, so a soak can be run again request for request.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// `n` requests drawn from `seed`, each with 1..=`max_tokens` tokens.
pub fn plan(n: usize, max_tokens: u64, seed: u64) -> Vec<Plan> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| Plan {
            kind: Kind::draw(rng.next()),
            max_tokens: rng.between(1, max_tokens.max(1)),
            temperature: if rng.next().is_multiple_of(2) {
                0.0
            } else {
                0.8
            },
            seed: rng.next() % 1_000_000,
            variant: (rng.next() % 1024) as usize,
            read_before_drop: rng.between(1, 3) as usize,
        })
        .collect()
}

const PROMPTS: [&str; 6] = [
    "Once upon a time, in a small village by the sea,",
    "The three primary colours are",
    "Write a haiku about autumn rain.",
    "def fibonacci(n):",
    "Explain why the sky is blue in one sentence.",
    "List four fruits:",
];

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A complete, well-formed answer.
    Ok,
    /// A complete answer with `finish_reason: "cancelled"`.
    Cancelled,
    /// The client dropped the stream on purpose.
    Disconnected,
    /// The error status a malformed request should get.
    Refused(u16),
    /// An oversized body's connection closed by the server before the client had sent
    /// it all: the server stops reading at its limit, answers 413 and closes, and a
    /// client still writing sees the close first (hyper does not drain the rest).
    ClosedEarly,
    /// Anything else: a wrong status, a broken body, an error event, a timeout.
    Unexpected(String),
}

impl Outcome {
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Cancelled => "cancelled",
            Outcome::Disconnected => "disconnected",
            Outcome::Refused(_) => "refused",
            Outcome::ClosedEarly => "closed_early",
            Outcome::Unexpected(_) => "unexpected",
        }
    }
}

/// What one request gave back, with its timings.
#[derive(Debug, Clone)]
pub struct Record {
    pub index: usize,
    pub kind: Kind,
    pub outcome: Outcome,
    pub started: Instant,
    pub ended: Instant,
    /// Time to the first piece of text (streams).
    pub first_piece: Option<Duration>,
    /// Did this request's `/v1/cancel` cancel a generation (whose is not known).
    pub cancel_hit: Option<bool>,
}

/// A client with no connection pool: every request opens its own connection and closes
/// it, so what the server holds at the end is what it leaked.
fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(REQUEST_TIMEOUT))
        .max_idle_connections(0)
        .build()
        .into()
}

/// Sends `plan` to the server at `url` and judges the answer.
pub fn run(url: &str, index: usize, plan: &Plan) -> Record {
    let started = Instant::now();
    let mut first_piece = None;
    let mut cancel_hit = None;
    let outcome = match plan.kind {
        Kind::Whole | Kind::ChatWhole | Kind::UnknownFields => whole(url, plan),
        Kind::Stream | Kind::ChatStream => {
            stream(url, plan, None, &mut first_piece, started).unwrap_or_else(|e| e)
        }
        Kind::Disconnect => stream(
            url,
            plan,
            Some(plan.read_before_drop),
            &mut first_piece,
            started,
        )
        .unwrap_or_else(|e| e),
        Kind::Cancel => cancel(url, plan, &mut first_piece, &mut cancel_hit, started),
        _ => malformed(url, plan),
    };
    Record {
        index,
        kind: plan.kind,
        outcome,
        started,
        ended: Instant::now(),
        first_piece,
        cancel_hit,
    }
}

/// The JSON body of a generation request.
fn body(plan: &Plan, stream: bool) -> Value {
    let prompt = PROMPTS[plan.variant % PROMPTS.len()];
    let mut body = match plan.kind {
        Kind::ChatWhole | Kind::ChatStream => json!({
            "messages": [{"role": "user", "content": prompt}],
        }),
        _ => json!({"prompt": prompt}),
    };
    let o = body.as_object_mut().expect("an object");
    o.insert("max_tokens".into(), json!(plan.max_tokens));
    o.insert("temperature".into(), json!(plan.temperature));
    o.insert("seed".into(), json!(plan.seed));
    o.insert("stream".into(), json!(stream));
    if plan.kind == Kind::ChatStream {
        o.insert("stream_options".into(), json!({"include_usage": true}));
    }
    if plan.kind == Kind::UnknownFields {
        o.insert("frobnicate".into(), json!({"level": 11}));
        o.insert("logit_bias".into(), json!({"50256": -100}));
        o.insert("user".into(), json!("soak"));
    }
    body
}

fn endpoint(url: &str, kind: Kind) -> String {
    match kind {
        Kind::ChatWhole | Kind::ChatStream => format!("{url}/v1/chat/completions"),
        _ => format!("{url}/v1/completions"),
    }
}

/// A broken pipe or a reset: the peer closed while this side was still writing.
fn closed_while_sending(error: &str) -> bool {
    error.contains("Broken pipe") || error.contains("Connection reset")
}

fn post(url: &str, body: impl AsRef<[u8]>) -> Result<ureq::http::Response<ureq::Body>, String> {
    agent()
        .post(url)
        .header("Content-Type", "application/json")
        .send(body.as_ref())
        .map_err(|e| format!("request failed: {e}"))
}

fn whole(url: &str, plan: &Plan) -> Outcome {
    let mut r = match post(&endpoint(url, plan.kind), body(plan, false).to_string()) {
        Ok(r) => r,
        Err(e) => return Outcome::Unexpected(e),
    };
    let status = r.status().as_u16();
    let text = match r.body_mut().read_to_string() {
        Ok(t) => t,
        Err(e) => return Outcome::Unexpected(format!("HTTP {status}: body unreadable: {e}")),
    };
    if status != 200 {
        return Outcome::Unexpected(format!("HTTP {status}: {text}"));
    }
    let v: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => return Outcome::Unexpected(format!("the body is not JSON ({e}): {text}")),
    };
    let choice = &v["choices"][0];
    let has_text = match plan.kind {
        Kind::ChatWhole => choice["message"]["content"].is_string(),
        _ => choice["text"].is_string(),
    };
    let tokens = v["usage"]["completion_tokens"].as_u64();
    if !has_text || tokens.is_none_or(|n| n > plan.max_tokens) {
        return Outcome::Unexpected(format!("malformed completion: {v}"));
    }
    finish(choice["finish_reason"].as_str(), &v)
}

/// `finish_reason` → the outcome.
fn finish(reason: Option<&str>, v: &Value) -> Outcome {
    match reason {
        Some("stop") | Some("length") => Outcome::Ok,
        Some("cancelled") => Outcome::Cancelled,
        _ => Outcome::Unexpected(format!("finish_reason {reason:?}: {v}")),
    }
}

/// Streams `plan`; with `drop_after`, drops the connection after that many pieces.
/// `Err` carries an outcome already decided (a failed request).
fn stream(
    url: &str,
    plan: &Plan,
    drop_after: Option<usize>,
    first_piece: &mut Option<Duration>,
    started: Instant,
) -> Result<Outcome, Outcome> {
    let r = post(&endpoint(url, plan.kind), body(plan, true).to_string())
        .map_err(Outcome::Unexpected)?;
    read_stream(r, plan, drop_after, first_piece, started, || {})
}

fn cancel(
    url: &str,
    plan: &Plan,
    first_piece: &mut Option<Duration>,
    cancel_hit: &mut Option<bool>,
    started: Instant,
) -> Outcome {
    let r = match post(&endpoint(url, plan.kind), body(plan, true).to_string()) {
        Ok(r) => r,
        Err(e) => return Outcome::Unexpected(e),
    };
    let mut cancel_error = None;
    let outcome = read_stream(r, plan, None, first_piece, started, || {
        match post(&format!("{url}/v1/cancel"), "") {
            Ok(mut r) if r.status() == 200 => {
                let v: Value = r.body_mut().read_json().unwrap_or(Value::Null);
                match v["cancelled"].as_bool() {
                    Some(hit) => *cancel_hit = Some(hit),
                    None => cancel_error = Some(format!("/v1/cancel answered {v}")),
                }
            }
            Ok(r) => cancel_error = Some(format!("/v1/cancel: HTTP {}", r.status())),
            Err(e) => cancel_error = Some(format!("/v1/cancel: {e}")),
        }
    })
    .unwrap_or_else(|e| e);
    match cancel_error {
        Some(e) => Outcome::Unexpected(e),
        None => outcome,
    }
}

/// Reads an SSE response, calling `after_first` once the first piece of text arrived.
fn read_stream(
    r: ureq::http::Response<ureq::Body>,
    plan: &Plan,
    drop_after: Option<usize>,
    first_piece: &mut Option<Duration>,
    started: Instant,
    mut after_first: impl FnMut(),
) -> Result<Outcome, Outcome> {
    let status = r.status().as_u16();
    if status != 200 {
        let mut r = r;
        let text = r.body_mut().read_to_string().unwrap_or_default();
        return Err(Outcome::Unexpected(format!("HTTP {status}: {text}")));
    }
    let is_sse = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !is_sse {
        return Err(Outcome::Unexpected(
            "a stream without text/event-stream".into(),
        ));
    }
    let chat = plan.kind == Kind::ChatStream;
    let mut pieces = 0u64;
    let mut finish_reason: Option<String> = None;
    let mut usage_seen = false;
    let mut done = false;
    let reader = BufReader::new(r.into_body().into_reader());
    for line in reader.lines() {
        let line = line.map_err(|e| Outcome::Unexpected(format!("the stream broke: {e}")))?;
        let Some(data) = line.strip_prefix("data: ") else {
            if line.is_empty() {
                continue;
            }
            return Err(Outcome::Unexpected(format!("not an SSE line: {line:?}")));
        };
        if done {
            return Err(Outcome::Unexpected(format!("data after [DONE]: {data}")));
        }
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(data)
            .map_err(|e| Outcome::Unexpected(format!("an event is not JSON ({e}): {data}")))?;
        if v.get("error").is_some() {
            return Err(Outcome::Unexpected(format!("error event: {v}")));
        }
        if v["usage"].is_object() && v["choices"].as_array().is_some_and(|c| c.is_empty()) {
            usage_seen = true;
            continue;
        }
        let choice = &v["choices"][0];
        let piece = if chat {
            choice["delta"]["content"].as_str()
        } else {
            choice["text"].as_str()
        };
        if piece.is_some_and(|p| !p.is_empty()) {
            pieces += 1;
            if pieces == 1 {
                *first_piece = Some(started.elapsed());
                after_first();
            }
            if drop_after.is_some_and(|n| pieces as usize >= n) {
                // Dropping the reader closes the connection mid-stream.
                return Ok(Outcome::Disconnected);
            }
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish_reason = Some(reason.to_string());
        }
    }
    if !done {
        return Err(Outcome::Unexpected(
            "the stream ended without [DONE]".into(),
        ));
    }
    if pieces > plan.max_tokens {
        return Err(Outcome::Unexpected(format!(
            "{pieces} pieces for max_tokens {}",
            plan.max_tokens
        )));
    }
    if chat && !usage_seen {
        return Err(Outcome::Unexpected("no usage chunk".into()));
    }
    if drop_after.is_some() {
        // The generation ended before the client meant to go: a whole stream.
        return Ok(Outcome::Ok);
    }
    Ok(finish(finish_reason.as_deref(), &Value::Null))
}

/// A malformed request: the status and error it must get.
fn malformed(url: &str, plan: &Plan) -> Outcome {
    let completions = format!("{url}/v1/completions");
    let (target, body, want_status, want_param): (String, Vec<u8>, u16, Option<&str>) =
        match plan.kind {
            Kind::BadJson => {
                let bodies = [
                    r#"{"prompt": "hi","#,
                    "prompt=hi",
                    "",
                    "[1, 2",
                    "\u{0}\u{1}",
                ];
                let b = bodies[plan.variant % bodies.len()];
                (completions, b.into(), 400, None)
            }
            Kind::WrongType => {
                let cases: [(&str, &str); 6] = [
                    (r#"{"prompt": 5}"#, "prompt"),
                    (r#"{"prompt": "hi", "max_tokens": "ten"}"#, "max_tokens"),
                    (r#"{"prompt": "hi", "max_tokens": -3}"#, "max_tokens"),
                    (r#"{"prompt": "hi", "stream": "yes"}"#, "stream"),
                    (r#"{"prompt": "hi", "seed": 1.5}"#, "seed"),
                    (r#"{"prompt": "hi", "stop": 7}"#, "stop"),
                ];
                let (b, param) = cases[plan.variant % cases.len()];
                (completions, b.into(), 400, Some(param))
            }
            Kind::ZeroMaxTokens => (
                completions,
                r#"{"prompt": "hi", "max_tokens": 0}"#.into(),
                400,
                Some("max_tokens"),
            ),
            Kind::TooLong => {
                // Far more tokens than the soak's 512-token context.
                let prompt = "the quick brown fox jumps over the lazy dog ".repeat(120);
                let b = json!({"prompt": prompt, "max_tokens": 4}).to_string();
                (completions, b.into(), 400, Some("prompt"))
            }
            Kind::Oversized => {
                let prompt = "a".repeat(3 << 20);
                let b = json!({"prompt": prompt}).to_string();
                (completions, b.into(), 413, None)
            }
            Kind::UnknownEndpoint => (format!("{url}/v1/embeddings"), b"{}".to_vec(), 404, None),
            other => unreachable!("{other:?} is not malformed"),
        };
    let mut r = match post(&target, &body) {
        Ok(r) => r,
        Err(e) if plan.kind == Kind::Oversized && closed_while_sending(&e) => {
            return Outcome::ClosedEarly
        }
        Err(e) => return Outcome::Unexpected(e),
    };
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap_or_default();
    if status != want_status {
        return Outcome::Unexpected(format!("HTTP {status}, not {want_status}: {text}"));
    }
    let v: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => return Outcome::Unexpected(format!("the error is not JSON ({e}): {text}")),
    };
    let error = &v["error"];
    if !error["message"].is_string() || error["type"] != "invalid_request_error" {
        return Outcome::Unexpected(format!("not an OpenAI error: {v}"));
    }
    if let Some(param) = want_param {
        if error["param"] != param {
            return Outcome::Unexpected(format!(
                "the error names {} not {param}: {v}",
                error["param"]
            ));
        }
    }
    if plan.kind == Kind::TooLong && error["code"] != "context_length_exceeded" {
        return Outcome::Unexpected(format!("no context_length_exceeded code: {v}"));
    }
    Outcome::Refused(status)
}

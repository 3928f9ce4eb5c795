//! The web page at `/`: chat and the cluster panel, three static files compiled into the
//! binary (no CDN, no request outside the host: a Content-Security-Policy of `'self'`
//! says so to the browser), and the cluster board's routes it reads:
//! `GET /v1/cluster` (a snapshot) and `GET /v1/cluster/events` (server-sent events: a
//! snapshot, then every change as the board records it, and tokens/s each second).

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

use crate::board::board;
use crate::metrics::record_request;

const INDEX_HTML: &str = include_str!("../web/index.html");
const APP_JS: &str = include_str!("../web/app.js");
const APP_CSS: &str = include_str!("../web/app.css");

/// Everything the page may load comes from this server; nothing else.
const CSP: &str = "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// How often an open page is told the tokens/s.
const RATE_EVERY: Duration = Duration::from_secs(1);

/// The page's routes, for any router state.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route(
            "/app.js",
            get(|| asset(APP_JS, "text/javascript; charset=utf-8")),
        )
        .route(
            "/app.css",
            get(|| asset(APP_CSS, "text/css; charset=utf-8")),
        )
        .route("/v1/cluster", get(cluster))
        .route("/v1/cluster/events", get(cluster_events))
}

async fn index() -> Response {
    record_request("/");
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        INDEX_HTML,
    )
        .into_response()
}

async fn asset(body: &'static str, kind: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

async fn cluster() -> Json<Value> {
    record_request("/v1/cluster");
    Json(board().snapshot())
}

/// One open page's stream.
struct Watch {
    changes: tokio::sync::broadcast::Receiver<Value>,
    tick: tokio::time::Interval,
    /// Tokens counted, and when, at the last rate sent.
    last: (u64, Instant),
    /// The first message (a snapshot) is still to send.
    first: bool,
}

async fn cluster_events() -> Response {
    record_request("/v1/cluster/events");
    let b = board();
    let watch = Watch {
        changes: b.subscribe(),
        tick: tokio::time::interval(RATE_EVERY),
        last: (b.tokens(), Instant::now()),
        first: true,
    };
    let body = futures_util::stream::unfold(watch, |mut w| async move {
        let message = w.next().await?;
        let event = format!("data: {message}\n\n");
        Some((Ok::<_, Infallible>(Bytes::from(event)), w))
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

impl Watch {
    /// The next message for the page; `None` ends the stream (the server is stopping).
    async fn next(&mut self) -> Option<Value> {
        if std::mem::take(&mut self.first) {
            return Some(board().snapshot());
        }
        tokio::select! {
            change = self.changes.recv() => match change {
                Ok(v) if v["type"] == "bye" => None,
                Ok(v) => Some(v),
                // The page fell behind: what it missed is in a new snapshot.
                Err(RecvError::Lagged(_)) => Some(board().snapshot()),
                Err(RecvError::Closed) => None,
            },
            _ = self.tick.tick() => {
                let (tokens, now) = (board().tokens(), Instant::now());
                let (before, then) = std::mem::replace(&mut self.last, (tokens, now));
                let seconds = (now - then).as_secs_f64().max(1e-3);
                Some(json!({
                    "type": "rate",
                    "tokens_per_s": (tokens - before) as f64 / seconds,
                }))
            }
        }
    }
}

//! The OpenAI-compatible HTTP server that runs on the head, and the generation worker
//! behind it.
//!
//! Two halves joined by a queue:
//! - [`run_scheduler`] owns the model — any [`BatchForward`] of N slots, or any
//!   [`Forward`] as one slot ([`OneSlot`]): a single-device `Session` or the ring head —
//!   on the thread that calls it, and serves [`Job`]s, up to N at once in one batch per
//!   step (continuous batching, `scheduler.rs`): chat template, tokens, sampling, stop
//!   strings, cancellation per slot (`slot.rs`). It never moves the model to another
//!   thread (a ring head borrows the model and is not `'static`). With a draft model
//!   ([`run_speculative_scheduler`], `speculative.rs`) every slot drafts and one batch
//!   verifies all their drafts.
//! - [`serve`] is the axum front end on a tokio runtime: it parses OpenAI requests into
//!   [`GenerationRequest`]s, submits them through a [`JobQueue`], and turns the worker's
//!   [`Event`]s into JSON or server-sent events. It never touches the model.
//!
//! [`serve_blocking`] wires both together for a front end that just wants "serve this
//! `Forward` until Ctrl-C" (`prima serve`, `prima apply`).
//!
//! A request's `tools`, an assistant message's `tool_calls` and a `tool` message's answer
//! reach the chat template (`openai.rs` checks them; `prima_core::chat` renders them); a
//! gpt-oss model's replies (harmony channels, `harmony.rs`) are split into
//! `reasoning_content`, `content` and `tool_calls`.
//!
//! Not here: `tool_choice` (nothing constrains a reply to a call: no grammar), tool-call
//! parsing for formats other than harmony, logprobs, embeddings.

pub mod board;
pub mod fuzzing;
mod harmony;
mod http;
mod job;
pub mod metrics;
mod one_slot;
pub(crate) mod openai;
mod queue;
mod scheduler;
mod slot;
mod speculative;
mod stop;
mod web;
mod worker;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use harmony::ReplyFormat;
pub use http::{serve, ServerState};
pub use job::{Completion, Event, FinishReason, GenerationRequest, Prompt, Usage, WorkerError};
pub use one_slot::{OneSlot, OneSlotError};
pub use queue::{job_queue, Job, JobQueue, JobReceiver, Submitted};
pub use scheduler::{run_scheduler, SchedulerOptions};
pub use speculative::{run_speculative_scheduler, Drafting};
pub use worker::{run_worker, run_worker_with};

use prima_core::batch::{BatchForward, BatchRowLogits};
use prima_core::generate::Forward;
use prima_core::tokenizer::Tokenizer;

/// A future whose completion stops the server.
pub type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Completes once `flag` is set (e.g. by a `ctrlc` handler); checked every 100 ms.
pub fn shutdown_when_set(flag: Arc<AtomicBool>) -> Shutdown {
    Box::pin(async move {
        while !flag.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// Serves `forward` over HTTP on `listener` until `shutdown` completes (or Ctrl-C or SIGTERM
/// when `shutdown` is `None`): the HTTP server runs on its own thread with its own tokio
/// runtime, the generation worker on the calling thread. `after_job` runs on the calling
/// thread after every generation (e.g. to collect a ring's per-device statistics into
/// [`metrics::record_ring_stats`]).
pub fn serve_blocking<F: Forward>(
    forward: &mut F,
    tokenizer: &Tokenizer,
    model_name: &str,
    listener: std::net::TcpListener,
    shutdown: Option<Shutdown>,
    mut after_job: impl FnMut(&mut F),
) -> std::io::Result<()> {
    let mut one = OneSlot::new(forward);
    serve_blocking_batch(
        &mut one,
        tokenizer,
        model_name,
        listener,
        shutdown,
        SchedulerOptions::default(),
        |one| after_job(one.inner()),
    )
}

/// [`serve_blocking`] for a model of several slots: up to `model.n_slots()` requests are
/// generated at once (`--parallel N`). `after_job` runs between requests, when no slot
/// is busy.
pub fn serve_blocking_batch<B: BatchForward>(
    model: &mut B,
    tokenizer: &Tokenizer,
    model_name: &str,
    listener: std::net::TcpListener,
    shutdown: Option<Shutdown>,
    options: SchedulerOptions,
    after_job: impl FnMut(&mut B),
) -> std::io::Result<()> {
    let format = ReplyFormat::of(tokenizer);
    serve_jobs(model_name, format, listener, shutdown, |jobs| {
        run_scheduler(model, tokenizer, jobs, options, after_job)
    })
}

/// [`serve_blocking_batch`] with a draft model (`--draft`): up to `n_slots` requests at
/// once, each slot drafting and all slots' drafts verified in one batch per step.
/// `after_job` runs with the target between requests.
pub fn serve_blocking_speculative<T: BatchRowLogits, D: BatchForward>(
    model: Drafting<'_, T, D>,
    tokenizer: &Tokenizer,
    model_name: &str,
    listener: std::net::TcpListener,
    shutdown: Option<Shutdown>,
    options: SchedulerOptions,
    after_job: impl FnMut(&mut T),
) -> std::io::Result<()> {
    let format = ReplyFormat::of(tokenizer);
    serve_jobs(model_name, format, listener, shutdown, |jobs| {
        run_speculative_scheduler(model, tokenizer, jobs, options, after_job)
    })
}

/// The HTTP server on its own thread with its own tokio runtime, `work` (the generation
/// loop over the queue's jobs) on the calling thread, until `shutdown` completes.
fn serve_jobs(
    model_name: &str,
    reply_format: ReplyFormat,
    listener: std::net::TcpListener,
    shutdown: Option<Shutdown>,
    work: impl FnOnce(JobReceiver),
) -> std::io::Result<()> {
    let metrics = metrics::install();
    let (queue, jobs) = job_queue();
    let state = ServerState::new(model_name, queue, metrics).with_reply_format(reply_format);
    listener.set_nonblocking(true)?;
    std::thread::scope(|scope| {
        let http = scope.spawn(move || -> std::io::Result<()> {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("prima-http")
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                let shutdown = shutdown.unwrap_or_else(|| Box::pin(interrupted()));
                serve(listener, state, shutdown).await
            })
            // The state, and with it the last `JobQueue`, is dropped here: the worker's
            // queue closes and `work` returns.
        });
        work(jobs);
        http.join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the HTTP thread panicked")))
    })
}

/// Completes on Ctrl-C (SIGINT) or SIGTERM; never, where no handler can be installed.
async fn interrupted() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

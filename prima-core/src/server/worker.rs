//! The generation worker: serves queued requests one at a time on the thread that owns
//! the model, and reports back over a channel per request.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Duration;

use thiserror::Error;
use tokio::sync::mpsc as tokio_mpsc;

use super::metrics;
use super::stop::StopMatcher;
use crate::chat::{render_chat, ChatError, ChatMessage};
use crate::generate::{generate, Forward, GenerateOptions, StopReason};
use crate::sampler::{Sampler, SamplerConfig};
use crate::tokenizer::Tokenizer;

/// What to generate from.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// A conversation, formatted by the model's chat template.
    Chat(Vec<ChatMessage>),
    /// Raw text, tokenized as it is (special-token text is parsed).
    Text(String),
}

/// One generation, as the worker understands it (the HTTP layer has already checked it).
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    pub prompt: Prompt,
    /// Tokens to generate at most; `None`: until the context is full.
    pub max_tokens: Option<usize>,
    pub sampler: SamplerConfig,
    /// Generation ends before the first of these strings; none of it is returned.
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
}

/// Why a generation ended, as OpenAI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// End of generation or a stop string.
    Stop,
    /// `max_tokens` reached, or the context is full.
    Length,
    /// Cancelled by `POST /v1/cancel` (a client that went away reads nothing).
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

/// The end of a successful generation.
#[derive(Debug, Clone)]
pub struct Completion {
    pub usage: Usage,
    pub finish_reason: FinishReason,
    /// Prompt tokens taken from the previous request's cache instead of evaluated.
    pub cached_prompt_tokens: usize,
    pub time_to_first_token: Duration,
    /// Mean time per output token after the first, in milliseconds.
    pub tpot_ms: f64,
}

/// What the worker reports about one job, in this order: `Started`, any number of
/// `Text`, then `Done`; or `Failed` at any point.
#[derive(Debug)]
pub enum Event {
    /// The prompt fits; evaluation begins.
    Started {
        prompt_tokens: usize,
    },
    /// The next piece of generated text.
    Text(String),
    Done(Completion),
    Failed(WorkerError),
}

#[derive(Debug, Error)]
pub enum WorkerError {
    #[error(
        "the prompt has {prompt_tokens} tokens but the context holds {n_ctx} \
         (at least one more position is needed to generate)"
    )]
    PromptTooLong { prompt_tokens: usize, n_ctx: usize },
    #[error("the prompt is empty after tokenization")]
    EmptyPrompt,
    #[error(
        "the model has no chat template (tokenizer.chat_template); \
         use /v1/completions with a formatted prompt"
    )]
    NoChatTemplate,
    /// The template refused the messages (e.g. roles in an order it does not allow).
    #[error(transparent)]
    Template(#[from] ChatError),
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("generation failed: {0}")]
    Model(String),
}

impl WorkerError {
    /// Caused by the request (HTTP 4xx) rather than by the server.
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            WorkerError::PromptTooLong { .. }
                | WorkerError::EmptyPrompt
                | WorkerError::NoChatTemplate
                | WorkerError::Template(ChatError::Render(_))
        )
    }

    /// OpenAI's `code` for this error, where it has one.
    pub fn code(&self) -> Option<&'static str> {
        match self {
            WorkerError::PromptTooLong { .. } => Some("context_length_exceeded"),
            _ => None,
        }
    }
}

/// A request in the queue with its cancellation flag and its reply channel.
pub struct Job {
    request: GenerationRequest,
    cancel: Arc<AtomicBool>,
    events: tokio_mpsc::UnboundedSender<Event>,
}

/// State the submitting side and the worker share.
#[derive(Default)]
struct Shared {
    /// The cancellation flag of the job being generated, if any.
    running: Mutex<Option<Arc<AtomicBool>>>,
    /// Set when the server stops: the running job is cancelled and queued ones refused.
    closing: AtomicBool,
}

impl Shared {
    fn set_running(&self, flag: Option<Arc<AtomicBool>>) {
        *self.running.lock().unwrap_or_else(PoisonError::into_inner) = flag;
    }

    fn cancel_running(&self) -> bool {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        match running.as_ref() {
            Some(flag) => !flag.swap(true, Ordering::AcqRel),
            None => false,
        }
    }
}

/// The submitting side of the queue; cheap to clone. When every clone is dropped the
/// worker finishes its current job and returns.
#[derive(Clone)]
pub struct JobQueue {
    tx: mpsc::Sender<Job>,
    shared: Arc<Shared>,
}

/// The worker's side of the queue, for [`run_worker`].
pub struct JobReceiver {
    rx: mpsc::Receiver<Job>,
    shared: Arc<Shared>,
}

/// A new, empty queue.
pub fn job_queue() -> (JobQueue, JobReceiver) {
    let (tx, rx) = mpsc::channel();
    let shared = Arc::new(Shared::default());
    (
        JobQueue {
            tx,
            shared: shared.clone(),
        },
        JobReceiver { rx, shared },
    )
}

/// A submitted job: its events, and its cancellation, which also happens when this is
/// dropped (a client that went away).
pub struct Submitted {
    pub events: tokio_mpsc::UnboundedReceiver<Event>,
    cancel: Arc<AtomicBool>,
}

impl Submitted {
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Release);
    }
}

impl Drop for Submitted {
    fn drop(&mut self) {
        self.cancel();
    }
}

impl JobQueue {
    /// Queues `request` behind the jobs already waiting.
    pub fn submit(&self, request: GenerationRequest) -> Result<Submitted, WorkerError> {
        if self.shared.closing.load(Ordering::Acquire) {
            return Err(WorkerError::ShuttingDown);
        }
        let (events, rx) = tokio_mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let job = Job {
            request,
            cancel: cancel.clone(),
            events,
        };
        self.tx.send(job).map_err(|_| WorkerError::ShuttingDown)?;
        Ok(Submitted { events: rx, cancel })
    }

    /// Cancels the generation in progress; false when there was none.
    pub fn cancel_running(&self) -> bool {
        self.shared.cancel_running()
    }

    /// Refuses new jobs, cancels the running one, and fails the queued ones.
    pub fn close(&self) {
        self.shared.closing.store(true, Ordering::Release);
        self.shared.cancel_running();
    }
}

/// Serves jobs one at a time on this thread until every [`JobQueue`] is dropped.
pub fn run_worker<F: Forward>(forward: &mut F, tokenizer: &Tokenizer, jobs: JobReceiver) {
    run_worker_with(forward, tokenizer, jobs, |_| {});
}

/// [`run_worker`], calling `after_job` with the model after every job that ran.
pub fn run_worker_with<F: Forward>(
    forward: &mut F,
    tokenizer: &Tokenizer,
    jobs: JobReceiver,
    mut after_job: impl FnMut(&mut F),
) {
    // The tokens in `forward`'s cache, so a request that repeats the conversation so far
    // evaluates only what is new.
    let mut cached: Vec<u32> = Vec::new();
    while let Ok(job) = jobs.rx.recv() {
        if job.cancel.load(Ordering::Acquire) || job.events.is_closed() {
            // The client went away (or cancelled) while queued.
            metrics::record_cancelled_in_queue();
            continue;
        }
        jobs.shared.set_running(Some(job.cancel.clone()));
        if jobs.shared.closing.load(Ordering::Acquire) {
            jobs.shared.set_running(None);
            let _ = job.events.send(Event::Failed(WorkerError::ShuttingDown));
            continue;
        }
        let outcome = run_job(forward, tokenizer, &job, &mut cached);
        jobs.shared.set_running(None);
        let event = match outcome {
            Ok(completion) => {
                metrics::record_generation(&completion);
                Event::Done(completion)
            }
            Err(e) => {
                tracing::warn!(error = %e, "generation failed");
                metrics::record_generation_error(&e);
                Event::Failed(e)
            }
        };
        let _ = job.events.send(event);
        after_job(forward);
    }
}

/// Tokenizes, checks and generates one job, sending `Started` and `Text` events.
fn run_job<F: Forward>(
    forward: &mut F,
    tokenizer: &Tokenizer,
    job: &Job,
    cached: &mut Vec<u32>,
) -> Result<Completion, WorkerError> {
    let request = &job.request;
    let prompt = tokenize(tokenizer, &request.prompt)?;
    let n_ctx = forward.n_ctx();
    if prompt.len() >= n_ctx {
        return Err(WorkerError::PromptTooLong {
            prompt_tokens: prompt.len(),
            n_ctx,
        });
    }
    let _ = job.events.send(Event::Started {
        prompt_tokens: prompt.len(),
    });

    // Reuse the cached prefix, but evaluate at least the last prompt token: its logits
    // choose the first generated token.
    let reuse = common_prefix(cached, &prompt)
        .min(prompt.len() - 1)
        .min(forward.n_past());
    cached.clear();
    forward
        .truncate(reuse)
        .map_err(|e| WorkerError::Model(e.to_string()))?;

    let mut sampler = Sampler::new(request.sampler.clone());
    for &t in &prompt[..reuse] {
        sampler.accept(t);
    }
    let options = GenerateOptions {
        max_tokens: request
            .max_tokens
            .unwrap_or(usize::MAX)
            .min(n_ctx - prompt.len()),
        ignore_eos: request.ignore_eos,
    };
    let mut stop = StopMatcher::new(&request.stop);
    let mut stopped = false;
    let mut cancelled = false;
    let (out, stats) = generate(
        forward,
        tokenizer,
        &mut sampler,
        &prompt[reuse..],
        options,
        |piece| {
            if stopped || cancelled {
                return ControlFlow::Break(());
            }
            if job.cancel.load(Ordering::Acquire) {
                cancelled = true;
                return ControlFlow::Break(());
            }
            let (text, hit) = stop.push(piece);
            if !text.is_empty() && job.events.send(Event::Text(text)).is_err() {
                cancelled = true;
                return ControlFlow::Break(());
            }
            if hit {
                stopped = true;
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        },
    )
    .map_err(|e| WorkerError::Model(e.to_string()))?;
    if !stopped && !cancelled {
        let tail = stop.finish();
        if !tail.is_empty() {
            let _ = job.events.send(Event::Text(tail));
        }
    }

    // Evaluated tokens are the prompt then the output, in order; the last sampled token
    // was never evaluated.
    cached.extend_from_slice(&prompt);
    cached.extend_from_slice(&out);
    cached.truncate(forward.n_past());

    let finish_reason = if stopped {
        FinishReason::Stop
    } else if cancelled {
        FinishReason::Cancelled
    } else {
        match stats.stop {
            StopReason::EndOfGeneration => FinishReason::Stop,
            StopReason::MaxTokens | StopReason::ContextFull => FinishReason::Length,
            StopReason::Cancelled => FinishReason::Cancelled,
        }
    };
    Ok(Completion {
        usage: Usage {
            prompt_tokens: prompt.len(),
            completion_tokens: stats.generated_tokens,
        },
        finish_reason,
        cached_prompt_tokens: reuse,
        time_to_first_token: stats.time_to_first_token,
        tpot_ms: stats.tpot_ms(),
    })
}

fn tokenize(tokenizer: &Tokenizer, prompt: &Prompt) -> Result<Vec<u32>, WorkerError> {
    let ids = match prompt {
        Prompt::Chat(messages) => {
            let template = tokenizer
                .chat_template()
                .ok_or(WorkerError::NoChatTemplate)?;
            let bos = tokenizer.bos_text();
            let text = render_chat(template, messages, true, bos, tokenizer.eos_text())?;
            // A chat template writes its own BOS text; it is parsed as the special token.
            let writes_bos = !bos.is_empty() && text.starts_with(bos);
            let add_bos = tokenizer.add_bos_default() && !writes_bos;
            tokenizer.encode(&text, add_bos, true)
        }
        Prompt::Text(text) => tokenizer.encode(text, tokenizer.add_bos_default(), true),
    };
    if ids.is_empty() {
        return Err(WorkerError::EmptyPrompt);
    }
    Ok(ids)
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

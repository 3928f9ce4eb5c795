//! The queue between the HTTP side and the model's thread: requests, the events each
//! gets back over its own channel, cancellation, and [`run_worker`] (the scheduler with
//! one slot, for any [`Forward`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Duration;

use thiserror::Error;
use tokio::sync::mpsc as tokio_mpsc;

use super::metrics;
use super::one_slot::OneSlot;
use super::scheduler::{run_scheduler, SchedulerOptions};
use prima_core::chat::{render_chat, ChatError, ChatMessage};
use prima_core::generate::Forward;
use prima_core::sampler::SamplerConfig;
use prima_core::tokenizer::Tokenizer;

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
    /// What a draft model did for this request (speculative decoding), if one drafted.
    pub draft: Option<prima_core::speculative::DraftStats>,
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

impl Job {
    pub(crate) fn request(&self) -> &GenerationRequest {
        &self.request
    }

    /// Cancelled (`POST /v1/cancel`, shutdown), or its client went away.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire) || self.events.is_closed()
    }

    pub(crate) fn cancel_flag(&self) -> &Arc<AtomicBool> {
        &self.cancel
    }

    /// Sends `event` to the client; an error when it went away.
    pub(crate) fn send(&self, event: Event) -> Result<(), ()> {
        self.events.send(event).map_err(|_| ())
    }
}

/// State the submitting side and the worker share.
#[derive(Default)]
pub(crate) struct Shared {
    /// The cancellation flags of the jobs being generated, one per busy slot.
    running: Mutex<Vec<Arc<AtomicBool>>>,
    /// Set when the server stops: running jobs are cancelled and queued ones refused.
    closing: AtomicBool,
}

impl Shared {
    pub(crate) fn add_running(&self, flag: Arc<AtomicBool>) {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(flag);
    }

    pub(crate) fn remove_running(&self, flag: &Arc<AtomicBool>) {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|f| !Arc::ptr_eq(f, flag));
    }

    /// Cancels every running job; false when none was running (or all were cancelled).
    fn cancel_running(&self) -> bool {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let mut any = false;
        for flag in running.iter() {
            any |= !flag.swap(true, Ordering::AcqRel);
        }
        any
    }

    pub(crate) fn closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }
}

/// The submitting side of the queue; cheap to clone. When every clone is dropped the
/// worker finishes its running jobs and returns.
#[derive(Clone)]
pub struct JobQueue {
    tx: mpsc::Sender<Job>,
    shared: Arc<Shared>,
}

/// The worker's side of the queue, for [`run_worker`] and [`super::run_scheduler`].
pub struct JobReceiver {
    pub(crate) rx: mpsc::Receiver<Job>,
    pub(crate) shared: Arc<Shared>,
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
        if self.shared.closing() {
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
        metrics::record_queued(1);
        Ok(Submitted { events: rx, cancel })
    }

    /// Cancels every generation in progress (`POST /v1/cancel` names no request); false
    /// when there was none.
    pub fn cancel_running(&self) -> bool {
        self.shared.cancel_running()
    }

    /// Refuses new jobs, cancels the running ones, and fails the queued ones.
    pub fn close(&self) {
        self.shared.closing.store(true, Ordering::Release);
        self.shared.cancel_running();
    }
}

/// Serves jobs one at a time on this thread until every [`JobQueue`] is dropped: the
/// scheduler over a [`OneSlot`] (`--parallel 1`).
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
    let mut one = OneSlot::new(forward);
    run_scheduler(
        &mut one,
        tokenizer,
        jobs,
        SchedulerOptions::default(),
        |one| after_job(one.inner()),
    );
}

pub(crate) fn tokenize(tokenizer: &Tokenizer, prompt: &Prompt) -> Result<Vec<u32>, WorkerError> {
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

pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) use prima_core::tokenizer::letters;

    /// The text and completion of each job, whose events are all queued (panics on a
    /// failed job).
    pub(crate) fn outcomes(submitted: Vec<Submitted>) -> Vec<(String, Completion)> {
        submitted
            .into_iter()
            .map(|mut s| {
                let events: Vec<Event> = std::iter::from_fn(|| s.events.try_recv().ok()).collect();
                let (text, c) = outcome(&events);
                (text, c.clone())
            })
            .collect()
    }

    /// A model that always continues the alphabet and ends after "z"; it records what it
    /// was asked to evaluate.
    struct Alphabet {
        n_ctx: usize,
        n_past: usize,
        evaluated: Vec<Vec<u32>>,
        logits: Vec<f32>,
    }

    impl Alphabet {
        fn new(n_ctx: usize) -> Alphabet {
            Alphabet {
                n_ctx,
                n_past: 0,
                evaluated: Vec::new(),
                logits: vec![0.0; 27],
            }
        }
    }

    impl Forward for Alphabet {
        type Error = std::io::Error;

        fn eval(&mut self, tokens: &[u32]) -> Result<&[f32], std::io::Error> {
            if self.n_past + tokens.len() > self.n_ctx {
                return Err(std::io::Error::other("context full"));
            }
            self.n_past += tokens.len();
            self.evaluated.push(tokens.to_vec());
            let last = *tokens.last().unwrap();
            let next = if last == 26 { 0 } else { last + 1 };
            self.logits.fill(0.0);
            self.logits[next as usize] = 1.0;
            Ok(&self.logits)
        }

        fn n_past(&self) -> usize {
            self.n_past
        }

        fn n_ctx(&self) -> usize {
            self.n_ctx
        }

        fn truncate(&mut self, n: usize) -> Result<(), std::io::Error> {
            self.n_past = self.n_past.min(n);
            Ok(())
        }
    }

    fn text(prompt: &str, max_tokens: usize, stop: &[&str]) -> GenerationRequest {
        GenerationRequest {
            prompt: Prompt::Text(prompt.into()),
            max_tokens: Some(max_tokens),
            sampler: SamplerConfig {
                temperature: 0.0,
                ..SamplerConfig::default()
            },
            stop: stop.iter().map(|s| s.to_string()).collect(),
            ignore_eos: false,
        }
    }

    /// Runs `requests` through one worker; returns each job's events and the model.
    fn serve(n_ctx: usize, requests: Vec<GenerationRequest>) -> (Vec<Vec<Event>>, Alphabet) {
        let tok = letters();
        let mut model = Alphabet::new(n_ctx);
        let (queue, jobs) = job_queue();
        let mut submitted: Vec<Submitted> = requests
            .into_iter()
            .map(|r| queue.submit(r).unwrap())
            .collect();
        drop(queue);
        run_worker(&mut model, &tok, jobs);
        let events = submitted
            .iter_mut()
            .map(|s| std::iter::from_fn(|| s.events.try_recv().ok()).collect())
            .collect();
        (events, model)
    }

    /// The text and the completion of a successful job.
    fn outcome(events: &[Event]) -> (String, &Completion) {
        assert!(matches!(events[0], Event::Started { .. }), "{events:?}");
        let mut text = String::new();
        for e in &events[1..events.len() - 1] {
            let Event::Text(t) = e else {
                panic!("{events:?}")
            };
            text.push_str(t);
        }
        let Some(Event::Done(c)) = events.last() else {
            panic!("{events:?}")
        };
        (text, c)
    }

    #[test]
    fn limits_stop_strings_and_end_of_generation_set_the_finish_reason() {
        let (events, _) = serve(
            64,
            vec![
                text("abc", 5, &[]),
                text("abc", 10, &["fg"]),
                text("wx", 10, &[]),
            ],
        );
        let (t, c) = outcome(&events[0]);
        assert_eq!(
            (t.as_str(), c.finish_reason),
            ("defgh", FinishReason::Length)
        );
        assert_eq!(
            c.usage,
            Usage {
                prompt_tokens: 3,
                completion_tokens: 5
            }
        );
        let (t, c) = outcome(&events[1]);
        assert_eq!((t.as_str(), c.finish_reason), ("de", FinishReason::Stop));
        let (t, c) = outcome(&events[2]);
        assert_eq!((t.as_str(), c.finish_reason), ("yz", FinishReason::Stop));
    }

    #[test]
    fn a_request_that_continues_the_last_one_evaluates_only_what_is_new() {
        let (events, model) = serve(64, vec![text("abc", 5, &[]), text("abcdefgq", 2, &[])]);
        let (_, first) = outcome(&events[0]);
        assert_eq!(first.cached_prompt_tokens, 0);
        let (t, second) = outcome(&events[1]);
        assert_eq!(t, "rs");
        // "abc" + "defg" were evaluated ("h" was sampled last and never fed back).
        assert_eq!(second.cached_prompt_tokens, 7);
        assert_eq!(model.evaluated[model.evaluated.len() - 2], vec![17]); // "q"
    }

    #[test]
    fn a_repeated_prompt_still_evaluates_its_last_token() {
        let (events, model) = serve(64, vec![text("abc", 1, &[]), text("abc", 1, &[])]);
        assert_eq!(outcome(&events[1]).0, "d");
        assert_eq!(outcome(&events[1]).1.cached_prompt_tokens, 2);
        assert_eq!(model.evaluated.last().unwrap(), &vec![3]); // "c"
    }

    #[test]
    fn a_prompt_that_fills_the_context_is_refused_before_it_starts() {
        let (events, model) = serve(4, vec![text("abcd", 1, &[]), text("abc", 5, &[])]);
        assert!(
            matches!(
                events[0].as_slice(),
                [Event::Failed(WorkerError::PromptTooLong {
                    prompt_tokens: 4,
                    n_ctx: 4
                })]
            ),
            "{:?}",
            events[0]
        );
        // The next one runs until the context is full.
        let (t, c) = outcome(&events[1]);
        assert_eq!((t.as_str(), c.finish_reason), ("d", FinishReason::Length));
        assert_eq!(model.n_past, 3);
    }

    #[test]
    fn cancelled_and_closed_jobs_never_reach_the_model() {
        let tok = letters();
        let mut model = Alphabet::new(64);
        let (queue, jobs) = job_queue();
        let gone = queue.submit(text("abc", 3, &[])).unwrap();
        drop(gone); // the client left while queued
        let mut refused = queue.submit(text("abc", 3, &[])).unwrap();
        queue.close();
        assert!(matches!(
            queue.submit(text("abc", 3, &[])),
            Err(WorkerError::ShuttingDown)
        ));
        drop(queue);
        run_worker(&mut model, &tok, jobs);
        assert!(model.evaluated.is_empty());
        assert!(matches!(
            refused.events.try_recv(),
            Ok(Event::Failed(WorkerError::ShuttingDown))
        ));
    }
}

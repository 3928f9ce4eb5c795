//! The queue between the HTTP side and the model's thread: a submitted [`Job`] with its
//! cancellation flag and its own event channel, and the state both sides share.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};

use tokio::sync::mpsc as tokio_mpsc;

use crate::job::{Event, GenerationRequest, WorkerError};
use crate::metrics;

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

/// The worker's side of the queue, for [`crate::run_worker`] and [`crate::run_scheduler`].
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

/// Helpers for the tests of the modules that serve the queue.
#[cfg(test)]
pub(crate) mod testing {
    use super::Submitted;
    use crate::job::{Completion, Event};

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

    /// The text and the completion of a successful job.
    pub(crate) fn outcome(events: &[Event]) -> (String, &Completion) {
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
}

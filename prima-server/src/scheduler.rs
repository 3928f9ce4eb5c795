//! Continuous batching: several requests share the model, one batch per step.
//!
//! The scheduler owns a [`BatchForward`] of N slots (independent KV caches) on the
//! model's thread. Each step it
//! 1. takes what was queued, drops jobs cancelled while waiting, and admits waiting jobs
//!    into free slots, each into the free slot whose cache shares the longest prefix with
//!    its prompt (then the one used least recently), cutting that cache back to the prefix;
//! 2. ends the requests that were cancelled (by `POST /v1/cancel`, shutdown, or a client
//!    that went away);
//! 3. builds one batch: every decoding slot's last sampled token, and a chunk of each
//!    newcomer's prompt (see [`SchedulerOptions::prefill_chunk`]);
//! 4. runs it with one [`BatchForward::eval_batch`], and lets each slot that has finished
//!    its prompt sample from its row with its own sampler; finished requests leave, so
//!    their slots are free for the next step's newcomers.
//!
//! With one slot (a [`super::OneSlot`] over any `Forward`) this is the single-request
//! worker it replaced: the whole prompt in one evaluation, then one token per step.
//!
//! Step 4 is a [`Step`]: [`Plain`] here; with a draft model, `speculative.rs` drafts for
//! every decoding slot first and verifies all their drafts in the one batch. Admission,
//! cancellation and the slots' bookkeeping are the same for both.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use super::metrics;
use super::slot::Running;
use super::Event;
use crate::job::{common_prefix, tokenize, FinishReason, WorkerError};
use crate::queue::{Job, JobReceiver};
use prima_core::batch::{BatchForward, SeqTokens};
use prima_core::tokenizer::Tokenizer;

/// How the scheduler shares a batch between decoding and prompt processing.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerOptions {
    /// Prompt tokens, all newcomers together, in a step where other slots are decoding.
    /// A step costs about as much as the prompt tokens in it (prompt processing is
    /// compute-bound, one decode row is not), so this bounds how much a newcomer slows
    /// the others' next token: 128 tokens of SmolLM2 are ~0.1 s on two CPU cores, while
    /// rows beyond a few dozen add little to a batched product's efficiency. When no slot
    /// is decoding, a newcomer takes the whole [`BatchForward::n_batch`].
    pub prefill_chunk: usize,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions { prefill_chunk: 128 }
    }
}

/// One slot: what its cache holds, and the request in it, if any.
#[derive(Default)]
pub(super) struct Slot<'t> {
    /// The tokens in the slot's cache, in order (positions 0..n_past).
    pub(super) cached: Vec<u32>,
    pub(super) running: Option<Running<'t>>,
    /// The step the slot was last given a request (least recently used goes first).
    last_used: u64,
    /// Admission order of its request, so earlier newcomers' prompts go first.
    admitted: u64,
}

/// What one scheduler step does with the slots that hold a request.
pub(super) trait Step<B: BatchForward> {
    /// Slot `index` has taken `running`, whose first `reuse` prompt tokens the model's
    /// cache of that slot holds.
    fn admitted(&mut self, index: usize, reuse: usize, running: &mut Running<'_>);

    /// Evaluates one batch for the busy `slots` and takes what it gives; true when a
    /// request finished (or failed).
    fn run(
        &mut self,
        model: &mut B,
        jobs: &JobReceiver,
        slots: &mut [Slot<'_>],
        options: SchedulerOptions,
    ) -> bool;
}

/// One token per decoding slot a step.
pub(super) struct Plain;

impl<B: BatchForward> Step<B> for Plain {
    fn admitted(&mut self, _: usize, _: usize, _: &mut Running<'_>) {}

    fn run(
        &mut self,
        model: &mut B,
        jobs: &JobReceiver,
        slots: &mut [Slot<'_>],
        options: SchedulerOptions,
    ) -> bool {
        run_step(model, jobs, slots, options)
    }
}

/// How often an idle server runs its between-requests work (`after_job`): a ring's lost
/// device that answers again is planned back in while nobody asks, so the next request
/// uses it rather than the one after it.
const IDLE_TICK: Duration = Duration::from_secs(1);

/// Serves jobs with `model`'s slots on this thread until every [`super::JobQueue`] is
/// dropped and the running requests have finished. `after_job` runs with the model after
/// a request finishes when no slot is busy (between requests, as a ring's failover needs),
/// and every [`IDLE_TICK`] while idle.
pub fn run_scheduler<B: BatchForward>(
    model: &mut B,
    tokenizer: &Tokenizer,
    jobs: JobReceiver,
    options: SchedulerOptions,
    after_job: impl FnMut(&mut B),
) {
    schedule(model, tokenizer, jobs, options, &mut Plain, after_job);
}

/// [`run_scheduler`] with each step's evaluation done by `stepper`.
pub(super) fn schedule<B: BatchForward>(
    model: &mut B,
    tokenizer: &Tokenizer,
    jobs: JobReceiver,
    options: SchedulerOptions,
    stepper: &mut impl Step<B>,
    mut after_job: impl FnMut(&mut B),
) {
    let mut slots: Vec<Slot<'_>> = (0..model.n_slots()).map(|_| Slot::default()).collect();
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut step: u64 = 0;
    let mut admissions: u64 = 0;
    metrics::record_slots(slots.len(), 0);
    loop {
        let busy = slots.iter().filter(|s| s.running.is_some()).count();
        if busy == 0 && waiting.is_empty() {
            // Idle: sleep until a job comes, or every queue is gone; the work between
            // requests runs now and then meanwhile.
            match jobs.rx.recv_timeout(IDLE_TICK) {
                Ok(job) => waiting.push_back(job),
                Err(RecvTimeoutError::Timeout) => {
                    after_job(model);
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        while let Ok(job) = jobs.rx.try_recv() {
            waiting.push_back(job);
        }
        step += 1;
        admit(
            model,
            tokenizer,
            &jobs,
            &mut slots,
            &mut waiting,
            (step, &mut admissions),
            stepper,
        );

        let mut finished = false;
        for slot in &mut slots {
            if slot.running.as_ref().is_some_and(Running::cancelled) {
                let running = slot.running.take().expect("checked");
                jobs.shared.remove_running(running.cancel_flag());
                running.finish(FinishReason::Cancelled);
                finished = true;
            }
        }
        if slots.iter().any(|s| s.running.is_some()) {
            finished |= stepper.run(model, &jobs, &mut slots, options);
        }
        let busy = slots.iter().filter(|s| s.running.is_some()).count();
        metrics::record_slots(slots.len(), busy);
        if finished && busy == 0 {
            after_job(model);
        }
    }
    metrics::record_slots(slots.len(), 0);
}

/// Admits waiting jobs into free slots, in order; `(step, admissions)` count steps and
/// admissions so far.
fn admit<'t, B: BatchForward>(
    model: &mut B,
    tokenizer: &'t Tokenizer,
    jobs: &JobReceiver,
    slots: &mut [Slot<'t>],
    waiting: &mut VecDeque<Job>,
    (step, admissions): (u64, &mut u64),
    stepper: &mut impl Step<B>,
) {
    let n_ctx = model.n_ctx();
    while slots.iter().any(|s| s.running.is_none()) {
        let Some(job) = waiting.pop_front() else {
            break;
        };
        metrics::record_queued(-1);
        if job.is_cancelled() {
            // The client went away (or cancelled) while queued.
            metrics::record_cancelled_in_queue();
            continue;
        }
        if jobs.shared.closing() {
            let _ = job.send(Event::Failed(WorkerError::ShuttingDown));
            continue;
        }
        let prompt = match tokenize(tokenizer, &job.request().prompt) {
            Ok(p) if p.len() >= n_ctx => Err(WorkerError::PromptTooLong {
                prompt_tokens: p.len(),
                n_ctx,
            }),
            other => other,
        };
        let prompt = match prompt {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "generation failed");
                metrics::record_generation_error(&e);
                let _ = job.send(Event::Failed(e));
                continue;
            }
        };
        let (index, slot) = slots
            .iter_mut()
            .enumerate()
            .filter(|(_, s)| s.running.is_none())
            .min_by_key(|(_, s)| {
                (
                    std::cmp::Reverse(common_prefix(&s.cached, &prompt)),
                    s.last_used,
                )
            })
            .expect("a free slot");
        // Reuse the cached prefix, but evaluate at least the last prompt token: its
        // logits choose the first generated token.
        let reuse = common_prefix(&slot.cached, &prompt)
            .min(prompt.len() - 1)
            .min(model.n_past(index));
        if let Err(e) = model.truncate(index, reuse) {
            slot.cached.clear();
            let e = WorkerError::Model(e.to_string());
            metrics::record_generation_error(&e);
            let _ = job.send(Event::Failed(e));
            continue;
        }
        slot.cached.truncate(reuse);
        slot.last_used = step;
        *admissions += 1;
        slot.admitted = *admissions;
        let _ = job.send(Event::Started {
            prompt_tokens: prompt.len(),
        });
        let mut running = Running::new(job, prompt, reuse, n_ctx, tokenizer);
        if running.wants_nothing() {
            running.finish(FinishReason::Length);
            continue;
        }
        stepper.admitted(index, reuse, &mut running);
        jobs.shared.add_running(running.cancel_flag().clone());
        slot.running = Some(running);
    }
}

/// Evaluates one batch and samples for the slots that finished their prompt; true when
/// a request finished (or failed).
fn run_step<B: BatchForward>(
    model: &mut B,
    jobs: &JobReceiver,
    slots: &mut [Slot<'_>],
    options: SchedulerOptions,
) -> bool {
    let n_ctx = model.n_ctx();
    let plan = plan_batch(model.n_batch(), slots, options, |_| 1);
    let seqs: Vec<SeqTokens<'_>> = plan
        .iter()
        .map(|&(slot, n)| SeqTokens {
            slot,
            tokens: slots[slot].running.as_ref().expect("planned").feed(n),
        })
        .collect();
    metrics::record_batch(seqs.len(), seqs.iter().map(|s| s.tokens.len()).sum());
    let mut finished = false;
    match model.eval_batch(&seqs) {
        Ok(logits) => {
            drop(seqs);
            let n_vocab = logits.len() / plan.len().max(1);
            for (row, &(index, n)) in plan.iter().enumerate() {
                let slot = &mut slots[index];
                let running = slot.running.as_mut().expect("planned");
                slot.cached.extend_from_slice(running.feed(n));
                running.evaluated(n);
                if running.prefilling() {
                    continue;
                }
                let row = &logits[row * n_vocab..(row + 1) * n_vocab];
                if let ControlFlow::Break(reason) = running.sample(row, slot.cached.len(), n_ctx) {
                    slot.end(jobs, reason);
                    finished = true;
                }
            }
        }
        Err(e) => {
            drop(seqs);
            fail_planned(model, jobs, slots, &plan, &e.to_string());
            finished = true;
        }
    }
    finished
}

impl Slot<'_> {
    /// Ends the slot's request for `reason`; the slot is free.
    pub(super) fn end(&mut self, jobs: &JobReceiver, reason: FinishReason) {
        let running = self.running.take().expect("a request in the slot");
        jobs.shared.remove_running(running.cancel_flag());
        running.finish(reason);
    }
}

/// Fails the requests of the slots in `plan` (their evaluation failed with `message`);
/// what their caches hold is unknown, so they start again from nothing.
pub(super) fn fail_planned<B: BatchForward>(
    model: &mut B,
    jobs: &JobReceiver,
    slots: &mut [Slot<'_>],
    plan: &[(usize, usize)],
    message: &str,
) {
    for &(index, _) in plan {
        let slot = &mut slots[index];
        slot.cached.clear();
        let running = slot.running.take().expect("planned");
        jobs.shared.remove_running(running.cancel_flag());
        running.fail(WorkerError::Model(message.to_string()));
    }
    for &(index, _) in plan {
        if let Err(e) = model.truncate(index, 0) {
            tracing::warn!(error = %e, slot = index, "cannot clear a failed slot");
        }
    }
}

/// Which slots take part in the next batch and with how many tokens: every decoding slot
/// with one, then the prefilling slots in admission order, sharing the prompt budget
/// (`n_batch` less the decoding rows, at most `prefill_chunk` while any slot decodes).
/// `decode_rows(slot)` is the rows a decoding slot may take (1, or more with its
/// draft).
pub(super) fn plan_batch(
    n_batch: usize,
    slots: &[Slot<'_>],
    options: SchedulerOptions,
    decode_rows: impl Fn(usize) -> usize,
) -> Vec<(usize, usize)> {
    let mut plan: Vec<(usize, usize)> = Vec::new();
    let mut prefilling: Vec<(u64, usize, usize)> = Vec::new();
    let mut decoding = 0;
    for (index, slot) in slots.iter().enumerate() {
        let Some(running) = &slot.running else {
            continue;
        };
        if running.prefilling() {
            prefilling.push((slot.admitted, index, running.prompt_left()));
        } else {
            plan.push((index, 1));
            decoding += decode_rows(index);
        }
    }
    let mut budget = n_batch.saturating_sub(decoding).max(1);
    if decoding > 0 {
        budget = budget.min(options.prefill_chunk.max(1));
    }
    prefilling.sort_unstable();
    for (_, index, left) in prefilling {
        if budget == 0 {
            break;
        }
        let n = left.min(budget);
        budget -= n;
        plan.push((index, n));
    }
    plan.sort_unstable();
    plan
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::job::{Completion, GenerationRequest, Prompt};
    use crate::queue::testing::{letters, outcomes};
    use crate::queue::{job_queue, Submitted};
    use prima_core::sampler::SamplerConfig;

    type Hook = Box<dyn FnMut(usize)>;

    /// N slots of a model that continues the alphabet and ends after "z"; it records
    /// every batch as (slot, tokens) entries and calls `hook` with the step number.
    struct Alphabets {
        n_ctx: usize,
        n_batch: usize,
        n_past: Vec<usize>,
        batches: Vec<Vec<(usize, Vec<u32>)>>,
        logits: Vec<f32>,
        hook: Option<Hook>,
    }

    impl Alphabets {
        fn new(n_slots: usize, n_ctx: usize, n_batch: usize) -> Alphabets {
            Alphabets {
                n_ctx,
                n_batch,
                n_past: vec![0; n_slots],
                batches: Vec::new(),
                logits: Vec::new(),
                hook: None,
            }
        }
    }

    impl BatchForward for Alphabets {
        type Error = std::io::Error;

        fn n_slots(&self) -> usize {
            self.n_past.len()
        }

        fn n_ctx(&self) -> usize {
            self.n_ctx
        }

        fn n_batch(&self) -> usize {
            self.n_batch
        }

        fn n_vocab(&self) -> usize {
            27
        }

        fn n_past(&self, slot: usize) -> usize {
            self.n_past[slot]
        }

        fn truncate(&mut self, slot: usize, n: usize) -> Result<(), std::io::Error> {
            self.n_past[slot] = self.n_past[slot].min(n);
            Ok(())
        }

        fn eval_batch(&mut self, seqs: &[SeqTokens<'_>]) -> Result<&[f32], std::io::Error> {
            if let Some(hook) = &mut self.hook {
                hook(self.batches.len());
            }
            self.logits.clear();
            let mut batch = Vec::new();
            for s in seqs {
                assert!(!batch.iter().any(|&(slot, _)| slot == s.slot), "{seqs:?}");
                if self.n_past[s.slot] + s.tokens.len() > self.n_ctx {
                    return Err(std::io::Error::other("context full"));
                }
                self.n_past[s.slot] += s.tokens.len();
                batch.push((s.slot, s.tokens.to_vec()));
                let last = *s.tokens.last().unwrap();
                let next = if last == 26 { 0 } else { last + 1 };
                let mut row = vec![0.0; 27];
                row[next as usize] = 1.0;
                self.logits.extend_from_slice(&row);
            }
            self.batches.push(batch);
            Ok(&self.logits)
        }
    }

    fn text(prompt: &str, max_tokens: usize) -> GenerationRequest {
        GenerationRequest {
            prompt: Prompt::Text(prompt.into()),
            max_tokens: Some(max_tokens),
            sampler: SamplerConfig {
                temperature: 0.0,
                ..SamplerConfig::default()
            },
            stop: Vec::new(),
            ignore_eos: false,
        }
    }

    fn serve(
        model: &mut Alphabets,
        options: SchedulerOptions,
        requests: Vec<GenerationRequest>,
    ) -> Vec<(String, Completion)> {
        let tok = letters();
        let (queue, jobs) = job_queue();
        let submitted: Vec<Submitted> = requests
            .into_iter()
            .map(|r| queue.submit(r).unwrap())
            .collect();
        drop(queue);
        run_scheduler(model, &tok, jobs, options, |_| {});
        outcomes(submitted)
    }

    #[test]
    fn concurrent_requests_decode_together_and_each_gets_its_own_text() {
        let mut model = Alphabets::new(3, 64, 64);
        let out = serve(
            &mut model,
            SchedulerOptions::default(),
            vec![text("abc", 4), text("mn", 6), text("wx", 10)],
        );
        let texts: Vec<&str> = out.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(texts, ["defg", "opqrst", "yz"]);
        assert_eq!(out[0].1.finish_reason, FinishReason::Length);
        assert_eq!(out[2].1.finish_reason, FinishReason::Stop);
        assert_eq!(out[1].1.usage.completion_tokens, 6);
        // Step 1: the three prompts together; then one decode row per running slot.
        assert_eq!(
            model.batches[0],
            vec![(0, vec![1, 2, 3]), (1, vec![13, 14]), (2, vec![23, 24])]
        );
        assert_eq!(
            model.batches[1],
            vec![(0, vec![4]), (1, vec![15]), (2, vec![25])]
        );
        // "wx" ended on "z" + end of generation in step 3; the others go on without it.
        assert_eq!(model.batches[3], vec![(0, vec![6]), (1, vec![17])]);
        assert_eq!(model.batches.last().unwrap(), &vec![(1, vec![19])]);
    }

    #[test]
    fn a_queued_request_joins_when_a_slot_frees_and_reuses_the_closest_cache() {
        let mut model = Alphabets::new(2, 64, 64);
        let out = serve(
            &mut model,
            SchedulerOptions::default(),
            vec![text("abc", 2), text("klm", 8), text("abcdq", 2)],
        );
        let texts: Vec<&str> = out.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(texts, ["de", "nopqrstu", "rs"]);
        // "abc" left after step 2 ("d" evaluated, "e" sampled); "abcdq" joined slot 0
        // in step 3 and evaluated only its new token, beside slot 1's decode row.
        assert_eq!(out[2].1.cached_prompt_tokens, 4);
        assert_eq!(model.batches[2], vec![(0, vec![17]), (1, vec![15])]);
    }

    #[test]
    fn a_long_prompt_is_prefilled_in_chunks_beside_the_decoding_slots() {
        let mut model = Alphabets::new(2, 64, 64);
        let tok = letters();
        let (queue, jobs) = job_queue();
        let mut decoding = text("xy", 12);
        decoding.ignore_eos = true;
        let first = queue.submit(decoding).unwrap();
        let late: Arc<Mutex<Vec<Submitted>>> = Arc::default();
        {
            let late = late.clone();
            let mut queue = Some(queue);
            // While step 0 ("xy" alone) runs, a 16-token prompt arrives.
            model.hook = Some(Box::new(move |step| {
                if step == 0 {
                    let q = queue.take().unwrap();
                    let long = text("abcdefghijklmnop", 2);
                    late.lock().unwrap().push(q.submit(long).unwrap());
                }
            }));
        }
        run_scheduler(
            &mut model,
            &tok,
            jobs,
            SchedulerOptions { prefill_chunk: 5 },
            |_| {},
        );
        let out = outcomes(vec![first]);
        assert_eq!(out[0].1.usage.completion_tokens, 12);
        let long = outcomes(std::mem::take(&mut *late.lock().unwrap()));
        assert_eq!(long[0].0, "qr");
        assert_eq!(model.batches[0], vec![(0, vec![24, 25])]);
        // The prompt goes in chunks of 5, 5, 5, 1, each beside slot 0's decode row.
        let chunks: Vec<usize> = model.batches[1..5]
            .iter()
            .map(|b| {
                assert_eq!(b.len(), 2, "{b:?}");
                assert_eq!(b[0].1.len(), 1, "{b:?}");
                b[1].1.len()
            })
            .collect();
        assert_eq!(chunks, [5, 5, 5, 1]);
        // Then both decode.
        assert_eq!(model.batches[5], vec![(0, vec![3]), (1, vec![17])]);
    }

    #[test]
    fn cancelling_one_request_leaves_the_others_running() {
        let mut model = Alphabets::new(2, 64, 64);
        let tok = letters();
        let (queue, jobs) = job_queue();
        let mut endless = text("a", 100);
        endless.ignore_eos = true;
        let cancelled = Arc::new(Mutex::new(queue.submit(endless.clone()).unwrap()));
        let other = queue.submit(text("c", 6)).unwrap();
        {
            let cancelled = cancelled.clone();
            model.hook = Some(Box::new(move |step| {
                if step == 3 {
                    cancelled.lock().unwrap().cancel();
                }
            }));
        }
        drop(queue);
        run_scheduler(&mut model, &tok, jobs, SchedulerOptions::default(), |_| {});
        model.hook = None;
        let other = outcomes(vec![other]);
        assert_eq!(other[0].0, "defghi");
        let cancelled = Arc::into_inner(cancelled).unwrap().into_inner().unwrap();
        let out = outcomes(vec![cancelled]);
        assert_eq!(out[0].1.finish_reason, FinishReason::Cancelled);
        assert_eq!(out[0].1.usage.completion_tokens, 4);
        // After the cancel, only slot 1 runs.
        assert!(model.batches[4..]
            .iter()
            .all(|b| b.len() == 1 && b[0].0 == 1));
    }

    #[test]
    fn a_full_context_ends_one_slot_while_another_continues() {
        let mut model = Alphabets::new(2, 6, 64);
        let mut long = text("abcd", 100);
        long.ignore_eos = true;
        let out = serve(
            &mut model,
            SchedulerOptions::default(),
            vec![long, text("a", 3)],
        );
        // Two positions were left after "abcd": "e" is evaluated, "f" only sampled.
        assert_eq!(out[0].0, "ef");
        assert_eq!(out[0].1.finish_reason, FinishReason::Length);
        assert_eq!(out[1].0, "bcd");
        assert_eq!(model.n_past, [5, 3]);
    }
}

//! Serving with a draft model (`--draft`): continuous batching where every decoding slot
//! drafts and the target verifies all the slots' drafts in one batch.
//!
//! The scheduler (`scheduler.rs`) admits, cancels and frees slots as without a draft; this
//! is its [`Step`]. Each step:
//! 1. The draft (a [`BatchForward`] of as many slots as the target, on the head) catches
//!    up with every busy slot's text in one batch — a decoding slot's last accepted
//!    tokens, a prefilling slot's prompt chunk of this step — and, from each decoding
//!    slot's row, proposes its first token; then one batch per further drafted token,
//!    holding the slots still drafting. A slot drafts up to [`DraftOptions::max`] tokens,
//!    fewer where its output, a context or the batch has no room, and stops when the
//!    draft's top token is less likely than [`DraftOptions::p_min`].
//! 2. The target evaluates one batch ([`BatchRowLogits::eval_batch_rows`], one trip
//!    round the ring): each decoding slot's last token and its drafted ones, with logits
//!    for all of them, and each newcomer's prompt chunk, with the last row's.
//! 3. Each slot keeps the drafted prefix its sampler accepts and one more token, by the
//!    rules of [`prima_core::speculative`] (greedy: the text of decoding without a draft;
//!    sampled: the speculative-sampling rule); every token goes through the slot's stop
//!    checks ([`Running::push_token`]), and both caches are cut back to the kept text.
//!
//! Speculation and batching multiply: a trip round the ring verifies several tokens of
//! several requests. The drafts of all slots share the draft's batches too, so the draft
//! reads its weights once per drafted position, not once per slot.

use std::ops::ControlFlow;

use super::metrics;
use super::scheduler::{fail_planned, plan_batch, schedule, SchedulerOptions, Slot, Step};
use super::slot::Running;
use crate::queue::JobReceiver;
use prima_core::batch::{BatchForward, BatchRowLogits, SeqTokens};
use prima_core::speculative::{draft_sampler_for, DraftOptions, Round, Verdict};
use prima_core::tokenizer::Tokenizer;

/// The target (any [`BatchRowLogits`]: a session, a ring head), its draft (as many slots)
/// and how it drafts.
pub struct Drafting<'a, T, D> {
    pub target: &'a mut T,
    pub draft: &'a mut D,
    pub options: DraftOptions,
}

/// Serves jobs by speculative decoding in up to `target.n_slots()` slots at once until
/// every queue is dropped; `after_job` runs with the target between requests (a ring's
/// statistics and re-admission), as [`super::run_scheduler`]'s does.
pub fn run_speculative_scheduler<T: BatchRowLogits, D: BatchForward>(
    model: Drafting<'_, T, D>,
    tokenizer: &Tokenizer,
    jobs: JobReceiver,
    options: SchedulerOptions,
    after_job: impl FnMut(&mut T),
) {
    let Drafting {
        target,
        draft,
        options: draft_options,
    } = model;
    let mut stepper = Speculating {
        slots: (0..target.n_slots())
            .map(|_| SlotDraft::default())
            .collect(),
        draft,
        options: draft_options,
    };
    schedule(target, tokenizer, jobs, options, &mut stepper, after_job);
}

/// The step that drafts and verifies.
struct Speculating<'a, D> {
    draft: &'a mut D,
    options: DraftOptions,
    /// Per slot of the target (and the draft).
    slots: Vec<SlotDraft>,
}

/// One slot's drafting.
#[derive(Default)]
struct SlotDraft {
    /// The draft's sampler for the request in the slot (its own RNG).
    sampler: Option<prima_core::sampler::Sampler>,
    /// This step's drafted tokens (and their q).
    round: Round,
    /// What the draft evaluates first this step: the part of the slot's text it lacks.
    feed: Vec<u32>,
    /// What the target evaluates: the last sampled token, then the drafted ones.
    batch: Vec<u32>,
    /// Tokens it may still draft this step.
    left: usize,
}

impl<T: BatchRowLogits, D: BatchForward> Step<T> for Speculating<'_, D> {
    fn admitted(&mut self, index: usize, reuse: usize, running: &mut Running<'_>) {
        // The draft holds a prefix of what the target's slot held: cut to the same prefix.
        if self.draft.n_past(index) > reuse {
            if let Err(e) = self.draft.truncate(index, reuse) {
                tracing::warn!(error = %e, slot = index, "draft model: cannot cut a slot");
            }
        }
        self.slots[index].sampler = Some(draft_sampler_for(running.sampler()));
    }

    fn run(
        &mut self,
        model: &mut T,
        jobs: &JobReceiver,
        slots: &mut [Slot<'_>],
        options: SchedulerOptions,
    ) -> bool {
        let n_ctx = model.n_ctx();
        let n_batch = model.n_batch();
        let decoding = slots
            .iter()
            .filter(|s| s.running.as_ref().is_some_and(|r| !r.prefilling()))
            .count();
        // Every decoding slot's rows must fit one target batch together.
        let share = (n_batch / decoding.max(1)).saturating_sub(1);
        for (index, slot) in slots.iter_mut().enumerate() {
            let d = &mut self.slots[index];
            d.round.drafted.clear();
            d.left = match &slot.running {
                Some(r) if !r.prefilling() => {
                    // The target evaluates the last token and the drafted ones after
                    // `cached`; the draft, the text and all but the last drafted.
                    let text = slot.cached.len() + 1;
                    self.options
                        .max
                        .min(r.tokens_left().saturating_sub(1))
                        .min(n_ctx.saturating_sub(text))
                        .min((self.draft.n_ctx() + 1).saturating_sub(text))
                        .min(share)
                }
                _ => 0,
            };
        }
        let plan = plan_batch(n_batch, slots, options, |i| 1 + self.slots[i].left);
        if let Err(e) = self.propose(slots, &plan) {
            // The target still decodes; the draft starts its slots again next step.
            tracing::warn!(error = %e, "draft model failed; decoding without drafts this step");
            for &(index, _) in &plan {
                self.slots[index].left = 0;
                let _ = self.draft.truncate(index, 0);
            }
        }
        self.verify(model, jobs, slots, &plan)
    }
}

impl<D: BatchForward> Speculating<'_, D> {
    /// Brings the draft up to every planned slot's text and lets each decoding slot draft
    /// up to its `left` tokens, every slot's drafts in the same batches.
    fn propose(&mut self, slots: &mut [Slot<'_>], plan: &[(usize, usize)]) -> Result<(), D::Error> {
        let draft_ctx = self.draft.n_ctx();
        let mut entries: Vec<usize> = Vec::with_capacity(plan.len());
        for &(index, n) in plan {
            let slot = &slots[index];
            let running = slot.running.as_ref().expect("planned");
            if self.draft.n_past(index) > slot.cached.len() {
                self.draft.truncate(index, slot.cached.len())?;
            }
            let d = &mut self.slots[index];
            d.feed.clear();
            d.feed
                .extend_from_slice(&slot.cached[self.draft.n_past(index)..]);
            d.feed.extend_from_slice(running.feed(n));
            if self.draft.n_past(index) + d.feed.len() > draft_ctx {
                // The draft's context is full: this slot decodes without it.
                d.left = 0;
                continue;
            }
            entries.push(index);
        }
        // First batch: every slot's catch-up; later ones, each drafting slot's last draft.
        let mut first = true;
        while !entries.is_empty() {
            let seqs: Vec<SeqTokens<'_>> = entries
                .iter()
                .map(|&index| {
                    let d = &self.slots[index];
                    SeqTokens {
                        slot: index,
                        tokens: if first {
                            &d.feed
                        } else {
                            &d.round.drafted[d.round.drafted.len() - 1..]
                        },
                    }
                })
                .collect();
            let logits = self.draft.eval_batch(&seqs)?;
            let n_vocab = logits.len() / entries.len();
            for (e, &index) in entries.iter().enumerate() {
                let d = &mut self.slots[index];
                if d.left == 0 {
                    continue;
                }
                let running = slots[index].running.as_mut().expect("planned");
                let sampler = d.sampler.as_mut().expect("admitted");
                if first {
                    sampler.copy_history_from(running.sampler());
                }
                let row = &logits[e * n_vocab..(e + 1) * n_vocab];
                d.left = match d.round.pick(sampler, row, self.options.p_min) {
                    Some(x) if !running.ends_with(x) => d.left - 1,
                    _ => 0,
                };
            }
            entries.retain(|&index| self.slots[index].left > 0);
            first = false;
        }
        Ok(())
    }

    /// Evaluates the planned slots in one target batch and takes each slot's accepted
    /// tokens; true when a request finished (or failed).
    fn verify<T: BatchRowLogits>(
        &mut self,
        model: &mut T,
        jobs: &JobReceiver,
        slots: &mut [Slot<'_>],
        plan: &[(usize, usize)],
    ) -> bool {
        let n_ctx = model.n_ctx();
        let mut rows = Vec::with_capacity(plan.len());
        for &(index, n) in plan {
            let running = slots[index].running.as_ref().expect("planned");
            let d = &mut self.slots[index];
            d.batch.clear();
            d.batch.extend_from_slice(running.feed(n));
            if running.prefilling() {
                rows.push(1);
            } else {
                d.batch.extend_from_slice(&d.round.drafted);
                rows.push(d.batch.len());
            }
        }
        let seqs: Vec<SeqTokens<'_>> = plan
            .iter()
            .map(|&(slot, _)| SeqTokens {
                slot,
                tokens: &self.slots[slot].batch,
            })
            .collect();
        metrics::record_batch(seqs.len(), seqs.iter().map(|s| s.tokens.len()).sum());
        let logits = match model.eval_batch_rows(&seqs, &rows) {
            Ok(logits) => logits,
            Err(e) => {
                drop(seqs);
                let message = e.to_string();
                fail_planned(model, jobs, slots, plan, &message);
                for &(index, _) in plan {
                    let _ = self.draft.truncate(index, 0);
                }
                return true;
            }
        };
        drop(seqs);
        let n_vocab = logits.len() / rows.iter().sum::<usize>().max(1);
        let mut finished = false;
        let mut at = 0;
        // Slots whose target cache must be cut back to what they kept.
        let mut cuts = Vec::new();
        for (&(index, n), &n_rows) in plan.iter().zip(&rows) {
            let slot_rows = &logits[at * n_vocab..(at + n_rows) * n_vocab];
            at += n_rows;
            let slot = &mut slots[index];
            let d = &mut self.slots[index];
            let running = slot.running.as_mut().expect("planned");
            if running.prefilling() {
                slot.cached.extend_from_slice(running.feed(n));
                running.evaluated(n);
                if running.prefilling() {
                    continue;
                }
                if let ControlFlow::Break(reason) =
                    running.sample(slot_rows, slot.cached.len(), n_ctx)
                {
                    slot.end(jobs, reason);
                    finished = true;
                }
                continue;
            }
            // Row i holds the target's logits for the token after batch[i].
            let drafted = d.round.drafted.len();
            let before = slot.cached.len();
            let mut accepted = 0;
            let mut flow = ControlFlow::Continue(());
            for i in 0..=drafted {
                let row = &slot_rows[i * n_vocab..(i + 1) * n_vocab];
                let verdict = if i == drafted {
                    Verdict::Replace(running.sampler().sample(row))
                } else {
                    d.round.verify(i, row, running.sampler())
                };
                let token = match verdict {
                    Verdict::Accept(x) => {
                        accepted += 1;
                        x
                    }
                    Verdict::Replace(t) => t,
                };
                running.sampler().accept(token);
                // The slot then holds its last token and the drafts before this one.
                flow = running.push_token(token, before + 1 + i, n_ctx);
                if flow.is_break() || matches!(verdict, Verdict::Replace(_)) {
                    break;
                }
            }
            if drafted > 0 {
                running.drafted(drafted, accepted);
            }
            slot.cached.extend_from_slice(&d.batch[..1 + accepted]);
            if accepted < drafted {
                cuts.push(index);
            }
            if self.draft.n_past(index) > slot.cached.len() {
                if let Err(e) = self.draft.truncate(index, slot.cached.len()) {
                    tracing::warn!(error = %e, slot = index, "draft model: cannot cut a slot");
                }
            }
            if let ControlFlow::Break(reason) = flow {
                slot.end(jobs, reason);
                finished = true;
            }
        }
        // The rejected rows leave the target's caches (on a ring, every node forgets them
        // when the slot's next span starts before them).
        for index in cuts {
            let keep = slots[index].cached.len();
            if let Err(e) = model.truncate(index, keep) {
                let message = e.to_string();
                if slots[index].running.is_some() {
                    fail_planned(model, jobs, slots, &[(index, 0)], &message);
                    finished = true;
                } else {
                    slots[index].cached.clear();
                }
            }
        }
        finished
    }
}

#[cfg(test)]
mod tests;

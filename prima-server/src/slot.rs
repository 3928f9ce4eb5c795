//! One request in one slot of the scheduler: its prompt still to evaluate, its own
//! sampler, stream decoder and stop strings, and the limits that end it.
//!
//! A [`Running`] never touches the model: the scheduler feeds what [`Running::feed`]
//! returns into a batch and hands back the logits of its last row. Everything a sampled
//! token decides (end of generation, stop strings, `max_tokens`, a full context, a client
//! that went away) happens in [`Running::push_token`], one token at a time — where a
//! draft model's accepted tokens also go through (`speculative.rs`).

use std::ops::ControlFlow;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::metrics;
use super::stop::StopMatcher;
use crate::job::{Completion, Event, FinishReason, Usage, WorkerError};
use crate::queue::Job;
use prima_core::sampler::Sampler;
use prima_core::speculative::DraftStats;
use prima_core::tokenizer::{StreamDecoder, Tokenizer};

/// A request admitted into a slot.
pub(crate) struct Running<'t> {
    job: Job,
    prompt: Vec<u32>,
    /// Prompt tokens in the slot's cache so far (reused, then evaluated chunk by chunk).
    evaluated: usize,
    /// Prompt tokens taken from the slot's cache instead of evaluated.
    reused: usize,
    sampler: Sampler,
    tokenizer: &'t Tokenizer,
    decoder: StreamDecoder<'t>,
    stop: StopMatcher,
    /// Generated tokens; the last one is fed in the next step.
    out: Vec<u32>,
    max_tokens: usize,
    ignore_eos: bool,
    /// When evaluation began (admission), for the time to first token.
    started: Instant,
    first_token_at: Option<Instant>,
    time_to_first_token: Duration,
    /// Set once a stop string or a lost client ended the text (what is held is dropped).
    text_ended: bool,
    /// What a draft model did for this request, when one drafts.
    draft: Option<DraftStats>,
}

impl<'t> Running<'t> {
    /// `prompt` (checked to leave room for one token in a context of `n_ctx`) after
    /// `reused` positions the slot already holds.
    pub(crate) fn new(
        job: Job,
        prompt: Vec<u32>,
        reused: usize,
        n_ctx: usize,
        tokenizer: &'t Tokenizer,
    ) -> Running<'t> {
        let request = job.request();
        let mut sampler = Sampler::new(request.sampler.clone());
        // The penalties see the whole prompt, reused or not.
        for &t in &prompt {
            sampler.accept(t);
        }
        let max_tokens = request
            .max_tokens
            .unwrap_or(usize::MAX)
            .min(n_ctx - prompt.len());
        Running {
            stop: StopMatcher::new(&request.stop),
            ignore_eos: request.ignore_eos,
            job,
            prompt,
            evaluated: reused,
            reused,
            sampler,
            tokenizer,
            decoder: tokenizer.stream_decoder(),
            out: Vec::new(),
            max_tokens,
            started: Instant::now(),
            first_token_at: None,
            time_to_first_token: Duration::ZERO,
            text_ended: false,
            draft: None,
        }
    }

    /// Prompt tokens not yet evaluated.
    pub(crate) fn prompt_left(&self) -> usize {
        self.prompt.len() - self.evaluated
    }

    /// Still in prompt processing (no token sampled yet).
    pub(crate) fn prefilling(&self) -> bool {
        self.prompt_left() > 0
    }

    /// `max_tokens` is 0: nothing is to be evaluated at all.
    pub(crate) fn wants_nothing(&self) -> bool {
        self.max_tokens == 0
    }

    /// The tokens this slot contributes to the next batch: up to `chunk` prompt tokens
    /// while prefilling, else the last sampled token.
    pub(crate) fn feed(&self, chunk: usize) -> &[u32] {
        if self.prefilling() {
            let end = self.prompt.len().min(self.evaluated + chunk);
            &self.prompt[self.evaluated..end]
        } else {
            &self.out[self.out.len() - 1..]
        }
    }

    /// Tokens it may still generate.
    pub(crate) fn tokens_left(&self) -> usize {
        self.max_tokens - self.out.len()
    }

    /// Whether `token` ends the generation (unless the request ignores end of
    /// generation).
    pub(crate) fn ends_with(&self, token: u32) -> bool {
        !self.ignore_eos && self.tokenizer.is_end_of_generation(token)
    }

    /// The request's sampler (its penalties' history holds the text so far).
    pub(crate) fn sampler(&mut self) -> &mut Sampler {
        &mut self.sampler
    }

    /// Adds one verification's drafted and accepted tokens to the request's figures.
    pub(crate) fn drafted(&mut self, drafted: usize, accepted: usize) {
        let d = self.draft.get_or_insert_with(DraftStats::default);
        d.drafted += drafted;
        d.accepted += accepted;
        d.target_evals += 1;
    }

    /// Records that `n` tokens of [`Running::feed`] were evaluated.
    pub(crate) fn evaluated(&mut self, n: usize) {
        if self.prefilling() {
            self.evaluated += n;
        }
    }

    /// Cancelled by `POST /v1/cancel`, by shutdown, or by a client that went away.
    pub(crate) fn cancelled(&self) -> bool {
        self.job.is_cancelled()
    }

    /// Samples from the logits of the last evaluated row; `n_past` is what the slot then
    /// holds, of `n_ctx`. `Break` with the reason when the request is finished.
    pub(crate) fn sample(
        &mut self,
        logits: &[f32],
        n_past: usize,
        n_ctx: usize,
    ) -> ControlFlow<FinishReason> {
        let token = self.sampler.sample(logits);
        self.sampler.accept(token);
        self.push_token(token, n_past, n_ctx)
    }

    /// Takes one generated token: end of generation, text and stop strings, limits.
    pub(crate) fn push_token(
        &mut self,
        token: u32,
        n_past: usize,
        n_ctx: usize,
    ) -> ControlFlow<FinishReason> {
        if self.first_token_at.is_none() {
            let now = Instant::now();
            self.first_token_at = Some(now);
            self.time_to_first_token = now - self.started;
        }
        if !self.ignore_eos && self.tokenizer.is_end_of_generation(token) {
            return ControlFlow::Break(FinishReason::Stop);
        }
        self.out.push(token);
        crate::board::count_token();
        let piece = self.decoder.push(token);
        if !piece.is_empty() {
            if self.cancelled() {
                return ControlFlow::Break(FinishReason::Cancelled);
            }
            self.send_text(&piece)?;
        }
        if self.out.len() >= self.max_tokens {
            return ControlFlow::Break(FinishReason::Length);
        }
        // The token just sampled needs one more position to be evaluated.
        if n_past + 1 > n_ctx {
            return ControlFlow::Break(FinishReason::Length);
        }
        ControlFlow::Continue(())
    }

    /// Passes `piece` through the stop strings to the client.
    fn send_text(&mut self, piece: &str) -> ControlFlow<FinishReason> {
        let (text, hit) = self.stop.push(piece);
        if !text.is_empty() && self.job.send(Event::Text(text)).is_err() {
            self.text_ended = true;
            return ControlFlow::Break(FinishReason::Cancelled);
        }
        if hit {
            self.text_ended = true;
            return ControlFlow::Break(FinishReason::Stop);
        }
        ControlFlow::Continue(())
    }

    /// Ends the request: the text held back (unless a stop string or a cancellation
    /// ended it), then `Done` with its usage and timings.
    pub(crate) fn finish(mut self, reason: FinishReason) -> Completion {
        if reason != FinishReason::Cancelled && !self.text_ended {
            let tail = self.decoder.finish();
            if !tail.is_empty() {
                let _ = self.send_text(&tail);
            }
            if !self.text_ended {
                let tail = self.stop.finish();
                if !tail.is_empty() {
                    let _ = self.job.send(Event::Text(tail));
                }
            }
        }
        let decode_time = self.first_token_at.map(|t| t.elapsed()).unwrap_or_default();
        let steps = self.out.len().saturating_sub(1);
        let completion = Completion {
            usage: Usage {
                prompt_tokens: self.prompt.len(),
                completion_tokens: self.out.len(),
            },
            finish_reason: reason,
            cached_prompt_tokens: self.reused,
            time_to_first_token: self.time_to_first_token,
            tpot_ms: if steps == 0 {
                0.0
            } else {
                decode_time.as_secs_f64() * 1e3 / steps as f64
            },
            draft: self.draft,
        };
        metrics::record_generation(&completion);
        if let Some(d) = &self.draft {
            metrics::record_draft(d);
        }
        let _ = self.job.send(Event::Done(completion.clone()));
        completion
    }

    /// Ends the request with an error (the model failed).
    pub(crate) fn fail(self, error: WorkerError) {
        tracing::warn!(error = %error, "generation failed");
        metrics::record_generation_error(&error);
        let _ = self.job.send(Event::Failed(error));
    }

    /// The cancellation flag, for `POST /v1/cancel`.
    pub(crate) fn cancel_flag(&self) -> &Arc<AtomicBool> {
        self.job.cancel_flag()
    }
}

//! Speculative decoding: a small draft model on the head proposes the next tokens, the
//! target model checks them all in one batched evaluation (one trip round the ring), and
//! the longest acceptable prefix is kept.
//!
//! The loop is [`generate`](crate::generate::generate)'s — same callbacks, stop reasons and
//! timings — with a different inner step. What it keeps unchanged:
//! - **Greedy** (`temperature <= 0`): a drafted token is kept when it is the token the
//!   target's sampler picks from that row's logits, so the text is the text of decoding
//!   without a draft (a batch computes each row as that row evaluated alone would).
//! - **Sampled**: the speculative-sampling rule (Leviathan et al. 2023; Chen et al. 2023).
//!   With p the distribution the target's sampler would draw from at a position and q the
//!   draft's, a drafted x ~ q is accepted with probability min(1, p(x)/q(x)); on the first
//!   rejection the token is drawn from normalize(max(0, p − q)); when every drafted token
//!   is accepted, a bonus token is drawn from the next row's p. Each emitted token is then
//!   distributed as p, so the output's distribution is that of decoding without a draft.
//!   p and q are the configured chain's distributions ([`Sampler::distribution`]: penalties,
//!   top-k, top-p, min-p, temperature), both computed with the penalty history of the
//!   text before that position — the accepted text plus the drafted tokens before it —,
//!   so repetition penalties are applied exactly as without a draft. The uniform draws and
//!   the resampling use the target sampler's RNG; the draft draws with its own, seeded from
//!   the same seed, so one seed gives one text (not the text of decoding without a draft:
//!   the draws are spent differently).
//!
//! Draft length: at most [`DraftOptions::max`] tokens a round, fewer where the output or
//! the context has no room for more, and drafting stops early (as llama.cpp's
//! `--draft-p-min`) when the draft's most likely token falls below
//! [`DraftOptions::p_min`]: a draft that unsure is likely rejected, and on a ring every
//! drafted token costs the head a draft evaluation while a trip round the ring costs the
//! same for one row as for several.
//!
//! Not here: the front ends (`prima run --draft`, `prima apply`), or drafting on another
//! device than the head.

use std::ops::ControlFlow;
use std::time::Instant;

use crate::generate::{Forward, GenerateOptions, GenerationStats, RowLogits, StopReason};
use crate::sampler::{Sampler, SamplerConfig, TokenProb};
use crate::tokenizer::Tokenizer;

/// How much the draft proposes per round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftOptions {
    /// Tokens drafted per round at most (0: no drafting, plain decoding).
    pub max: usize,
    /// Stop drafting when the draft's most likely next token has a probability below
    /// this (softmax of its logits at temperature 1); 0 = always draft `max`.
    pub p_min: f32,
}

/// Measured on a loopback ring with 5 ms per hop (`cargo xtask spec-bench`, SmolLM2-135M
/// F16 target): p_min 0.2 was the best compromise — a good draft (Q4_1) lost little to it,
/// a poor one (Q2_K) was spared most of its wasted drafts (0.82× instead of 0.44× without
/// it), where 0.5 cut a good draft's gain too.
impl Default for DraftOptions {
    fn default() -> Self {
        DraftOptions { max: 8, p_min: 0.2 }
    }
}

/// What the draft did over one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DraftStats {
    /// Tokens the draft proposed.
    pub drafted: usize,
    /// Of those, the ones the target accepted.
    pub accepted: usize,
    /// Batched target evaluations after the prompt (trips round the ring).
    pub target_evals: usize,
}

impl DraftStats {
    /// accepted / drafted (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

/// What [`generate_speculative`] returns: the generated tokens, the timings as
/// [`generate`](crate::generate::generate)'s, and what the draft did.
pub type Speculated = (Vec<u32>, GenerationStats, DraftStats);

/// An error of the target or of the draft model.
#[derive(Debug, thiserror::Error)]
pub enum SpeculativeError<T, D> {
    #[error(transparent)]
    Target(T),
    #[error("draft model: {0}")]
    Draft(D),
}

/// Why a draft model cannot draft for a target.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VocabularyMismatch {
    #[error("the draft model's vocabulary has {draft} tokens, the target's {target}: a draft must share the target's vocabulary")]
    Size { target: usize, draft: usize },
    #[error("the draft model's token {id} is {draft:?}, the target's is {target:?}: a draft must share the target's vocabulary")]
    Token {
        id: u32,
        target: String,
        draft: String,
    },
}

/// Checks that `draft` can draft for `target`: the same number of tokens (in the
/// tokenizer and in the output head, `*_n_vocab`), and every token the same text and
/// kind, so a token id means the same in both.
pub fn check_vocabularies(
    target: &Tokenizer,
    target_n_vocab: usize,
    draft: &Tokenizer,
    draft_n_vocab: usize,
) -> Result<(), VocabularyMismatch> {
    let sizes = [
        (target.vocab_size(), draft.vocab_size()),
        (target_n_vocab, draft_n_vocab),
    ];
    for (target, draft) in sizes {
        if target != draft {
            return Err(VocabularyMismatch::Size { target, draft });
        }
    }
    for id in 0..target.vocab_size() as u32 {
        let (t, d) = (target.token_text(id), draft.token_text(id));
        if t != d || target.token_kind(id) != draft.token_kind(id) {
            return Err(VocabularyMismatch::Token {
                id,
                target: t.unwrap_or_default().to_string(),
                draft: d.unwrap_or_default().to_string(),
            });
        }
    }
    Ok(())
}

/// [`generate`](crate::generate::generate) with a draft model: evaluates `prompt` in
/// `target`, samples the first token, then each round lets `draft` propose up to
/// `draft_options.max` tokens and verifies them in one evaluation of `target`. `on_text`
/// gets each complete piece of text as soon as it is accepted and may cancel. Both
/// contexts are cut back to the accepted text after each round. The draft must share the
/// target's vocabulary ([`check_vocabularies`]).
#[allow(clippy::too_many_arguments)]
pub fn generate_speculative<T: RowLogits, D: Forward>(
    target: &mut T,
    draft: &mut D,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    options: GenerateOptions,
    draft_options: DraftOptions,
    on_text: impl FnMut(&str) -> ControlFlow<()>,
) -> Result<Speculated, SpeculativeError<T::Error, D::Error>> {
    let cached = Cached { tokens: 0 };
    generate_speculative_after(
        target,
        draft,
        tokenizer,
        sampler,
        prompt,
        cached,
        options,
        draft_options,
        on_text,
    )
}

/// Prompt positions the target already holds (a server reusing the previous request's
/// cache): they are not evaluated again.
#[derive(Debug, Clone, Copy)]
pub struct Cached {
    /// The target's `n_past`: the first `tokens` prompt tokens, fewer than the prompt's.
    pub tokens: usize,
}

/// [`generate_speculative`] for a target that already holds the first `cached.tokens`
/// tokens of `prompt` (and a draft that holds a prefix of `prompt`, any length): only the
/// rest is evaluated. Penalties still see the whole prompt.
#[allow(clippy::too_many_arguments)]
pub fn generate_speculative_after<T: RowLogits, D: Forward>(
    target: &mut T,
    draft: &mut D,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    cached: Cached,
    options: GenerateOptions,
    draft_options: DraftOptions,
    on_text: impl FnMut(&str) -> ControlFlow<()>,
) -> Result<Speculated, SpeculativeError<T::Error, D::Error>> {
    let reused = cached.tokens.min(prompt.len().saturating_sub(1));
    let mut out = Output {
        tokenizer,
        options,
        n_ctx: target.n_ctx(),
        decoder: tokenizer.stream_decoder(),
        tokens: Vec::with_capacity(options.max_tokens.min(target.n_ctx())),
        context: prompt.to_vec(),
        stats: GenerationStats {
            prompt_tokens: prompt.len(),
            ..Default::default()
        },
        first_token_at: None,
        on_text,
    };
    let mut draft_stats = DraftStats::default();
    for &t in prompt {
        sampler.accept(t);
    }
    if options.max_tokens == 0 {
        return Ok((out.tokens, out.stats, draft_stats));
    }

    let start = Instant::now();
    let logits = target
        .eval(&prompt[reused..])
        .map_err(SpeculativeError::Target)?;
    let n_vocab = logits.len();
    let first = sampler.sample(logits);
    sampler.accept(first);
    out.stats.time_to_first_token = start.elapsed();
    let mut stop = out.emit(first);

    let mut draft_sampler = draft_sampler_for(sampler);
    let mut round = Round::default();
    // The target's logits of every row of the batch it verifies.
    let mut rows = Vec::new();
    while stop.is_continue() {
        // The target holds the context but its last token; the draft holds less.
        let last = *out.context.last().expect("the context holds the prompt");
        let n_target = out.context.len() - 1;
        let n_draft = draft_options
            .max
            .min(options.max_tokens - out.tokens.len() - 1)
            .min(target.n_batch().saturating_sub(1))
            .min(target.n_ctx().saturating_sub(n_target + 1))
            .min((draft.n_ctx() + 1).saturating_sub(out.context.len()));
        round
            .propose(
                draft,
                &mut draft_sampler,
                sampler,
                &out,
                n_draft,
                draft_options.p_min,
            )
            .map_err(SpeculativeError::Draft)?;
        let n = round.drafted.len();
        draft_stats.drafted += n;
        draft_stats.target_evals += 1;

        round.batch.clear();
        round.batch.push(last);
        round.batch.extend_from_slice(&round.drafted);
        let last_row = target
            .eval(&round.batch)
            .map_err(SpeculativeError::Target)?;
        // The last row's logits come with the evaluation; the others in one product.
        rows.resize((n + 1) * n_vocab, 0.0);
        rows[n * n_vocab..].copy_from_slice(last_row);
        if n > 0 {
            target
                .row_logits(0..n, &mut rows[..n * n_vocab])
                .map_err(SpeculativeError::Target)?;
        }

        // Row i holds the target's logits for the token after batch[i].
        let mut accepted = 0;
        for i in 0..=n {
            let row = &rows[i * n_vocab..(i + 1) * n_vocab];
            let verdict = if i == n {
                Verdict::Replace(sampler.sample(row))
            } else {
                round.verify(i, row, sampler)
            };
            let token = match verdict {
                Verdict::Accept(x) => {
                    accepted += 1;
                    x
                }
                Verdict::Replace(t) => t,
            };
            sampler.accept(token);
            stop = out.emit(token);
            if stop.is_break() || matches!(verdict, Verdict::Replace(_)) {
                break;
            }
        }
        draft_stats.accepted += accepted;

        // Keep what was accepted (also when generation ends: a cache that holds more than
        // the text would mislead the next request's prefix reuse). The target evaluated
        // `last` and the drafted tokens, the draft the context and every drafted token
        // but the last.
        let keep = n_target + 1 + accepted;
        target.truncate(keep).map_err(SpeculativeError::Target)?;
        if draft.n_past() > keep {
            draft.truncate(keep).map_err(SpeculativeError::Draft)?;
        }
    }

    let tail = out.decoder.finish();
    if !tail.is_empty() {
        let _ = (out.on_text)(&tail);
    }
    if let Some(t) = out.first_token_at {
        out.stats.decode_time = t.elapsed();
    }
    Ok((out.tokens, out.stats, draft_stats))
}

/// The draft's sampler: the target's settings (so q is shaped like p), its own RNG.
pub fn draft_sampler_for(sampler: &Sampler) -> Sampler {
    Sampler::new(SamplerConfig {
        seed: sampler.config().seed ^ DRAFT_SEED,
        ..sampler.config().clone()
    })
}

/// Mixed into the seed of the draft's sampler, so its draws are not the target's.
const DRAFT_SEED: u64 = 0xD4AF_7000_0000_0001;

/// The text so far and what ends it: each emitted token goes through the checks
/// [`generate`](crate::generate::generate) makes, in its order.
struct Output<'t, F> {
    tokenizer: &'t Tokenizer,
    options: GenerateOptions,
    /// The target's context length.
    n_ctx: usize,
    decoder: crate::tokenizer::StreamDecoder<'t>,
    /// Generated tokens.
    tokens: Vec<u32>,
    /// The prompt and the generated tokens.
    context: Vec<u32>,
    stats: GenerationStats,
    first_token_at: Option<Instant>,
    on_text: F,
}

impl<F: FnMut(&str) -> ControlFlow<()>> Output<'_, F> {
    /// Appends `token` to the text; `Break` when generation ends with it.
    fn emit(&mut self, token: u32) -> ControlFlow<()> {
        self.first_token_at.get_or_insert_with(Instant::now);
        let stop = |stats: &mut GenerationStats, reason| {
            stats.stop = reason;
            ControlFlow::Break(())
        };
        if !self.options.ignore_eos && self.tokenizer.is_end_of_generation(token) {
            return stop(&mut self.stats, StopReason::EndOfGeneration);
        }
        self.tokens.push(token);
        self.context.push(token);
        self.stats.generated_tokens += 1;
        let piece = self.decoder.push(token);
        if !piece.is_empty() && (self.on_text)(&piece).is_break() {
            return stop(&mut self.stats, StopReason::Cancelled);
        }
        if self.tokens.len() >= self.options.max_tokens {
            return stop(&mut self.stats, StopReason::MaxTokens);
        }
        // The next evaluation needs a position for this token.
        if self.context.len() > self.n_ctx {
            return stop(&mut self.stats, StopReason::ContextFull);
        }
        ControlFlow::Continue(())
    }
}

/// One round's buffers, reused.
#[derive(Default)]
pub struct Round {
    /// The tokens the draft proposed.
    pub drafted: Vec<u32>,
    /// q: the draft's distribution at each drafted position (sampled decoding only).
    q: Vec<Vec<TokenProb>>,
    /// What the target evaluates: the last accepted token, then the drafted ones.
    batch: Vec<u32>,
    /// p at the position being verified.
    p: Vec<TokenProb>,
    /// max(0, p − q) at a rejected position.
    residual: Vec<TokenProb>,
}

/// A drafted token kept, or the token that replaces it (or follows a fully accepted draft).
#[derive(Clone, Copy)]
pub enum Verdict {
    Accept(u32),
    Replace(u32),
}

impl Round {
    /// Brings `draft` up to the context and lets it propose up to `n_draft` tokens.
    fn propose<D: Forward, F>(
        &mut self,
        draft: &mut D,
        draft_sampler: &mut Sampler,
        sampler: &Sampler,
        out: &Output<'_, F>,
        n_draft: usize,
        p_min: f32,
    ) -> Result<(), D::Error> {
        self.drafted.clear();
        if n_draft == 0 {
            return Ok(());
        }
        let context = &out.context;
        if draft.n_past() >= context.len() {
            draft.truncate(context.len() - 1)?;
        }
        let mut logits = draft.eval(&context[draft.n_past()..])?;
        draft_sampler.copy_history_from(sampler);
        for i in 0..n_draft {
            let Some(x) = self.pick(draft_sampler, logits, p_min) else {
                break;
            };
            let ends = !out.options.ignore_eos && out.tokenizer.is_end_of_generation(x);
            if ends || i + 1 == n_draft {
                break;
            }
            logits = draft.eval(&[x])?;
        }
        Ok(())
    }

    /// Drafts the next token from the draft's `logits` (pushed to `drafted`, its q kept
    /// when sampling), or `None` when the draft is less sure than `p_min`.
    pub fn pick(&mut self, draft_sampler: &mut Sampler, logits: &[f32], p_min: f32) -> Option<u32> {
        let i = self.drafted.len();
        let x = if draft_sampler.is_greedy() {
            if p_min > 0.0 && top_probability(logits) < p_min {
                return None;
            }
            draft_sampler.sample(logits)
        } else {
            if self.q.len() <= i {
                self.q.resize_with(i + 1, Vec::new);
            }
            let q = &mut self.q[i];
            draft_sampler.distribution(logits, q);
            if q[0].p < p_min {
                return None;
            }
            draft_sampler
                .draw_from(q)
                .expect("a distribution is never empty")
        };
        self.drafted.push(x);
        draft_sampler.accept(x);
        Some(x)
    }

    /// Decides drafted token `i` from the target's logits `row` at its position.
    pub fn verify(&mut self, i: usize, row: &[f32], sampler: &mut Sampler) -> Verdict {
        let x = self.drafted[i];
        if sampler.is_greedy() {
            let t = sampler.sample(row);
            return if t == x {
                Verdict::Accept(x)
            } else {
                Verdict::Replace(t)
            };
        }
        sampler.distribution(row, &mut self.p);
        let q = &self.q[i];
        match speculative_step(x, &self.p, q, sampler, &mut self.residual) {
            Some(t) => Verdict::Replace(t),
            None => Verdict::Accept(x),
        }
    }
}

/// The rejection rule at one position: `x` was drawn from `q`; `None` accepts it (with
/// probability min(1, p(x)/q(x))), `Some(t)` rejects it for t drawn from
/// normalize(max(0, p − q)). Draws with `sampler`'s RNG; `residual` is scratch space.
pub fn speculative_step(
    x: u32,
    p: &[TokenProb],
    q: &[TokenProb],
    sampler: &mut Sampler,
    residual: &mut Vec<TokenProb>,
) -> Option<u32> {
    let prob = |d: &[TokenProb], id: u32| d.iter().find(|t| t.id == id).map_or(0.0, |t| t.p);
    let (px, qx) = (prob(p, x), prob(q, x));
    let u = sampler.uniform();
    // u < p(x)/q(x), without dividing by a q(x) that rounding made tiny.
    if u * qx < px {
        return None;
    }
    // p − q over p's support (elsewhere it is ≤ 0), by id: both may hold the whole
    // vocabulary, so no search per token.
    residual.clear();
    residual.extend_from_slice(p);
    residual.sort_unstable_by_key(|t| t.id);
    for t in q {
        if let Ok(j) = residual.binary_search_by_key(&t.id, |r| r.id) {
            residual[j].p -= t.p;
        }
    }
    residual.retain(|t| t.p > 0.0);
    // p ≤ q everywhere only by rounding (a rejection means p(x) < q(x), so some mass of p
    // lies elsewhere): then p itself.
    let from = if residual.is_empty() { p } else { residual };
    sampler.draw_from(from)
}

/// The largest softmax probability of `logits` (temperature 1).
fn top_probability(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    1.0 / sum
}

#[cfg(test)]
mod tests;

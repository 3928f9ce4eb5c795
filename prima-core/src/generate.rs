//! The generation loop: prompt in, streamed text out, with timing.
//!
//! Shared by `prima run`, the server and the ring head, so every front end
//! measures TTFT and TPOT the same way.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use crate::model::{ModelError, Session};
use crate::sampler::Sampler;
use crate::tokenizer::Tokenizer;

/// Anything that turns tokens into next-token logits while keeping its own context:
/// a single-device [`Session`], or the head of a device ring.
pub trait Forward {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Evaluates `tokens` after the cached positions; returns the last token's logits.
    fn eval(&mut self, tokens: &[u32]) -> Result<&[f32], Self::Error>;

    /// Positions already cached.
    fn n_past(&self) -> usize;

    /// Positions the context holds.
    fn n_ctx(&self) -> usize;

    /// Forgets every cached position from `n` on (a new request that shares only the
    /// first `n` tokens with what is cached).
    fn truncate(&mut self, n: usize) -> Result<(), Self::Error>;
}

impl Forward for Session<'_> {
    type Error = ModelError;

    fn eval(&mut self, tokens: &[u32]) -> Result<&[f32], ModelError> {
        Session::eval(self, tokens)
    }

    fn n_past(&self) -> usize {
        Session::n_past(self)
    }

    fn n_ctx(&self) -> usize {
        Session::n_ctx(self)
    }

    fn truncate(&mut self, n: usize) -> Result<(), ModelError> {
        Session::truncate(self, n)
    }
}

/// A [`Forward`] that hands out the logits of any row of its last batch, not only the
/// last one: what scoring a text (perplexity) or checking drafted tokens needs.
pub trait RowLogits: Forward {
    /// Largest number of tokens one [`Forward::eval`] call runs as a single batch.
    fn n_batch(&self) -> usize;

    /// Logits of rows `rows` of the last batch, row after row, into `out`
    /// (`rows.len() × n_vocab` floats). One output-head product for all of them.
    fn row_logits(
        &mut self,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) -> Result<(), Self::Error>;
}

impl RowLogits for Session<'_> {
    fn n_batch(&self) -> usize {
        Session::n_batch(self)
    }

    fn row_logits(
        &mut self,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        self.logits_rows(rows, out)
    }
}

/// What one generation did and how long it took.
#[derive(Debug, Clone, Default)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Prompt processing up to the first sampled token.
    pub time_to_first_token: Duration,
    /// Decoding of every token after the first.
    pub decode_time: Duration,
    /// Why generation stopped.
    pub stop: StopReason,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StopReason {
    #[default]
    MaxTokens,
    EndOfGeneration,
    Cancelled,
    ContextFull,
}

impl GenerationStats {
    /// Prompt tokens per second (prompt processing throughput).
    pub fn prompt_tokens_per_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.time_to_first_token.as_secs_f64().max(1e-9)
    }

    /// Mean time per output token after the first, in milliseconds.
    pub fn tpot_ms(&self) -> f64 {
        let steps = self.generated_tokens.saturating_sub(1);
        if steps == 0 {
            return 0.0;
        }
        self.decode_time.as_secs_f64() * 1e3 / steps as f64
    }
}

/// Options of one generation.
#[derive(Debug, Clone, Copy)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
}

/// Evaluates `prompt` in `session`, then samples up to `max_tokens` tokens, calling
/// `on_text` with each complete piece of UTF-8 text as soon as it is known.
/// `on_text` may return `ControlFlow::Break` to cancel.
pub fn generate<F: Forward>(
    session: &mut F,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    options: GenerateOptions,
    mut on_text: impl FnMut(&str) -> ControlFlow<()>,
) -> Result<(Vec<u32>, GenerationStats), F::Error> {
    let mut stats = GenerationStats {
        prompt_tokens: prompt.len(),
        ..Default::default()
    };
    // `max_tokens` may be "no limit" (usize::MAX): the context bounds the output.
    let mut out = Vec::with_capacity(options.max_tokens.min(session.n_ctx()));
    let mut decoder = tokenizer.stream_decoder();
    for &t in prompt {
        sampler.accept(t);
    }
    if options.max_tokens == 0 {
        return Ok((out, stats));
    }

    let start = Instant::now();
    let mut logits = session.eval(prompt)?;
    let mut first_token_at = None;
    loop {
        let token = sampler.sample(logits);
        sampler.accept(token);
        if first_token_at.is_none() {
            first_token_at = Some(Instant::now());
            stats.time_to_first_token = start.elapsed();
        }
        if !options.ignore_eos && tokenizer.is_end_of_generation(token) {
            stats.stop = StopReason::EndOfGeneration;
            break;
        }
        out.push(token);
        stats.generated_tokens += 1;
        let piece = decoder.push(token);
        if !piece.is_empty() && on_text(&piece).is_break() {
            stats.stop = StopReason::Cancelled;
            break;
        }
        if out.len() >= options.max_tokens {
            stats.stop = StopReason::MaxTokens;
            break;
        }
        if session.n_past() + 1 > session.n_ctx() {
            stats.stop = StopReason::ContextFull;
            break;
        }
        logits = session.eval(&[token])?;
    }
    let tail = decoder.finish();
    if !tail.is_empty() {
        let _ = on_text(&tail);
    }
    if let Some(t) = first_token_at {
        stats.decode_time = t.elapsed();
    }
    Ok((out, stats))
}

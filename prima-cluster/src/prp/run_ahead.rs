//! Running ahead on the device that computes the whole model while the head only embeds
//! and samples (the ring that steps aside, issue 38). Between sending a step's logits and
//! receiving the next step the device would wait two hops; instead it computes the step
//! that each row's most likely token (the argmax of the logits it sent) would start. When
//! the head's next frame is exactly that step — the same spans, each row the embedding of
//! the guessed token, bit for bit — the result is sent at once. Otherwise the frame is
//! computed as usual: its spans cut the slots' positions where the guess wrote, so a wrong
//! guess leaves nothing behind but the time it took.
//!
//! Greedy decoding always hits. Sampled text often does not, and a wrong guess delays the
//! real step by up to one step's compute, so guesses stop while they mostly miss; whether
//! the head took the guessed tokens is still checked every step (an embedding lookup), so
//! they resume when they would hit again.

use prima_core::batch::SeqSpan;
use prima_core::model::{Model, ModelError, Session};
use prima_core::sampler::argmax_logits;

use super::counters::PassMeter;
use super::residency::Residency;

/// A step computed ahead: its spans, its input (the guessed tokens and their embeddings),
/// and what the device would send for it.
pub struct Guess {
    pub spans: Vec<SeqSpan>,
    tokens: Vec<u32>,
    input: Vec<f32>,
    /// Present when the step was computed: the hidden states and the logits of every row.
    pub output: Option<GuessOutput>,
}

/// The input of a step that came: the previous device's hidden states, or the head's token
/// ids (`protocol::WireType::Tokens`).
pub enum StepInput<'a> {
    Hidden(&'a [f32]),
    Tokens(&'a [u32]),
}

pub struct GuessOutput {
    pub hidden: Vec<f32>,
    pub logits: Vec<f32>,
    pub compute_ms: f64,
}

/// The device's guesses and how well they have done lately.
pub struct RunAhead {
    guess: Option<Guess>,
    /// Raised by a hit, lowered twice as much by a miss: the step is computed ahead while
    /// it is at least [`RunAhead::COMPUTE_AT`], so while about two thirds of guesses hit.
    score: u32,
    /// Steps computed ahead, and of those the ones the head took.
    pub computed: u64,
    pub taken: u64,
}

impl Default for RunAhead {
    fn default() -> Self {
        RunAhead {
            guess: None,
            score: Self::START,
            computed: 0,
            taken: 0,
        }
    }
}

impl RunAhead {
    const START: u32 = 4;
    const MAX: u32 = 8;
    const COMPUTE_AT: u32 = 2;

    pub fn has_guess(&self) -> bool {
        self.guess.is_some()
    }

    /// After a step whose spans are `spans` and whose logits (`logits`, one row of `n_vocab`
    /// per entry of `rows`) went to the head: guesses the next step when every span's last
    /// row has logits (a decode step, or a prompt's end) and no other batch is in flight,
    /// and computes it when guesses have been hitting. The session's last batch must be
    /// finished.
    #[allow(clippy::too_many_arguments)]
    pub fn guess(
        &mut self,
        model: &Model,
        session: &mut Session<'_>,
        residency: &Residency,
        meter: &PassMeter,
        spans: &[SeqSpan],
        rows: &[u32],
        logits: &[f32],
    ) -> Result<(), ModelError> {
        self.guess = None;
        let n_vocab = model.hparams().n_vocab;
        let Some(tokens) = next_tokens(spans, rows, logits, n_vocab) else {
            return Ok(());
        };
        let next: Vec<SeqSpan> = spans
            .iter()
            .map(|s| SeqSpan {
                slot: s.slot,
                start: s.start + s.len,
                len: 1,
            })
            .collect();
        if next.iter().any(|s| s.start >= session.n_ctx()) {
            return Ok(());
        }
        session.begin_spans(&next)?;
        session.embed(&tokens)?;
        let input = session.hidden()?.to_vec();
        let output = if self.score >= Self::COMPUTE_AT {
            let computing = std::time::Instant::now();
            let run = residency.run_round(model, session, meter, 0)?;
            let all: Vec<u32> = (0..next.len() as u32).collect();
            let mut logits = Vec::new();
            session.logits_of(&all, &mut logits)?;
            let compute_ms = computing.elapsed().as_secs_f64() * 1e3;
            let hidden = session.hidden()?.to_vec();
            session.finish_batch();
            if let Some(i) = run.index {
                residency.after_window(model, i);
            }
            self.computed += 1;
            Some(GuessOutput {
                hidden,
                logits,
                compute_ms,
            })
        } else {
            None
        };
        self.guess = Some(Guess {
            spans: next,
            tokens,
            input,
            output,
        });
        Ok(())
    }

    /// The guess, when the step that came (`spans`, logits wanted of `rows`, its input)
    /// is the one guessed; scores the guess either way.
    pub fn take_if_guessed(
        &mut self,
        spans: &[SeqSpan],
        rows: &[u32],
        input: StepInput<'_>,
    ) -> Option<Guess> {
        let guess = self.guess.take()?;
        let every_row: bool = rows.iter().enumerate().all(|(i, &r)| r as usize == i);
        let same_input = match input {
            StepInput::Hidden(x) => bits_equal(&guess.input, x),
            StepInput::Tokens(t) => guess.tokens == t,
        };
        let hit = guess.spans == spans && rows.len() == spans.len() && every_row && same_input;
        self.score = if hit {
            (self.score + 1).min(Self::MAX)
        } else {
            self.score.saturating_sub(2)
        };
        if hit && guess.output.is_some() {
            self.taken += 1;
        }
        hit.then_some(guess)
    }
}

/// Each span's most likely next token, when `rows` are exactly the spans' last rows in
/// order (ties to the lower id, as greedy sampling breaks them).
fn next_tokens(
    spans: &[SeqSpan],
    rows: &[u32],
    logits: &[f32],
    n_vocab: usize,
) -> Option<Vec<u32>> {
    if spans.is_empty() || rows.len() != spans.len() || logits.len() != rows.len() * n_vocab {
        return None;
    }
    let mut end = 0;
    for (s, &r) in spans.iter().zip(rows) {
        end += s.len;
        if r as usize != end - 1 {
            return None;
        }
    }
    Some(logits.chunks_exact(n_vocab).map(argmax_logits).collect())
}

fn bits_equal(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(slot: usize, start: usize, len: usize) -> SeqSpan {
        SeqSpan { slot, start, len }
    }

    #[test]
    fn only_steps_that_end_every_span_are_guessed() {
        let logits = [0.0, 2.0, 1.0, 5.0, 5.0, 1.0];
        let spans = [span(0, 4, 3), span(1, 0, 1)];
        assert_eq!(next_tokens(&spans, &[2, 3], &logits, 3), Some(vec![1, 0]));
        // A prompt chunk that does not end its entry, a missing row, rows out of order.
        assert_eq!(next_tokens(&spans, &[1, 3], &logits, 3), None);
        assert_eq!(next_tokens(&spans, &[3], &logits[..3], 3), None);
        assert_eq!(next_tokens(&spans, &[3, 2], &logits, 3), None);
    }

    #[test]
    fn a_guess_is_taken_only_for_the_same_step_and_misses_stop_the_computing() {
        let mut ahead = RunAhead::default();
        let spans = vec![span(0, 5, 1)];
        let guess = |ahead: &mut RunAhead| {
            ahead.guess = Some(Guess {
                spans: spans.clone(),
                tokens: vec![7],
                input: vec![1.0, -0.0],
                output: None,
            });
        };
        guess(&mut ahead);
        assert!(ahead
            .take_if_guessed(&spans, &[0], StepInput::Hidden(&[1.0, -0.0]))
            .is_some());
        // The same step as the head's tokens; another token.
        guess(&mut ahead);
        assert!(ahead
            .take_if_guessed(&spans, &[0], StepInput::Tokens(&[7]))
            .is_some());
        guess(&mut ahead);
        assert!(ahead
            .take_if_guessed(&spans, &[0], StepInput::Tokens(&[8]))
            .is_none());
        ahead.score = RunAhead::START;
        // Another token (here: the sign of a zero), other spans, no logits asked.
        for (s, rows, input) in [
            (spans.clone(), vec![0u32], vec![1.0f32, 0.0]),
            (vec![span(0, 6, 1)], vec![0], vec![1.0, -0.0]),
            (spans.clone(), vec![], vec![1.0, -0.0]),
        ] {
            guess(&mut ahead);
            assert!(ahead
                .take_if_guessed(&s, &rows, StepInput::Hidden(&input))
                .is_none());
        }
        assert!(
            ahead.score < RunAhead::COMPUTE_AT,
            "three misses stop the computing"
        );
        assert!(
            ahead
                .take_if_guessed(&spans, &[0], StepInput::Hidden(&[1.0, -0.0]))
                .is_none(),
            "no guess left"
        );
    }
}

//! Any [`Forward`] (one context) as a one-slot [`BatchForward`], so `--parallel 1` runs
//! on the same scheduler as several slots: a `Session`, a `LocalSession`, a `RingHead`
//! or a `ResilientRing` with its failover.

use thiserror::Error;

use prima_core::batch::{BatchForward, SeqTokens};
use prima_core::generate::Forward;

/// A [`Forward`] seen as a [`BatchForward`] of one slot.
pub struct OneSlot<'f, F: Forward> {
    forward: &'f mut F,
    /// Length of the last logits returned (the model's vocabulary).
    n_vocab: usize,
}

impl<'f, F: Forward> OneSlot<'f, F> {
    pub fn new(forward: &'f mut F) -> OneSlot<'f, F> {
        OneSlot {
            forward,
            n_vocab: 0,
        }
    }

    /// The wrapped model (e.g. for a ring's statistics between requests).
    pub fn inner(&mut self) -> &mut F {
        self.forward
    }
}

#[derive(Debug, Error)]
pub enum OneSlotError<E: std::error::Error + 'static> {
    #[error(transparent)]
    Forward(E),
    #[error("a one-slot model was asked for slot {slot} or for several sequences at once")]
    Slots { slot: usize },
}

impl<F: Forward> BatchForward for OneSlot<'_, F> {
    type Error = OneSlotError<F::Error>;

    fn n_slots(&self) -> usize {
        1
    }

    fn n_ctx(&self) -> usize {
        self.forward.n_ctx()
    }

    /// Unbounded: the wrapped model cuts a long prompt into its own batches, and with one
    /// slot there is no other sequence a long prompt could stall.
    fn n_batch(&self) -> usize {
        usize::MAX
    }

    /// Known after the first evaluation; 0 before.
    fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    fn n_past(&self, _slot: usize) -> usize {
        self.forward.n_past()
    }

    fn truncate(&mut self, slot: usize, n: usize) -> Result<(), Self::Error> {
        if slot != 0 {
            return Err(OneSlotError::Slots { slot });
        }
        self.forward.truncate(n).map_err(OneSlotError::Forward)
    }

    fn eval_batch(&mut self, seqs: &[SeqTokens<'_>]) -> Result<&[f32], Self::Error> {
        let [seq] = seqs else {
            return Err(OneSlotError::Slots {
                slot: seqs.get(1).map_or(0, |s| s.slot),
            });
        };
        if seq.slot != 0 {
            return Err(OneSlotError::Slots { slot: seq.slot });
        }
        let logits = self
            .forward
            .eval(seq.tokens)
            .map_err(OneSlotError::Forward)?;
        self.n_vocab = logits.len();
        Ok(logits)
    }
}

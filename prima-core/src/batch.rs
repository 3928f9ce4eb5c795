//! Several sequences through one forward pass: the engine interface of continuous batching.
//!
//! A [`BatchForward`] holds `n_slots` independent contexts (a KV cache each) and runs the
//! tokens of several of them as one batch, so every weight is read once for all their
//! rows. The server's scheduler decides which slots take part in each step; the engine
//! (one device, or the head of a ring) only evaluates what it is given.

pub use crate::model::{check_entries, check_rows, plan_batches, Piece, SeqSpan, SeqTokens};
use crate::model::{ModelError, Session};

/// A forward pass over `n_slots` independent contexts.
pub trait BatchForward {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Independent contexts (KV caches) held.
    fn n_slots(&self) -> usize;

    /// Positions each slot holds.
    fn n_ctx(&self) -> usize;

    /// Largest number of tokens, all slots together, that one batch runs.
    fn n_batch(&self) -> usize;

    /// Logits per token.
    fn n_vocab(&self) -> usize;

    /// Positions slot `slot` has cached.
    fn n_past(&self, slot: usize) -> usize;

    /// Forgets every cached position of slot `slot` from `n` on.
    fn truncate(&mut self, slot: usize, n: usize) -> Result<(), Self::Error>;

    /// Evaluates each entry's tokens after its slot's cached positions, all entries in
    /// one batch (or several, in order, when they exceed [`BatchForward::n_batch`]);
    /// returns the logits of each entry's last token, entry after entry
    /// (`seqs.len() × n_vocab` floats). A slot appears at most once; an entry has at
    /// least one token.
    fn eval_batch(&mut self, seqs: &[SeqTokens<'_>]) -> Result<&[f32], Self::Error>;
}

/// A [`BatchForward`] that returns the logits of several rows of an entry, not only its
/// last: speculative decoding verifies each slot's drafted tokens from the rows after
/// them, every slot's in one batch (one trip round the ring).
pub trait BatchRowLogits: BatchForward {
    /// As [`BatchForward::eval_batch`], but returns the logits of the last `rows[i]`
    /// tokens of entry `i` (1 to its tokens), entry after entry, row after row
    /// (`Σ rows × n_vocab` floats). The output head runs once per batch over the rows
    /// asked for.
    fn eval_batch_rows(
        &mut self,
        seqs: &[SeqTokens<'_>],
        rows: &[usize],
    ) -> Result<&[f32], Self::Error>;
}

/// A session's slots on one device: every layer here.
impl BatchForward for Session<'_> {
    type Error = ModelError;

    fn n_slots(&self) -> usize {
        Session::n_slots(self)
    }

    fn n_ctx(&self) -> usize {
        Session::n_ctx(self)
    }

    fn n_batch(&self) -> usize {
        Session::n_batch(self)
    }

    fn n_vocab(&self) -> usize {
        self.model().hparams().n_vocab
    }

    fn n_past(&self, slot: usize) -> usize {
        self.slot_n_past(slot)
    }

    fn truncate(&mut self, slot: usize, n: usize) -> Result<(), ModelError> {
        self.truncate_slot(slot, n)
    }

    fn eval_batch(&mut self, seqs: &[SeqTokens<'_>]) -> Result<&[f32], ModelError> {
        let n_layers = self.model().hparams().n_layers;
        self.eval_batch_with(seqs, |s| s.run_layers(0..n_layers))
    }
}

impl BatchRowLogits for Session<'_> {
    fn eval_batch_rows(
        &mut self,
        seqs: &[SeqTokens<'_>],
        rows: &[usize],
    ) -> Result<&[f32], ModelError> {
        let n_layers = self.model().hparams().n_layers;
        self.eval_batch_rows_with(seqs, rows, |s| s.run_layers(0..n_layers))
    }
}

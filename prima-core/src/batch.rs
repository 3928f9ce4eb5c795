//! Several sequences through one forward pass: the engine interface of continuous batching.
//!
//! A [`BatchForward`] holds `n_slots` independent contexts (a KV cache each) and runs the
//! tokens of several of them as one batch, so every weight is read once for all their
//! rows. The server's scheduler decides which slots take part in each step; the engine
//! (one device, or the head of a ring) only evaluates what it is given.

/// One sequence's share of a multi-sequence batch: `tokens` follow what slot `slot`
/// has cached.
#[derive(Debug, Clone, Copy)]
pub struct SeqTokens<'a> {
    pub slot: usize,
    pub tokens: &'a [u32],
}

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

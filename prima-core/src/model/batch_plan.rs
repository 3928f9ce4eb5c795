//! How a multi-sequence batch is laid out for the forward pass: each sequence's tokens
//! ([`SeqTokens`]), the rows they take in one batch ([`SeqSpan`], [`Piece`]), the cut
//! into batches of at most `n_batch` rows ([`plan_batches`]) and the checks on entries
//! before anything runs.
//!
//! Plain data and pure functions that the model's [`Session`](super::Session) needs;
//! `crate::batch` (continuous batching's engine interface) builds on them and
//! re-exports them, so the dependency runs one way: batch → model.

use super::ModelError;

/// One sequence's share of a multi-sequence batch: `tokens` follow what slot `slot`
/// has cached.
#[derive(Debug, Clone, Copy)]
pub struct SeqTokens<'a> {
    pub slot: usize,
    pub tokens: &'a [u32],
}

/// Fails, naming the entry, unless `rows` gives each entry of `seqs` between 1 and its
/// tokens' count of logits rows.
pub fn check_rows(seqs: &[SeqTokens<'_>], rows: &[usize]) -> Result<(), ModelError> {
    if rows.len() != seqs.len() {
        return Err(ModelError::EntryRowsCount {
            given: rows.len(),
            entries: seqs.len(),
        });
    }
    for (seq, &n) in seqs.iter().zip(rows) {
        if n == 0 || n > seq.tokens.len() {
            return Err(ModelError::EntryRows {
                slot: seq.slot,
                rows: n,
                tokens: seq.tokens.len(),
            });
        }
    }
    Ok(())
}

/// Fails, naming the entry, unless every entry of `seqs` names one of `n_slots` slots,
/// no slot appears twice, every entry has a token and every slot's context of `n_ctx`
/// positions, of which it holds `n_past(slot)`, has room for its tokens.
pub fn check_entries(
    seqs: &[SeqTokens<'_>],
    n_slots: usize,
    n_ctx: usize,
    n_past: impl Fn(usize) -> usize,
) -> Result<(), ModelError> {
    for (i, seq) in seqs.iter().enumerate() {
        if seq.slot >= n_slots {
            return Err(ModelError::UnknownSlot {
                slot: seq.slot,
                n_slots,
            });
        }
        if seqs[..i].iter().any(|s| s.slot == seq.slot) {
            return Err(ModelError::SlotTwice { slot: seq.slot });
        }
        if seq.tokens.is_empty() {
            return Err(ModelError::EmptyEntry { slot: seq.slot });
        }
        let needed = n_past(seq.slot) + seq.tokens.len();
        if needed > n_ctx {
            return Err(ModelError::SlotContextFull {
                slot: seq.slot,
                needed,
                n_ctx,
            });
        }
    }
    Ok(())
}

/// The rows one sequence contributes to one batch: `len` tokens of slot `slot` at
/// positions `start..start + len`. A batch is a list of these, their rows one after
/// another in the residual stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqSpan {
    pub slot: usize,
    pub start: usize,
    pub len: usize,
}

/// One piece of one entry of a multi-sequence evaluation (`BatchForward::eval_batch`) in
/// one batch: tokens `tokens` of entry `entry`, as the span `span` of the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub entry: usize,
    pub tokens: std::ops::Range<usize>,
    pub span: SeqSpan,
}

impl Piece {
    /// Whether this piece holds its entry's last token (so its last row gives the
    /// entry's logits).
    pub fn ends(&self, seqs: &[SeqTokens<'_>]) -> bool {
        self.tokens.end == seqs[self.entry].tokens.len()
    }
}

/// Cuts `seqs` into batches of at most `n_batch` rows, entries in order: an entry that
/// does not fit the room left in a batch continues at the start of the next one. Slot
/// `s` holds `n_past(s)` positions before. No checks: the caller has checked the
/// entries (see `Session::check_batch`).
pub fn plan_batches(
    seqs: &[SeqTokens<'_>],
    n_past: impl Fn(usize) -> usize,
    n_batch: usize,
) -> Vec<Vec<Piece>> {
    let n_batch = n_batch.max(1);
    let mut batches = Vec::new();
    let mut batch = Vec::new();
    let mut room = n_batch;
    for (entry, seq) in seqs.iter().enumerate() {
        let mut done = 0;
        while done < seq.tokens.len() {
            let len = (seq.tokens.len() - done).min(room);
            batch.push(Piece {
                entry,
                tokens: done..done + len,
                span: SeqSpan {
                    slot: seq.slot,
                    start: n_past(seq.slot) + done,
                    len,
                },
            });
            done += len;
            room -= len;
            if room == 0 {
                batches.push(std::mem::take(&mut batch));
                room = n_batch;
            }
        }
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_cut_where_a_batch_is_full() {
        let (a, b, c) = ([1u32; 5], [2u32; 1], [3u32; 3]);
        let seqs = [
            SeqTokens {
                slot: 2,
                tokens: &a,
            },
            SeqTokens {
                slot: 0,
                tokens: &b,
            },
            SeqTokens {
                slot: 1,
                tokens: &c,
            },
        ];
        let past = |slot: usize| [10, 0, 7][slot];
        let batches = plan_batches(&seqs, past, 4);
        let shape: Vec<Vec<(usize, usize, usize, usize)>> = batches
            .iter()
            .map(|b| {
                b.iter()
                    .map(|p| (p.entry, p.span.slot, p.span.start, p.span.len))
                    .collect()
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                vec![(0, 2, 7, 4)],
                vec![(0, 2, 11, 1), (1, 0, 10, 1), (2, 1, 0, 2)],
                vec![(2, 1, 2, 1)],
            ]
        );
        let ends: Vec<bool> = batches.iter().flatten().map(|p| p.ends(&seqs)).collect();
        assert_eq!(ends, [false, true, true, false, true]);
        assert!(plan_batches(&[], past, 4).is_empty());
    }
}

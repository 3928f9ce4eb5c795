//! Byte-pair merging over one pre-tokenized word.
//!
//! Merges are looked up by the ids of the two halves. Strings that take part in merges
//! but are not vocabulary entries get ids past the end of the vocabulary, so every
//! symbol is one integer and the hot loop never hashes strings.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::TokenizerError;

pub struct Merges {
    /// (left id, right id) → (rank, id of the merged string).
    pairs: HashMap<(u32, u32), (u32, u32)>,
    /// Strings past the vocabulary, with ids from `n_vocab` up.
    extra_ids: HashMap<String, u32>,
}

impl Merges {
    /// `lookup` maps vocabulary text to its id; `merges` are "left right" lines, best first.
    pub fn new(
        merges: &[&str],
        n_vocab: usize,
        lookup: &HashMap<String, u32>,
    ) -> Result<Self, TokenizerError> {
        let mut extra_ids: HashMap<String, u32> = HashMap::new();
        let mut intern = |s: &str| -> u32 {
            if let Some(&id) = lookup.get(s) {
                return id;
            }
            if let Some(&id) = extra_ids.get(s) {
                return id;
            }
            let id = (n_vocab + extra_ids.len()) as u32;
            extra_ids.insert(s.to_string(), id);
            id
        };
        let mut pairs = HashMap::with_capacity(merges.len());
        for (rank, line) in merges.iter().enumerate() {
            // The separator is the first space after the first character: a half may itself
            // be a space only in vocabularies that are not byte-level, which we do not load.
            let split = line
                .char_indices()
                .skip(1)
                .find(|&(_, c)| c == ' ')
                .map(|(i, _)| i)
                .ok_or_else(|| TokenizerError::BadMerge {
                    index: rank,
                    entry: line.to_string(),
                })?;
            let (left, right) = (&line[..split], &line[split + 1..]);
            if right.is_empty() {
                return Err(TokenizerError::BadMerge {
                    index: rank,
                    entry: line.to_string(),
                });
            }
            let l = intern(left);
            let r = intern(right);
            let merged = intern(&format!("{left}{right}"));
            // The first (best) rank for a pair wins, as in llama.cpp.
            pairs.entry((l, r)).or_insert((rank as u32, merged));
        }
        Ok(Merges { pairs, extra_ids })
    }

    /// Id of a string that takes part in merges but is not in the vocabulary.
    pub fn extra_id(&self, s: &str) -> Option<u32> {
        self.extra_ids.get(s).copied()
    }

    fn get(&self, l: u32, r: u32) -> Option<(u32, u32)> {
        self.pairs.get(&(l, r)).copied()
    }
}

/// A symbol of the word being merged: an id (or `None` for a character that is in
/// neither the vocabulary nor any merge), and its neighbours in the live chain.
#[derive(Clone, Copy)]
struct Symbol {
    id: Option<u32>,
    start: usize,
    end: usize,
    prev: usize,
    next: usize,
    alive: bool,
}

const NONE: usize = usize::MAX;

/// Merges the characters of `word` (byte-level text) and returns each final symbol as
/// `(id, text range)`. `char_id` gives the id of a one-character string.
pub fn merge_word(
    word: &str,
    merges: &Merges,
    char_id: impl Fn(&str) -> Option<u32>,
    out: &mut Vec<(Option<u32>, std::ops::Range<usize>)>,
) {
    let mut syms: Vec<Symbol> = Vec::with_capacity(word.len());
    for (start, c) in word.char_indices() {
        let end = start + c.len_utf8();
        let i = syms.len();
        syms.push(Symbol {
            id: char_id(&word[start..end]),
            start,
            end,
            prev: if i == 0 { NONE } else { i - 1 },
            next: i + 1,
            alive: true,
        });
    }
    if let Some(last) = syms.last_mut() {
        last.next = NONE;
    }

    // Min-heap on (rank, left position): equal ranks merge leftmost first.
    let mut heap: BinaryHeap<Reverse<(u32, usize, u32, u32)>> = BinaryHeap::new();
    let push = |heap: &mut BinaryHeap<_>, syms: &[Symbol], l: usize| {
        if l == NONE || syms[l].next == NONE {
            return;
        }
        let r = syms[l].next;
        if let (Some(a), Some(b)) = (syms[l].id, syms[r].id) {
            if let Some((rank, _)) = merges.get(a, b) {
                heap.push(Reverse((rank, l, a, b)));
            }
        }
    };
    for i in 0..syms.len() {
        push(&mut heap, &syms, i);
    }
    while let Some(Reverse((_, l, a, b))) = heap.pop() {
        let r = syms[l].next;
        // Stale entry: one side has merged with something else since it was pushed.
        if !syms[l].alive || r == NONE || syms[l].id != Some(a) || syms[r].id != Some(b) {
            continue;
        }
        let (_, merged) = merges.get(a, b).expect("pair was found when pushed");
        syms[l].id = Some(merged);
        syms[l].end = syms[r].end;
        syms[l].next = syms[r].next;
        syms[r].alive = false;
        if syms[r].next != NONE {
            let n = syms[r].next;
            syms[n].prev = l;
        }
        push(&mut heap, &syms, syms[l].prev);
        push(&mut heap, &syms, l);
    }
    out.extend(
        syms.iter()
            .filter(|s| s.alive)
            .map(|s| (s.id, s.start..s.end)),
    );
}

//! SentencePiece BPE (`tokenizer.ggml.model = "llama"`): Llama 1/2, Mistral, Gemma.
//!
//! Spaces are written as U+2581 (`▁`); with `tokenizer.ggml.add_space_prefix` a text
//! fragment that starts the input or follows a special token gets a leading one. The
//! text is split into characters, then the adjacent pair whose concatenation is the
//! vocabulary entry with the highest score (`tokenizer.ggml.scores`) is merged, again and
//! again, leftmost first on ties — llama.cpp's `llm_tokenizer_spm_session`. A final
//! symbol that is not a vocabulary entry (only possible for a single character) becomes
//! its UTF-8 bytes as `<0xXX>` tokens.
//!
//! Not here: cutting special tokens out of the text and BOS (shared with BPE, in
//! [`super::Tokenizer::encode`]).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// SentencePiece's visible space.
pub const SPACE: &str = "\u{2581}";

/// Scores and byte-fallback ids of a SentencePiece vocabulary.
pub(super) struct Spm {
    scores: Vec<f32>,
    /// Token of each byte: `<0xXX>`, else the one-byte text itself (as llama.cpp).
    byte_tokens: Box<[Option<u32>; 256]>,
}

/// A symbol of the word being merged: a byte range of the escaped text, linked to its
/// live neighbours. Merged-away symbols have `len == 0`.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of two adjacent symbols.
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    /// Byte length of the merged text, to detect stale entries.
    size: usize,
}

impl Ord for Bigram {
    /// Highest score first; on equal scores the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl Spm {
    pub(super) fn new(scores: Vec<f32>, ids: &HashMap<String, u32>) -> Spm {
        let mut byte_tokens = Box::new([None; 256]);
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            let hex = format!("<0x{b:02X}>");
            *slot = ids.get(hex.as_str()).copied().or_else(|| {
                // A lone byte ≥ 0x80 is not a str; only ASCII can be looked up as text.
                u8::try_from(b)
                    .ok()
                    .filter(u8::is_ascii)
                    .and_then(|c| ids.get((c as char).encode_utf8(&mut [0; 4]) as &str))
                    .copied()
            });
        }
        Spm {
            scores,
            byte_tokens,
        }
    }

    /// Appends the tokens of `text` (no special tokens in it) to `out`.
    pub(super) fn encode(
        &self,
        text: &str,
        space_prefix: bool,
        ids: &HashMap<String, u32>,
        out: &mut Vec<u32>,
    ) {
        let mut escaped = String::with_capacity(text.len() + 3);
        if space_prefix {
            escaped.push_str(SPACE);
        }
        escaped.push_str(&text.replace(' ', SPACE));
        if escaped.is_empty() {
            return;
        }
        let text = escaped.as_str();

        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        let n_chars = text.chars().count();
        for (i, (start, c)) in text.char_indices().enumerate() {
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: (i + 1 < n_chars).then_some(i + 1),
            });
        }

        let mut queue = BinaryHeap::new();
        let try_add = |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], left, right| {
            let (Some(left), Some(right)) = (left, right) else {
                return;
            };
            let (l, r): (Symbol, Symbol) = (symbols[left], symbols[right]);
            let piece = &text[l.start..l.start + l.len + r.len];
            if let Some(&id) = ids.get(piece) {
                if let Some(&score) = self.scores.get(id as usize) {
                    queue.push(Bigram {
                        left,
                        right,
                        score,
                        size: piece.len(),
                    });
                }
            }
        };
        for i in 1..symbols.len() {
            try_add(&mut queue, &symbols, Some(i - 1), Some(i));
        }

        while let Some(bigram) = queue.pop() {
            let (l, r) = (symbols[bigram.left], symbols[bigram.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != bigram.size {
                continue; // one side was merged into something else since
            }
            symbols[bigram.left].len += r.len;
            symbols[bigram.right].len = 0;
            symbols[bigram.left].next = r.next;
            if let Some(next) = r.next {
                symbols[next].prev = Some(bigram.left);
            }
            try_add(&mut queue, &symbols, l.prev, Some(bigram.left));
            try_add(&mut queue, &symbols, Some(bigram.left), r.next);
        }

        let mut at = Some(0);
        while let Some(i) = at {
            let s = symbols[i];
            let piece = &text[s.start..s.start + s.len];
            match ids.get(piece) {
                Some(&id) => out.push(id),
                // Every merge made a vocabulary entry, so this is a single character
                // the vocabulary lacks: fall back to its bytes.
                None => out.extend(piece.bytes().filter_map(|b| self.byte_tokens[b as usize])),
            }
            at = s.next;
        }
    }
}

/// The byte a `<0xXX>` token stands for.
pub(super) fn byte_token_value(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(entries: &[(&str, f32)]) -> (Spm, HashMap<String, u32>) {
        let mut ids = HashMap::new();
        let mut scores = Vec::new();
        for (i, (t, s)) in entries.iter().enumerate() {
            ids.insert(t.to_string(), i as u32);
            scores.push(*s);
        }
        for b in 0..=255u8 {
            let id = scores.len() as u32;
            ids.insert(format!("<0x{b:02X}>"), id);
            scores.push(0.0);
        }
        (Spm::new(scores, &ids), ids)
    }

    #[test]
    fn highest_score_merges_first() {
        // "abc": "ab" (-1) loses to "bc" (-0.5), and "abc" is not reachable from "a"+"bc".
        let (spm, ids) = vocab(&[
            ("a", 0.0),
            ("b", 0.0),
            ("c", 0.0),
            ("ab", -1.0),
            ("bc", -0.5),
        ]);
        let mut out = Vec::new();
        spm.encode("abc", false, &ids, &mut out);
        assert_eq!(out, [0, 4]);
    }

    #[test]
    fn spaces_become_u2581_and_prefix_is_optional() {
        let (spm, ids) = vocab(&[("\u{2581}", 0.0), ("a", 0.0), ("\u{2581}a", 1.0)]);
        let mut out = Vec::new();
        spm.encode("a a", true, &ids, &mut out);
        assert_eq!(out, [2, 2]);
        out.clear();
        spm.encode("a a", false, &ids, &mut out);
        assert_eq!(out, [1, 2]);
    }

    #[test]
    fn unknown_characters_fall_back_to_bytes() {
        let (spm, ids) = vocab(&[("a", 0.0)]);
        let mut out = Vec::new();
        spm.encode("aé", false, &ids, &mut out);
        // é is C3 A9; byte tokens follow the one listed entry.
        assert_eq!(out, [0, 1 + 0xC3, 1 + 0xA9]);
        assert_eq!(byte_token_value("<0xC3>"), Some(0xC3));
        assert_eq!(byte_token_value("<0xC3"), None);
    }
}

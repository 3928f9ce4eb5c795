//! Pre-tokenization: splitting text into words before BPE runs on each word.
//!
//! A pre-tokenizer is a list of regexes applied in turn, as llama.cpp does: each regex
//! splits every piece produced so far into its matches and the gaps between them (gaps
//! are kept as pieces too), so no text is ever dropped. A regex never sees across the
//! boundary of a piece, which matters for lookaheads such as `\s+(?!\S)`.
//!
//! Which list a model uses is chosen by the GGUF key `tokenizer.ggml.pre`.

use fancy_regex::Regex;

use super::TokenizerError;

/// GPT-2's pattern. llama.cpp leaves off the final `\s+`; it only ever matches what
/// would otherwise be a one-character gap, so the split is the same either way.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Llama 3's pattern, with the case-insensitive contractions spelled out per letter
/// (ASCII only, as llama.cpp does, rather than full Unicode case folding).
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's pattern: Llama 3's with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-4o's (o200k, gpt-oss's) pattern as llama.cpp runs it. The original splits a word
/// into an upper-case run and a lower-case run (`[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*` then
/// `[\p{Ll}\p{Lm}\p{Lo}\p{M}]+`); llama.cpp, whose regexes see only a letter/number/
/// punctuation class per non-ASCII character, approximates the runs as "letters other than
/// a-z" then "letters other than A-Z", and leaves combining marks out of words. Its ids are
/// the reference, so its reading is the one written here.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{L}&&[^a-z]]*[\p{L}&&[^A-Z]]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{L}&&[^a-z]]+[\p{L}&&[^A-Z]]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-4o's pattern with combining marks inside words (llama.cpp's
/// `granite-embed-multi-97m`): the runs are marks or letters other than a-z (resp. A-Z).
const GPT4O_MARKS: &str = r"[^\r\n\p{L}\p{N}]?[[\p{L}\p{M}]&&[^a-z]]*[[\p{L}\p{M}]&&[^A-Z]]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[[\p{L}\p{M}]&&[^a-z]]+[[\p{L}\p{M}]&&[^A-Z]]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The regex list for a `tokenizer.ggml.pre` value, and whether a word found whole in
/// the vocabulary skips the merges (llama.cpp's `ignore_merges`, set for Llama 3).
fn patterns_for(pre: &str) -> Option<(&'static [&'static str], bool)> {
    const DEFAULT: &[&str] = &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"];
    Some(match pre {
        "default" => (DEFAULT, false),
        "gpt-2" | "phi-2" | "gpt2" | "mpt" | "olmo" | "jais" => (&[GPT2], false),
        "llama-bpe" | "llama3" | "llama-v3" | "falcon3" | "smaug-bpe" | "dbrx" => (&[LLAMA3], true),
        // SmolLM / StarCoder: digits split one by one first, then GPT-2's pattern.
        "smollm" | "starcoder" | "refact" | "codeshell" => (&[r"\p{N}", GPT2], false),
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "megrez" => (&[QWEN2], false),
        // o200k (gpt-oss, GPT-4o) and the vocabularies that reuse its split.
        "gpt-4o" | "llama4" | "kanana2" | "talkie" => (&[GPT4O], false),
        "granite-embed-multi-97m" => (&[GPT4O_MARKS], true),
        _ => return None,
    })
}

/// A compiled pre-tokenizer.
pub struct PreTokenizer {
    regexes: Vec<Regex>,
    ignore_merges: bool,
}

impl PreTokenizer {
    /// Builds the pre-tokenizer named by `tokenizer.ggml.pre`; a missing name means
    /// `default`, as in llama.cpp.
    pub fn new(pre: &str) -> Result<Self, TokenizerError> {
        let (patterns, ignore_merges) = patterns_for(pre)
            .ok_or_else(|| TokenizerError::UnknownPreTokenizer(pre.to_string()))?;
        let regexes = patterns
            .iter()
            .map(|p| Regex::new(p).expect("built-in pre-tokenizer regexes compile"))
            .collect();
        Ok(PreTokenizer {
            regexes,
            ignore_merges,
        })
    }

    /// Whether a word that is itself a vocabulary entry is taken whole, without merges.
    pub fn ignore_merges(&self) -> bool {
        self.ignore_merges
    }

    /// Splits `text` into words, in order; the words concatenate back to `text`.
    pub fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut pieces = vec![text];
        let mut next = Vec::new();
        for re in &self.regexes {
            for &piece in &pieces {
                split_one(re, piece, &mut next);
            }
            std::mem::swap(&mut pieces, &mut next);
            next.clear();
        }
        pieces.retain(|p| !p.is_empty());
        pieces
    }
}

fn split_one<'t>(re: &Regex, piece: &'t str, out: &mut Vec<&'t str>) {
    let mut last = 0;
    for m in re.find_iter(piece) {
        // The built-in patterns are simple enough that the backtracking limit is never hit;
        // if it were, the rest of the piece stays whole rather than being lost.
        let Ok(m) = m else { break };
        if m.start() > last {
            out.push(&piece[last..m.start()]);
        }
        if m.end() > m.start() {
            out.push(m.as_str());
        }
        last = m.end();
    }
    if last < piece.len() {
        out.push(&piece[last..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pre: &str, text: &str) -> Vec<String> {
        PreTokenizer::new(pre)
            .unwrap()
            .split(text)
            .into_iter()
            .map(String::from)
            .collect()
    }

    #[test]
    fn gpt2_keeps_one_space_for_the_next_word() {
        assert_eq!(
            split("gpt-2", "Hello   world's 42!!"),
            ["Hello", "  ", " world", "'s", " 42", "!!"]
        );
        assert_eq!(split("gpt-2", "a \n b  "), ["a", " \n", " b", "  "]);
    }

    #[test]
    fn smollm_splits_digits_one_by_one() {
        assert_eq!(split("smollm", "x 1234"), ["x", " ", "1", "2", "3", "4"]);
    }

    #[test]
    fn llama3_groups_digits_by_three() {
        assert_eq!(split("llama-bpe", "12345 I'M"), ["123", "45", " I", "'M"]);
    }

    #[test]
    fn gpt4o_splits_case_runs_and_keeps_contractions() {
        assert_eq!(
            split("gpt-4o", "HelloWorld CamelCase I'M 1234567"),
            ["Hello", "World", " Camel", "Case", " I'M", " ", "123", "456", "7"]
        );
        // Non-ASCII letters count as both cases (so an upper-case word whose first
        // letter is not ASCII loses it); combining marks are not letters.
        assert_eq!(split("gpt-4o", "ÉCOLE école"), ["É", "COLE", " école"]);
        assert_eq!(split("gpt-4o", "\u{928}\u{93f}x"), ["\u{928}", "\u{93f}x"]);
        assert_eq!(
            split("gpt-4o", "a/b\n\n  c"),
            ["a", "/b", "\n\n", " ", " c"]
        );
        // With marks inside words the same text stays whole.
        assert_eq!(
            split("granite-embed-multi-97m", "\u{928}\u{93f}x"),
            ["\u{928}\u{93f}x"]
        );
    }

    #[test]
    fn unknown_name_is_an_error_naming_it() {
        let err = PreTokenizer::new("no-such-pre").err().unwrap();
        assert!(err.to_string().contains("no-such-pre"), "{err}");
    }
}

//! Text → token ids → text, from the vocabulary stored in a GGUF file.
//!
//! Supported: byte-level BPE as GPT-2 defines it (`tokenizer.ggml.model = "gpt2"`), with
//! the pre-tokenizer named by `tokenizer.ggml.pre` (the list is in `pretokenize.rs`), and
//! SentencePiece BPE (`"llama"`, in `spm.rs`). The rest are refused with
//! [`TokenizerError::UnsupportedModel`].
//!
//! Behaviour follows llama.cpp's `llama-tokenize`, which the fixture test checks id for id:
//! - special tokens (control, user-defined, unknown) found literally in the text are cut
//!   out first, longest token text first, and the text between them is tokenized normally;
//!   with `parse_special = false` only user-defined tokens are cut out;
//! - a BPE symbol that is not a vocabulary entry falls back to one-byte tokens;
//! - decoding renders control and unknown tokens as nothing unless asked to;
//! - no clean-up of spaces before punctuation is done on decode, so decode(encode(x)) == x.
//!
//! Not here: chat formatting ([`crate::chat`]) and choosing the next token
//! ([`crate::sampler`]).

mod bpe;
mod byte_level;
mod pretokenize;
mod spm;
mod stream;

use std::collections::HashMap;

use thiserror::Error;

use crate::gguf::{GgufError, GgufFile};

pub use byte_level::byte_to_char;
use pretokenize::PreTokenizer;
pub use spm::SPACE as SPM_SPACE;
pub use stream::StreamDecoder;

/// Why a tokenizer could not be built; each message names the GGUF key at fault.
#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] Box<GgufError>),

    #[error("tokenizer.ggml.model '{0}' is not supported yet (Prima reads 'gpt2' byte-level BPE and 'llama' SentencePiece vocabularies)")]
    UnsupportedModel(String),

    #[error("tokenizer.ggml.model 'llama' (SentencePiece) needs tokenizer.ggml.scores, one per token: found {scores} for {tokens} tokens")]
    ScoreCount { scores: usize, tokens: usize },

    #[error("tokenizer.ggml.pre '{0}' is not a pre-tokenizer Prima knows")]
    UnknownPreTokenizer(String),

    #[error("{0} is missing")]
    MissingKey(&'static str),

    #[error("tokenizer.ggml.tokens is empty")]
    EmptyVocabulary,

    #[error(
        "tokenizer.ggml.token_type has {types} entries but tokenizer.ggml.tokens has {tokens}"
    )]
    TokenTypeCount { types: usize, tokens: usize },

    #[error("tokenizer.ggml.merges entry {index} '{entry}' has no space")]
    BadMerge { index: usize, entry: String },

    #[error("{key} = {id} is outside the vocabulary of {n_vocab} tokens")]
    SpecialIdOutOfRange {
        key: &'static str,
        id: u64,
        n_vocab: usize,
    },
}

impl From<GgufError> for TokenizerError {
    fn from(e: GgufError) -> Self {
        TokenizerError::Gguf(Box::new(e))
    }
}

/// `tokenizer.ggml.token_type` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
    /// A type number outside 1..=6; rendered as nothing, never matched in text.
    Undefined,
}

impl TokenKind {
    fn from_gguf(t: i32) -> TokenKind {
        match t {
            1 => TokenKind::Normal,
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            _ => TokenKind::Undefined,
        }
    }

    /// Cut out of the text before BPE (when `parse_special` allows it).
    fn is_special(self) -> bool {
        matches!(
            self,
            TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
        )
    }
}

/// Texts of tokens that end a turn or the text, whatever their declared type. llama.cpp
/// keeps a similar list because many converted models only declare `eos_token_id` while
/// their chat templates end turns with another marker.
const END_MARKERS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

/// gpt-oss's (harmony's) message markers, which llama.cpp types as user-defined whatever
/// the vocabulary says: they are part of the reply's text, not control tokens.
const HARMONY_MARKERS: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// Everything a tokenizer is built from, as plain data: the GGUF `tokenizer.*` keys.
#[derive(Debug, Clone, Default)]
pub struct TokenizerParts {
    /// `tokenizer.ggml.model`.
    pub model: String,
    /// `tokenizer.ggml.pre`; `None` means `default`.
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`; empty means every token is normal.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges` (BPE only).
    pub merges: Vec<String>,
    /// `tokenizer.ggml.scores` (SentencePiece only).
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece); `None` means true.
    pub add_space_prefix: Option<bool>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unknown: Option<u32>,
    pub padding: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`; `None` uses the pre-tokenizer's usual choice.
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub chat_template: Option<String>,
}

impl TokenizerParts {
    /// Reads the `tokenizer.*` keys of a GGUF file, refusing vocabularies other than
    /// `gpt2` and `llama` early (before copying the token list).
    pub fn from_gguf(g: &GgufFile) -> Result<TokenizerParts, TokenizerError> {
        // An id too large for u32 is saturated so that from_parts reports it against
        // the vocabulary size.
        let id = |key: &'static str| -> Result<Option<u32>, TokenizerError> {
            Ok(g.get_u64(key)?
                .map(|v| u32::try_from(v).unwrap_or(u32::MAX)))
        };
        let strings = |key: &'static str| -> Result<Option<Vec<String>>, TokenizerError> {
            Ok(g.get_str_array(key)?
                .map(|v| v.into_iter().map(String::from).collect()))
        };
        let model = g.require_str("tokenizer.ggml.model")?.to_string();
        let spm = match model.as_str() {
            "gpt2" => false,
            "llama" => true,
            _ => return Err(TokenizerError::UnsupportedModel(model)),
        };
        Ok(TokenizerParts {
            model,
            pre: g.get_str("tokenizer.ggml.pre")?.map(String::from),
            tokens: strings("tokenizer.ggml.tokens")?
                .ok_or(TokenizerError::MissingKey("tokenizer.ggml.tokens"))?,
            token_types: g
                .get_i32_array("tokenizer.ggml.token_type")?
                .unwrap_or_default(),
            merges: match strings("tokenizer.ggml.merges")? {
                Some(merges) => merges,
                None if spm => Vec::new(),
                None => return Err(TokenizerError::MissingKey("tokenizer.ggml.merges")),
            },
            scores: g
                .get_f32_array("tokenizer.ggml.scores")?
                .unwrap_or_default(),
            add_space_prefix: g.get_bool("tokenizer.ggml.add_space_prefix")?,
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            eot: id("tokenizer.ggml.eot_token_id")?,
            eom: id("tokenizer.ggml.eom_token_id")?,
            unknown: id("tokenizer.ggml.unknown_token_id")?,
            padding: id("tokenizer.ggml.padding_token_id")?,
            add_bos: g.get_bool("tokenizer.ggml.add_bos_token")?,
            add_eos: g.get_bool("tokenizer.ggml.add_eos_token")?,
            chat_template: g.get_str("tokenizer.chat_template")?.map(String::from),
        })
    }
}

/// How plain text (between special tokens) becomes ids.
enum Encoder {
    /// Byte-level BPE: pre-tokenizer splits, then merges by rank.
    Bpe {
        merges: bpe::Merges,
        pre: PreTokenizer,
    },
    /// SentencePiece: merges by score over the whole fragment.
    Spm {
        spm: spm::Spm,
        add_space_prefix: bool,
    },
}

/// A byte-level BPE or SentencePiece tokenizer.
pub struct Tokenizer {
    tokens: Vec<String>,
    kinds: Vec<TokenKind>,
    /// Bytes each token decodes to when special tokens are not rendered.
    pieces: Vec<Box<[u8]>>,
    ids: HashMap<String, u32>,
    encoder: Encoder,
    /// Control, user-defined and unknown tokens, longest text first.
    specials: Vec<u32>,
    is_eog: Vec<bool>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    chat_template: Option<String>,
}

impl Tokenizer {
    /// Reads the `tokenizer.*` keys of a GGUF file.
    pub fn from_gguf(g: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_parts(TokenizerParts::from_gguf(g)?)
    }

    /// Builds a tokenizer from plain data (what [`Tokenizer::from_gguf`] reads).
    pub fn from_parts(p: TokenizerParts) -> Result<Tokenizer, TokenizerError> {
        let is_spm = match p.model.as_str() {
            "gpt2" => false,
            "llama" => true,
            _ => return Err(TokenizerError::UnsupportedModel(p.model)),
        };
        let n_vocab = p.tokens.len();
        if n_vocab == 0 {
            return Err(TokenizerError::EmptyVocabulary);
        }
        if !p.token_types.is_empty() && p.token_types.len() != n_vocab {
            return Err(TokenizerError::TokenTypeCount {
                types: p.token_types.len(),
                tokens: n_vocab,
            });
        }
        if is_spm && p.scores.len() != n_vocab {
            return Err(TokenizerError::ScoreCount {
                scores: p.scores.len(),
                tokens: n_vocab,
            });
        }
        let pre_name = p.pre.as_deref().unwrap_or("default");

        let check = |key: &'static str, id: Option<u32>| -> Result<Option<u32>, TokenizerError> {
            match id {
                Some(i) if i as usize >= n_vocab => Err(TokenizerError::SpecialIdOutOfRange {
                    key,
                    id: i as u64,
                    n_vocab,
                }),
                other => Ok(other),
            }
        };
        let bos = check("tokenizer.ggml.bos_token_id", p.bos)?;
        let eos = check("tokenizer.ggml.eos_token_id", p.eos)?;
        let eot = check("tokenizer.ggml.eot_token_id", p.eot)?;
        let eom = check("tokenizer.ggml.eom_token_id", p.eom)?;
        // Padding and unknown ids are only informative here; a bad one is not fatal.
        let _ = (p.unknown, p.padding);

        let mut kinds: Vec<TokenKind> = if p.token_types.is_empty() {
            vec![TokenKind::Normal; n_vocab]
        } else {
            p.token_types
                .iter()
                .map(|&t| TokenKind::from_gguf(t))
                .collect()
        };

        let mut ids = HashMap::with_capacity(n_vocab);
        for (i, t) in p.tokens.iter().enumerate() {
            // On duplicate texts the later id wins, as in llama.cpp's token_to_id map.
            ids.insert(t.clone(), i as u32);
        }

        let mut is_eog = vec![false; n_vocab];
        for id in [eos, eot, eom].into_iter().flatten() {
            is_eog[id as usize] = true;
        }
        for marker in END_MARKERS {
            if let Some(&id) = ids.get(*marker) {
                is_eog[id as usize] = true;
                // An end marker typed as normal text is a conversion bug; treat it as control.
                kinds[id as usize] = TokenKind::Control;
            }
        }
        // gpt-oss's harmony markers are always rendered and always found in text (even
        // without parse_special), as llama.cpp treats them, so that a reply's channels
        // can be read from its text.
        for marker in HARMONY_MARKERS {
            if let Some(&id) = ids.get(*marker) {
                kinds[id as usize] = TokenKind::UserDefined;
            }
        }
        // gpt-oss ends a message with <|end|> but keeps generating (an analysis message
        // is followed by the final one): with <|return|> and <|call|> present, the
        // assistant's turn ends at those two and <|end|> is not an end of generation.
        if let (Some(_), Some(_), Some(&end)) = (
            ids.get("<|return|>"),
            ids.get("<|call|>"),
            ids.get("<|end|>"),
        ) {
            if Some(end) != eos {
                is_eog[end as usize] = false;
                kinds[end as usize] = TokenKind::UserDefined;
            }
        }

        let encoder = if is_spm {
            // SentencePiece vocabularies have no pre-tokenizer; `tokenizer.ggml.pre` is
            // ignored, as llama.cpp does.
            Encoder::Spm {
                spm: spm::Spm::new(p.scores, &ids),
                add_space_prefix: p.add_space_prefix.unwrap_or(true),
            }
        } else {
            let pre = PreTokenizer::new(pre_name)?;
            let merge_lines: Vec<&str> = p.merges.iter().map(String::as_str).collect();
            Encoder::Bpe {
                merges: bpe::Merges::new(&merge_lines, n_vocab, &ids)?,
                pre,
            }
        };

        let mut specials: Vec<u32> = (0..n_vocab as u32)
            .filter(|&i| kinds[i as usize].is_special() && !p.tokens[i as usize].is_empty())
            .collect();
        specials.sort_by_key(|&i| std::cmp::Reverse(p.tokens[i as usize].len()));

        let pieces = p
            .tokens
            .iter()
            .zip(&kinds)
            .map(|(text, kind)| render(text, *kind, is_spm).into_boxed_slice())
            .collect();

        let add_bos = p.add_bos.unwrap_or(
            is_spm || matches!(pre_name, "llama-bpe" | "llama3" | "llama-v3" | "falcon3"),
        );
        Ok(Tokenizer {
            tokens: p.tokens,
            kinds,
            pieces,
            ids,
            encoder,
            specials,
            is_eog,
            bos,
            eos,
            add_bos,
            add_eos: p.add_eos.unwrap_or(false),
            chat_template: p.chat_template,
        })
    }

    /// Token ids for `text`. `add_bos` prepends the BOS token if the model has one; pass
    /// [`Tokenizer::add_bos_default`] unless you know better. With `parse_special`,
    /// control tokens written out in the text (`<|im_start|>`) become those tokens.
    /// EOS is never appended (see [`Tokenizer::add_eos_default`]).
    pub fn encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::new();
        if add_bos {
            out.extend(self.bos);
        }
        // SentencePiece prefixes a space to text at the start or after a special token.
        let mut after_special = true;
        for fragment in self.partition(text, parse_special) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(s) => {
                    match &self.encoder {
                        Encoder::Bpe { merges, pre } => self.encode_bpe(s, merges, pre, &mut out),
                        Encoder::Spm {
                            spm,
                            add_space_prefix,
                        } => spm.encode(s, *add_space_prefix && after_special, &self.ids, &mut out),
                    }
                    after_special = false;
                }
            }
        }
        out
    }

    /// Splits `text` around special tokens written out in it, the longest token text
    /// first (so `<|im_start|>` wins over a shorter token it contains).
    fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut frags = vec![Fragment::Text(text)];
        let mut next = Vec::new();
        for &id in &self.specials {
            let kind = self.kinds[id as usize];
            if !parse_special && kind != TokenKind::UserDefined {
                continue;
            }
            let needle = self.tokens[id as usize].as_str();
            for frag in frags.drain(..) {
                let Fragment::Text(s) = frag else {
                    next.push(frag);
                    continue;
                };
                let mut last = 0;
                for (at, _) in s.match_indices(needle) {
                    if at > last {
                        next.push(Fragment::Text(&s[last..at]));
                    }
                    next.push(Fragment::Token(id));
                    last = at + needle.len();
                }
                if last < s.len() {
                    next.push(Fragment::Text(&s[last..]));
                }
            }
            std::mem::swap(&mut frags, &mut next);
        }
        frags
    }

    /// BPE over plain text (no special tokens in it).
    fn encode_bpe(&self, text: &str, merges: &bpe::Merges, pre: &PreTokenizer, out: &mut Vec<u32>) {
        let mut word = String::new();
        let mut symbols = Vec::new();
        for piece in pre.split(text) {
            word.clear();
            byte_level::encode_into(piece.as_bytes(), &mut word);
            if pre.ignore_merges() {
                if let Some(&id) = self.ids.get(word.as_str()) {
                    out.push(id);
                    continue;
                }
            }
            symbols.clear();
            let symbol_id = |c: &str| self.ids.get(c).copied().or_else(|| merges.extra_id(c));
            bpe::merge_word(&word, merges, symbol_id, &mut symbols);
            for (id, range) in symbols.drain(..) {
                match id {
                    Some(id) if (id as usize) < self.tokens.len() => out.push(id),
                    // A symbol the vocabulary lacks: llama.cpp falls back to looking up
                    // each byte of its text as a one-character token.
                    _ => {
                        for &b in word[range].as_bytes() {
                            if b.is_ascii() {
                                if let Some(&id) =
                                    self.ids.get((b as char).encode_utf8(&mut [0; 4]) as &str)
                                {
                                    out.push(id);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Whether the model asks for BOS at the start of a prompt (`tokenizer.ggml.add_bos_token`).
    pub fn add_bos_default(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    /// Whether the model asks for EOS at the end of an input (`tokenizer.ggml.add_eos_token`);
    /// [`Tokenizer::encode`] leaves that to the caller, since generation never wants it.
    pub fn add_eos_default(&self) -> bool {
        self.add_eos && self.eos.is_some()
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// True for EOS, EOT, EOM and the usual end-of-turn markers (`<|im_end|>`,
    /// `<|eot_id|>`, `<end_of_turn>`, …; the list is `END_MARKERS`) the vocabulary has.
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.is_eog.get(id as usize).copied().unwrap_or(false)
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The token as stored in the vocabulary (byte-level text, e.g. `Ġhello`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The token's type as declared (end markers are reported as control).
    pub fn token_kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    /// The bytes a token stands for. Control, unknown and media-marker tokens are empty
    /// unless `render_special`; unknown ids are empty.
    pub fn token_bytes(&self, id: u32, render_special: bool) -> Vec<u8> {
        self.piece(id, render_special).to_vec()
    }

    fn piece(&self, id: u32, render_special: bool) -> &[u8] {
        let i = id as usize;
        match self.kinds.get(i) {
            None => &[],
            Some(TokenKind::Control | TokenKind::Unknown | TokenKind::UserDefined)
                if render_special =>
            {
                self.tokens[i].as_bytes()
            }
            Some(_) => &self.pieces[i],
        }
    }

    /// Text of `ids`, special tokens not rendered; invalid UTF-8 (only possible when the
    /// ids cut a character in half) becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_with(ids, false)
    }

    /// [`Tokenizer::decode`], optionally rendering control tokens as their text.
    pub fn decode_with(&self, ids: &[u32], render_special: bool) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.piece(id, render_special));
        }
        match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    /// A decoder for generated tokens that only ever yields whole characters.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self, false)
    }

    /// `tokenizer.chat_template`, if the model has one (or the one set in its place).
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Uses `template` as the chat template (a built-in one for a file that has none,
    /// or one the user gives).
    pub fn set_chat_template(&mut self, template: String) {
        self.chat_template = Some(template);
    }

    /// The BOS token's text for chat templates, or "" if the model has none.
    pub fn bos_text(&self) -> &str {
        self.bos.and_then(|id| self.token_text(id)).unwrap_or("")
    }

    /// The EOS token's text for chat templates, or "" if the model has none.
    pub fn eos_text(&self) -> &str {
        self.eos.and_then(|id| self.token_text(id)).unwrap_or("")
    }
}

enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// The bytes a token of `kind` with vocabulary text `text` decodes to when special
/// tokens are not rendered.
fn render(text: &str, kind: TokenKind, spm: bool) -> Vec<u8> {
    match kind {
        // SentencePiece: `▁` is a space, `<0xXX>` one byte.
        TokenKind::Normal if spm => text.replace(spm::SPACE, " ").into_bytes(),
        TokenKind::Byte if spm => spm::byte_token_value(text)
            .map(|b| vec![b])
            .unwrap_or_default(),
        TokenKind::Normal | TokenKind::Byte => {
            let mut out = Vec::with_capacity(text.len());
            byte_level::decode_into(text, &mut out);
            out
        }
        // A media marker is special in all but its type: hidden like a control token.
        TokenKind::UserDefined if is_media_marker(text) => Vec::new(),
        // User-defined tokens are stored as plain text, not byte-level text.
        TokenKind::UserDefined => text.as_bytes().to_vec(),
        _ => Vec::new(),
    }
}

/// A user-defined token that stands for media (`<start_of_image>`, `<end_of_image>`,
/// `[multimodal]`): Prima runs text alone, so such a token is never text. Other
/// user-defined tokens are (HTML tags, `<think>`, `<tool_call>`, harmony's markers).
fn is_media_marker(text: &str) -> bool {
    let inner = text
        .strip_prefix('<')
        .and_then(|t| t.strip_suffix('>'))
        .or_else(|| text.strip_prefix('[').and_then(|t| t.strip_suffix(']')));
    inner.is_some_and(|name| {
        name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
            && ["image", "audio", "video", "vision", "multimodal"]
                .iter()
                .any(|m| name.contains(m))
    })
}

#[cfg(test)]
mod tests;

/// `<|endoftext|>` (id 0, BOS and EOS) then the letters a–z, one token each: the toy
/// vocabulary of the scheduler's, the server's and speculative decoding's unit tests
/// (in this crate and in `prima-server`).
#[doc(hidden)]
pub fn letters() -> Tokenizer {
    let mut tokens = vec!["<|endoftext|>".to_string()];
    tokens.extend(('a'..='z').map(String::from));
    let mut token_types = vec![1; tokens.len()];
    token_types[0] = 3;
    Tokenizer::from_parts(TokenizerParts {
        model: "gpt2".into(),
        pre: Some("gpt-2".into()),
        tokens,
        token_types,
        bos: Some(0),
        eos: Some(0),
        add_bos: Some(false),
        ..Default::default()
    })
    .unwrap()
}

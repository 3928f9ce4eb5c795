//! Turning generated tokens into text as they arrive.
//!
//! A byte-level token can end in the middle of a UTF-8 character (emoji and CJK often
//! span two or three tokens), so the decoder holds back an incomplete tail until the
//! token that completes it arrives. Bytes that can never become valid UTF-8 are
//! emitted as U+FFFD at once rather than held forever.

use super::Tokenizer;

/// Incremental decoder from [`Tokenizer::stream_decoder`].
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    pending: Vec<u8>,
    render_special: bool,
}

impl<'t> StreamDecoder<'t> {
    pub(super) fn new(tokenizer: &'t Tokenizer, render_special: bool) -> Self {
        StreamDecoder {
            tokenizer,
            pending: Vec::new(),
            render_special,
        }
    }

    /// Renders control tokens (`<|im_end|>`) as their text instead of nothing.
    pub fn render_special(mut self, yes: bool) -> Self {
        self.render_special = yes;
        self
    }

    /// Adds one token; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        self.pending
            .extend_from_slice(self.tokenizer.piece(id, self.render_special));
        self.take_complete()
    }

    /// Everything still held back, with an incomplete character as U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(valid).expect("checked by from_utf8"));
                    match e.error_len() {
                        // Truncated character at the end: wait for more bytes.
                        None => {
                            rest = after;
                            break;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[bad..];
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let len = self.pending.len();
        self.pending.drain(..len - keep);
        out
    }
}

//! gpt-oss's harmony replies, read into OpenAI's fields: the `analysis` channel becomes
//! `reasoning_content`, the `final` (and a bare `commentary`) channel `content`, and a
//! message to `functions.NAME` a tool call. The text arrives in pieces as the model writes
//! it; [`ReplyReader`] turns each piece into [`Delta`]s at once, holding back only what may
//! still be the beginning of a marker, so a client never sees one.
//!
//! A reply continues the prompt's `<|start|>assistant`:
//!
//! ```text
//! <|channel|>analysis<|message|>…thinking…<|end|><|start|>assistant<|channel|>final<|message|>…answer…
//! <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}
//! ```
//!
//! (`<|return|>` and `<|call|>` end the turn; they are control tokens, never text.) Text
//! that does not follow the format is content, as it is. Not here: the markers as tokens
//! (`prima_core::tokenizer`), the template that writes the prompt (`prima_core::chat`).

use prima_core::tokenizer::Tokenizer;

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const END: &str = "<|end|>";
/// What a message's body ends at: `<|end|>`, or a new message begun without one. The two
/// control tokens are never rendered, but text may spell them.
const BODY_ENDS: &[&str] = &[END, START, "<|return|>", "<|call|>"];
/// What a message's header may begin with (after white space): a new message, its channel,
/// or a recipient before the channel (`<|start|>assistant to=functions.x<|channel|>…`).
const HEADER_STARTS: &[&str] = &[START, CHANNEL, "to="];
/// A header longer than this is not one: the text is read as plain content.
const MAX_HEADER: usize = 256;

/// How the chat replies of a model are read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ReplyFormat {
    /// The text is the content.
    #[default]
    Plain,
    /// gpt-oss's harmony channels.
    Harmony,
}

impl ReplyFormat {
    /// Harmony when the model's chat template writes `<|channel|>` markers (llama.cpp's
    /// test for the GPT-OSS format) and the vocabulary has them as tokens.
    pub fn of(tokenizer: &Tokenizer) -> ReplyFormat {
        let template_writes_channels = tokenizer
            .chat_template()
            .is_some_and(|t| t.contains(CHANNEL));
        let vocab_has_markers = [CHANNEL, MESSAGE]
            .iter()
            .all(|m| tokenizer.encode(m, false, false).len() == 1);
        if template_writes_channels && vocab_has_markers {
            ReplyFormat::Harmony
        } else {
            ReplyFormat::Plain
        }
    }
}

/// A function call the model made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// Its position among the reply's calls, from 0.
    pub index: usize,
    /// The function (`NAME` of `to=functions.NAME`).
    pub name: String,
    /// The message body: the arguments' JSON, as the model wrote it.
    pub arguments: String,
}

/// The next part of a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    Reasoning(String),
    Content(String),
    /// A whole call, sent once its message has ended.
    ToolCall(ToolCall),
}

/// A whole reply, the deltas added up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reply {
    pub reasoning: String,
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
}

impl Reply {
    pub fn add(&mut self, delta: Delta) {
        match delta {
            Delta::Reasoning(t) => self.reasoning.push_str(&t),
            Delta::Content(t) => self.content.push_str(&t),
            Delta::ToolCall(c) => self.tool_calls.push(c),
        }
    }

    /// The reply of `text`, read whole.
    pub fn read(format: ReplyFormat, text: &str) -> Reply {
        let mut reader = ReplyReader::new(format);
        let mut reply = Reply::default();
        for d in reader.push(text).into_iter().chain(reader.finish()) {
            reply.add(d);
        }
        reply
    }
}

/// Reads one reply piece by piece.
#[derive(Debug)]
pub enum ReplyReader {
    Plain,
    Harmony(HarmonyParser),
}

impl ReplyReader {
    pub fn new(format: ReplyFormat) -> ReplyReader {
        match format {
            ReplyFormat::Plain => ReplyReader::Plain,
            ReplyFormat::Harmony => ReplyReader::Harmony(HarmonyParser::default()),
        }
    }

    /// The deltas `piece` completes (none while it may still be part of a marker).
    pub fn push(&mut self, piece: &str) -> Vec<Delta> {
        match self {
            ReplyReader::Plain if piece.is_empty() => Vec::new(),
            ReplyReader::Plain => vec![Delta::Content(piece.to_string())],
            ReplyReader::Harmony(p) => p.push(piece),
        }
    }

    /// The end of the reply (whatever stopped it): what was held back.
    pub fn finish(&mut self) -> Vec<Delta> {
        match self {
            ReplyReader::Plain => Vec::new(),
            ReplyReader::Harmony(p) => p.finish(),
        }
    }
}

/// The harmony reader: where in a message it stands, and the text not yet placed.
#[derive(Debug, Default)]
pub struct HarmonyParser {
    state: State,
    /// Text received and not yet sent: a header so far, or a body's tail that may begin
    /// a marker.
    pending: String,
    tool_calls: usize,
}

#[derive(Debug, Default)]
enum State {
    /// Between messages (and at the start): white space, then a header, or else plain text.
    #[default]
    Between,
    /// In a message's header, up to its `<|message|>`.
    Header,
    /// In a message's body.
    Body(Body),
    /// Text that does not follow harmony: everything from here is content.
    Plain,
}

#[derive(Debug)]
enum Body {
    Reasoning,
    Content,
    Tool {
        name: String,
        arguments: String,
    },
    /// A message to another recipient (a built-in tool): not part of the reply.
    Ignored,
}

impl HarmonyParser {
    fn push(&mut self, piece: &str) -> Vec<Delta> {
        self.pending.push_str(piece);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        out
    }

    /// Moves the state on as far as the pending text decides; false once it needs more.
    fn step(&mut self, out: &mut Vec<Delta>) -> bool {
        match &mut self.state {
            State::Plain => {
                if !self.pending.is_empty() {
                    out.push(Delta::Content(std::mem::take(&mut self.pending)));
                }
                false
            }
            State::Between => {
                let text = self.pending.trim_start();
                if text.is_empty() || HEADER_STARTS.iter().any(|m| m.starts_with(text)) {
                    return false;
                }
                self.state = if HEADER_STARTS.iter().any(|m| text.starts_with(m)) {
                    let ws = self.pending.len() - text.len();
                    self.pending.drain(..ws);
                    State::Header
                } else {
                    State::Plain
                };
                true
            }
            State::Header => match self.pending.find(MESSAGE) {
                Some(at) if at <= MAX_HEADER => {
                    let body = body_of(&self.pending[..at]);
                    self.pending.drain(..at + MESSAGE.len());
                    self.state = State::Body(body);
                    true
                }
                Some(_) => {
                    self.state = State::Plain;
                    true
                }
                None if self.pending.len() >= MAX_HEADER + MESSAGE.len() => {
                    self.state = State::Plain;
                    true
                }
                None => false,
            },
            State::Body(body) => {
                let end = BODY_ENDS
                    .iter()
                    .filter_map(|m| self.pending.find(m).map(|at| (at, *m)))
                    .min();
                let Some((at, marker)) = end else {
                    let keep = marker_prefix_len(&self.pending, BODY_ENDS);
                    let text: String = self.pending.drain(..self.pending.len() - keep).collect();
                    body.take(text, out);
                    return false;
                };
                let text = self.pending[..at].to_string();
                body.take(text, out);
                let body = std::mem::replace(&mut self.state, State::Between);
                if let State::Body(body) = body {
                    self.end_message(body, out);
                }
                // `<|start|>` begins the next header; the others are dropped.
                let cut = if marker == START {
                    at
                } else {
                    at + marker.len()
                };
                self.pending.drain(..cut);
                true
            }
        }
    }

    /// The end of the reply: a body's held-back tail is its text; a header never finished
    /// is dropped; text that never became a header is content.
    fn finish(&mut self) -> Vec<Delta> {
        let mut out = Vec::new();
        let text = std::mem::take(&mut self.pending);
        match std::mem::take(&mut self.state) {
            State::Body(mut body) => {
                body.take(text, &mut out);
                self.end_message(body, &mut out);
            }
            State::Between | State::Plain if !text.trim().is_empty() => {
                out.push(Delta::Content(text))
            }
            State::Between | State::Plain | State::Header => {}
        }
        out
    }

    fn end_message(&mut self, body: Body, out: &mut Vec<Delta>) {
        if let Body::Tool { name, arguments } = body {
            out.push(Delta::ToolCall(ToolCall {
                index: self.tool_calls,
                name,
                arguments: arguments.trim().to_string(),
            }));
            self.tool_calls += 1;
        }
    }
}

impl Body {
    fn take(&mut self, text: String, out: &mut Vec<Delta>) {
        if text.is_empty() {
            return;
        }
        match self {
            Body::Reasoning => out.push(Delta::Reasoning(text)),
            Body::Content => out.push(Delta::Content(text)),
            Body::Tool { arguments, .. } => arguments.push_str(&text),
            Body::Ignored => {}
        }
    }
}

/// What a message with this header (the text before `<|message|>`) holds.
fn body_of(header: &str) -> Body {
    let channel = header
        .rfind(CHANNEL)
        .map(|at| word(&header[at + CHANNEL.len()..]));
    let recipient = header
        .match_indices("to=")
        .find(|(at, _)| {
            header[..*at]
                .chars()
                .next_back()
                .is_none_or(|c| c.is_whitespace() || c == '>')
        })
        .map(|(at, _)| word(&header[at + 3..]));
    match (recipient, channel) {
        (Some(r), _) if r.starts_with("functions.") => Body::Tool {
            name: r["functions.".len()..].to_string(),
            arguments: String::new(),
        },
        (Some(r), _) if r != "assistant" => Body::Ignored,
        (_, Some("analysis")) => Body::Reasoning,
        _ => Body::Content,
    }
}

/// The text up to white space or a marker.
fn word(s: &str) -> &str {
    let end = s
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(s.len());
    &s[..end]
}

/// The length of the longest tail of `text` that some marker begins with (and does not
/// equal): text that must wait for the next piece.
fn marker_prefix_len(text: &str, markers: &[&str]) -> usize {
    // Every marker begins with '<': only a tail from the last few '<' can be one.
    text.char_indices()
        .rev()
        .take_while(|(i, _)| text.len() - i < 16)
        .filter(|(_, c)| *c == '<')
        .map(|(i, _)| &text[i..])
        .filter(|tail| {
            markers
                .iter()
                .any(|m| m.len() > tail.len() && m.starts_with(tail))
        })
        .map(str::len)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;

//! Chat prompts: rendering a model's Jinja chat template (`tokenizer.chat_template`).
//!
//! Templates are written for Hugging Face's Python Jinja; the environment here matches
//! it where it matters: `trim_blocks` and `lstrip_blocks` on, Python string methods
//! (`.strip()`, `.startswith()`, …) through minijinja-contrib's pycompat, the globals
//! `raise_exception(msg)` and `strftime_now(fmt)`, and `tojson` as `json.dumps` writes
//! (`json.rs`).
//!
//! Tool use reaches the template as llama.cpp's server passes it: the request's `tools`
//! as the variable `tools` (undefined without them), an assistant message's `tool_calls`
//! (`arguments` as a JSON object), a tool message's `tool_call_id` and `name`, and the
//! reasoning of an earlier turn as both `reasoning_content` and `thinking` (gpt-oss's
//! template reads the latter). A message has only the fields it was given, so a
//! template's `is defined` and `in message` tests see what the client sent.
//!
//! `builtin.rs` holds templates for files that carry none.
//!
//! Not here: tokenizing the result (`crate::tokenizer`), parsing a reply's tool calls
//! (the server's), multimodal content.

mod builtin;
mod json;

pub use builtin::{builtin_for_architecture, builtin_template, BUILTIN_TEMPLATES};
pub use json::TemplateJson;

use minijinja::{context, Environment, Error, ErrorKind, Value};
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use thiserror::Error as ThisError;

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ChatMessage {
    /// "system", "user", "assistant", "tool", …
    pub role: String,
    pub content: String,
    /// An assistant turn's reasoning (`reasoning_content`, or `thinking` as gpt-oss's
    /// template names it).
    #[serde(default, alias = "thinking")]
    pub reasoning_content: Option<String>,
    /// The calls an assistant turn made.
    #[serde(default)]
    pub tool_calls: Vec<ChatToolCall>,
    /// Which call a tool message answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// A tool message's function name.
    #[serde(default)]
    pub name: Option<String>,
}

/// An assistant's call of a function, in OpenAI's shape
/// (`{"id", "type": "function", "function": {"name", "arguments"}}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Always "function".
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: ChatFunctionCall,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatFunctionCall {
    pub name: String,
    /// The arguments as JSON (an object, as the templates that read them expect).
    pub arguments: TemplateJson,
}

fn function_type() -> String {
    "function".into()
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            reasoning_content: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
}

/// Only the fields a message has, so that templates' `is defined` tests hold.
impl Serialize for ChatMessage {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("role", &self.role)?;
        m.serialize_entry("content", &self.content)?;
        if let Some(r) = &self.reasoning_content {
            m.serialize_entry("reasoning_content", r)?;
            m.serialize_entry("thinking", r)?;
        }
        if !self.tool_calls.is_empty() {
            m.serialize_entry("tool_calls", &self.tool_calls)?;
        }
        if let Some(id) = &self.tool_call_id {
            m.serialize_entry("tool_call_id", id)?;
        }
        if let Some(name) = &self.name {
            m.serialize_entry("name", name)?;
        }
        m.end()
    }
}

#[derive(Debug, ThisError)]
pub enum ChatError {
    #[error("tokenizer.chat_template does not parse: {0:#}")]
    Syntax(#[source] Error),
    #[error("tokenizer.chat_template failed to render: {0:#}")]
    Render(#[source] Error),
}

/// Renders `template` for `messages`. `add_generation_prompt` appends the opening of
/// the assistant's turn; `tools` is the request's list of tools (OpenAI's shape), if it
/// has one; `bos` and `eos` are the model's token texts.
pub fn render_chat(
    template: &str,
    messages: &[ChatMessage],
    tools: Option<&TemplateJson>,
    add_generation_prompt: bool,
    bos: &str,
    eos: &str,
) -> Result<String, ChatError> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
    env.add_filter("tojson", json::tojson);
    env.add_template("chat", template)
        .map_err(ChatError::Syntax)?;
    let tmpl = env.get_template("chat").map_err(ChatError::Render)?;
    tmpl.render(context! {
        messages => messages,
        tools => tools.map_or(Value::UNDEFINED, |t| t.value().clone()),
        add_generation_prompt => add_generation_prompt,
        bos_token => bos,
        eos_token => eos,
    })
    .map_err(ChatError::Render)
}

/// The current UTC time formatted with the common strftime fields
/// (`%Y %m %d %H %M %S %B %b %A %a %e %j %%`); others are copied through.
fn strftime_now(fmt: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    format_time(secs, fmt)
}

fn format_time(unix_secs: i64, fmt: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = unix_secs.div_euclid(86_400);
    let tod = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[m as usize - 1] + d + i64::from(leap && m > 2);
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let month = MONTHS[m as usize - 1];

    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('H') => out.push_str(&format!("{:02}", tod / 3600)),
            Some('M') => out.push_str(&format!("{:02}", tod / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", tod % 60)),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests;

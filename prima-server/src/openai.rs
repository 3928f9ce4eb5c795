//! The OpenAI wire format: request bodies in (checked field by field, so an error names
//! the parameter), response and chunk bodies out. Fields Prima does not know are ignored,
//! as OpenAI clients send many.

use serde_json::{json, Map, Value};

use crate::harmony::{Delta, Reply, ToolCall};
use crate::job::{Completion, FinishReason, GenerationRequest, Prompt, Usage};
use prima_core::chat::{ChatFunctionCall, ChatMessage, ChatToolCall, TemplateJson};
use prima_core::sampler::SamplerConfig;

/// An invalid request: HTTP 400 with an OpenAI error body.
#[derive(Debug)]
pub(crate) struct BadRequest {
    pub message: String,
    pub param: Option<&'static str>,
}

impl BadRequest {
    fn new(param: &'static str, message: impl Into<String>) -> BadRequest {
        BadRequest {
            message: message.into(),
            param: Some(param),
        }
    }
}

/// Which API a request came through; it decides the shape of the replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Text,
}

impl Api {
    pub(crate) fn endpoint(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Text => "/v1/completions",
        }
    }

    fn id_prefix(self) -> &'static str {
        match self {
            Api::Chat => "chatcmpl",
            Api::Text => "cmpl",
        }
    }
}

/// A parsed request: what to generate and how to answer.
#[derive(Debug)]
pub(crate) struct ParsedRequest {
    pub generation: GenerationRequest,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage and no choices.
    pub include_usage: bool,
}

/// Parses the body of a `/v1/chat/completions` or `/v1/completions` request.
pub(crate) fn parse_request(api: Api, body: &[u8]) -> Result<ParsedRequest, BadRequest> {
    let value: Value = serde_json::from_slice(body).map_err(|e| BadRequest {
        message: format!("the request body is not valid JSON: {e}"),
        param: None,
    })?;
    let Value::Object(obj) = value else {
        return Err(BadRequest {
            message: "the request body must be a JSON object".into(),
            param: None,
        });
    };
    let prompt = match api {
        Api::Chat => Prompt::Chat {
            messages: messages(&obj)?,
            tools: tools(&obj, body)?,
        },
        Api::Text => Prompt::Text(text_prompt(&obj)?),
    };
    if let Some(n) = opt_u64(&obj, "n")? {
        if n != 1 {
            return Err(BadRequest::new("n", "only n = 1 is supported"));
        }
    }
    let max_tokens = match opt_u64(&obj, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => opt_u64(&obj, "max_tokens")?,
    };
    if max_tokens == Some(0) {
        return Err(BadRequest::new(
            "max_tokens",
            "max_tokens must be at least 1",
        ));
    }
    let defaults = SamplerConfig::default();
    let sampler = SamplerConfig {
        temperature: opt_f32_in(&obj, "temperature", 0.0, 2.0)?.unwrap_or(defaults.temperature),
        top_p: opt_f32_in(&obj, "top_p", 0.0, 1.0)?.unwrap_or(defaults.top_p),
        top_k: opt_u64(&obj, "top_k")?.map_or(defaults.top_k, |k| k as usize),
        min_p: opt_f32_in(&obj, "min_p", 0.0, 1.0)?.unwrap_or(defaults.min_p),
        presence_penalty: opt_f32_in(&obj, "presence_penalty", -2.0, 2.0)?
            .unwrap_or(defaults.presence_penalty),
        frequency_penalty: opt_f32_in(&obj, "frequency_penalty", -2.0, 2.0)?
            .unwrap_or(defaults.frequency_penalty),
        repeat_penalty: opt_f32_in(&obj, "repeat_penalty", 0.0, 10.0)?
            .unwrap_or(defaults.repeat_penalty),
        repeat_last_n: defaults.repeat_last_n,
        seed: seed(&obj)?,
    };
    let stream = opt_bool(&obj, "stream")?.unwrap_or(false);
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => opt_bool(o, "include_usage")?.unwrap_or(false),
        Some(_) => {
            return Err(BadRequest::new(
                "stream_options",
                "stream_options must be an object",
            ))
        }
    };
    Ok(ParsedRequest {
        generation: GenerationRequest {
            prompt,
            max_tokens: max_tokens.map(|n| n.min(usize::MAX as u64) as usize),
            sampler,
            stop: stop_strings(&obj)?,
            ignore_eos: opt_bool(&obj, "ignore_eos")?.unwrap_or(false),
        },
        stream,
        include_usage,
    })
}

fn messages(obj: &Map<String, Value>) -> Result<Vec<ChatMessage>, BadRequest> {
    let Some(value) = obj.get("messages") else {
        return Err(BadRequest::new(
            "messages",
            "missing required parameter: messages",
        ));
    };
    let Value::Array(items) = value else {
        return Err(BadRequest::new("messages", "messages must be an array"));
    };
    if items.is_empty() {
        return Err(BadRequest::new("messages", "messages must not be empty"));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let Value::Object(m) = m else {
                return Err(BadRequest::new(
                    "messages",
                    format!("messages[{i}] must be an object"),
                ));
            };
            let role = match m.get("role") {
                Some(Value::String(r)) => r.clone(),
                Some(_) => {
                    return Err(BadRequest::new(
                        "messages",
                        format!("messages[{i}].role must be a string"),
                    ))
                }
                None => {
                    return Err(BadRequest::new(
                        "messages",
                        format!("messages[{i}] is missing its role"),
                    ))
                }
            };
            let content = match m.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => text_parts(i, parts)?,
                Some(_) => {
                    return Err(BadRequest::new(
                        "messages",
                        format!("messages[{i}].content must be a string or an array of parts"),
                    ))
                }
            };
            let reasoning_content = match (m.get("reasoning_content"), m.get("thinking")) {
                (Some(Value::String(s)), _)
                | (None | Some(Value::Null), Some(Value::String(s))) => Some(s.clone()),
                (None | Some(Value::Null), None | Some(Value::Null)) => None,
                _ => {
                    return Err(BadRequest::new(
                        "messages",
                        format!("messages[{i}].reasoning_content must be a string"),
                    ))
                }
            };
            let tool_calls = match m.get("tool_calls") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(calls)) => calls
                    .iter()
                    .enumerate()
                    .map(|(j, c)| tool_call(&format!("messages[{i}].tool_calls[{j}]"), c))
                    .collect::<Result<_, _>>()?,
                Some(_) => {
                    return Err(BadRequest::new(
                        "messages",
                        format!("messages[{i}].tool_calls must be an array"),
                    ))
                }
            };
            let tool_call_id = opt_string(m, "tool_call_id", i)?;
            // Only a tool message's name reaches the template (the function it answers).
            let name = match role.as_str() {
                "tool" => opt_string(m, "name", i)?,
                _ => None,
            };
            Ok(ChatMessage {
                role,
                content,
                reasoning_content,
                tool_calls,
                tool_call_id,
                name,
            })
        })
        .collect()
}

fn opt_string(m: &Map<String, Value>, key: &str, i: usize) -> Result<Option<String>, BadRequest> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(BadRequest::new(
            "messages",
            format!("messages[{i}].{key} must be a string"),
        )),
    }
}

/// One of an assistant message's `tool_calls`. Its `arguments`, a JSON string in OpenAI's
/// API, reach the template as an object, as llama.cpp's server passes them to the
/// templates that read them (gpt-oss's writes them with `tojson`, Qwen's and Hermes'
/// take an object or a string).
fn tool_call(at: &str, call: &Value) -> Result<ChatToolCall, BadRequest> {
    let bad = |what: String| BadRequest::new("messages", what);
    let Value::Object(call) = call else {
        return Err(bad(format!("{at} must be an object")));
    };
    match call.get("type") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "function" => {}
        Some(_) => return Err(bad(format!("{at}.type must be \"function\""))),
    }
    let id = match call.get("id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad(format!("{at}.id must be a string"))),
    };
    let Some(Value::Object(function)) = call.get("function") else {
        return Err(bad(format!("{at}.function must be an object")));
    };
    let Some(Value::String(name)) = function.get("name") else {
        return Err(bad(format!("{at}.function.name must be a string")));
    };
    let arguments = match function.get("arguments") {
        Some(Value::String(text)) => TemplateJson::parse(text).map_err(|e| {
            bad(format!(
                "{at}.function.arguments is not valid JSON ({e}): {}",
                snippet(text)
            ))
        })?,
        Some(v @ Value::Object(_)) => TemplateJson::from(v),
        None | Some(Value::Null) => TemplateJson::from(&Value::Object(Map::new())),
        Some(_) => {
            return Err(bad(format!(
                "{at}.function.arguments must be a string of JSON or an object"
            )))
        }
    };
    Ok(ChatToolCall {
        id,
        kind: "function".into(),
        function: ChatFunctionCall {
            name: name.clone(),
            arguments,
        },
    })
}

/// The start of a long text, for an error message.
fn snippet(text: &str) -> String {
    match text.char_indices().nth(80) {
        Some((at, _)) => format!("{:?}…", &text[..at]),
        None => format!("{text:?}"),
    }
}

/// The request's `tools` (OpenAI's `[{"type": "function", "function": {"name",
/// "description", "parameters"}}]`), checked, with each object's keys in the request's
/// order; `None` when there are none. `tool_choice` is not read: nothing constrains the
/// reply to a call.
fn tools(obj: &Map<String, Value>, body: &[u8]) -> Result<Option<TemplateJson>, BadRequest> {
    let bad = |what: String| BadRequest::new("tools", what);
    let list = match obj.get("tools") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(bad("tools must be an array".into())),
    };
    if list.is_empty() {
        return Ok(None);
    }
    for (i, tool) in list.iter().enumerate() {
        let Value::Object(tool) = tool else {
            return Err(bad(format!("tools[{i}] must be an object")));
        };
        match tool.get("type") {
            Some(Value::String(t)) if t == "function" => {}
            Some(Value::String(t)) => {
                return Err(bad(format!(
                    "tools[{i}].type is {t:?}; only \"function\" tools are supported"
                )))
            }
            _ => return Err(bad(format!("tools[{i}].type must be \"function\""))),
        }
        let Some(Value::Object(function)) = tool.get("function") else {
            return Err(bad(format!("tools[{i}].function must be an object")));
        };
        match function.get("name") {
            Some(Value::String(n)) if !n.is_empty() => {}
            _ => {
                return Err(bad(format!(
                    "tools[{i}].function.name must be a non-empty string"
                )))
            }
        }
        if !matches!(function.get("description"), None | Some(Value::String(_))) {
            return Err(bad(format!(
                "tools[{i}].function.description must be a string"
            )));
        }
        if !matches!(function.get("parameters"), None | Some(Value::Object(_))) {
            return Err(bad(format!(
                "tools[{i}].function.parameters must be a JSON Schema object"
            )));
        }
    }
    // Parsed again so that objects keep their key order (serde_json's maps sort them).
    #[derive(serde::Deserialize)]
    struct OrderedTools {
        tools: TemplateJson,
    }
    let ordered: OrderedTools =
        serde_json::from_slice(body).map_err(|e| bad(format!("tools could not be read: {e}")))?;
    Ok(Some(ordered.tools))
}

/// The text of a content array; only `{"type": "text"}` parts are understood.
fn text_parts(i: usize, parts: &[Value]) -> Result<String, BadRequest> {
    let mut text = String::new();
    for part in parts {
        match (part.get("type"), part.get("text")) {
            (Some(Value::String(t)), Some(Value::String(s))) if t == "text" => text.push_str(s),
            (Some(Value::String(t)), _) if t != "text" => {
                return Err(BadRequest::new(
                    "messages",
                    format!(
                        "messages[{i}].content: parts of type {t:?} are not supported, only text"
                    ),
                ))
            }
            _ => {
                return Err(BadRequest::new(
                    "messages",
                    format!("messages[{i}].content: each part needs a type and a text"),
                ))
            }
        }
    }
    Ok(text)
}

fn text_prompt(obj: &Map<String, Value>) -> Result<String, BadRequest> {
    match obj.get("prompt") {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(a)) => match a.as_slice() {
            [Value::String(s)] => Ok(s.clone()),
            _ => Err(BadRequest::new(
                "prompt",
                "prompt must be a string or an array of exactly one string",
            )),
        },
        Some(_) => Err(BadRequest::new("prompt", "prompt must be a string")),
        None => Err(BadRequest::new(
            "prompt",
            "missing required parameter: prompt",
        )),
    }
}

fn stop_strings(obj: &Map<String, Value>) -> Result<Vec<String>, BadRequest> {
    const MAX: usize = 16;
    let bad = || BadRequest::new("stop", "stop must be a string or an array of strings");
    let stops = match obj.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(bad))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    if stops.len() > MAX {
        return Err(BadRequest::new(
            "stop",
            format!("at most {MAX} stop strings are supported"),
        ));
    }
    Ok(stops)
}

/// `seed`: any integer; absent, null or negative (llama.cpp's -1) means a random seed.
fn seed(obj: &Map<String, Value>) -> Result<u64, BadRequest> {
    match obj.get("seed") {
        None | Some(Value::Null) => Ok(random_seed()),
        Some(Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
            (Some(s), _) => Ok(s),
            (None, Some(_)) => Ok(random_seed()),
            _ => Err(BadRequest::new("seed", "seed must be an integer")),
        },
        Some(_) => Err(BadRequest::new("seed", "seed must be an integer")),
    }
}

fn random_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn opt_u64(obj: &Map<String, Value>, name: &'static str) -> Result<Option<u64>, BadRequest> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            BadRequest::new(
                name,
                format!("{name} must be a non-negative integer, not {v}"),
            )
        }),
    }
}

fn opt_bool(obj: &Map<String, Value>, name: &'static str) -> Result<Option<bool>, BadRequest> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(BadRequest::new(
            name,
            format!("{name} must be true or false, not {v}"),
        )),
    }
}

fn opt_f32_in(
    obj: &Map<String, Value>,
    name: &'static str,
    min: f32,
    max: f32,
) -> Result<Option<f32>, BadRequest> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if (min as f64..=max as f64).contains(&x) => Ok(Some(x as f32)),
            _ => Err(BadRequest::new(
                name,
                format!("{name} must be a number from {min} to {max}, not {v}"),
            )),
        },
    }
}

/// Names one response and its chunks.
pub(crate) struct ResponseHeader<'a> {
    pub api: Api,
    pub id: u64,
    pub created: u64,
    pub model: &'a str,
}

impl ResponseHeader<'_> {
    fn id(&self) -> String {
        format!("{}-{}", self.api.id_prefix(), self.id)
    }

    /// The whole answer of a non-streaming request.
    pub(crate) fn complete(&self, reply: &Reply, c: &Completion) -> Value {
        let finish_reason = finish_reason(c, !reply.tool_calls.is_empty());
        let choice = match self.api {
            Api::Chat => {
                let mut message = json!({"role": "assistant", "content": reply.content});
                if !reply.reasoning.is_empty() {
                    message["reasoning_content"] = reply.reasoning.as_str().into();
                }
                if !reply.tool_calls.is_empty() {
                    if reply.content.is_empty() {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] =
                        reply.tool_calls.iter().map(|t| self.tool_call(t)).collect();
                }
                json!({
                    "index": 0,
                    "message": message,
                    "logprobs": null,
                    "finish_reason": finish_reason,
                })
            }
            Api::Text => json!({
                "index": 0,
                "text": reply.content,
                "logprobs": null,
                "finish_reason": finish_reason,
            }),
        };
        json!({
            "id": self.id(),
            "object": match self.api { Api::Chat => "chat.completion", Api::Text => "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage(&c.usage),
            "timings": timings(c),
        })
    }

    /// A streamed chunk: one `delta` (with the assistant role on the first chat chunk), or
    /// the end with `finish` (and whether the reply made tool calls).
    pub(crate) fn chunk(
        &self,
        delta: Option<&Delta>,
        first: bool,
        finish: Option<(&Completion, bool)>,
    ) -> Value {
        let finish_reason = finish.map(|(c, tool_calls)| finish_reason(c, tool_calls));
        let choice = match self.api {
            Api::Chat => {
                let mut fields = Map::new();
                if first {
                    fields.insert("role".into(), "assistant".into());
                }
                match delta {
                    Some(Delta::Content(t)) => {
                        fields.insert("content".into(), t.as_str().into());
                    }
                    Some(Delta::Reasoning(t)) => {
                        fields.insert("reasoning_content".into(), t.as_str().into());
                    }
                    Some(Delta::ToolCall(t)) => {
                        let mut call = self.tool_call(t);
                        call["index"] = t.index.into();
                        fields.insert("tool_calls".into(), json!([call]));
                    }
                    None => {}
                }
                json!({"index": 0, "delta": fields, "logprobs": null, "finish_reason": finish_reason})
            }
            Api::Text => json!({
                "index": 0,
                "text": match delta { Some(Delta::Content(t)) => t.as_str(), _ => "" },
                "logprobs": null,
                "finish_reason": finish_reason,
            }),
        };
        let mut chunk = self.chunk_shell();
        chunk["choices"] = json!([choice]);
        if let Some((c, _)) = finish {
            chunk["timings"] = timings(c);
        }
        chunk
    }

    /// OpenAI's form of a tool call; its id names the response and the call's place.
    fn tool_call(&self, t: &ToolCall) -> Value {
        json!({
            "id": format!("call_{}_{}", self.id, t.index),
            "type": "function",
            "function": {"name": t.name, "arguments": t.arguments},
        })
    }

    /// The chunk with the usage and no choices (`stream_options.include_usage`).
    pub(crate) fn usage_chunk(&self, u: &Usage) -> Value {
        let mut chunk = self.chunk_shell();
        chunk["choices"] = json!([]);
        chunk["usage"] = usage(u);
        chunk
    }

    fn chunk_shell(&self) -> Value {
        json!({
            "id": self.id(),
            "object": match self.api { Api::Chat => "chat.completion.chunk", Api::Text => "text_completion" },
            "created": self.created,
            "model": self.model,
        })
    }
}

/// A turn that ended by calling functions (`<|call|>`) finishes with "tool_calls".
fn finish_reason(c: &Completion, tool_calls: bool) -> &'static str {
    match c.finish_reason {
        FinishReason::Stop if tool_calls => "tool_calls",
        reason => reason.as_str(),
    }
}

fn usage(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

/// Prima's timings, beside OpenAI's fields (as llama.cpp's server adds them).
fn timings(c: &Completion) -> Value {
    let mut timings = json!({
        "prompt_n": c.usage.prompt_tokens,
        "prompt_cached_n": c.cached_prompt_tokens,
        "ttft_ms": c.time_to_first_token.as_secs_f64() * 1e3,
        "predicted_n": c.usage.completion_tokens,
        "tpot_ms": c.tpot_ms,
    });
    // With a draft model: llama-server's names for drafted and accepted tokens.
    if let Some(d) = &c.draft {
        timings["draft_n"] = d.drafted.into();
        timings["draft_n_accepted"] = d.accepted.into();
        timings["draft_acceptance"] = d.acceptance().into();
        timings["target_evals"] = d.target_evals.into();
    }
    timings
}

/// OpenAI's error body.
pub(crate) fn error_body(
    message: &str,
    kind: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(api: Api, body: &str) -> Result<ParsedRequest, BadRequest> {
        parse_request(api, body.as_bytes())
    }

    #[test]
    fn a_chat_request_with_unknown_fields_parses() {
        let p = parse(
            Api::Chat,
            r#"{"model":"x","messages":[{"role":"user","content":"hi","name":"a"}],
                "temperature":0,"max_tokens":5,"stop":"\n","seed":3,"stream":true,
                "stream_options":{"include_usage":true},"user":"u","logit_bias":{}}"#,
        )
        .unwrap();
        assert!(p.stream && p.include_usage);
        assert_eq!(p.generation.max_tokens, Some(5));
        assert_eq!(p.generation.stop, vec!["\n".to_string()]);
        assert_eq!(p.generation.sampler.temperature, 0.0);
        assert_eq!(p.generation.sampler.seed, 3);
        let Prompt::Chat { messages: m, .. } = &p.generation.prompt else {
            panic!()
        };
        assert_eq!(m, &[ChatMessage::new("user", "hi")]);
    }

    #[test]
    fn content_parts_are_joined_and_images_refused() {
        let p = parse(
            Api::Chat,
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#,
        )
        .unwrap();
        let Prompt::Chat { messages: m, .. } = &p.generation.prompt else {
            panic!()
        };
        assert_eq!(m[0].content, "ab");
        let e = parse(
            Api::Chat,
            r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}"#,
        )
        .unwrap_err();
        assert!(e.message.contains("image_url"), "{}", e.message);
    }

    #[test]
    fn each_bad_value_names_its_parameter() {
        for (api, body, param) in [
            (Api::Chat, r#"{}"#, "messages"),
            (Api::Chat, r#"{"messages":[]}"#, "messages"),
            (Api::Chat, r#"{"messages":[{"content":"x"}]}"#, "messages"),
            (Api::Text, r#"{"prompt":3}"#, "prompt"),
            (Api::Text, r#"{"prompt":"x","max_tokens":-1}"#, "max_tokens"),
            (Api::Text, r#"{"prompt":"x","max_tokens":0}"#, "max_tokens"),
            (
                Api::Text,
                r#"{"prompt":"x","temperature":"hot"}"#,
                "temperature",
            ),
            (
                Api::Text,
                r#"{"prompt":"x","temperature":5}"#,
                "temperature",
            ),
            (Api::Text, r#"{"prompt":"x","top_p":1.5}"#, "top_p"),
            (Api::Text, r#"{"prompt":"x","stop":[1]}"#, "stop"),
            (Api::Text, r#"{"prompt":"x","stream":"yes"}"#, "stream"),
            (Api::Text, r#"{"prompt":"x","n":2}"#, "n"),
            (Api::Text, r#"{"prompt":"x","seed":"s"}"#, "seed"),
        ] {
            let e = parse(api, body).unwrap_err();
            assert_eq!(e.param, Some(param), "{body}: {}", e.message);
        }
    }

    #[test]
    fn malformed_json_and_non_objects_are_refused() {
        let e = parse(Api::Chat, "{\"messages\": [").unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        assert!(parse(Api::Chat, "[1]").is_err());
    }

    fn chat(body: &str) -> (Vec<ChatMessage>, Option<TemplateJson>) {
        match parse(Api::Chat, body).unwrap().generation.prompt {
            Prompt::Chat { messages, tools } => (messages, tools),
            Prompt::Text(_) => panic!("a chat request"),
        }
    }

    #[test]
    fn tools_and_tool_turns_are_read_in_the_request_order() {
        let (m, tools) = chat(
            r#"{"messages":[{"role":"user","content":"Weather?"},
                {"role":"assistant","content":null,"reasoning_content":"Look it up.",
                 "tool_calls":[{"id":"c1","type":"function",
                   "function":{"name":"get_weather","arguments":"{\"z\": 1, \"a\": [2]}"}}]},
                {"role":"tool","tool_call_id":"c1","name":"get_weather","content":"21"}],
               "tools":[{"type":"function","function":{"name":"get_weather",
                 "parameters":{"type":"object","properties":{"z":{},"a":{}}}}}],
               "tool_choice":"auto"}"#,
        );
        let tools = serde_json::to_string(&tools.unwrap()).unwrap();
        assert_eq!(
            tools,
            r#"[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"z":{},"a":{}}}}}]"#
        );
        assert_eq!(m[1].content, "");
        assert_eq!(m[1].reasoning_content.as_deref(), Some("Look it up."));
        let call = &m[1].tool_calls[0];
        assert_eq!(
            (call.id.as_deref(), call.function.name.as_str()),
            (Some("c1"), "get_weather")
        );
        assert_eq!(
            serde_json::to_string(&call.function.arguments).unwrap(),
            r#"{"z":1,"a":[2]}"#
        );
        assert_eq!(m[2].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(m[2].name.as_deref(), Some("get_weather"));
        // No tools, or an empty list: the template sees none.
        assert!(
            chat(r#"{"messages":[{"role":"user","content":"x"}],"tools":[]}"#)
                .1
                .is_none()
        );
    }

    #[test]
    fn a_malformed_tool_is_refused_naming_it() {
        let msg = |m: &str| format!(r#"{{"messages":[{{"role":"user","content":"x"}},{m}]}}"#);
        let tools =
            |t: &str| format!(r#"{{"messages":[{{"role":"user","content":"x"}}],"tools":{t}}}"#);
        for (body, param, says) in [
            (tools("{}"), "tools", "tools must be an array"),
            (tools("[3]"), "tools", "tools[0] must be an object"),
            (
                tools(r#"[{"type":"function","function":{"name":"f"}},{"type":"function"}]"#),
                "tools",
                "tools[1].function must be an object",
            ),
            (
                tools(r#"[{"type":"function","function":{"name":7}}]"#),
                "tools",
                "tools[0].function.name must be a non-empty string",
            ),
            (
                tools(r#"[{"type":"retrieval"}]"#),
                "tools",
                "tools[0].type is \"retrieval\"",
            ),
            (
                tools(r#"[{"type":"function","function":{"name":"f","parameters":"x"}}]"#),
                "tools",
                "tools[0].function.parameters",
            ),
            (
                msg(r#"{"role":"assistant","tool_calls":{}}"#),
                "messages",
                "messages[1].tool_calls must be an array",
            ),
            (
                msg(r#"{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}"#),
                "messages",
                "messages[1].tool_calls[0].function.name must be a string",
            ),
            (
                msg(
                    r#"{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{oops"}}]}"#,
                ),
                "messages",
                "messages[1].tool_calls[0].function.arguments is not valid JSON",
            ),
            (
                msg(r#"{"role":"tool","content":"1","tool_call_id":5}"#),
                "messages",
                "messages[1].tool_call_id must be a string",
            ),
        ] {
            let e = parse(Api::Chat, &body).unwrap_err();
            assert_eq!(e.param, Some(param), "{body}: {}", e.message);
            assert!(e.message.contains(says), "{body}: {}", e.message);
        }
    }
}

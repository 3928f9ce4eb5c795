//! A request's `tools` and its tool turns reach the chat template over HTTP (`prima serve
//! --chat-template FILE` on SmolLM2): the prompt a chat request with tools gets is the
//! one the template writes for them, and a malformed tool is a 400 naming it.

mod server_support;

use serde_json::{json, Value};
use server_support::{smollm2, Server};

/// A tools-aware template in the Hermes manner: each tool as JSON in `<tools>`, an
/// assistant's calls and a tool's answer in the turns.
const TEMPLATE: &str = r#"{%- if tools %}{{ '<|im_start|>system\n<tools>' }}{% for tool in tools %}{{ '\n' + tool | tojson }}{% endfor %}{{ '\n</tools><|im_end|>\n' }}{% endif %}
{%- for m in messages %}{{ '<|im_start|>' + m.role + '\n' + m.content }}
{%- for c in m.tool_calls or [] %}{{ '<tool_call>' + c.function.name + ' ' + c.function.arguments | tojson + '</tool_call>' }}{% endfor %}
{%- if m.role == 'tool' %}{{ ' (' + m.tool_call_id + ')' }}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}
{{- '<|im_start|>assistant\n' }}"#;

/// The request, written out so that its keys come in this order.
const WITH_TOOLS: &str = r#"{"messages": [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "21 C"}],
  "tools": [{"type": "function", "function": {"name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
  "tool_choice": "auto", "temperature": 0, "max_tokens": 8}"#;

/// What the template writes for it.
const RENDERED: &str = "<|im_start|>system\n<tools>\n\
    {\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": \
    {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}\n\
    </tools><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n\
    <|im_start|>assistant\n<tool_call>get_weather {\"city\": \"Paris\"}</tool_call><|im_end|>\n\
    <|im_start|>tool\n21 C (c1)<|im_end|>\n<|im_start|>assistant\n";

#[test]
fn tools_reach_the_template_and_malformed_ones_are_refused() {
    let Some(model) = smollm2() else { return };
    let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("server_tools.jinja");
    std::fs::write(&file, TEMPLATE).unwrap();
    let server = Server::start(
        &model,
        &["-c", "256", "--chat-template", file.to_str().unwrap()],
    );

    // The chat request and the completion of the text the template should have written
    // read the same prompt: the same tokens, the same greedy reply.
    let (status, text) = server.post("/v1/chat/completions", WITH_TOOLS);
    assert_eq!(status, 200, "{text}");
    let chat: Value = serde_json::from_str(&text).unwrap();
    let (status, plain) = server.post_json(
        "/v1/completions",
        &json!({"prompt": RENDERED, "temperature": 0, "max_tokens": 8}),
    );
    assert_eq!(status, 200, "{plain}");
    assert_eq!(
        chat["usage"]["prompt_tokens"], plain["usage"]["prompt_tokens"],
        "{chat}\n{plain}"
    );
    assert_eq!(
        chat["choices"][0]["message"]["content"], plain["choices"][0]["text"],
        "{chat}\n{plain}"
    );

    // Without tools the template writes no tools section.
    let (status, bare) = server.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 1}),
    );
    assert_eq!(status, 200, "{bare}");
    let (_, bare_plain) = server.post_json(
        "/v1/completions",
        &json!({"prompt": "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n",
                "max_tokens": 1}),
    );
    assert_eq!(
        bare["usage"]["prompt_tokens"],
        bare_plain["usage"]["prompt_tokens"]
    );

    for (tools, says) in [
        (r#"{"type": "function"}"#, "tools must be an array"),
        (
            r#"[{"type": "function", "function": {"name": 3}}]"#,
            "tools[0].function.name must be a non-empty string",
        ),
    ] {
        let body =
            format!(r#"{{"messages": [{{"role": "user", "content": "hi"}}], "tools": {tools}}}"#);
        let (status, error) = server.post_json(
            "/v1/chat/completions",
            &serde_json::from_str(&body).unwrap(),
        );
        assert_eq!(status, 400, "{body}: {error}");
        assert_eq!(error["error"]["param"], "tools", "{error}");
        assert!(
            error["error"]["message"].as_str().unwrap().contains(says),
            "{error}"
        );
    }
    let (status, error) = server.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "assistant", "tool_calls": [{"type": "function",
            "function": {"name": "f", "arguments": "{not json"}}]}]}),
    );
    assert_eq!(status, 400, "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("messages[0].tool_calls[0].function.arguments is not valid JSON"),
        "{error}"
    );
}

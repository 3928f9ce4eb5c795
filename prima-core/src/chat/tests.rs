use super::*;

/// SmolLM2-135M-Instruct's `tokenizer.chat_template`, as stored in its GGUF.
const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

#[test]
fn smollm2_template_renders_chatml() {
    let msgs = [ChatMessage::new("user", "Hi there")];
    let out = render_chat(SMOLLM2, &msgs, None, true, "<|im_start|>", "<|im_end|>").unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    );
    let msgs = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "2+2?"),
        ChatMessage::new("assistant", "4"),
    ];
    let out = render_chat(SMOLLM2, &msgs, None, false, "", "").unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
    );
}

#[test]
fn blocks_are_trimmed_like_hugging_face() {
    let t = "{% for m in messages %}\n  {{ m.role }}: {{ m.content | trim }}\n{% endfor %}\n{{ bos_token }}|{{ eos_token }}";
    let out = render_chat(
        t,
        &[
            ChatMessage::new("user", " a "),
            ChatMessage::new("bot", "b"),
        ],
        None,
        false,
        "<s>",
        "</s>",
    )
    .unwrap();
    assert_eq!(out, "  user: a\n  bot: b\n<s>|</s>");
}

#[test]
fn python_string_methods_work() {
    let t = "{{ messages[0].content.strip().upper() }}{% if messages[0].role.startswith('us') %}!{% endif %}";
    let out = render_chat(
        t,
        &[ChatMessage::new("user", "  hi  ")],
        None,
        false,
        "",
        "",
    )
    .unwrap();
    assert_eq!(out, "HI!");
}

#[test]
fn raise_exception_is_an_error_with_its_message() {
    let t = "{% if messages[0].role != 'system' %}{{ raise_exception('system first, please') }}{% endif %}";
    let err = render_chat(t, &[ChatMessage::new("user", "x")], None, false, "", "").unwrap_err();
    assert!(err.to_string().contains("system first, please"), "{err}");
    let err = render_chat("{% if %}", &[], None, false, "", "").unwrap_err();
    assert!(matches!(err, ChatError::Syntax(_)), "{err}");
}

#[test]
fn strftime_fields() {
    // 2024-02-29 13:05:09 UTC, a Thursday.
    let t = 1_709_211_909;
    assert_eq!(format_time(t, "%Y-%m-%d %H:%M:%S"), "2024-02-29 13:05:09");
    assert_eq!(
        format_time(t, "%d %B %Y, %a %b %j %%"),
        "29 February 2024, Thu Feb 060 %"
    );
    assert!(
        render_chat("{{ strftime_now('%Y') }}", &[], None, false, "", "")
            .unwrap()
            .len()
            == 4
    );
}

#[test]
fn messages_round_trip_through_json() {
    let m: Vec<ChatMessage> = serde_json::from_str(r#"[{"role":"user","content":"hi"}]"#).unwrap();
    assert_eq!(m, [ChatMessage::new("user", "hi")]);
}

#[test]
fn harmony_style_template_features() {
    // What gpt-oss's template leans on: `in` over a message's keys, list slices,
    // namespace() and whitespace control around blocks.
    let t = "{%- if messages[0].role == 'system' %}{%- set rest = messages[1:] %}{%- else %}{%- set rest = messages %}{%- endif %}\n\
             {%- set last = namespace(role=none) %}\n\
             {%- for m in rest -%}\n\
             {%- if 'thinking' in m %}T{% endif -%}\n\
             {{- '<|start|>' + m.role + '<|message|>' + m.content + '<|end|>' }}\n\
             {%- set last.role = m.role %}\n\
             {%- endfor -%}\n\
             {%- if add_generation_prompt -%}\n<|start|>assistant\n{%- endif -%}{{ last.role }}";
    let msgs = [
        ChatMessage::new("system", "s"),
        ChatMessage::new("user", "hi"),
    ];
    let out = render_chat(t, &msgs, None, true, "", "").unwrap();
    assert_eq!(
        out,
        "<|start|>user<|message|>hi<|end|><|start|>assistantuser"
    );
}

#[test]
fn builtin_templates_render_each_architectures_turns() {
    let msgs = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", " Hi "),
        ChatMessage::new("assistant", "Hello."),
        ChatMessage::new("user", "Bye"),
    ];
    let render = |name: &str| {
        render_chat(
            builtin_template(name).unwrap(),
            &msgs,
            None,
            true,
            "<bos>",
            "<eos>",
        )
        .unwrap()
    };
    assert_eq!(
        render("gemma"),
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
         <start_of_turn>model\nHello.<end_of_turn>\n\
         <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    );
    assert_eq!(
        render("chatml"),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n\
         <|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    assert!(render("llama3").starts_with(
        "<bos><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
    ));
    assert!(render("llama3").ends_with("<|start_header_id|>assistant<|end_header_id|>\n\n"));
    // No system message: Gemma's first turn is the user's alone.
    let out = render_chat(
        builtin_template("gemma").unwrap(),
        &msgs[1..2],
        None,
        false,
        "",
        "",
    )
    .unwrap();
    assert_eq!(out, "<start_of_turn>user\nHi<end_of_turn>\n");
    assert_eq!(builtin_for_architecture("gemma3"), Some("gemma"));
    assert_eq!(builtin_for_architecture("qwen3moe"), Some("chatml"));
    assert_eq!(builtin_for_architecture("gpt-oss"), None);
    assert!(builtin_template("vicuna").is_none());
}

/// The tool parts of a Hermes-style template, as Qwen3's writes them: each tool as JSON
/// in `<tools>`, calls in `<tool_call>` (arguments as a string or an object), results in
/// `<tool_response>`.
const HERMES: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<|im_start|>user\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>assistant\n' }}
        {%- if message.reasoning_content is defined %}
            {{- '<think>\n' + message.reasoning_content + '\n</think>\n\n' }}
        {%- endif %}
        {{- message.content }}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response> (' + message.name + ' ' + message.tool_call_id + ')<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"##;

const WEATHER_TOOLS: &str = r#"[{"type": "function", "function": {"name": "get_weather",
    "description": "Current weather in a city.", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "description": "The city's name"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}]"#;

fn weather_call() -> ChatMessage {
    ChatMessage {
        reasoning_content: Some("Call the tool.".into()),
        tool_calls: vec![ChatToolCall {
            id: Some("call_1".into()),
            kind: "function".into(),
            function: ChatFunctionCall {
                name: "get_weather".into(),
                arguments: TemplateJson::parse(r#"{"unit": "celsius", "city": "Paris"}"#).unwrap(),
            },
        }],
        ..ChatMessage::new("assistant", "")
    }
}

fn weather_result() -> ChatMessage {
    ChatMessage {
        tool_call_id: Some("call_1".into()),
        name: Some("get_weather".into()),
        ..ChatMessage::new("tool", r#"{"temp": 21}"#)
    }
}

#[test]
fn hermes_template_gets_the_tools_calls_and_results() {
    // Expected text: the same template and inputs through Python's jinja2 with
    // transformers' tojson (json.dumps, keys in their order, ensure_ascii=False).
    let tools = TemplateJson::parse(WEATHER_TOOLS).unwrap();
    let msgs = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Weather in Paris?"),
        weather_call(),
        weather_result(),
    ];
    let out = render_chat(HERMES, &msgs, Some(&tools), true, "", "").unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.\n\n# Tools\n\n<tools>\n\
         {\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \
         \"description\": \"Current weather in a city.\", \"parameters\": {\"type\": \"object\", \
         \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city's name\"}, \
         \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, \
         \"required\": [\"city\"]}}}\n</tools><|im_end|>\n\
         <|im_start|>user\nWeather in Paris?<|im_end|>\n\
         <|im_start|>assistant\n<think>\nCall the tool.\n</think>\n\n<tool_call>\n\
         {\"name\": \"get_weather\", \"arguments\": {\"unit\": \"celsius\", \"city\": \"Paris\"}}\n\
         </tool_call><|im_end|>\n\
         <|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response> (get_weather call_1)<|im_end|>\n\
         <|im_start|>assistant\n"
    );
}

#[test]
fn without_tools_a_template_sees_what_it_saw_before() {
    // `tools` is undefined, and a message has only role and content.
    let msgs = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
    ];
    let out = render_chat(HERMES, &msgs, None, true, "", "").unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let t = "{{ tools is defined }} {% for m in messages %}{{ m | list | join(',') }};{% endfor %}";
    let out = render_chat(
        t,
        &[msgs[1].clone(), weather_call(), weather_result()],
        None,
        false,
        "",
        "",
    );
    assert_eq!(
        out.unwrap(),
        "False role,content;role,content,reasoning_content,thinking,tool_calls;\
         role,content,tool_call_id,name;"
    );
    let tools = TemplateJson::parse("[]").unwrap();
    let out = render_chat("{{ tools is defined }}", &[], Some(&tools), false, "", "");
    assert_eq!(out.unwrap(), "True");
}

#[test]
fn tojson_writes_as_python_json_dumps() {
    let render = |t: &str| render_chat(t, &[weather_call()], None, false, "", "").unwrap();
    let args = "messages[0].tool_calls[0].function.arguments";
    assert_eq!(
        render(&format!("{{{{ {args} | tojson }}}}")),
        r#"{"unit": "celsius", "city": "Paris"}"#
    );
    assert_eq!(
        render(&format!("{{{{ {args} | tojson(indent=2) }}}}")),
        "{\n  \"unit\": \"celsius\",\n  \"city\": \"Paris\"\n}"
    );
    assert_eq!(
        render(&format!("{{{{ {args} | tojson(separators=[',', ':']) }}}}")),
        r#"{"unit":"celsius","city":"Paris"}"#
    );
    assert_eq!(
        render(r#"{{ ["é <b>", 1, 2.5, true, none, {}, []] | tojson }}"#),
        r#"["é <b>", 1, 2.5, true, null, {}, []]"#
    );
    assert_eq!(
        render(r#"{{ "é\n\"" | tojson(ensure_ascii=true) }}"#),
        r#""\u00e9\n\"""#
    );
    let err = render_chat("{{ 1 | tojson(sort_keys=true) }}", &[], None, false, "", "");
    assert!(err.unwrap_err().to_string().contains("sort_keys"));
}

#[test]
fn tool_messages_read_from_json() {
    let m: Vec<ChatMessage> = serde_json::from_str(
        r#"[{"role": "assistant", "content": "", "thinking": "Call the tool.",
             "tool_calls": [{"id": "call_1", "type": "function", "function":
               {"name": "get_weather", "arguments": {"unit": "celsius", "city": "Paris"}}}]},
            {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "call_1",
             "name": "get_weather"}]"#,
    )
    .unwrap();
    assert_eq!(m, [weather_call(), weather_result()]);
}

use super::*;

/// SmolLM2-135M-Instruct's `tokenizer.chat_template`, as stored in its GGUF.
const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

#[test]
fn smollm2_template_renders_chatml() {
    let msgs = [ChatMessage::new("user", "Hi there")];
    let out = render_chat(SMOLLM2, &msgs, true, "<|im_start|>", "<|im_end|>").unwrap();
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
    let out = render_chat(SMOLLM2, &msgs, false, "", "").unwrap();
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
    let out = render_chat(t, &[ChatMessage::new("user", "  hi  ")], false, "", "").unwrap();
    assert_eq!(out, "HI!");
}

#[test]
fn raise_exception_is_an_error_with_its_message() {
    let t = "{% if messages[0].role != 'system' %}{{ raise_exception('system first, please') }}{% endif %}";
    let err = render_chat(t, &[ChatMessage::new("user", "x")], false, "", "").unwrap_err();
    assert!(err.to_string().contains("system first, please"), "{err}");
    let err = render_chat("{% if %}", &[], false, "", "").unwrap_err();
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
        render_chat("{{ strftime_now('%Y') }}", &[], false, "", "")
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
    let out = render_chat(t, &msgs, true, "", "").unwrap();
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

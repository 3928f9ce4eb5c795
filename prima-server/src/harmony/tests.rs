use super::*;
use prima_core::tokenizer::{byte_to_char, TokenizerParts};

fn harmony(text: &str) -> Reply {
    Reply::read(ReplyFormat::Harmony, text)
}

fn reply(reasoning: &str, content: &str, tool_calls: &[(&str, &str)]) -> Reply {
    Reply {
        reasoning: reasoning.into(),
        content: content.into(),
        tool_calls: tool_calls
            .iter()
            .enumerate()
            .map(|(index, (name, arguments))| ToolCall {
                index,
                name: name.to_string(),
                arguments: arguments.to_string(),
            })
            .collect(),
    }
}

/// `text` fed in the given pieces; adjacent deltas of one kind are joined, so that any
/// cut of the same text must give the same list.
fn streamed<'a>(pieces: impl IntoIterator<Item = &'a str>) -> Vec<Delta> {
    let mut reader = ReplyReader::new(ReplyFormat::Harmony);
    let mut deltas = Vec::new();
    for p in pieces {
        deltas.extend(reader.push(p));
    }
    deltas.extend(reader.finish());
    joined(deltas)
}

fn joined(deltas: Vec<Delta>) -> Vec<Delta> {
    let mut out: Vec<Delta> = Vec::new();
    for d in deltas {
        match (out.last_mut(), d) {
            (Some(Delta::Reasoning(a)), Delta::Reasoning(b)) => a.push_str(&b),
            (Some(Delta::Content(a)), Delta::Content(b)) => a.push_str(&b),
            (_, d) => out.push(d),
        }
    }
    out
}

/// Every cut of `text` in two, and every character alone, gives the whole text's deltas.
fn assert_any_cut_reads_alike(text: &str) {
    let whole = streamed([text]);
    for (at, _) in text.char_indices() {
        assert_eq!(
            streamed([&text[..at], &text[at..]]),
            whole,
            "cut at {at}: {text:?}"
        );
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    assert_eq!(
        streamed(chars.iter().map(String::as_str)),
        whole,
        "{text:?}"
    );
}

const THOUGHT_AND_ANSWER: &str =
    "<|channel|>analysis<|message|>User says hi. Reply < 5 words.<|end|>\
     <|start|>assistant<|channel|>final<|message|>Hello! How can I help?";

#[test]
fn analysis_is_reasoning_and_final_is_content() {
    assert_eq!(
        harmony(THOUGHT_AND_ANSWER),
        reply(
            "User says hi. Reply < 5 words.",
            "Hello! How can I help?",
            &[]
        )
    );
    assert_any_cut_reads_alike(THOUGHT_AND_ANSWER);
}

#[test]
fn deltas_come_reasoning_first_and_never_carry_a_marker() {
    let chars: Vec<String> = THOUGHT_AND_ANSWER.chars().map(String::from).collect();
    let mut reader = ReplyReader::new(ReplyFormat::Harmony);
    let mut deltas = Vec::new();
    for c in &chars {
        deltas.extend(reader.push(c));
    }
    deltas.extend(reader.finish());
    let first_content = deltas
        .iter()
        .position(|d| matches!(d, Delta::Content(_)))
        .unwrap();
    assert!(deltas[..first_content]
        .iter()
        .all(|d| matches!(d, Delta::Reasoning(_))));
    for d in &deltas {
        let (Delta::Reasoning(t) | Delta::Content(t)) = d else {
            panic!("{d:?}")
        };
        assert!(!t.contains("<|"), "{d:?}");
    }
    // Held back only while a marker may begin: "<" waits for the next piece.
    let mut reader = ReplyReader::new(ReplyFormat::Harmony);
    assert_eq!(
        reader.push("<|channel|>final<|message|>a <"),
        [Delta::Content("a ".into())]
    );
    assert_eq!(reader.push(" b"), [Delta::Content("< b".into())]);
}

#[test]
fn a_reply_cut_off_while_thinking_is_all_reasoning() {
    assert_eq!(
        harmony("<|channel|>analysis<|message|>Let me think about <|"),
        reply("Let me think about <|", "", &[])
    );
    // Cut inside the next header: nothing of the header is shown.
    assert_eq!(
        harmony("<|channel|>analysis<|message|>Done.<|end|><|start|>assistant<|channel|>fin"),
        reply("Done.", "", &[])
    );
}

#[test]
fn text_that_is_not_harmony_is_content_as_it_is() {
    for text in [
        "Hello there",
        "  <b>bold</b>",
        "to be or not",
        "<|message|>x",
    ] {
        assert_eq!(harmony(text), reply("", text, &[]), "{text:?}");
        assert_any_cut_reads_alike(text);
    }
    // A header that never ends is not one.
    let long = format!("<|channel|>{}", "x".repeat(2 * MAX_HEADER));
    assert_eq!(harmony(&long), reply("", &long, &[]));
    assert_any_cut_reads_alike(&long);
    assert_eq!(harmony(""), Reply::default());
    assert_eq!(
        Reply::read(ReplyFormat::Plain, THOUGHT_AND_ANSWER).content,
        THOUGHT_AND_ANSWER
    );
}

#[test]
fn a_call_to_a_function_is_a_tool_call() {
    // The recipient in the channel header, as gpt-oss writes it…
    let text = "<|channel|>analysis<|message|>Need the weather.<|end|>\
        <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}";
    assert_eq!(
        harmony(text),
        reply(
            "Need the weather.",
            "",
            &[("get_weather", "{\"city\":\"Paris\"}")]
        )
    );
    assert_any_cut_reads_alike(text);
    // … or in the role header, as the template writes past calls.
    let text = " to=functions.lookup<|channel|>commentary json<|message|>{\"q\": 1} <|end|>\
        <|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{}";
    assert_eq!(
        harmony(text),
        reply("", "", &[("lookup", "{\"q\": 1}"), ("lookup", "{}")])
    );
    assert_any_cut_reads_alike(text);
}

#[test]
fn preambles_are_content_and_built_in_tools_are_dropped() {
    let text = "<|channel|>commentary<|message|>Checking.<|end|>\
        <|start|>assistant<|channel|>analysis to=browser.search code<|message|>{\"q\":\"x\"}<|end|>\
        <|start|>assistant<|channel|>commentary to=assistant<|message|> Done.";
    assert_eq!(harmony(text), reply("", "Checking. Done.", &[]));
    assert_any_cut_reads_alike(text);
}

/// gpt-oss's markers as its GGUF types them (control; the tokenizer makes the message
/// markers user-defined), the byte alphabet, and the harmony template's telltale.
fn harmony_tokenizer(template: &str) -> Tokenizer {
    let specials = [
        "<|return|>",
        "<|constrain|>",
        "<|channel|>",
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|call|>",
    ];
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_to_char(b).to_string()).collect();
    let mut token_types = vec![1; tokens.len()];
    tokens.extend(specials.iter().map(|s| s.to_string()));
    token_types.extend([3; 7]);
    Tokenizer::from_parts(TokenizerParts {
        model: "gpt2".into(),
        pre: Some("gpt-4o".into()),
        tokens,
        token_types,
        eos: Some(256),
        chat_template: Some(template.into()),
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn the_format_is_harmony_when_template_and_vocabulary_have_the_markers() {
    let t = harmony_tokenizer("{{ '<|start|>assistant<|channel|>final<|message|>' }}");
    assert_eq!(ReplyFormat::of(&t), ReplyFormat::Harmony);
    let t = harmony_tokenizer("{{ messages[0].content }}");
    assert_eq!(ReplyFormat::of(&t), ReplyFormat::Plain);
}

#[test]
fn tokens_decoded_one_by_one_read_as_the_text() {
    let t = harmony_tokenizer("<|channel|>");
    let text = "<|channel|>analysis<|message|>Café? 😀<|end|><|start|>assistant<|channel|>final<|message|>Oui.";
    let ids = t.encode(text, false, false);
    let mut decoder = t.stream_decoder();
    let mut pieces: Vec<String> = ids.iter().map(|&id| decoder.push(id)).collect();
    pieces.push(decoder.finish());
    assert_eq!(
        streamed(pieces.iter().map(String::as_str)),
        [
            Delta::Reasoning("Café? 😀".into()),
            Delta::Content("Oui.".into())
        ]
    );
    // <|return|> ends the turn and is never text.
    let return_id = t.encode("<|return|>", false, true)[0];
    assert!(t.is_end_of_generation(return_id));
    assert_eq!(t.decode(&[return_id]), "");
}

#[test]
fn arbitrary_mixes_of_markers_never_panic_and_read_alike_in_any_cut() {
    let parts = [
        "<|channel|>",
        "<|message|>",
        "<|start|>",
        "<|end|>",
        "<|constrain|>",
        "<|",
        "|>",
        "<",
        "analysis",
        "final",
        "commentary",
        " to=",
        "functions.f",
        "assistant",
        " ",
        "é",
        "x",
        "{}",
        "\n",
    ];
    // A fixed linear congruential sequence: the same cases on every run.
    let mut state = 12345u64;
    let mut next = |n: usize| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as usize % n
    };
    for _ in 0..300 {
        let len = next(12);
        let text: String = (0..len).map(|_| parts[next(parts.len())]).collect();
        assert_any_cut_reads_alike(&text);
    }
}

/// gpt-oss's real vocabulary and template (`cargo xtask o200k-vocab`), when it is there.
fn gpt_oss_vocabulary() -> Option<Tokenizer> {
    let dir = std::env::var_os("PRIMA_MODEL_DIR")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache/prima/models"))
        })?;
    let path = dir.join("gpt-oss-o200k-vocab.gguf");
    if !path.exists() {
        eprintln!("note: skipping, {} is absent", path.display());
        return None;
    }
    let g = prima_core::gguf::GgufFile::open(&path).unwrap();
    Some(Tokenizer::from_gguf(&g).unwrap())
}

#[test]
fn gpt_oss_vocabulary_is_read_as_harmony() {
    let Some(t) = gpt_oss_vocabulary() else {
        return;
    };
    assert_eq!(ReplyFormat::of(&t), ReplyFormat::Harmony);
    let text = "<|channel|>analysis<|message|>The user greets in French; answer «bonjour».<|end|>\
        <|start|>assistant<|channel|>final<|message|>Bonjour ! 😀";
    let ids = t.encode(text, false, true);
    let mut decoder = t.stream_decoder();
    let mut pieces: Vec<String> = ids.iter().map(|&id| decoder.push(id)).collect();
    pieces.push(decoder.finish());
    assert_eq!(
        streamed(pieces.iter().map(String::as_str)),
        [
            Delta::Reasoning("The user greets in French; answer «bonjour».".into()),
            Delta::Content("Bonjour ! 😀".into())
        ]
    );
}

//! Prima's tokenizer and chat template on gpt-oss's vocabulary against llama.cpp's.
//!
//! The vocabulary is OpenAI's real `o200k_harmony` (201 088 tokens, byte-level BPE,
//! `tokenizer.ggml.pre = gpt-4o`), written with gpt-oss's chat template by
//! `cargo xtask o200k-vocab` (also run by `test-models`) into the derived-model directory;
//! without it these tests skip unless `PRIMA_REQUIRE_MODELS=1`.
//!
//! Fixtures: `tests/fixtures/tokenizer/gpt-oss.json` holds the ids `llama-tokenize` gives
//! for the shared `corpus.json`, `gpt-oss.extra.json` those for `gpt-oss.corpus.json`
//! (case runs, long numbers, combining marks, harmony markers), and
//! `gpt-oss.pre-granite-embed-multi-97m.json` the shared corpus through the variant of the
//! same split with combining marks inside words (`make_fixtures.py`, run by `cargo xtask
//! reference`). `tests/fixtures/chat/harmony.json` holds conversations (three with tools, a
//! call and its result) rendered by the template under Python's jinja2 as Hugging Face
//! renders it (`make_harmony.py`); those
//! that end in a generation prompt are what llama-server's `/apply-template` (minja)
//! renders too, while for a conversation ending in an assistant message llama-server
//! renders a prefill to continue rather than the template's own ending.

mod common;

use prima_core::chat::{render_chat, ChatMessage, TemplateJson};
use prima_core::gguf::GgufFile;
use prima_core::tokenizer::{TokenKind, Tokenizer, TokenizerParts};
use serde::Deserialize;

fn gpt_oss_parts() -> Option<TokenizerParts> {
    let path = common::model_or_skip(common::derived_models().join("gpt-oss-o200k-vocab.gguf"))?;
    let g = GgufFile::open(&path).expect("open the vocabulary");
    Some(TokenizerParts::from_gguf(&g).expect("tokenizer keys from GGUF"))
}

fn gpt_oss() -> Option<Tokenizer> {
    gpt_oss_parts().map(|p| Tokenizer::from_parts(p).expect("tokenizer from GGUF"))
}

#[test]
fn gpt_oss_ids_match_llama_cpp() {
    let Some(tok) = gpt_oss() else { return };
    let n = common::tokens::check(&tok, "gpt-oss.json", 60);
    let m = common::tokens::check(&tok, "gpt-oss.extra.json", 30);
    eprintln!("gpt-oss: {} fixtures identical to llama.cpp", n + m);
}

#[test]
fn marks_in_words_variant_matches_llama_cpp() {
    let Some(parts) = gpt_oss_parts() else { return };
    let tok = Tokenizer::from_parts(TokenizerParts {
        pre: Some("granite-embed-multi-97m".into()),
        ..parts
    })
    .unwrap();
    let n = common::tokens::check(&tok, "gpt-oss.pre-granite-embed-multi-97m.json", 60);
    eprintln!("granite-embed-multi-97m split: {n} fixtures identical to llama.cpp");
}

#[test]
fn harmony_tokens_end_turns_and_render() {
    let Some(tok) = gpt_oss() else { return };
    let id = |text: &str| {
        let ids = tok.encode(text, false, true);
        assert_eq!(ids.len(), 1, "{text} is one token");
        ids[0]
    };
    assert_eq!(tok.vocab_size(), 201_088);
    assert_eq!(tok.bos(), Some(199_998));
    assert_eq!(tok.eos(), Some(200_002));
    assert!(!tok.add_bos_default());
    assert_eq!(id("<|start|>"), 200_006);
    assert_eq!(id("<|call|>"), 200_012);
    // The assistant's turn ends at <|return|> (its last message) or <|call|> (a tool
    // call); <|end|> closes a message, and the final message may still follow.
    assert!(tok.is_end_of_generation(id("<|return|>")));
    assert!(tok.is_end_of_generation(id("<|call|>")));
    assert!(tok.is_end_of_generation(id("<|endoftext|>")));
    assert!(!tok.is_end_of_generation(id("<|end|>")));
    assert!(!tok.is_end_of_generation(id("<|channel|>")));
    // The message markers are text the reply is read from, as in llama.cpp.
    let reply =
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>4";
    let ids = tok.encode(reply, false, true);
    assert_eq!(tok.decode(&ids), reply);
    for marker in [
        "<|channel|>",
        "<|message|>",
        "<|start|>",
        "<|constrain|>",
        "<|end|>",
    ] {
        assert_eq!(
            tok.token_kind(id(marker)),
            Some(TokenKind::UserDefined),
            "{marker}"
        );
        // User-defined tokens are cut out of text even when specials are not parsed.
        assert_eq!(tok.encode(marker, false, false), [id(marker)], "{marker}");
    }
    assert_eq!(tok.token_kind(id("<|return|>")), Some(TokenKind::Control));
    assert_eq!(tok.decode(&[id("<|return|>")]), "");
}

#[derive(Deserialize)]
struct Conversation {
    messages: Vec<ChatMessage>,
    #[serde(default)]
    tools: Option<TemplateJson>,
    add_generation_prompt: bool,
    date: String,
    text: String,
}

#[test]
fn harmony_template_renders_as_jinja2_does() {
    let Some(tok) = gpt_oss() else { return };
    let path = common::workspace_root().join("tests/fixtures/chat/harmony.json");
    let cases: Vec<Conversation> =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(
        cases.len() >= 5,
        "{}: only {} cases",
        path.display(),
        cases.len()
    );
    let template = tok
        .chat_template()
        .expect("the vocabulary has gpt-oss's template");
    for case in &cases {
        let out = render_chat(
            template,
            &case.messages,
            case.tools.as_ref(),
            case.add_generation_prompt,
            tok.bos_text(),
            tok.eos_text(),
        )
        .unwrap();
        // The template writes today's date; the fixture was rendered on `date`.
        let at = out
            .find("Current date: ")
            .expect("a system message with the date")
            + 14;
        let out = format!("{}{}{}", &out[..at], case.date, &out[at + 10..]);
        assert_eq!(out, case.text, "{:?}", case.messages);
        let ids = tok.encode(&out, tok.add_bos_default(), true);
        assert_eq!(ids[0], 200_006, "the prompt opens with <|start|>");
        if case.add_generation_prompt {
            assert!(out.ends_with("<|start|>assistant"), "{out}");
        }
        assert_eq!(tok.decode_with(&ids, true), out);
    }
    // The conversations with tools: the tools' TypeScript namespace in the developer
    // message, the call on the commentary channel and the tool's answer to the assistant.
    let with_tools: Vec<&Conversation> = cases.iter().filter(|c| c.tools.is_some()).collect();
    assert!(
        with_tools.len() >= 3,
        "{}: no tool conversations",
        path.display()
    );
    for case in &with_tools {
        assert!(case.text.contains(
            "# Tools\n\n## functions\n\nnamespace functions {\n\n// Current weather in a city.\n\
             type get_weather = (_: {\n// The city's name\ncity: string,\n\
             unit?: \"celsius\" | \"fahrenheit\",\ndays?: number,\n}) => any;"
        ));
    }
    assert!(with_tools[1].text.contains(
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>\
         {\"city\": \"Paris\", \"unit\": \"celsius\"}<|call|>\
         <|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
    ));
}

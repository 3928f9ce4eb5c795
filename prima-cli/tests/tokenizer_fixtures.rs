//! Prima's tokenizer against llama.cpp's, on SmolLM2-135M-Instruct's vocabulary.
//!
//! `tests/fixtures/tokenizer/smollm2.json` holds the ids `llama-tokenize` gives for each
//! string of `corpus.json` (regenerate with `make_fixtures.py` next to them). The model
//! file is git-ignored; without it these tests print a note and pass.
//!
//! `smollm2.pre-NAME.json` are the same strings tokenized by llama.cpp with the model's
//! `tokenizer.ggml.pre` swapped for NAME, which checks the other pre-tokenizers on a
//! real vocabulary.

mod common;

use std::path::{Path, PathBuf};

use prima_core::gguf::GgufFile;
use prima_core::tokenizer::{Tokenizer, TokenizerParts};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn fixture_dir() -> PathBuf {
    root().join("tests/fixtures/tokenizer")
}

fn smollm2_parts() -> Option<TokenizerParts> {
    let path = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        eprintln!(
            "note: {} is absent; skipping the tokenizer fixture test",
            path.display()
        );
        return None;
    }
    let g = GgufFile::open(&path).expect("open model");
    Some(TokenizerParts::from_gguf(&g).expect("tokenizer keys from GGUF"))
}

fn smollm2() -> Option<Tokenizer> {
    smollm2_parts().map(|p| Tokenizer::from_parts(p).expect("tokenizer from GGUF"))
}

fn corpus() -> Vec<String> {
    let text = std::fs::read_to_string(fixture_dir().join("corpus.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn ids_match_llama_cpp() {
    let Some(tok) = smollm2() else { return };
    let n = common::tokens::check(&tok, "smollm2.json", 60);
    eprintln!("{n} fixtures identical to llama.cpp");
}

#[test]
fn other_pre_tokenizers_match_llama_cpp() {
    let Some(parts) = smollm2_parts() else { return };
    for pre in ["gpt-2", "llama-bpe", "qwen2", "default"] {
        let tok = Tokenizer::from_parts(TokenizerParts {
            pre: Some(pre.into()),
            ..parts.clone()
        })
        .unwrap();
        let n = common::tokens::check(&tok, &format!("smollm2.pre-{pre}.json"), 60);
        eprintln!("tokenizer.ggml.pre={pre}: {n} fixtures identical to llama.cpp");
    }
}

#[test]
fn decode_inverts_encode() {
    let Some(tok) = smollm2() else { return };
    for text in corpus() {
        // Without parse_special every byte is ordinary text.
        let ids = tok.encode(&text, false, false);
        assert_eq!(tok.decode(&ids), text);
        // With it, control tokens come back when rendered.
        let ids = tok.encode(&text, false, true);
        assert_eq!(tok.decode_with(&ids, true), text);
    }
}

#[test]
fn stream_decoder_yields_whole_characters() {
    let Some(tok) = smollm2() else { return };
    for text in corpus() {
        let ids = tok.encode(&text, false, false);
        let mut dec = tok.stream_decoder();
        let mut out = String::new();
        for &id in &ids {
            // Each piece is a String, so valid UTF-8 by construction; what must not happen
            // is a replacement character standing for half a character.
            let piece = dec.push(id);
            assert!(
                !piece.contains('\u{FFFD}') || text.contains('\u{FFFD}'),
                "{text:?}: {piece:?}"
            );
            out.push_str(&piece);
        }
        out.push_str(&dec.finish());
        assert_eq!(out, text);
    }
}

#[test]
fn smollm2_special_tokens() {
    let Some(tok) = smollm2() else { return };
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos(), Some(2));
    assert!(!tok.add_bos_default());
    assert!(tok.is_end_of_generation(2), "<|im_end|>");
    assert!(tok.is_end_of_generation(0), "<|endoftext|>");
    assert!(!tok.is_end_of_generation(1));
    assert_eq!(tok.eos_text(), "<|im_end|>");
    assert_eq!(tok.token_text(1), Some("<|im_start|>"));
    assert_eq!(
        tok.encode("<|im_start|>user\nhi<|im_end|>", false, true)[0],
        1
    );
    assert!(tok.chat_template().unwrap().contains("<|im_start|>"));
}

#[test]
fn chat_template_from_the_model_renders_chatml() {
    let Some(tok) = smollm2() else { return };
    use prima_core::chat::{render_chat, ChatMessage};
    let out = render_chat(
        tok.chat_template().unwrap(),
        &[ChatMessage::new("user", "What is 2+2?")],
        None,
        true,
        tok.bos_text(),
        tok.eos_text(),
    )
    .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
}

//! Prima's SentencePiece tokenizer against llama.cpp's, on Gemma 3's vocabulary (262 144
//! tokens, `tokenizer.ggml.model = llama`, no space prefix, BOS added).
//!
//! `tests/fixtures/tokenizer/gemma3.json` holds the ids `llama-tokenize` gives for each
//! string of the shared `corpus.json`; `gemma3.extra.json` those for the Gemma-specific
//! strings of `gemma3.corpus.json` (chat markers, byte fallback, `▁` in the input).
//! Regenerate both with `make_fixtures.py` (`--pre-variants none`). The model file is
//! git-ignored; without it these tests print a note and pass.

mod common;

use prima_core::gguf::GgufFile;
use prima_core::tokenizer::{Tokenizer, TokenizerParts};

fn gemma3_parts() -> Option<TokenizerParts> {
    let path = common::workspace_models().join("gemma-3-270m-q4_k_m.gguf");
    let path = common::model_or_skip(path)?;
    let g = GgufFile::open(&path).expect("open model");
    Some(TokenizerParts::from_gguf(&g).expect("tokenizer keys from GGUF"))
}

fn gemma3() -> Option<Tokenizer> {
    gemma3_parts().map(|p| Tokenizer::from_parts(p).expect("tokenizer from GGUF"))
}

#[test]
fn gemma3_ids_match_llama_cpp() {
    let Some(tok) = gemma3() else { return };
    let n = common::tokens::check(&tok, "gemma3.json", 60);
    let m = common::tokens::check(&tok, "gemma3.extra.json", 15);
    eprintln!("gemma3: {} fixtures identical to llama.cpp", n + m);
}

#[test]
fn gemma3_special_tokens_and_bos() {
    let Some(tok) = gemma3() else { return };
    assert_eq!(tok.vocab_size(), 262_144);
    assert_eq!(tok.bos(), Some(2));
    assert_eq!(tok.eos(), Some(1));
    assert!(tok.add_bos_default());
    let end_of_turn = tok.encode("<end_of_turn>", false, true);
    assert_eq!(end_of_turn.len(), 1);
    assert!(tok.is_end_of_generation(end_of_turn[0]));
    assert!(tok.is_end_of_generation(1));
    // BOS is added once, at the front, and rendered as nothing.
    let ids = tok.encode("Hello", true, true);
    assert_eq!(ids[0], 2);
    assert_eq!(tok.decode(&ids), "Hello");
    assert_eq!(tok.decode_with(&ids, true), "<bos>Hello");
}

#[test]
fn gemma3_decode_inverts_encode() {
    let Some(tok) = gemma3() else { return };
    let corpus: Vec<String> = common::tokens::load("gemma3.json")
        .into_iter()
        .chain(common::tokens::load("gemma3.extra.json"))
        .map(|f| f.text)
        .collect();
    for text in corpus {
        // Without parse_special every byte is ordinary text: `▁` and spaces both decode
        // to a space, so only texts without `▁` round-trip exactly.
        let ids = tok.encode(&text, false, false);
        // Rendering special tokens too: plain decoding hides media markers
        // (`<start_of_image>`), which user-defined tokens match even as ordinary text.
        if !text.contains('\u{2581}') {
            assert_eq!(tok.decode_with(&ids, true), text);
        }
        let mut dec = tok.stream_decoder();
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&dec.push(id));
        }
        out.push_str(&dec.finish());
        assert_eq!(out, tok.decode(&ids));
    }
}

#[test]
fn space_prefix_follows_metadata() {
    let Some(parts) = gemma3_parts() else { return };
    let plain = Tokenizer::from_parts(parts.clone()).unwrap();
    let prefixed = Tokenizer::from_parts(TokenizerParts {
        add_space_prefix: Some(true),
        ..parts
    })
    .unwrap();
    // With the prefix, "Hello" is tokenized as " Hello", also after a special token.
    assert_eq!(
        prefixed.encode("Hello", false, true),
        plain.encode(" Hello", false, true)
    );
    let after = prefixed.encode("<start_of_turn>Hello", false, true);
    assert_eq!(&after[1..], &plain.encode(" Hello", false, true)[..]);
}

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
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    text: String,
    ids: Vec<u32>,
    add_bos: bool,
    parse_special: bool,
}

fn gemma3_parts() -> Option<TokenizerParts> {
    let path = common::workspace_models().join("gemma-3-270m-q4_k_m.gguf");
    let path = common::model_or_skip(path)?;
    let g = GgufFile::open(&path).expect("open model");
    Some(TokenizerParts::from_gguf(&g).expect("tokenizer keys from GGUF"))
}

fn gemma3() -> Option<Tokenizer> {
    gemma3_parts().map(|p| Tokenizer::from_parts(p).expect("tokenizer from GGUF"))
}

fn fixtures(file: &str) -> Vec<Fixture> {
    let path = common::workspace_root()
        .join("tests/fixtures/tokenizer")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Compares every fixture of `file` with `tok`; returns how many there were.
fn check_fixtures(tok: &Tokenizer, file: &str, at_least: usize) -> usize {
    let fixtures = fixtures(file);
    assert!(
        fixtures.len() >= at_least,
        "{file}: only {} fixtures",
        fixtures.len()
    );
    let mut failures = Vec::new();
    for f in &fixtures {
        let ids = tok.encode(&f.text, f.add_bos && tok.add_bos_default(), f.parse_special);
        if ids != f.ids {
            failures.push(format!(
                "{:?} (add_bos={}, parse_special={}):\n  llama.cpp {:?}\n  prima     {:?}",
                f.text, f.add_bos, f.parse_special, f.ids, ids
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{file}: {} of {} differ:\n{}",
        failures.len(),
        fixtures.len(),
        failures.join("\n")
    );
    fixtures.len()
}

#[test]
fn gemma3_ids_match_llama_cpp() {
    let Some(tok) = gemma3() else { return };
    let n = check_fixtures(&tok, "gemma3.json", 60);
    let m = check_fixtures(&tok, "gemma3.extra.json", 15);
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
    let corpus: Vec<String> = fixtures("gemma3.json")
        .into_iter()
        .chain(fixtures("gemma3.extra.json"))
        .map(|f| f.text)
        .collect();
    for text in corpus {
        // Without parse_special every byte is ordinary text: `▁` and spaces both decode
        // to a space, so only texts without `▁` round-trip exactly.
        let ids = tok.encode(&text, false, false);
        if !text.contains('\u{2581}') {
            assert_eq!(tok.decode(&ids), text);
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

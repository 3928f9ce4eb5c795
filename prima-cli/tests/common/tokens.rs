//! Tokenizer fixtures from llama.cpp (`tests/fixtures/tokenizer/*.json`) and the check
//! every tokenizer test applies to them.

use prima_core::tokenizer::Tokenizer;
use serde::Deserialize;

/// One string and the ids `llama-tokenize` gave for it.
#[derive(Deserialize)]
pub struct Fixture {
    pub text: String,
    pub ids: Vec<u32>,
    #[serde(default = "yes")]
    pub add_bos: bool,
    #[serde(default = "yes")]
    pub parse_special: bool,
}

fn yes() -> bool {
    true
}

/// The fixtures of `file` under `tests/fixtures/tokenizer/`.
pub fn load(file: &str) -> Vec<Fixture> {
    let path = super::workspace_root()
        .join("tests/fixtures/tokenizer")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Compares every fixture of `file` with `tok` (which must produce llama.cpp's ids exactly)
/// and returns how many there were; fails if there are fewer than `at_least`.
pub fn check(tok: &Tokenizer, file: &str, at_least: usize) -> usize {
    let fixtures = load(file);
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

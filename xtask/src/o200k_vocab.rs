//! gpt-oss's real vocabulary as a vocabulary-only GGUF: `gpt-oss-o200k-vocab.gguf` in the
//! derived-model directory, for the tokenizer and chat-template tests.
//!
//! The ranks of OpenAI's `o200k_base` come from the npm package `js-tiktoken` (its
//! `dist/ranks/o200k_base.js`), its registry tarball fetched into `~/.cache/prima/npm/`; the
//! ranks are checked against the SHA-256 that tiktoken pins for `o200k_base.tiktoken`, so
//! the file is the real vocabulary or nothing. From them this writes what llama.cpp's
//! converter writes for gpt-oss: byte-level token texts, the merges recovered from the
//! ranks (each multi-byte token is split by BPE over the tokens of lower rank, as
//! `convert_hf_to_gguf` does for tiktoken vocabularies), the harmony special tokens of
//! `o200k_harmony` as control tokens up to 201 088, `tokenizer.ggml.pre = gpt-4o`, and
//! the gpt-oss chat template, read from the llama.cpp sdist (`models/templates/
//! openai-gpt-oss-120b.jinja`) so that its text is never committed here. The gpt-oss
//! hyper-parameters are written too so that llama.cpp's loader accepts the file with
//! `vocab_only`.

use std::collections::HashMap;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use prima_core::gguf::{GgufWriter, Value};
use prima_core::tokenizer::byte_to_char;
use sha2::{Digest, Sha256};

use crate::layout::Layout;
use crate::llama_cpp::LlamaCpp;
use crate::shell;

/// The file's name in the derived-model directory.
pub const FILE: &str = "gpt-oss-o200k-vocab.gguf";

const NPM_PACKAGE: &str = "js-tiktoken";
const NPM_VERSION: &str = "1.0.21";
/// SHA-256 of `js-tiktoken-1.0.21.tgz` as the npm registry serves it.
const NPM_TARBALL_SHA256: &str = "3b1f24b185565ca9a8d8f51466dfc4f99d67f1f05bc009258710ddb7a8d810fa";
const RANKS_IN_TARBALL: &str = "package/dist/ranks/o200k_base.js";
/// tiktoken's `expected_hash` for `o200k_base.tiktoken` (`base64 rank` lines).
const O200K_BASE_SHA256: &str = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d";
const TEMPLATE_IN_SDIST: &str = "models/templates/openai-gpt-oss-120b.jinja";

/// gpt-oss's vocabulary size (the embedding's rows): o200k's ranks, then special tokens.
const N_VOCAB: u32 = 201_088;
/// Named special tokens of `o200k_harmony`; every other id from 199 998 on is
/// `<|reserved_ID|>`.
const SPECIALS: &[(u32, &str)] = &[
    (199_998, "<|startoftext|>"),
    (199_999, "<|endoftext|>"),
    (200_002, "<|return|>"),
    (200_003, "<|constrain|>"),
    (200_005, "<|channel|>"),
    (200_006, "<|start|>"),
    (200_007, "<|end|>"),
    (200_008, "<|message|>"),
    (200_012, "<|call|>"),
    (200_018, "<|endofprompt|>"),
];
const BOS: u32 = 199_998;
const EOS: u32 = 200_002;
const PAD: u32 = 199_999;

/// The generator's own text, for the recipe.
const SOURCE: &str = include_str!("o200k_vocab.rs");

/// Makes the vocabulary file unless one with the same recipe exists; returns its path.
pub fn ensure(layout: &Layout) -> Result<PathBuf> {
    let path = layout.derived_models.join(FILE);
    let template_path = LlamaCpp::new(layout).source().join(TEMPLATE_IN_SDIST);
    let template = fs::read_to_string(&template_path).with_context(|| {
        format!(
            "reading gpt-oss's chat template {}",
            template_path.display()
        )
    })?;
    let recipe = format!(
        "xtask/src/o200k_vocab.rs sha256={} {NPM_PACKAGE}@{NPM_VERSION} template sha256={}\n",
        sha256_hex(SOURCE.as_bytes()),
        sha256_hex(template.as_bytes()),
    );
    let recipe_path = path.with_extension("gguf.recipe");
    if path.exists() && fs::read_to_string(&recipe_path).is_ok_and(|r| r == recipe) {
        return Ok(path);
    }
    let ranks = fetch_ranks(layout)?;
    let writer = vocab_gguf(&ranks, template)?;
    fs::create_dir_all(&layout.derived_models)?;
    let tmp = path.with_extension("gguf.tmp");
    writer
        .write(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, &path)?;
    fs::write(&recipe_path, recipe)?;
    println!("made      {}", layout.display(&path));
    Ok(path)
}

/// gpt-oss's fixtures from the vocabulary: `tests/fixtures/tokenizer/gpt-oss*.json`
/// (ids from `llama-tokenize`, through `make_fixtures.py`) and
/// `tests/fixtures/chat/harmony.json` (the template rendered by Python's jinja2).
pub fn fixtures(layout: &Layout, llama: &LlamaCpp) -> Result<()> {
    let vocab = ensure(layout)?;
    let dir = layout.workspace.join("tests/fixtures/tokenizer");
    let runs = [
        // The shared corpus, also through the split with marks inside words.
        ("corpus.json", "gpt-oss.json", "granite-embed-multi-97m"),
        ("gpt-oss.corpus.json", "gpt-oss.extra.json", "none"),
    ];
    for (corpus, out, variants) in runs {
        shell::run(
            Command::new("python3")
                .arg(dir.join("make_fixtures.py"))
                .arg("--llama-tokenize")
                .arg(llama.bin("llama-tokenize"))
                .arg("--model")
                .arg(&vocab)
                .arg("--corpus")
                .arg(dir.join(corpus))
                .arg("--out")
                .arg(dir.join(out))
                .arg("--pre-variants")
                .arg(variants),
        )?;
    }
    let chat = layout.workspace.join("tests/fixtures/chat");
    shell::run(
        Command::new("python3")
            .arg(chat.join("make_harmony.py"))
            .arg("--model")
            .arg(&vocab)
            .arg("--gguf-py")
            .arg(llama.gguf_py())
            .arg("--out")
            .arg(chat.join("harmony.json")),
    )?;
    Ok(())
}

/// o200k_base's tokens in rank order (rank = index), checked against tiktoken's hash.
fn fetch_ranks(layout: &Layout) -> Result<Vec<Vec<u8>>> {
    let dir = layout.cache.join("npm");
    fs::create_dir_all(&dir)?;
    let tarball = dir.join(format!("{NPM_PACKAGE}-{NPM_VERSION}.tgz"));
    if !tarball.exists() {
        // The registry's own tarball (what `npm pack` fetches), read with Python's urllib:
        // a bare machine has Python, not necessarily Node.js, and xtask's HTTP client has
        // no TLS. Written beside and renamed, so a cut download is never taken for one.
        let url =
            format!("https://registry.npmjs.org/{NPM_PACKAGE}/-/{NPM_PACKAGE}-{NPM_VERSION}.tgz");
        let part = tarball.with_extension("tgz.part");
        shell::run(
            Command::new("python3")
                .arg("-c")
                .arg("import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])")
                .arg(&url)
                .arg(&part),
        )
        .with_context(|| format!("downloading {url}"))?;
        fs::rename(&part, &tarball)?;
    }
    let digest = sha256_hex(&fs::read(&tarball)?);
    if digest != NPM_TARBALL_SHA256 {
        bail!(
            "{} has SHA-256 {digest}, expected {NPM_TARBALL_SHA256}; delete it to fetch it again",
            tarball.display()
        );
    }
    let js = shell::output(
        Command::new("tar")
            .arg("-xzOf")
            .arg(&tarball)
            .arg(RANKS_IN_TARBALL),
    )?;
    let ranks = parse_js_ranks(&js)
        .with_context(|| format!("{RANKS_IN_TARBALL} in {}", tarball.display()))?;
    let mut tiktoken = String::new();
    for (rank, token) in ranks.iter().enumerate() {
        tiktoken.push_str(&base64_encode(token));
        tiktoken.push(' ');
        tiktoken.push_str(&rank.to_string());
        tiktoken.push('\n');
    }
    let digest = sha256_hex(tiktoken.as_bytes());
    ensure!(
        digest == O200K_BASE_SHA256,
        "the ranks of {NPM_PACKAGE}@{NPM_VERSION} are not o200k_base (SHA-256 {digest} of the .tiktoken form, expected {O200K_BASE_SHA256})"
    );
    Ok(ranks)
}

/// js-tiktoken's compressed form: `export default {"bpe_ranks": "..."}`, whose lines are
/// `! OFFSET TOKEN TOKEN ...` with base64 tokens ranked OFFSET, OFFSET + 1, ….
fn parse_js_ranks(js: &str) -> Result<Vec<Vec<u8>>> {
    let json = js
        .trim()
        .strip_prefix("export default")
        .context("no `export default`")?
        .trim()
        .trim_end_matches(';');
    let value: serde_json::Value = serde_json::from_str(json).context("not JSON")?;
    let packed = value["bpe_ranks"].as_str().context("no bpe_ranks string")?;
    let mut by_rank: Vec<Option<Vec<u8>>> = Vec::new();
    for line in packed.lines().filter(|l| !l.is_empty()) {
        let mut fields = line.split(' ');
        let _marker = fields.next();
        let offset: usize = fields
            .next()
            .and_then(|f| f.parse().ok())
            .with_context(|| format!("a bpe_ranks line without an offset: {:.40}", line))?;
        for (i, b64) in fields.enumerate() {
            let rank = offset + i;
            if by_rank.len() <= rank {
                by_rank.resize(rank + 1, None);
            }
            by_rank[rank] = Some(base64_decode(b64).with_context(|| format!("rank {rank}"))?);
        }
    }
    by_rank
        .into_iter()
        .enumerate()
        .map(|(rank, t)| t.with_context(|| format!("rank {rank} is missing")))
        .collect()
}

/// The GGUF: gpt-oss's hyper-parameters (for llama.cpp's loader) and its tokenizer.
fn vocab_gguf(ranks: &[Vec<u8>], template: String) -> Result<GgufWriter> {
    let n_ranks = u32::try_from(ranks.len())?;
    ensure!(
        n_ranks == BOS,
        "o200k_base has {n_ranks} ranks, expected {BOS}"
    );
    let mut tokens: Vec<String> = ranks.iter().map(|t| byte_level(t)).collect();
    let mut types = vec![Value::I32(1); ranks.len()];
    for id in n_ranks..N_VOCAB {
        let name = SPECIALS
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, n)| n.to_string())
            .unwrap_or_else(|| format!("<|reserved_{id}|>"));
        tokens.push(name);
        // llama.cpp's token type 3: control.
        types.push(Value::I32(3));
    }
    let merges = recover_merges(ranks)?;

    let mut w = GgufWriter::new();
    let u = Value::U32;
    let a = |k: &str| format!("gpt-oss.{k}");
    // gpt-oss-20b's shape; only the loader reads these.
    w.add("general.architecture", Value::String("gpt-oss".into()))
        .add(
            "general.name",
            Value::String("gpt-oss o200k_harmony vocabulary".into()),
        )
        .add(&a("context_length"), u(131_072))
        .add(&a("embedding_length"), u(2880))
        .add(&a("block_count"), u(24))
        .add(&a("feed_forward_length"), u(2880))
        .add(&a("expert_feed_forward_length"), u(2880))
        .add(&a("expert_count"), u(32))
        .add(&a("expert_used_count"), u(4))
        .add(&a("attention.head_count"), u(64))
        .add(&a("attention.head_count_kv"), u(8))
        .add(&a("attention.key_length"), u(64))
        .add(&a("attention.value_length"), u(64))
        .add(&a("attention.sliding_window"), u(128))
        .add(&a("attention.layer_norm_rms_epsilon"), Value::F32(1e-5))
        .add(&a("rope.freq_base"), Value::F32(150_000.0))
        .add(&a("rope.scaling.type"), Value::String("yarn".into()))
        .add(&a("rope.scaling.factor"), Value::F32(32.0))
        .add(&a("rope.scaling.original_context_length"), u(4096))
        .add("tokenizer.ggml.model", Value::String("gpt2".into()))
        .add("tokenizer.ggml.pre", Value::String("gpt-4o".into()))
        .add(
            "tokenizer.ggml.tokens",
            Value::Array(tokens.into_iter().map(Value::String).collect()),
        )
        .add("tokenizer.ggml.token_type", Value::Array(types))
        .add(
            "tokenizer.ggml.merges",
            Value::Array(merges.into_iter().map(Value::String).collect()),
        )
        .add("tokenizer.ggml.bos_token_id", u(BOS))
        .add("tokenizer.ggml.eos_token_id", u(EOS))
        .add("tokenizer.ggml.padding_token_id", u(PAD))
        .add("tokenizer.chat_template", Value::String(template));
    Ok(w)
}

/// One merge per multi-byte token, in rank order: BPE over the token's bytes using only
/// tokens of lower rank ends in exactly two parts, and those are the merge.
fn recover_merges(ranks: &[Vec<u8>]) -> Result<Vec<String>> {
    let rank_of: HashMap<&[u8], usize> = ranks
        .iter()
        .enumerate()
        .map(|(r, t)| (t.as_slice(), r))
        .collect();
    let mut merges = Vec::with_capacity(ranks.len());
    for (rank, token) in ranks.iter().enumerate() {
        if token.len() < 2 {
            continue;
        }
        // Part i is token[cuts[i]..cuts[i + 1]].
        let mut cuts: Vec<usize> = (0..=token.len()).collect();
        loop {
            let mut best: Option<(usize, usize)> = None;
            for i in 0..cuts.len() - 2 {
                if let Some(&r) = rank_of.get(&token[cuts[i]..cuts[i + 2]]) {
                    if r < rank && best.is_none_or(|(_, b)| r < b) {
                        best = Some((i, r));
                    }
                }
            }
            let Some((i, _)) = best else { break };
            cuts.remove(i + 1);
        }
        ensure!(
            cuts.len() == 3,
            "token of rank {rank} does not split into two lower-ranked tokens ({} parts)",
            cuts.len() - 1
        );
        merges.push(format!(
            "{} {}",
            byte_level(&token[..cuts[1]]),
            byte_level(&token[cuts[1]..])
        ));
    }
    Ok(merges)
}

/// GPT-2's byte-level text of raw token bytes.
fn byte_level(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_to_char(b)).collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn base64_decode(text: &str) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.bytes().filter(|&c| c != b'=') {
        let v = B64
            .iter()
            .position(|&b| b == c)
            .with_context(|| format!("'{}' is not base64", c as char))?;
        acc = acc << 6 | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        for bytes in [&b""[..], b"!", b"ab", b"abc", b"\xff\x00\x10\x80"] {
            assert_eq!(base64_decode(&base64_encode(bytes)).unwrap(), bytes);
        }
        assert_eq!(base64_encode(b"!"), "IQ==");
        assert_eq!(base64_decode("IGNvbnRy").unwrap(), b" contr");
    }

    #[test]
    fn merges_follow_ranks() {
        let ranks: Vec<Vec<u8>> = ["a", "b", "c", "ab", "abc", "bc"]
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .collect();
        assert_eq!(recover_merges(&ranks).unwrap(), ["a b", "ab c", "b c"]);
    }

    #[test]
    fn js_ranks_parse() {
        let js = "export default {\"pat_str\":\"x\",\"bpe_ranks\":\"! 0 IQ== Ig==\\n! 2 Iw==\"};";
        assert_eq!(
            parse_js_ranks(js).unwrap(),
            [b"!".to_vec(), b"\"".to_vec(), b"#".to_vec()]
        );
    }
}

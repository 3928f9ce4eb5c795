//! `cargo xtask reference [--fixtures-only]`: regenerate the golden fixtures
//! from llama.cpp.
//!
//! - `tests/fixtures/generation/<tag>.json` for every catalogue model: logits
//!   and greedy continuations recorded by `xtask/reference/dump_logits.c`
//!   (schema in [`write_fixture`]).
//! - `tests/fixtures/tokenizer/smollm2.json`, through that directory's own
//!   `make_fixtures.py`, when it exists; gpt-oss's tokenizer and chat fixtures
//!   ([`crate::o200k_vocab::fixtures`]).
//!
//! `--only TEXT` limits the run to generation fixtures whose model tag
//! contains TEXT (and skips the tokenizer fixture).
//!
//! Without `--fixtures-only` it first makes sure llama.cpp is built and every
//! model exists (`test-models`); with it, it only checks that they do.

use std::fmt::Write as _;
use std::fs;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::catalogue::{ModelSpec, MODELS, SMOLLM2_Q4_1};
use crate::digest;
use crate::fixture_cases::{self, Case, Prompt};
use crate::layout::Layout;
use crate::llama_cpp::{LlamaCpp, Version};
use crate::shell;
use crate::test_models;

pub const SCHEMA: u32 = 1;
/// One thread: results do not depend on it, and OpenMP spinning on a busy
/// 2-core machine made two threads several times slower.
const THREADS: u32 = 1;
const N_PREDICT: u32 = 64;
const TOP_K: u32 = 40;
const N_CTX: u32 = 512;

/// Fields of one case, in the order the dump tool prints them.
const CASE_FIELDS: &[&str] = &[
    "prompt_ids",
    "top_logits",
    "sampled_logits",
    "greedy",
    "greedy_gaps",
];

pub fn run(layout: &Layout, fixtures_only: bool, only: Option<&str>) -> Result<()> {
    let llama = LlamaCpp::new(layout);
    if fixtures_only {
        llama.require_built()?;
        test_models::require_all(layout)?;
    } else {
        test_models::run(layout)?;
    }
    let tool = llama.ensure_dump_tool()?;
    let version = llama.version()?;
    fs::create_dir_all(layout.generation_fixtures())?;
    for spec in MODELS
        .iter()
        .filter(|m| only.is_none_or(|o| m.tag.contains(o)))
    {
        let started = Instant::now();
        let out = layout
            .generation_fixtures()
            .join(format!("{}.json", spec.tag));
        let text = fixture(layout, spec, &tool, &version)?;
        fs::write(&out, &text).with_context(|| format!("writing {}", out.display()))?;
        println!(
            "wrote     {} ({} KiB, {:.1?})",
            layout.display(&out),
            text.len() / 1024,
            started.elapsed()
        );
    }
    if only.is_some() {
        return Ok(());
    }
    tokenizer_fixture(layout, &llama)?;
    crate::o200k_vocab::fixtures(layout, &llama)
}

fn fixture(
    layout: &Layout,
    spec: &ModelSpec,
    tool: &std::path::Path,
    version: &Version,
) -> Result<String> {
    let model = spec.path(layout);
    let cases = fixture_cases::for_model(spec);
    let stride = fixture_cases::sample_stride(spec);
    let mut cmd = Command::new(tool);
    cmd.arg("-m").arg(&model);
    for (flag, value) in [
        ("-t", THREADS),
        ("-n", N_PREDICT),
        ("-k", TOP_K),
        ("-s", stride),
        ("-c", N_CTX),
    ] {
        cmd.args([flag, &value.to_string()]);
    }
    for case in &cases {
        match &case.prompt {
            Prompt::Text(text) => cmd.args(["-p", text]),
            Prompt::Ids(ids) => cmd.args(["-i", &join_ids(ids)]),
        };
    }
    let stdout = shell::output(&mut cmd)?;
    let results: Vec<Value> = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing the output of `{}`", shell::describe(&cmd)))?;
    anyhow::ensure!(
        results.len() == cases.len(),
        "`{}` printed {} results for {} cases",
        shell::describe(&cmd),
        results.len(),
        cases.len()
    );
    let header = Header {
        sha256: digest::file_sha256(&model)?,
        version,
        command: format!(
            "dump_logits -m {} -t {THREADS} -n {N_PREDICT} -k {TOP_K} -s {stride} -c {N_CTX} \
             (-p PROMPT | -i IDS) per case",
            layout.display(&model)
        ),
        stride,
        n_vocab: results[0]["n_vocab"].clone(),
    };
    write_fixture(spec, &header, &cases, &results)
}

/// What a fixture records besides its cases.
struct Header<'a> {
    sha256: String,
    version: &'a Version,
    command: String,
    stride: u32,
    n_vocab: Value,
}

/// Fixture schema 1 (one JSON object):
///
/// - `schema`: 1.
/// - `model`: `tag`; `file` (file name); `location`: `"workspace-models"`
///   (`<workspace>/models/`) or `"derived-models"` (`$PRIMA_MODEL_DIR`, default
///   `~/.cache/prima/models/`); `sha256` of the file the fixture was made from.
/// - `reference`: llama.cpp `sdist`, `commit`, `ggml` version, `cmake_flags`,
///   `tool` (source of the dump tool), `command`, `regenerate`.
/// - `settings`: `n_ctx`, `n_predict`, `top_k`, `sample_stride`, `threads`,
///   `kv_cache_type` ("f16"), `flash_attention` (false), `add_special`,
///   `parse_special` (both true; text prompts only), `stop_at_eog` (false:
///   greedy runs on through end-of-generation tokens).
/// - `n_vocab`: logits per position.
/// - `cases[]`: `name`; `prompt` (text, or null for id prompts);
///   `prompt_ids` (llama.cpp's tokenization, or the given ids); `top_logits`
///   (`[id, logit]` × top_k at the last prompt position, logit descending, ties
///   by lower id); `sampled_logits` (`[id, logit]` for ids 0, stride, 2·stride,
///   … < n_vocab, same position); `greedy` (n_predict argmax ids, lowest id on
///   ties; `greedy[0]` is `top_logits[0][0]`); `greedy_gaps` (per greedy step,
///   top-1 minus top-2 logit).
fn write_fixture(
    spec: &ModelSpec,
    header: &Header,
    cases: &[Case],
    results: &[Value],
) -> Result<String> {
    let version = header.version;
    let fields = [
        ("schema", json!(SCHEMA)),
        (
            "model",
            json!({
                "tag": spec.tag,
                "file": spec.file,
                "location": spec.location(),
                "sha256": header.sha256,
            }),
        ),
        (
            "reference",
            json!({
                "implementation": "llama.cpp",
                "sdist": version.sdist,
                "commit": version.commit,
                "ggml": version.ggml,
                "cmake_flags": version.cmake_flags,
                "tool": "xtask/reference/dump_logits.c",
                "command": header.command,
                "regenerate": "cargo xtask reference --fixtures-only",
            }),
        ),
        (
            "settings",
            json!({
                "n_ctx": N_CTX,
                "n_predict": N_PREDICT,
                "top_k": TOP_K,
                "sample_stride": header.stride,
                "threads": THREADS,
                "kv_cache_type": "f16",
                "flash_attention": false,
                "add_special": true,
                "parse_special": true,
                "stop_at_eog": false,
            }),
        ),
        ("n_vocab", header.n_vocab.clone()),
    ];
    // One line per header key and per case field keeps diffs readable and
    // files small.
    let mut out = String::from("{\n");
    for (key, value) in fields {
        writeln!(out, "  {}: {},", json!(key), value)?;
    }
    out.push_str("  \"cases\": [\n");
    for (i, (case, result)) in cases.iter().zip(results).enumerate() {
        let prompt = match &case.prompt {
            Prompt::Text(text) => json!(text),
            Prompt::Ids(_) => Value::Null,
        };
        writeln!(out, "    {{\n      \"name\": {},", json!(case.name))?;
        writeln!(out, "      \"prompt\": {prompt},")?;
        for (j, field) in CASE_FIELDS.iter().enumerate() {
            let value = result
                .get(*field)
                .with_context(|| format!("the dump tool printed no {field}"))?;
            let comma = if j + 1 < CASE_FIELDS.len() { "," } else { "" };
            writeln!(out, "      {}: {value}{comma}", json!(field))?;
        }
        let comma = if i + 1 < cases.len() { "," } else { "" };
        writeln!(out, "    }}{comma}")?;
    }
    out.push_str("  ]\n}\n");
    Ok(out)
}

/// The tokenizer engineer's generator, driven with llama.cpp's llama-tokenize.
fn tokenizer_fixture(layout: &Layout, llama: &LlamaCpp) -> Result<()> {
    let dir = layout.workspace.join("tests/fixtures/tokenizer");
    let script = dir.join("make_fixtures.py");
    if !script.exists() {
        println!(
            "skipped   tokenizer fixture ({} not found)",
            layout.display(&script)
        );
        return Ok(());
    }
    let out = dir.join("smollm2.json");
    let model = crate::catalogue::by_tag(SMOLLM2_Q4_1).path(layout);
    shell::run(
        Command::new("python3")
            .arg(&script)
            .arg("--llama-tokenize")
            .arg(llama.bin("llama-tokenize"))
            .arg("--model")
            .arg(model)
            .arg("--out")
            .arg(&out),
    )?;
    println!("wrote     {}", layout.display(&out));
    Ok(())
}

fn join_ids(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

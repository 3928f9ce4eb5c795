//! Gemma 3 and Qwen 3 against llama.cpp: the same checks as `golden_generation.rs`
//! (prompt token ids identical, last-position logits within the tolerance of the weight
//! format, teacher-forced greedy agreement wherever llama.cpp's own top-2 gap exceeds the
//! noise), on Gemma 3 270M Q4_K_M (`cargo xtask fetch-models`) and tiny random-weight
//! `gemma3` and `qwen3` models (`cargo xtask test-models`). The real model's prompts are
//! shorter than its 512-token window, so the tiny Gemma (window 8) is what checks
//! sliding-window attention against llama.cpp. The checking code is a copy of that file's,
//! so both read the same fixture schema and apply the same tolerances.

mod common;

use std::path::PathBuf;

use prima_core::model::{Model, Session};
use prima_core::tokenizer::Tokenizer;
use serde_json::Value;

/// (max |Δlogit|, top-2 gap above which the greedy token must agree) per weight format.
///
/// F32 Gemma gets 5e-3 instead of 2e-3: ggml's GeGLU rounds the gate to f16 and reads
/// GELU from an f16 table, while the CPU backend computes tanh in f32. Measured on
/// tiny-gemma3-f32: 2.1e-3 with the backend's GeGLU, 3.8e-4 when the same f16 rounding
/// is emulated — the rest of the layer agrees as closely as the other F32 models.
fn tolerances(tag: &str) -> (f32, f32) {
    if tag.contains("gemma3") && tag.ends_with("-f32") {
        (5e-3, 0.0)
    } else if tag.ends_with("-f32") {
        (2e-3, 0.0)
    } else if tag.ends_with("-f16") {
        (0.2, 0.2)
    } else {
        (1.5, 1.0)
    }
}

struct Case {
    name: String,
    prompt: Option<String>,
    prompt_ids: Vec<u32>,
    logits: Vec<(u32, f32)>,
    greedy: Vec<u32>,
    gaps: Vec<f32>,
}

fn load_fixture(file: &str) -> (Value, Vec<Case>) {
    let path = common::workspace_root()
        .join("tests/fixtures/generation")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: Value = serde_json::from_str(&text).unwrap();
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let pairs = |v: &Value| -> Vec<(u32, f32)> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap() as f32))
            .collect()
    };
    let cases = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_string(),
            prompt: c["prompt"].as_str().map(str::to_string),
            prompt_ids: ids(&c["prompt_ids"]),
            logits: pairs(&c["top_logits"])
                .into_iter()
                .chain(pairs(&c["sampled_logits"]))
                .collect(),
            greedy: ids(&c["greedy"]),
            gaps: c["greedy_gaps"]
                .as_array()
                .map(|g| g.iter().map(|x| x.as_f64().unwrap() as f32).collect())
                .unwrap_or_default(),
        })
        .collect();
    (v, cases)
}

fn model_path(fixture: &Value) -> PathBuf {
    let file = fixture["model"]["file"].as_str().unwrap();
    match fixture["model"]["location"].as_str() {
        Some("workspace-models") => common::workspace_models().join(file),
        _ => common::derived_models().join(file),
    }
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Runs every case of one fixture file against the model it names.
fn check_fixture(file: &str) {
    let (fixture, cases) = load_fixture(file);
    let Some(path) = common::model_or_skip(model_path(&fixture)) else {
        return;
    };
    let tag = fixture["model"]["tag"].as_str().unwrap_or(file);
    let (logit_tol, gap_tol) = tolerances(tag);
    let model = Model::load(&path).unwrap();
    let tokenizer = Tokenizer::from_gguf(model.gguf()).unwrap();
    let backend = common::cpu_backend(2);

    let mut worst = 0.0f32;
    let mut failures = Vec::new();
    let mut report = Vec::new();
    for case in &cases {
        if let Some(text) = &case.prompt {
            let ids = tokenizer.encode(text, tokenizer.add_bos_default(), true);
            assert_eq!(
                ids, case.prompt_ids,
                "{file} / {}: prompt token ids differ",
                case.name
            );
        }
        let mut session = Session::new(&model, &backend.backend, 512, 512).unwrap();
        let mut logits = session.eval(&case.prompt_ids).unwrap().to_vec();
        let max_diff = case
            .logits
            .iter()
            .map(|&(id, want)| (logits[id as usize] - want).abs())
            .fold(0.0f32, f32::max);
        worst = worst.max(max_diff);
        if max_diff > logit_tol {
            failures.push(format!(
                "{}: last-position logits differ by up to {max_diff} (tolerance {logit_tol})",
                case.name
            ));
        }

        // Teacher-forced: llama.cpp's token is fed back at every step, so one near-tie does
        // not derail the rest of the comparison.
        let mut identical_prefix = None;
        let mut agree = 0;
        for (step, &want) in case.greedy.iter().enumerate() {
            let got = argmax(&logits);
            let gap = case.gaps.get(step).copied().unwrap_or(f32::INFINITY);
            if got == want {
                agree += 1;
            } else {
                identical_prefix.get_or_insert(step);
                if gap > gap_tol {
                    failures.push(format!(
                        "{}: greedy step {step}: Prima picks {got}, llama.cpp {want}, whose top-2 gap there is {gap} (> {gap_tol})",
                        case.name
                    ));
                }
            }
            if step + 1 < case.greedy.len() {
                logits.copy_from_slice(session.eval(&[want]).unwrap());
            }
        }
        let same = identical_prefix.unwrap_or(case.greedy.len());
        report.push(format!(
            "{}:{same}/{} (teacher-forced {agree}/{})",
            case.name,
            case.greedy.len(),
            case.greedy.len()
        ));
    }
    eprintln!(
        "{file}: worst last-position |Δlogit| {worst:.2e} (tolerance {logit_tol}); identical greedy prefix per case: {}",
        report.join(" ")
    );
    assert!(failures.is_empty(), "{file}:\n{}", failures.join("\n"));
}

#[test]
fn gemma3_270m_q4_k_m() {
    check_fixture("gemma-3-270m-q4_k_m.json");
}

/// Random weights, F32: layer 0 local (8-token window, RoPE base 2e4), layer 1 global;
/// the 40-token case runs far past the window.
#[test]
fn tiny_gemma3_f32() {
    check_fixture("tiny-gemma3-f32.json");
}

#[test]
fn tiny_qwen3_f32() {
    check_fixture("tiny-qwen3-f32.json");
}

/// Gemma 3's layer pattern and RoPE bases come from metadata: 18 layers, every sixth
/// global, local layers with a 512-token window and base 10 000, global ones 1e6.
#[test]
fn gemma3_hyper_parameters() {
    let Some(path) =
        common::model_or_skip(common::workspace_models().join("gemma-3-270m-q4_k_m.gguf"))
    else {
        return;
    };
    let model = Model::load(&path).unwrap();
    let hp = model.hparams();
    assert_eq!((hp.n_layers, hp.n_embd, hp.head_dim_k), (18, 640, 256));
    assert_eq!(hp.sliding_window, 512);
    let globals: Vec<usize> = (0..hp.n_layers).filter(|&il| !hp.is_local(il)).collect();
    assert_eq!(globals, [5, 11, 17]);
    assert_eq!(hp.rope_freq_base, 1_000_000.0);
    assert_eq!(hp.rope_freq_base_local, 10_000.0);
    assert_eq!(hp.attention_scale, 1.0 / 16.0);
}

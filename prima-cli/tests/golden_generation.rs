//! Prima against llama.cpp on real and derived models (SmolLM2 in every format, Gemma 3
//! 270M, tiny random llama / qwen2 / qwen3 / gemma3 / qwen3moe models): the same prompt token ids, the
//! last-position logits within a stated tolerance, and the same greedy tokens.
//!
//! Fixtures come from `cargo xtask reference` (llama.cpp built from the llama-cpp-python
//! sdist, driven by our own `xtask/reference/dump_logits.c`).
//!
//! Tolerances, and why they differ by weight format:
//! - F32 weights: activations stay f32, only float summation order differs, so logits agree
//!   to ~1e-4 and greedy continuations must be identical token for token.
//! - Quantized weights: llama.cpp and Prima both round every activation vector to 8-bit
//!   (Q8_0/Q8_1/Q8_K) before each product. That rounding is discontinuous, so a difference
//!   in the last float bit (summation order, exp implementation) flips some 8-bit values and
//!   the flip propagates through 30 layers. Measured: perturbing 1/7 of the input embedding
//!   by 1e-6 (relative) moves Prima's own SmolLM2 Q4_1 logits by up to 1.06; and llama.cpp
//!   itself, built for AVX2 instead of AVX-512 from the same source, differs from its
//!   AVX-512 build by up to 0.59 on these prompts and its greedy continuations diverge
//!   after 5–32 tokens on 6 of 8 of them (Q2_K: 1.12, and divergence after 0–20 tokens).
//!   No independent implementation can get closer than that without copying llama.cpp's
//!   exact float operation order, so the bound is 2.0 max-abs, about twice the reference's
//!   own cross-build noise. Greedy decoding is checked teacher-forced (llama.cpp's tokens are fed back)
//!   and must pick llama.cpp's token at every step where llama.cpp's own top-2 gap exceeds
//!   that noise; the free-running identical prefix is reported.

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
        (2.0, 1.0)
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
        let n = case.greedy.len();
        report.push(format!(
            "{}:{same}/{n} (teacher-forced {agree}/{n})",
            case.name
        ));
    }
    eprintln!(
        "{file}: worst last-position |Δlogit| {worst:.2e} (tolerance {logit_tol}); identical greedy prefix per case: {}",
        report.join(" ")
    );
    assert!(failures.is_empty(), "{file}:\n{}", failures.join("\n"));
}

macro_rules! golden {
    ($($name:ident => $file:literal,)*) => {
        $(
            #[test]
            fn $name() {
                check_fixture($file);
            }
        )*
    };
}

golden! {
    smollm2_q4_1 => "smollm2-135m-q4_1.json",
    smollm2_q4_0 => "smollm2-135m-q4_0.json",
    smollm2_q5_0 => "smollm2-135m-q5_0.json",
    smollm2_q5_1 => "smollm2-135m-q5_1.json",
    smollm2_q8_0 => "smollm2-135m-q8_0.json",
    smollm2_q2_k => "smollm2-135m-q2_k.json",
    smollm2_q3_k_m => "smollm2-135m-q3_k_m.json",
    smollm2_q4_k_m => "smollm2-135m-q4_k_m.json",
    smollm2_q5_k_m => "smollm2-135m-q5_k_m.json",
    smollm2_q6_k => "smollm2-135m-q6_k.json",
    smollm2_f16 => "smollm2-135m-f16.json",
    smollm2_iq4_nl => "smollm2-135m-iq4_nl.json",
    // IQ4_XS where rows are whole super-blocks (ffn_down), IQ4_NL elsewhere (576 columns).
    smollm2_iq4_xs => "smollm2-135m-iq4_xs.json",
    tiny_qwen2_f32 => "tiny-qwen2-f32.json",
    tiny_qwen2_f16 => "tiny-qwen2-f16.json",
    tiny_llama_f32 => "tiny-llama-f32.json",
    tiny_llama_q2_k => "tiny-llama-q2_k.json",
    tiny_llama_q3_k => "tiny-llama-q3_k.json",
    tiny_llama_q4_k => "tiny-llama-q4_k.json",
    tiny_llama_q5_k => "tiny-llama-q5_k.json",
    tiny_llama_q6_k => "tiny-llama-q6_k.json",
    gemma3_270m_q4_k_m => "gemma-3-270m-q4_k_m.json",
    // Random weights, F32: layer 0 local (8-token window, RoPE base 2e4), layer 1 global;
    // the 40-token case runs far past the window, so sliding-window attention is checked.
    tiny_gemma3_f32 => "tiny-gemma3-f32.json",
    tiny_qwen3_f32 => "tiny-qwen3-f32.json",
    // qwen3moe, random weights with a skewed router (xtask/src/random_moe.rs): 8 experts
    // top-2 and 16 experts top-4, F32 and llama-quantize's Q8_0 and Q4_K_M.
    tiny_qwen3moe_8x2_f32 => "tiny-qwen3moe-8x2-f32.json",
    tiny_qwen3moe_8x2_q8_0 => "tiny-qwen3moe-8x2-q8_0.json",
    tiny_qwen3moe_8x2_q4_k_m => "tiny-qwen3moe-8x2-q4_k_m.json",
    tiny_qwen3moe_16x4_f32 => "tiny-qwen3moe-16x4-f32.json",
    tiny_qwen3moe_16x4_q8_0 => "tiny-qwen3moe-16x4-q8_0.json",
    tiny_qwen3moe_16x4_q4_k_m => "tiny-qwen3moe-16x4-q4_k_m.json",
}

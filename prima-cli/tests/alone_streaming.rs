//! A device alone whose weights do not fit its memory budget streams layers — and computes
//! exactly what it computes with everything resident: the page hints change which pages
//! are in memory, never the bytes read.

mod common;

use std::process::Command;

use common::{cpu_backend, model_or_skip, workspace_models};
use prima_cluster::prp::alone::LocalSession;
use prima_cluster::prp::protocol::{ReleaseMethod, ReleasePolicy};
use prima_cluster::prp::residency::Residency;
use prima_core::generate::Forward;
use prima_core::model::{Model, Session};
use prima_core::tokenizer::Tokenizer;

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Greedy tokens and every step's logits, bit for bit.
fn greedy<F: Forward>(f: &mut F, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>)
where
    F::Error: std::fmt::Debug,
{
    let argmax = |l: &[f32]| {
        (0..l.len())
            .max_by(|&a, &b| l[a].total_cmp(&l[b]).then(b.cmp(&a)))
            .unwrap() as u32
    };
    let mut logits = f.eval(prompt).unwrap().to_vec();
    let (mut tokens, mut all) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = argmax(&logits);
        tokens.push(t);
        all.push(logits);
        logits = f.eval(&[t]).unwrap().to_vec();
    }
    (tokens, all)
}

#[test]
fn a_plan_alone_keeps_the_first_layers_and_streams_the_rest_in_chunks() {
    let Some(path) = model_or_skip(workspace_models().join(MODEL)) else {
        return;
    };
    let model = Model::load(&path).unwrap();
    let n = model.hparams().n_layers;
    let layers: u64 = (0..n).map(|il| model.layer_bytes(il)).sum();
    let total = model.global_bytes() + layers;
    let plan = |budget| {
        Residency::plan_alone(
            &model,
            budget,
            true,
            ReleasePolicy::Mru,
            ReleaseMethod::Pageout,
        )
    };

    assert!(!plan(total).streams(), "a budget of the whole model fits");
    let tight = plan(total - 1);
    assert!(tight.streams());
    let w = tight.windows();
    // One resident window of the first layers, then streamed chunks up to the last layer.
    assert!(w[0].fully_resident() && w[0].layers.start == 0);
    assert!(w[1..].iter().all(|c| !c.fully_resident()));
    assert_eq!(w.last().unwrap().layers.end, n);
    assert!(w.windows(2).all(|p| p[0].layers.end == p[1].layers.start));
    // The embedding and output head count against the budget: a budget of the layers
    // alone cannot hold them all.
    assert!(plan(layers).streams());
}

#[test]
fn streaming_alone_computes_the_same_logits_as_a_resident_session() {
    let Some(path) = model_or_skip(workspace_models().join(MODEL)) else {
        return;
    };
    let model = Model::load(&path).unwrap();
    let backend = cpu_backend(2);
    let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
    // Longer than a batch, so prompts go through the chunks more than once.
    let prompt = tok.encode(
        "The printing press spread across Europe within decades, and books became cheap.",
        true,
        true,
    );
    let (n_ctx, n_batch) = (128, 8);
    assert!(prompt.len() > n_batch);

    let mut plain = Session::new(&model, &backend.backend, n_ctx, n_batch).unwrap();
    let expected = greedy(&mut plain, &prompt, 12);
    // Nothing resident but the embedding and output head; then half the layers.
    for budget in [1, model.global_bytes() + model.layer_bytes(0) * 15] {
        for release in [ReleasePolicy::Mru, ReleasePolicy::None] {
            let residency =
                Residency::plan_alone(&model, budget, true, release, ReleaseMethod::Pageout);
            assert!(residency.streams());
            residency.warm(&model);
            let session = Session::new(&model, &backend.backend, n_ctx, n_batch).unwrap();
            let mut local = LocalSession::new(session, Some(residency));
            assert!(local.residency().is_some());
            assert!(
                greedy(&mut local, &prompt, 12) == expected,
                "budget {budget}, release {release:?}: the logits differ"
            );
        }
    }
}

/// `prima run` with greedy sampling; returns (stdout, stderr).
fn prima_run(model: &std::path::Path, budget: &str) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_prima"))
        .args(["run", "-m"])
        .arg(model)
        .args(["-p", "The capital of France is", "-n", "24", "--temp", "0"])
        .args(["-c", "256", "--mem-budget", budget])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "--mem-budget {budget}: {stderr}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

#[test]
fn prima_run_under_a_small_budget_gives_the_same_greedy_tokens() {
    let Some(path) = model_or_skip(workspace_models().join(MODEL)) else {
        return;
    };
    let (expected, quiet) = prima_run(&path, "none");
    assert!(
        !quiet.contains("memory:"),
        "nothing streamed, nothing said: {quiet}"
    );
    for budget in ["40M", "60M"] {
        let (text, stderr) = prima_run(&path, budget);
        assert_eq!(text, expected, "--mem-budget {budget}");
        let decided = stderr.lines().find(|l| l.starts_with("memory:"));
        let decided = decided.unwrap_or_else(|| panic!("no decision on stderr: {stderr}"));
        assert!(
            decided.contains("--mem-budget") && decided.contains("streamed in"),
            "{decided}"
        );
    }
}

//! Speculative decoding with real models: SmolLM2-135M Q4_1 (and Q2_K) drafting for its
//! F16 conversion. Greedy text with a draft is the text without one, on one device and on
//! a 3-device loopback ring; a seed gives one sampled text; a draft with another
//! vocabulary is refused, by the library and by `prima run`.

mod common;

use std::ops::ControlFlow;
use std::process::Command;

use common::{cpu_backend, derived_models, model_or_skip, workspace_models, Node};
use prima_cluster::prp::{RingHead, RingOptions};
use prima_core::generate::{generate, GenerateOptions, RowLogits};
use prima_core::model::{Model, Session};
use prima_core::sampler::{Sampler, SamplerConfig};
use prima_core::speculative::{
    check_vocabularies, generate_speculative, DraftOptions, DraftStats, VocabularyMismatch,
};
use prima_core::tokenizer::Tokenizer;

const N_CTX: usize = 256;
const N_BATCH: usize = 64;

fn prompts(tok: &Tokenizer) -> Vec<Vec<u32>> {
    [
        "The capital of France is",
        "Here is a short story about a robot who learns to paint. Once upon a time,",
        "def fibonacci(n):",
    ]
    .iter()
    .map(|p| tok.encode(p, true, true))
    .collect()
}

fn greedy() -> Sampler {
    Sampler::new(SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    })
}

fn options(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        ignore_eos: true,
    }
}

fn with_draft<F: RowLogits>(
    target: &mut F,
    draft: &mut Session<'_>,
    tok: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    max_tokens: usize,
    draft_options: DraftOptions,
) -> (Vec<u32>, DraftStats)
where
    F::Error: std::fmt::Debug,
{
    target.truncate(0).unwrap();
    draft.truncate(0).unwrap();
    let (tokens, _, stats) = generate_speculative(
        target,
        draft,
        tok,
        sampler,
        prompt,
        options(max_tokens),
        draft_options,
        |_| ControlFlow::Continue(()),
    )
    .unwrap();
    (tokens, stats)
}

#[test]
fn greedy_text_with_a_draft_is_the_text_without_one() {
    let Some((target_path, draft_path)) = common::draft_pair() else {
        return;
    };
    let q2k = model_or_skip(derived_models().join("smollm2-135m-q2_k.gguf"));
    let backend = cpu_backend(2);
    let be = &backend.backend;
    let target_model = Model::load(&target_path).unwrap();
    let tok = Tokenizer::from_gguf(target_model.gguf()).unwrap();
    let mut target = Session::new(&target_model, be, N_CTX, N_BATCH).unwrap();
    let mut drafts = vec![Model::load(&draft_path).unwrap()];
    drafts.extend(q2k.map(|p| Model::load(&p).unwrap()));
    for prompt in prompts(&tok) {
        target.truncate(0).unwrap();
        let (want, _) = generate(
            &mut target,
            &tok,
            &mut greedy(),
            &prompt,
            options(40),
            |_| ControlFlow::Continue(()),
        )
        .unwrap();
        for draft_model in &drafts {
            let mut draft = Session::new(draft_model, be, N_CTX, N_BATCH).unwrap();
            for draft_options in [DraftOptions::default(), DraftOptions { max: 3, p_min: 0.0 }] {
                let (got, stats) = with_draft(
                    &mut target,
                    &mut draft,
                    &tok,
                    &mut greedy(),
                    &prompt,
                    40,
                    draft_options,
                );
                eprintln!(
                    "draft {:?} {draft_options:?}: accepted {}/{} ({:.0}%), {} target evaluations",
                    draft_model.gguf().path().file_name().unwrap_or_default(),
                    stats.accepted,
                    stats.drafted,
                    stats.acceptance() * 100.0,
                    stats.target_evals
                );
                assert_eq!(
                    tok.decode(&got),
                    tok.decode(&want),
                    "{draft_options:?}, prompt {prompt:?}"
                );
                assert_eq!(got, want);
                assert!(stats.drafted > 0 && stats.target_evals < 39, "{stats:?}");
            }
        }
    }
}

#[test]
fn a_ring_with_a_draft_generates_what_one_device_does() {
    let Some((target_path, draft_path)) = common::draft_pair() else {
        return;
    };
    let backend = cpu_backend(1);
    let be = &backend.backend;
    let target_model = Model::load(&target_path).unwrap();
    let draft_model = Model::load(&draft_path).unwrap();
    let tok = Tokenizer::from_gguf(target_model.gguf()).unwrap();
    let prompt = &prompts(&tok)[1];
    let mut single = Session::new(&target_model, be, N_CTX, N_BATCH).unwrap();
    let (want, _) = generate(
        &mut single,
        &tok,
        &mut greedy(),
        prompt,
        options(32),
        |_| ControlFlow::Continue(()),
    )
    .unwrap();
    drop(single);

    let transport = common::tcp_transport();
    let nodes = [Node::start(&target_path), Node::start(&target_path)];
    let addrs: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
    let mut head = RingHead::connect(
        &target_model,
        be,
        &transport.transport,
        &addrs,
        &[10, 10, 10],
        &RingOptions {
            n_ctx: N_CTX,
            n_batch: N_BATCH,
            listen: "127.0.0.1:0".into(),
            security: common::test_security(),
            ..RingOptions::default()
        },
    )
    .unwrap();
    let mut draft = Session::new(&draft_model, be, N_CTX, N_BATCH).unwrap();
    let (got, stats) = with_draft(
        &mut head,
        &mut draft,
        &tok,
        &mut greedy(),
        prompt,
        32,
        DraftOptions::default(),
    );
    eprintln!("ring: {stats:?}");
    assert_eq!(got, want);
    assert!(stats.target_evals < 31, "{stats:?}");
    head.shutdown(false);
}

#[test]
fn a_seed_gives_one_sampled_text() {
    let Some((target_path, draft_path)) = common::draft_pair() else {
        return;
    };
    let backend = cpu_backend(2);
    let be = &backend.backend;
    let target_model = Model::load(&target_path).unwrap();
    let draft_model = Model::load(&draft_path).unwrap();
    let tok = Tokenizer::from_gguf(target_model.gguf()).unwrap();
    let mut target = Session::new(&target_model, be, N_CTX, N_BATCH).unwrap();
    let mut draft = Session::new(&draft_model, be, N_CTX, N_BATCH).unwrap();
    let prompt = &prompts(&tok)[1];
    let mut run = |seed| {
        let mut sampler = Sampler::new(SamplerConfig {
            temperature: 1.0,
            seed,
            repeat_penalty: 1.1,
            ..SamplerConfig::default()
        });
        with_draft(
            &mut target,
            &mut draft,
            &tok,
            &mut sampler,
            prompt,
            32,
            DraftOptions { max: 4, p_min: 0.0 },
        )
    };
    let (a, stats) = run(1);
    eprintln!("sampled: {stats:?}");
    assert_eq!(run(1).0, a);
    assert_ne!(run(2).0, a);
    assert!(stats.accepted > 0);
}

#[test]
fn a_draft_with_another_vocabulary_is_refused() {
    let (Some(target_path), Some(gemma)) = (
        model_or_skip(workspace_models().join("SmolLM2-135M-Instruct.Q4_1.gguf")),
        model_or_skip(workspace_models().join("gemma-3-270m-q4_k_m.gguf")),
    ) else {
        return;
    };
    let target = Model::load(&target_path).unwrap();
    let draft = Model::load(&gemma).unwrap();
    let err = check_vocabularies(
        &Tokenizer::from_gguf(target.gguf()).unwrap(),
        target.hparams().n_vocab,
        &Tokenizer::from_gguf(draft.gguf()).unwrap(),
        draft.hparams().n_vocab,
    )
    .unwrap_err();
    assert!(matches!(err, VocabularyMismatch::Size { .. }), "{err}");

    let out = Command::new(env!("CARGO_BIN_EXE_prima"))
        .args(["run", "-p", "hi", "-n", "4", "-m"])
        .arg(&target_path)
        .arg("--draft")
        .arg(&gemma)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("cannot draft for") && stderr.contains("vocabulary"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn apply_drafts_with_the_manifests_draft_model() {
    let Some((target_path, draft_path)) = common::draft_pair() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("prima-spec-apply-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let manifest = dir.join("cluster.toml");
    let local = |name: &str, head: bool| {
        format!("[[device]]\nname = \"{name}\"\nhead = {head}\nlocal = true\nthreads = 1\n\n")
    };
    std::fs::write(
        &manifest,
        format!(
            "[model]\npath = {:?}\ndraft = {:?}\ndraft_max = 4\n\n{}{}{}[policy]\nscheduler = \"manual\"\nwindows = [10, 10, 10]\nctx = 256\n",
            target_path,
            draft_path,
            local("desktop", true),
            local("laptop", false),
            local("tablet", false),
        ),
    )
    .unwrap();
    let prompt = "The three primary colours are";
    let prima = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_prima"))
            .args(args)
            .output()
            .unwrap()
    };
    let drafted = prima(&[
        "apply",
        manifest.to_str().unwrap(),
        "--prompt",
        prompt,
        "-n",
        "16",
        "--temp",
        "0",
    ]);
    let stderr = String::from_utf8_lossy(&drafted.stderr);
    assert!(drafted.status.success(), "{stderr}");
    assert!(stderr.contains("ring of 3 devices"), "{stderr}");
    assert!(stderr.contains("draft: accepted"), "{stderr}");
    let single = prima(&[
        "run",
        "-m",
        target_path.to_str().unwrap(),
        "-p",
        prompt,
        "-n",
        "16",
        "--temp",
        "0",
        "-t",
        "1",
        "-c",
        "256",
    ]);
    assert!(single.status.success());
    assert_eq!(
        String::from_utf8_lossy(&drafted.stdout),
        String::from_utf8_lossy(&single.stdout),
        "the ring with a draft generates what one device generates"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `prima run` keeps the draft's weights and KV cache out of the target's memory budget:
/// in a 400 MiB memory cgroup the F16 target fits alone (no residency plan is needed),
/// while beside the Q4_1 draft it gets a budget whose margin holds the draft's weights.
/// Needs a writable cgroup v1 memory hierarchy (root, as CI runs); skipped otherwise.
#[test]
fn run_keeps_the_draft_out_of_its_memory_budget() {
    let Some((target_path, draft_path)) = common::draft_pair() else {
        return;
    };
    let cgroup = std::path::Path::new("/sys/fs/cgroup/memory")
        .join(format!("prima-draft-budget-{}", std::process::id()));
    if std::fs::create_dir(&cgroup).is_err()
        || std::fs::write(cgroup.join("memory.limit_in_bytes"), "400M").is_err()
    {
        eprintln!("note: skipping, no writable cgroup v1 memory hierarchy");
        let _ = std::fs::remove_dir(&cgroup);
        return;
    }
    let run = |draft: Option<&std::path::Path>| {
        let mut args = vec![
            "run".to_string(),
            "-m".into(),
            target_path.display().to_string(),
            "-p".into(),
            "The capital of France is".into(),
            "-n".into(),
            "4".into(),
            "-t".into(),
            "1".into(),
            "-c".into(),
            "256".into(),
        ];
        if let Some(d) = draft {
            args.extend(["--draft".into(), d.display().to_string()]);
        }
        // The shell joins the cgroup, then becomes `prima`.
        let out = Command::new("sh")
            .arg("-c")
            .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
            .arg(&cgroup)
            .arg(env!("CARGO_BIN_EXE_prima"))
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        stderr
    };
    let alone = run(None);
    let drafted = run(Some(&draft_path));
    let _ = std::fs::remove_dir(&cgroup);
    assert!(!alone.contains("memory: budget"), "{alone}");
    // "memory: budget B MiB for weights (…, less M MiB for KV cache, buffers and the process)"
    let margin_mib: u64 = drafted
        .split("less ")
        .nth(1)
        .and_then(|rest| rest.split(" MiB").next())
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("no budget line: {drafted}"));
    let draft_mib = std::fs::metadata(&draft_path).unwrap().len() >> 20;
    assert!(
        margin_mib > draft_mib,
        "the margin ({margin_mib} MiB) leaves no room for the draft ({draft_mib} MiB): {drafted}"
    );
}

/// A node killed mid-generation: the `ResilientRing` plans the ring without it, replays the
/// context and the batch being verified in one evaluation, and hands out the verified
/// rows from further down that batch; the greedy text is still one device's.
#[test]
fn a_resilient_ring_loses_a_node_mid_speculation_and_keeps_the_text() {
    let Some((target_path, draft_path)) = common::draft_pair() else {
        return;
    };
    let backend = cpu_backend(1);
    let be = &backend.backend;
    let target_model = Model::load(&target_path).unwrap();
    let draft_model = Model::load(&draft_path).unwrap();
    let tok = Tokenizer::from_gguf(target_model.gguf()).unwrap();
    let prompt = &prompts(&tok)[0];
    let mut single = Session::new(&target_model, be, N_CTX, N_BATCH).unwrap();
    let (want, _) = generate(
        &mut single,
        &tok,
        &mut greedy(),
        prompt,
        options(40),
        |_| ControlFlow::Continue(()),
    )
    .unwrap();
    drop(single);

    let transport = common::tcp_transport();
    let mut nodes = [Node::start(&target_path), Node::start(&target_path)];
    let ring_options = RingOptions {
        n_ctx: N_CTX,
        n_batch: N_BATCH,
        listen: "127.0.0.1:0".into(),
        security: common::test_security(),
        ..RingOptions::default()
    };
    let mut ring = common::resilient_ring(
        &target_model,
        be,
        &transport.transport,
        &nodes,
        ring_options,
    );
    let mut draft = Session::new(&draft_model, be, N_CTX, N_BATCH).unwrap();
    let mut pieces = 0;
    let (got, _, stats) = generate_speculative(
        &mut ring,
        &mut draft,
        &tok,
        &mut greedy(),
        prompt,
        options(40),
        DraftOptions { max: 4, p_min: 0.0 },
        |_| {
            pieces += 1;
            if pieces == 6 {
                // Between two verifications: the next one finds the ring broken.
                let _ = nodes[1].child.kill();
            }
            ControlFlow::Continue(())
        },
    )
    .unwrap();
    eprintln!("failover: {stats:?}, events {:?}", ring.take_events());
    assert_eq!(ring.devices().len(), 2, "planned without the killed node");
    assert_eq!(got, want);
    ring.shutdown(false);
}

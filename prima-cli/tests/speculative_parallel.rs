//! Speculative decoding with parallel slots, with real models: SmolLM2-135M Q4_1 drafting
//! for its F16 conversion in every slot, all slots' drafts verified in one batch. Each of
//! several concurrent greedy requests gets the text it gets alone without a draft, on one
//! device and on a 3-device loopback ring; requests that finish mid-step leave their slot
//! to a queued one; a seed gives one sampled text; bad combinations are refused.

mod common;

use std::ops::ControlFlow;
use std::process::Command;

use common::{cpu_backend, derived_models, model_or_skip, Node};
use prima_cluster::prp::{RingHead, RingOptions};
use prima_core::batch::{BatchForward, BatchRowLogits, SeqTokens};
use prima_core::generate::{generate, GenerateOptions};
use prima_core::model::{Model, Session};
use prima_core::sampler::{Sampler, SamplerConfig};
use prima_core::speculative::DraftOptions;
use prima_core::tokenizer::Tokenizer;
use prima_server::{
    job_queue, run_scheduler, run_speculative_scheduler, Completion, Drafting, Event, FinishReason,
    GenerationRequest, Prompt, SchedulerOptions, Submitted,
};

const N_CTX: usize = 256;
const N_BATCH: usize = 64;

/// Prompts and how many tokens each asks for: different lengths, so slots leave at
/// different steps and the last, queued, request joins a freed slot.
const REQUESTS: &[(&str, usize)] = &[
    ("The capital of France is", 24),
    (
        "Here is a short story about a robot who learns to paint. Once upon a time,",
        9,
    ),
    ("def fibonacci(n):", 30),
    ("The three primary colours are", 16),
];

fn request(prompt: &str, max_tokens: usize, temperature: f32) -> GenerationRequest {
    GenerationRequest {
        prompt: Prompt::Text(prompt.into()),
        max_tokens: Some(max_tokens),
        sampler: SamplerConfig {
            temperature,
            seed: 42,
            ..SamplerConfig::default()
        },
        stop: Vec::new(),
        ignore_eos: true,
    }
}

/// Each request's text, generated alone on one slot without a draft.
fn alone(model: &Model, tok: &Tokenizer) -> Vec<String> {
    let backend = cpu_backend(2);
    let mut session = Session::new(model, &backend.backend, N_CTX, N_BATCH).unwrap();
    REQUESTS
        .iter()
        .map(|&(prompt, n)| {
            session.truncate(0).unwrap();
            let tokens = tok.encode(prompt, tok.add_bos_default(), true);
            let mut sampler = Sampler::new(SamplerConfig {
                temperature: 0.0,
                ..SamplerConfig::default()
            });
            let options = GenerateOptions {
                max_tokens: n,
                ignore_eos: true,
            };
            let (out, _) = generate(&mut session, tok, &mut sampler, &tokens, options, |_| {
                ControlFlow::Continue(())
            })
            .unwrap();
            tok.decode(&out)
        })
        .collect()
}

/// The text and completion of each job (panics on a failed one).
fn outcomes(submitted: Vec<Submitted>) -> Vec<(String, Completion)> {
    submitted
        .into_iter()
        .map(|mut s| {
            let events: Vec<Event> = std::iter::from_fn(|| s.events.try_recv().ok()).collect();
            let mut text = String::new();
            for e in &events {
                match e {
                    Event::Text(t) => text.push_str(t),
                    Event::Failed(e) => panic!("{e}"),
                    _ => {}
                }
            }
            let Some(Event::Done(c)) = events.last() else {
                panic!("{events:?}")
            };
            (text, c.clone())
        })
        .collect()
}

/// Serves every request of `REQUESTS` at once (the slots hold the first ones, the rest
/// queue) by speculative decoding with `draft`.
fn serve_drafting<T: BatchRowLogits, D: BatchForward>(
    target: &mut T,
    draft: &mut D,
    tok: &Tokenizer,
    temperature: f32,
    options: DraftOptions,
) -> Vec<(String, Completion)> {
    let (queue, jobs) = job_queue();
    let submitted: Vec<Submitted> = REQUESTS
        .iter()
        .map(|&(p, n)| queue.submit(request(p, n, temperature)).unwrap())
        .collect();
    drop(queue);
    let model = Drafting {
        target,
        draft,
        options,
    };
    run_speculative_scheduler(model, tok, jobs, SchedulerOptions::default(), |_| {});
    outcomes(submitted)
}

fn check_greedy(got: &[(String, Completion)], want: &[String]) {
    for (i, ((text, c), want)) in got.iter().zip(want).enumerate() {
        eprintln!("request {i}: {:?}", c.draft);
        assert_eq!(
            text, want,
            "request {i}: the text with a draft differs from alone"
        );
        assert_eq!(c.usage.completion_tokens, REQUESTS[i].1);
        assert_eq!(c.finish_reason, FinishReason::Length);
    }
    let drafted: usize = got
        .iter()
        .filter_map(|(_, c)| c.draft)
        .map(|d| d.drafted)
        .sum();
    let accepted: usize = got
        .iter()
        .filter_map(|(_, c)| c.draft)
        .map(|d| d.accepted)
        .sum();
    assert!(
        accepted > 0 && accepted <= drafted,
        "{accepted} of {drafted}"
    );
}

#[test]
fn concurrent_greedy_requests_with_a_draft_get_their_text_alone() {
    let Some((target_path, draft_path)) = common::draft_pair() else {
        return;
    };
    let backend = cpu_backend(2);
    let be = &backend.backend;
    let target_model = Model::load(&target_path).unwrap();
    let draft_model = Model::load(&draft_path).unwrap();
    let tok = Tokenizer::from_gguf(target_model.gguf()).unwrap();
    let want = alone(&target_model, &tok);

    let mut target = Session::with_slots(&target_model, be, N_CTX, N_BATCH, 3).unwrap();
    let mut draft = Session::with_slots(&draft_model, be, N_CTX, N_BATCH, 3).unwrap();
    for options in [DraftOptions::default(), DraftOptions { max: 3, p_min: 0.0 }] {
        for slot in 0..3 {
            BatchForward::truncate(&mut target, slot, 0).unwrap();
            BatchForward::truncate(&mut draft, slot, 0).unwrap();
        }
        let got = serve_drafting(&mut target, &mut draft, &tok, 0.0, options);
        check_greedy(&got, &want);
    }

    // The plain scheduler on the same slots, for the same texts.
    let (queue, jobs) = job_queue();
    let submitted: Vec<Submitted> = REQUESTS
        .iter()
        .map(|&(p, n)| queue.submit(request(p, n, 0.0)).unwrap())
        .collect();
    drop(queue);
    run_scheduler(&mut target, &tok, jobs, SchedulerOptions::default(), |_| {});
    let plain: Vec<String> = outcomes(submitted).into_iter().map(|(t, _)| t).collect();
    assert_eq!(plain, want);
}

#[test]
fn a_ring_verifies_every_slots_draft_in_one_trip() {
    let Some((target_path, draft_path)) = common::draft_pair() else {
        return;
    };
    let backend = cpu_backend(1);
    let be = &backend.backend;
    let target_model = Model::load(&target_path).unwrap();
    let draft_model = Model::load(&draft_path).unwrap();
    let tok = Tokenizer::from_gguf(target_model.gguf()).unwrap();
    let want = alone(&target_model, &tok);

    let transport = common::tcp_transport();
    let nodes = [Node::start(&target_path), Node::start(&target_path)];
    let addrs: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
    for micro_batches in [Some(1), Some(2)] {
        let mut head = RingHead::connect(
            &target_model,
            be,
            &transport.transport,
            &addrs,
            &[10, 10, 10],
            &RingOptions {
                n_ctx: N_CTX,
                n_batch: N_BATCH,
                n_slots: 2,
                listen: "127.0.0.1:0".into(),
                security: common::test_security(),
                micro_batches,
                ..RingOptions::default()
            },
        )
        .unwrap();
        let mut draft = Session::with_slots(&draft_model, be, N_CTX, N_BATCH, 2).unwrap();
        let got = serve_drafting(&mut head, &mut draft, &tok, 0.0, DraftOptions::default());
        check_greedy(&got, &want);
        head.shutdown(false);
    }
}

#[test]
fn a_seed_gives_one_sampled_text_per_request() {
    let Some((target_path, draft_path)) = common::draft_pair() else {
        return;
    };
    let backend = cpu_backend(2);
    let be = &backend.backend;
    let target_model = Model::load(&target_path).unwrap();
    let draft_model = Model::load(&draft_path).unwrap();
    let tok = Tokenizer::from_gguf(target_model.gguf()).unwrap();
    let run = || {
        let mut target = Session::with_slots(&target_model, be, N_CTX, N_BATCH, 2).unwrap();
        let mut draft = Session::with_slots(&draft_model, be, N_CTX, N_BATCH, 2).unwrap();
        serve_drafting(&mut target, &mut draft, &tok, 0.8, DraftOptions::default())
    };
    let (a, b) = (run(), run());
    for (i, ((ta, ca), (tb, _))) in a.iter().zip(&b).enumerate() {
        assert_eq!(ta, tb, "request {i}: one seed, two texts");
        assert_eq!(ca.usage.completion_tokens, REQUESTS[i].1);
        assert!(!ta.is_empty());
    }
    assert!(a
        .iter()
        .any(|(_, c)| c.draft.is_some_and(|d| d.accepted > 0)));
}

fn prima(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_prima"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_draft_and_micro_batch_settings_are_refused_before_anything_loads() {
    let serve = |extra: &[&str]| {
        let mut args = vec!["serve", "-m", "x.gguf", "--draft", "y.gguf"];
        args.extend_from_slice(extra);
        prima(&args)
    };
    let (ok, err) = serve(&["--parallel", "4", "--draft-max", "0"]);
    assert!(!ok && err.contains("--draft-max 0"), "{err}");
    let (ok, err) = serve(&["--draft-max", "64", "-b", "64"]);
    assert!(
        !ok && err.contains("--draft-max 64") && err.contains("64"),
        "{err}"
    );
    let (ok, err) = serve(&["--draft-p-min", "1.5"]);
    assert!(!ok && err.contains("--draft-p-min"), "{err}");
    for bad in ["0", "two", "-1"] {
        let (ok, err) = prima(&["apply", &format!("--micro-batches={bad}")]);
        assert!(
            !ok && err.contains("--micro-batches") && err.contains("tuned"),
            "{bad}: {err}"
        );
    }
}

/// `eval_batch_rows` gives each entry's last rows the logits each token gets alone, also
/// where entries are cut across batches (a batch of 5 rows here), and refuses rows an
/// entry does not have.
#[test]
fn the_rows_asked_for_are_the_logits_each_token_gets_alone() {
    let Some(path) = model_or_skip(derived_models().join("tiny-llama-f32.gguf")) else {
        return;
    };
    let backend = cpu_backend(1);
    let be = &backend.backend;
    let model = Model::load(&path).unwrap();
    let n_vocab = model.hparams().n_vocab;
    let texts: [Vec<u32>; 3] = [(1..12).collect(), (20..27).collect(), (40..44).collect()];
    // Each text's logits after every prefix, alone.
    let alone: Vec<Vec<f32>> = texts
        .iter()
        .map(|t| {
            let mut s = Session::new(&model, be, 64, 64).unwrap();
            s.eval(t).unwrap();
            let mut rows = vec![0.0; t.len() * n_vocab];
            s.logits_rows(0..t.len(), &mut rows).unwrap();
            rows
        })
        .collect();
    let mut batched = Session::with_slots(&model, be, 64, 5, 3).unwrap();
    // Two steps: the first tokens of each text, then the rest (a verification's shape),
    // asking for a different number of last rows of each entry.
    let cuts = [4, 5, 1];
    for (step, rows) in [[2, 5, 1], [7, 2, 3]].into_iter().enumerate() {
        let seqs: Vec<SeqTokens<'_>> = texts
            .iter()
            .zip(cuts)
            .enumerate()
            .map(|(slot, (t, cut))| SeqTokens {
                slot,
                tokens: if step == 0 { &t[..cut] } else { &t[cut..] },
            })
            .collect();
        let got = batched.eval_batch_rows(&seqs, &rows).unwrap().to_vec();
        let mut at = 0;
        for (slot, (seq, &n)) in seqs.iter().zip(&rows).enumerate() {
            let end = if step == 0 {
                cuts[slot]
            } else {
                texts[slot].len()
            };
            let want = &alone[slot][(end - n) * n_vocab..end * n_vocab];
            assert_eq!(
                &got[at * n_vocab..(at + n) * n_vocab],
                want,
                "step {step}, slot {slot}"
            );
            assert!(n <= seq.tokens.len());
            at += n;
        }
        assert_eq!(got.len(), at * n_vocab);
    }
    for (rows, needle) in [
        (vec![0], "last 0 tokens"),
        (vec![3], "last 3 tokens"),
        (vec![1, 1], "for 2 entries"),
    ] {
        let seqs = [SeqTokens {
            slot: 0,
            tokens: &[5, 6],
        }];
        let err = batched
            .eval_batch_rows(&seqs, &rows)
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{rows:?}: {err}");
    }
}

/// A node of a resilient ring killed while two slots draft: the ring is planned again
/// without it, every slot's context replayed in the next verification, and each
/// request still gets its text alone.
#[test]
fn a_resilient_ring_loses_a_node_while_slots_draft_and_keeps_every_text() {
    let Some((target_path, draft_path)) = common::draft_pair() else {
        return;
    };
    let backend = cpu_backend(1);
    let be = &backend.backend;
    let target_model = Model::load(&target_path).unwrap();
    let draft_model = Model::load(&draft_path).unwrap();
    let tok = Tokenizer::from_gguf(target_model.gguf()).unwrap();
    let want = alone(&target_model, &tok);

    let transport = common::tcp_transport();
    let nodes = [Node::start(&target_path), Node::start(&target_path)];
    let ring_options = RingOptions {
        n_ctx: N_CTX,
        n_batch: N_BATCH,
        n_slots: 2,
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
    let mut draft = Session::with_slots(&draft_model, be, N_CTX, N_BATCH, 2).unwrap();

    let (queue, jobs) = job_queue();
    let mut submitted: Vec<Submitted> = REQUESTS
        .iter()
        .map(|&(p, n)| queue.submit(request(p, n, 0.0)).unwrap())
        .collect();
    drop(queue);
    let [_, mut b] = nodes;
    let mut first = submitted.remove(0);
    let (texts, got) = std::thread::scope(|scope| {
        // Node b dies after the first request's third piece of text.
        let watcher = scope.spawn(move || {
            let mut events = Vec::new();
            let mut pieces = 0;
            while let Some(event) = first.events.blocking_recv() {
                if matches!(event, Event::Text(_)) {
                    pieces += 1;
                    if pieces == 3 {
                        let _ = b.child.kill();
                    }
                }
                events.push(event);
            }
            events
        });
        let model = Drafting {
            target: &mut ring,
            draft: &mut draft,
            options: DraftOptions { max: 4, p_min: 0.0 },
        };
        run_speculative_scheduler(model, &tok, jobs, SchedulerOptions::default(), |_| {});
        let events = watcher.join().unwrap();
        let text: String = events
            .iter()
            .filter_map(|e| match e {
                Event::Text(t) => Some(t.as_str()),
                Event::Failed(e) => panic!("{e}"),
                _ => None,
            })
            .collect();
        (text, outcomes(submitted))
    });
    assert_eq!(ring.devices().len(), 2, "planned without the killed node");
    assert_eq!(texts, want[0]);
    for (i, (text, _)) in got.iter().enumerate() {
        assert_eq!(text, &want[i + 1], "request {}", i + 1);
    }
    ring.shutdown(false);
}

//! Continuous batching's engine: several sequences in one forward pass compute, each, the
//! logits the same sequence gets alone, bit for bit — prefill chunks beside single decode
//! tokens, slots at different positions, entries cut across batches, one slot truncated
//! and evaluated again. The kernels are batch-size invariant (each row of a product is
//! the same dot products in the same order whatever the other rows), and RoPE and
//! attention run per slot, so nothing but the row order differs.

mod common;

use std::path::PathBuf;

use common::{cpu_backend, derived_models, model_or_skip, workspace_models, Node};
use prima_cluster::prp::alone::LocalSession;
use prima_cluster::prp::protocol::{OutputSetup, ReleaseMethod, ReleasePolicy};
use prima_cluster::prp::residency::Residency;
use prima_cluster::prp::{NextRoute, RingHead, RingOptions};
use prima_core::batch::{BatchForward, SeqSpan, SeqTokens};
use prima_core::generate::Forward;
use prima_core::model::{Model, ModelError, Session};

const N_CTX: usize = 64;
/// Greedy steps each sequence decodes after its prompt.
const STEPS: usize = 5;
/// A prompt is fed this many tokens per step (chunked prefill).
const CHUNK: usize = 4;

fn smollm2() -> Option<PathBuf> {
    model_or_skip(workspace_models().join("SmolLM2-135M-Instruct.Q4_1.gguf"))
}

fn argmax(l: &[f32]) -> u32 {
    (0..l.len())
        .max_by(|&a, &b| l[a].total_cmp(&l[b]).then(b.cmp(&a)))
        .unwrap() as u32
}

/// Prompts of different lengths (token ids spread over the vocabulary), and the step at
/// which each joins: the last joins while the others decode.
fn prompts(n_vocab: usize) -> Vec<(Vec<u32>, usize)> {
    let mut state = 0x2545_f491_u64;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) % n_vocab as u64) as u32
    };
    [(11, 0), (5, 0), (17, 1), (2, 4)]
        .iter()
        .map(|&(len, join)| ((0..len).map(|_| next()).collect(), join))
        .collect()
}

/// The logits a sequence gets alone: after its prompt, then after each greedy token.
fn alone(model: &Model, be: &prima_abi::backend::BackendBox, prompt: &[u32]) -> Vec<Vec<f32>> {
    let mut s = Session::new(model, be, N_CTX, 64).unwrap();
    let mut all = vec![s.eval(prompt).unwrap().to_vec()];
    for _ in 0..STEPS {
        let t = argmax(all.last().unwrap());
        all.push(s.eval(&[t]).unwrap().to_vec());
    }
    all
}

/// Runs every prompt on its own slot of `f` (prompt `i` on slot `slots[i]`), all active
/// sequences in one `eval_batch` per step: prompts fed in chunks of [`CHUNK`] beside the
/// others' decode tokens. Returns each sequence's logits after its prompt and after
/// each greedy token, as [`alone`] does.
fn batched<F: BatchForward>(
    f: &mut F,
    prompts: &[(Vec<u32>, usize)],
    slots: &[usize],
) -> Vec<Vec<Vec<f32>>>
where
    F::Error: std::fmt::Debug,
{
    batched_with(f, prompts, slots, |_| {})
}

/// [`batched`], calling `before_step` with the step's number before each step.
fn batched_with<F: BatchForward>(
    f: &mut F,
    prompts: &[(Vec<u32>, usize)],
    slots: &[usize],
    mut before_step: impl FnMut(usize),
) -> Vec<Vec<Vec<f32>>>
where
    F::Error: std::fmt::Debug,
{
    let n = prompts.len();
    let mut fed = vec![0; n];
    let mut next = vec![0u32; n];
    let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); n];
    let mut step = 0;
    while got.iter().any(|g| g.len() < STEPS + 1) {
        let mut active = Vec::new();
        let mut inputs: Vec<Vec<u32>> = Vec::new();
        for i in 0..n {
            let (prompt, join) = &prompts[i];
            if step < *join || got[i].len() == STEPS + 1 {
                continue;
            }
            let input = if fed[i] < prompt.len() {
                let end = (fed[i] + CHUNK).min(prompt.len());
                let chunk = prompt[fed[i]..end].to_vec();
                fed[i] = end;
                chunk
            } else {
                vec![next[i]]
            };
            active.push(i);
            inputs.push(input);
        }
        // Entries in a different order than the slots, every other step reversed.
        if step % 2 == 1 {
            active.reverse();
            inputs.reverse();
        }
        let seqs: Vec<SeqTokens> = active
            .iter()
            .zip(&inputs)
            .map(|(&i, t)| SeqTokens {
                slot: slots[i],
                tokens: t,
            })
            .collect();
        before_step(step);
        let logits = f.eval_batch(&seqs).unwrap().to_vec();
        let v = f.n_vocab();
        assert_eq!(logits.len(), seqs.len() * v);
        for (e, &i) in active.iter().enumerate() {
            if fed[i] < prompts[i].0.len() {
                continue; // a prompt chunk before its last
            }
            let l = logits[e * v..(e + 1) * v].to_vec();
            next[i] = argmax(&l);
            got[i].push(l);
        }
        step += 1;
    }
    got
}

fn check_model(path: &std::path::Path) {
    let model = Model::load(path).unwrap();
    let backend = cpu_backend(2);
    let be = &backend.backend;
    let prompts = prompts(model.hparams().n_vocab);
    let expected: Vec<_> = prompts.iter().map(|(p, _)| alone(&model, be, p)).collect();
    let slots = [0, 2, 1, 3];
    // One batch per step, and batches of 3 rows that cut entries across batches.
    for n_batch in [64, 3] {
        let mut session = Session::with_slots(&model, be, N_CTX, n_batch, 4).unwrap();
        assert_eq!(BatchForward::n_slots(&session), 4);
        let got = batched(&mut session, &prompts, &slots);
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert!(
                g == e,
                "{}: n_batch {n_batch}: sequence {i} differs from the same sequence alone",
                path.display()
            );
        }
        // Slot 1 forgets all but its prompt's first 3 positions and is fed the rest
        // again, beside a decode token of slot 0: its logits are the prompt's again.
        let p = &prompts[2].0;
        BatchForward::truncate(&mut session, 1, 3).unwrap();
        assert_eq!(BatchForward::n_past(&session, 1), 3);
        let t0 = argmax(&got[0][STEPS]);
        let logits = session
            .eval_batch(&[
                SeqTokens {
                    slot: 1,
                    tokens: &p[3..],
                },
                SeqTokens {
                    slot: 0,
                    tokens: &[t0],
                },
            ])
            .unwrap();
        let v = model.hparams().n_vocab;
        assert!(
            logits[..v] == expected[2][0][..],
            "slot 1 after its truncation"
        );
    }
}

#[test]
fn each_sequence_of_a_mixed_batch_gets_the_logits_it_gets_alone() {
    let Some(path) = smollm2() else { return };
    check_model(&path);
}

#[test]
fn mixed_batches_are_exact_on_every_architecture() {
    // Gemma 3's local layers (sliding window), Qwen's biases and Q/K norms, F16 weights.
    for name in [
        "tiny-llama-f32.gguf",
        "tiny-llama-q4_k.gguf",
        "tiny-qwen2-f16.gguf",
        "tiny-qwen3-f32.gguf",
        "tiny-gemma3-f32.gguf",
    ] {
        let Some(path) = model_or_skip(derived_models().join(name)) else {
            continue;
        };
        check_model(&path);
    }
}

#[test]
fn a_streaming_device_alone_batches_exactly_too() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let backend = cpu_backend(2);
    let be = &backend.backend;
    let prompts = prompts(model.hparams().n_vocab);
    let expected: Vec<_> = prompts.iter().map(|(p, _)| alone(&model, be, p)).collect();
    // Nothing resident but the embedding and the output head: every chunk streamed.
    let residency =
        Residency::plan_alone(&model, 1, true, ReleasePolicy::Mru, ReleaseMethod::Pageout);
    assert!(residency.streams());
    let session = Session::with_slots(&model, be, N_CTX, 64, 4).unwrap();
    let mut local = LocalSession::new(session, Some(residency));
    let got = batched(&mut local, &prompts, &[3, 1, 0, 2]);
    assert!(
        got == expected,
        "the streamed batches differ from each sequence alone"
    );
}

#[test]
fn one_slot_keeps_the_single_sequence_api() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let backend = cpu_backend(2);
    let be = &backend.backend;
    let prompt = &prompts(model.hparams().n_vocab)[0].0;
    let expected = alone(&model, be, prompt);
    // `Forward` (slot 0) and `BatchForward` on the same session agree.
    let mut s = Session::new(&model, be, N_CTX, 64).unwrap();
    let l = s
        .eval_batch(&[SeqTokens {
            slot: 0,
            tokens: prompt,
        }])
        .unwrap();
    assert!(l == expected[0]);
    assert_eq!(Forward::n_past(&s), prompt.len());
    let t = argmax(&expected[0]);
    assert!(Forward::eval(&mut s, &[t]).unwrap() == expected[1]);
}

#[test]
fn bad_entries_are_errors_that_change_nothing() {
    let Some(path) = model_or_skip(derived_models().join("tiny-llama-f32.gguf")) else {
        return;
    };
    let model = Model::load(&path).unwrap();
    let backend = cpu_backend(1);
    let mut s = Session::with_slots(&model, &backend.backend, 8, 4, 2).unwrap();
    s.eval_batch(&[SeqTokens {
        slot: 1,
        tokens: &[1, 2, 3],
    }])
    .unwrap();
    let vocab = model.hparams().n_vocab as u32;
    let err = |s: &mut Session, seqs: &[SeqTokens]| s.eval_batch(seqs).map(|_| ()).unwrap_err();

    let e = err(
        &mut s,
        &[SeqTokens {
            slot: 2,
            tokens: &[1],
        }],
    );
    assert!(
        matches!(
            e,
            ModelError::UnknownSlot {
                slot: 2,
                n_slots: 2
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("slot 2"), "{e}");
    let e = err(
        &mut s,
        &[
            SeqTokens {
                slot: 0,
                tokens: &[1],
            },
            SeqTokens {
                slot: 0,
                tokens: &[2],
            },
        ],
    );
    assert!(matches!(e, ModelError::SlotTwice { slot: 0 }), "{e}");
    let e = err(
        &mut s,
        &[
            SeqTokens {
                slot: 0,
                tokens: &[1],
            },
            SeqTokens {
                slot: 1,
                tokens: &[],
            },
        ],
    );
    assert!(matches!(e, ModelError::EmptyEntry { slot: 1 }), "{e}");
    // Slot 1 holds 3 of its 8 positions: 6 more overflow it, not slot 0.
    let e = err(
        &mut s,
        &[
            SeqTokens {
                slot: 0,
                tokens: &[1; 6],
            },
            SeqTokens {
                slot: 1,
                tokens: &[1; 6],
            },
        ],
    );
    assert!(
        matches!(
            e,
            ModelError::SlotContextFull {
                slot: 1,
                needed: 9,
                n_ctx: 8
            }
        ),
        "{e}"
    );
    let e = err(
        &mut s,
        &[SeqTokens {
            slot: 0,
            tokens: &[vocab],
        }],
    );
    assert!(matches!(e, ModelError::TokenOutOfRange { .. }), "{e}");
    assert!(BatchForward::truncate(&mut s, 5, 0).is_err());
    assert!(matches!(
        Session::with_slots(&model, &backend.backend, 8, 4, 0),
        Err(ModelError::NoSlots)
    ));
    // Spans as a ring node receives them (round 0 of a frame).
    let span = |slot, start, len| SeqSpan { slot, start, len };
    for (spans, what) in [
        (vec![span(7, 0, 1)], "slot 7 does not exist"),
        (vec![span(0, 1, 1)], "only 0 positions are cached"),
        (vec![span(1, 0, 1), span(1, 1, 1)], "slot 1 appears twice"),
        (vec![span(0, 0, 1), span(1, 3, 0)], "holds no tokens"),
        (vec![span(0, 0, 3), span(1, 3, 2)], "batch size 4"),
    ] {
        let e = s.begin_spans(&spans).unwrap_err();
        assert!(e.to_string().contains(what), "{spans:?}: {e}");
    }
    // Nothing ran: the slots hold what they held.
    assert_eq!(
        (BatchForward::n_past(&s, 0), BatchForward::n_past(&s, 1)),
        (0, 3)
    );
    assert!(s.eval_batch(&[]).unwrap().is_empty());
}

fn ring_options(n_batch: usize) -> RingOptions {
    RingOptions {
        n_ctx: N_CTX,
        n_batch,
        n_slots: 4,
        listen: "127.0.0.1:0".into(),
        security: common::test_security(),
        ..RingOptions::default()
    }
}

#[test]
fn a_ring_of_three_batches_exactly_what_each_sequence_gets_alone() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let backend = cpu_backend(1);
    let be = &backend.backend;
    let transport = common::tcp_transport();
    let nodes = [Node::start(&path), Node::start(&path)];
    let addrs: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
    let prompts = prompts(model.hparams().n_vocab);
    let expected: Vec<_> = prompts.iter().map(|(p, _)| alone(&model, be, p)).collect();
    // One round, and three rounds (k = 3) with entries cut across batches; one batch at
    // a time, and up to 2 and 3 micro-batches in the ring at once.
    // The last three with the output layer on the last node, every logit sent back
    // (issue 38): the same bits.
    let every_logit = Some(OutputSetup {
        top_k: 0,
        hidden: true,
    });
    let rings = [
        ([10, 10, 10], 64, 1, None),
        ([10, 10, 10], 64, 3, None),
        ([4, 3, 3], 3, 1, None),
        ([4, 3, 3], 3, 2, None),
        ([4, 3, 3], 3, 3, None),
        ([10, 10, 10], 64, 3, every_logit),
        ([4, 3, 3], 3, 2, every_logit),
        ([0, 30, 0], 64, 1, every_logit),
    ];
    for (windows, n_batch, micro_batches, output) in rings {
        let options = RingOptions {
            micro_batches: Some(micro_batches),
            output,
            ..ring_options(n_batch)
        };
        let mut head =
            RingHead::connect(&model, be, &transport.transport, &addrs, &windows, &options)
                .unwrap_or_else(|e| panic!("windows {windows:?}: {e}"));
        let got = batched(&mut head, &prompts, &[1, 3, 0, 2]);
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert!(
                g == e,
                "windows {windows:?}, {micro_batches} in flight: sequence {i} differs from alone"
            );
        }
        // A slot truncated on the head: the nodes forget its positions with its next
        // span.
        let p = &prompts[2].0;
        BatchForward::truncate(&mut head, 0, 5).unwrap();
        let logits = head
            .eval_batch(&[SeqTokens {
                slot: 0,
                tokens: &p[5..],
            }])
            .unwrap();
        assert!(
            logits == expected[2][0],
            "windows {windows:?}: after truncation"
        );
        head.shutdown(false);
    }
}

#[test]
fn a_resilient_ring_replays_every_slot_after_a_lost_device() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let backend = cpu_backend(1);
    let be = &backend.backend;
    let transport = common::tcp_transport();
    let mut nodes = vec![Node::start(&path), Node::start(&path)];
    let prompts = prompts(model.hparams().n_vocab);
    let expected: Vec<_> = prompts.iter().map(|(p, _)| alone(&model, be, p)).collect();

    // Micro-batches in flight when b dies: the step is replayed whole.
    let options = RingOptions {
        micro_batches: Some(3),
        ..ring_options(64)
    };
    let mut ring = common::resilient_ring(&model, be, &transport.transport, &nodes, options);
    // Device b dies after a few steps, when every slot holds a context.
    let got = batched_with(&mut ring, &prompts, &[0, 1, 2, 3], |step| {
        if step == 6 {
            nodes.pop();
        }
    });
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert!(
            g == e,
            "sequence {i} differs from alone across the failover"
        );
    }
    assert_eq!(ring.devices().len(), 2, "the ring goes on without b");
    ring.shutdown(false);
}

/// Median seconds of one decode step with `n` slots each decoding one token, for each
/// `n` of `slots`, after a 16-token prompt per slot. The sizes take turns, a few steps
/// each, `reps` times, so that what else runs on the machine weighs on all of them alike.
fn decode_step_s<F: BatchForward>(f: &mut F, slots: &[usize], reps: usize) -> Vec<f64>
where
    F::Error: std::fmt::Debug,
{
    let turns: Vec<(usize, usize)> = slots.iter().map(|&n| (n, 0)).collect();
    decode_steps(f, &turns, reps, |_, _| {})
}

/// [`decode_step_s`] for turns of `(n, setting)`: `configure` applies the setting to `f`
/// before each turn of `n` slots.
fn decode_steps<F: BatchForward>(
    f: &mut F,
    turns: &[(usize, usize)],
    reps: usize,
    mut configure: impl FnMut(&mut F, usize),
) -> Vec<f64>
where
    F::Error: std::fmt::Debug,
{
    const STEPS_PER_TURN: usize = 4;
    let v = f.n_vocab();
    let prompts = prompts(v);
    let most = turns.iter().map(|t| t.0).max().unwrap_or(1);
    let mut next = Vec::new();
    for slot in 0..most {
        BatchForward::truncate(f, slot, 0).unwrap();
        let prompt: Vec<u32> = prompts[slot % prompts.len()]
            .0
            .iter()
            .cycle()
            .take(16)
            .copied()
            .collect();
        let logits = f
            .eval_batch(&[SeqTokens {
                slot,
                tokens: &prompt,
            }])
            .unwrap();
        next.push([argmax(logits)]);
    }
    let mut times = vec![Vec::new(); turns.len()];
    for _ in 0..reps {
        for (i, &(n, setting)) in turns.iter().enumerate() {
            configure(f, setting);
            for _ in 0..STEPS_PER_TURN {
                let seqs: Vec<SeqTokens> = next[..n]
                    .iter()
                    .enumerate()
                    .map(|(slot, t)| SeqTokens { slot, tokens: t })
                    .collect();
                let start = std::time::Instant::now();
                let logits = f.eval_batch(&seqs).unwrap().to_vec();
                times[i].push(start.elapsed().as_secs_f64());
                for (e, t) in next[..n].iter_mut().enumerate() {
                    t[0] = argmax(&logits[e * v..(e + 1) * v]);
                }
            }
        }
    }
    times
        .iter_mut()
        .map(|t| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        })
        .collect()
}

/// The engine's ceiling for continuous batching: aggregate decode tokens/s with 1, 2, 4
/// and 8 slots each decoding one token per step, SmolLM2 Q4_1, on one device (2
/// threads) and on a 3-device loopback ring (a thread each). Measures, asserts nothing:
/// `cargo test --release -p prima-core --test batch -- --ignored --nocapture`.
#[test]
#[ignore]
fn decode_throughput_by_slots() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    const REPS: usize = 12;
    let slots = [1, 2, 4, 8];
    let mut rows = Vec::new();
    {
        let backend = cpu_backend(2);
        let mut s = Session::with_slots(&model, &backend.backend, 256, 64, 8).unwrap();
        decode_step_s(&mut s, &[1], 2); // warm-up
        let steps = decode_step_s(&mut s, &slots, REPS);
        rows.push(("one device, -t 2".to_string(), steps));
    }
    let backend = cpu_backend(1);
    let transport = common::tcp_transport();
    let nodes = [Node::start(&path), Node::start(&path)];
    let addrs: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
    let options = RingOptions {
        // Each slot decodes in every setting's turns.
        n_ctx: 2048,
        n_slots: 8,
        ..ring_options(64)
    };
    let mut head = RingHead::connect(
        &model,
        &backend.backend,
        &transport.transport,
        &addrs,
        &[10, 10, 10],
        &options,
    )
    .unwrap();
    decode_step_s(&mut head, &[1], 2);
    // One batch at a time, 2 and 3 (one per device) micro-batches in flight, and as
    // many as the head finds fastest (0; its tuner learns across its turns), taking
    // turns.
    let settings = [1, 2, 3, 0];
    let turns: Vec<(usize, usize)> = slots
        .iter()
        .flat_map(|&n| settings.map(|m| (n, m)))
        .collect();
    let steps = decode_steps(&mut head, &turns, REPS, |head, m| {
        head.set_micro_batches((m > 0).then_some(m))
    });
    for (i, m) in settings.iter().enumerate() {
        let by_slots = steps.iter().skip(i).step_by(settings.len()).copied();
        let what = match m {
            0 => "tuned".to_string(),
            m => format!("{m} in flight"),
        };
        rows.push((
            format!("3-device loopback ring, -t 1 each, {what}"),
            by_slots.collect(),
        ));
    }
    head.shutdown(false);
    println!("| where | slots | median step ms | aggregate tok/s | × 1 slot |");
    println!("|---|---|---|---|---|");
    for (where_, steps) in &rows {
        for (&n, &step) in slots.iter().zip(steps) {
            println!(
                "| {where_} | {n} | {:.1} | {:.1} | {:.2} |",
                step * 1e3,
                n as f64 / step,
                n as f64 * steps[0] / step
            );
        }
    }
}

/// [`decode_throughput_by_slots`] for the ring with 5 ms added to each hop (a forwarder
/// on loopback delays every byte by that much in each direction, as `cargo xtask
/// spec-bench` does): whether micro-batches pay when the links, not the cores, take the
/// time. Measures, asserts nothing (`-- --ignored --nocapture`).
#[test]
#[ignore]
fn decode_throughput_with_link_latency() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    const REPS: usize = 6;
    let delay = std::time::Duration::from_millis(5);
    let slots = [1, 2, 4, 8];
    let backend = cpu_backend(1);
    let transport = common::tcp_transport();
    let nodes = [Node::start(&path), Node::start(&path)];
    let head_addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    // The head reaches node m through forwarder m (so node 1 reaches node 2 through it
    // too); node 2 reaches the head through a third.
    let addrs: Vec<String> = nodes.iter().map(|n| delayed(&n.addr, delay)).collect();
    let options = RingOptions {
        n_ctx: 2048,
        n_slots: 8,
        listen: head_addr.clone(),
        next_routes: vec![
            NextRoute::AsHead,
            NextRoute::Addr(delayed(&head_addr, delay)),
        ],
        ..ring_options(64)
    };
    let mut head = RingHead::connect(
        &model,
        &backend.backend,
        &transport.transport,
        &addrs,
        &[10, 10, 10],
        &options,
    )
    .unwrap();
    decode_step_s(&mut head, &[1], 2);
    let settings = [1, 2, 3, 0];
    let turns: Vec<(usize, usize)> = slots
        .iter()
        .flat_map(|&n| settings.map(|m| (n, m)))
        .collect();
    let steps = decode_steps(&mut head, &turns, REPS, |head, m| {
        head.set_micro_batches((m > 0).then_some(m))
    });
    head.shutdown(false);
    println!("| 5 ms per hop | slots | median step ms | aggregate tok/s |");
    println!("|---|---|---|---|");
    for (i, m) in settings.iter().enumerate() {
        for (&n, &step) in slots
            .iter()
            .zip(steps.iter().skip(i).step_by(settings.len()))
        {
            let what = match m {
                0 => "tuned".to_string(),
                m => format!("{m} in flight"),
            };
            println!(
                "| {what} | {n} | {:.1} | {:.1} |",
                step * 1e3,
                n as f64 / step
            );
        }
    }
}

/// Listens on a loopback port and forwards each connection to `to`, every chunk in each
/// direction written `delay` after it was read: a link of that one-way latency.
fn delayed(to: &str, delay: std::time::Duration) -> String {
    use std::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let to = to.to_string();
    std::thread::spawn(move || {
        for client in listener.incoming().map_while(Result::ok) {
            let Ok(server) = TcpStream::connect(&to) else {
                continue;
            };
            for s in [&client, &server] {
                let _ = s.set_nodelay(true);
            }
            let (client2, server2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            pipe(client, server, delay);
            pipe(server2, client2, delay);
        }
    });
    addr
}

/// Copies `from` to `to`, each chunk `delay` after it was read (a reader thread stamps
/// chunks, a writer thread waits for each one's time, so the delay shifts the stream
/// without throttling it).
fn pipe(mut from: std::net::TcpStream, mut to: std::net::TcpStream, delay: std::time::Duration) {
    use std::io::{Read, Write};
    let (tx, rx) = std::sync::mpsc::channel::<(std::time::Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            if tx
                .send((std::time::Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        for (due, chunk) in rx {
            std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
}

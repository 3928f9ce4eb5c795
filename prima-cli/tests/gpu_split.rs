//! The GPU+CPU layer split (the paper's n_m): a session whose first layers run on a
//! second backend computes exactly what one backend does. A second CPU backend instance
//! stands in for the GPU (the CPU backend is deterministic, so the logits must be equal
//! bit for bit): alone for n_m = 0, a few and all layers, with slots (continuous
//! batching), and on a ring of three whose devices each run their own n_m.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{cpu_backend, model_or_skip, workspace_models, Node};
use prima_abi::backend::BackendBox;
use prima_cluster::prp::protocol::{ReleaseMethod, ReleasePolicy, RoundWindow};
use prima_cluster::prp::residency::Residency;
use prima_cluster::prp::{RingGpus, RingHead, RingOptions};
use prima_core::batch::SeqTokens;
use prima_core::generate::Forward;
use prima_core::model::{GpuLayers, Model, Session};

const N_CTX: usize = 128;
const GENERATE: usize = 6;

fn smollm2() -> Option<PathBuf> {
    model_or_skip(workspace_models().join("SmolLM2-135M-Instruct.Q4_1.gguf"))
}

fn argmax(l: &[f32]) -> u32 {
    (0..l.len())
        .max_by(|&a, &b| l[a].total_cmp(&l[b]).then(b.cmp(&a)))
        .unwrap() as u32
}

/// Greedy tokens and the logits of every step: after the prompt, then after each token.
fn greedy<F: Forward>(f: &mut F, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>)
where
    F::Error: std::fmt::Debug,
{
    let (mut tokens, mut all) = (Vec::new(), Vec::new());
    let mut logits = f.eval(prompt).unwrap().to_vec();
    for _ in 0..n {
        let t = argmax(&logits);
        tokens.push(t);
        all.push(logits);
        logits = f.eval(&[t]).unwrap().to_vec();
    }
    all.push(logits);
    (tokens, all)
}

/// A prompt of `len` token ids spread over the vocabulary.
fn prompt(n_vocab: usize, len: usize, seed: u64) -> Vec<u32> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % n_vocab as u64) as u32
        })
        .collect()
}

/// A session of every layer with the first `n_gpu` on `gpu`, in batches of `n_batch`.
fn split<'m>(
    model: &'m Model,
    cpu: &'m BackendBox,
    gpu: &'m BackendBox,
    n_gpu: usize,
    n_batch: usize,
    n_slots: usize,
) -> Session<'m> {
    let all: Vec<usize> = (0..model.hparams().n_layers).collect();
    let on_gpu: Vec<usize> = (0..n_gpu).collect();
    let gpu = GpuLayers {
        backend: gpu,
        layers: &on_gpu,
    };
    Session::with_split(model, cpu, Some(gpu), N_CTX, n_batch, n_slots, &all).unwrap()
}

#[test]
fn a_split_session_computes_what_one_backend_does() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let n_layers = model.hparams().n_layers;
    let (cpu, gpu) = (cpu_backend(1), cpu_backend(1));
    let prompt = prompt(model.hparams().n_vocab, 21, 7);
    // Batches of 8: the prompt crosses batch boundaries on both backends.
    let mut one = Session::new(&model, &cpu.backend, N_CTX, 8).unwrap();
    let (want_tokens, want) = greedy(&mut one, &prompt, GENERATE);
    for n_gpu in [0, 1, 3, n_layers - 1, n_layers] {
        let mut s = split(&model, &cpu.backend, &gpu.backend, n_gpu, 8, 1);
        assert_eq!(s.gpu_layer_count(), n_gpu);
        let (tokens, logits) = greedy(&mut s, &prompt, GENERATE);
        assert_eq!(tokens, want_tokens, "n_gpu = {n_gpu}");
        assert!(logits == want, "n_gpu = {n_gpu}: logits differ");
        // Truncating reaches both backends' caches: the same prompt again, same logits.
        s.truncate(0).unwrap();
        let again = s.eval(&prompt).unwrap().to_vec();
        assert!(again == want[0], "n_gpu = {n_gpu}: after truncate");
    }
}

#[test]
fn a_split_session_with_slots_batches_exactly() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let n_vocab = model.hparams().n_vocab;
    let (cpu, gpu) = (cpu_backend(1), cpu_backend(1));
    let prompts = [
        prompt(n_vocab, 9, 1),
        prompt(n_vocab, 4, 2),
        prompt(n_vocab, 13, 3),
    ];
    let want: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| {
            let mut s = Session::new(&model, &cpu.backend, N_CTX, 32).unwrap();
            s.eval(p).unwrap().to_vec()
        })
        .collect();
    let n_layers = model.hparams().n_layers;
    for n_gpu in [0, 5, n_layers] {
        let mut s = split(&model, &cpu.backend, &gpu.backend, n_gpu, 32, 3);
        let seqs: Vec<SeqTokens<'_>> = prompts
            .iter()
            .enumerate()
            .map(|(slot, tokens)| SeqTokens { slot, tokens })
            .collect();
        let logits = s
            .eval_batch_with(&seqs, |s| s.run_layers(0..n_layers))
            .unwrap()
            .to_vec();
        for (i, w) in want.iter().enumerate() {
            assert!(
                logits[i * n_vocab..(i + 1) * n_vocab] == w[..],
                "n_gpu = {n_gpu}, slot {i}: logits differ"
            );
        }
    }
}

#[test]
fn gpu_layers_must_be_held() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let (cpu, gpu) = (cpu_backend(1), cpu_backend(1));
    let gpu = GpuLayers {
        backend: &gpu.backend,
        layers: &[3],
    };
    let err = Session::with_split(&model, &cpu.backend, Some(gpu), 32, 8, 1, &[0, 1, 2])
        .err()
        .expect("a GPU layer outside the session's layers is refused");
    assert!(err.to_string().contains("layer 3"), "{err}");
    // Beyond the model, in both lists: an error, not a panic.
    let gpu_be = cpu_backend(1);
    let gpu = GpuLayers {
        backend: &gpu_be.backend,
        layers: &[99],
    };
    let err = Session::with_split(&model, &cpu.backend, Some(gpu), 32, 8, 1, &[0, 99])
        .err()
        .expect("a layer beyond the model is refused");
    assert!(err.to_string().contains("layer 99"), "{err}");
}

/// A ring of three, each device with its own n_m: the head's from the plan (on its second
/// CPU backend), node 1's from the plan through the setup (under a memory budget that
/// streams some of its CPU layers), node 2's from its own `--gpu-layers`, which overrides
/// the plan's.
#[test]
fn a_ring_of_three_with_gpu_layers_per_device() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let (cpu, gpu) = (cpu_backend(1), cpu_backend(1));
    let transport = common::tcp_transport();
    let nodes = [
        Node::start_with(&path, &["--gpu-backend", "cpu", "--mem-budget", "12M"]),
        Node::start_with(&path, &["--gpu-backend", "cpu", "--gpu-layers", "2"]),
    ];
    let addrs: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
    let prompt = prompt(model.hparams().n_vocab, 11, 5);
    let mut one = Session::new(&model, &cpu.backend, N_CTX, 64).unwrap();
    let (want_tokens, want) = greedy(&mut one, &prompt, GENERATE);
    let options = RingOptions {
        n_ctx: N_CTX,
        n_batch: 64,
        listen: "127.0.0.1:0".into(),
        security: common::test_security(),
        ..RingOptions::default()
    };
    // k = 2 rounds of 5 + 5 + 5 layers; n_m = 3, 1 and (node 2's own) 2 of each window.
    for (windows, n) in [([5, 5, 5], [3, 1, 4]), ([10, 10, 10], [10, 0, 0])] {
        let gpus = RingGpus {
            head: Some(&gpu.backend),
            n: n.to_vec(),
        };
        let mut head = RingHead::connect_with_gpus(
            &model,
            &cpu.backend,
            &transport.transport,
            &addrs,
            &windows,
            &gpus,
            &options,
        )
        .unwrap_or_else(|e| panic!("windows {windows:?}, n {n:?}: {e}"));
        let (tokens, logits) = greedy(&mut head, &prompt, GENERATE);
        assert_eq!(tokens, want_tokens, "windows {windows:?}, n {n:?}");
        assert!(
            logits == want,
            "windows {windows:?}, n {n:?}: logits differ"
        );
        head.shutdown(false);
    }
}

/// A ring device's GPU layers live in VRAM: left out of its RAM budget and never
/// streamed; the streamed layers are its windows' first CPU layers.
#[test]
fn gpu_layers_are_out_of_the_ram_budget_and_never_streamed() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let windows = [
        RoundWindow {
            round: 0,
            layers: 0..10,
        },
        RoundWindow {
            round: 1,
            layers: 15..25,
        },
    ];
    let gpu = [0, 1, 2, 3, 15, 16, 17, 18];
    let cpu_bytes: u64 = windows
        .iter()
        .flat_map(|w| w.layers.clone())
        .filter(|il| !gpu.contains(il))
        .map(|il| model.layer_bytes(il))
        .sum();
    let plan = |gpu: &[usize], budget: u64| {
        Residency::plan_split(
            &model,
            &windows,
            gpu,
            Some(budget),
            false,
            ReleasePolicy::Mru,
            ReleaseMethod::Pageout,
        )
    };
    // The CPU layers' bytes hold every CPU layer: nothing streams, though all the held
    // layers would not fit.
    assert!(!plan(&gpu, cpu_bytes).streams());
    assert!(plan(&[], cpu_bytes).streams());
    // Less than that: CPU layers stream, GPU layers never.
    let tight = plan(&gpu, cpu_bytes / 2);
    assert!(tight.streams());
    for w in tight.windows() {
        if w.layers.clone().any(|il| gpu.contains(&il)) {
            assert!(w.fully_resident(), "a GPU layer streamed: {:?}", w.layers);
        }
    }
    let covered: Vec<usize> = tight
        .windows()
        .iter()
        .flat_map(|w| w.layers.clone())
        .collect();
    let held: Vec<usize> = windows.iter().flat_map(|w| w.layers.clone()).collect();
    assert_eq!(covered, held, "every held layer once, in order");
}

/// `--gpu-layers` without a usable GPU backend is a clear error from the binary, never a
/// panic: here no plugin answers as a GPU (the CUDA plugin is unavailable without a
/// driver), and a named one that does not exist is named.
#[test]
fn gpu_layers_without_a_gpu_backend_is_a_clear_error() {
    let Some(path) = smollm2() else { return };
    if prima_core::plugin::first_gpu_backend().is_some() {
        eprintln!("a usable GPU backend is present: only the named-plugin case runs");
    } else {
        let out = Command::new(env!("CARGO_BIN_EXE_prima"))
            .args(["run", "-n", "1", "-p", "hi", "-ngl", "3", "-m"])
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains("--gpu-layers 3"), "{stderr}");
        assert!(stderr.contains("no usable GPU backend"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_prima"))
        .args(["run", "-n", "1", "-p", "hi", "--gpu-layers", "3"])
        .args(["--gpu-backend", "no-such-gpu", "-m"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("no-such-gpu"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

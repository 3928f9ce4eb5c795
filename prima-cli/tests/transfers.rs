//! What crosses between host and device per token: a backend's activations stay in its own
//! buffers, so a window costs at most one upload (its input) and one download (its output),
//! whatever its number of operations. Counted by the backends themselves
//! ([`TransferCounts`]) on SmolLM2, for the CPU backend (host buffers, the same calls) and
//! the wgpu backend on whatever adapter is here (lavapipe in CI; skipped without one,
//! unless `PRIMA_REQUIRE_VULKAN=1`):
//! - a single device: per decoded token no upload (the embedding is looked up on the
//!   device) and one download (the logits); per prompt batch the same;
//! - a split device (the wgpu backend runs the first layers, the CPU the rest): per token
//!   the GPU takes one upload and one download;
//! - a ring node (layers of the middle, driven as `prp::node` drives them): one upload of
//!   the received activations and one download of those it sends on, per batch;
//! - a continuous-batching step of two requests: one download for both requests' logits.

mod common;

use std::path::PathBuf;

use common::{cpu_backend, model_or_skip, workspace_models};
use prima_abi::backend::{BackendBox, BackendConfig, TransferCounts};
use prima_core::batch::SeqTokens;
use prima_core::model::{GpuLayers, Model, Session};
use prima_core::plugin::load_backend;

fn smollm2() -> Option<PathBuf> {
    model_or_skip(workspace_models().join("SmolLM2-135M-Instruct.Q4_1.gguf"))
}

/// The wgpu backend on any adapter, software included, or `None` where there is none and
/// `PRIMA_REQUIRE_VULKAN` is unset.
fn wgpu() -> Option<prima_core::plugin::LoadedBackend> {
    std::env::set_var("PRIMA_WGPU_ALLOW_SOFTWARE", "1");
    match load_backend(Some("wgpu"), BackendConfig { threads: 0 }) {
        Ok(b) => Some(b),
        Err(e) => {
            if std::env::var_os("PRIMA_REQUIRE_VULKAN").is_some_and(|v| v == "1") {
                panic!("PRIMA_REQUIRE_VULKAN=1 but the wgpu backend is unavailable: {e}");
            }
            eprintln!("no wgpu backend here ({e}): its half skipped");
            None
        }
    }
}

fn argmax(l: &[f32]) -> u32 {
    (0..l.len())
        .max_by(|&a, &b| l[a].total_cmp(&l[b]).then(b.cmp(&a)))
        .unwrap() as u32
}

/// Runs `f` and returns what crossed on `be` meanwhile.
fn counted<T>(be: &BackendBox, f: impl FnOnce() -> T) -> (T, TransferCounts) {
    let before = be.transfers();
    let out = f();
    (out, be.transfers().since(before))
}

/// A single device: the prompt in one batch, then tokens one at a time.
fn single_device(model: &Model, be: &BackendBox) -> Vec<u32> {
    let mut s = Session::new(model, be, 128, 32).unwrap();
    let prompt: Vec<u32> = (0..16u32).map(|i| 100 + 37 * i).collect();
    let (logits, c) = counted(be, || s.eval(&prompt).unwrap().to_vec());
    eprintln!("{} single device, prompt of 16: {c:?}", be.name());
    assert_eq!((c.uploads, c.downloads), (0, 1), "prompt batch: {c:?}");
    let mut tokens = vec![argmax(&logits)];
    for _ in 0..4 {
        let last = *tokens.last().unwrap();
        let (logits, c) = counted(be, || s.eval(&[last]).unwrap().to_vec());
        eprintln!("{} single device, one token: {c:?}", be.name());
        assert_eq!((c.uploads, c.downloads), (0, 1), "decode step: {c:?}");
        assert!(c.waits <= 1, "decode step waited {} times", c.waits);
        tokens.push(argmax(&logits));
    }
    tokens
}

/// A ring node's share: activations in, its layers, activations out.
fn ring_node(model: &Model, be: &BackendBox) {
    let d = model.hparams().n_embd;
    let layers: Vec<usize> = (10..20).collect();
    let mut s = Session::with_layers(model, be, 128, 32, &layers).unwrap();
    for (start, n) in [(0usize, 8usize), (8, 1), (9, 1)] {
        s.begin_batch(start, n).unwrap();
        for (i, v) in s.hidden_mut().iter_mut().enumerate() {
            *v = ((i % d) as f32 * 0.37).sin();
        }
        let (_, c) = counted(be, || {
            s.run_layers(10..20).unwrap();
            s.outgoing().unwrap().1.len()
        });
        s.finish_batch();
        eprintln!("{} ring node, batch of {n}: {c:?}", be.name());
        assert_eq!((c.uploads, c.downloads), (1, 1), "ring node: {c:?}");
        assert!(c.waits <= 1, "ring node waited {} times", c.waits);
    }
}

/// Two requests in one continuous-batching step: one download for both.
fn batch_step(model: &Model, be: &BackendBox) {
    let mut s = Session::with_slots(model, be, 64, 32, 2).unwrap();
    let (a, b) = ([1u32, 2, 3], [7u32, 8]);
    let seqs = [
        SeqTokens {
            slot: 0,
            tokens: &a,
        },
        SeqTokens {
            slot: 1,
            tokens: &b,
        },
    ];
    let (_, c) = counted(be, || {
        s.eval_batch_with(&seqs, |s| s.run_layers(0..model.hparams().n_layers))
            .unwrap()
            .len()
    });
    eprintln!("{} batch step of two requests: {c:?}", be.name());
    assert_eq!((c.uploads, c.downloads), (0, 1), "batch step: {c:?}");
}

#[test]
fn cpu_backend_one_download_per_token_and_one_each_way_per_ring_window() {
    let Some(path) = smollm2() else { return };
    let model = Model::load(&path).unwrap();
    let cpu = cpu_backend(2);
    single_device(&model, &cpu.backend);
    ring_node(&model, &cpu.backend);
    batch_step(&model, &cpu.backend);
}

#[test]
fn wgpu_backend_one_upload_and_one_download_per_window() {
    let Some(path) = smollm2() else { return };
    let Some(gpu) = wgpu() else { return };
    let model = Model::load(&path).unwrap();
    let cpu = cpu_backend(2);
    let on_gpu = single_device(&model, &gpu.backend);
    let on_cpu = single_device(&model, &cpu.backend);
    assert_eq!(
        on_gpu, on_cpu,
        "the wgpu backend's greedy tokens differ from the CPU's"
    );
    ring_node(&model, &gpu.backend);
    batch_step(&model, &gpu.backend);

    // Split: the first 15 layers on the GPU, the rest and the output head on the CPU.
    let n_layers = model.hparams().n_layers;
    let all: Vec<usize> = (0..n_layers).collect();
    let first: Vec<usize> = (0..15).collect();
    let split = GpuLayers {
        backend: &gpu.backend,
        layers: &first,
    };
    let mut s = Session::with_split(&model, &cpu.backend, Some(split), 128, 32, 1, &all).unwrap();
    let prompt: Vec<u32> = (0..8u32).map(|i| 300 + 11 * i).collect();
    s.eval(&prompt).unwrap();
    for t in [5u32, 9, 12] {
        let (_, c) = counted(&gpu.backend, || s.eval(&[t]).unwrap().len());
        eprintln!("split, GPU side, one token: {c:?}");
        assert_eq!((c.uploads, c.downloads), (1, 1), "split GPU window: {c:?}");
        assert!(c.waits <= 1, "split GPU window waited {} times", c.waits);
    }
}

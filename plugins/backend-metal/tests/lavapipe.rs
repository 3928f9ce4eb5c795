//! The wgpu backend against the CPU backend (the oracle), on whatever adapter this machine
//! has — in CI, Mesa's software Vulkan driver (lavapipe), which `cargo xtask setup`
//! installs. Software adapters are allowed here (`PRIMA_WGPU_ALLOW_SOFTWARE=1`).
//!
//! Without an adapter every test returns early, passing, after printing why — unless
//! `PRIMA_REQUIRE_VULKAN=1` (set by `cargo xtask test` where lavapipe was installed), which
//! makes a missing adapter a failure. Covered: each weight format's get_rows and matmul,
//! every element-wise op, RoPE variants, attention variants (GQA, sliding window,
//! soft-capping, truncation), a weight split over several bindings, a generated model
//! operation by operation, and SmolLM2 Q4_1 end to end. Shapes are small: lavapipe is slow.

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RSlice, RSliceMut};
use prima_abi::backend::{BackendConfig, Backend_TO, KvSpec};
use prima_abi::on_host::OnHost;
use prima_abi::GgmlType;
use prima_backend_metal::device::unavailable;
use prima_core::model::{Model, Session};
use prima_core::tokenizer::Tokenizer;
use prima_gpu_support::conformance::models::{self, ModelShape, MIXED, MIXED_HEAD};
use prima_gpu_support::conformance::{self as suite, Target, GAP};
use prima_gpu_support::conformance::{argmax, max_abs, max_abs_diff, randn, random_weight};
use prima_gpu_support::conformance::{top2_gap, view};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn allow_software() {
    // Every test sets the same value before probing, so the race is harmless.
    std::env::set_var(prima_backend_metal::device::ALLOW_SOFTWARE, "1");
}

/// The wgpu backend on any adapter, software included, or `None` (after checking the
/// refusal) where there is none and `PRIMA_REQUIRE_VULKAN` is unset. Exact (the CPU's
/// bits) on lavapipe, where that was measured; another driver may contract multiply-adds
/// or reassociate (WGSL cannot forbid either), so it is held to the loose tolerance. F32
/// matmuls are exact only where the adapter's `fma` is fused, as the CPU's F32 dot is
/// (probed; lavapipe's is not: Mesa lowers it to a multiply and an add).
fn target() -> Option<Target> {
    allow_software();
    match unavailable() {
        Some(why) => {
            if std::env::var_os("PRIMA_REQUIRE_VULKAN").is_some_and(|v| v == "1") {
                panic!("PRIMA_REQUIRE_VULKAN=1 but no adapter: {why}");
            }
            eprintln!("no wgpu adapter here ({why}): skipped");
            let err = prima_backend_metal::create_backend(BackendConfig { threads: 0 })
                .into_result()
                .err()
                .expect("create must refuse without an adapter");
            assert!(err.contains("unavailable"), "{err}");
            None
        }
        None => {
            let backend =
                prima_backend_metal::create_backend(BackendConfig { threads: 0 }).unwrap();
            eprintln!("{}", backend.describe());
            let exact = backend.describe().contains("llvmpipe");
            let fused_f32 = suite::f32_matmul_fuses(&backend);
            eprintln!("F32 matmul multiply-adds fused as the CPU's: {fused_f32}");
            Some(Target {
                backend,
                exact,
                fused_f32,
            })
        }
    }
}

/// The generated models' sizes: small, lavapipe is slow.
const SHAPE: ModelShape = ModelShape {
    n_embd: 256,
    n_ff: 768,
    n_vocab: 512,
    n_head: 4,
    n_head_kv: 2,
};

#[test]
fn every_weight_format_decodes_and_multiplies_like_the_cpu() {
    let Some(t) = target() else { return };
    // The other matmul kernels than the adapter's default (row per invocation on CPU
    // adapters, workgroup per row on GPUs): both must give the CPU's products.
    let other = prima_backend_metal::backend::open(BackendConfig { threads: 0 }).unwrap();
    other.with_state(|s| s.row_per_invocation = !t.exact);
    let other = Backend_TO::from_value(other, TD_Opaque);
    suite::ops::every_weight_format(&t, &[other], &[1, 3, 9]);
}

/// A layer's operations on device buffers at odd offsets, one upload, one download: the
/// CPU's bits, one submission, one wait.
#[test]
fn a_layer_chained_on_the_device_waits_once() {
    let Some(t) = target() else { return };
    suite::ops::chained_on_device(&t);
}

#[test]
fn element_wise_ops_match_the_cpu() {
    let Some(t) = target() else { return };
    suite::ops::element_wise_ops(&t);
}

#[test]
fn rope_variants_match_the_cpu() {
    let Some(t) = target() else { return };
    suite::ops::rope_variants(&t);
}

#[test]
fn attention_variants_match_the_cpu() {
    let Some(t) = target() else { return };
    suite::ops::attention_variants(&t);
}

#[test]
fn a_generated_f32_model_gives_the_cpus_logits_and_tokens() {
    // With F32 weights neither backend quantizes activations; this checks the whole
    // forward pass (RoPE, the KV cache across steps, attention, norms).
    let Some(mut t) = target() else { return };
    // Every product is an F32 matmul: exact only where they fuse as the CPU's.
    t.exact &= t.fused_f32;
    let path =
        std::env::temp_dir().join(format!("prima-wgpu-test-f32-{}.gguf", std::process::id()));
    let f = GgmlType::F32;
    models::write_model(&path, SHAPE, 2, [[f; 7]; 2], [f, f]);
    let backends = (&suite::cpu(), &t.backend);
    let c = models::compare("f32 model", &path, backends, &SHAPE.prompt(12), 8, false);
    let _ = std::fs::remove_file(&path);
    c.assert_within(&t, "f32 model");
}

/// Q4_1 and Q8_0 weights, as the CPU adapter's fused kernels take them: layer 0 all Q4_1
/// (q, k, v with RoPE and the KV store; gate, up with SwiGLU; the output and down
/// projections with the next norm; attention quantizing its output), layer 1 mixed, so
/// that weights of other pages fall back to dispatches of their own; heads of 64 (the
/// RoPE kernel's and attention's `_d64`) and of 128 (neither). The CPU's bits.
#[test]
fn generated_q4_1_and_q8_0_models_take_the_fused_kernels_with_the_cpus_bits() {
    let Some(t) = target() else { return };
    use GgmlType::{Q4_1, Q8_0};
    let mixed = [Q4_1, Q8_0, Q4_1, Q8_0, Q4_1, Q8_0, Q4_1];
    let wide = ModelShape {
        n_head: 2,
        n_head_kv: 1,
        ..SHAPE
    };
    for (shape, name) in [(SHAPE, "heads of 64"), (wide, "heads of 128")] {
        let path = std::env::temp_dir().join(format!(
            "prima-wgpu-test-fused-{}-{}.gguf",
            shape.n_head,
            std::process::id()
        ));
        models::write_model(&path, shape, 2, [[Q4_1; 7], mixed], [Q8_0, Q8_0]);
        let backends = (&suite::cpu(), &t.backend);
        let c = models::compare(name, &path, backends, &shape.prompt(12), 8, false);
        let _ = std::fs::remove_file(&path);
        c.assert_within(&t, name);
    }
}

/// A real model, held to the target's promise: tokens agree wherever the CPU's top-2 gap
/// exceeds 1.0, and on lavapipe the logits equal the CPU's bit for bit (for `f32` weights,
/// only where F32 multiply-adds fuse as the CPU's: lavapipe's do not).
fn real_model_matches(name: &str, path: std::path::PathBuf, n_gen: usize, f32: bool) {
    let Some(path) = suite::model_path(path) else {
        return;
    };
    let Some(mut t) = target() else { return };
    t.exact &= !f32 || t.fused_f32;
    models::real_model(&t, name, &path, n_gen);
}

/// SmolLM2-135M Q4_1, the project's reference model: 16 tokens.
#[test]
fn smollm2_q4_1_end_to_end_matches_the_cpu() {
    real_model_matches(
        "SmolLM2 Q4_1",
        suite::fetched("SmolLM2-135M-Instruct.Q4_1.gguf"),
        16,
        false,
    );
}

/// Gemma 3 270M Q4_K_M (GeGLU, sliding-window layers, K-quants, a 262144-row output head
/// split over two dispatch dimensions on GPUs): 4 tokens, its head is slow on lavapipe.
#[test]
fn gemma3_q4_k_m_end_to_end_matches_the_cpu() {
    real_model_matches(
        "Gemma 3 Q4_K_M",
        suite::fetched("gemma-3-270m-q4_k_m.gguf"),
        4,
        false,
    );
}

/// The tiny random Gemma 3 of the derived test models (F32).
#[test]
fn tiny_gemma3_end_to_end_matches_the_cpu() {
    real_model_matches(
        "tiny Gemma 3 F32",
        suite::derived("tiny-gemma3-f32.gguf"),
        8,
        true,
    );
}

/// The legacy formats' row kernels (CPU adapters) off the model's shapes: rows that start
/// half-way into a word (3 blocks of 18, 22 or 34 bytes), and activations too large for
/// the uniform binding (2560 columns × 24 tokens), which are read from storage instead.
#[test]
fn legacy_row_kernels_take_odd_rows_and_large_activations() {
    let Some(t) = target() else { return };
    let cpu_backend = suite::cpu();
    let (gpu, cpu) = (OnHost(&t.backend), OnHost(&cpu_backend));
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    // The backend caches weights by address: each stays alive so none is reused.
    let mut weights = Vec::new();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
    ] {
        for (cols, rows, n) in [(96usize, 13usize, 1usize), (96, 13, 5), (2560, 9, 24)] {
            weights.push(random_weight(&mut rng, ty, cols, rows));
            let w = weights.last().unwrap();
            let x = randn(&mut rng, n * cols);
            let (mut g, mut c) = (vec![0f32; n * rows], vec![0f32; n * rows]);
            let wv = view(w, ty, cols, rows);
            let xs = RSlice::from_slice(&x);
            gpu.matmul(wv, xs, n as u32, RSliceMut::from_mut_slice(&mut g))
                .unwrap();
            cpu.matmul(wv, xs, n as u32, RSliceMut::from_mut_slice(&mut c))
                .unwrap();
            let d = max_abs_diff(&g, &c);
            let first_bad = (0..g.len()).find(|&i| g[i] != c[i]);
            assert!(
                d <= t.tol(max_abs(&c)),
                "{ty} {cols}x{rows} n={n}: differs by {d}, first at {first_bad:?}"
            );
        }
    }
}

/// A weight too large for one binding is split into parts of whole rows, each with its own
/// dispatch: forced here with a tiny binding limit. The same kernels run on each part, so
/// the results are the unsplit backend's bit for bit.
#[test]
fn a_weight_split_over_several_bindings_gives_the_same_results() {
    let Some(t) = target() else { return };
    let whole = &t.backend;
    let split = prima_backend_metal::backend::open_with_part_limit(
        BackendConfig { threads: 0 },
        Some(4096),
    )
    .unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for ty in [GgmlType::Q4_1, GgmlType::F32, GgmlType::Q6K] {
        let (cols, rows) = (512, 40);
        let w = random_weight(&mut rng, ty, cols, rows);
        let wv = view(&w, ty, cols, rows);
        let x = randn(&mut rng, 3 * cols);
        let (mut a, mut b) = (vec![0f32; 3 * rows], vec![0f32; 3 * rows]);
        let xs = RSlice::from_slice(&x);
        OnHost(whole)
            .matmul(wv, xs, 3, RSliceMut::from_mut_slice(&mut a))
            .unwrap();
        OnHost(&split)
            .matmul(wv, xs, 3, RSliceMut::from_mut_slice(&mut b))
            .unwrap();
        assert_eq!(max_abs_diff(&a, &b), 0.0, "{ty} matmul");
        let ids = [0u32, 39, 17, 3];
        let (mut a, mut b) = (vec![0f32; 4 * cols], vec![0f32; 4 * cols]);
        let ids = RSlice::from_slice(&ids);
        OnHost(whole)
            .get_rows(wv, ids, RSliceMut::from_mut_slice(&mut a))
            .unwrap();
        OnHost(&split)
            .get_rows(wv, ids, RSliceMut::from_mut_slice(&mut b))
            .unwrap();
        assert_eq!(max_abs_diff(&a, &b), 0.0, "{ty} get_rows");
    }
}

/// Every operation of a generated quantized model's forward pass, run on both backends with
/// the same inputs: reports, per kind of operation, how many calls differed and by how much.
#[test]
fn each_operation_inside_a_model_matches_the_cpu() {
    let Some(t) = target() else { return };
    let path = std::env::temp_dir().join(format!("prima-wgpu-test-q-{}.gguf", std::process::id()));
    models::write_model(&path, SHAPE, 2, MIXED, MIXED_HEAD);
    let exact = t.exact;
    let differing = suite::tee::differing_operations(
        suite::cpu(),
        t.backend,
        std::slice::from_ref(&path),
        &SHAPE.prompt(12),
    );
    let _ = std::fs::remove_file(&path);
    assert!(
        !exact || differing.is_empty(),
        "differ from the CPU: {differing:?}"
    );
}

/// Bad arguments are errors naming what is wrong, never panics, and the backend keeps
/// working after them.
#[test]
fn bad_arguments_are_errors() {
    let Some(Target { backend, .. }) = target() else {
        return;
    };
    let gpu = OnHost(&backend);
    let w = vec![0u8; 4 * 64 * 2];
    let wv = view(&w, GgmlType::F32, 64, 2);
    let x = vec![1f32; 63];
    let mut out = vec![0f32; 2];
    let e = gpu
        .matmul(
            wv,
            RSlice::from_slice(&x),
            1,
            RSliceMut::from_mut_slice(&mut out),
        )
        .into_result()
        .unwrap_err();
    assert!(e.contains("x length is 63, expected 64"), "{e}");
    let mut rows = vec![0f32; 64];
    let e = gpu
        .get_rows(
            wv,
            RSlice::from_slice(&[2u32]),
            RSliceMut::from_mut_slice(&mut rows),
        )
        .into_result()
        .unwrap_err();
    assert!(e.contains("row id 2 is out of range"), "{e}");
    let spec = KvSpec {
        n_layers: 1,
        n_ctx: 8,
        n_head_kv: 1,
        head_dim_k: 3,
        head_dim_v: 3,
    };
    let e = backend.kv_create(spec).into_result().unwrap_err();
    assert!(e.contains("must be even"), "{e}");
    let e = backend.kv_truncate(12345, 0).into_result().unwrap_err();
    assert!(e.contains("unknown KV cache"), "{e}");
    let q8k = view(&w, GgmlType::Q8K, 256, 1);
    let e = gpu
        .get_rows(
            q8k,
            RSlice::from_slice(&[0u32]),
            RSliceMut::from_mut_slice(&mut rows),
        )
        .into_result()
        .unwrap_err();
    assert!(e.contains("not supported"), "{e}");
    // Ranges are checked against their buffers, by name.
    let id = backend.buf_create(8).into_result().unwrap();
    let over = prima_abi::backend::Buf {
        id,
        offset: 4,
        len: 5,
    };
    let e = backend.scale(over, 2.0).into_result().unwrap_err();
    assert!(e.contains("exceeds its 8 elements"), "{e}");
    let e = backend
        .scale(prima_abi::backend::Buf::whole(id + 1000, 1), 2.0)
        .into_result()
        .unwrap_err();
    assert!(e.contains("unknown buffer"), "{e}");
    backend.buf_drop(id);
    // Still working.
    let x = vec![1f32; 128];
    let mut out = vec![0f32; 4];
    gpu.matmul(
        wv,
        RSlice::from_slice(&x),
        2,
        RSliceMut::from_mut_slice(&mut out),
    )
    .unwrap();
}

#[test]
fn without_an_adapter_create_refuses_and_probe_explains() {
    // Without PRIMA_WGPU_ALLOW_SOFTWARE a software adapter is refused with a reason.
    if let Some(why) = unavailable() {
        assert!(!why.is_empty());
        let err = prima_backend_metal::create_backend(BackendConfig { threads: 0 })
            .into_result()
            .err()
            .unwrap();
        assert!(err.contains(&why), "{err}");
    }
}

/// The adapter's memory, as `gpu_memory` exports it for Halda and `--gpu-layers`: some
/// device-local memory, no more free than there is; a software (CPU) adapter's is RAM.
#[test]
fn the_adapter_reports_its_memory() {
    let Some(Target { backend: gpu, .. }) = target() else {
        return;
    };
    let m = prima_backend_metal::device::memory().expect("an adapter with no memory report");
    println!(
        "{}: {} MiB, {} MiB free, unified {}",
        gpu.describe(),
        m.total_bytes >> 20,
        m.free_bytes >> 20,
        m.unified
    );
    assert!(m.total_bytes > 0 && m.free_bytes <= m.total_bytes);
    if gpu.describe().contains("Cpu") {
        assert!(m.unified, "a CPU adapter shares RAM");
    }
}

/// The paper's GPU+CPU split on one device with this plugin as the GPU: SmolLM2 with its
/// first 12 of 30 layers on wgpu, the rest and the head on the CPU backend, prompt and 8
/// greedy tokens. The split session's logits are the all-CPU session's (bit for bit where
/// the backend is exact, as on lavapipe).
#[test]
fn smollm2_split_between_wgpu_and_the_cpu_matches_the_cpu() {
    let Some(path) = suite::model_path(suite::fetched("SmolLM2-135M-Instruct.Q4_1.gguf")) else {
        return;
    };
    let Some(t) = target() else { return };
    let (cpu, gpu) = (suite::cpu(), &t.backend);
    let model = Model::load(&path).unwrap();
    let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
    let prompt = tok.encode("The capital of France is a city called", true, false);
    let all: Vec<usize> = (0..model.hparams().n_layers).collect();
    let on_gpu: Vec<usize> = (0..12).collect();
    let mut alone = Session::new(&model, &cpu, 128, 64).unwrap();
    let split_layers = prima_core::model::GpuLayers {
        backend: gpu,
        layers: &on_gpu,
    };
    let mut split =
        Session::with_split(&model, &cpu, Some(split_layers), 128, 64, 1, &all).unwrap();
    assert_eq!(split.gpu_layer_count(), 12);
    let mut a = alone.eval(&prompt).unwrap().to_vec();
    let mut b = split.eval(&prompt).unwrap().to_vec();
    for step in 0..8 {
        let diff = max_abs_diff(&a, &b);
        assert!(
            diff <= t.tol(max_abs(&a)),
            "step {step}: split logits differ by {diff}"
        );
        let next = argmax(&a) as u32;
        if t.exact || top2_gap(&a) > GAP {
            assert_eq!(argmax(&b) as u32, next, "step {step}: greedy token");
        }
        a = alone.eval(&[next]).unwrap().to_vec();
        b = split.eval(&[next]).unwrap().to_vec();
    }
}

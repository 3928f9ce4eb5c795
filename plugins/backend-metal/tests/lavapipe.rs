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
use abi_stable::std_types::{RResult::ROk, RString};
use abi_stable::std_types::{RSlice, RSliceMut};
use half::{bf16, f16};
use prima_backend_metal::device::unavailable;
use prima_backend_metal::formats::FORMATS;
use prima_core::gguf::{GgmlType, GgufWriter, Value};
use prima_core::model::{Model, Session};
use prima_core::plugin::backend_abi::{
    AttentionParams, Backend, BackendBox, BackendConfig, BackendResult, Backend_TO, KvSpec,
    RopeParams, TensorView,
};
use prima_core::tokenizer::Tokenizer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The CPU backend, loaded as a plugin (linking its rlib too would clash with this
/// crate's exported plugin symbols): from $PRIMA_PLUGIN_DIR, else beside the test binary.
fn cpu() -> BackendBox {
    prima_core::plugin::load_backend(Some("cpu"), BackendConfig { threads: 0 })
        .expect(
            "the CPU backend plugin (cargo build -p prima-backend-cpu, or set PRIMA_PLUGIN_DIR)",
        )
        .backend
}

fn allow_software() {
    // Every test sets the same value before probing, so the race is harmless.
    std::env::set_var(prima_backend_metal::device::ALLOW_SOFTWARE, "1");
}

/// The wgpu backend on any adapter, software included, or `None` (after checking the
/// refusal) where there is none and `PRIMA_REQUIRE_VULKAN` is unset.
fn gpu() -> Option<BackendBox> {
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
            let b = prima_backend_metal::create_backend(BackendConfig { threads: 0 }).unwrap();
            eprintln!("{}", b.describe());
            Some(b)
        }
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn max_abs(a: &[f32]) -> f32 {
    a.iter().fold(0.0f32, |m, x| m.max(x.abs()))
}

/// (offset, value) of each f16 scale field in a block: chosen so a random block's weights
/// have mean ≈ 0 and standard deviation ≈ 0.03 (≈ 1/√1024), so activations stay in range
/// through a generated model's layers instead of growing chaotically.
fn scale_fields(ty: GgmlType) -> &'static [(usize, f32)] {
    match ty {
        GgmlType::Q4_0 => &[(0, 0.0068)],
        GgmlType::Q5_0 => &[(0, 0.0034)],
        GgmlType::Q8_0 => &[(0, 0.00042)],
        GgmlType::Q4_1 => &[(0, 0.0068), (2, -0.051)],
        GgmlType::Q5_1 => &[(0, 0.0034), (2, -0.053)],
        GgmlType::Q2K => &[(80, 0.004), (82, 0.006)],
        GgmlType::Q3K => &[(108, 0.00075)],
        GgmlType::Q4K => &[(0, 0.0002), (2, 0.0015)],
        GgmlType::Q5K => &[(0, 0.0001), (2, 0.00155)],
        GgmlType::Q6K => &[(208, 0.000023)],
        _ => &[],
    }
}

/// `rows` rows of `cols` random but valid elements of `ty`.
fn random_weight(rng: &mut ChaCha8Rng, ty: GgmlType, cols: usize, rows: usize) -> Vec<u8> {
    let n = cols * rows;
    let mut normal = || (rng.gen::<f32>() - 0.5) * 0.1;
    match ty {
        GgmlType::F32 => (0..n).flat_map(|_| normal().to_le_bytes()).collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| f16::from_f32(normal()).to_le_bytes())
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| bf16::from_f32(normal()).to_le_bytes())
            .collect(),
        _ => {
            let bytes = ty.row_bytes(cols).unwrap() * rows;
            let mut data: Vec<u8> = (0..bytes).map(|_| rng.gen()).collect();
            for block in data.chunks_exact_mut(ty.block_bytes()) {
                let jitter = 0.75 + 0.5 * rng.gen::<f32>();
                for &(off, v) in scale_fields(ty) {
                    block[off..off + 2].copy_from_slice(&f16::from_f32(v * jitter).to_le_bytes());
                }
            }
            data
        }
    }
}

fn view(data: &[u8], ty: GgmlType, cols: usize, rows: usize) -> TensorView<'_> {
    TensorView {
        data: RSlice::from_slice(data),
        ggml_type: ty as u32,
        cols: cols as u64,
        rows: rows as u64,
    }
}

fn randn(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen::<f32>() * 2.0 - 1.0).collect()
}

/// Whether results must equal the CPU's bit for bit: on lavapipe, where it was measured.
/// Another driver may contract multiply-adds or reassociate (WGSL cannot forbid either);
/// there the tests allow `LOOSE` relative to the magnitudes compared, and a model's greedy
/// tokens must still agree wherever the CPU's top-2 gap exceeds 1.0.
fn exact(gpu: &BackendBox) -> bool {
    gpu.describe().contains("llvmpipe")
}

const LOOSE: f32 = 1e-4;

/// The tolerance of a comparison: 0 where [`exact`], else `LOOSE` × `scale`.
fn tol(gpu: &BackendBox, scale: f32) -> f32 {
    if exact(gpu) {
        0.0
    } else {
        LOOSE * scale.max(1.0)
    }
}

#[test]
fn every_weight_format_decodes_and_multiplies_like_the_cpu() {
    let Some(gpu) = gpu() else { return };
    // The other matmul kernels than the adapter's default (row per invocation on CPU
    // adapters, workgroup per row on GPUs): both must give the CPU's products.
    let other = prima_backend_metal::WgpuBackend::new(BackendConfig { threads: 0 }).unwrap();
    other.set_row_per_invocation(!exact(&gpu));
    let other = Backend_TO::from_value(other, TD_Opaque);
    let cpu = cpu();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut failures = Vec::new();
    for fmt in FORMATS {
        let ty = fmt.ty;
        assert!(gpu.supports(ty as u32));
        // 512 columns: fewer blocks than a workgroup's invocations; 2560: several passes.
        for (cols, rows) in [(512, 67), (2560, 33)] {
            let w = random_weight(&mut rng, ty, cols, rows);
            let wv = view(&w, ty, cols, rows);
            // get_rows: exact decoding.
            let ids: Vec<u32> = vec![0, rows as u32 - 1, 5, 5, 31];
            let mut want = vec![0f32; ids.len() * cols];
            let mut got = want.clone();
            cpu.get_rows(
                wv,
                RSlice::from_slice(&ids),
                RSliceMut::from_mut_slice(&mut want),
            )
            .unwrap();
            gpu.get_rows(
                wv,
                RSlice::from_slice(&ids),
                RSliceMut::from_mut_slice(&mut got),
            )
            .unwrap();
            let d = max_abs_diff(&want, &got);
            assert!(
                d <= tol(&gpu, max_abs(&want)),
                "{ty}: get_rows differs by {d}"
            );
            for n_tokens in [1usize, 3, 9] {
                // Activations with a spread of magnitudes, a zero block and exact ties, so
                // the quantizers' rounding and max rules are exercised.
                let mut x = randn(&mut rng, n_tokens * cols);
                for (i, v) in x.iter_mut().enumerate() {
                    *v *= 1.0 + 4.0 * ((i / 32) % 3) as f32;
                }
                x[..32].fill(0.0);
                x[300] = 5.0;
                x[301] = -5.0;
                let (mut g, mut c) = (vec![0f32; n_tokens * rows], vec![0f32; n_tokens * rows]);
                gpu.matmul(
                    wv,
                    RSlice::from_slice(&x),
                    n_tokens as u32,
                    RSliceMut::from_mut_slice(&mut g),
                )
                .unwrap();
                cpu.matmul(
                    wv,
                    RSlice::from_slice(&x),
                    n_tokens as u32,
                    RSliceMut::from_mut_slice(&mut c),
                )
                .unwrap();
                let mut o = vec![0f32; n_tokens * rows];
                other
                    .matmul(
                        wv,
                        RSlice::from_slice(&x),
                        n_tokens as u32,
                        RSliceMut::from_mut_slice(&mut o),
                    )
                    .unwrap();
                let rel = max_abs_diff(&g, &c) / max_abs(&c).max(1e-30);
                let rel_other = max_abs_diff(&o, &c) / max_abs(&c).max(1e-30);
                println!(
                    "{:<5} matmul {cols}x{rows} n={n_tokens:<2}: |gpu-cpu| / max|y| {rel:.2e}, other kernels {rel_other:.2e}  (max |y| {:.2})",
                    ty.name(),
                    max_abs(&c)
                );
                if rel.max(rel_other) > tol(&gpu, 1.0) {
                    failures.push(format!(
                        "{ty} {cols}x{rows} n={n_tokens}: {rel:.2e} / {rel_other:.2e}"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "matmuls differ: {failures:?}");
}

#[test]
fn element_wise_ops_match_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let cpu = cpu();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let n = 576;
    let rows = 5;
    let x = randn(&mut rng, rows * n);
    let w: Vec<u8> = randn(&mut rng, n)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let wv = view(&w, GgmlType::F32, n, 1);
    let (mut a, mut b) = (vec![0f32; rows * n], vec![0f32; rows * n]);
    cpu.rms_norm(
        RSlice::from_slice(&x),
        wv,
        1e-5,
        RSliceMut::from_mut_slice(&mut a),
    )
    .unwrap();
    gpu.rms_norm(
        RSlice::from_slice(&x),
        wv,
        1e-5,
        RSliceMut::from_mut_slice(&mut b),
    )
    .unwrap();
    let d = max_abs_diff(&a, &b);
    println!("rms_norm: {d:.2e}");
    assert!(d <= tol(&gpu, max_abs(&a)), "rms_norm {d}");
    let y = randn(&mut rng, rows * n);
    type Op = fn(&BackendBox, &mut [f32], &[f32], TensorView<'_>);
    let ops: [(&str, Op, f32); 5] = [
        (
            "add",
            |be, a, y, _| {
                be.add(RSliceMut::from_mut_slice(a), RSlice::from_slice(y))
                    .unwrap()
            },
            0.0,
        ),
        (
            "add_bias",
            |be, a, _, w| be.add_bias(RSliceMut::from_mut_slice(a), w).unwrap(),
            0.0,
        ),
        (
            "scale",
            |be, a, _, _| be.scale(RSliceMut::from_mut_slice(a), 0.37).unwrap(),
            0.0,
        ),
        // The CPU's own e^x, ported operation for operation: equal bits.
        (
            "swiglu",
            |be, a, y, _| {
                be.swiglu(RSliceMut::from_mut_slice(a), RSlice::from_slice(y))
                    .unwrap()
            },
            0.0,
        ),
        (
            "geglu",
            |be, a, y, _| {
                be.geglu(RSliceMut::from_mut_slice(a), RSlice::from_slice(y))
                    .unwrap()
            },
            0.0,
        ),
    ];
    for (name, op, tol) in ops {
        let (mut a, mut b) = (x.clone(), x.clone());
        op(&cpu, &mut a, &y, wv);
        op(&gpu, &mut b, &y, wv);
        let d = max_abs_diff(&a, &b);
        println!("{name}: {d:.2e}");
        assert!(d <= tol.max(self::tol(&gpu, max_abs(&a))), "{name}: {d}");
    }
}

#[test]
fn rope_variants_match_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let cpu = cpu();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let (n_head, head_dim) = (4usize, 64usize);
    let positions: Vec<u32> = vec![0, 1, 7, 100, 4095];
    let factors: Vec<f32> = (0..32).map(|i| 1.0 + i as f32 * 0.25).collect();
    for (neox, with_factors, yarn) in [
        (false, false, false),
        (true, false, false),
        (true, true, false),
        (false, false, true),
    ] {
        let params = RopeParams {
            n_rot: 64,
            freq_base: 10_000.0,
            freq_scale: if yarn { 0.25 } else { 1.0 },
            neox,
            freq_factors: if with_factors {
                Some(RSlice::from_slice(&factors[..]))
            } else {
                None
            }
            .into(),
            ext_factor: if yarn { 1.0 } else { 0.0 },
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 4096,
        };
        let x = randn(&mut rng, positions.len() * n_head * head_dim);
        let (mut a, mut b) = (x.clone(), x.clone());
        cpu.rope(
            RSliceMut::from_mut_slice(&mut a),
            n_head as u32,
            head_dim as u32,
            RSlice::from_slice(&positions),
            params,
        )
        .unwrap();
        gpu.rope(
            RSliceMut::from_mut_slice(&mut b),
            n_head as u32,
            head_dim as u32,
            RSlice::from_slice(&positions),
            params,
        )
        .unwrap();
        let d = max_abs_diff(&a, &b);
        println!("rope neox={neox} factors={with_factors} yarn={yarn}: {d:.2e}");
        // The cos/sin table comes from the host, computed as the CPU computes it.
        assert!(d <= tol(&gpu, max_abs(&a)), "rope {d}");
    }
}

#[test]
fn attention_variants_match_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let cpu = cpu();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for (n_head, n_head_kv, dk, window, softcap) in [
        (8u32, 2u32, 64u32, 0u32, 0.0f32),
        (4, 4, 128, 5, 0.0),
        (6, 3, 256, 0, 50.0),
    ] {
        let spec = KvSpec {
            n_layers: 2,
            n_ctx: 64,
            n_head_kv,
            head_dim_k: dk,
            head_dim_v: dk,
        };
        let (kc, kg) = (cpu.kv_create(spec).unwrap(), gpu.kv_create(spec).unwrap());
        let mut worst = 0.0f32;
        let mut pos = 0;
        for n_tokens in [7u32, 1, 1, 12, 1] {
            let p = AttentionParams {
                layer: 1,
                n_tokens,
                start_pos: pos,
                n_head,
                n_head_kv,
                head_dim_k: dk,
                head_dim_v: dk,
                scale: 1.0 / (dk as f32).sqrt(),
                sliding_window: window,
                softcap,
            };
            let q = randn(&mut rng, (n_tokens * n_head * dk) as usize);
            let k = randn(&mut rng, (n_tokens * n_head_kv * dk) as usize);
            let v = randn(&mut rng, (n_tokens * n_head_kv * dk) as usize);
            let (mut a, mut b) = (vec![0f32; q.len()], vec![0f32; q.len()]);
            cpu.attention(
                kc,
                RSlice::from_slice(&q),
                RSlice::from_slice(&k),
                RSlice::from_slice(&v),
                p,
                RSliceMut::from_mut_slice(&mut a),
            )
            .unwrap();
            gpu.attention(
                kg,
                RSlice::from_slice(&q),
                RSlice::from_slice(&k),
                RSlice::from_slice(&v),
                p,
                RSliceMut::from_mut_slice(&mut b),
            )
            .unwrap();
            worst = worst.max(max_abs_diff(&a, &b));
            pos += n_tokens;
        }
        // Truncation, then a re-evaluation of the dropped positions.
        cpu.kv_truncate(kc, 10).unwrap();
        gpu.kv_truncate(kg, 10).unwrap();
        println!("attention heads {n_head}/{n_head_kv} d {dk} window {window} softcap {softcap}: {worst:.2e}");
        // The CPU's numerics step for step (f16 queries, q · k in its order, f16
        // probabilities, f64 total, values summed in key order): equal bits.
        assert!(worst <= tol(&gpu, 1.0), "attention {worst}");
        cpu.kv_drop(kc);
        gpu.kv_drop(kg);
    }
}

/// A Llama-shaped random model mixing the test models' formats, with a stub byte-level
/// tokenizer so `prima run` can use it too.
/// `mixes[il % 2]` gives layer il's q, k, v, o, gate, up, down formats; `head` the token
/// embedding's and output head's.
fn write_model(
    path: &std::path::Path,
    n_layer: u64,
    mixes: [[GgmlType; 7]; 2],
    head: [GgmlType; 2],
) {
    let mut rng = ChaCha8Rng::seed_from_u64(2024);
    let (e, ff, n_vocab, n_head, n_head_kv) = (256u64, 768u64, VOCAB, 4u64, 2u64);
    let kv = e / n_head * n_head_kv;
    let mut w = GgufWriter::new();
    let u = |v: u64| Value::U32(v as u32);
    w.add("general.architecture", Value::String("llama".into()))
        .add("general.name", Value::String("wgpu-test-llama".into()))
        .add("llama.context_length", u(2048))
        .add("llama.embedding_length", u(e))
        .add("llama.block_count", u(n_layer))
        .add("llama.feed_forward_length", u(ff))
        .add("llama.attention.head_count", u(n_head))
        .add("llama.attention.head_count_kv", u(n_head_kv))
        .add("llama.rope.dimension_count", u(e / n_head))
        .add("llama.rope.freq_base", Value::F32(10_000.0))
        .add("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    let mut tokens: Vec<Value> = (0..256).map(|b| Value::String(byte_token(b))).collect();
    tokens.extend((256..n_vocab - 1).map(|i| Value::String(format!("<filler_{i}>"))));
    tokens.push(Value::String("<|endoftext|>".into()));
    let mut types = vec![Value::I32(1); n_vocab as usize];
    types[n_vocab as usize - 1] = Value::I32(3);
    w.add("tokenizer.ggml.model", Value::String("gpt2".into()))
        .add("tokenizer.ggml.pre", Value::String("llama-bpe".into()))
        .add("tokenizer.ggml.tokens", Value::Array(tokens))
        .add("tokenizer.ggml.token_type", Value::Array(types))
        .add(
            "tokenizer.ggml.merges",
            Value::Array(vec![Value::String("\u{0120} t".into())]),
        )
        .add("tokenizer.ggml.bos_token_id", u(n_vocab - 1))
        .add("tokenizer.ggml.eos_token_id", u(n_vocab - 1))
        .add("tokenizer.ggml.add_bos_token", Value::Bool(false));
    let mut add = |name: &str, dims: &[u64], ty: GgmlType| {
        let data = if ty == GgmlType::F32 && dims.len() == 1 {
            (0..dims[0])
                .flat_map(|_| (1.0 + (rng.gen::<f32>() - 0.5) * 0.2).to_le_bytes())
                .collect()
        } else {
            random_weight(
                &mut rng,
                ty,
                dims[0] as usize,
                dims[1..].iter().product::<u64>() as usize,
            )
        };
        w.add_tensor(name, dims, ty, &data).unwrap();
    };
    use GgmlType as T;
    add("token_embd.weight", &[e, n_vocab], head[0]);
    for il in 0..n_layer {
        let m = mixes[il as usize % 2];
        let b = |s: &str| format!("blk.{il}.{s}");
        add(&b("attn_norm.weight"), &[e], T::F32);
        add(&b("attn_q.weight"), &[e, e], m[0]);
        add(&b("attn_k.weight"), &[e, kv], m[1]);
        add(&b("attn_v.weight"), &[e, kv], m[2]);
        add(&b("attn_output.weight"), &[e, e], m[3]);
        add(&b("ffn_norm.weight"), &[e], T::F32);
        add(&b("ffn_gate.weight"), &[e, ff], m[4]);
        add(&b("ffn_up.weight"), &[e, ff], m[5]);
        add(&b("ffn_down.weight"), &[ff, e], m[6]);
    }
    add("output_norm.weight", &[e], T::F32);
    add("output.weight", &[e, n_vocab], head[1]);
    w.write(path).unwrap();
}

/// GPT-2's printable stand-in for byte `b`.
fn byte_token(b: u32) -> String {
    let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(b) {
        return char::from_u32(b).unwrap().to_string();
    }
    let rank = (0..b).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + rank).unwrap().to_string()
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold(
            (0, f32::MIN),
            |(bi, bv), (i, &x)| if x > bv { (i, x) } else { (bi, bv) },
        )
        .0
}

/// The top-2 gap above which both backends must pick the same token (as the golden
/// fixtures require of Prima against llama.cpp).
const GAP: f32 = 1.0;

fn top2_gap(v: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::MIN, f32::MIN);
    for &x in v {
        if x > a {
            b = a;
            a = x;
        } else if x > b {
            b = x;
        }
    }
    a - b
}

/// Per kind of operation: (calls, calls that differed, largest |Δ|).
type OpStats =
    std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<&'static str, (u32, u32, f32)>>>;

/// Both backends behind one: every operation runs on the CPU and on the GPU with the same
/// inputs, the CPU's result goes on, and each kind of operation records how often and how
/// far the GPU's differed. Tells which operation a model-level difference starts in.
struct Tee {
    cpu: BackendBox,
    gpu: BackendBox,
    /// cpu KV id → gpu KV id.
    kv: std::sync::Mutex<std::collections::HashMap<u64, u64>>,
    stats: OpStats,
}

impl Tee {
    fn note(&self, op: &'static str, cpu: &[f32], gpu: &[f32]) {
        let d = max_abs_diff(cpu, gpu);
        let mut st = self.stats.lock().unwrap();
        let e = st.entry(op).or_insert((0, 0, 0.0));
        e.0 += 1;
        if d > 0.0 || cpu.iter().zip(gpu).any(|(a, b)| a.to_bits() != b.to_bits()) {
            e.1 += 1;
        }
        e.2 = e.2.max(d);
    }

    /// Runs `f` on both with copies of `buf`, keeps the CPU's.
    fn both(
        &self,
        op: &'static str,
        buf: &mut [f32],
        f: impl Fn(&BackendBox, &mut [f32]) -> BackendResult<()>,
    ) -> BackendResult<()> {
        let mut g = buf.to_vec();
        f(&self.gpu, &mut g).unwrap();
        let r = f(&self.cpu, buf);
        self.note(op, buf, &g);
        r
    }
}

impl Backend for Tee {
    fn name(&self) -> RString {
        "tee".into()
    }
    fn describe(&self) -> RString {
        "cpu + wgpu".into()
    }
    fn supports(&self, t: u32) -> bool {
        self.cpu.supports(t) && self.gpu.supports(t)
    }
    fn get_rows(
        &self,
        table: TensorView<'_>,
        ids: RSlice<'_, u32>,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        self.both("get_rows", out.as_mut_slice(), |be, o| {
            be.get_rows(table, ids, RSliceMut::from_mut_slice(o))
        })
    }
    fn matmul(
        &self,
        w: TensorView<'_>,
        x: RSlice<'_, f32>,
        n: u32,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        let op = match GgmlType::from_id(w.ggml_type).map(|t| t.name()) {
            Some("F32") => "matmul F32",
            Some("F16") => "matmul F16",
            Some("Q4_0") => "matmul Q4_0",
            Some("Q4_1") => "matmul Q4_1",
            Some("Q5_0") => "matmul Q5_0",
            Some("Q5_1") => "matmul Q5_1",
            Some("Q8_0") => "matmul Q8_0",
            Some("Q2_K") => "matmul Q2_K",
            Some("Q3_K") => "matmul Q3_K",
            Some("Q4_K") => "matmul Q4_K",
            Some("Q5_K") => "matmul Q5_K",
            Some("Q6_K") => "matmul Q6_K",
            _ => "matmul other",
        };
        self.both(op, out.as_mut_slice(), |be, o| {
            be.matmul(w, x, n, RSliceMut::from_mut_slice(o))
        })
    }
    fn rms_norm(
        &self,
        x: RSlice<'_, f32>,
        w: TensorView<'_>,
        eps: f32,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        self.both("rms_norm", out.as_mut_slice(), |be, o| {
            be.rms_norm(x, w, eps, RSliceMut::from_mut_slice(o))
        })
    }
    fn add(&self, mut acc: RSliceMut<'_, f32>, x: RSlice<'_, f32>) -> BackendResult<()> {
        self.both("add", acc.as_mut_slice(), |be, o| {
            be.add(RSliceMut::from_mut_slice(o), x)
        })
    }
    fn add_bias(&self, mut x: RSliceMut<'_, f32>, b: TensorView<'_>) -> BackendResult<()> {
        self.both("add_bias", x.as_mut_slice(), |be, o| {
            be.add_bias(RSliceMut::from_mut_slice(o), b)
        })
    }
    fn scale(&self, mut x: RSliceMut<'_, f32>, v: f32) -> BackendResult<()> {
        self.both("scale", x.as_mut_slice(), |be, o| {
            be.scale(RSliceMut::from_mut_slice(o), v)
        })
    }
    fn rope(
        &self,
        mut x: RSliceMut<'_, f32>,
        n_head: u32,
        head_dim: u32,
        pos: RSlice<'_, u32>,
        p: RopeParams<'_>,
    ) -> BackendResult<()> {
        self.both("rope", x.as_mut_slice(), |be, o| {
            be.rope(RSliceMut::from_mut_slice(o), n_head, head_dim, pos, p)
        })
    }
    fn swiglu(&self, mut g: RSliceMut<'_, f32>, up: RSlice<'_, f32>) -> BackendResult<()> {
        self.both("swiglu", g.as_mut_slice(), |be, o| {
            be.swiglu(RSliceMut::from_mut_slice(o), up)
        })
    }
    fn geglu(&self, mut g: RSliceMut<'_, f32>, up: RSlice<'_, f32>) -> BackendResult<()> {
        self.both("geglu", g.as_mut_slice(), |be, o| {
            be.geglu(RSliceMut::from_mut_slice(o), up)
        })
    }
    fn kv_create(&self, spec: KvSpec) -> BackendResult<u64> {
        let g = self.gpu.kv_create(spec).unwrap();
        let c = self.cpu.kv_create(spec).unwrap();
        self.kv.lock().unwrap().insert(c, g);
        ROk(c)
    }
    fn kv_drop(&self, kv: u64) {
        if let Some(g) = self.kv.lock().unwrap().remove(&kv) {
            self.gpu.kv_drop(g);
        }
        self.cpu.kv_drop(kv);
    }
    fn kv_truncate(&self, kv: u64, n: u32) -> BackendResult<()> {
        let g = self.kv.lock().unwrap()[&kv];
        self.gpu.kv_truncate(g, n).unwrap();
        self.cpu.kv_truncate(kv, n)
    }
    fn attention(
        &self,
        kv: u64,
        q: RSlice<'_, f32>,
        k: RSlice<'_, f32>,
        v: RSlice<'_, f32>,
        p: AttentionParams,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        let g = self.kv.lock().unwrap()[&kv];
        let mut go = out.as_slice().to_vec();
        self.gpu
            .attention(g, q, k, v, p, RSliceMut::from_mut_slice(&mut go))
            .unwrap();
        let r = self.cpu.attention(
            kv,
            q,
            k,
            v,
            p,
            RSliceMut::from_mut_slice(out.as_mut_slice()),
        );
        self.note("attention", out.as_slice(), &go);
        r
    }
    fn idle(&self) {
        self.cpu.idle();
        self.gpu.idle();
    }
}

const VOCAB: u64 = 512;

fn compare_models(
    name: &str,
    path: &std::path::Path,
    prompt: &[u32],
    n_gen: usize,
) -> Option<Comparison> {
    let gpu = gpu()?;
    let cpu = cpu();
    let strict = exact(&gpu);
    let model = Model::load(path).unwrap();
    // Greedy decoding; `feed` replaces the model's own choices. Returns every step's logits
    // and the tokens chosen.
    let run = |be: &BackendBox, feed: Option<&[u32]>| {
        let mut s = Session::new(&model, be, 256, 64).unwrap();
        let mut logits = vec![s.eval(prompt).unwrap().to_vec()];
        let mut tokens = vec![argmax(&logits[0]) as u32];
        for i in 0..n_gen {
            let next = feed.map_or(tokens[i], |f| f[i]);
            let l = s.eval(&[next]).unwrap().to_vec();
            tokens.push(argmax(&l) as u32);
            logits.push(l);
        }
        (logits, tokens)
    };
    let (lc, tc) = run(&cpu, None);
    let (_, tg) = run(&gpu, None);
    let (lf, tf) = run(&gpu, Some(&tc));
    let mut c = Comparison {
        max_diff: 0.0,
        max_logit: 0.0,
        top1_equal: 0,
        steps: lc.len(),
        decided_mismatches: 0,
        greedy_equal: tc.iter().zip(&tg).take_while(|(a, b)| a == b).count(),
        n_greedy: tc.len(),
        strict,
    };
    for (step, (a, b)) in lc.iter().zip(&lf).enumerate() {
        c.max_diff = c.max_diff.max(max_abs_diff(a, b));
        c.max_logit = c.max_logit.max(max_abs(a));
        if tc[step] == tf[step] {
            c.top1_equal += 1;
        } else {
            let gap = top2_gap(a);
            if gap > GAP {
                c.decided_mismatches += 1;
            }
            println!(
                "{name}: step {step}: cpu {} gpu {} (cpu top-2 gap {gap:.3})",
                tc[step], tf[step]
            );
        }
    }
    println!(
        "{name}: logits max |cpu-gpu| {:.2e} over {} steps (max |logit| {:.2}, {:.1e} of it); \
         top-1 equal {}/{}, {} differ where the cpu's top-2 gap > {GAP}; free-running greedy \
         tokens equal for the first {}/{}",
        c.max_diff,
        c.steps,
        c.max_logit,
        c.max_diff / c.max_logit.max(1e-30),
        c.top1_equal,
        c.steps,
        c.decided_mismatches,
        c.greedy_equal,
        c.n_greedy,
    );
    Some(c)
}

/// Both backends on one model: the CPU decodes greedily; the GPU is fed the CPU's tokens
/// (so every step's logits are comparable) and also decodes greedily on its own.
struct Comparison {
    /// Largest |cpu − gpu| logit over the prompt and every fed step.
    max_diff: f32,
    /// Largest |logit| the CPU gave.
    max_logit: f32,
    /// Steps (prompt + fed tokens) whose top-1 agreed, and their number.
    top1_equal: usize,
    steps: usize,
    /// Steps where the CPU's top-2 gap exceeds [`GAP`] but the GPU picked another token.
    decided_mismatches: usize,
    /// How many of the greedy tokens agree before the first difference, free-running.
    greedy_equal: usize,
    n_greedy: usize,
    /// Whether the logits must be the CPU's bit for bit ([`exact`]).
    strict: bool,
}

#[test]
fn a_generated_f32_model_gives_the_cpus_logits_and_tokens() {
    // With F32 weights neither backend quantizes activations; this checks the whole
    // forward pass (RoPE, the KV cache across steps, attention, norms).
    let path =
        std::env::temp_dir().join(format!("prima-wgpu-test-f32-{}.gguf", std::process::id()));
    let f = GgmlType::F32;
    write_model(&path, 2, [[f; 7]; 2], [f, f]);
    let prompt: Vec<u32> = (0..12).map(|i| (i * 131 + 7) % VOCAB as u32).collect();
    let Some(c) = compare_models("f32 model", &path, &prompt, 8) else {
        return;
    };
    let _ = std::fs::remove_file(&path);
    assert!(
        !c.strict || c.max_diff == 0.0,
        "logits differ by {}",
        c.max_diff
    );
    assert_eq!(c.decided_mismatches, 0);
}

/// A model from `models/` (fetched) or the derived test models, or `None` where it is
/// absent and absence is allowed (`PRIMA_REQUIRE_MODELS` unset).
fn model_path(path: std::path::PathBuf) -> Option<std::path::PathBuf> {
    if path.exists() {
        return Some(path);
    }
    if std::env::var_os("PRIMA_REQUIRE_MODELS").is_some() {
        panic!(
            "{} is missing (run `cargo xtask setup` / `cargo xtask test-models`)",
            path.display()
        );
    }
    eprintln!("note: skipping, {} is absent", path.display());
    None
}

fn fetched(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name)
}

fn derived(name: &str) -> std::path::PathBuf {
    let dir = match std::env::var_os("PRIMA_MODEL_DIR") {
        Some(d) => std::path::PathBuf::from(d),
        None => std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/prima/models"),
    };
    dir.join(name)
}

/// A real model, `n_gen` greedy tokens after a short prompt: tokens must agree wherever
/// the CPU's top-2 gap exceeds 1.0, as the golden fixtures require, and on lavapipe the
/// logits equal the CPU's bit for bit.
fn real_model_matches(name: &str, path: std::path::PathBuf, n_gen: usize) {
    let Some(path) = model_path(path) else { return };
    let model = Model::load(&path).unwrap();
    let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
    let prompt = tok.encode("The capital of France is a city called", true, false);
    drop(model);
    let Some(c) = compare_models(name, &path, &prompt, n_gen) else {
        return;
    };
    assert_eq!(c.decided_mismatches, 0);
    assert!(
        !c.strict || c.max_diff == 0.0,
        "logits differ by {}",
        c.max_diff
    );
}

/// SmolLM2-135M Q4_1, the project's reference model: 16 tokens.
#[test]
fn smollm2_q4_1_end_to_end_matches_the_cpu() {
    real_model_matches(
        "SmolLM2 Q4_1",
        fetched("SmolLM2-135M-Instruct.Q4_1.gguf"),
        16,
    );
}

/// Gemma 3 270M Q4_K_M (GeGLU, sliding-window layers, K-quants, a 262144-row output head
/// split over two dispatch dimensions on GPUs): 4 tokens, its head is slow on lavapipe.
#[test]
fn gemma3_q4_k_m_end_to_end_matches_the_cpu() {
    real_model_matches("Gemma 3 Q4_K_M", fetched("gemma-3-270m-q4_k_m.gguf"), 4);
}

/// The tiny random Gemma 3 of the derived test models (F32).
#[test]
fn tiny_gemma3_end_to_end_matches_the_cpu() {
    real_model_matches("tiny Gemma 3 F32", derived("tiny-gemma3-f32.gguf"), 8);
}

/// A weight too large for one binding is split into parts of whole rows, each with its own
/// dispatch: forced here with a tiny binding limit. The same kernels run on each part, so
/// the results are the unsplit backend's bit for bit.
#[test]
fn a_weight_split_over_several_bindings_gives_the_same_results() {
    let Some(whole) = gpu() else { return };
    let split =
        prima_backend_metal::WgpuBackend::with_part_limit(BackendConfig { threads: 0 }, Some(4096))
            .unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for ty in [GgmlType::Q4_1, GgmlType::F32, GgmlType::Q6K] {
        let (cols, rows) = (512, 40);
        let w = random_weight(&mut rng, ty, cols, rows);
        let wv = view(&w, ty, cols, rows);
        let x = randn(&mut rng, 3 * cols);
        let (mut a, mut b) = (vec![0f32; 3 * rows], vec![0f32; 3 * rows]);
        let xs = RSlice::from_slice(&x);
        whole
            .matmul(wv, xs, 3, RSliceMut::from_mut_slice(&mut a))
            .unwrap();
        split
            .matmul(wv, xs, 3, RSliceMut::from_mut_slice(&mut b))
            .unwrap();
        assert_eq!(max_abs_diff(&a, &b), 0.0, "{ty} matmul");
        let ids = [0u32, 39, 17, 3];
        let (mut a, mut b) = (vec![0f32; 4 * cols], vec![0f32; 4 * cols]);
        let ids = RSlice::from_slice(&ids);
        whole
            .get_rows(wv, ids, RSliceMut::from_mut_slice(&mut a))
            .unwrap();
        split
            .get_rows(wv, ids, RSliceMut::from_mut_slice(&mut b))
            .unwrap();
        assert_eq!(max_abs_diff(&a, &b), 0.0, "{ty} get_rows");
    }
}

/// Every operation of a generated quantized model's forward pass, run on both backends with
/// the same inputs: reports, per kind of operation, how many calls differed and by how much.
#[test]
fn each_operation_inside_a_model_matches_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let strict = exact(&gpu);
    let cpu = cpu();
    let stats = OpStats::default();
    let tee = Backend_TO::from_value(
        Tee {
            cpu,
            gpu,
            kv: Default::default(),
            stats: stats.clone(),
        },
        TD_Opaque,
    );
    let path = std::env::temp_dir().join(format!("prima-wgpu-test-q-{}.gguf", std::process::id()));
    use GgmlType as T;
    let mixes = [
        [
            T::Q4_0,
            T::Q4_1,
            T::Q8_0,
            T::Q5_0,
            T::Q4_1,
            T::Q5_1,
            T::Q8_0,
        ],
        [T::Q4K, T::Q3K, T::Q6K, T::Q4K, T::Q5K, T::Q2K, T::F16],
    ];
    write_model(&path, 2, mixes, [T::Q8_0, T::Q6K]);
    let model = Model::load(&path).unwrap();
    let prompt: Vec<u32> = (0..12).map(|i| (i * 131 + 7) % VOCAB as u32).collect();
    let mut s = Session::new(&model, &tee, 256, 64).unwrap();
    let mut next = argmax(s.eval(&prompt).unwrap()) as u32;
    for _ in 0..4 {
        next = argmax(s.eval(&[next]).unwrap()) as u32;
    }
    drop(s);
    drop(model);
    let _ = std::fs::remove_file(&path);
    let mut differing = Vec::new();
    for (op, (calls, diff, worst)) in stats.lock().unwrap().iter() {
        println!("{op:<12} {calls:>4} calls, {diff:>4} differ, max |Δ| {worst:.2e}");
        if *diff > 0 {
            differing.push(format!("{op}: {worst:.2e}"));
        }
    }
    assert!(
        !strict || differing.is_empty(),
        "differ from the CPU: {differing:?}"
    );
}

/// Bad arguments are errors naming what is wrong, never panics, and the backend keeps
/// working after them.
#[test]
fn bad_arguments_are_errors() {
    let Some(gpu) = gpu() else { return };
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
    let e = gpu.kv_create(spec).into_result().unwrap_err();
    assert!(e.contains("must be even"), "{e}");
    let e = gpu.kv_truncate(12345, 0).into_result().unwrap_err();
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
    let Some(gpu) = gpu() else { return };
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
    let Some(path) = model_path(fetched("SmolLM2-135M-Instruct.Q4_1.gguf")) else {
        return;
    };
    let Some(gpu) = gpu() else { return };
    let cpu = cpu();
    let model = Model::load(&path).unwrap();
    let tok = Tokenizer::from_gguf(model.gguf()).unwrap();
    let prompt = tok.encode("The capital of France is a city called", true, false);
    let all: Vec<usize> = (0..model.hparams().n_layers).collect();
    let on_gpu: Vec<usize> = (0..12).collect();
    let mut alone = Session::new(&model, &cpu, 128, 64).unwrap();
    let split_layers = prima_core::model::GpuLayers {
        backend: &gpu,
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
            diff <= tol(&gpu, max_abs(&a)),
            "step {step}: split logits differ by {diff}"
        );
        let next = argmax(&a) as u32;
        if exact(&gpu) || top2_gap(&a) > GAP {
            assert_eq!(argmax(&b) as u32, next, "step {step}: greedy token");
        }
        a = alone.eval(&[next]).unwrap().to_vec();
        b = split.eval(&[next]).unwrap().to_vec();
    }
}

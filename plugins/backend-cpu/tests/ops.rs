//! Backend operations against direct f64 formulas, called through the `Backend` trait of
//! [`CpuBackend`].
//!
//! - matmul: every weight type, 1 and 3 threads give bit-identical results, 37 rows (not a
//!   multiple of any chunk), n_tokens 1 and 3 (each token equals its own single-token call),
//!   every element equals the format's `vec_dot`, and the f64 dot of dequantized operands
//!   within the activation step; bad shapes and types are errors.
//! - get_rows: rows equal `dequantize_row`; out-of-range ids are errors.
//! - rms_norm (several rows, per-head row length; a batch's rows as each alone), swiglu, geglu, add, add_bias, scale;
//!   prompt-sized swiglu/geglu (split over the pool) equal the element-wise functions.
//! - rope: normal and NeoX ordering, partial rotation, freq_factors and YaRN, vs f64.
//! - attention: GQA, prefill then decode, sliding window, soft-capping, vs a naive f64
//!   softmax over f16-rounded q/k/v and probabilities; truncate and rewrite; shape and position errors.

use abi_stable::std_types::{RNone, ROption, RSlice, RSliceMut, RSome};
use prima_abi::backend::{
    AttentionParams, AttentionSpan, Backend, BackendConfig, KvSpec, RopeParams, TensorView,
};
use prima_abi::on_host::OnHost;
use prima_abi::GgmlType;
use prima_backend_cpu::formats::scalar;
use prima_backend_cpu::CpuBackend;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn backend(threads: u32) -> CpuBackend {
    CpuBackend::new(BackendConfig { threads }).unwrap()
}

fn view(data: &[u8], t: GgmlType, cols: usize, rows: usize) -> TensorView<'_> {
    TensorView {
        data: RSlice::from_slice(data),
        ggml_type: t.id(),
        cols: cols as u64,
        rows: rows as u64,
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn rand_vec(rng: &mut ChaCha8Rng, n: usize, r: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-r..r)).collect()
}

/// Random valid weights: quantize nothing, just sanitise the f16 scales of random bytes.
fn random_weights(rng: &mut ChaCha8Rng, t: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let n = rows * cols;
    match t {
        GgmlType::F32 => f32_bytes(&rand_vec(rng, n, 1.0)),
        GgmlType::F16 => (0..n)
            .flat_map(|_| half::f16::from_f32(rng.gen_range(-1.0..1.0)).to_le_bytes())
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| half::bf16::from_f32(rng.gen_range(-1.0..1.0)).to_le_bytes())
            .collect(),
        _ => {
            let fields: &[usize] = match t {
                GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
                GgmlType::Q2K => &[80, 82],
                GgmlType::Q3K => &[108],
                GgmlType::Q6K => &[208],
                GgmlType::MXFP4 => &[],
                _ => &[0, 2],
            };
            let mut data = vec![0u8; rows * t.row_bytes(cols).unwrap()];
            rng.fill(&mut data[..]);
            for block in data.chunks_exact_mut(t.block_bytes()) {
                for &off in fields {
                    block[off..off + 2].copy_from_slice(
                        &half::f16::from_f32(rng.gen_range(-0.05..0.05)).to_le_bytes(),
                    );
                }
                if t == GgmlType::MXFP4 {
                    // The E8M0 exponent: half-scales 2^-10 ..= 2^2.
                    block[0] = rng.gen_range(118..=130);
                }
            }
            data
        }
    }
}

use prima_backend_cpu::formats::WEIGHT_TYPES;

fn run_matmul(b: &CpuBackend, w: TensorView<'_>, x: &[f32], n_tokens: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; n_tokens * w.rows as usize];
    OnHost(b)
        .matmul(
            w,
            RSlice::from_slice(x),
            n_tokens as u32,
            RSliceMut::from_mut_slice(&mut out),
        )
        .unwrap();
    out
}

#[test]
fn matmul_is_independent_of_threads_and_matches_vec_dot() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let (one, three) = (backend(1), backend(3));
    let (rows, cols, n_tokens) = (37usize, 512usize, 3usize);
    for t in WEIGHT_TYPES {
        let data = random_weights(&mut rng, t, rows, cols);
        let w = view(&data, t, cols, rows);
        let x = rand_vec(&mut rng, n_tokens * cols, 2.0);

        let a = run_matmul(&one, w, &x, n_tokens);
        let b = run_matmul(&three, w, &x, n_tokens);
        assert_eq!(a, b, "{t}: 1 vs 3 threads");
        for tok in 0..n_tokens {
            let single = run_matmul(&three, w, &x[tok * cols..(tok + 1) * cols], 1);
            assert_eq!(
                single,
                a[tok * rows..(tok + 1) * rows],
                "{t}: token {tok} alone"
            );
        }

        let k = scalar::kernels(t).unwrap();
        let row_bytes = t.row_bytes(cols).unwrap();
        let mut act = vec![0u8; k.vec_dot_type.row_bytes(cols).unwrap()];
        let mut wf = vec![0f32; cols];
        for tok in 0..n_tokens {
            let xr = &x[tok * cols..(tok + 1) * cols];
            (k.quantize_activation)(xr, &mut act);
            for r in 0..rows {
                let wr = &data[r * row_bytes..(r + 1) * row_bytes];
                let got = a[tok * rows + r];
                assert_eq!(got, (k.vec_dot)(cols, wr, &act), "{t}: token {tok} row {r}");
                (k.dequantize_row)(wr, &mut wf);
                let exact: f64 = wf.iter().zip(xr).map(|(&p, &q)| p as f64 * q as f64).sum();
                let mag: f64 = wf
                    .iter()
                    .zip(xr)
                    .map(|(&p, &q)| (p as f64 * q as f64).abs())
                    .sum();
                let wsum: f64 = wf.iter().map(|v| v.abs() as f64).sum();
                // Activations are quantized to 8 bits (≤ 2/127 per element here) or rounded.
                let tol = wsum * 2.0 / 127.0 + 1e-3 * mag;
                assert!(
                    (got as f64 - exact).abs() <= tol,
                    "{t}: row {r}: {got} vs {exact}"
                );
            }
        }
    }
}

#[test]
fn matmul_rejects_bad_shapes() {
    let b = backend(2);
    let data = vec![0u8; 4 * GgmlType::Q4_0.row_bytes(64).unwrap()];
    let w = view(&data, GgmlType::Q4_0, 64, 4);
    let x = vec![0f32; 128];
    let mut out = vec![0f32; 8];
    let err = |w: TensorView<'_>, x: &[f32], n: u32, out: &mut [f32]| {
        OnHost(&b)
            .matmul(w, RSlice::from_slice(x), n, RSliceMut::from_mut_slice(out))
            .unwrap_err()
            .to_string()
    };
    assert!(err(w, &x[..100], 2, &mut out).contains("matmul: x length"));
    assert!(err(w, &x, 2, &mut out[..7]).contains("matmul: out length"));
    assert!(err(view(&data[1..], GgmlType::Q4_0, 64, 4), &x, 2, &mut out).contains("data length"));
    assert!(err(view(&data, GgmlType::Q4_0, 48, 4), &x, 2, &mut out).contains("whole number"));
    assert!(
        err(TensorView { ggml_type: 99, ..w }, &x, 2, &mut out).contains("unknown GGUF type id 99")
    );
    let q8k = vec![0u8; GgmlType::Q8K.row_bytes(256).unwrap()];
    let x256 = vec![0f32; 256];
    assert!(
        err(view(&q8k, GgmlType::Q8K, 256, 1), &x256, 1, &mut out[..1]).contains("not supported")
    );
    // Q8_0 activations need 32-element blocks: an F16 weight of 48 columns still works.
    let f16w = vec![0u8; 2 * 48];
    let mut one = [1f32];
    OnHost(&b)
        .matmul(
            view(&f16w, GgmlType::F16, 48, 1),
            RSlice::from_slice(&x[..48]),
            1,
            RSliceMut::from_mut_slice(&mut one),
        )
        .unwrap();
    assert_eq!(one, [0.0]);
}

#[test]
fn supports_exactly_the_weight_types() {
    let b = backend(1);
    for t in GgmlType::ALL {
        assert_eq!(b.supports(t.id()), WEIGHT_TYPES.contains(&t), "{t}");
    }
    assert!(!b.supports(1234));
    let level = prima_backend_cpu::formats::dispatch::kernel_level_name();
    assert_eq!(
        b.describe().as_str(),
        format!("cpu: {level} kernels, 1 threads")
    );
}

#[test]
fn get_rows_dequantizes_rows() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let b = backend(2);
    for t in WEIGHT_TYPES {
        let (rows, cols) = (5, 256);
        let data = random_weights(&mut rng, t, rows, cols);
        let ids = [4u32, 0, 4, 2];
        let mut out = vec![f32::NAN; ids.len() * cols];
        OnHost(&b)
            .get_rows(
                view(&data, t, cols, rows),
                RSlice::from_slice(&ids),
                RSliceMut::from_mut_slice(&mut out),
            )
            .unwrap();
        let rb = t.row_bytes(cols).unwrap();
        let mut want = vec![0f32; cols];
        for (i, &id) in ids.iter().enumerate() {
            scalar::dequantize_row(t)(&data[id as usize * rb..(id as usize + 1) * rb], &mut want);
            assert_eq!(out[i * cols..(i + 1) * cols], want[..], "{t}: id {id}");
        }
        let e = OnHost(&b).get_rows(
            view(&data, t, cols, rows),
            RSlice::from_slice(&[5]),
            RSliceMut::from_mut_slice(&mut out[..cols]),
        );
        assert!(e
            .unwrap_err()
            .as_str()
            .contains("get_rows: id 5 is out of range"));
    }
}

#[test]
fn rms_norm_of_a_batch_equals_each_row_alone() {
    // Rows are normalised several at a time (their sums side by side): every count of rows,
    // whole groups and left-overs, gives each row the bits it gets alone.
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let b = backend(1);
    let n = 96;
    let wb = f32_bytes(&rand_vec(&mut rng, n, 2.0));
    let norm = |x: &[f32]| {
        let mut out = vec![0f32; x.len()];
        OnHost(&b)
            .rms_norm(
                RSlice::from_slice(x),
                view(&wb, GgmlType::F32, n, 1),
                1e-5,
                RSliceMut::from_mut_slice(&mut out),
            )
            .unwrap();
        out
    };
    for rows in 1..=9 {
        let x = rand_vec(&mut rng, rows * n, 1e3);
        let batch = norm(&x);
        for (r, got) in batch.chunks_exact(n).enumerate() {
            let alone = norm(&x[r * n..(r + 1) * n]);
            let same = got
                .iter()
                .zip(&alone)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "row {r} of {rows}");
        }
    }
}

#[test]
fn rms_norm_and_elementwise_match_formulas() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let b = backend(2);
    let (rows, n) = (6, 64);
    let x = rand_vec(&mut rng, rows * n, 3.0);
    let wv = rand_vec(&mut rng, n, 2.0);
    let wb = f32_bytes(&wv);
    let mut out = vec![0f32; rows * n];
    let eps = 1e-6;
    OnHost(&b)
        .rms_norm(
            RSlice::from_slice(&x),
            view(&wb, GgmlType::F32, n, 1),
            eps,
            RSliceMut::from_mut_slice(&mut out),
        )
        .unwrap();
    for r in 0..rows {
        let xr = &x[r * n..(r + 1) * n];
        let ms: f64 = xr.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n as f64;
        for i in 0..n {
            let want = xr[i] as f64 / (ms + eps as f64).sqrt() * wv[i] as f64;
            assert!(
                (out[r * n + i] as f64 - want).abs() <= 1e-5 * want.abs().max(1e-3),
                "rms_norm {r},{i}"
            );
        }
    }
    let bad = OnHost(&b).rms_norm(
        RSlice::from_slice(&x[..63]),
        view(&wb, GgmlType::F32, n, 1),
        eps,
        RSliceMut::from_mut_slice(&mut out[..63]),
    );
    assert!(bad.unwrap_err().as_str().contains("rms_norm: x length 63"));

    let up = rand_vec(&mut rng, 100, 3.0);
    let gate = rand_vec(&mut rng, 100, 6.0);
    let mut g = gate.clone();
    OnHost(&b)
        .swiglu(RSliceMut::from_mut_slice(&mut g), RSlice::from_slice(&up))
        .unwrap();
    let mut h = gate.clone();
    OnHost(&b)
        .geglu(RSliceMut::from_mut_slice(&mut h), RSlice::from_slice(&up))
        .unwrap();
    for i in 0..100 {
        let (x, u) = (gate[i] as f64, up[i] as f64);
        let silu = x / (1.0 + (-x).exp()) * u;
        let gelu = 0.5
            * x
            * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
            * u;
        assert!(
            (g[i] as f64 - silu).abs() <= 1e-5 * silu.abs().max(1.0),
            "swiglu {i}"
        );
        assert!(
            (h[i] as f64 - gelu).abs() <= 1e-5 * gelu.abs().max(1.0),
            "geglu {i}"
        );
    }
    assert!(OnHost(&b)
        .swiglu(
            RSliceMut::from_mut_slice(&mut g),
            RSlice::from_slice(&up[..99])
        )
        .is_err());

    let mut acc = vec![1.0f32; 8];
    OnHost(&b)
        .add(
            RSliceMut::from_mut_slice(&mut acc),
            RSlice::from_slice(&[0.5; 8]),
        )
        .unwrap();
    OnHost(&b)
        .scale(RSliceMut::from_mut_slice(&mut acc), 2.0)
        .unwrap();
    let bias = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
    OnHost(&b)
        .add_bias(
            RSliceMut::from_mut_slice(&mut acc),
            view(&bias, GgmlType::F32, 4, 1),
        )
        .unwrap();
    assert_eq!(acc, [4.0, 5.0, 6.0, 7.0, 4.0, 5.0, 6.0, 7.0]);
    assert!(OnHost(&b)
        .add_bias(
            RSliceMut::from_mut_slice(&mut acc[..7]),
            view(&bias, GgmlType::F32, 4, 1)
        )
        .is_err());
}

#[test]
fn gated_activations_split_over_the_pool_match_elementwise() {
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    let n = 3 * 16 * 1024 + 5;
    let up = rand_vec(&mut rng, n, 3.0);
    let gate = rand_vec(&mut rng, n, 6.0);
    for threads in [1, 2, 3] {
        let b = backend(threads);
        let mut g = gate.clone();
        OnHost(&b)
            .swiglu(RSliceMut::from_mut_slice(&mut g), RSlice::from_slice(&up))
            .unwrap();
        let mut h = gate.clone();
        OnHost(&b)
            .geglu(RSliceMut::from_mut_slice(&mut h), RSlice::from_slice(&up))
            .unwrap();
        for i in 0..n {
            let (x, u) = (gate[i], up[i]);
            assert_eq!(
                g[i].to_bits(),
                (prima_backend_cpu::ops::activation::silu(x) * u).to_bits(),
                "swiglu {i}"
            );
            let gelu = prima_backend_cpu::ops::activation::gelu_tanh(x) * u;
            assert_eq!(
                h[i].to_bits(),
                gelu.to_bits(),
                "geglu {i}, {threads} threads"
            );
        }
    }
}

/// gpt-oss's clamped SwiGLU: the formula in f64 (the gate clamped above at the limit, the
/// up clamped both ways and shifted by one), bit for bit the ABI's host body at every pool
/// split, and a length mismatch refused.
#[test]
fn clamped_swiglu_matches_the_formula_at_every_split() {
    let mut rng = ChaCha8Rng::seed_from_u64(37);
    let n = 3 * 16 * 1024 + 5;
    // Spread past the limit (7) on both sides.
    let up = rand_vec(&mut rng, n, 12.0);
    let gate = rand_vec(&mut rng, n, 12.0);
    let (alpha, limit) = (1.702f32, 7.0f32);
    let mut host = gate.clone();
    prima_abi::backend::swiglu_oai_host(&mut host, &up, alpha, limit);
    for threads in [1, 3] {
        let b = backend(threads);
        let mut g = gate.clone();
        OnHost(&b)
            .swiglu_oai(
                RSliceMut::from_mut_slice(&mut g),
                RSlice::from_slice(&up),
                alpha,
                limit,
            )
            .unwrap();
        for i in 0..n {
            assert_eq!(g[i].to_bits(), host[i].to_bits(), "swiglu_oai {i}");
            let x = (gate[i] as f64).min(limit as f64);
            let y = (up[i] as f64).clamp(-(limit as f64), limit as f64);
            let want = x / (1.0 + (-(alpha as f64) * x).exp()) * (y + 1.0);
            assert!(
                (g[i] as f64 - want).abs() <= 1e-5 * want.abs().max(1.0),
                "swiglu_oai {i}: {} vs {want}",
                g[i]
            );
        }
        assert!(OnHost(&b)
            .swiglu_oai(
                RSliceMut::from_mut_slice(&mut g[..10]),
                RSlice::from_slice(&up[..9]),
                alpha,
                limit
            )
            .is_err());
    }
}

fn rope_params(n_rot: u32, neox: bool, factors: Option<&[f32]>) -> RopeParams<'_> {
    RopeParams {
        n_rot,
        freq_base: 10000.0,
        freq_scale: 1.0,
        neox,
        freq_factors: match factors {
            Some(f) => RSome(RSlice::from_slice(f)),
            None => RNone,
        },
        ext_factor: 0.0,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        n_ctx_orig: 4096,
    }
}

/// The f64 rotation angle and magnitude of pair `i`, YaRN included.
fn rope_angle(p: &RopeParams<'_>, pos: u32, i: usize) -> (f64, f64) {
    let n = p.n_rot as f64;
    let ff = match &p.freq_factors {
        ROption::RSome(f) => f[i] as f64,
        ROption::RNone => 1.0,
    };
    let extrap = pos as f64 * (p.freq_base as f64).powf(-2.0 * i as f64 / n) / ff;
    let interp = p.freq_scale as f64 * extrap;
    if p.ext_factor == 0.0 {
        return (interp, p.attn_factor as f64);
    }
    let corr = |beta: f64| {
        n * ((p.n_ctx_orig as f64) / (beta * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * (p.freq_base as f64).ln())
    };
    let low = corr(p.beta_fast as f64).floor().max(0.0);
    let high = corr(p.beta_slow as f64).ceil().min(n - 1.0);
    let ramp = 1.0 - ((i as f64 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
    let mix = ramp * p.ext_factor as f64;
    let mscale = p.attn_factor as f64 * (1.0 + 0.1 * (1.0 / p.freq_scale as f64).ln());
    (interp * (1.0 - mix) + extrap * mix, mscale)
}

#[test]
fn rope_matches_formula() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let b = backend(2);
    let (n_head, head_dim) = (3usize, 16usize);
    let positions = [0u32, 1, 7, 300];
    let factors: Vec<f32> = (0..6).map(|i| 1.0 + i as f32).collect();
    let mut yarn = rope_params(12, true, None);
    yarn.ext_factor = 1.0;
    yarn.freq_scale = 0.25;
    yarn.attn_factor = 0.9;
    let cases = [
        rope_params(16, false, None),
        rope_params(16, true, None),
        rope_params(12, false, Some(&factors)),
        rope_params(12, true, Some(&factors)),
        yarn,
    ];
    for p in cases {
        let x = rand_vec(&mut rng, positions.len() * n_head * head_dim, 2.0);
        let mut y = x.clone();
        OnHost(&b)
            .rope(
                RSliceMut::from_mut_slice(&mut y),
                n_head as u32,
                head_dim as u32,
                RSlice::from_slice(&positions),
                p,
            )
            .unwrap();
        let n_rot = p.n_rot as usize;
        for (r, &pos) in positions.iter().enumerate() {
            for h in 0..n_head {
                let base = (r * n_head + h) * head_dim;
                for i in 0..n_rot / 2 {
                    let (a, c) = if p.neox {
                        (i, i + n_rot / 2)
                    } else {
                        (2 * i, 2 * i + 1)
                    };
                    let (theta, m) = rope_angle(&p, pos, i);
                    let (x0, x1) = (x[base + a] as f64, x[base + c] as f64);
                    let want0 = m * (x0 * theta.cos() - x1 * theta.sin());
                    let want1 = m * (x0 * theta.sin() + x1 * theta.cos());
                    // f32 angles of up to 300 rad carry ~1e-5 absolute error.
                    let tol = 1e-4 * (x0.abs() + x1.abs()).max(1.0);
                    assert!(
                        (y[base + a] as f64 - want0).abs() <= tol,
                        "neox={} pos {pos} pair {i}",
                        p.neox
                    );
                    assert!(
                        (y[base + c] as f64 - want1).abs() <= tol,
                        "neox={} pos {pos} pair {i}",
                        p.neox
                    );
                }
                for d in n_rot..head_dim {
                    assert_eq!(
                        y[base + d],
                        x[base + d],
                        "dim {d} beyond n_rot must be untouched"
                    );
                }
            }
        }
    }
    let mut y = vec![0f32; 10];
    let e = OnHost(&b).rope(
        RSliceMut::from_mut_slice(&mut y),
        1,
        16,
        RSlice::from_slice(&[0]),
        rope_params(16, false, None),
    );
    assert!(e.unwrap_err().as_str().contains("rope: x length"));
}

fn f16r(v: f32) -> f64 {
    half::f16::from_f32(v).to_f32() as f64
}

struct Naive {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    /// One sink logit per query head (gpt-oss), or none.
    sinks: Option<Vec<f32>>,
}

impl Naive {
    fn attend(&self, q: &[f32], pos: usize, h: usize, p: &AttentionParams) -> Vec<f64> {
        let (dk, dv) = (p.head_dim_k as usize, p.head_dim_v as usize);
        let kvh = h / (p.n_head / p.n_head_kv) as usize;
        let w = p.sliding_window as usize;
        let js: Vec<usize> = (0..=pos).filter(|&j| w == 0 || j + w > pos).collect();
        let scores: Vec<f64> = js
            .iter()
            .map(|&j| {
                let k = &self.k[j][kvh * dk..(kvh + 1) * dk];
                let mut s = p.scale as f64
                    * q.iter()
                        .zip(k)
                        .map(|(&a, &b)| f16r(a) * f16r(b))
                        .sum::<f64>();
                if p.softcap != 0.0 {
                    s = p.softcap as f64 * (s / p.softcap as f64).tanh();
                }
                s
            })
            .collect();
        let sink = self.sinks.as_ref().map(|s| s[h] as f64);
        let max = scores
            .iter()
            .cloned()
            .chain(sink)
            .fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        // A sink joins the denominator only.
        let z: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - max).exp());
        let mut out = vec![0f64; dv];
        for (&j, ej) in js.iter().zip(&e) {
            for (o, &v) in out.iter_mut().zip(&self.v[j][kvh * dv..(kvh + 1) * dv]) {
                // The backend rounds each probability to f16, as llama.cpp's non-flash path.
                *o += f16r((ej / z) as f32) * f16r(v);
            }
        }
        out
    }
}

#[test]
fn attention_matches_naive_softmax() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let b = backend(3);
    let (n_head, n_head_kv, dk, dv) = (4u32, 2u32, 16u32, 8u32);
    let spec = KvSpec {
        n_layers: 2,
        n_ctx: 16,
        n_head_kv,
        head_dim_k: dk,
        head_dim_v: dv,
    };
    // Sinks: one large enough to take most of a head's weight, one small, one negative.
    let sinks = [4.0f32, -1.0, 0.5, -6.0];
    for (window, softcap, sinks) in [
        (0u32, 0.0f32, None),
        (3, 0.0, None),
        (0, 5.0, None),
        (0, 0.0, Some(sinks)),
        (3, 0.0, Some(sinks)),
    ] {
        let kv = b.kv_create(spec).unwrap();
        let mut naive = Naive {
            k: vec![],
            v: vec![],
            sinks: sinks.map(|s| s.to_vec()),
        };
        let layer = 1;
        // Prefill 5 tokens, then decode 2 one at a time.
        for (start, n) in [(0u32, 5u32), (5, 1), (6, 1)] {
            let p = AttentionParams {
                layer,
                n_tokens: n,
                start_pos: start,
                n_head,
                n_head_kv,
                head_dim_k: dk,
                head_dim_v: dv,
                scale: 1.0 / (dk as f32).sqrt(),
                sliding_window: window,
                softcap,
            };
            let (nt, nh, nkv) = (n as usize, n_head as usize, n_head_kv as usize);
            let q = rand_vec(&mut rng, nt * nh * dk as usize, 3.0);
            let k = rand_vec(&mut rng, nt * nkv * dk as usize, 3.0);
            let v = rand_vec(&mut rng, nt * nkv * dv as usize, 3.0);
            for t in 0..nt {
                naive
                    .k
                    .push(k[t * nkv * dk as usize..(t + 1) * nkv * dk as usize].to_vec());
                naive
                    .v
                    .push(v[t * nkv * dv as usize..(t + 1) * nkv * dv as usize].to_vec());
            }
            let mut out = vec![f32::NAN; nt * nh * dv as usize];
            match &sinks {
                None => OnHost(&b).attention(
                    kv,
                    RSlice::from_slice(&q),
                    RSlice::from_slice(&k),
                    RSlice::from_slice(&v),
                    p,
                    RSliceMut::from_mut_slice(&mut out),
                ),
                Some(sinks) => OnHost(&b).attention_spans_sinks(
                    RSlice::from_slice(&[AttentionSpan {
                        kv,
                        n_tokens: n,
                        start_pos: start,
                    }]),
                    RSlice::from_slice(&q),
                    RSlice::from_slice(&k),
                    RSlice::from_slice(&v),
                    RSlice::from_slice(sinks),
                    p,
                    RSliceMut::from_mut_slice(&mut out),
                ),
            }
            .unwrap();
            for t in 0..nt {
                for h in 0..nh {
                    let qi = &q[(t * nh + h) * dk as usize..(t * nh + h + 1) * dk as usize];
                    let want = naive.attend(qi, start as usize + t, h, &p);
                    let got = &out[(t * nh + h) * dv as usize..(t * nh + h + 1) * dv as usize];
                    for d in 0..dv as usize {
                        assert!(
                            (got[d] as f64 - want[d]).abs() <= 1e-4 * want[d].abs().max(1.0),
                            "window {window} softcap {softcap} sinks {sinks:?} pos {} head {h} dim {d}: {} vs {}",
                            start as usize + t,
                            got[d],
                            want[d]
                        );
                    }
                }
            }
        }
        b.kv_drop(kv);
    }
}

/// Attention sinks are one per query head: another count is an error naming both (checked
/// before the keys are stored); the right count then works.
#[test]
fn attention_sinks_must_be_one_per_head() {
    let b = backend(2);
    let spec = KvSpec {
        n_layers: 1,
        n_ctx: 4,
        n_head_kv: 1,
        head_dim_k: 4,
        head_dim_v: 4,
    };
    let kv = b.kv_create(spec).unwrap();
    let p = AttentionParams {
        layer: 0,
        n_tokens: 1,
        start_pos: 0,
        n_head: 2,
        n_head_kv: 1,
        head_dim_k: 4,
        head_dim_v: 4,
        scale: 0.5,
        sliding_window: 0,
        softcap: 0.0,
    };
    let (q, kv_row, mut out) = ([0.5f32; 8], [0.25f32; 4], [0f32; 8]);
    let span = [AttentionSpan {
        kv,
        n_tokens: 1,
        start_pos: 0,
    }];
    let e = OnHost(&b)
        .attention_spans_sinks(
            RSlice::from_slice(&span),
            RSlice::from_slice(&q),
            RSlice::from_slice(&kv_row),
            RSlice::from_slice(&kv_row),
            RSlice::from_slice(&[1.0, 2.0, 3.0]),
            p,
            RSliceMut::from_mut_slice(&mut out),
        )
        .unwrap_err();
    assert!(e.contains("3 sinks for 2 query heads"), "{e}");
    OnHost(&b)
        .attention_spans_sinks(
            RSlice::from_slice(&span),
            RSlice::from_slice(&q),
            RSlice::from_slice(&kv_row),
            RSlice::from_slice(&kv_row),
            RSlice::from_slice(&[1.0, 2.0]),
            p,
            RSliceMut::from_mut_slice(&mut out),
        )
        .unwrap();
    b.kv_drop(kv);
}

#[test]
fn attention_validates_and_truncates() {
    let b = backend(2);
    let spec = KvSpec {
        n_layers: 1,
        n_ctx: 5,
        n_head_kv: 1,
        head_dim_k: 4,
        head_dim_v: 4,
    };
    let kv = b.kv_create(spec).unwrap();
    let p = |start: u32, n: u32| AttentionParams {
        layer: 0,
        n_tokens: n,
        start_pos: start,
        n_head: 2,
        n_head_kv: 1,
        head_dim_k: 4,
        head_dim_v: 4,
        scale: 0.5,
        sliding_window: 0,
        softcap: 0.0,
    };
    let call = |kv: u64, params: AttentionParams, q: &[f32], kvv: &[f32], out: &mut [f32]| {
        OnHost(&b)
            .attention(
                kv,
                RSlice::from_slice(q),
                RSlice::from_slice(kvv),
                RSlice::from_slice(kvv),
                params,
                RSliceMut::from_mut_slice(out),
            )
            .into_result()
            .map_err(|e| e.into_string())
    };
    let (q, kvv) = (vec![1.0f32; 3 * 8], vec![1.0f32; 3 * 4]);
    let mut out = vec![0f32; 3 * 8];
    call(kv, p(0, 3), &q, &kvv, &mut out).unwrap();
    assert!(call(kv, p(3, 3), &q, &kvv, &mut out)
        .unwrap_err()
        .contains("exceed the cache's n_ctx 5"));
    assert!(call(kv, p(4, 1), &q[..8], &kvv[..4], &mut out[..8])
        .unwrap_err()
        .contains("leaves a gap"));
    assert!(call(kv, p(0, 3), &q[..23], &kvv, &mut out)
        .unwrap_err()
        .contains("q length"));
    assert!(call(kv + 100, p(0, 3), &q, &kvv, &mut out)
        .unwrap_err()
        .contains("unknown KV cache handle"));
    let mut bad = p(0, 1);
    bad.layer = 1;
    assert!(call(kv, bad, &q[..8], &kvv[..4], &mut out[..8])
        .unwrap_err()
        .contains("layer 1 is out of range"));

    // Truncate to 1 position, then write position 1 with a value that dominates.
    b.kv_truncate(kv, 1).unwrap();
    assert!(call(kv, p(2, 1), &q[..8], &kvv[..4], &mut out[..8])
        .unwrap_err()
        .contains("leaves a gap"));
    call(kv, p(1, 1), &[0.0; 8], &[2.0; 4], &mut out[..8]).unwrap();
    // q = 0: uniform over positions 0 (v = 1) and 1 (v = 2).
    assert_eq!(&out[..8], &[1.5; 8]);
    b.kv_drop(kv);
    assert!(b.kv_truncate(kv, 0).is_err());
    assert!(b
        .kv_create(KvSpec {
            n_layers: 0,
            ..spec
        })
        .is_err());
}

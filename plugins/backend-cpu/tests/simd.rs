//! Every kernel level this CPU runs against the scalar kernels, which are the oracle.
//!
//! - `quantizers_are_byte_exact`: each level's activation quantizers (Q8_0, Q8_1, Q8_K and
//!   the float types) write the scalar bytes, over rows of 1, 2, 3, 7 and more blocks and
//!   random, tiny, huge, all-equal, alternating, tie-valued, zero and infinite inputs.
//! - `vec_dot_matches_scalar`: each level's `vec_dot` of every weight type returns the
//!   scalar result bit for bit (the kernels keep the scalar summation order), for the same
//!   row lengths, weight scales of ±65504, f16 subnormals and zero, and those activations.
//!   (MXFP4's E8M0 scales: the largest, 254 and 255, and the f32-subnormal 0 and 1.)
//! - `mxfp4_extreme_scales_match_scalar`: each level's MXFP4 `vec_dot` returns the scalar
//!   result bit for bit when every block, or each block independently, has one of the
//!   extreme E8M0 exponents (0, 1, 2, 127, 128, 254, 255), so vector lanes mix them.
//! - `vec_dot_x4_matches_scalar`: each level's four-token kernel returns, per token, the
//!   scalar `vec_dot` bit for bit, for the same row lengths and weight scales, with four
//!   different activation kinds side by side and rows padded apart (strides beyond a row).
//! - `vec_dot_2x4_matches_scalar`: likewise for the two-row, four- and eight-token kernels,
//!   the two weight rows with different scale kinds and padded apart.
//! - `matmul_matches_scalar_at_every_level`: `ops::matmul` with each level's table, odd
//!   row and token counts (prefill tiles and their remainders), equals the scalar
//!   `vec_dot` of every element.
//!   Both on rayon and on `SpinPool`, which must agree.
//! - `f32_dot_is_fused_at_every_level`: F32's canonical dot fuses each multiply-add (in the
//!   16 lanes and in the tail): every level's `vec_dot` and `ops::matmul` (decode,
//!   small-batch and panel paths) give the hand-computed fused value where rounding each
//!   product first would not.
//! - `panel_matmul_matches_scalar`: the row-panel prefill kernels (whole panels and
//!   the rows after them, 8-token tiles and single-token tails), with every weight scale
//!   kind and every activation kind above, equal the scalar `vec_dot` bit for bit.
//! - `mxfp4_panels_extreme_values_match_scalar`: MXFP4's panels (rows rewritten as Q8_0,
//!   the E8M0 scales as f32 lanes) with every exponent mixed in the lanes, and the largest
//!   values against same-signed ±127 activation quants, equal the scalar bits.
//! - `panel_matmul_bf16_bounds`: BF16 panels, with weights and activations around the
//!   bounds that let a tile fuse its multiply-adds (tiny, subnormal, huge, infinite, NaN
//!   and zero elements), in tiles of one kind and of mixed kinds, equal the scalar bits.
//! - `few_token_matmul_matches_scalar`: the small-batch kernels (2–8 tokens through
//!   `ops::matmul`, and 1–8 tokens called directly with weight rows padded apart), over
//!   odd and even block counts, every weight scale kind and every activation kind above,
//!   equal the scalar `vec_dot` bit for bit; and the decode kernels likewise (one token,
//!   through `ops::matmul` and directly).
//! - `decode_kernels_cover_their_formats`: the K-quants (and at AVX-512 the IQ4 formats)
//!   that have decode kernels at a level get them from its table (so the test above checks
//!   them).
//! - `axpy_f16_matches_scalar`: each level's F16 `axpy` (attention's V weighting) returns
//!   the scalar bits, over the float lengths (8-lane tails) and extreme values.
//! - `gated_activations_match_portable`: each level's SiLU and GELU gates return the
//!   portable bits over float lengths (vector tails) and inputs from −1e4 to 1e4, with
//!   zeros, infinities and values at the `exp` clamp; and the portable functions stay within
//!   their stated error of the f64 functions.
//! - `spin_pool_runs_every_chunk_once`: `SpinPool` runs each chunk exactly once, including
//!   after its workers have gone to sleep.
//! - `spin_pool_reraises_a_worker_panic`: a chunk that panics on a worker makes `run`
//!   panic in the caller, every time, and the pool keeps working.
//! - `default_threads_count_physical_cores`: the default thread count counts (package,
//!   core) pairs of a sysfs-like tree (SMT siblings once, offline CPUs not at all), and
//!   never more than the cores a cgroup quota or affinity mask leaves the process.
//! - `dispatch_selection`: `PRIMA_CPU_KERNELS` parsing and fallbacks.

use abi_stable::std_types::RSlice;
use prima_abi::backend::TensorView;
use prima_abi::GgmlType;
use prima_backend_cpu::formats::dispatch::{self, KernelLevel};
use prima_backend_cpu::formats::scalar;
use prima_backend_cpu::ops::matmul::{matmul, KernelLookup};
use prima_backend_cpu::pool::{build_pool, ChunkRunner, Scratch, SpinPool};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::{AtomicUsize, Ordering};

use prima_backend_cpu::formats::WEIGHT_TYPES;

/// Rows of this many blocks: the edge cases of the 4-block and 16-lane loops, and more.
const BLOCK_COUNTS: [usize; 8] = [1, 2, 3, 4, 5, 7, 9, 33];
/// Float types have 1-element blocks: cover the 16-lane tail too.
const FLOAT_LENGTHS: [usize; 11] = [1, 2, 3, 7, 15, 16, 17, 31, 33, 100, 1000];

fn levels() -> Vec<KernelLevel> {
    let l = dispatch::available_levels();
    eprintln!(
        "kernel levels on this CPU: {:?}",
        l.iter().map(|l| l.name()).collect::<Vec<_>>()
    );
    l
}

fn lengths(t: GgmlType) -> Vec<usize> {
    match t.block_elems() {
        1 => FLOAT_LENGTHS.to_vec(),
        b => BLOCK_COUNTS.iter().map(|c| c * b).collect(),
    }
}

#[derive(Clone, Copy, Debug)]
enum Scales {
    Normal,
    Max,
    Subnormal,
    Zero,
}

/// Offsets of the f16 scale fields of a block (sanitised so random bytes are finite).
fn scale_fields(t: GgmlType) -> &'static [usize] {
    match t {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::IQ4NL | GgmlType::IQ4XS => &[0],
        GgmlType::MXFP4 => &[],
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q3K => &[108],
        GgmlType::Q6K => &[208],
        _ => &[0, 2],
    }
}

fn random_row(rng: &mut ChaCha8Rng, t: GgmlType, n: usize, scales: Scales) -> Vec<u8> {
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    let pick = |rng: &mut ChaCha8Rng| -> f32 {
        let sign = if rng.gen::<bool>() { 1.0 } else { -1.0 };
        match scales {
            Scales::Normal => rng.gen_range(-0.05..0.05),
            Scales::Max => sign * 65504.0,
            Scales::Subnormal => sign * rng.gen_range(1..1024) as f32 * 2f32.powi(-24),
            Scales::Zero => 0.0,
        }
    };
    match t {
        GgmlType::F32 => (0..n)
            .flat_map(|_| (pick(rng) * rng.gen_range(-1.0f32..1.0)).to_le_bytes())
            .collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| f16(pick(rng) * rng.gen_range(-1.0f32..1.0)))
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| {
                half::bf16::from_f32(pick(rng) * rng.gen_range(-1.0f32..1.0)).to_le_bytes()
            })
            .collect(),
        _ => {
            let mut data = vec![0u8; t.row_bytes(n).unwrap()];
            rng.fill(&mut data[..]);
            for block in data.chunks_exact_mut(t.block_bytes()) {
                for &off in scale_fields(t) {
                    block[off..off + 2].copy_from_slice(&f16(pick(rng)));
                }
                if t == GgmlType::MXFP4 {
                    block[0] = mxfp4_exponent(rng, scales);
                }
            }
            data
        }
    }
}

/// An MXFP4 block's E8M0 exponent for `scales`: MXFP4 has no zero scale, so `Zero` draws
/// any byte; `Max` and `Subnormal` give the largest scales (255 is E8M0's NaN, which
/// llama.cpp computes with as 2^127) and the f32-subnormal ones (`e8m0_half` of 0 and 1).
fn mxfp4_exponent(rng: &mut ChaCha8Rng, scales: Scales) -> u8 {
    match scales {
        Scales::Normal => rng.gen_range(118..=130),
        Scales::Max => [254, 255][rng.gen_range(0..2)],
        Scales::Subnormal => [0, 1, 2][rng.gen_range(0..3)],
        Scales::Zero => rng.gen(),
    }
}

/// Activation rows that stress the quantizers' rounding, saturation and zero handling.
fn activations(rng: &mut ChaCha8Rng, n: usize) -> Vec<(&'static str, Vec<f32>)> {
    let mut rand = |r: f32| -> Vec<f32> { (0..n).map(|_| rng.gen_range(-r..r)).collect() };
    let mut sets = vec![
        ("random", rand(2.0)),
        ("small", rand(1e-3)),
        ("huge", rand(1e30)),
        ("tiny", rand(1e-39)),
    ];
    sets.push(("all-equal", vec![0.7; n]));
    sets.push((
        "alternating",
        (0..n)
            .map(|i| if i % 2 == 0 { 1.5 } else { -1.5 })
            .collect(),
    ));
    sets.push(("zeros", vec![0.0; n]));
    // With max |x| = 127, d = 1: every other value lands exactly on a rounding tie.
    sets.push((
        "ties",
        (0..n)
            .map(|i| {
                if i % 32 == 0 {
                    127.0
                } else {
                    (i % 254) as f32 * 0.5 - 63.0
                }
            })
            .collect(),
    ));
    let mut inf = vec![1.0; n];
    inf[n / 2] = f32::INFINITY;
    if n > 1 {
        inf[0] = f32::NEG_INFINITY;
    }
    sets.push(("infinite", inf));
    sets
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn quantizers_are_byte_exact() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for level in levels() {
        for t in WEIGHT_TYPES {
            let (want_k, got_k) = (scalar::kernels(t).unwrap(), level.kernels(t).unwrap());
            let at = want_k.vec_dot_type;
            for n in lengths(at) {
                for (name, x) in activations(&mut rng, n) {
                    let len = at.row_bytes(n).unwrap();
                    let (mut want, mut got) = (vec![0xAAu8; len], vec![0x55u8; len]);
                    (want_k.quantize_activation)(&x, &mut want);
                    (got_k.quantize_activation)(&x, &mut got);
                    assert!(
                        want == got,
                        "{} {at} (for {t}) n={n} {name}: bytes differ at {:?}",
                        level.name(),
                        want.iter().zip(&got).position(|(a, b)| a != b)
                    );
                }
            }
        }
    }
}

#[test]
fn vec_dot_matches_scalar() {
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    for level in levels() {
        for t in WEIGHT_TYPES {
            let (want_k, got_k) = (scalar::kernels(t).unwrap(), level.kernels(t).unwrap());
            for n in lengths(t) {
                for scales in [Scales::Normal, Scales::Max, Scales::Subnormal, Scales::Zero] {
                    let w = random_row(&mut rng, t, n, scales);
                    for (name, x) in activations(&mut rng, n) {
                        let mut a = vec![0u8; want_k.vec_dot_type.row_bytes(n).unwrap()];
                        (want_k.quantize_activation)(&x, &mut a);
                        let want = (want_k.vec_dot)(n, &w, &a);
                        let got = (got_k.vec_dot)(n, &w, &a);
                        assert!(
                            same(want, got),
                            "{} {t} n={n} {scales:?} weights, {name} activations: {got} vs scalar {want}",
                            level.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn mxfp4_extreme_scales_match_scalar() {
    const EXTREME_E: [u8; 7] = [0, 1, 2, 127, 128, 254, 255];
    let t = GgmlType::MXFP4;
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let want_k = scalar::kernels(t).unwrap();
    for level in levels() {
        let got_k = level.kernels(t).unwrap();
        for n in lengths(t) {
            // `None`: each block draws its own exponent.
            for fixed in EXTREME_E.map(Some).into_iter().chain([None]) {
                let mut w = vec![0u8; t.row_bytes(n).unwrap()];
                rng.fill(&mut w[..]);
                for block in w.chunks_exact_mut(t.block_bytes()) {
                    block[0] = fixed.unwrap_or_else(|| EXTREME_E[rng.gen_range(0..7)]);
                }
                for (name, x) in activations(&mut rng, n) {
                    let mut a = vec![0u8; want_k.vec_dot_type.row_bytes(n).unwrap()];
                    (want_k.quantize_activation)(&x, &mut a);
                    let want = (want_k.vec_dot)(n, &w, &a);
                    let got = (got_k.vec_dot)(n, &w, &a);
                    assert!(
                        same(want, got),
                        "{} MXFP4 n={n} e={fixed:?}, {name} activations: {got} vs scalar {want}",
                        level.name()
                    );
                }
            }
        }
    }
}

#[test]
fn vec_dot_x4_matches_scalar() {
    let mut rng = ChaCha8Rng::seed_from_u64(14);
    for level in levels() {
        for t in WEIGHT_TYPES {
            let (want_k, got_k) = (scalar::kernels(t).unwrap(), level.kernels(t).unwrap());
            let Some(x4) = got_k.vec_dot_x4 else {
                continue;
            };
            let at = want_k.vec_dot_type;
            for n in lengths(t) {
                let row = at.row_bytes(n).unwrap();
                // Every activation kind once in each of the four slots, across the groups.
                let acts: Vec<Vec<u8>> = activations(&mut rng, n)
                    .into_iter()
                    .map(|(_, x)| {
                        let mut a = vec![0u8; row];
                        (want_k.quantize_activation)(&x, &mut a);
                        a
                    })
                    .collect();
                for scales in [Scales::Normal, Scales::Max, Scales::Subnormal, Scales::Zero] {
                    let w = random_row(&mut rng, t, n, scales);
                    for pad in [0, 3] {
                        let stride = row + pad;
                        for first in 0..acts.len() {
                            let pick: [usize; 4] =
                                std::array::from_fn(|k| (first + k) % acts.len());
                            let mut a = vec![0x5Au8; 3 * stride + row];
                            for (k, &p) in pick.iter().enumerate() {
                                a[k * stride..k * stride + row].copy_from_slice(&acts[p]);
                            }
                            let got = x4(n, &w, &a, stride);
                            for (k, &p) in pick.iter().enumerate() {
                                let want = (want_k.vec_dot)(n, &w, &acts[p]);
                                assert!(
                                    same(want, got[k]),
                                    "{} {t} x4 n={n} {scales:?} weights, token {k} (kind {p}), \
                                     stride {stride}: {} vs scalar {want}",
                                    level.name(),
                                    got[k]
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn vec_dot_2x4_matches_scalar() {
    let mut rng = ChaCha8Rng::seed_from_u64(15);
    let kinds = [Scales::Normal, Scales::Max, Scales::Subnormal, Scales::Zero];
    for level in levels() {
        for t in WEIGHT_TYPES {
            let (want_k, got_k) = (scalar::kernels(t).unwrap(), level.kernels(t).unwrap());
            let Some(x2x4) = got_k.vec_dot_2x4 else {
                continue;
            };
            let x2x8 = got_k.vec_dot_2x8;
            let at = want_k.vec_dot_type;
            for n in lengths(t) {
                let (w_row, a_row) = (t.row_bytes(n).unwrap(), at.row_bytes(n).unwrap());
                let acts: Vec<Vec<u8>> = activations(&mut rng, n)
                    .into_iter()
                    .map(|(_, x)| {
                        let mut a = vec![0u8; a_row];
                        (want_k.quantize_activation)(&x, &mut a);
                        a
                    })
                    .collect();
                for (ki, &k0) in kinds.iter().enumerate() {
                    let k1 = kinds[(ki + 1) % kinds.len()];
                    let rows = [
                        random_row(&mut rng, t, n, k0),
                        random_row(&mut rng, t, n, k1),
                    ];
                    for pad in [0, 5] {
                        let (ws, st) = (w_row + pad, a_row + pad);
                        let mut w = vec![0xA5u8; ws + w_row];
                        w[..w_row].copy_from_slice(&rows[0]);
                        w[ws..].copy_from_slice(&rows[1]);
                        for first in 0..acts.len() {
                            let pick: [usize; 8] =
                                std::array::from_fn(|k| (first + k) % acts.len());
                            let mut a = vec![0x5Au8; 7 * st + a_row];
                            for (k, &p) in pick.iter().enumerate() {
                                a[k * st..k * st + a_row].copy_from_slice(&acts[p]);
                            }
                            // Each result is [row 0 × 4 tokens, row 1 × 4 tokens]: the 2x4
                            // call on tokens 0..4, then the 2x8 call's two groups.
                            let mut got = vec![(0, x2x4(n, &w, ws, &a, st))];
                            if let Some(x2x8) = x2x8 {
                                let [g0, g1] = x2x8(n, &w, ws, &a, st);
                                got.extend([(0, g0), (4, g1)]);
                            }
                            for (call, &(base, d)) in got.iter().enumerate() {
                                for ((r, row), k) in rows
                                    .iter()
                                    .enumerate()
                                    .flat_map(|r| (0..4).map(move |k| (r, k)))
                                {
                                    let p = pick[base + k];
                                    let want = (want_k.vec_dot)(n, row, &acts[p]);
                                    let g = d[4 * r + k];
                                    assert!(
                                        same(want, g),
                                        "{} {t} call {call} (2x4, then 2x8) n={n} row {r} ({:?}), \
                                         token {} (kind {p}), pad {pad}: {g} vs scalar {want}",
                                        level.name(),
                                        [k0, k1][r],
                                        base + k
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn matmul_with(
    lookup: KernelLookup,
    threads: u32,
    w: TensorView<'_>,
    x: &[f32],
    n_tokens: usize,
) -> Vec<f32> {
    let mut scratch = Scratch::default();
    let mut out = vec![f32::NAN; n_tokens * w.rows as usize];
    let rayon = build_pool(threads).unwrap();
    matmul(&rayon, &mut scratch, lookup, &w, x, n_tokens, &mut out).unwrap();
    let mut spin_out = vec![f32::NAN; out.len()];
    let spin = SpinPool::new(threads).unwrap();
    matmul(&spin, &mut scratch, lookup, &w, x, n_tokens, &mut spin_out).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&out), bits(&spin_out), "rayon vs SpinPool");
    out
}

#[test]
fn axpy_f16_matches_scalar() {
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let want_f = KernelLevel::Scalar.axpy_f16().unwrap();
    for level in levels() {
        let got_f = level.axpy_f16().unwrap();
        for n in FLOAT_LENGTHS {
            for scales in [Scales::Normal, Scales::Max, Scales::Subnormal, Scales::Zero] {
                let v = random_row(&mut rng, GgmlType::F16, n, scales);
                for w in [0.0f32, 1.0, -0.37, 1e-30, 65504.0, f32::MIN_POSITIVE] {
                    let acc: Vec<f32> = (0..n).map(|_| rng.gen_range(-4.0..4.0)).collect();
                    let (mut want, mut got) = (acc.clone(), acc);
                    want_f(&mut want, w, &v);
                    got_f(&mut got, w, &v);
                    assert!(
                        want.iter().zip(&got).all(|(a, b)| same(*a, *b)),
                        "{} axpy_f16 n={n} {scales:?} w={w}",
                        level.name()
                    );
                }
            }
        }
    }
}

#[test]
fn gated_activations_match_portable() {
    use prima_backend_cpu::ops::activation::{self, gate_at, Gate};
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    let specials = [
        0.0f32, -0.0, 1e-30, -1e-30, 43.6, -43.6, 87.0, -87.0, 88.5, -88.5, 1e4, -1e4,
    ];
    for level in levels() {
        for n in FLOAT_LENGTHS {
            for span in [1.0f32, 8.0, 100.0, 1e4] {
                let mut gate: Vec<f32> = (0..n).map(|_| rng.gen_range(-span..span)).collect();
                for (g, s) in gate.iter_mut().zip(specials.iter().cycle().step_by(5)) {
                    if rng.gen_bool(0.1) {
                        *g = *s;
                    }
                }
                let up: Vec<f32> = (0..n).map(|_| rng.gen_range(-3.0..3.0)).collect();
                for act in [Gate::Silu, Gate::GeluTanh] {
                    let (mut want, mut got) = (gate.clone(), gate.clone());
                    gate_at(KernelLevel::Scalar, act, &mut want, &up);
                    gate_at(level, act, &mut got, &up);
                    assert!(
                        want.iter().zip(&got).all(|(a, b)| same(*a, *b)),
                        "{} {act:?} n={n} span={span}",
                        level.name()
                    );
                }
            }
        }
    }
    // Accuracy of the portable math against f64.
    let mut worst = [0.0f64; 3];
    for i in 0..=200_000 {
        let x = -87.0 + 175.0 * i as f64 / 200_000.0;
        let e = activation::exp(x as f32) as f64;
        let want = (x as f32 as f64).exp();
        worst[0] = worst[0].max(((e - want) / want).abs());
        let x = (x / 4.0) as f32;
        let xf = x as f64;
        let silu = xf / (1.0 + (-xf).exp());
        let u = (2.0 / std::f64::consts::PI).sqrt() * (xf + 0.044715 * xf * xf * xf);
        // 0.5·x·(1 + tanh u) without f64's cancellation at tanh u ≈ −1.
        let gelu = xf / (1.0 + (-2.0 * u).exp());
        // Relative error, with a floor where GELU's exact value underflows (x ≪ 0).
        let err = |got: f32, want: f64| (got as f64 - want).abs() / want.abs().max(1e-20);
        worst[1] = worst[1].max(err(activation::silu(x), silu));
        // GELU's argument 2u is itself computed in f32 (five roundings, as in any f32
        // GELU), and e^−2u carries that error times |2u|: measure in units of that bound.
        let bound = 1e-6 + 4e-7 * (2.0 * u).abs();
        worst[2] = worst[2].max(err(activation::gelu_tanh(x), gelu) / bound * 1e-6);
    }
    eprintln!(
        "worst relative error: exp {:.2e}, silu {:.2e}, gelu {:.2e}",
        worst[0], worst[1], worst[2]
    );
    assert!(worst[0] < 2.5e-7, "exp: {:.3e}", worst[0]);
    assert!(worst[1] < 1e-6, "silu: {:.3e}", worst[1]);
    assert!(worst[2] < 1e-6, "gelu: {:.3e}", worst[2]);
}

#[test]
fn softmax_matches_portable_and_f64() {
    use prima_backend_cpu::ops::activation::softmax_at;
    let mut rng = ChaCha8Rng::seed_from_u64(29);
    for level in levels() {
        for n in [1usize, 2, 7, 8, 9, 16, 31, 64, 100, 257] {
            for span in [0.1f32, 10.0, 200.0] {
                let scores: Vec<f32> = (0..n).map(|_| rng.gen_range(-span..span)).collect();
                let scale = 0.125f32;
                let (mut want, mut got) = (scores.clone(), scores.clone());
                softmax_at(KernelLevel::Scalar, &mut want, scale);
                softmax_at(level, &mut got, scale);
                assert!(
                    want.iter().zip(&got).all(|(a, b)| same(*a, *b)),
                    "{} softmax n={n} span={span}",
                    level.name()
                );
                // Against f64: each weight within a few f32 roundings of the exact one, plus
                // the rounding of `s − max` in f32 (relative 2^-24), which `e^x` carries
                // times |s − max|.
                let s: Vec<f64> = scores.iter().map(|&x| (x * scale) as f64).collect();
                let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let total: f64 = s.iter().map(|x| (x - max).exp()).sum();
                for (x, g) in s.iter().zip(&got) {
                    let exact = (x - max).exp() / total;
                    let bound = 1e-6 + 1.2e-7 * (x - max).abs();
                    assert!(
                        (*g as f64 - exact).abs() <= bound * exact + 1e-30,
                        "{} softmax n={n} span={span}: {g} vs {exact}",
                        level.name()
                    );
                }
                assert!((got.iter().map(|&g| g as f64).sum::<f64>() - 1.0).abs() < 1e-5);
            }
        }
    }
    // A row of −∞ scores (the causal mask never makes one): NaNs or zeros, not a panic.
    let mut masked = vec![f32::NEG_INFINITY; 5];
    softmax_at(KernelLevel::Scalar, &mut masked, 1.0);
    assert!(masked.iter().all(|g| g.is_nan() || *g == 0.0));
}

/// gpt-oss's attention sinks: every level gives the scalar softmax's bits, and the weights
/// are the exact softmax with the sink in the denominator (so they sum to 1 − its share).
#[test]
fn softmax_with_a_sink_matches_portable_and_f64() {
    use prima_backend_cpu::ops::activation::softmax_sink_at;
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    for level in levels() {
        for n in [1usize, 7, 9, 64, 257] {
            for sink in [-20.0f32, -1.0, 0.0, 3.0, 40.0] {
                let scores: Vec<f32> = (0..n).map(|_| rng.gen_range(-10.0..10.0)).collect();
                let scale = 0.5f32;
                let (mut want, mut got) = (scores.clone(), scores.clone());
                softmax_sink_at(KernelLevel::Scalar, &mut want, scale, Some(sink));
                softmax_sink_at(level, &mut got, scale, Some(sink));
                assert!(
                    want.iter().zip(&got).all(|(a, b)| same(*a, *b)),
                    "{} softmax n={n} sink={sink}",
                    level.name()
                );
                let s: Vec<f64> = scores.iter().map(|&x| (x * scale) as f64).collect();
                let max = s.iter().cloned().fold(sink as f64, f64::max);
                let total: f64 =
                    s.iter().map(|x| (x - max).exp()).sum::<f64>() + (sink as f64 - max).exp();
                for (x, g) in s.iter().zip(&got) {
                    let exact = (x - max).exp() / total;
                    let bound = 1e-6 + 1.2e-7 * (x - max).abs();
                    assert!(
                        (*g as f64 - exact).abs() <= bound * exact + 1e-30,
                        "{} softmax n={n} sink={sink}: {g} vs {exact}",
                        level.name()
                    );
                }
            }
        }
    }
    // Without a sink it is the plain softmax, bit for bit.
    let scores: Vec<f32> = (0..33).map(|i| i as f32 * 0.37 - 5.0).collect();
    let (mut plain, mut none) = (scores.clone(), scores);
    prima_backend_cpu::ops::activation::softmax_at(KernelLevel::Scalar, &mut plain, 0.3);
    softmax_sink_at(KernelLevel::Scalar, &mut none, 0.3, None);
    assert!(plain.iter().zip(&none).all(|(a, b)| same(*a, *b)));
}

#[test]
fn spin_pool_runs_every_chunk_once() {
    for threads in [1, 2, 3, 5] {
        let pool = SpinPool::new(threads).unwrap();
        assert_eq!(pool.threads(), threads as usize);
        for round in 0..2000usize {
            let n = round % 37;
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|c| {
                hits[c].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "{threads} threads, {n} chunks"
            );
            if round % 500 == 0 {
                // Let the workers fall asleep, then wake them.
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
    }
}

#[test]
fn spin_pool_reraises_a_worker_panic() {
    let pool = SpinPool::new(2).unwrap();
    let mut worker_panics = 0;
    for _ in 0..50 {
        let on_worker = std::sync::atomic::AtomicBool::new(false);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(8, &|_| {
                std::thread::sleep(std::time::Duration::from_micros(20));
                let name = std::thread::current().name().map(str::to_owned);
                if name.is_some_and(|n| n.starts_with("prima-cpu-")) {
                    on_worker.store(true, Ordering::Relaxed);
                    panic!("chunk failed on a worker");
                }
            })
        }));
        if on_worker.load(Ordering::Relaxed) {
            worker_panics += 1;
            assert!(result.is_err(), "a worker's panic was lost");
        } else {
            assert!(result.is_ok());
        }
    }
    assert!(worker_panics > 0, "the worker never took a chunk");
    // The pool still works afterwards.
    let hits = AtomicUsize::new(0);
    pool.run(8, &|_| {
        hits.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(hits.load(Ordering::Relaxed), 8);
}

#[test]
fn default_threads_count_physical_cores() {
    use prima_backend_cpu::pool::{default_threads, physical_cores, threads_for};
    let root = std::env::temp_dir().join(format!("prima-cpu-topology-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    // Two packages; cpu0/cpu2 and cpu1/cpu3 are SMT siblings on package 0, cpu4 is alone on
    // package 1 with the same core id as cpu0; cpu5 is offline (no topology).
    for (cpu, package, core) in [(0, 0, 0), (1, 0, 1), (2, 0, 0), (3, 0, 1), (4, 1, 0)] {
        let dir = root.join(format!("cpu{cpu}/topology"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("physical_package_id"), format!("{package}\n")).unwrap();
        std::fs::write(dir.join("core_id"), format!("{core}\n")).unwrap();
    }
    std::fs::create_dir_all(root.join("cpu5")).unwrap();
    std::fs::create_dir_all(root.join("cpufreq/topology")).unwrap();
    assert_eq!(physical_cores(&root), Some(3));
    assert_eq!(physical_cores(&root.join("missing")), None);
    std::fs::remove_dir_all(&root).unwrap();
    assert_eq!(threads_for(Some(3), 8), 3);
    // A cgroup quota of one core on a 3-core machine: one thread.
    assert_eq!(threads_for(Some(3), 1), 1);
    assert_eq!(threads_for(None, 2), 2);
    assert_eq!(threads_for(Some(0), 0), 1);
    let n = default_threads();
    let usable = prima_host::device_cores().cores;
    assert!(
        n >= 1 && n <= usable,
        "{n} threads of {usable} usable cores"
    );
}

/// Every kernel level with its table lookup (a `fn`, as `matmul` takes it).
fn level_lookups() -> [(KernelLevel, KernelLookup); 5] {
    [
        (KernelLevel::Scalar, |t| KernelLevel::Scalar.kernels(t)),
        (KernelLevel::Avx2, |t| KernelLevel::Avx2.kernels(t)),
        (KernelLevel::Avx512, |t| KernelLevel::Avx512.kernels(t)),
        (KernelLevel::Neon, |t| KernelLevel::Neon.kernels(t)),
        (KernelLevel::NeonDotprod, |t| {
            KernelLevel::NeonDotprod.kernels(t)
        }),
    ]
}

#[test]
fn matmul_matches_scalar_at_every_level() {
    let lookups = level_lookups();
    let available = levels();
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    for t in WEIGHT_TYPES {
        let k = scalar::kernels(t).unwrap();
        let cols = 2 * 256;
        let shapes = [
            (37usize, 1usize),
            (5, 3),
            (37, 7),
            (64, 9),
            (3, 17),
            (48, 8),
            (35, 19),
        ];
        for (rows, n_tokens) in shapes {
            let data = random_row(&mut rng, t, rows * cols, Scales::Normal);
            let w = TensorView {
                data: RSlice::from_slice(&data),
                ggml_type: t.id(),
                cols: cols as u64,
                rows: rows as u64,
            };
            let x: Vec<f32> = (0..n_tokens * cols)
                .map(|_| rng.gen_range(-2.0..2.0))
                .collect();
            let row_bytes = t.row_bytes(cols).unwrap();
            let mut act = vec![0u8; k.vec_dot_type.row_bytes(cols).unwrap()];
            let mut want = vec![0f32; n_tokens * rows];
            for tok in 0..n_tokens {
                (k.quantize_activation)(&x[tok * cols..(tok + 1) * cols], &mut act);
                for r in 0..rows {
                    let wr = &data[r * row_bytes..(r + 1) * row_bytes];
                    want[tok * rows + r] = (k.vec_dot)(cols, wr, &act);
                }
            }
            for &(level, lookup) in lookups.iter().filter(|(l, _)| available.contains(l)) {
                for threads in [1, 2, 3] {
                    let got = matmul_with(lookup, threads, w, &x, n_tokens);
                    assert_eq!(
                        got,
                        want,
                        "{} {t}: {rows} rows × {n_tokens} tokens, {threads} threads",
                        level.name()
                    );
                }
            }
        }
    }
}

#[test]
fn f32_dot_is_fused_at_every_level() {
    // Weight row `r` and every token put `x·x` (`x = 1 + 2^-12`, `x² = 1 + 2^-11 + 2^-24`)
    // onto `−1` in lane `r % 16`, and `−1`, then `x·x`, onto the folded sum in the tail.
    // Fused, each step is exact and the dot is `2^-10 + 2^-23` (times token `k`'s scale
    // `2^(k % 5)`); a multiply rounding `x·x` to `1 + 2^-11` first would give `2^-10`, and
    // a kernel fusing only its lanes or only its tail `2^-10 + 2^-24`.
    let lookups = level_lookups();
    let available = levels();
    let t = GgmlType::F32;
    let x = 1.0 + 2f32.powi(-12);
    let fused = 2f32.powi(-10) + 2f32.powi(-23);
    for (chunks, tail) in [(2usize, 2usize), (3, 5), (62, 8)] {
        let cols = 16 * chunks + tail;
        let row = |r: usize| -> Vec<f32> {
            let mut w = vec![0.0; cols];
            let lane = r % 16;
            (w[lane], w[16 * (chunks - 1) + lane]) = (1.0, x);
            (w[16 * chunks], w[cols - 1]) = (1.0, x);
            w
        };
        let token = |k: usize| -> Vec<f32> {
            let mut a = vec![0.0; cols];
            a[..16].fill(-1.0);
            a[16 * (chunks - 1)..16 * chunks].fill(x);
            (a[16 * chunks], a[cols - 1]) = (-1.0, x);
            let scale = 2f32.powi((k % 5) as i32);
            a.iter().map(|v| v * scale).collect()
        };
        // 35 rows: whole panels of every level and rows after them; 1, 3, 9 and 17
        // tokens: the decode, small-batch and panel paths with their remainders.
        let rows = 35;
        let w: Vec<u8> = (0..rows).flat_map(row).flat_map(f32::to_le_bytes).collect();
        let view = TensorView {
            data: RSlice::from_slice(&w),
            ggml_type: t.id(),
            cols: cols as u64,
            rows: rows as u64,
        };
        for &(level, lookup) in lookups.iter().filter(|(l, _)| available.contains(l)) {
            let k = lookup(t).unwrap();
            for r in 0..rows {
                let a: Vec<u8> = token(0).into_iter().flat_map(f32::to_le_bytes).collect();
                let got = (k.vec_dot)(cols, &w[4 * cols * r..4 * cols * (r + 1)], &a);
                assert_eq!(got, fused, "{} vec_dot n={cols} row {r}", level.name());
            }
            for n_tokens in [1, 3, 9, 17] {
                let acts: Vec<f32> = (0..n_tokens).flat_map(token).collect();
                let got = matmul_with(lookup, 2, view, &acts, n_tokens);
                for (i, g) in got.iter().enumerate() {
                    let (tok, r) = (i / rows, i % rows);
                    let want = fused * 2f32.powi((tok % 5) as i32);
                    assert_eq!(
                        *g,
                        want,
                        "{} matmul n={cols} {n_tokens} tokens: row {r} token {tok}",
                        level.name()
                    );
                }
            }
        }
    }
}

#[test]
fn panel_matmul_matches_scalar() {
    let scale_kinds = [Scales::Normal, Scales::Max, Scales::Subnormal, Scales::Zero];
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    for level in levels() {
        let lookup: KernelLookup = match level {
            KernelLevel::Avx2 => |t| KernelLevel::Avx2.kernels(t),
            KernelLevel::Avx512 => |t| KernelLevel::Avx512.kernels(t),
            _ => continue,
        };
        for t in WEIGHT_TYPES {
            if lookup(t).and_then(|k| k.panel).is_none() {
                continue;
            }
            let k = scalar::kernels(t).unwrap();
            let be = t.block_elems();
            // 35 rows leave rows after the panels; 64, a whole number of every level's
            // panels, take the path where only the panels' side data is kept.
            let all_rows = 64;
            let col_counts = match be {
                1 => vec![1, 15, 16, 33, 100, 1000],
                _ => vec![be, 3 * be, 9 * be],
            };
            for cols in col_counts {
                let row_bytes = t.row_bytes(cols).unwrap();
                let data: Vec<u8> = (0..all_rows)
                    .flat_map(|r| random_row(&mut rng, t, cols, scale_kinds[r % 4]))
                    .collect();
                let kinds = activations(&mut rng, cols);
                for (rows, n_tokens) in [35, 64]
                    .into_iter()
                    .flat_map(|r| [(r, 8usize), (r, 9), (r, 17)])
                {
                    let w = TensorView {
                        data: RSlice::from_slice(&data[..rows * row_bytes]),
                        ggml_type: t.id(),
                        cols: cols as u64,
                        rows: rows as u64,
                    };
                    let x: Vec<f32> = (0..n_tokens)
                        .flat_map(|tok| kinds[tok % kinds.len()].1.clone())
                        .collect();
                    let mut act = vec![0u8; k.vec_dot_type.row_bytes(cols).unwrap()];
                    let got = matmul_with(lookup, 2, w, &x, n_tokens);
                    for tok in 0..n_tokens {
                        (k.quantize_activation)(&x[tok * cols..(tok + 1) * cols], &mut act);
                        for r in 0..rows {
                            let wr = &data[r * row_bytes..(r + 1) * row_bytes];
                            let want = (k.vec_dot)(cols, wr, &act);
                            let g = got[tok * rows + r];
                            assert!(
                                same(g, want),
                                "{} {t} n={cols} {n_tokens} tokens: row {r} ({:?}) token {tok} \
                                 ({}): {g} vs scalar {want}",
                                level.name(),
                                scale_kinds[r % 4],
                                kinds[tok % kinds.len()].0
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn mxfp4_panels_extreme_values_match_scalar() {
    // Every E8M0 exponent (f16-representable `2^(e − 128)` is only e in 104..=143: the
    // panels carry the f32 scale) mixed within each panel's lanes, and the largest values
    // (codes ±12) against ±127 activation quants of the same signs, the AVX2 tile's widest
    // i16 sums (eight groups of 2·12·127 pairs).
    let t = GgmlType::MXFP4;
    let k = scalar::kernels(t).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    for level in levels() {
        let lookup: KernelLookup = match level {
            KernelLevel::Avx2 => |t| KernelLevel::Avx2.kernels(t),
            KernelLevel::Avx512 => |t| KernelLevel::Avx512.kernels(t),
            _ => continue,
        };
        assert!(
            lookup(t).unwrap().panel.is_some(),
            "{}: no MXFP4 panels",
            level.name()
        );
        let (rows, cols) = (37, 5 * t.block_elems());
        let row_bytes = t.row_bytes(cols).unwrap();
        for extreme in [false, true] {
            let mut data = vec![0u8; rows * row_bytes];
            rng.fill(&mut data[..]);
            let mut e = 0u8;
            for (i, block) in data.chunks_exact_mut(t.block_bytes()).enumerate() {
                block[0] = e;
                e = e.wrapping_add(if i % 3 == 0 { 1 } else { 97 });
                if extreme {
                    // 12 (code 7) in the low nibbles, −12 (code 15) in the high ones.
                    block[1..].fill(0xF7);
                }
            }
            // Whole tiles and single tokens; the extreme tokens' signs follow the weights'.
            let n_tokens = 9;
            let x: Vec<f32> = (0..n_tokens * cols)
                .map(|i| {
                    if extreme {
                        if i % 32 < 16 {
                            1.0
                        } else {
                            -1.0
                        }
                    } else {
                        rng.gen_range(-2.0..2.0)
                    }
                })
                .collect();
            let w = TensorView {
                data: RSlice::from_slice(&data),
                ggml_type: t.id(),
                cols: cols as u64,
                rows: rows as u64,
            };
            let got = matmul_with(lookup, 2, w, &x, n_tokens);
            let mut act = vec![0u8; k.vec_dot_type.row_bytes(cols).unwrap()];
            for tok in 0..n_tokens {
                (k.quantize_activation)(&x[tok * cols..(tok + 1) * cols], &mut act);
                for r in 0..rows {
                    let want = (k.vec_dot)(cols, &data[r * row_bytes..(r + 1) * row_bytes], &act);
                    let g = got[tok * rows + r];
                    assert!(
                        same(g, want),
                        "{} MXFP4 panels (extreme values: {extreme}) row {r} token {tok}: \
                         {g} vs scalar {want}",
                        level.name()
                    );
                }
            }
        }
    }
}

#[test]
fn panel_matmul_bf16_bounds() {
    // Weight panels (four rows each) and tokens of one kind each, around the bounds that
    // decide whether a BF16 tile fuses its multiply-adds (products that stay normal): the
    // tiles must equal the scalar oracle on both sides of them.
    let mut rng = ChaCha8Rng::seed_from_u64(29);
    let t = GgmlType::BF16;
    let k = scalar::kernels(t).unwrap();
    let rows_of = |rng: &mut ChaCha8Rng, cols: usize, kind: usize| -> Vec<f32> {
        let mut v: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let j = rng.gen_range(0..cols);
        match kind {
            0 => {}
            // Tiny but normal: products with small activations underflow.
            1 => v.iter_mut().for_each(|x| *x *= 2f32.powi(-100)),
            2 => v[j] = 2f32.powi(-130), // a BF16 subnormal
            3 => v[j] = 2f32.powi(120),  // products with large activations overflow
            4 => v[j] = f32::INFINITY,
            5 => v[j] = f32::NAN,
            _ => v.fill(0.0),
        }
        v
    };
    let tokens_of = |rng: &mut ChaCha8Rng, cols: usize, kind: usize| -> Vec<f32> {
        let mut v: Vec<f32> = (0..cols).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
        let j = rng.gen_range(0..cols);
        match kind {
            0 => {}
            1 => v.iter_mut().for_each(|x| *x *= 2f32.powi(-30)),
            2 => v.iter_mut().for_each(|x| *x *= 2f32.powi(10)),
            3 => v[j] = 1e-39, // a BF16 subnormal
            4 => v[j] = f32::NEG_INFINITY,
            5 => v[j] = f32::NAN,
            _ => v.fill(0.0),
        }
        v
    };
    for level in levels() {
        let lookup: KernelLookup = match level {
            KernelLevel::Avx2 => |t| KernelLevel::Avx2.kernels(t),
            KernelLevel::Avx512 => |t| KernelLevel::Avx512.kernels(t),
            _ => continue,
        };
        if lookup(t).and_then(|k| k.panel).is_none() {
            continue;
        }
        for cols in [16usize, 33, 1000] {
            // Seven kinds of eight rows (whole panels of four or eight), then three rows
            // past the last whole panel.
            let rows = 7 * 8 + 3;
            let w: Vec<f32> = (0..rows)
                .flat_map(|r| rows_of(&mut rng, cols, r / 8 % 7))
                .collect();
            let mut data = vec![0u8; rows * 2 * cols];
            prima_backend_cpu::formats::float::quantize_row_bf16(&w, &mut data);
            let view = TensorView {
                data: RSlice::from_slice(&data),
                ggml_type: t.id(),
                cols: cols as u64,
                rows: rows as u64,
            };
            let row_bytes = 2 * cols;
            // Tiles of three tokens of one kind, then of three kinds.
            for kind_of in [|tok: usize| tok / 3 % 7, |tok: usize| tok % 7] {
                let n_tokens = 22;
                let x: Vec<f32> = (0..n_tokens)
                    .flat_map(|tok| tokens_of(&mut rng, cols, kind_of(tok)))
                    .collect();
                let got = matmul_with(lookup, 2, view, &x, n_tokens);
                let mut act = vec![0u8; 2 * cols];
                for tok in 0..n_tokens {
                    (k.quantize_activation)(&x[tok * cols..(tok + 1) * cols], &mut act);
                    for r in 0..rows {
                        let want = (k.vec_dot)(cols, &data[r * row_bytes..][..row_bytes], &act);
                        let g = got[tok * rows + r];
                        assert!(
                            same(g, want),
                            "{} BF16 n={cols}: row {r} (kind {}) token {tok} (kind {}): {g} vs \
                             scalar {want}",
                            level.name(),
                            r / 8 % 7,
                            kind_of(tok)
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn few_token_matmul_matches_scalar() {
    let scale_kinds = [Scales::Normal, Scales::Max, Scales::Subnormal, Scales::Zero];
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    for level in levels() {
        let lookup: KernelLookup = match level {
            KernelLevel::Avx2 => |t| KernelLevel::Avx2.kernels(t),
            KernelLevel::Avx512 => |t| KernelLevel::Avx512.kernels(t),
            _ => continue,
        };
        // The small-batch kernels (2 ..= max_tokens through `matmul`) and the decode
        // kernels (one token through `matmul`), each also called directly.
        let sets = WEIGHT_TYPES.into_iter().flat_map(|t| {
            let k = lookup(t);
            [
                k.and_then(|k| k.few).map(|f| (t, f, 2, f.max_tokens)),
                k.and_then(|k| k.decode).map(|f| (t, f, 1, 1)),
            ]
            .into_iter()
            .flatten()
        });
        for (t, few, matmul_from, most) in sets {
            let k = scalar::kernels(t).unwrap();
            // 37: kernels that take 16 rows a step get two whole steps and a short one.
            // 64 blocks: steps over 16 KB, which `few_rows16` prefetches into L2 by its
            // other loop.
            for (rows, blocks) in [13, 37]
                .into_iter()
                .flat_map(|r| [1usize, 2, 3, 9, 18, 64].map(|b| (r, b)))
            {
                let cols = blocks * t.block_elems();
                let row_bytes = t.row_bytes(cols).unwrap();
                let data: Vec<u8> = (0..rows)
                    .flat_map(|r| random_row(&mut rng, t, cols, scale_kinds[r % 4]))
                    .collect();
                let w = TensorView {
                    data: RSlice::from_slice(&data),
                    ggml_type: t.id(),
                    cols: cols as u64,
                    rows: rows as u64,
                };
                let kinds = activations(&mut rng, cols);
                let act_bytes = k.vec_dot_type.row_bytes(cols).unwrap();
                for n_tokens in 1..=most {
                    // Each token a different activation kind, whichever the batch size.
                    let first_kind = rng.gen_range(0..kinds.len());
                    let kind = |tok: usize| &kinds[(first_kind + tok) % kinds.len()];
                    let x: Vec<f32> = (0..n_tokens).flat_map(|tok| kind(tok).1.clone()).collect();
                    let mut act = vec![0u8; n_tokens * act_bytes];
                    for (xs, a) in x.chunks_exact(cols).zip(act.chunks_exact_mut(act_bytes)) {
                        (k.quantize_activation)(xs, a);
                    }
                    let want = |r: usize, tok: usize| {
                        let wr = &data[r * row_bytes..(r + 1) * row_bytes];
                        (k.vec_dot)(cols, wr, &act[tok * act_bytes..(tok + 1) * act_bytes])
                    };
                    let check = |g: f32, r: usize, tok: usize, how: &str| {
                        let want = want(r, tok);
                        assert!(
                            same(g, want),
                            "{} {t} n={cols} {n_tokens} tokens ({how}): row {r} ({:?}) token \
                             {tok} ({}): {g} vs scalar {want}",
                            level.name(),
                            scale_kinds[r % 4],
                            kind(tok).0
                        );
                    };
                    if n_tokens >= matmul_from {
                        let got = matmul_with(lookup, 2, w, &x, n_tokens);
                        for tok in 0..n_tokens {
                            for r in 0..rows {
                                check(got[tok * rows + r], r, tok, "matmul");
                            }
                        }
                    }
                    // Directly: weight rows padded apart, the pack in a dirty buffer.
                    let stride = row_bytes + 7;
                    let mut padded = vec![0xA5u8; rows * stride];
                    for r in 0..rows {
                        padded[r * stride..][..row_bytes]
                            .copy_from_slice(&data[r * row_bytes..(r + 1) * row_bytes]);
                    }
                    let mut pack = vec![0x5Au8; (few.pack_bytes)(cols, n_tokens)];
                    (few.pack)(cols, &act, act_bytes, n_tokens, &mut pack);
                    let mut got = vec![f32::NAN; rows * n_tokens];
                    (few.dot)(cols, &padded, stride, &pack, n_tokens, &mut got);
                    for r in 0..rows {
                        for tok in 0..n_tokens {
                            let at = if few.token_major {
                                tok * rows + r
                            } else {
                                r * n_tokens + tok
                            };
                            check(got[at], r, tok, "direct");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn decode_kernels_cover_their_formats() {
    use GgmlType as T;
    for level in levels() {
        // Q6_K, Q5_K and Q3_K stay on `vec_dot`: their decode kernels
        // measured slower (see `formats/x86/kdec16.rs`, `kdec8.rs`). AVX-512 also has the
        // IQ4 formats' (`kdec16.rs`, `few_rows16.rs`).
        let want: &[GgmlType] = match level {
            KernelLevel::Avx512 => &[T::Q4K, T::Q2K, T::IQ4XS, T::IQ4NL],
            KernelLevel::Avx2 => &[T::Q4K, T::Q2K],
            _ => continue,
        };
        for &t in want {
            let k = level.kernels(t).unwrap();
            assert!(k.decode.is_some(), "{} {t}: no decode kernel", level.name());
        }
    }
}

#[test]
fn dispatch_selection() {
    let best = *dispatch::available_levels().last().unwrap();
    assert_eq!(dispatch::select(None).level, best);
    assert_eq!(dispatch::select(Some("")).level, best);
    let s = dispatch::select(Some("scalar"));
    assert_eq!((s.level, s.note), (KernelLevel::Scalar, None));
    assert_eq!(dispatch::select(Some(" AVX2 ")).level, {
        if KernelLevel::Avx2.is_available() {
            KernelLevel::Avx2
        } else {
            best
        }
    });
    let bad = dispatch::select(Some("amx"));
    assert_eq!(bad.level, best);
    assert!(bad.note.unwrap().contains("PRIMA_CPU_KERNELS=amx"));
    for l in KernelLevel::ALL {
        assert_eq!(KernelLevel::from_name(l.name()), Some(l));
        assert_eq!(l.kernels(GgmlType::Q4_0).is_some(), l.is_available());
    }
    assert!(KernelLevel::ALL
        .iter()
        .any(|l| l.name() == dispatch::kernel_level_name()));
}

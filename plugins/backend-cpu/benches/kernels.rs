//! Kernel throughput, in bytes of weights per second.
//!
//! - `matvec/<format>/<rows>x<cols>/<level>`: one thread, every weight row's `vec_dot`
//!   against one activation row (the decode step's matmul without the pool), scalar vs
//!   each SIMD level this CPU runs.
//! - `pool/q4_1/576x576/<pool>/<threads>`: a whole decode matmul through `ops::matmul` on
//!   rayon vs `SpinPool`, the hand-off cost the decode step pays ~100 times per token.
//! - `prefill/<format>/<rows>x<cols>/<tokens>`: a prefill matmul on two threads.
//! - `prefill_1t/<format>/<rows>x<cols>/<level>/x1|x4|2x4|2x8`: one thread, 16 tokens, the
//!   one-token, four-token and two-row × four- and eight-token kernels.
//! - `few_1t/<format>/<rows>x<cols>/<level>/<tokens>`: one thread, the small-batch kernels
//!   (continuous batching's decode steps of 2–8 requests; at 1 token, the decode kernel
//!   where the same table serves both): the pack, then every row.
//!
//! Run briefly: `cargo bench -p prima-backend-cpu -- --warm-up-time 1 --measurement-time 3 matvec/q4_1`.

use abi_stable::std_types::RSlice;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use prima_abi::backend::TensorView;
use prima_abi::GgmlType;
use prima_backend_cpu::formats::dispatch::{available_levels, KernelLevel};
use prima_backend_cpu::ops::matmul::{dot_rows, matmul, KernelLookup};
use prima_backend_cpu::ops::Weight;
use prima_backend_cpu::pool::{build_pool, ChunkRunner, Scratch, SpinPool};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::hint::black_box;

/// SmolLM2-135M's FFN (576 → 1536) and a 2B-class FFN (2048 → 8192), as rows × cols.
const SHAPES: [(usize, usize); 2] = [(1536, 576), (8192, 2048)];

/// `(rows, cols)`, or its transpose (the FFN's down projection) when a row of `cols` is not
/// whole blocks of `t` (576 columns of a K-quant).
fn shape_for(t: GgmlType, (rows, cols): (usize, usize)) -> (usize, usize) {
    if cols % t.block_elems() == 0 {
        (rows, cols)
    } else {
        (cols, rows)
    }
}

const FORMATS: [GgmlType; 15] = [
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q6K,
    GgmlType::Q5_0,
    GgmlType::Q4_0,
    GgmlType::Q5_1,
    GgmlType::Q5K,
    GgmlType::Q3K,
    GgmlType::Q2K,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
    // The 16-entry table formats (32-element blocks, Q8_0 activations, as Q4_0).
    GgmlType::IQ4NL,
    GgmlType::MXFP4,
];

fn weights(rng: &mut ChaCha8Rng, t: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let mut data = vec![0u8; rows * t.row_bytes(cols).unwrap()];
    rng.fill(&mut data[..]);
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    match t {
        GgmlType::F32 => {
            for c in data.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.gen_range(-1.0f32..1.0).to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in data.chunks_exact_mut(2) {
                c.copy_from_slice(&f16(rng.gen_range(-1.0..1.0)));
            }
        }
        GgmlType::BF16 => {
            for c in data.chunks_exact_mut(2) {
                c.copy_from_slice(&half::bf16::from_f32(rng.gen_range(-1.0..1.0)).to_le_bytes());
            }
        }
        _ => {
            let fields: &[usize] = match t {
                GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
                GgmlType::Q2K => &[80, 82],
                GgmlType::Q3K => &[108],
                GgmlType::Q6K => &[208],
                GgmlType::IQ4NL => &[0],
                GgmlType::MXFP4 => &[],
                _ => &[0, 2],
            };
            for block in data.chunks_exact_mut(t.block_bytes()) {
                for &off in fields {
                    block[off..off + 2].copy_from_slice(&f16(rng.gen_range(-0.05..0.05)));
                }
                if t == GgmlType::MXFP4 {
                    // The E8M0 exponent: half-scales 2^-10 ..= 2^2.
                    block[0] = rng.gen_range(118..=130);
                }
            }
        }
    }
    data
}

fn name(t: GgmlType) -> String {
    t.name().to_lowercase()
}

fn matvec(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let levels = available_levels();
    for t in FORMATS {
        let mut g = c.benchmark_group(format!("matvec/{}", name(t)));
        for shape in SHAPES {
            let (rows, cols) = shape_for(t, shape);
            let w = weights(&mut rng, t, rows, cols);
            let row_bytes = t.row_bytes(cols).unwrap();
            let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
            g.throughput(Throughput::Bytes(w.len() as u64));
            for &level in &levels {
                let k = level.kernels(t).unwrap();
                let mut a = vec![0u8; k.vec_dot_type.row_bytes(cols).unwrap()];
                (k.quantize_activation)(&x, &mut a);
                let mut out = vec![0f32; rows];
                g.bench_function(
                    BenchmarkId::new(format!("{rows}x{cols}"), level.name()),
                    |b| {
                        b.iter(|| {
                            for (o, wr) in out.iter_mut().zip(w.chunks_exact(row_bytes)) {
                                *o = (k.vec_dot)(cols, wr, black_box(&a));
                            }
                            black_box(&out);
                        })
                    },
                );
            }
        }
        g.finish();
    }
}

fn best_lookup() -> KernelLookup {
    match available_levels().last() {
        Some(KernelLevel::Avx512) => |t| KernelLevel::Avx512.kernels(t),
        Some(KernelLevel::Avx2) => |t| KernelLevel::Avx2.kernels(t),
        Some(KernelLevel::Neon) => |t| KernelLevel::Neon.kernels(t),
        _ => |t| KernelLevel::Scalar.kernels(t),
    }
}

fn run_matmul(
    pool: &impl ChunkRunner,
    scratch: &mut Scratch,
    w: &TensorView<'_>,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
) {
    matmul(pool, scratch, best_lookup(), w, x, n_tokens, out).unwrap();
}

fn view(data: &[u8], t: GgmlType, rows: usize, cols: usize) -> TensorView<'_> {
    TensorView {
        data: RSlice::from_slice(data),
        ggml_type: t.id(),
        cols: cols as u64,
        rows: rows as u64,
    }
}

fn pool(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let (t, rows, cols) = (GgmlType::Q4_1, 576usize, 576usize);
    let data = weights(&mut rng, t, rows, cols);
    let w = view(&data, t, rows, cols);
    let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let mut out = vec![0f32; rows];
    let mut scratch = Scratch::default();
    let mut g = c.benchmark_group("pool/q4_1/576x576");
    g.throughput(Throughput::Bytes(data.len() as u64));
    for threads in [1u32, 2] {
        let rayon = build_pool(threads).unwrap();
        g.bench_function(BenchmarkId::new("rayon", threads), |b| {
            b.iter(|| run_matmul(&rayon, &mut scratch, &w, &x, 1, &mut out))
        });
        drop(rayon);
        let spin = SpinPool::new(threads).unwrap();
        g.bench_function(BenchmarkId::new("spin", threads), |b| {
            b.iter(|| run_matmul(&spin, &mut scratch, &w, &x, 1, &mut out))
        });
    }
    g.finish();
}

fn prefill(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let pool = SpinPool::new(2).unwrap();
    let mut scratch = Scratch::default();
    for t in [GgmlType::Q4_1, GgmlType::Q4K] {
        let mut g = c.benchmark_group(format!("prefill/{}", name(t)));
        for shape in SHAPES {
            let (rows, cols) = shape_for(t, shape);
            let data = weights(&mut rng, t, rows, cols);
            let w = view(&data, t, rows, cols);
            let n_tokens = 64;
            let x: Vec<f32> = (0..n_tokens * cols)
                .map(|_| rng.gen_range(-1.0..1.0))
                .collect();
            let mut out = vec![0f32; n_tokens * rows];
            g.throughput(Throughput::Bytes((data.len() * n_tokens) as u64));
            g.bench_function(BenchmarkId::new(format!("{rows}x{cols}"), n_tokens), |b| {
                b.iter(|| run_matmul(&pool, &mut scratch, &w, &x, n_tokens, &mut out))
            });
        }
        g.finish();
    }
}

/// One thread, 16 tokens: the four-token kernel against four one-token calls, at each SIMD
/// level this CPU runs.
fn prefill_x4(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let levels: Vec<KernelLevel> = available_levels()
        .into_iter()
        .filter(|&l| l != KernelLevel::Scalar)
        .collect();
    for t in [
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
    ] {
        let (rows, cols) = shape_for(t, SHAPES[0]);
        let data = weights(&mut rng, t, rows, cols);
        let row_bytes = t.row_bytes(cols).unwrap();
        let w = Weight {
            ty: t,
            data: &data,
            cols,
            rows,
            row_bytes,
        };
        let n_tokens = 16;
        let x: Vec<f32> = (0..n_tokens * cols)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        let mut g = c.benchmark_group(format!("prefill_1t/{}/{rows}x{cols}", name(t)));
        g.throughput(Throughput::Bytes((data.len() * n_tokens) as u64));
        for &level in &levels {
            let k = level.kernels(t).unwrap();
            let arb = k.vec_dot_type.row_bytes(cols).unwrap();
            let mut act = vec![0u8; n_tokens * arb];
            for (a, xr) in act.chunks_exact_mut(arb).zip(x.chunks_exact(cols)) {
                (k.quantize_activation)(xr, a);
            }
            let mut out = vec![0f32; rows * n_tokens];
            let variants = [
                ("x1", without_x4(k)),
                ("x4", without_2x4(k)),
                ("2x4", without_2x8(k)),
                ("2x8", k),
            ];
            for (label, kk) in variants {
                let has = match label {
                    "2x4" => k.vec_dot_2x4.is_some(),
                    "2x8" => k.vec_dot_2x8.is_some(),
                    _ => true,
                };
                if !has {
                    continue;
                }
                g.bench_function(BenchmarkId::new(level.name(), label), |b| {
                    b.iter(|| dot_rows(&kk, &w, 0, &act, arb, n_tokens, &mut out))
                });
            }
        }
        g.finish();
    }
}

/// One thread, 1, 2, 4 and 8 tokens through the small-batch kernels ([`FewKernels`]), at each
/// SIMD level that has them: SmolLM2's FFN and its output head's shape.
///
/// [`FewKernels`]: prima_backend_cpu::formats::FewKernels
fn few_1t(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for (t, (rows, cols)) in [
        (GgmlType::Q4_1, SHAPES[0]),
        (GgmlType::Q4_1, (576, 1536)),
        (GgmlType::Q8_0, (8192, 576)),
        (GgmlType::Q4_0, SHAPES[0]),
        (GgmlType::Q5_1, SHAPES[0]),
    ] {
        let data = weights(&mut rng, t, rows, cols);
        let row_bytes = t.row_bytes(cols).unwrap();
        let mut g = c.benchmark_group(format!("few_1t/{}/{rows}x{cols}", name(t)));
        for level in available_levels() {
            let k = level.kernels(t).unwrap();
            let Some(few) = k.few else { continue };
            let arb = k.vec_dot_type.row_bytes(cols).unwrap();
            for n_tokens in [1, 2, 4, 8] {
                let x: Vec<f32> = (0..n_tokens * cols)
                    .map(|_| rng.gen_range(-1.0..1.0))
                    .collect();
                let mut act = vec![0u8; n_tokens * arb];
                for (a, xr) in act.chunks_exact_mut(arb).zip(x.chunks_exact(cols)) {
                    (k.quantize_activation)(xr, a);
                }
                let mut pack = vec![0u8; (few.pack_bytes)(cols, n_tokens)];
                let mut out = vec![0f32; rows * n_tokens];
                g.throughput(Throughput::Bytes(data.len() as u64));
                g.bench_function(BenchmarkId::new(level.name(), n_tokens), |b| {
                    b.iter(|| {
                        (few.pack)(cols, black_box(&act), arb, n_tokens, &mut pack);
                        (few.dot)(cols, &data, row_bytes, &pack, n_tokens, &mut out);
                        black_box(&out);
                    })
                });
            }
        }
        g.finish();
    }
}

fn without_2x8(
    mut k: prima_backend_cpu::formats::FormatKernels,
) -> prima_backend_cpu::formats::FormatKernels {
    k.vec_dot_2x8 = None;
    k
}

fn without_2x4(
    mut k: prima_backend_cpu::formats::FormatKernels,
) -> prima_backend_cpu::formats::FormatKernels {
    k.vec_dot_2x4 = None;
    k.vec_dot_2x8 = None;
    k
}

fn without_x4(
    mut k: prima_backend_cpu::formats::FormatKernels,
) -> prima_backend_cpu::formats::FormatKernels {
    k.vec_dot_x4 = None;
    k.vec_dot_2x4 = None;
    k.vec_dot_2x8 = None;
    k
}

criterion_group!(benches, matvec, pool, prefill, prefill_x4, few_1t);
criterion_main!(benches);

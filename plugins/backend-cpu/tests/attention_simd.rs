//! Attention's several-head F16 products at every kernel level this CPU runs, against the
//! scalar one-row kernels (the oracle):
//!
//! - `attention_dots_match_scalar`: each query head's score against each key row equals
//!   the scalar F16 `vec_dot` bit for bit, over head lengths around the 8- and 16-lane
//!   loops and the stack bound, 1–5 heads (the kernels' head groups and their remainders),
//!   1–9 keys, rows padded apart, and keys and queries from tiny (subnormal) to ±65504.
//! - `attention_axpys_match_scalar`: each head's weighted value sum equals the scalar
//!   `axpy_f16` applied row after row, likewise, with weights that are not F16 values.

use half::f16;
use prima_backend_cpu::formats::dispatch::{self, KernelLevel};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const LENGTHS: [usize; 13] = [1, 7, 8, 15, 16, 17, 31, 32, 33, 64, 100, 256, 520];

/// `n` F16 values as little-endian bytes, with magnitudes from `scale`.
fn f16_row(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<u8> {
    (0..n)
        .flat_map(|_| f16::from_f32(rng.gen_range(-1.0..1.0) * scale).to_le_bytes())
        .collect()
}

/// `n_rows` rows of `n` F16 elements, `stride` bytes apart (padding filled with NaN bits,
/// which a kernel reading it would show).
fn rows(rng: &mut ChaCha8Rng, n: usize, n_rows: usize, stride: usize, scale: f32) -> Vec<u8> {
    let mut out = vec![0xffu8; n_rows * stride];
    for j in 0..n_rows {
        let s = if j % 3 == 2 { 65504.0 } else { scale };
        out[j * stride..j * stride + 2 * n].copy_from_slice(&f16_row(rng, n, s));
    }
    out
}

fn same(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn attention_dots_match_scalar() {
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    let want_f = KernelLevel::Scalar.attention_f16().unwrap().dots;
    for level in dispatch::available_levels() {
        let got_f = level.attention_f16().unwrap().dots;
        for n in LENGTHS {
            for n_q in 1..=5 {
                for n_keys in [1usize, 2, 5, 9] {
                    for scale in [1.0f32, 1e-6, 300.0] {
                        let stride = 2 * n + 6;
                        let keys = rows(&mut rng, n, n_keys, stride, scale);
                        let keys = &keys[..(n_keys - 1) * stride + 2 * n];
                        let q = f16_row(&mut rng, n * n_q, 1.0);
                        let mut want = vec![0f32; n_q * n_keys];
                        let mut got = vec![0f32; n_q * n_keys];
                        want_f(n, keys, stride, n_keys, &q, n_q, &mut want);
                        got_f(n, keys, stride, n_keys, &q, n_q, &mut got);
                        assert!(
                            same(&want, &got),
                            "{} dots n={n} heads={n_q} keys={n_keys} scale={scale}",
                            level.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn attention_axpys_match_scalar() {
    let mut rng = ChaCha8Rng::seed_from_u64(37);
    let want_f = KernelLevel::Scalar.attention_f16().unwrap().axpys;
    for level in dispatch::available_levels() {
        let got_f = level.attention_f16().unwrap().axpys;
        for n in LENGTHS {
            for n_q in 1..=5 {
                for n_rows in [1usize, 2, 5, 9] {
                    for scale in [1.0f32, 1e-6, 300.0] {
                        let stride = 2 * n + 10;
                        let values = rows(&mut rng, n, n_rows, stride, scale);
                        let values = &values[..(n_rows - 1) * stride + 2 * n];
                        let w: Vec<f32> = (0..n_q * n_rows)
                            .map(|i| match i % 4 {
                                0 => rng.gen_range(0.0..1.0),
                                1 => f16::from_f32(rng.gen_range(0.0..1.0)).to_f32(),
                                2 => 0.0,
                                _ => 1e-30,
                            })
                            .collect();
                        let acc: Vec<f32> =
                            (0..n_q * n).map(|_| rng.gen_range(-4.0..4.0)).collect();
                        let (mut want, mut got) = (acc.clone(), acc);
                        want_f(n, values, stride, n_rows, &w, n_q, &mut want);
                        got_f(n, values, stride, n_rows, &w, n_q, &mut got);
                        assert!(
                            same(&want, &got),
                            "{} axpys n={n} heads={n_q} rows={n_rows} scale={scale}",
                            level.name()
                        );
                    }
                }
            }
        }
    }
}

//! Format kernels against independent oracles.
//!
//! - `dequantize_matches_numpy_oracle`: every weight format's `dequantize_row` against the
//!   `gguf` Python package's numpy dequantization (fixture `formats.bin`, see
//!   `fixtures/make_format_fixtures.py`), bit-exact, including zero/extreme/negative scales,
//!   the whole stream as one row and as rows of two blocks.
//! - `activation_quantizers_match_oracle`: Q8_0 (numpy `gguf` quantizer), Q8_1, Q8_K (numpy
//!   descriptions) and BF16 bytes, exact, including ties and all-zero blocks.
//! - `mxfp4_hand_checked`: MXFP4 blocks whose values were worked out by hand from
//!   llama.cpp's definition (doubled E2M1 codes times `2^(e − 128)`), at ordinary, subnormal
//!   and overflowing scales, dequantized and dotted against a hand-made Q8_0 block.
//! - `mxfp4_quantizer_matches_oracle`: this file's MXFP4 weight quantizer (written from the
//!   format's definition, as llama.cpp's reference quantizer rounds) writes the bytes of
//!   `gguf`'s numpy quantizer (fixture `wquant:MXFP4`), ties and an all-zero block included.
//! - `mxfp4_quantized_matmul_tracks_f32`: an F32 matrix quantized to MXFP4 by that
//!   quantizer, multiplied through the backend (its selected kernel level) for one token and
//!   for a prompt: each output equals the scalar `vec_dot`, and stays within MXFP4's
//!   rounding of the F32 product.
//! - `vec_dot_matches_dequantized_dot`: each format's `vec_dot` equals the f64 dot of the
//!   dequantized weight and dequantized activation rows (up to f32 rounding and, for
//!   Q4_1/Q5_1, the f16 rounding of Q8_1's `s`), and the unquantized f64 dot within the
//!   activation quantization step.

use abi_stable::std_types::{RSlice, RSliceMut};
use prima_abi::backend::{BackendConfig, TensorView};
use prima_abi::on_host::OnHost;
use prima_abi::GgmlType;
use prima_backend_cpu::formats::dispatch;
use prima_backend_cpu::formats::{k_quants::q8_k, mxfp4, q8_0, q8_1, scalar};
use prima_backend_cpu::CpuBackend;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use prima_backend_cpu::formats::WEIGHT_TYPES;

struct Record {
    name: String,
    bytes: Vec<u8>,
    floats: Vec<f32>,
}

fn read_fixtures() -> Vec<Record> {
    let data = include_bytes!("fixtures/formats.bin");
    let mut at = 0usize;
    let mut take = |n: usize| {
        let s = &data[at..at + n];
        at += n;
        s
    };
    let mut out = Vec::new();
    let mut left = data.len();
    while left > 0 {
        let name_len = take(1)[0] as usize;
        let name = String::from_utf8(take(name_len).to_vec()).unwrap();
        let n_bytes = u32::from_le_bytes(take(4).try_into().unwrap()) as usize;
        let bytes = take(n_bytes).to_vec();
        let n_floats = u32::from_le_bytes(take(4).try_into().unwrap()) as usize;
        let floats = take(4 * n_floats)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        left -= 1 + name_len + 4 + n_bytes + 4 + 4 * n_floats;
        out.push(Record {
            name,
            bytes,
            floats,
        });
    }
    out
}

fn type_named(name: &str) -> GgmlType {
    GgmlType::ALL
        .into_iter()
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("unknown type {name}"))
}

#[test]
fn dequantize_matches_numpy_oracle() {
    let records = read_fixtures();
    let mut seen = Vec::new();
    for r in records.iter().filter(|r| r.name.starts_with("dequant:")) {
        let t = type_named(&r.name["dequant:".len()..]);
        let dequantize = scalar::kernels(t)
            .expect("weight type has kernels")
            .dequantize_row;
        let n = r.floats.len();
        assert_eq!(t.row_bytes(n), Some(r.bytes.len()), "{t}: fixture size");

        let mut got = vec![f32::NAN; n];
        dequantize(&r.bytes, &mut got);
        for (i, (g, want)) in got.iter().zip(&r.floats).enumerate() {
            assert_eq!(
                g.to_bits(),
                want.to_bits(),
                "{t}: element {i} (block {}): got {g}, numpy {want}",
                i / t.block_elems()
            );
        }

        // Rows of two blocks give the same values.
        let (be, bb) = (2 * t.block_elems(), 2 * t.block_bytes());
        let mut by_rows = vec![f32::NAN; n];
        for (src, out) in r.bytes.chunks_exact(bb).zip(by_rows.chunks_exact_mut(be)) {
            dequantize(src, out);
        }
        assert_eq!(by_rows, got, "{t}: rows of two blocks");
        seen.push(t);
    }
    for t in WEIGHT_TYPES {
        assert!(seen.contains(&t), "no fixture for {t}");
    }
}

#[test]
fn activation_quantizers_match_oracle() {
    let records = read_fixtures();
    let mut seen = 0;
    for r in records.iter().filter(|r| r.name.starts_with("quant:")) {
        let t = type_named(&r.name["quant:".len()..]);
        let quantize: fn(&[f32], &mut [u8]) = match t {
            GgmlType::Q8_0 => q8_0::quantize_row,
            GgmlType::Q8_1 => q8_1::quantize_row,
            GgmlType::Q8K => q8_k::quantize_row,
            other => scalar::kernels(other).unwrap().quantize_activation,
        };
        let mut got = vec![0xAAu8; r.bytes.len()];
        quantize(&r.floats, &mut got);
        let bb = t.block_bytes();
        for (b, (g, want)) in got.chunks(bb).zip(r.bytes.chunks(bb)).enumerate() {
            assert_eq!(g, want, "{t}: block {b} differs from the oracle");
        }
        seen += 1;
    }
    assert_eq!(seen, 4);
}

/// Byte offsets of each block's f16 scales, to make random bytes into valid blocks.
fn f16_fields(t: GgmlType) -> &'static [usize] {
    match t {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::IQ4NL | GgmlType::IQ4XS => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q3K => &[108],
        GgmlType::Q6K => &[208],
        _ => &[],
    }
}

fn random_row(rng: &mut ChaCha8Rng, t: GgmlType, n: usize) -> Vec<u8> {
    let mut row = vec![0u8; t.row_bytes(n).unwrap()];
    match t {
        GgmlType::F32 => {
            for c in row.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.gen_range(-2.0f32..2.0).to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in row.chunks_exact_mut(2) {
                c.copy_from_slice(&half::f16::from_f32(rng.gen_range(-2.0f32..2.0)).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for c in row.chunks_exact_mut(2) {
                c.copy_from_slice(&half::bf16::from_f32(rng.gen_range(-2.0f32..2.0)).to_le_bytes());
            }
        }
        _ => {
            rng.fill(&mut row[..]);
            for block in row.chunks_exact_mut(t.block_bytes()) {
                for &off in f16_fields(t) {
                    let v = half::f16::from_f32(rng.gen_range(-0.05f32..0.05));
                    block[off..off + 2].copy_from_slice(&v.to_le_bytes());
                }
                if t == GgmlType::MXFP4 {
                    // The E8M0 exponent: half-scales 2^-10 ..= 2^2.
                    block[0] = rng.gen_range(118..=130);
                }
            }
        }
    }
    row
}

/// Largest error a quantized activation element may carry in each block of `x`.
fn activation_step(t: GgmlType, x: &[f32], i: usize) -> f64 {
    let be = t.block_elems();
    let block = &x[i / be * be..(i / be + 1) * be];
    let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
    match t {
        GgmlType::F32 => 0.0,
        // f16 subnormals below 2^-14 have an absolute step of 2^-24.
        GgmlType::F16 => x[i].abs() as f64 * 2f64.powi(-11) + 2f64.powi(-25),
        GgmlType::BF16 => x[i].abs() as f64 * 2f64.powi(-8),
        // Half a step, plus up to 127 times the f16 rounding of d (absolute 2^-25 once d is
        // an f16 subnormal).
        GgmlType::Q8_0 | GgmlType::Q8_1 => {
            let d = amax / 127.0;
            d * 0.5 + 127.0 * (d * 2f64.powi(-11)).max(2f64.powi(-25))
        }
        GgmlType::Q8K => amax / 127.0 * 0.5 * (1.0 + 1e-5),
        _ => unreachable!(),
    }
}

#[test]
fn vec_dot_matches_dequantized_dot() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for t in WEIGHT_TYPES {
        let k = scalar::kernels(t).unwrap();
        for &n in &[256usize, 512, 1024] {
            for trial in 0..8 {
                let w = random_row(&mut rng, t, n);
                let scale = if trial == 0 { 1e-3 } else { 10.0 };
                let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-scale..scale)).collect();
                let mut a = vec![0u8; k.vec_dot_type.row_bytes(n).unwrap()];
                (k.quantize_activation)(&x, &mut a);

                let mut wf = vec![0f32; n];
                let mut af = vec![0f32; n];
                (k.dequantize_row)(&w, &mut wf);
                scalar::dequantize_row(k.vec_dot_type)(&a, &mut af);
                for i in 0..n {
                    let err = (x[i] - af[i]).abs() as f64;
                    let step = activation_step(k.vec_dot_type, &x, i);
                    assert!(
                        err <= step + 1e-30,
                        "{t}: activation {i}: |{} - {}| > {step}",
                        x[i],
                        af[i]
                    );
                }

                let got = (k.vec_dot)(n, &w, &a) as f64;
                let exact_q: f64 = wf.iter().zip(&af).map(|(&p, &q)| p as f64 * q as f64).sum();
                let magnitude: f64 = wf
                    .iter()
                    .zip(&af)
                    .map(|(&p, &q)| (p as f64 * q as f64).abs())
                    .sum();
                let mut tol = 1e-5 * magnitude + 1e-30;
                if matches!(t, GgmlType::Q4_1 | GgmlType::Q5_1) {
                    // `s = d·Σq` is stored as f16: its rounding multiplies the weight's min.
                    let (wbb, abb) = (t.block_bytes(), q8_1::BLOCK_BYTES);
                    for (wb, ab) in w.chunks_exact(wbb).zip(a.chunks_exact(abb)) {
                        let m = half::f16::from_le_bytes([wb[2], wb[3]]).to_f32() as f64;
                        let s = half::f16::from_le_bytes([ab[2], ab[3]]).to_f32() as f64;
                        tol += (m * s).abs() * 2f64.powi(-10) + m.abs() * 2f64.powi(-24);
                    }
                }
                assert!((got - exact_q).abs() <= tol, "{t} n={n} trial {trial}: vec_dot {got} vs dequantized dot {exact_q} (tol {tol})");

                let exact_x: f64 = wf.iter().zip(&x).map(|(&p, &q)| p as f64 * q as f64).sum();
                let step_tol: f64 = (0..n)
                    .map(|i| wf[i].abs() as f64 * activation_step(k.vec_dot_type, &x, i))
                    .sum();
                assert!(
                    (got - exact_x).abs() <= step_tol + tol,
                    "{t} n={n}: vec_dot {got} vs unquantized dot {exact_x} (tol {})",
                    step_tol + tol
                );
            }
        }
    }
}

#[test]
fn q8_k_hand_checked() {
    // max |x| is the negative -4: iscale = -127 / -4 = 31.75, d = 1/31.75.
    let mut x = [0.0f32; 256];
    x[0] = -4.0;
    x[1] = 2.0;
    x[17] = 1.0;
    let mut b = vec![0u8; q8_k::BLOCK_BYTES];
    q8_k::quantize_row(&x, &mut b);
    assert_eq!(f32::from_le_bytes(b[0..4].try_into().unwrap()), 1.0 / 31.75);
    assert_eq!(b[4] as i8, -127);
    assert_eq!(b[5] as i8, 64); // 63.5 rounds to even
    assert_eq!(b[4 + 17] as i8, 32); // 31.75
    let bsum = |g: usize| i16::from_le_bytes([b[260 + 2 * g], b[261 + 2 * g]]);
    assert_eq!((bsum(0), bsum(1), bsum(2)), (-63, 32, 0));
}

#[test]
fn mxfp4_hand_checked() {
    // Codes 0..16 stand for 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (code 8 is -0,
    // read as 0); llama.cpp doubles them (0, 1, 2, 3, 4, 6, 8, 12) and halves the scale.
    // Byte j: element j in the low nibble, element j + 16 in the high one.
    let mut block = [0u8; 17];
    for j in 0..16u8 {
        block[1 + j as usize] = j | (15 - j) << 4;
    }
    let e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    // Code 8 (−0) reads as +0: the doubled table holds the integer 0.
    let code = |c: usize| if c <= 8 { e2m1[c % 8] } else { -e2m1[c - 8] };
    // e = 127: scale 2^0, the plain E2M1 values.
    block[0] = 127;
    let mut got = [f32::NAN; 32];
    mxfp4::dequantize_row(&block, &mut got);
    for (i, g) in got.iter().enumerate() {
        let c = if i < 16 { i } else { 15 - (i - 16) };
        assert_eq!(g.to_bits(), (code(c) as f32).to_bits(), "e=127 element {i}");
    }
    // e = 130: scale 2^3 (element 7: code 7, 6 · 8 = 48; element 16: code 15, −48).
    block[0] = 130;
    mxfp4::dequantize_row(&block, &mut got);
    assert_eq!((got[7], got[16], got[1], got[31]), (48.0, -48.0, 4.0, 0.0));
    // e = 0: scale 2^-127. Code 7 is 6 · 2^-127 = 1.5 · 2^-125 (normal: exponent field 2),
    // code 1 is 0.5 · 2^-127 = 2^-128, an f32 subnormal (bits 0x0020_0000).
    block[0] = 0;
    mxfp4::dequantize_row(&block, &mut got);
    assert_eq!(got[7].to_bits(), 2 << 23 | 0x0040_0000);
    assert_eq!(got[1].to_bits(), 0x0020_0000);
    // e = 255: scale 2^128 (E8M0's NaN, computed with by llama.cpp): 0.5 gives 2^127,
    // 6 overflows to infinity, the zero codes stay 0.
    block[0] = 255;
    mxfp4::dequantize_row(&block, &mut got);
    assert_eq!(got[1], 2f32.powi(127));
    assert_eq!((got[7], got[16]), (f32::INFINITY, f32::NEG_INFINITY));
    assert_eq!((got[0].to_bits(), got[8].to_bits()), (0, 0));

    // vec_dot against a Q8_0 block with d = 0.25 and quants 1, 2, .., 16 on elements
    // 0..16 (codes 0..16), 0 after: Σ code(i) · (i + 1) is 0·1 + 0.5·2 + 1·3 + 1.5·4 + 2·5
    // + 3·6 + 4·7 + 6·8 = 114 for the positive codes and −(0.5·10 + 1·11 + 1.5·12 + 2·13 +
    // 3·14 + 4·15 + 6·16) = −258 for the negative ones: −144, times 0.25 and the scale.
    let mut act = vec![0u8; q8_0::BLOCK_BYTES];
    act[..2].copy_from_slice(&half::f16::from_f32(0.25).to_le_bytes());
    for i in 0..16 {
        act[2 + i] = (i + 1) as u8;
    }
    for (e, want) in [(127, -36.0), (130, -288.0), (120, -36.0 / 128.0)] {
        block[0] = e;
        assert_eq!(mxfp4::vec_dot(32, &block, &act), want, "e = {e}");
    }
}

/// MXFP4 blocks of `x`, written from the format's definition as llama.cpp's reference
/// quantizer rounds: the exponent `e = ⌊log2 max|x|⌋ − 2 + 127` (so the largest code, 6 =
/// 1.5 · 2^2, lands on max|x|'s binade), then each value the nearest doubled code times
/// the half-scale, the first code on ties. All-zero blocks get `e = 0`.
fn quantize_mxfp4(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 32 * mxfp4::BLOCK_BYTES);
    for b in x.chunks_exact(32) {
        let amax = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0) as u8
        } else {
            0
        };
        let d = mxfp4::e8m0_half(e);
        let nearest = |v: f32| {
            let err = |c: usize| (mxfp4::KVALUES[c] as f32 * d - v).abs();
            (1..16).fold(0, |best, c| if err(c) < err(best) { c } else { best }) as u8
        };
        out.push(e);
        out.extend((0..16).map(|j| nearest(b[j]) | nearest(b[j + 16]) << 4));
    }
    out
}

#[test]
fn mxfp4_quantizer_matches_oracle() {
    let records = read_fixtures();
    let r = records
        .iter()
        .find(|r| r.name == "wquant:MXFP4")
        .expect("fixture wquant:MXFP4");
    let got = quantize_mxfp4(&r.floats);
    assert_eq!(got.len(), r.bytes.len());
    for (b, (g, want)) in got.chunks(17).zip(r.bytes.chunks(17)).enumerate() {
        assert_eq!(g, want, "MXFP4 block {b} differs from gguf's quantizer");
    }
}

#[test]
fn mxfp4_quantized_matmul_tracks_f32() {
    let mut rng = ChaCha8Rng::seed_from_u64(39);
    let (rows, cols) = (24usize, 512usize);
    // Rows of different magnitudes, as a model's experts have.
    let wf: Vec<f32> = (0..rows)
        .flat_map(|r| {
            let s = 10f32.powi(r as i32 % 5 - 3);
            (0..cols)
                .map(|_| s * rng.gen_range(-1.0f32..1.0))
                .collect::<Vec<_>>()
        })
        .collect();
    let wq = quantize_mxfp4(&wf);
    let mut wd = vec![0f32; rows * cols];
    mxfp4::dequantize_row(&wq, &mut wd);
    let w = TensorView {
        data: RSlice::from_slice(&wq),
        ggml_type: GgmlType::MXFP4.id(),
        cols: cols as u64,
        rows: rows as u64,
    };
    let k = scalar::kernels(GgmlType::MXFP4).unwrap();
    let b = CpuBackend::new(BackendConfig { threads: 2 }).unwrap();
    for n_tokens in [1usize, 5] {
        let x: Vec<f32> = (0..n_tokens * cols)
            .map(|_| rng.gen_range(-2.0..2.0))
            .collect();
        let mut out = vec![f32::NAN; n_tokens * rows];
        OnHost(&b)
            .matmul(
                w,
                RSlice::from_slice(&x),
                n_tokens as u32,
                RSliceMut::from_mut_slice(&mut out),
            )
            .unwrap();
        let mut act = vec![0u8; q8_0::BLOCK_BYTES * cols / 32];
        for t in 0..n_tokens {
            let xt = &x[t * cols..(t + 1) * cols];
            (k.quantize_activation)(xt, &mut act);
            for r in 0..rows {
                let got = out[t * rows + r];
                let wr = &wq[r * cols / 32 * 17..(r + 1) * cols / 32 * 17];
                assert_eq!(
                    got.to_bits(),
                    (k.vec_dot)(cols, wr, &act).to_bits(),
                    "{} kernels, {n_tokens} tokens: token {t} row {r} vs the scalar vec_dot",
                    dispatch::kernel_level_name()
                );
                // MXFP4 rounds each weight by at most half a code step, at most a quarter
                // of the binade's scale, 2^(e−128)·2 ≤ max|w|/2: |Δw| ≤ max|w|/4 per
                // element; activations by at most 2/127 each (|x| < 2).
                let (row_f, row_d) = (&wf[r * cols..(r + 1) * cols], &wd[r * cols..(r + 1) * cols]);
                let dot = |w: &[f32]| -> f64 {
                    w.iter().zip(xt).map(|(&p, &q)| p as f64 * q as f64).sum()
                };
                let (exact_q, exact_f) = (dot(row_d), dot(row_f));
                let wsum: f64 = row_d.iter().map(|v| v.abs() as f64).sum();
                let werr: f64 = row_f
                    .iter()
                    .zip(row_d)
                    .zip(xt)
                    .map(|((&p, &q), &v)| ((p - q) as f64 * v as f64).abs())
                    .sum();
                assert!(
                    (got as f64 - exact_q).abs() <= wsum * 2.0 / 127.0 + 1e-5 * wsum * 2.0,
                    "token {t} row {r}: {got} vs dequantized dot {exact_q}"
                );
                assert!(
                    (got as f64 - exact_f).abs() <= werr + wsum * 2.0 / 127.0 + 1e-5 * wsum * 2.0,
                    "token {t} row {r}: {got} vs F32 dot {exact_f}"
                );
                // And the rounding is that of MXFP4: each weight within a quarter of its
                // block's largest magnitude.
                for (blk, (bf, bd)) in row_f.chunks(32).zip(row_d.chunks(32)).enumerate() {
                    let amax = bf.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    for (p, q) in bf.iter().zip(bd) {
                        assert!(
                            (p - q).abs() <= amax / 4.0,
                            "row {r} block {blk}: {p} → {q}"
                        );
                    }
                }
            }
        }
    }
}

//! Format kernels against independent oracles.
//!
//! - `dequantize_matches_numpy_oracle`: every weight format's `dequantize_row` against the
//!   `gguf` Python package's numpy dequantization (fixture `formats.bin`, see
//!   `fixtures/make_format_fixtures.py`), bit-exact, including zero/extreme/negative scales,
//!   the whole stream as one row and as rows of two blocks.
//! - `activation_quantizers_match_oracle`: Q8_0 (numpy `gguf` quantizer), Q8_1, Q8_K (numpy
//!   descriptions) and BF16 bytes, exact, including ties and all-zero blocks.
//! - `vec_dot_matches_dequantized_dot`: each format's `vec_dot` equals the f64 dot of the
//!   dequantized weight and dequantized activation rows (up to f32 rounding and, for
//!   Q4_1/Q5_1, the f16 rounding of Q8_1's `s`), and the unquantized f64 dot within the
//!   activation quantization step.

use prima_abi::GgmlType;
use prima_backend_cpu::formats::{k_quants::q8_k, q8_0, q8_1, scalar};
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

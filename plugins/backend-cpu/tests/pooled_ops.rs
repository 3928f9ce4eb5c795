//! The ops a prompt splits over the pool give the bits they give on one thread, called
//! through the `Backend` trait of [`CpuBackend`] with prompt-sized inputs (enough rows to
//! be split, and a count that no chunking divides):
//!
//! - `rms_norm_and_rope_split_over_the_pool_match_one_thread`: RMS norm by rows, RoPE by
//!   positions (NeoX and normal ordering, frequency factors, YaRN), 1 vs 2 and 3 threads.
//! - `attention_split_over_the_pool_matches_one_thread`: grouped-query attention (3 query
//!   heads per KV head, head lengths with and without a 16-lane tail) of a prompt, then a
//!   second prompt on top of it with a sliding window and soft-capping, 1 vs 2 and 3
//!   threads.

use abi_stable::std_types::{RNone, RSlice, RSliceMut, RSome};
use prima_backend_cpu::CpuBackend;
use prima_core::gguf::GgmlType;
use prima_core::plugin::backend_abi::{
    AttentionParams, Backend, BackendConfig, KvSpec, RopeParams, TensorView,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn backend(threads: u32) -> CpuBackend {
    CpuBackend::new(BackendConfig { threads }).unwrap()
}

fn rand_vec(rng: &mut ChaCha8Rng, n: usize, r: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-r..r)).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn rope(n_rot: u32, neox: bool, factors: Option<&[f32]>, ext: f32) -> RopeParams<'_> {
    RopeParams {
        n_rot,
        freq_base: 10000.0,
        freq_scale: if ext != 0.0 { 0.25 } else { 1.0 },
        neox,
        freq_factors: match factors {
            Some(f) => RSome(RSlice::from_slice(f)),
            None => RNone,
        },
        ext_factor: ext,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        n_ctx_orig: 4096,
    }
}

#[test]
fn rms_norm_and_rope_split_over_the_pool_match_one_thread() {
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    let (rows, n_head, head_dim) = (37usize, 3usize, 32usize);
    let n = n_head * head_dim;
    let x = rand_vec(&mut rng, rows * n, 3.0);
    let w: Vec<u8> = rand_vec(&mut rng, n, 2.0)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let weight = TensorView {
        data: RSlice::from_slice(&w),
        ggml_type: GgmlType::F32.id(),
        cols: n as u64,
        rows: 1,
    };
    let positions: Vec<u32> = (0..rows as u32).map(|i| 3 * i + 1).collect();
    let factors: Vec<f32> = (0..12).map(|i| 1.0 + i as f32 / 4.0).collect();
    let run = |b: &CpuBackend| {
        let mut normed = vec![0f32; x.len()];
        b.rms_norm(
            RSlice::from_slice(&x),
            weight,
            1e-6,
            RSliceMut::from_mut_slice(&mut normed),
        )
        .unwrap();
        let mut all = normed.clone();
        for p in [
            rope(32, false, None, 0.0),
            rope(32, true, None, 0.0),
            rope(24, true, Some(&factors), 0.0),
            rope(24, false, None, 1.0),
        ] {
            let mut y = normed.clone();
            b.rope(
                RSliceMut::from_mut_slice(&mut y),
                n_head as u32,
                head_dim as u32,
                RSlice::from_slice(&positions),
                p,
            )
            .unwrap();
            all.extend(y);
        }
        bits(&all)
    };
    let want = run(&backend(1));
    for threads in [2, 3] {
        assert!(want == run(&backend(threads)), "{threads} threads");
    }
}

#[test]
fn attention_split_over_the_pool_matches_one_thread() {
    let mut rng = ChaCha8Rng::seed_from_u64(43);
    for (dk, dv) in [(64u32, 64u32), (40, 24)] {
        let (n_head, n_head_kv) = (6u32, 2u32);
        let spec = KvSpec {
            n_layers: 2,
            n_ctx: 64,
            n_head_kv,
            head_dim_k: dk,
            head_dim_v: dv,
        };
        // A prompt of 19 tokens, then one of 11 with a window of 7 and soft-capping.
        let steps = [(0u32, 19u32, 0u32, 0.0f32), (19, 11, 7, 20.0)];
        let inputs: Vec<_> = steps
            .iter()
            .map(|&(_, n, _, _)| {
                let n = n as usize;
                (
                    rand_vec(&mut rng, n * (n_head * dk) as usize, 2.0),
                    rand_vec(&mut rng, n * (n_head_kv * dk) as usize, 2.0),
                    rand_vec(&mut rng, n * (n_head_kv * dv) as usize, 2.0),
                )
            })
            .collect();
        let run = |b: &CpuBackend| {
            let kv = b.kv_create(spec).unwrap();
            let mut all = Vec::new();
            for (&(start, n, window, softcap), (q, k, v)) in steps.iter().zip(&inputs) {
                let p = AttentionParams {
                    layer: 1,
                    n_tokens: n,
                    start_pos: start,
                    n_head,
                    n_head_kv,
                    head_dim_k: dk,
                    head_dim_v: dv,
                    scale: 0.125,
                    sliding_window: window,
                    softcap,
                };
                let mut out = vec![0f32; (n * n_head * dv) as usize];
                b.attention(
                    kv,
                    RSlice::from_slice(q),
                    RSlice::from_slice(k),
                    RSlice::from_slice(v),
                    p,
                    RSliceMut::from_mut_slice(&mut out),
                )
                .unwrap();
                all.extend(out);
            }
            bits(&all)
        };
        let want = run(&backend(1));
        for threads in [2, 3] {
            assert!(want == run(&backend(threads)), "dk {dk}, {threads} threads");
        }
    }
}

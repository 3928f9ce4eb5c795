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
//! - `attention_spans_match_one_call_per_span`: a continuous-batching step (three
//!   requests' caches at different lengths, spans of 1, 3 and 1 rows) through one
//!   `attention_spans` call gives the bits of one `attention` call per span, with and
//!   without a window and soft-capping; bad spans are errors that change no cache.

use abi_stable::std_types::{RNone, RSlice, RSliceMut, RSome};
use prima_abi::backend::{
    AttentionParams, AttentionSpan, Backend, BackendConfig, KvSpec, RopeParams, TensorView,
};
use prima_abi::on_host::OnHost;
use prima_abi::GgmlType;
use prima_backend_cpu::CpuBackend;
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
        OnHost(b)
            .rms_norm(
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
            OnHost(b)
                .rope(
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
                OnHost(b)
                    .attention(
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

#[test]
fn attention_spans_match_one_call_per_span() {
    let mut rng = ChaCha8Rng::seed_from_u64(47);
    let (n_head, n_head_kv, dk, dv) = (6u32, 2u32, 40u32, 24u32);
    let spec = KvSpec {
        n_layers: 2,
        n_ctx: 64,
        n_head_kv,
        head_dim_k: dk,
        head_dim_v: dv,
    };
    let (q_row, k_row, v_row, o_row) = (
        (n_head * dk) as usize,
        (n_head_kv * dk) as usize,
        (n_head_kv * dv) as usize,
        (n_head * dv) as usize,
    );
    let params = |n_tokens, start_pos, window, softcap| AttentionParams {
        layer: 1,
        n_tokens,
        start_pos,
        n_head,
        n_head_kv,
        head_dim_k: dk,
        head_dim_v: dv,
        scale: 0.125,
        sliding_window: window,
        softcap,
    };
    // Three requests' prompts (5, 9 and 13 tokens), then two batched steps of 1, 3 and 1
    // rows each: plain, then with a window of 7 and soft-capping.
    let prompts = [5u32, 9, 13];
    let steps = [[1u32, 3, 1], [1, 3, 1]];
    let mut rows = |n: u32| {
        let n = n as usize;
        (
            rand_vec(&mut rng, n * q_row, 2.0),
            rand_vec(&mut rng, n * k_row, 2.0),
            rand_vec(&mut rng, n * v_row, 2.0),
        )
    };
    let prompt_rows: Vec<_> = prompts.iter().map(|&n| rows(n)).collect();
    let step_rows: Vec<Vec<_>> = steps
        .iter()
        .map(|s| s.iter().map(|&n| rows(n)).collect())
        .collect();
    let concat = |parts: &[(Vec<f32>, Vec<f32>, Vec<f32>)]| {
        let mut all = (Vec::new(), Vec::new(), Vec::new());
        for (q, k, v) in parts {
            all.0.extend_from_slice(q);
            all.1.extend_from_slice(k);
            all.2.extend_from_slice(v);
        }
        all
    };
    // Each request's prompt, one call each, on a fresh backend; its caches.
    let start = |b: &CpuBackend| {
        prompts
            .iter()
            .zip(&prompt_rows)
            .map(|(&n, (q, k, v))| {
                let kv = b.kv_create(spec).unwrap();
                let mut out = vec![0f32; n as usize * o_row];
                OnHost(b)
                    .attention(
                        kv,
                        RSlice::from_slice(q),
                        RSlice::from_slice(k),
                        RSlice::from_slice(v),
                        params(n, 0, 0, 0.0),
                        RSliceMut::from_mut_slice(&mut out),
                    )
                    .unwrap();
                kv
            })
            .collect::<Vec<u64>>()
    };
    let step_params = |i: usize| if i == 0 { (0, 0.0) } else { (7, 20.0) };

    // Reference: one thread, one call per span.
    let one = backend(1);
    let kvs = start(&one);
    let mut want = Vec::new();
    let mut pos = prompts;
    for (i, (sizes, parts)) in steps.iter().zip(&step_rows).enumerate() {
        let (window, softcap) = step_params(i);
        for (r, (&n, (q, k, v))) in sizes.iter().zip(parts).enumerate() {
            let mut out = vec![0f32; n as usize * o_row];
            OnHost(&one)
                .attention(
                    kvs[r],
                    RSlice::from_slice(q),
                    RSlice::from_slice(k),
                    RSlice::from_slice(v),
                    params(n, pos[r], window, softcap),
                    RSliceMut::from_mut_slice(&mut out),
                )
                .unwrap();
            want.extend(bits(&out));
            pos[r] += n;
        }
    }

    for threads in [1, 2, 3] {
        let b = backend(threads);
        let kvs = start(&b);
        let mut got = Vec::new();
        let mut pos = prompts;
        for (i, (sizes, parts)) in steps.iter().zip(&step_rows).enumerate() {
            let (window, softcap) = step_params(i);
            let (q, k, v) = concat(parts);
            let spans: Vec<AttentionSpan> = (0..3)
                .map(|r| AttentionSpan {
                    kv: kvs[r],
                    n_tokens: sizes[r],
                    start_pos: pos[r],
                })
                .collect();
            let n_rows: u32 = sizes.iter().sum();
            let mut out = vec![0f32; n_rows as usize * o_row];
            let call = |spans: &[AttentionSpan], q: &[f32], out: &mut [f32]| {
                OnHost(&b)
                    .attention_spans(
                        RSlice::from_slice(spans),
                        RSlice::from_slice(q),
                        RSlice::from_slice(&k),
                        RSlice::from_slice(&v),
                        params(0, 0, window, softcap),
                        RSliceMut::from_mut_slice(out),
                    )
                    .into_result()
            };
            // Bad calls first: each an error naming what is wrong, no cache changed (the
            // good call after them must still give the reference's bits).
            let mut twice = spans.clone();
            twice[2].kv = twice[0].kv;
            let e = call(&twice, &q, &mut out).unwrap_err();
            assert!(e.contains("share KV cache handle"), "{e}");
            let e = call(&spans, &q[1..], &mut out).unwrap_err();
            assert!(e.contains("q length"), "{e}");
            let mut gap = spans.clone();
            gap[1].start_pos += 1;
            let e = call(&gap, &q, &mut out).unwrap_err();
            assert!(e.contains("leaves a gap"), "{e}");

            call(&spans, &q, &mut out).unwrap();
            got.extend(bits(&out));
            for (p, n) in pos.iter_mut().zip(sizes) {
                *p += n;
            }
        }
        assert!(want == got, "{threads} threads");
    }
}

//! The operations one by one against the CPU backend, on random inputs.

use abi_stable::std_types::{RSlice, RSliceMut};
use prima_abi::backend::{
    AttentionParams, AttentionSpan, BackendBox, Buf, KvSpec, RopeParams, TensorView,
};
use prima_abi::on_host::OnHost;
use prima_abi::GgmlType;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::{cpu, max_abs, max_abs_diff, randn, random_weight, view, Target};
use crate::formats::FORMATS;

/// Each weight format's get_rows and matmul at `token_counts` tokens, on the target and on
/// `others` (the same plugin with other kernel shapes, which must give the same products).
pub fn every_weight_format(t: &Target, others: &[BackendBox], token_counts: &[usize]) {
    let (gpu, cpu_backend) = (OnHost(&t.backend), cpu());
    let cpu = OnHost(&cpu_backend);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut failures = Vec::new();
    for fmt in FORMATS {
        let ty = fmt.ty;
        assert!(gpu.0.supports(ty as u32));
        // 512 columns: fewer blocks than a workgroup's (or warp's) lanes; 2560: several passes.
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
            assert!(d <= t.tol(max_abs(&want)), "{ty}: get_rows differs by {d}");
            for &n_tokens in token_counts {
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
                let rel = max_abs_diff(&g, &c) / max_abs(&c).max(1e-30);
                let mut rel_other = 0.0f32;
                for other in others {
                    let mut o = vec![0f32; n_tokens * rows];
                    OnHost(other)
                        .matmul(
                            wv,
                            RSlice::from_slice(&x),
                            n_tokens as u32,
                            RSliceMut::from_mut_slice(&mut o),
                        )
                        .unwrap();
                    rel_other = rel_other.max(max_abs_diff(&o, &c) / max_abs(&c).max(1e-30));
                }
                println!(
                    "{:<5} matmul {cols}x{rows} n={n_tokens:<2}: |gpu-cpu| / max|y| {rel:.2e}, other kernels {rel_other:.2e}  (max |y| {:.2})",
                    ty.name(),
                    max_abs(&c)
                );
                let tol = if ty == GgmlType::F32 {
                    t.tol_f32(1.0)
                } else {
                    t.tol(1.0)
                };
                if rel.max(rel_other) > tol {
                    failures.push(format!(
                        "{ty} {cols}x{rows} n={n_tokens}: {rel:.2e} / {rel_other:.2e}"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "matmuls differ: {failures:?}");
}

/// rms_norm, add, add_bias, scale, swiglu and geglu.
pub fn element_wise_ops(t: &Target) {
    let (gpu, cpu_backend) = (OnHost(&t.backend), cpu());
    let cpu = OnHost(&cpu_backend);
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
    assert!(d <= t.tol(max_abs(&a)), "rms_norm {d}");
    let y = randn(&mut rng, rows * n);
    type Op = fn(&OnHost<'_, BackendBox>, &mut [f32], &[f32], TensorView<'_>);
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
    for (name, op, slack) in ops {
        let (mut a, mut b) = (x.clone(), x.clone());
        op(&cpu, &mut a, &y, wv);
        op(&gpu, &mut b, &y, wv);
        let d = max_abs_diff(&a, &b);
        println!("{name}: {d:.2e}");
        assert!(d <= slack.max(t.tol(max_abs(&a))), "{name}: {d}");
    }
}

/// RoPE, normal and NeoX, with frequency factors and with YaRN.
pub fn rope_variants(t: &Target) {
    let (gpu, cpu_backend) = (OnHost(&t.backend), cpu());
    let cpu = OnHost(&cpu_backend);
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
        assert!(d <= t.tol(max_abs(&a)), "rope {d}");
    }
}

/// Attention with GQA, a sliding window and soft-capping, over prompt and decode steps,
/// then after a truncation.
pub fn attention_variants(t: &Target) {
    let (gpu, cpu_backend) = (OnHost(&t.backend), cpu());
    let cpu = OnHost(&cpu_backend);
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
        let (kc, kg) = (
            cpu.0.kv_create(spec).unwrap(),
            gpu.0.kv_create(spec).unwrap(),
        );
        let p = |n_tokens, start_pos| AttentionParams {
            layer: 1,
            n_tokens,
            start_pos,
            n_head,
            n_head_kv,
            head_dim_k: dk,
            head_dim_v: dk,
            scale: 1.0 / (dk as f32).sqrt(),
            sliding_window: window,
            softcap,
        };
        let mut worst = 0.0f32;
        let mut pos = 0;
        for n_tokens in [7u32, 1, 1, 12, 1] {
            let q = randn(&mut rng, (n_tokens * n_head * dk) as usize);
            let k = randn(&mut rng, (n_tokens * n_head_kv * dk) as usize);
            let v = randn(&mut rng, (n_tokens * n_head_kv * dk) as usize);
            let (mut a, mut b) = (vec![0f32; q.len()], vec![0f32; q.len()]);
            cpu.attention(
                kc,
                RSlice::from_slice(&q),
                RSlice::from_slice(&k),
                RSlice::from_slice(&v),
                p(n_tokens, pos),
                RSliceMut::from_mut_slice(&mut a),
            )
            .unwrap();
            gpu.attention(
                kg,
                RSlice::from_slice(&q),
                RSlice::from_slice(&k),
                RSlice::from_slice(&v),
                p(n_tokens, pos),
                RSliceMut::from_mut_slice(&mut b),
            )
            .unwrap();
            worst = worst.max(max_abs_diff(&a, &b));
            pos += n_tokens;
        }
        // A continuous-batching step: this cache (at `pos`) and two fresh ones with short
        // prompts, spans of 1, 3 and 2 rows in one `attention_spans` call.
        let mut spans = (vec![], vec![]);
        let (mut qs, mut ks, mut vs) = (vec![], vec![], vec![]);
        for (prompt, n_tokens) in [(0u32, 1u32), (5, 3), (9, 2)] {
            let (c, g, start) = if prompt == 0 {
                (kc, kg, pos)
            } else {
                let (c, g) = (
                    cpu.0.kv_create(spec).unwrap(),
                    gpu.0.kv_create(spec).unwrap(),
                );
                let q = randn(&mut rng, (prompt * n_head * dk) as usize);
                let k = randn(&mut rng, (prompt * n_head_kv * dk) as usize);
                let v = randn(&mut rng, (prompt * n_head_kv * dk) as usize);
                for (be, kv) in [(&cpu, c), (&gpu, g)] {
                    let mut o = vec![0f32; q.len()];
                    be.attention(
                        kv,
                        RSlice::from_slice(&q),
                        RSlice::from_slice(&k),
                        RSlice::from_slice(&v),
                        p(prompt, 0),
                        RSliceMut::from_mut_slice(&mut o),
                    )
                    .unwrap();
                }
                (c, g, prompt)
            };
            let span = |kv| AttentionSpan {
                kv,
                n_tokens,
                start_pos: start,
            };
            spans.0.push(span(c));
            spans.1.push(span(g));
            qs.extend(randn(&mut rng, (n_tokens * n_head * dk) as usize));
            ks.extend(randn(&mut rng, (n_tokens * n_head_kv * dk) as usize));
            vs.extend(randn(&mut rng, (n_tokens * n_head_kv * dk) as usize));
        }
        let (mut a, mut b) = (vec![0f32; qs.len()], vec![0f32; qs.len()]);
        for (be, spans, out) in [(&cpu, &spans.0, &mut a), (&gpu, &spans.1, &mut b)] {
            be.attention_spans(
                RSlice::from_slice(spans),
                RSlice::from_slice(&qs),
                RSlice::from_slice(&ks),
                RSlice::from_slice(&vs),
                p(0, 0),
                RSliceMut::from_mut_slice(out),
            )
            .unwrap();
        }
        worst = worst.max(max_abs_diff(&a, &b));
        for (c, g) in spans.0.iter().zip(&spans.1).skip(1) {
            cpu.0.kv_drop(c.kv);
            gpu.0.kv_drop(g.kv);
        }
        // Truncation, then a re-evaluation of the dropped positions.
        cpu.0.kv_truncate(kc, 10).unwrap();
        gpu.0.kv_truncate(kg, 10).unwrap();
        println!("attention heads {n_head}/{n_head_kv} d {dk} window {window} softcap {softcap}: {worst:.2e}");
        // The CPU's numerics step for step (f16 queries, q · k in its order, f16
        // probabilities, f64 total, values summed in key order): equal bits.
        assert!(worst <= t.tol(1.0), "attention {worst}");
        cpu.0.kv_drop(kc);
        gpu.0.kv_drop(kg);
    }
}

/// A layer's worth of operations chained on device buffers — embedding rows, a norm, Q, K
/// and V into ranges of one buffer, RoPE on two of them, attention, an output product into
/// a range at an odd offset, a residual add, a scale — with one upload and one download.
/// The result must be the CPU's, and the target must have crossed the bus only for those
/// two (one wait, at most one submission).
pub fn chained_on_device(t: &Target) {
    let cpu = cpu();
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let (n, n_head, n_head_kv, hd, n_tok) = (256usize, 4usize, 2usize, 64usize, 5usize);
    let (q_dim, kv_dim) = (n_head * hd, n_head_kv * hd);
    let table = random_weight(&mut rng, GgmlType::Q8_0, n, 32);
    let wq = random_weight(&mut rng, GgmlType::Q4_1, n, q_dim);
    let wk = random_weight(&mut rng, GgmlType::Q4K, n, kv_dim);
    let wv = random_weight(&mut rng, GgmlType::Q8_0, n, kv_dim);
    let wo = random_weight(&mut rng, GgmlType::Q6K, q_dim, n);
    let norm: Vec<u8> = randn(&mut rng, n)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let residual = randn(&mut rng, n_tok * n);
    let ids: Vec<u32> = vec![3, 0, 31, 7, 7];
    let positions: Vec<u32> = (0..n_tok as u32).collect();
    let rope = RopeParams {
        n_rot: hd as u32,
        freq_base: 10_000.0,
        freq_scale: 1.0,
        neox: true,
        freq_factors: None.into(),
        ext_factor: 0.0,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        n_ctx_orig: 4096,
    };
    let spec = KvSpec {
        n_layers: 1,
        n_ctx: 16,
        n_head_kv: n_head_kv as u32,
        head_dim_k: hd as u32,
        head_dim_v: hd as u32,
    };
    let params = AttentionParams {
        layer: 0,
        n_tokens: n_tok as u32,
        start_pos: 0,
        n_head: n_head as u32,
        n_head_kv: n_head_kv as u32,
        head_dim_k: hd as u32,
        head_dim_v: hd as u32,
        scale: 1.0 / (hd as f32).sqrt(),
        sliding_window: 0,
        softcap: 0.0,
    };
    let run = |be: &BackendBox| -> (Vec<f32>, prima_abi::backend::TransferCounts) {
        let before = be.transfers();
        let new = |len: usize| Buf::whole(be.buf_create(len as u64).unwrap(), len);
        let (x, h, qkv, att) = (
            new(n_tok * n),
            new(n_tok * n),
            new(n_tok * (q_dim + 2 * kv_dim)),
            new(n_tok * q_dim),
        );
        // An odd offset: the kernels take element offsets, not aligned bindings.
        let o_big = new(n_tok * n + 7);
        let o = o_big.slice(7, n_tok * n);
        let extra = new(n_tok * n);
        let q = qkv.slice(0, n_tok * q_dim);
        let k = qkv.slice(n_tok * q_dim, n_tok * kv_dim);
        let v = qkv.slice(n_tok * (q_dim + kv_dim), n_tok * kv_dim);
        let kv = be.kv_create(spec).unwrap();
        be.upload(extra, RSlice::from_slice(&residual)).unwrap();
        be.get_rows(
            view(&table, GgmlType::Q8_0, n, 32),
            RSlice::from_slice(&ids),
            x,
        )
        .unwrap();
        be.add(x, extra).unwrap();
        be.rms_norm(x, view(&norm, GgmlType::F32, n, 1), 1e-5, h)
            .unwrap();
        let nt = n_tok as u32;
        be.matmul(view(&wq, GgmlType::Q4_1, n, q_dim), h, nt, q)
            .unwrap();
        be.matmul(view(&wk, GgmlType::Q4K, n, kv_dim), h, nt, k)
            .unwrap();
        be.matmul(view(&wv, GgmlType::Q8_0, n, kv_dim), h, nt, v)
            .unwrap();
        let pos = RSlice::from_slice(&positions);
        be.rope(q, n_head as u32, hd as u32, pos, rope).unwrap();
        be.rope(k, n_head_kv as u32, hd as u32, pos, rope).unwrap();
        let span = [AttentionSpan {
            kv,
            n_tokens: nt,
            start_pos: 0,
        }];
        be.attention_spans(RSlice::from_slice(&span), q, k, v, params, att)
            .unwrap();
        be.matmul(view(&wo, GgmlType::Q6K, q_dim, n), att, nt, o)
            .unwrap();
        be.add(x, o).unwrap();
        be.scale(x, 0.5).unwrap();
        let mut host = vec![0f32; n_tok * n];
        be.download(x, RSliceMut::from_mut_slice(&mut host))
            .unwrap();
        let moved = be.transfers().since(before);
        for b in [x, h, qkv, att, o_big, extra] {
            be.buf_drop(b.id);
        }
        be.kv_drop(kv);
        (host, moved)
    };
    let (want, _) = run(&cpu);
    let (got, moved) = run(&t.backend);
    let d = max_abs_diff(&want, &got);
    println!("a layer chained on the device: {d:.2e}; transfers {moved:?}");
    assert!(d <= t.tol(max_abs(&want)), "chained ops differ by {d}");
    assert_eq!(
        (moved.uploads, moved.downloads, moved.waits),
        (1, 1, 1),
        "{moved:?}"
    );
    assert!(moved.submissions <= 1, "{moved:?}");
    assert_eq!(
        (moved.bytes_up, moved.bytes_down),
        ((n_tok * n * 4) as u64, (n_tok * n * 4) as u64)
    );
}

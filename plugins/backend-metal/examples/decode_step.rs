//! A SmolLM2-135M-shaped decode step (30 layers of random Q4_1 weights, a Q8_0 output
//! head) on device buffers, timed per token with the transfers it made: where a token's
//! time goes without the engine in the way (recording vs waiting for the device).
//! `PRIMA_WGPU_ALLOW_SOFTWARE=1 cargo run --release -p prima-backend-metal --example
//! decode_step [LAYERS]`

use std::time::Instant;

use abi_stable::std_types::{RSlice, RSliceMut};
use prima_abi::backend::{
    AttentionParams, AttentionSpan, Backend, BackendConfig, Buf, KvSpec, RopeParams, TensorView,
};
use prima_abi::GgmlType;

const E: usize = 576;
const N_HEAD: usize = 9;
const N_HEAD_KV: usize = 3;
const HEAD_DIM: usize = 64;
const FF: usize = 1536;
const VOCAB: usize = 49152;

/// `rows` random rows of `ty` with small block scales (so values stay finite).
fn weight(ty: GgmlType, seed: &mut u64, cols: usize, rows: usize) -> Vec<u8> {
    let mut next = || {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*seed >> 56) as u8
    };
    let mut d: Vec<u8> = (0..ty.row_bytes(cols).unwrap() * rows)
        .map(|_| next())
        .collect();
    for b in d.chunks_exact_mut(ty.block_bytes()) {
        // d = 2^-8 (f16 0x1c00); Q4_1's m = -2^-8.
        b[..2].copy_from_slice(&[0x00, 0x1c]);
        if ty == GgmlType::Q4_1 {
            b[2..4].copy_from_slice(&[0x00, 0x9c]);
        }
    }
    d
}

fn view(d: &[u8], ty: GgmlType, cols: usize, rows: usize) -> TensorView<'_> {
    TensorView {
        data: RSlice::from_slice(d),
        ggml_type: ty as u32,
        cols: cols as u64,
        rows: rows as u64,
    }
}

fn main() {
    let layers: usize = std::env::args().nth(1).map_or(30, |s| s.parse().unwrap());
    let be = prima_backend_metal::backend::open(BackendConfig { threads: 0 }).unwrap();
    println!("{}", be.describe());
    let (kv_dim, t) = (N_HEAD_KV * HEAD_DIM, GgmlType::Q4_1);
    let mut seed = 1u64;
    let shapes = [
        (E, E),
        (E, kv_dim),
        (E, kv_dim),
        (E, E),
        (E, FF),
        (E, FF),
        (FF, E),
    ];
    let w: Vec<Vec<Vec<u8>>> = (0..layers)
        .map(|_| {
            shapes
                .iter()
                .map(|&(c, r)| weight(t, &mut seed, c, r))
                .collect()
        })
        .collect();
    let embd = weight(GgmlType::Q8_0, &mut seed, E, VOCAB);
    let norm: Vec<u8> = (0..E).flat_map(|_| 1.0f32.to_le_bytes()).collect();
    let norm = view(&norm, GgmlType::F32, E, 1);
    let new = |len: usize| Buf::whole(be.buf_create(len as u64).unwrap(), len);
    let (x, h, q, k, v, att, o) = (
        new(E),
        new(E),
        new(E),
        new(kv_dim),
        new(kv_dim),
        new(E),
        new(E),
    );
    let (g, u, logits) = (new(FF), new(FF), new(VOCAB));
    let spec = KvSpec {
        n_layers: layers as u32,
        n_ctx: 64,
        n_head_kv: N_HEAD_KV as u32,
        head_dim_k: HEAD_DIM as u32,
        head_dim_v: HEAD_DIM as u32,
    };
    let kv = be.kv_create(spec).unwrap();
    let rope = RopeParams {
        n_rot: HEAD_DIM as u32,
        freq_base: 10_000.0,
        freq_scale: 1.0,
        neox: false,
        freq_factors: None.into(),
        ext_factor: 0.0,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        n_ctx_orig: 4096,
    };
    let mut host = vec![0f32; VOCAB];
    let mut steady = Vec::new();
    for pos in 0..12u32 {
        let before = be.transfers();
        let t0 = Instant::now();
        let ids = [pos * 7 + 1];
        be.get_rows(
            view(&embd, GgmlType::Q8_0, E, VOCAB),
            RSlice::from_slice(&ids),
            x,
        )
        .unwrap();
        for (l, lw) in w.iter().enumerate() {
            let wv = |i: usize| view(&lw[i], t, shapes[i].0, shapes[i].1);
            be.rms_norm(x, norm, 1e-5, h).unwrap();
            be.matmul(wv(0), h, 1, q).unwrap();
            be.matmul(wv(1), h, 1, k).unwrap();
            be.matmul(wv(2), h, 1, v).unwrap();
            let p = [pos];
            be.rope(
                q,
                N_HEAD as u32,
                HEAD_DIM as u32,
                RSlice::from_slice(&p),
                rope,
            )
            .unwrap();
            be.rope(
                k,
                N_HEAD_KV as u32,
                HEAD_DIM as u32,
                RSlice::from_slice(&p),
                rope,
            )
            .unwrap();
            let params = AttentionParams {
                layer: l as u32,
                n_tokens: 1,
                start_pos: pos,
                n_head: N_HEAD as u32,
                n_head_kv: N_HEAD_KV as u32,
                head_dim_k: HEAD_DIM as u32,
                head_dim_v: HEAD_DIM as u32,
                scale: 0.125,
                sliding_window: 0,
                softcap: 0.0,
            };
            let span = [AttentionSpan {
                kv,
                n_tokens: 1,
                start_pos: pos,
            }];
            be.attention_spans(RSlice::from_slice(&span), q, k, v, params, att)
                .unwrap();
            be.matmul(wv(3), att, 1, o).unwrap();
            be.add(x, o).unwrap();
            be.rms_norm(x, norm, 1e-5, h).unwrap();
            be.matmul(wv(4), h, 1, g).unwrap();
            be.matmul(wv(5), h, 1, u).unwrap();
            be.swiglu(g, u).unwrap();
            be.matmul(wv(6), g, 1, o).unwrap();
            be.add(x, o).unwrap();
        }
        be.rms_norm(x, norm, 1e-5, h).unwrap();
        be.matmul(view(&embd, GgmlType::Q8_0, E, VOCAB), h, 1, logits)
            .unwrap();
        let recorded = t0.elapsed().as_secs_f64() * 1e3;
        be.download(logits, RSliceMut::from_mut_slice(&mut host))
            .unwrap();
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        if pos >= 2 {
            steady.push(ms);
        }
        println!(
            "token {pos}: {ms:.1} ms ({recorded:.1} ms recording); {:?}",
            be.transfers().since(before)
        );
    }
    let avg = steady.iter().sum::<f64>() / steady.len() as f64;
    println!(
        "{layers} layers + head: {avg:.1} ms/token, {:.1} tok/s",
        1e3 / avg
    );
}

//! Causal attention over a KV cache, with grouped-query heads, a sliding window and logit
//! soft-capping.
//!
//! For token `t` at position `p = start_pos + t` and head `h` (KV head `h / (n_head /
//! n_head_kv)`), the scores over positions `j ≤ p` (and `j > p − sliding_window` when a
//! window is set) are `s_j = scale · (q · k_j)`, with `q` rounded to f16 to match the F16
//! keys, then `c · tanh(s_j / c)` when soft-capping. The output is `Σ p_j · v_j` with
//! `p = softmax(s)` computed in two passes (max, then exp and a sum in f64) and each `p_j`
//! rounded to f16 before it weights the F16 values — the numerics of llama.cpp's
//! non-flash attention, which the golden fixtures record (measured: this takes F32 models
//! from 3e-3 to 5e-4 max |Δlogit| against llama.cpp). `q · k_j` is the F16 weight format's
//! `vec_dot` at the selected kernel level (16 f32 lanes, see `formats::float`), so
//! attention shares the matmul's numerics and speed. Heads × tokens run on the SpinPool; each
//! worker thread keeps its score buffer between calls, so steady-state calls allocate
//! nothing.

use super::kv_cache::{lock, KvCache, KvStore};
use super::matmul::SharedOut;
use super::OpResult;
use crate::formats::{dispatch, put_f16, AxpyF16Fn, VecDotFn};
use crate::pool::{sized, ChunkRunner, Scratch};
use half::f16;
use prima_core::gguf::GgmlType;
use prima_core::plugin::backend_abi::AttentionParams;
use std::cell::RefCell;

thread_local! {
    /// Softmax scores of one query head, reused by each pool thread across calls.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

#[allow(clippy::too_many_arguments)]
pub fn attention(
    pool: &impl ChunkRunner,
    scratch: &mut Scratch,
    store: &KvStore,
    kv: u64,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    p: &AttentionParams,
    out: &mut [f32],
) -> OpResult<()> {
    const OP: &str = "attention";
    let cache = store.get(OP, kv)?;
    let mut cache = lock(&cache);
    let spec = cache.spec;
    let (n_tokens, n_head, n_head_kv) =
        (p.n_tokens as usize, p.n_head as usize, p.n_head_kv as usize);
    let (dk, dv) = (p.head_dim_k as usize, p.head_dim_v as usize);
    let (layer, start) = (p.layer as usize, p.start_pos as usize);
    p.check(&spec, MAX_HEAD_DIM, [q.len(), k.len(), v.len(), out.len()])?;
    if start > cache.len(layer) {
        return Err(format!(
            "{OP}: start_pos {start} leaves a gap: layer {layer} holds {} positions",
            cache.len(layer)
        ));
    }
    if n_tokens == 0 {
        return Ok(());
    }
    cache.write(layer, start, n_tokens, k, v);

    let queries = sized(&mut scratch.queries, 2 * q.len());
    for (i, s) in q.iter().enumerate() {
        put_f16(queries, 2 * i, *s);
    }
    let queries: &[u8] = queries;
    let dot = dispatch::kernels(GgmlType::F16)
        .ok_or_else(|| format!("{OP}: no F16 kernels"))?
        .vec_dot;
    let axpy = dispatch::axpy_f16();
    let cache: &KvCache = &cache;
    if dv == 0 {
        return Ok(());
    }
    let group = n_head / n_head_kv;
    // (token, head) items, a few chunks of them per thread.
    let n_items = n_tokens * n_head;
    let per_chunk = n_items.div_ceil(pool.threads() * 4).max(1);
    let dst = SharedOut(out.as_mut_ptr());
    pool.run(n_items.div_ceil(per_chunk), &|c| {
        let first = c * per_chunk;
        for idx in first..(first + per_chunk).min(n_items) {
            // SAFETY: item `idx` owns `out[idx·dv .. (idx+1)·dv]`, disjoint across items, and
            // `out` (checked to be n_items·dv long) outlives `run`, which returns when all
            // chunks are done.
            let o = unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(idx * dv), dv) };
            let (t, h) = (idx / n_head, idx % n_head);
            let qh = &queries[2 * idx * dk..2 * (idx + 1) * dk];
            attend_one(cache, layer, start + t, h / group, qh, (dot, axpy), p, o);
        }
    });
    Ok(())
}

/// Longest head the attention op accepts (a bound kept from when rows were widened on the
/// stack; the models in use have at most 256).
pub const MAX_HEAD_DIM: usize = 512;

/// An F16 row as the little-endian bytes the format kernels read.
fn f16_bytes(bits: &[u16]) -> &[u8] {
    const {
        assert!(
            cfg!(target_endian = "little"),
            "F16 rows are read as little-endian bytes"
        )
    };
    // SAFETY: `u16` has no padding and `u8` no alignment requirement; the byte slice covers
    // exactly the memory of `bits` and borrows it for the same lifetime.
    unsafe { std::slice::from_raw_parts(bits.as_ptr() as *const u8, 2 * bits.len()) }
}

/// One query head (`q`: f16 bytes) at position `pos` against KV head `kv_head`, with `dot`
/// the F16 `vec_dot` and `axpy` the F16 `axpy`; writes `o`.
#[allow(clippy::too_many_arguments)]
fn attend_one(
    cache: &KvCache,
    layer: usize,
    pos: usize,
    kv_head: usize,
    q: &[u8],
    (dot, axpy): (VecDotFn, AxpyF16Fn),
    p: &AttentionParams,
    o: &mut [f32],
) {
    let window = p.sliding_window as usize;
    let first = if window > 0 {
        (pos + 1).saturating_sub(window)
    } else {
        0
    };
    SCORES.with(|cell| {
        let mut buf = cell.borrow_mut();
        let scores = sized(&mut buf, pos + 1 - first);
        let mut max = f32::NEG_INFINITY;
        for (s, j) in scores.iter_mut().zip(first..=pos) {
            let key = cache.key(layer, j, kv_head);
            *s = p.scale * dot(key.len(), f16_bytes(key), q);
            if p.softcap != 0.0 {
                *s = p.softcap * (*s / p.softcap).tanh();
            }
            max = max.max(*s);
        }
        let mut total = 0.0f64;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            total += *s as f64;
        }
        let norm = if total > 0.0 {
            (1.0 / total) as f32
        } else {
            0.0
        };
        o.fill(0.0);
        for (s, j) in scores.iter().zip(first..=pos) {
            let weight = f16::from_f32(s * norm).to_f32();
            axpy(o, weight, f16_bytes(cache.value(layer, j, kv_head)));
        }
    });
}

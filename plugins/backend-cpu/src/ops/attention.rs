//! Causal attention over a KV cache, with grouped-query heads, a sliding window, logit
//! soft-capping and attention sinks.
//!
//! For token `t` at position `p = start_pos + t` and head `h` (KV head `h / (n_head /
//! n_head_kv)`), the scores over positions `j ≤ p` (and `j > p − sliding_window` when a
//! window is set) are `s_j = scale · (q · k_j)`, with `q` rounded to f16 to match the F16
//! keys, then `c · tanh(s_j / c)` when soft-capping. The output is `Σ p_j · v_j` with
//! `p = softmax(s)` computed in two passes (max, then `e^(s_j − max)` and their sum in f64,
//! by `activation::softmax` in vector lanes) and each `p_j` rounded to f16 before it weights
//! the F16 values — the numerics of llama.cpp's non-flash attention, which the golden
//! fixtures record (measured: this takes F32 models from 3e-3 to 5e-4 max |Δlogit| against
//! llama.cpp). `q · k_j` is the F16 weight format's `vec_dot` at the selected kernel level
//! (16 f32 lanes, see `formats::float`), so attention shares the matmul's numerics and
//! speed. The (row, KV head) items of every span run on the SpinPool in one round; each
//! worker thread keeps its score buffer between calls, so the work per position and head
//! allocates nothing (a call allocates only its short per-span lists: the spans' caches,
//! locks and first rows).

use super::activation;
use super::kv_cache::{lock, KvCache, KvStore};
use super::matmul::SharedOut;
use super::OpResult;
use crate::formats::{dispatch, AttentionF16};
use crate::pool::{sized, ChunkRunner, Scratch};
use half::{f16, slice::HalfFloatSliceExt};
use prima_abi::backend::{AttentionParams, AttentionSpan};
use prima_abi::GgmlType;
use std::cell::RefCell;

thread_local! {
    /// Softmax scores of one query group, and one head's probabilities as f16, reused by
    /// each pool thread across calls.
    static SCORES: RefCell<(Vec<f32>, Vec<f16>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Causal attention for several requests' rows at once (`Backend::attention_spans`): every
/// span's keys and values stored, then all their (token, KV head) items in one pool round,
/// so a decode step of four requests is one round a layer, not four of three items each
/// (SmolLM2: three KV heads on two threads left one idle for a third of each round).
///
/// `sinks`, when given, holds one logit per query head (`n_head` long): gpt-oss's attention
/// sinks, which join each head's softmax denominator ([`activation::softmax_sink`]).
#[allow(clippy::too_many_arguments)]
pub fn attention_spans(
    pool: &impl ChunkRunner,
    scratch: &mut Scratch,
    store: &KvStore,
    spans: &[AttentionSpan],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    sinks: Option<&[f32]>,
    p: &AttentionParams,
    out: &mut [f32],
) -> OpResult<()> {
    const OP: &str = "attention";
    let (n_head, n_head_kv) = (p.n_head as usize, p.n_head_kv as usize);
    let (dk, dv) = (p.head_dim_k as usize, p.head_dim_v as usize);
    let layer = p.layer as usize;
    let (k_row, v_row) = (n_head_kv * dk, n_head_kv * dv);
    let n_rows = p.check_span_lengths(spans, [q.len(), k.len(), v.len(), out.len()])?;
    if let Some(sinks) = sinks {
        if sinks.len() != n_head {
            return Err(format!(
                "{OP}: {} sinks for {n_head} query heads (one per head)",
                sinks.len()
            ));
        }
    }
    // Every span's cache locked for the call, in handle order (a call holding several locks
    // never waits on one holding them in another order); that order also shows a handle
    // given twice.
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&i| spans[i].kv);
    if let Some(w) = order.windows(2).find(|w| spans[w[0]].kv == spans[w[1]].kv) {
        let (a, b) = (w[0].min(w[1]), w[0].max(w[1]));
        return Err(format!(
            "{OP}: spans {a} and {b} share KV cache handle {}",
            spans[a].kv
        ));
    }
    let handles: Vec<_> = spans
        .iter()
        .map(|s| store.get(OP, s.kv))
        .collect::<OpResult<_>>()?;
    let mut guards: Vec<_> = (0..spans.len()).map(|_| None).collect();
    for &i in &order {
        guards[i] = Some(lock(&handles[i]));
    }
    let mut caches: Vec<_> = guards.into_iter().flatten().collect();
    // Each span checked against its cache before any is written; its first row.
    let mut firsts = Vec::with_capacity(spans.len());
    let mut first_row = 0;
    for (s, cache) in spans.iter().zip(&caches) {
        let (n_tokens, start) = (s.n_tokens as usize, s.start_pos as usize);
        let ps = AttentionParams {
            n_tokens: s.n_tokens,
            start_pos: s.start_pos,
            ..*p
        };
        let lens = [
            n_tokens * n_head * dk,
            n_tokens * k_row,
            n_tokens * v_row,
            n_tokens * n_head * dv,
        ];
        ps.check(&cache.spec, MAX_HEAD_DIM, lens)?;
        if start > cache.len(layer) {
            return Err(format!(
                "{OP}: start_pos {start} leaves a gap: layer {layer} holds {} positions",
                cache.len(layer)
            ));
        }
        firsts.push(first_row);
        first_row += n_tokens;
    }
    for ((s, cache), &first) in spans.iter().zip(&mut caches).zip(&firsts) {
        let n = s.n_tokens as usize;
        if n > 0 {
            let (ks, vs) = (
                &k[first * k_row..(first + n) * k_row],
                &v[first * v_row..(first + n) * v_row],
            );
            cache.write(layer, s.start_pos as usize, n, ks, vs);
        }
    }
    if n_rows == 0 || dv == 0 {
        return Ok(());
    }

    let queries = sized(&mut scratch.queries, 2 * q.len());
    // The level's F16 activation quantizer: `put_f16`'s bytes, vectorised.
    let to_f16 = dispatch::kernels(GgmlType::F16)
        .ok_or_else(|| format!("{OP}: no F16 kernels"))?
        .quantize_activation;
    to_f16(q, queries);
    let queries: &[u8] = queries;
    let products = dispatch::attention_f16();
    let caches: Vec<&KvCache> = caches.iter().map(|c| &**c).collect();
    let group = n_head / n_head_kv;
    // (row, KV head) items over every span, each with the query heads that share that KV
    // head (one pass over its keys and values for all of them), a few chunks of items per
    // thread. A row's items cost in proportion to the positions it attends to, so within a
    // span the chunks are claimed last row first: the costliest go first and the cheapest
    // fill the gaps at the end (claimed first row first, the last chunk, the costliest,
    // left one core idle: a third of the main thread's waiting in pp128 on 2 threads, F16
    // SmolLM2).
    let n_items = n_rows * n_head_kv;
    let per_chunk = n_items.div_ceil(pool.threads() * 8).max(1);
    let n_chunks = n_items.div_ceil(per_chunk);
    let dst = SharedOut(out.as_mut_ptr());
    pool.run(n_chunks, &|c| {
        let first = (n_chunks - 1 - c) * per_chunk;
        for idx in first..(first + per_chunk).min(n_items) {
            let (row, g) = (idx / n_head_kv, idx % n_head_kv);
            // The span holding `row`: the last whose first row is at or before it.
            let span = firsts.partition_point(|&f| f <= row) - 1;
            let pos = spans[span].start_pos as usize + (row - firsts[span]);
            let h0 = row * n_head + g * group;
            // SAFETY: item `idx` owns `out[h0·dv .. (h0 + group)·dv]` (its query heads' rows),
            // disjoint across items, and `out` (checked to be n_rows·n_head·dv long)
            // outlives `run`, which returns when all chunks are done.
            let o = unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(h0 * dv), group * dv) };
            let qh = &queries[2 * h0 * dk..2 * (h0 + group) * dk];
            let group_sinks = sinks.map(|s| &s[g * group..(g + 1) * group]);
            attend_group(
                caches[span],
                layer,
                pos,
                g,
                qh,
                group,
                group_sinks,
                products,
                p,
                o,
            );
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

/// The `group` query heads (`q`: their f16 bytes, head after head) at position `pos` that
/// share KV head `kv_head`; writes their outputs, head after head, to `o`. `sinks`: those
/// heads' sink logits, when the model has them.
#[allow(clippy::too_many_arguments)]
fn attend_group(
    cache: &KvCache,
    layer: usize,
    pos: usize,
    kv_head: usize,
    q: &[u8],
    group: usize,
    sinks: Option<&[f32]>,
    products: AttentionF16,
    p: &AttentionParams,
    o: &mut [f32],
) {
    let window = p.sliding_window as usize;
    let first = if window > 0 {
        (pos + 1).saturating_sub(window)
    } else {
        0
    };
    let n_keys = pos + 1 - first;
    let (dk, dv) = (p.head_dim_k as usize, p.head_dim_v as usize);
    SCORES.with(|cell| {
        let (buf, rounded) = &mut *cell.borrow_mut();
        let scores = sized(buf, group * n_keys);
        let rounded = sized(rounded, n_keys);
        let keys = f16_bytes(cache.key_rows(layer, first, pos, kv_head));
        let k_stride = 2 * cache.row_stride_k();
        (products.dots)(dk, keys, k_stride, n_keys, q, group, scores);
        for (h, head) in scores.chunks_exact_mut(n_keys).enumerate() {
            let sink = sinks.map(|s| s[h]);
            if p.softcap != 0.0 {
                for s in head.iter_mut() {
                    *s = p.softcap * (*s * p.scale / p.softcap).tanh();
                }
                activation::softmax_sink(head, 1.0, sink);
            } else {
                activation::softmax_sink(head, p.scale, sink);
            }
            // Rounded to f16 and back by `half`'s slice conversions: `f16::from_f32`'s
            // bits, vectorised where the CPU has F16C.
            rounded.convert_from_f32_slice(head);
            rounded.convert_to_f32_slice(head);
        }
        o.fill(0.0);
        let values = f16_bytes(cache.value_rows(layer, first, pos, kv_head));
        let v_stride = 2 * cache.row_stride_v();
        (products.axpys)(dv, values, v_stride, n_keys, scores, group, o);
    });
}

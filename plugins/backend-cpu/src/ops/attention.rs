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
//! attention shares the matmul's numerics and speed; at AVX-512 a dot of 16 lanes in one
//! register and the `axpy` are inlined here instead (same order, same bits: a decode step's
//! head is 64 wide, where two calls per position cost more than their arithmetic). Heads ×
//! tokens run on the SpinPool; each worker thread keeps its score buffer between calls, so
//! steady-state calls allocate nothing.

use super::kv_cache::{lock, KvCache, KvStore};
use super::matmul::SharedOut;
use super::OpResult;
use crate::formats::dispatch::{self, KernelLevel};
use crate::formats::{AxpyF16Fn, VecDotFn};
use crate::pool::{sized, ChunkRunner, Scratch};
use half::f16;
use half::slice::HalfFloatSliceExt;
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

    let queries = sized(&mut scratch.queries, q.len());
    queries.convert_from_f32_slice(q);
    let queries = f16_bytes(queries.reinterpret_cast());
    let dot = dispatch::kernels(GgmlType::F16)
        .ok_or_else(|| format!("{OP}: no F16 kernels"))?
        .vec_dot;
    let axpy = dispatch::axpy_f16();
    let level = dispatch::selection().level;
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
        SCORES.with(|cell| {
            let scores = &mut cell.borrow_mut();
            for idx in first..(first + per_chunk).min(n_items) {
                // SAFETY: item `idx` owns `out[idx·dv .. (idx+1)·dv]`, disjoint across items,
                // and `out` (checked to be n_items·dv long) outlives `run`, which returns when
                // all chunks are done.
                let o = unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(idx * dv), dv) };
                let (t, h) = (idx / n_head, idx % n_head);
                let qh = &queries[2 * idx * dk..2 * (idx + 1) * dk];
                let at = (cache, layer, start + t, h / group);
                match level {
                    #[cfg(target_arch = "x86_64")]
                    KernelLevel::Avx512 if level.is_available() => {
                        // SAFETY: the level is available: this CPU has AVX-512F, AVX2, F16C.
                        unsafe { x86::attend_one_avx512(at, scores, qh, p, o) }
                    }
                    _ => attend_one(at, scores, qh, (dot, axpy), p, o),
                }
            }
        })
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

/// Where one query head attends: the cache, the layer, the query's position and its KV
/// head. The softmax scores go to a buffer the caller keeps (a pool thread's, reused).
type At<'a> = (&'a KvCache, usize, usize, usize);

/// One query head (`q`: f16 bytes) at its position against its KV head, with `dot` the F16
/// `vec_dot` and `axpy` the F16 `axpy`; writes `o`.
fn attend_one(
    at: At<'_>,
    scores: &mut Vec<f32>,
    q: &[u8],
    (dot, axpy): (VecDotFn, AxpyF16Fn),
    p: &AttentionParams,
    o: &mut [f32],
) {
    attend_with(
        at,
        scores,
        |key| dot(key.len(), f16_bytes(key), q),
        |o, weights, value| {
            o.fill(0.0);
            for (j, &w) in weights.iter().enumerate() {
                axpy(o, w, f16_bytes(value(j)));
            }
        },
        p,
        o,
    )
}

/// The one attention loop of every level: `dot(key)` is `q · key`, and `mix(o, weights,
/// value)` sets `o = Σ_j weights[j] · value(j)`, each term a mul, then an add, from 0.0 in
/// position order (the F16 `axpy`'s order).
#[inline(always)]
fn attend_with<'c>(
    (cache, layer, pos, kv_head): At<'c>,
    buf: &mut Vec<f32>,
    dot: impl Fn(&[u16]) -> f32,
    mix: impl Fn(&mut [f32], &[f32], &dyn Fn(usize) -> &'c [u16]),
    p: &AttentionParams,
    o: &mut [f32],
) {
    let window = p.sliding_window as usize;
    let first = if window > 0 {
        (pos + 1).saturating_sub(window)
    } else {
        0
    };
    let scores = sized(buf, pos + 1 - first);
    let mut max = f32::NEG_INFINITY;
    for (s, j) in scores.iter_mut().zip(first..=pos) {
        *s = p.scale * dot(cache.key(layer, j, kv_head));
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
    for s in scores.iter_mut() {
        *s = f16::from_f32(*s * norm).to_f32();
    }
    mix(o, scores, &|j| cache.value(layer, first + j, kv_head));
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{attend_with, At};
    use crate::formats::float::DOT_LANES;
    use core::arch::x86_64::*;
    use half::f16;
    use prima_core::plugin::backend_abi::AttentionParams;

    /// [`super::attend_one`] with the F16 dot and `axpy` inlined at AVX-512.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub(super) unsafe fn attend_one_avx512(
        at: At<'_>,
        scores: &mut Vec<f32>,
        q: &[u8],
        p: &AttentionParams,
        o: &mut [f32],
    ) {
        attend_with(
            at,
            scores,
            |key| {
                // SAFETY: this function's features are the callee's.
                unsafe { dot_f16(key, q) }
            },
            |o, weights, value| {
                // SAFETY: as above.
                unsafe { mix_f16(o, weights, value) }
            },
            p,
            o,
        )
    }

    /// `Σ key_i · q_i` as `formats::float::vec_dot_f16` sums it: element `i` in lane
    /// `i % 16` (a mul, then an add), the lanes folded by halving, then the tail in order.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    #[inline]
    unsafe fn dot_f16(key: &[u16], q: &[u8]) -> f32 {
        let n = key.len().min(q.len() / 2);
        let full = n / DOT_LANES * DOT_LANES;
        let (k, qp) = (key.as_ptr(), q.as_ptr() as *const u16);
        let load = |p: *const u16, i: usize| {
            _mm512_cvtph_ps(_mm256_loadu_si256(p.add(i) as *const __m256i))
        };
        let mut acc = _mm512_setzero_ps();
        for i in (0..full).step_by(DOT_LANES) {
            acc = _mm512_add_ps(acc, _mm512_mul_ps(load(k, i), load(qp, i)));
        }
        // l + l+8, then + l+4, + l+2, + l+1.
        let h8 = _mm256_add_ps(
            _mm512_castps512_ps256(acc),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc))),
        );
        let h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps::<1>(h8));
        let h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
        let h1 = _mm_add_ss(h2, _mm_movehdup_ps(h2));
        let mut sum = _mm_cvtss_f32(h1);
        for i in full..n {
            let at = |p: *const u16| f16::from_bits(p.add(i).read_unaligned()).to_f32();
            sum += at(k) * at(qp);
        }
        sum
    }

    /// `o = Σ_j weights[j] · value(j)`, each term a mul, then an add, from 0.0 in position
    /// order, as `formats::float::axpy_f16` sums it. Heads of 16 · C, C a power of two up to
    /// 16, stay in C registers over all the positions; others go through memory.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    #[inline]
    unsafe fn mix_f16<'c>(o: &mut [f32], weights: &[f32], value: &dyn Fn(usize) -> &'c [u16]) {
        match o.len() {
            16 => mix_in_registers::<1>(o, weights, value),
            32 => mix_in_registers::<2>(o, weights, value),
            64 => mix_in_registers::<4>(o, weights, value),
            128 => mix_in_registers::<8>(o, weights, value),
            256 => mix_in_registers::<16>(o, weights, value),
            _ => {
                o.fill(0.0);
                for (j, &w) in weights.iter().enumerate() {
                    axpy_f16(o, w, value(j));
                }
            }
        }
    }

    /// [`mix_f16`] for `o` of `16 · C` lanes.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    #[inline]
    unsafe fn mix_in_registers<'c, const C: usize>(
        o: &mut [f32],
        weights: &[f32],
        value: &dyn Fn(usize) -> &'c [u16],
    ) {
        let mut acc = [_mm512_setzero_ps(); C];
        for (j, &w) in weights.iter().enumerate() {
            let v = value(j);
            assert!(v.len() >= 16 * C, "attention: short value row");
            let wv = _mm512_set1_ps(w);
            for (c, acc) in acc.iter_mut().enumerate() {
                let x =
                    _mm512_cvtph_ps(_mm256_loadu_si256(v.as_ptr().add(16 * c) as *const __m256i));
                *acc = _mm512_add_ps(*acc, _mm512_mul_ps(wv, x));
            }
        }
        for (c, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(o[16 * c..16 * (c + 1)].as_mut_ptr(), *acc);
        }
    }

    /// `o[i] += w · value[i]` (a mul, then an add), as `formats::float::axpy_f16`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    #[inline]
    unsafe fn axpy_f16(o: &mut [f32], w: f32, value: &[u16]) {
        let n = o.len().min(value.len());
        let full = n / 16 * 16;
        let (a, v) = (o.as_mut_ptr(), value.as_ptr());
        let wv = _mm512_set1_ps(w);
        for i in (0..full).step_by(16) {
            let x = _mm512_cvtph_ps(_mm256_loadu_si256(v.add(i) as *const __m256i));
            _mm512_storeu_ps(
                a.add(i),
                _mm512_add_ps(_mm512_loadu_ps(a.add(i)), _mm512_mul_ps(wv, x)),
            );
        }
        for i in full..n {
            *a.add(i) += w * f16::from_bits(*v.add(i)).to_f32();
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::formats::float;
    use prima_core::plugin::backend_abi::KvSpec;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The inlined AVX-512 attention returns the kernel tables' bits (the scalar oracle's
    /// and AVX2's), over heads with and without 16-lane tails, windows and soft-capping.
    #[test]
    fn avx512_attention_matches_the_kernel_tables() {
        if !KernelLevel::Avx512.is_available() {
            return;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let tables: Vec<(VecDotFn, AxpyF16Fn)> = [KernelLevel::Scalar, KernelLevel::Avx2]
            .into_iter()
            .filter(|l| l.is_available())
            .map(|l| {
                let dot = l.kernels(GgmlType::F16).unwrap().vec_dot;
                (dot, l.axpy_f16().unwrap_or(float::axpy_f16))
            })
            .collect();
        for (dk, dv) in [
            (64u32, 64u32),
            (16, 8),
            (40, 24),
            (256, 256),
            (7, 9),
            (32, 16),
            (24, 128),
        ] {
            let (n_ctx, n_head_kv) = (40, 2);
            let spec = KvSpec {
                n_layers: 1,
                n_ctx,
                n_head_kv,
                head_dim_k: dk,
                head_dim_v: dv,
            };
            let mut cache = KvCache::new(spec).unwrap();
            let mut random = |len: u32, scale: f32| -> Vec<f32> {
                (0..len * n_ctx * n_head_kv)
                    .map(|_| rng.gen_range(-scale..scale))
                    .collect()
            };
            let (k, v) = (random(dk, 4.0), random(dv, 4.0));
            cache.write(0, 0, n_ctx as usize, &k, &v);
            let q: Vec<u8> = random(dk, 4.0)[..dk as usize]
                .iter()
                .flat_map(|x| f16::from_f32(*x).to_le_bytes())
                .collect();
            for (sliding_window, softcap) in [(0u32, 0.0f32), (5, 0.0), (0, 30.0)] {
                let p = AttentionParams {
                    layer: 0,
                    n_tokens: 1,
                    start_pos: 0,
                    n_head: 4,
                    n_head_kv,
                    head_dim_k: dk,
                    head_dim_v: dv,
                    scale: 1.0 / (dk as f32).sqrt(),
                    sliding_window,
                    softcap,
                };
                for pos in [0, 1, 17, 39] {
                    for kv_head in 0..n_head_kv as usize {
                        let at = (&cache, 0, pos, kv_head);
                        let mut got = vec![f32::NAN; dv as usize];
                        // SAFETY: AVX-512 is available (checked above).
                        unsafe { x86::attend_one_avx512(at, &mut vec![], &q, &p, &mut got) };
                        for &table in &tables {
                            let mut want = vec![f32::NAN; dv as usize];
                            attend_one(at, &mut vec![], &q, table, &p, &mut want);
                            assert_eq!(
                                got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                                "dk {dk} dv {dv} window {sliding_window} softcap {softcap} \
                                 pos {pos} head {kv_head}"
                            );
                        }
                    }
                }
            }
        }
    }
}

//! KV-cache bookkeeping for the GPU backends: handles, the buffers each layer's K and V
//! live in (the plugin's own buffer type), and the positions each layer holds — what the
//! backend ABI's `kv_create`, `kv_drop`, `kv_truncate` and `attention_spans` check and
//! keep.

use std::collections::HashMap;
use std::ops::Range;

use prima_abi::backend::{AttentionParams, AttentionSpan, KvSpec};

use crate::checks::{mul, OpResult};

/// One F16 KV cache: per layer, K and V as `[n_ctx][n_head_kv][head_dim]`.
pub struct KvCache<B> {
    pub spec: KvSpec,
    pub k: Vec<B>,
    pub v: Vec<B>,
    /// Positions held per layer.
    pub len: Vec<usize>,
}

impl<B> KvCache<B> {
    /// Layer `layer` now holds positions up to `end` (after an attention call stored them).
    pub fn hold(&mut self, layer: usize, end: usize) {
        self.len[layer] = self.len[layer].max(end);
    }
}

/// One span of a batched attention call, checked ([`KvCaches::plan_spans`]): its cache,
/// its first row in the call's operands, and the positions it stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanPlan {
    pub kv: u64,
    pub row0: usize,
    pub n_tokens: usize,
    pub positions: Range<usize>,
}

/// The caches a backend holds, by the handle `kv_create` returned.
pub struct KvCaches<B> {
    caches: HashMap<u64, KvCache<B>>,
    next: u64,
}

impl<B> Default for KvCaches<B> {
    fn default() -> Self {
        KvCaches {
            caches: HashMap::new(),
            next: 1,
        }
    }
}

impl<B> KvCaches<B> {
    /// A new cache for `spec`; `alloc(elements)` allocates one layer's K or V buffer of
    /// `n_ctx × n_head_kv × head_dim` f16 elements (its errors are returned as they are).
    pub fn create(
        &mut self,
        spec: KvSpec,
        mut alloc: impl FnMut(usize) -> OpResult<B>,
    ) -> OpResult<u64> {
        const OP: &str = "kv_create";
        let elements = |d: u32| -> OpResult<usize> {
            mul(
                OP,
                spec.n_ctx as usize,
                mul(OP, spec.n_head_kv as usize, d as usize)?,
            )
        };
        let (nk, nv) = (elements(spec.head_dim_k)?, elements(spec.head_dim_v)?);
        let mut cache = KvCache {
            spec,
            k: Vec::new(),
            v: Vec::new(),
            len: vec![0; spec.n_layers as usize],
        };
        for _ in 0..spec.n_layers {
            cache.k.push(alloc(nk)?);
            cache.v.push(alloc(nv)?);
        }
        let h = self.next;
        self.next += 1;
        self.caches.insert(h, cache);
        Ok(h)
    }

    pub fn drop(&mut self, kv: u64) {
        self.caches.remove(&kv);
    }

    /// Every layer of `kv` keeps at most its first `n_pos` positions.
    pub fn truncate(&mut self, kv: u64, n_pos: u32) -> OpResult<()> {
        let cache = self
            .caches
            .get_mut(&kv)
            .ok_or_else(|| format!("kv_truncate: unknown KV cache {kv}"))?;
        for l in &mut cache.len {
            *l = (*l).min(n_pos as usize);
        }
        Ok(())
    }

    /// Checks an attention call against cache `kv`: its parameters against the cache's
    /// spec and the `[q, k, v, out]` lengths, heads at most `max_head_dim`, and no gap
    /// before `start_pos`. The positions it stores, or `None` for no tokens.
    pub fn check_attention(
        &self,
        kv: u64,
        p: &AttentionParams,
        max_head_dim: usize,
        lens: [usize; 4],
    ) -> OpResult<Option<Range<usize>>> {
        const OP: &str = "attention";
        let cache = self
            .caches
            .get(&kv)
            .ok_or_else(|| format!("{OP}: unknown KV cache {kv}"))?;
        p.check(&cache.spec, max_head_dim, lens)?;
        let (layer, start) = (p.layer as usize, p.start_pos as usize);
        let held = cache.len[layer];
        if start > held {
            return Err(format!(
                "{OP}: start_pos {start} leaves a gap: layer {layer} holds {held} positions"
            ));
        }
        Ok((p.n_tokens > 0).then(|| start..start + p.n_tokens as usize))
    }

    /// Checks a batched attention call ([`prima_abi::backend::Backend::attention_spans`]):
    /// the operands' lengths against all the spans' rows, then each span against its cache
    /// as [`Self::check_attention`] does, a later span of the same cache seeing the
    /// positions an earlier one stores. Every span's plan, in order, spans of no tokens
    /// left out; nothing is recorded as held (the caller does that once it has queued the
    /// work, [`KvCache::hold`]).
    pub fn plan_spans(
        &self,
        spans: &[AttentionSpan],
        p: &AttentionParams,
        max_head_dim: usize,
        lens: [usize; 4],
    ) -> OpResult<Vec<SpanPlan>> {
        p.check_span_lengths(spans, lens)?;
        let (q_row, kv_row_k, kv_row_v) = (
            p.n_head as usize * p.head_dim_k as usize,
            p.n_head_kv as usize * p.head_dim_k as usize,
            p.n_head_kv as usize * p.head_dim_v as usize,
        );
        let o_row = p.n_head as usize * p.head_dim_v as usize;
        let mut held: HashMap<u64, usize> = HashMap::new();
        let mut plans = Vec::with_capacity(spans.len());
        let mut row0 = 0usize;
        for s in spans {
            let n = s.n_tokens as usize;
            let sp = AttentionParams {
                n_tokens: s.n_tokens,
                start_pos: s.start_pos,
                ..*p
            };
            let lens = [n * q_row, n * kv_row_k, n * kv_row_v, n * o_row];
            let cache = self
                .caches
                .get(&s.kv)
                .ok_or_else(|| format!("attention: unknown KV cache {}", s.kv))?;
            sp.check(&cache.spec, max_head_dim, lens)?;
            let layer = p.layer as usize;
            let have = *held.get(&s.kv).unwrap_or(&cache.len[layer]);
            let start = s.start_pos as usize;
            if start > have {
                return Err(format!(
                    "attention: start_pos {start} leaves a gap: layer {layer} of KV cache {} holds {have} positions",
                    s.kv
                ));
            }
            if n > 0 {
                held.insert(s.kv, have.max(start + n));
                plans.push(SpanPlan {
                    kv: s.kv,
                    row0,
                    n_tokens: n,
                    positions: start..start + n,
                });
            }
            row0 += n;
        }
        Ok(plans)
    }

    /// Cache `kv`, which [`Self::check_attention`] found.
    pub fn get_mut(&mut self, kv: u64) -> OpResult<&mut KvCache<B>> {
        self.caches
            .get_mut(&kv)
            .ok_or_else(|| format!("unknown KV cache {kv}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> KvSpec {
        KvSpec {
            n_layers: 2,
            n_ctx: 8,
            n_head_kv: 2,
            head_dim_k: 4,
            head_dim_v: 6,
        }
    }

    fn params(start_pos: u32, n_tokens: u32) -> AttentionParams {
        AttentionParams {
            layer: 1,
            n_tokens,
            start_pos,
            n_head: 2,
            n_head_kv: 2,
            head_dim_k: 4,
            head_dim_v: 6,
            scale: 0.5,
            sliding_window: 0,
            softcap: 0.0,
        }
    }

    #[test]
    fn caches_keep_positions_and_refuse_gaps() {
        let mut kv = KvCaches::<Vec<u16>>::default();
        let h = kv.create(spec(), |n| Ok(vec![0; n])).unwrap();
        let c = kv.get_mut(h).unwrap();
        assert_eq!((c.k[0].len(), c.v[1].len()), (8 * 2 * 4, 8 * 2 * 6));
        let lens = |n: usize| [n * 8, n * 8, n * 12, n * 12];
        assert_eq!(
            kv.check_attention(h, &params(0, 3), 256, lens(3)).unwrap(),
            Some(0..3)
        );
        kv.get_mut(h).unwrap().hold(1, 3);
        let e = kv
            .check_attention(h, &params(4, 1), 256, lens(1))
            .unwrap_err();
        assert!(e.contains("leaves a gap: layer 1 holds 3"), "{e}");
        kv.truncate(h, 2).unwrap();
        assert!(kv.check_attention(h, &params(3, 1), 256, lens(1)).is_err());
        assert_eq!(
            kv.check_attention(h, &params(2, 0), 256, lens(0)).unwrap(),
            None
        );
        // Two spans: one of this cache (2 rows at 2), one of a fresh cache (3 rows at 0).
        let h2 = kv.create(spec(), |n| Ok(vec![0; n])).unwrap();
        let spans = [
            AttentionSpan {
                kv: h,
                n_tokens: 2,
                start_pos: 2,
            },
            AttentionSpan {
                kv: h2,
                n_tokens: 3,
                start_pos: 0,
            },
        ];
        let plans = kv.plan_spans(&spans, &params(0, 0), 256, lens(5)).unwrap();
        assert_eq!(plans[1].row0, 2);
        assert_eq!(plans[1].positions, 0..3);
        let gap = [AttentionSpan {
            kv: h2,
            n_tokens: 1,
            start_pos: 1,
        }];
        let e = kv
            .plan_spans(&gap, &params(0, 0), 256, lens(1))
            .unwrap_err();
        assert!(e.contains("leaves a gap"), "{e}");
        assert!(kv.plan_spans(&spans, &params(0, 0), 256, lens(4)).is_err());
        kv.drop(h);
        assert!(kv.truncate(h, 0).unwrap_err().contains("unknown KV cache"));
        let e = kv
            .create(spec(), |_| Err("out of memory".into()))
            .unwrap_err();
        assert_eq!(e, "out of memory");
    }
}

//! KV-cache bookkeeping for the GPU backends: handles, the buffers each layer's K and V
//! live in (the plugin's own buffer type), and the positions each layer holds — what the
//! backend ABI's `kv_create`, `kv_drop`, `kv_truncate` and `attention` check and keep.

use std::collections::HashMap;
use std::ops::Range;

use prima_abi::backend::{AttentionParams, KvSpec};

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
        kv.drop(h);
        assert!(kv.truncate(h, 0).unwrap_err().contains("unknown KV cache"));
        let e = kv
            .create(spec(), |_| Err("out of memory".into()))
            .unwrap_err();
        assert_eq!(e, "out of memory");
    }
}

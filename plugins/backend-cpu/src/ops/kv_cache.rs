//! The backend-owned KV caches, stored as F16 (llama.cpp's default) and addressed by `u64`
//! handles.
//!
//! Each layer remembers how many positions it holds, so a device that runs only some layers
//! (a prima.cpp ring window) keeps consistent caches, and a write may not leave a gap.

use super::{mul, OpResult};
use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use prima_core::plugin::backend_abi::KvSpec;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// One KV cache: per layer, `n_ctx` positions of `n_head_kv` heads.
pub struct KvCache {
    pub spec: KvSpec,
    /// F16 bits, `[layer][pos][head][head_dim_k]`.
    k: Vec<u16>,
    /// F16 bits, `[layer][pos][head][head_dim_v]`.
    v: Vec<u16>,
    /// Positions held per layer.
    len: Vec<usize>,
}

impl KvCache {
    pub fn new(spec: KvSpec) -> OpResult<KvCache> {
        const OP: &str = "kv_create";
        if spec.n_layers == 0 || spec.n_head_kv == 0 {
            return Err(format!(
                "{OP}: n_layers ({}) and n_head_kv ({}) must be positive",
                spec.n_layers, spec.n_head_kv
            ));
        }
        let slots = mul(
            OP,
            mul(OP, spec.n_layers as usize, spec.n_ctx as usize)?,
            spec.n_head_kv as usize,
        )?;
        let k_len = mul(OP, slots, spec.head_dim_k as usize)?;
        let v_len = mul(OP, slots, spec.head_dim_v as usize)?;
        let bytes = mul(OP, k_len.saturating_add(v_len), 2)?;
        if bytes > isize::MAX as usize {
            return Err(format!(
                "{OP}: a cache of {bytes} bytes cannot be allocated"
            ));
        }
        // Zeroed allocations: the OS commits pages only as positions are written.
        Ok(KvCache {
            spec,
            k: vec![0; k_len],
            v: vec![0; v_len],
            len: vec![0; spec.n_layers as usize],
        })
    }

    /// Positions layer `layer` holds (the caller keeps `layer < n_layers`).
    pub fn len(&self, layer: usize) -> usize {
        self.len[layer]
    }

    fn k_offset(&self, layer: usize, pos: usize, head: usize) -> usize {
        let s = &self.spec;
        ((layer * s.n_ctx as usize + pos) * s.n_head_kv as usize + head) * s.head_dim_k as usize
    }

    fn v_offset(&self, layer: usize, pos: usize, head: usize) -> usize {
        let s = &self.spec;
        ((layer * s.n_ctx as usize + pos) * s.n_head_kv as usize + head) * s.head_dim_v as usize
    }

    /// The F16 key of `head` at `pos`.
    pub fn key(&self, layer: usize, pos: usize, head: usize) -> &[u16] {
        let o = self.k_offset(layer, pos, head);
        &self.k[o..o + self.spec.head_dim_k as usize]
    }

    /// The F16 value of `head` at `pos`.
    pub fn value(&self, layer: usize, pos: usize, head: usize) -> &[u16] {
        let o = self.v_offset(layer, pos, head);
        &self.v[o..o + self.spec.head_dim_v as usize]
    }

    /// Stores `n` rows of `n_head_kv × head_dim` at positions `start ..`, and makes
    /// `start + n` the layer's length (later positions are now stale). The caller has
    /// checked the shapes, `start ≤ len(layer)` and `start + n ≤ n_ctx`.
    /// Key rows `first ..= last` of KV head `head` in `layer` as one slice, from the first
    /// row's start to the last row's end, rows [`KvCache::row_stride_k`] elements apart.
    pub fn key_rows(&self, layer: usize, first: usize, last: usize, head: usize) -> &[u16] {
        let end = self.k_offset(layer, last, head) + self.spec.head_dim_k as usize;
        &self.k[self.k_offset(layer, first, head)..end]
    }

    /// [`KvCache::key_rows`] for values.
    pub fn value_rows(&self, layer: usize, first: usize, last: usize, head: usize) -> &[u16] {
        let end = self.v_offset(layer, last, head) + self.spec.head_dim_v as usize;
        &self.v[self.v_offset(layer, first, head)..end]
    }

    /// Elements from one position's key row of a head to the next position's.
    pub fn row_stride_k(&self) -> usize {
        self.spec.n_head_kv as usize * self.spec.head_dim_k as usize
    }

    /// Elements from one position's value row of a head to the next position's.
    pub fn row_stride_v(&self) -> usize {
        self.spec.n_head_kv as usize * self.spec.head_dim_v as usize
    }

    pub fn write(&mut self, layer: usize, start: usize, n: usize, k: &[f32], v: &[f32]) {
        // `half`'s slice conversion: `f16::from_f32`'s bits, several lanes at a time.
        let ko = self.k_offset(layer, start, 0);
        self.k[ko..ko + k.len()]
            .reinterpret_cast_mut::<f16>()
            .convert_from_f32_slice(k);
        let vo = self.v_offset(layer, start, 0);
        self.v[vo..vo + v.len()]
            .reinterpret_cast_mut::<f16>()
            .convert_from_f32_slice(v);
        self.len[layer] = start + n;
    }

    /// Forgets every position at or after `n_pos` in every layer.
    pub fn truncate(&mut self, n_pos: usize) {
        for l in &mut self.len {
            *l = (*l).min(n_pos);
        }
    }
}

/// Every live cache of one backend.
#[derive(Default)]
pub struct KvStore {
    next: AtomicU64,
    caches: Mutex<HashMap<u64, Arc<Mutex<KvCache>>>>,
}

/// Locks a mutex, recovering the data if a panicking thread poisoned it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl KvStore {
    pub fn create(&self, spec: KvSpec) -> OpResult<u64> {
        let cache = KvCache::new(spec)?;
        let handle = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        lock(&self.caches).insert(handle, Arc::new(Mutex::new(cache)));
        Ok(handle)
    }

    pub fn drop_cache(&self, handle: u64) {
        lock(&self.caches).remove(&handle);
    }

    pub fn get(&self, op: &str, handle: u64) -> OpResult<Arc<Mutex<KvCache>>> {
        lock(&self.caches)
            .get(&handle)
            .cloned()
            .ok_or_else(|| format!("{op}: unknown KV cache handle {handle}"))
    }

    pub fn truncate(&self, handle: u64, n_pos: u32) -> OpResult<()> {
        let cache = self.get("kv_truncate", handle)?;
        lock(&cache).truncate(n_pos as usize);
        Ok(())
    }
}

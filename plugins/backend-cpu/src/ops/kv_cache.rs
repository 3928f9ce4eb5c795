//! The backend-owned KV caches, stored as F16 (llama.cpp's default) and addressed by `u64`
//! handles.
//!
//! Each layer remembers how many positions it holds, so a device that runs only some layers
//! (a prima.cpp ring window) keeps consistent caches, and a write may not leave a gap.

use super::{mul, OpResult};
use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use memmap2::MmapMut;
use prima_abi::backend::KvSpec;
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Zeroed F16 bits in an anonymous mapping: the OS commits its pages as they are written;
/// on Linux it asks for transparent huge pages, so that attention's reads of a cache, cold
/// after the weights went through the caches, do not wait on a page walk every 4 KiB.
struct F16Buffer {
    map: MmapMut,
    len: usize,
}

impl F16Buffer {
    fn zeroed(len: usize) -> std::io::Result<F16Buffer> {
        let map = MmapMut::map_anon((2 * len).max(1))?;
        // Only advice: without huge pages the cache works the same, a little slower.
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        Ok(F16Buffer { map, len })
    }
}

impl Deref for F16Buffer {
    type Target = [u16];
    fn deref(&self) -> &[u16] {
        // SAFETY: the mapping is page-aligned (aligned for u16), `2 · len` bytes long,
        // initialised (zeroed by the OS) and borrowed with `self`; every bit pattern is a u16.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr() as *const u16, self.len) }
    }
}

impl DerefMut for F16Buffer {
    fn deref_mut(&mut self) -> &mut [u16] {
        // SAFETY: as in `deref`, borrowed mutably with `self`.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr() as *mut u16, self.len) }
    }
}

/// One KV cache: per layer, `n_ctx` positions of `n_head_kv` heads.
pub struct KvCache {
    pub spec: KvSpec,
    /// F16 bits, `[layer][head][pos][head_dim_k]`: a head's rows are contiguous, so
    /// attention reads them as one stream of few pages (measured: position-major rows,
    /// `n_head_kv` apart, made attention ~17% of a four-request decode step, its loads
    /// waiting on memory; the weights had evicted them and their page entries).
    k: F16Buffer,
    /// F16 bits, `[layer][head][pos][head_dim_v]`.
    v: F16Buffer,
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
        let buffer = |len| {
            F16Buffer::zeroed(len)
                .map_err(|e| format!("{OP}: cannot map a cache of {bytes} bytes: {e}"))
        };
        Ok(KvCache {
            spec,
            k: buffer(k_len)?,
            v: buffer(v_len)?,
            len: vec![0; spec.n_layers as usize],
        })
    }

    /// Positions layer `layer` holds (the caller keeps `layer < n_layers`).
    pub fn len(&self, layer: usize) -> usize {
        self.len[layer]
    }

    fn k_offset(&self, layer: usize, pos: usize, head: usize) -> usize {
        let s = &self.spec;
        ((layer * s.n_head_kv as usize + head) * s.n_ctx as usize + pos) * s.head_dim_k as usize
    }

    fn v_offset(&self, layer: usize, pos: usize, head: usize) -> usize {
        let s = &self.spec;
        ((layer * s.n_head_kv as usize + head) * s.n_ctx as usize + pos) * s.head_dim_v as usize
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
        self.spec.head_dim_k as usize
    }

    /// Elements from one position's value row of a head to the next position's.
    pub fn row_stride_v(&self) -> usize {
        self.spec.head_dim_v as usize
    }

    pub fn write(&mut self, layer: usize, start: usize, n: usize, k: &[f32], v: &[f32]) {
        let (dk, dv) = (self.spec.head_dim_k as usize, self.spec.head_dim_v as usize);
        let heads = self.spec.n_head_kv as usize;
        // Each head's rows of the `n` positions are contiguous in the cache; `k` and `v`
        // hold the positions' rows of every head one after another.
        for head in 0..heads {
            let ko = self.k_offset(layer, start, head);
            let vo = self.v_offset(layer, start, head);
            for i in 0..n {
                let (src_k, src_v) = ((i * heads + head) * dk, (i * heads + head) * dv);
                // `half`'s slice conversion: `f16::from_f32`'s bits, several lanes at a time.
                self.k[ko + i * dk..ko + (i + 1) * dk]
                    .reinterpret_cast_mut::<f16>()
                    .convert_from_f32_slice(&k[src_k..src_k + dk]);
                self.v[vo + i * dv..vo + (i + 1) * dv]
                    .reinterpret_cast_mut::<f16>()
                    .convert_from_f32_slice(&v[src_v..src_v + dv]);
            }
        }
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

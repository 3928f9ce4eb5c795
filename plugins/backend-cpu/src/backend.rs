//! The ABI glue: [`CpuBackend`] implements the plugin [`Backend`] trait by resolving each
//! operation's [`Buf`]s to slices of host memory ([`BufferStore`]), calling into
//! `crate::ops`, and turning errors into `RString`s.
//!
//! The CPU's activation buffers are host memory, so an operation runs on them in place:
//! the only copies are the engine's one upload of a window's input and one download of its
//! output, which [`Backend::transfers`] counts like a GPU's.

use crate::buffers::BufferStore;
use crate::formats::dispatch;
use crate::ops::kv_cache::{lock, KvStore};
use crate::ops::matmul::KernelLookup;
use crate::ops::{attention, elementwise, get_rows, matmul, norm, rope, OpResult};
use crate::pool::{ChunkRunner, Scratch, SpinPool};
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RErr, ROk, RSlice, RSliceMut, RString};
use prima_abi::backend::{
    gather_rows_host, scatter_scaled_host, sum_groups_host, AttentionParams, AttentionSpan,
    Backend, BackendBox, BackendConfig, BackendResult, Backend_TO, Buf, KvSpec, RopeParams,
    TensorView, TransferCounts,
};
use prima_abi::GgmlType;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The CPU backend: a thread pool, reusable scratch, the activation buffers, the KV
/// caches, a kernel table and the transfer counts.
///
/// Matrix products and attention — hundreds of small calls per decoded token — run on the
/// low-latency [`SpinPool`], whose workers sleep when idle.
///
/// Locks are taken in one order: an operation's buffers ([`BufferStore::with`]), then the
/// scratch, then KV caches.
pub struct CpuBackend {
    pool: SpinPool,
    scratch: Mutex<Scratch>,
    buffers: BufferStore,
    kv: KvStore,
    kernels: KernelLookup,
    kernels_name: &'static str,
    transfers: Transfers,
}

/// [`TransferCounts`] as atomics. A host backend queues nothing, so it never waits
/// (`waits` stays 0) and submits nothing (`submissions` 0); it copies no per-operation
/// arguments (`param_bytes` 0). Uploads and downloads are counted as the engine's window
/// boundaries, where a GPU's would be.
#[derive(Default)]
struct Transfers {
    uploads: AtomicU64,
    downloads: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
}

impl Transfers {
    fn counts(&self) -> TransferCounts {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TransferCounts {
            uploads: get(&self.uploads),
            downloads: get(&self.downloads),
            waits: 0,
            submissions: 0,
            bytes_up: get(&self.bytes_up),
            bytes_down: get(&self.bytes_down),
            param_bytes: 0,
        }
    }
}

impl CpuBackend {
    pub fn new(cfg: BackendConfig) -> Result<CpuBackend, String> {
        Ok(CpuBackend {
            pool: SpinPool::new(cfg.threads)?,
            scratch: Mutex::new(Scratch::default()),
            buffers: BufferStore::default(),
            kv: KvStore::default(),
            kernels: dispatch::kernels,
            kernels_name: dispatch::kernel_level_name(),
            transfers: Transfers::default(),
        })
    }

    /// Worker threads in the pool.
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }
}

/// Creates a CPU backend behind the ABI; the function the plugin exports.
pub extern "C" fn create_backend(cfg: BackendConfig) -> BackendResult<BackendBox> {
    match CpuBackend::new(cfg) {
        Ok(b) => ROk(Backend_TO::from_value(b, TD_Opaque)),
        Err(e) => RErr(RString::from(e)),
    }
}

fn to_abi<T>(r: OpResult<T>) -> BackendResult<T> {
    match r {
        Ok(v) => ROk(v),
        Err(e) => RErr(RString::from(e)),
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> RString {
        RString::from("cpu")
    }

    fn describe(&self) -> RString {
        RString::from(format!(
            "cpu: {} kernels, {} threads",
            self.kernels_name,
            self.threads()
        ))
    }

    fn supports(&self, ggml_type: u32) -> bool {
        GgmlType::from_id(ggml_type).is_some_and(|t| (self.kernels)(t).is_some())
    }

    fn buf_create(&self, len: u64) -> BackendResult<u64> {
        to_abi(self.buffers.create(len))
    }

    fn buf_drop(&self, id: u64) {
        self.buffers.drop_buffer(id);
    }

    fn upload(&self, dst: Buf, src: RSlice<'_, f32>) -> BackendResult<()> {
        if let Err(e) = self.buffers.upload(dst, src.as_slice()) {
            return RErr(e.into());
        }
        let t = &self.transfers;
        t.uploads.fetch_add(1, Ordering::Relaxed);
        t.bytes_up.fetch_add(4 * dst.len, Ordering::Relaxed);
        ROk(())
    }

    fn download(&self, src: Buf, mut dst: RSliceMut<'_, f32>) -> BackendResult<()> {
        if let Err(e) = self.buffers.download(src, dst.as_mut_slice()) {
            return RErr(e.into());
        }
        let t = &self.transfers;
        t.downloads.fetch_add(1, Ordering::Relaxed);
        t.bytes_down.fetch_add(4 * src.len, Ordering::Relaxed);
        ROk(())
    }

    fn transfers(&self) -> TransferCounts {
        self.transfers.counts()
    }

    fn get_rows(&self, table: TensorView<'_>, ids: RSlice<'_, u32>, out: Buf) -> BackendResult<()> {
        to_abi(self.buffers.with("get_rows", [], out, |[], out| {
            get_rows::get_rows(&table, ids.as_slice(), out)
        }))
    }

    fn matmul(&self, w: TensorView<'_>, x: Buf, n_tokens: u32, out: Buf) -> BackendResult<()> {
        to_abi(self.buffers.with("matmul", [x], out, |[x], out| {
            let mut scratch = lock(&self.scratch);
            matmul::matmul(
                &self.pool,
                &mut scratch,
                self.kernels,
                &w,
                x,
                n_tokens as usize,
                out,
            )
        }))
    }

    fn rms_norm(&self, x: Buf, weight: TensorView<'_>, eps: f32, out: Buf) -> BackendResult<()> {
        to_abi(self.buffers.with("rms_norm", [x], out, |[x], out| {
            norm::rms_norm_on(&self.pool, x, &weight, eps, out)
        }))
    }

    fn add(&self, acc: Buf, x: Buf) -> BackendResult<()> {
        to_abi(
            self.buffers
                .with("add", [x], acc, |[x], acc| elementwise::add(acc, x)),
        )
    }

    fn add_bias(&self, x: Buf, bias: TensorView<'_>) -> BackendResult<()> {
        to_abi(
            self.buffers
                .with("add_bias", [], x, |[], x| elementwise::add_bias(x, &bias)),
        )
    }

    fn scale(&self, x: Buf, s: f32) -> BackendResult<()> {
        to_abi(self.buffers.with("scale", [], x, |[], x| {
            elementwise::scale(x, s);
            Ok(())
        }))
    }

    fn rope(
        &self,
        x: Buf,
        n_head: u32,
        head_dim: u32,
        positions: RSlice<'_, u32>,
        params: RopeParams<'_>,
    ) -> BackendResult<()> {
        to_abi(self.buffers.with("rope", [], x, |[], x| {
            let mut scratch = lock(&self.scratch);
            rope::rope_on(
                &self.pool,
                x,
                n_head as usize,
                head_dim as usize,
                positions.as_slice(),
                &params,
                &mut scratch.rope,
            )
        }))
    }

    fn swiglu(&self, gate: Buf, up: Buf) -> BackendResult<()> {
        to_abi(self.buffers.with("swiglu", [up], gate, |[up], gate| {
            elementwise::gated_on(&self.pool, gate, up, elementwise::swiglu)
        }))
    }

    fn geglu(&self, gate: Buf, up: Buf) -> BackendResult<()> {
        to_abi(self.buffers.with("geglu", [up], gate, |[up], gate| {
            elementwise::gated_on(&self.pool, gate, up, elementwise::geglu)
        }))
    }

    fn swiglu_oai(&self, gate: Buf, up: Buf, alpha: f32, limit: f32) -> BackendResult<()> {
        to_abi(self.buffers.with("swiglu_oai", [up], gate, |[up], gate| {
            elementwise::gated_on(&self.pool, gate, up, |g: &mut [f32], u: &[f32]| {
                elementwise::swiglu_oai(g, u, alpha, limit)
            })
        }))
    }

    fn gather_rows(
        &self,
        src: Buf,
        row_len: u32,
        rows: RSlice<'_, u32>,
        dst: Buf,
    ) -> BackendResult<()> {
        to_abi(self.buffers.with("gather_rows", [src], dst, |[src], dst| {
            gather_rows_host(src, row_len as usize, rows.as_slice(), dst)
        }))
    }

    fn scatter_scaled(
        &self,
        src: Buf,
        row_len: u32,
        rows: RSlice<'_, u32>,
        weights: RSlice<'_, f32>,
        dst: Buf,
    ) -> BackendResult<()> {
        // In place: the rows of `dst` not named keep their values.
        to_abi(
            self.buffers
                .with("scatter_scaled", [src], dst, |[src], dst| {
                    scatter_scaled_host(
                        src,
                        row_len as usize,
                        rows.as_slice(),
                        weights.as_slice(),
                        dst,
                    )
                }),
        )
    }

    fn sum_groups(&self, src: Buf, row_len: u32, group: u32, dst: Buf) -> BackendResult<()> {
        to_abi(self.buffers.with("sum_groups", [src], dst, |[src], dst| {
            sum_groups_host(src, row_len as usize, group as usize, dst)
        }))
    }

    fn kv_create(&self, spec: KvSpec) -> BackendResult<u64> {
        to_abi(self.kv.create(spec))
    }

    fn kv_drop(&self, kv: u64) {
        self.kv.drop_cache(kv);
    }

    fn kv_truncate(&self, kv: u64, n_pos: u32) -> BackendResult<()> {
        to_abi(self.kv.truncate(kv, n_pos))
    }

    fn attention_spans(
        &self,
        spans: RSlice<'_, AttentionSpan>,
        q: Buf,
        k: Buf,
        v: Buf,
        params: AttentionParams,
        out: Buf,
    ) -> BackendResult<()> {
        self.attention_on(spans.as_slice(), [q, k, v], None, &params, out)
    }

    fn attention_spans_sinks(
        &self,
        spans: RSlice<'_, AttentionSpan>,
        q: Buf,
        k: Buf,
        v: Buf,
        sinks: RSlice<'_, f32>,
        params: AttentionParams,
        out: Buf,
    ) -> BackendResult<()> {
        let sinks = Some(sinks.as_slice());
        self.attention_on(spans.as_slice(), [q, k, v], sinks, &params, out)
    }

    fn idle(&self) {
        self.pool.park();
    }
}

impl CpuBackend {
    /// Batched attention ([`attention::attention_spans`]) on the buffers `q`, `k`, `v` and
    /// `out`, with gpt-oss's sinks when given.
    fn attention_on(
        &self,
        spans: &[AttentionSpan],
        qkv: [Buf; 3],
        sinks: Option<&[f32]>,
        params: &AttentionParams,
        out: Buf,
    ) -> BackendResult<()> {
        to_abi(self.buffers.with("attention", qkv, out, |[q, k, v], out| {
            let mut scratch = lock(&self.scratch);
            attention::attention_spans(
                &self.pool,
                &mut scratch,
                &self.kv,
                spans,
                q,
                k,
                v,
                sinks,
                params,
                out,
            )
        }))
    }
}

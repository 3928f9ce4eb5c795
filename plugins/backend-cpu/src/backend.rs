//! The ABI glue: [`CpuBackend`] implements the plugin [`Backend`] trait by converting ABI
//! types to slices, calling into `crate::ops`, and turning errors into `RString`s.

use crate::formats::dispatch;
use crate::ops::kv_cache::{lock, KvStore};
use crate::ops::matmul::KernelLookup;
use crate::ops::{attention, elementwise, get_rows, matmul, norm, rope, OpResult};
use crate::pool::{ChunkRunner, Scratch, SpinPool};
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RErr, ROk, RSlice, RSliceMut, RString};
use prima_abi::backend::{
    AttentionParams, AttentionSpan, Backend, BackendBox, BackendConfig, BackendResult, Backend_TO,
    KvSpec, RopeParams, TensorView,
};
use prima_abi::GgmlType;
use std::sync::Mutex;

/// The CPU backend: a thread pool, reusable scratch, the KV caches, and a kernel table.
///
/// Matrix products and attention — hundreds of small calls per decoded token — run on the
/// low-latency [`SpinPool`], whose workers sleep when idle.
pub struct CpuBackend {
    pool: SpinPool,
    scratch: Mutex<Scratch>,
    kv: KvStore,
    kernels: KernelLookup,
    kernels_name: &'static str,
}

impl CpuBackend {
    pub fn new(cfg: BackendConfig) -> Result<CpuBackend, String> {
        Ok(CpuBackend {
            pool: SpinPool::new(cfg.threads)?,
            scratch: Mutex::new(Scratch::default()),
            kv: KvStore::default(),
            kernels: dispatch::kernels,
            kernels_name: dispatch::kernel_level_name(),
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

fn to_abi(r: OpResult<()>) -> BackendResult<()> {
    match r {
        Ok(()) => ROk(()),
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

    fn get_rows(
        &self,
        table: TensorView<'_>,
        ids: RSlice<'_, u32>,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        to_abi(get_rows::get_rows(
            &table,
            ids.as_slice(),
            out.as_mut_slice(),
        ))
    }

    fn matmul(
        &self,
        w: TensorView<'_>,
        x: RSlice<'_, f32>,
        n_tokens: u32,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        let mut scratch = lock(&self.scratch);
        to_abi(matmul::matmul(
            &self.pool,
            &mut scratch,
            self.kernels,
            &w,
            x.as_slice(),
            n_tokens as usize,
            out.as_mut_slice(),
        ))
    }

    fn rms_norm(
        &self,
        x: RSlice<'_, f32>,
        weight: TensorView<'_>,
        eps: f32,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        to_abi(norm::rms_norm_on(
            &self.pool,
            x.as_slice(),
            &weight,
            eps,
            out.as_mut_slice(),
        ))
    }

    fn add(&self, mut acc: RSliceMut<'_, f32>, x: RSlice<'_, f32>) -> BackendResult<()> {
        to_abi(elementwise::add(acc.as_mut_slice(), x.as_slice()))
    }

    fn add_bias(&self, mut x: RSliceMut<'_, f32>, bias: TensorView<'_>) -> BackendResult<()> {
        to_abi(elementwise::add_bias(x.as_mut_slice(), &bias))
    }

    fn scale(&self, mut x: RSliceMut<'_, f32>, s: f32) -> BackendResult<()> {
        elementwise::scale(x.as_mut_slice(), s);
        ROk(())
    }

    fn rope(
        &self,
        mut x: RSliceMut<'_, f32>,
        n_head: u32,
        head_dim: u32,
        positions: RSlice<'_, u32>,
        params: RopeParams<'_>,
    ) -> BackendResult<()> {
        let mut scratch = lock(&self.scratch);
        to_abi(rope::rope_on(
            &self.pool,
            x.as_mut_slice(),
            n_head as usize,
            head_dim as usize,
            positions.as_slice(),
            &params,
            &mut scratch.rope,
        ))
    }

    fn swiglu(&self, mut gate: RSliceMut<'_, f32>, up: RSlice<'_, f32>) -> BackendResult<()> {
        to_abi(elementwise::gated_on(
            &self.pool,
            gate.as_mut_slice(),
            up.as_slice(),
            elementwise::swiglu,
        ))
    }

    fn geglu(&self, mut gate: RSliceMut<'_, f32>, up: RSlice<'_, f32>) -> BackendResult<()> {
        to_abi(elementwise::gated_on(
            &self.pool,
            gate.as_mut_slice(),
            up.as_slice(),
            elementwise::geglu,
        ))
    }

    fn swiglu_oai(
        &self,
        mut gate: RSliceMut<'_, f32>,
        up: RSlice<'_, f32>,
        alpha: f32,
        limit: f32,
    ) -> BackendResult<()> {
        to_abi(elementwise::gated_on(
            &self.pool,
            gate.as_mut_slice(),
            up.as_slice(),
            |g: &mut [f32], u: &[f32]| elementwise::swiglu_oai(g, u, alpha, limit),
        ))
    }

    fn kv_create(&self, spec: KvSpec) -> BackendResult<u64> {
        match self.kv.create(spec) {
            Ok(h) => ROk(h),
            Err(e) => RErr(RString::from(e)),
        }
    }

    fn kv_drop(&self, kv: u64) {
        self.kv.drop_cache(kv);
    }

    fn kv_truncate(&self, kv: u64, n_pos: u32) -> BackendResult<()> {
        to_abi(self.kv.truncate(kv, n_pos))
    }

    fn attention(
        &self,
        kv: u64,
        q: RSlice<'_, f32>,
        k: RSlice<'_, f32>,
        v: RSlice<'_, f32>,
        params: AttentionParams,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        let mut scratch = lock(&self.scratch);
        to_abi(attention::attention(
            &self.pool,
            &mut scratch,
            &self.kv,
            kv,
            q.as_slice(),
            k.as_slice(),
            v.as_slice(),
            &params,
            out.as_mut_slice(),
        ))
    }

    fn attention_spans(
        &self,
        spans: RSlice<'_, AttentionSpan>,
        q: RSlice<'_, f32>,
        k: RSlice<'_, f32>,
        v: RSlice<'_, f32>,
        params: AttentionParams,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        let mut scratch = lock(&self.scratch);
        to_abi(attention::attention_spans(
            &self.pool,
            &mut scratch,
            &self.kv,
            spans.as_slice(),
            q.as_slice(),
            k.as_slice(),
            v.as_slice(),
            None,
            &params,
            out.as_mut_slice(),
        ))
    }

    fn attention_spans_sinks(
        &self,
        spans: RSlice<'_, AttentionSpan>,
        q: RSlice<'_, f32>,
        k: RSlice<'_, f32>,
        v: RSlice<'_, f32>,
        sinks: RSlice<'_, f32>,
        params: AttentionParams,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        let mut scratch = lock(&self.scratch);
        to_abi(attention::attention_spans(
            &self.pool,
            &mut scratch,
            &self.kv,
            spans.as_slice(),
            q.as_slice(),
            k.as_slice(),
            v.as_slice(),
            Some(sinks.as_slice()),
            &params,
            out.as_mut_slice(),
        ))
    }

    fn idle(&self) {
        self.pool.park();
    }
}

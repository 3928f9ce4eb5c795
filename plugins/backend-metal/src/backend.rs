//! The ABI glue: [`WgpuBackend`] implements the plugin [`Backend`] trait by locking the GPU
//! state, calling `crate::ops`, and turning errors — and panics, which must never cross
//! the FFI boundary — into `RString`s.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RErr, ROk, ROption, RSlice, RSliceMut, RString};
use prima_core::plugin::backend_abi::{
    AttentionParams, Backend, BackendBox, BackendConfig, BackendResult, Backend_TO, GpuMemory,
    KvSpec, RopeParams, TensorView,
};

use crate::device::{self, Gpu};
use crate::formats;
use crate::ops::{OpResult, State};

/// The wgpu backend: one adapter (see `device`) and what it holds, behind a lock.
pub struct WgpuBackend {
    state: Mutex<State>,
    describe: String,
}

impl WgpuBackend {
    pub fn new(cfg: BackendConfig) -> Result<WgpuBackend, String> {
        Self::with_part_limit(cfg, None)
    }

    /// As [`Self::new`], with weights split into bindings of at most `part_limit` bytes
    /// (tests force the split that huge tensors get on real devices).
    pub fn with_part_limit(
        _cfg: BackendConfig,
        part_limit: Option<u64>,
    ) -> Result<WgpuBackend, String> {
        let gpu = Gpu::open()?;
        let describe = format!(
            "wgpu: {} ({}, {:?}{}); host-slice ABI: activations copied per op",
            gpu.info.name,
            gpu.api(),
            gpu.info.device_type,
            if gpu.f64 { ", f64" } else { "" },
        );
        Ok(WgpuBackend {
            state: Mutex::new(State::new(gpu, part_limit)),
            describe,
        })
    }

    /// Chooses the matmul kernels: one invocation per weight row (the default on CPU
    /// adapters) or a workgroup per row (on GPUs). Both give the same bits; tests run both.
    pub fn set_row_per_invocation(&self, on: bool) {
        if let Ok(mut s) = self.state.lock() {
            s.row_per_invocation = on;
        }
    }

    /// Runs `f` on the locked state; a panic or a poisoned lock becomes an error.
    fn with<T>(&self, op: &str, f: impl FnOnce(&mut State) -> OpResult<T>) -> BackendResult<T> {
        let r = catch_unwind(AssertUnwindSafe(|| {
            let mut state = self
                .state
                .lock()
                .map_err(|_| format!("{op}: the wgpu backend failed earlier (a panic)"))?;
            // wgpu reports invalid use through error scopes, not return values.
            let oom = state
                .gpu
                .device
                .push_error_scope(wgpu::ErrorFilter::OutOfMemory);
            let invalid = state
                .gpu
                .device
                .push_error_scope(wgpu::ErrorFilter::Validation);
            let r = f(&mut state);
            let invalid = pollster::block_on(invalid.pop());
            let oom = pollster::block_on(oom.pop());
            match (r, invalid.or(oom)) {
                (Ok(_), Some(e)) => Err(format!("{op}: GPU error: {e}")),
                (r, _) => r,
            }
        }));
        match r {
            Ok(Ok(v)) => ROk(v),
            Ok(Err(e)) => RErr(RString::from(e)),
            Err(_) => RErr(RString::from(format!("{op}: panicked in the wgpu backend"))),
        }
    }
}

/// Creates a wgpu backend behind the ABI; the function the plugin exports.
pub extern "C" fn create_backend(cfg: BackendConfig) -> BackendResult<BackendBox> {
    match catch_unwind(|| WgpuBackend::new(cfg)) {
        Ok(Ok(b)) => ROk(Backend_TO::from_value(b, TD_Opaque)),
        Ok(Err(e)) => RErr(RString::from(e)),
        Err(_) => RErr(RString::from("creating the wgpu backend panicked")),
    }
}

/// Why this machine cannot run the backend (`None`: it can); the plugin exports it.
pub extern "C" fn unavailable() -> ROption<RString> {
    device::unavailable().map(RString::from).into()
}

/// The adapter's memory, exported through the ABI (`gpu_memory`): what makes this plugin a
/// GPU's for `--gpu-layers` and `prima profile`.
pub extern "C" fn gpu_memory() -> ROption<GpuMemory> {
    device::memory().into()
}

impl Backend for WgpuBackend {
    fn name(&self) -> RString {
        RString::from("wgpu")
    }

    fn describe(&self) -> RString {
        RString::from(self.describe.as_str())
    }

    fn supports(&self, ggml_type: u32) -> bool {
        formats::format_of(ggml_type).is_some()
    }

    fn get_rows(
        &self,
        table: TensorView<'_>,
        ids: RSlice<'_, u32>,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        self.with("get_rows", |s| {
            s.get_rows(&table, ids.as_slice(), out.as_mut_slice())
        })
    }

    fn matmul(
        &self,
        w: TensorView<'_>,
        x: RSlice<'_, f32>,
        n_tokens: u32,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        self.with("matmul", |s| {
            s.matmul(&w, x.as_slice(), n_tokens as usize, out.as_mut_slice())
        })
    }

    fn rms_norm(
        &self,
        x: RSlice<'_, f32>,
        weight: TensorView<'_>,
        eps: f32,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        self.with("rms_norm", |s| {
            s.rms_norm(x.as_slice(), &weight, eps, out.as_mut_slice())
        })
    }

    fn add(&self, mut acc: RSliceMut<'_, f32>, x: RSlice<'_, f32>) -> BackendResult<()> {
        self.with("add", |s| s.add(acc.as_mut_slice(), x.as_slice()))
    }

    fn add_bias(&self, mut x: RSliceMut<'_, f32>, bias: TensorView<'_>) -> BackendResult<()> {
        self.with("add_bias", |s| s.add_bias(x.as_mut_slice(), &bias))
    }

    fn scale(&self, mut x: RSliceMut<'_, f32>, v: f32) -> BackendResult<()> {
        self.with("scale", |s| s.scale(x.as_mut_slice(), v))
    }

    fn rope(
        &self,
        mut x: RSliceMut<'_, f32>,
        n_head: u32,
        head_dim: u32,
        positions: RSlice<'_, u32>,
        params: RopeParams<'_>,
    ) -> BackendResult<()> {
        self.with("rope", |s| {
            s.rope(
                x.as_mut_slice(),
                n_head as usize,
                head_dim as usize,
                positions.as_slice(),
                &params,
            )
        })
    }

    fn swiglu(&self, mut gate: RSliceMut<'_, f32>, up: RSlice<'_, f32>) -> BackendResult<()> {
        self.with("swiglu", |s| s.swiglu(gate.as_mut_slice(), up.as_slice()))
    }

    fn geglu(&self, mut gate: RSliceMut<'_, f32>, up: RSlice<'_, f32>) -> BackendResult<()> {
        self.with("geglu", |s| s.geglu(gate.as_mut_slice(), up.as_slice()))
    }

    fn kv_create(&self, spec: KvSpec) -> BackendResult<u64> {
        self.with("kv_create", |s| s.kv_create(spec))
    }

    fn kv_drop(&self, kv: u64) {
        let _ = self.with("kv_drop", |s| {
            s.kv_drop(kv);
            Ok(())
        });
    }

    fn kv_truncate(&self, kv: u64, n_pos: u32) -> BackendResult<()> {
        self.with("kv_truncate", |s| s.kv_truncate(kv, n_pos))
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
        self.with("attention", |s| {
            s.attention(
                kv,
                q.as_slice(),
                k.as_slice(),
                v.as_slice(),
                &params,
                out.as_mut_slice(),
            )
        })
    }

    fn idle(&self) {}
}

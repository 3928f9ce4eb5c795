//! The ABI glue: [`CudaBackend`] implements the plugin [`Backend`] trait by locking the GPU
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

/// The CUDA backend: one GPU (device 0) and what it holds, behind a lock.
pub struct CudaBackend {
    state: Mutex<State>,
    describe: String,
}

impl CudaBackend {
    pub fn new(_cfg: BackendConfig) -> Result<CudaBackend, String> {
        let gpu = Gpu::open(0)?;
        let describe = format!(
            "cuda: {} (sm_{}{}, {:.1} GiB), NVRTC {}.{}; host-slice ABI: activations copied per op",
            gpu.name,
            gpu.arch.0,
            gpu.arch.1,
            gpu.vram_total as f64 / (1u64 << 30) as f64,
            gpu.nvrtc.0,
            gpu.nvrtc.1
        );
        Ok(CudaBackend {
            state: Mutex::new(State::new(gpu)),
            describe,
        })
    }

    /// Runs `f` on the locked state; a panic or a poisoned lock becomes an error.
    fn with<T>(&self, op: &str, f: impl FnOnce(&mut State) -> OpResult<T>) -> BackendResult<T> {
        let r = catch_unwind(AssertUnwindSafe(|| {
            let mut state = self
                .state
                .lock()
                .map_err(|_| format!("{op}: the CUDA backend failed earlier (a panic)"))?;
            f(&mut state)
        }));
        match r {
            Ok(Ok(v)) => ROk(v),
            Ok(Err(e)) => RErr(RString::from(e)),
            Err(_) => RErr(RString::from(format!("{op}: panicked in the CUDA backend"))),
        }
    }
}

/// Creates a CUDA backend behind the ABI; the function the plugin exports.
pub extern "C" fn create_backend(cfg: BackendConfig) -> BackendResult<BackendBox> {
    match catch_unwind(|| CudaBackend::new(cfg)) {
        Ok(Ok(b)) => ROk(Backend_TO::from_value(b, TD_Opaque)),
        Ok(Err(e)) => RErr(RString::from(e)),
        Err(_) => RErr(RString::from("creating the CUDA backend panicked")),
    }
}

/// Why this machine cannot run the backend (`None`: it can); the plugin exports it.
pub extern "C" fn unavailable() -> ROption<RString> {
    device::unavailable().map(RString::from).into()
}

/// The plugin's answer to [`prima_core::plugin::backend_abi::BackendPlugin::gpu_memory`]:
/// device 0's VRAM, or `None` where the backend cannot run.
pub extern "C" fn gpu_memory() -> ROption<GpuMemory> {
    device::memory().into()
}

impl Backend for CudaBackend {
    fn name(&self) -> RString {
        RString::from("cuda")
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

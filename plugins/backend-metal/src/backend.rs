//! Opening the wgpu backend, and the plugin's exports. The ABI glue itself is
//! [`prima_gpu_support::backend::GpuBackend`] over [`crate::ops::State`], whose
//! `guarded` collects wgpu's out-of-band errors.

use abi_stable::std_types::{ROption, RString};
use prima_abi::backend::{BackendBox, BackendConfig, BackendResult, GpuMemory};
use prima_gpu_support::backend::{self as glue, GpuBackend};

use crate::device::{self, Gpu};
use crate::ops::State;

/// The wgpu backend: one adapter (see `device`) and what it holds, behind a lock.
pub type WgpuBackend = GpuBackend<State>;

/// Opens the best adapter (see `device`).
pub fn open(cfg: BackendConfig) -> Result<WgpuBackend, String> {
    open_with_part_limit(cfg, None)
}

/// As [`open`], with weights split into bindings of at most `part_limit` bytes (tests
/// force the split that huge tensors get on real devices).
pub fn open_with_part_limit(
    _cfg: BackendConfig,
    part_limit: Option<u64>,
) -> Result<WgpuBackend, String> {
    let gpu = Gpu::open()?;
    let describe = format!(
        "wgpu: {} ({}, {:?}{}); activations on the device",
        gpu.info.name,
        gpu.api(),
        gpu.info.device_type,
        if gpu.f64 { ", f64" } else { "" },
    );
    Ok(GpuBackend::new(State::new(gpu, part_limit), describe))
}

/// Creates a wgpu backend behind the ABI; the function the plugin exports.
pub extern "C" fn create_backend(cfg: BackendConfig) -> BackendResult<BackendBox> {
    glue::create(|| open(cfg))
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

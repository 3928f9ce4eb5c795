//! Opening the CUDA backend, and the plugin's exports. The ABI glue itself is
//! [`prima_gpu_support::backend::GpuBackend`] over [`crate::ops::State`].

use abi_stable::std_types::{ROption, RString};
use prima_abi::backend::{BackendBox, BackendConfig, BackendResult, GpuMemory};
use prima_gpu_support::backend::{self as glue, GpuBackend};

use crate::device::{self, Gpu};
use crate::ops::State;

/// The CUDA backend: one GPU (device 0) and what it holds, behind a lock.
pub type CudaBackend = GpuBackend<State>;

/// Opens device 0.
pub fn open(_cfg: BackendConfig) -> Result<CudaBackend, String> {
    let gpu = Gpu::open(0)?;
    let describe = format!(
        "cuda: {} (sm_{}{}, {:.1} GiB), NVRTC {}.{}; activations on the device",
        gpu.name,
        gpu.arch.0,
        gpu.arch.1,
        gpu.vram_total as f64 / (1u64 << 30) as f64,
        gpu.nvrtc.0,
        gpu.nvrtc.1
    );
    Ok(GpuBackend::new(State::new(gpu), describe))
}

/// Creates a CUDA backend behind the ABI; the function the plugin exports.
pub extern "C" fn create_backend(cfg: BackendConfig) -> BackendResult<BackendBox> {
    glue::create(|| open(cfg))
}

/// Why this machine cannot run the backend (`None`: it can); the plugin exports it.
pub extern "C" fn unavailable() -> ROption<RString> {
    device::unavailable().map(RString::from).into()
}

/// The plugin's answer to [`prima_abi::backend::BackendPlugin::gpu_memory`]:
/// device 0's VRAM, or `None` where the backend cannot run.
pub extern "C" fn gpu_memory() -> ROption<GpuMemory> {
    device::memory().into()
}

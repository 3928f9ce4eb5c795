//! The GPU as the host side sees it: whether one can be used at all ([`unavailable`]),
//! and an opened device ([`Gpu`]) with its stream and every kernel module loaded.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DriverError};
use cudarc::nvrtc::Ptx;

use prima_abi::backend::GpuMemory;

use crate::compile;
use crate::kernels::Family;

/// Driver errors as messages naming what was being done.
pub fn drv<T>(what: &str, r: Result<T, DriverError>) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// Why this machine cannot run the CUDA backend, or `None` if it can: the driver library,
/// NVRTC, `cuInit` and at least one device, checked in that order without creating a
/// context. Never panics (cudarc panics when a library is missing; that is caught).
pub fn unavailable() -> Option<String> {
    std::panic::catch_unwind(|| {
        // SAFETY: only tries to dlopen the library by its usual names.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Some("libcuda.so not found (no NVIDIA driver)".to_string());
        }
        // SAFETY: as above, for NVRTC.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Some(
                "libnvrtc.so not found (NVRTC, part of the CUDA toolkit/runtime, compiles the kernels)"
                    .to_string(),
            );
        }
        if let Err(e) = cudarc::driver::result::init() {
            return Some(format!("cuInit failed: {e}"));
        }
        match CudaContext::device_count() {
            Ok(0) => Some("no CUDA device".to_string()),
            Ok(_) => None,
            Err(e) => Some(format!("cannot count CUDA devices: {e}")),
        }
    })
    .unwrap_or_else(|_| Some("probing the CUDA driver panicked".to_string()))
}

/// Device 0's memory (total and free, from `cuMemGetInfo` in its primary context), or
/// `None` where the backend cannot run. Never panics.
pub fn memory() -> Option<GpuMemory> {
    if unavailable().is_some() {
        return None;
    }
    std::panic::catch_unwind(|| {
        let ctx = CudaContext::new(0).ok()?;
        let (free, total) = ctx.mem_get_info().ok()?;
        Some(GpuMemory {
            total_bytes: total as u64,
            free_bytes: free as u64,
            unified: false,
        })
    })
    .ok()
    .flatten()
}

/// An opened GPU: context, one stream, the kernels.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    modules: HashMap<Family, Arc<CudaModule>>,
    functions: HashMap<&'static str, CudaFunction>,
    pub name: String,
    pub arch: (i32, i32),
    pub nvrtc: (i32, i32),
    pub vram_total: usize,
}

impl Gpu {
    /// Opens device `ordinal` and compiles (or reads from the cache) every kernel family.
    pub fn open(ordinal: usize) -> Result<Gpu, String> {
        if let Some(why) = unavailable() {
            return Err(format!("CUDA unavailable: {why}"));
        }
        let ctx = drv("creating a CUDA context", CudaContext::new(ordinal))?;
        let arch = drv("reading the compute capability", ctx.compute_capability())?;
        let nvrtc = compile::nvrtc_version()?;
        let mut modules = HashMap::new();
        for family in Family::ALL {
            let ptx = compile::ptx(family, arch, nvrtc)?;
            let module = drv(
                &format!("loading the {} kernels", family.name()),
                ctx.load_module(Ptx::from_src(ptx)),
            )?;
            modules.insert(family, module);
        }
        Ok(Gpu {
            stream: ctx.default_stream(),
            name: ctx.name().unwrap_or_else(|_| "unknown GPU".into()),
            vram_total: ctx.total_mem().unwrap_or(0),
            ctx,
            modules,
            functions: HashMap::new(),
            arch,
            nvrtc,
        })
    }

    /// The kernel `name` of `family` (looked up once, then remembered).
    pub fn function(&mut self, family: Family, name: &'static str) -> Result<CudaFunction, String> {
        if let Some(f) = self.functions.get(name) {
            return Ok(f.clone());
        }
        let module = self
            .modules
            .get(&family)
            .ok_or_else(|| format!("kernel module {} not loaded", family.name()))?;
        let f = drv(
            &format!("finding kernel {name}"),
            module.load_function(name),
        )?;
        self.functions.insert(name, f.clone());
        Ok(f)
    }
}

/// A 1-D grid-stride launch over `n` items.
pub fn grid_1d(n: u64) -> cudarc::driver::LaunchConfig {
    const BLOCK: u32 = 256;
    let blocks = n.div_ceil(BLOCK as u64).clamp(1, 65_535 * 8) as u32;
    cudarc::driver::LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

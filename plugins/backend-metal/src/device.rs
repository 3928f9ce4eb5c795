//! The GPU as the host side sees it: whether one can be used at all ([`unavailable`]), and
//! an opened device ([`Gpu`]) with its queue, limits and pipelines (created on first use,
//! then kept).
//!
//! Adapter choice: discrete, then integrated, then virtual GPUs. A CPU ("software") adapter
//! such as Mesa's llvmpipe (lavapipe) is slower than Prima's own CPU backend, so it is used
//! only when `PRIMA_WGPU_ALLOW_SOFTWARE=1` asks for it — the tests set it, to run the
//! kernels on machines without a GPU.

use std::collections::HashMap;

use prima_abi::backend::GpuMemory;
use wgpu::{Adapter, Backends, DeviceType};

use crate::kernels;

/// The environment variable that lets a software (CPU) adapter be used.
pub const ALLOW_SOFTWARE: &str = "PRIMA_WGPU_ALLOW_SOFTWARE";

/// The native APIs this build asks wgpu for: Metal on Apple, Vulkan elsewhere, and DX12
/// too on Windows. No GL.
fn backends() -> Backends {
    if cfg!(target_vendor = "apple") {
        Backends::METAL
    } else if cfg!(windows) {
        Backends::VULKAN | Backends::DX12
    } else {
        Backends::VULKAN
    }
}

fn api_names() -> &'static str {
    if cfg!(target_vendor = "apple") {
        "Metal"
    } else if cfg!(windows) {
        "Vulkan/DX12"
    } else {
        "Vulkan"
    }
}

fn software_allowed() -> bool {
    std::env::var(ALLOW_SOFTWARE).is_ok_and(|v| v == "1")
}

fn rank(t: DeviceType) -> u8 {
    match t {
        DeviceType::DiscreteGpu => 0,
        DeviceType::IntegratedGpu => 1,
        DeviceType::VirtualGpu => 2,
        DeviceType::Other => 3,
        DeviceType::Cpu => 4,
    }
}

/// Mesa's device-select layer (an implicit Vulkan layer that `mesa-vulkan-drivers`
/// installs) connects to Wayland to order the devices, and on a headless machine without
/// `XDG_RUNTIME_DIR` prints an error on every probe, into every `prima` command's output.
/// The backend ranks adapters itself, so there it is turned off (`NODEVICE_SELECT=1`,
/// Mesa's own switch) unless the user set it either way.
fn quiet_device_select() {
    if cfg!(target_os = "linux")
        && std::env::var_os("XDG_RUNTIME_DIR").is_none()
        && std::env::var_os("NODEVICE_SELECT").is_none()
    {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}

/// The adapter the backend would use, or why there is none.
fn pick_adapter() -> Result<Adapter, String> {
    quiet_device_select();
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: backends(),
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let mut adapters = pollster::block_on(instance.enumerate_adapters(backends()));
    adapters.sort_by_key(|a| rank(a.get_info().device_type));
    let software: Vec<String> = adapters
        .iter()
        .filter(|a| a.get_info().device_type == DeviceType::Cpu)
        .map(|a| a.get_info().name)
        .collect();
    let allow = software_allowed();
    adapters
        .into_iter()
        .find(|a| allow || a.get_info().device_type != DeviceType::Cpu)
        .ok_or_else(|| {
            if software.is_empty() {
                format!("no {} adapter found", api_names())
            } else {
                format!(
                    "only a software {} adapter found ({}), slower than the CPU backend; set {ALLOW_SOFTWARE}=1 to use it anyway",
                    api_names(),
                    software.join(", ")
                )
            }
        })
}

/// Why this machine cannot run the wgpu backend, or `None` if it can. Never panics.
pub fn unavailable() -> Option<String> {
    std::panic::catch_unwind(|| pick_adapter().err())
        .unwrap_or_else(|_| Some("probing for a wgpu adapter panicked".to_string()))
}

/// The chosen adapter's memory (the ABI's `gpu_memory`, which Halda plans the GPU layers
/// against), or `None` where the backend cannot run or the API does not say. Integrated and
/// software adapters, and every Apple GPU, share RAM with the CPU (`unified`). Never panics.
pub fn memory() -> Option<GpuMemory> {
    std::panic::catch_unwind(|| {
        let adapter = pick_adapter().ok()?;
        let info = adapter.get_info();
        match info.backend {
            // Integrated and software adapters share RAM with the CPU.
            #[cfg(not(target_vendor = "apple"))]
            wgpu::Backend::Vulkan => vulkan_memory(
                &adapter,
                matches!(
                    info.device_type,
                    DeviceType::IntegratedGpu | DeviceType::Cpu
                ),
            ),
            // Metal reports no heap sizes through wgpu; an Apple GPU may take what RAM
            // has, so the RAM's figures are its memory.
            wgpu::Backend::Metal => ram_memory(),
            _ => None,
        }
    })
    .ok()
    .flatten()
}

/// Unified memory's figures: this process's RAM, cgroups included.
fn ram_memory() -> Option<GpuMemory> {
    let mem = prima_host::device_memory().ok()?.effective;
    let bytes = |gib: f64| (gib * (1u64 << 30) as f64) as u64;
    Some(GpuMemory {
        total_bytes: bytes(mem.total_gib),
        free_bytes: bytes(mem.available_gib),
        unified: true,
    })
}

/// A Vulkan adapter's device-local heaps: their sizes, and what is free of them where the
/// driver has VK_EXT_memory_budget (else the whole heaps are counted free).
#[cfg(not(target_vendor = "apple"))]
fn vulkan_memory(adapter: &Adapter, unified: bool) -> Option<GpuMemory> {
    use ash::vk;
    // SAFETY: the hal adapter is borrowed only for read-only queries below, while
    // `adapter` (which owns it) is alive; no wgpu state is changed.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let shared = hal.shared_instance();
    let instance = shared.raw_instance();
    let physical = hal.raw_physical_device();
    // SAFETY: `physical` was enumerated from `instance`, which outlives these calls.
    let extensions = unsafe { instance.enumerate_device_extension_properties(physical) }.ok()?;
    let has_budget = shared.instance_api_version() >= vk::API_VERSION_1_1
        && extensions
            .iter()
            .any(|e| e.extension_name_as_c_str() == Ok(ash::ext::memory_budget::NAME));
    let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
    let props = if has_budget {
        let mut props2 = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
        // SAFETY: as above; the chained `budget` outlives the call (Vulkan 1.1 checked).
        unsafe { instance.get_physical_device_memory_properties2(physical, &mut props2) };
        props2.memory_properties
    } else {
        // SAFETY: as above.
        unsafe { instance.get_physical_device_memory_properties(physical) }
    };
    let heaps = &props.memory_heaps[..(props.memory_heap_count as usize).min(vk::MAX_MEMORY_HEAPS)];
    let (mut total, mut free) = (0u64, 0u64);
    for (i, heap) in heaps.iter().enumerate() {
        if !heap.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL) {
            continue;
        }
        total += heap.size;
        free += if has_budget {
            budget.heap_budget[i].saturating_sub(budget.heap_usage[i])
        } else {
            heap.size
        };
    }
    (total > 0).then_some(GpuMemory {
        total_bytes: total,
        free_bytes: free.min(total),
        unified,
    })
}

/// An opened GPU: device, queue, what it allows, the pipelines made so far.
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    /// Whether shaders may use f64 (RMS norm's sum, attention's exp and total).
    pub f64: bool,
    pipelines: HashMap<String, wgpu::ComputePipeline>,
}

impl Gpu {
    /// Opens the preferred adapter with all its limits and, where it has it, SHADER_F64.
    pub fn open() -> Result<Gpu, String> {
        let adapter = pick_adapter().map_err(|why| format!("wgpu unavailable: {why}"))?;
        let info = adapter.get_info();
        let limits = adapter.limits();
        let f64 = adapter.features().contains(wgpu::Features::SHADER_F64);
        let features = if f64 {
            wgpu::Features::SHADER_F64
        } else {
            wgpu::Features::empty()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("prima"),
            required_features: features,
            required_limits: limits.clone(),
            memory_hints: wgpu::MemoryHints::Performance,
            ..Default::default()
        }))
        .map_err(|e| format!("opening {}: {e}", info.name))?;
        // Errors are collected per operation with error scopes (see `ops`); one that
        // escapes them is logged instead of panicking in wgpu's default handler.
        device.on_uncaptured_error(std::sync::Arc::new(|e| {
            eprintln!("prima wgpu backend: uncaptured GPU error: {e}");
        }));
        Ok(Gpu {
            device,
            queue,
            info,
            limits,
            f64,
            pipelines: HashMap::new(),
        })
    }

    /// The graphics API in words.
    pub fn api(&self) -> &'static str {
        match self.info.backend {
            wgpu::Backend::Vulkan => "Vulkan",
            wgpu::Backend::Metal => "Metal",
            wgpu::Backend::Dx12 => "DX12",
            _ => "other",
        }
    }

    /// The pipeline `name` (see `kernels::source`), compiled on first use.
    pub fn pipeline(&mut self, name: &str) -> Result<wgpu::ComputePipeline, String> {
        if let Some(p) = self.pipelines.get(name) {
            return Ok(p.clone());
        }
        let src = kernels::source(name, self.f64).ok_or_else(|| format!("no kernel {name}"))?;
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(name),
                source: wgpu::ShaderSource::Wgsl(src.into()),
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(name),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(format!("compiling kernel {name}: {e}"));
        }
        self.pipelines.insert(name.to_string(), pipeline.clone());
        Ok(pipeline)
    }
}

//! The GPU as the host side sees it: whether one can be used at all ([`unavailable`]), and
//! an opened device ([`Gpu`]) with its queue, limits and pipelines (created on first use,
//! then kept).
//!
//! Adapter choice: discrete, then integrated, then virtual GPUs. A CPU ("software") adapter
//! such as Mesa's llvmpipe (lavapipe) is slower than Prima's own CPU backend, so it is used
//! only when `PRIMA_WGPU_ALLOW_SOFTWARE=1` asks for it — the tests set it, to run the
//! kernels on machines without a GPU.

use std::collections::HashMap;

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

/// The adapter the backend would use, or why there is none.
fn pick_adapter() -> Result<Adapter, String> {
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

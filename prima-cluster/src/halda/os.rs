//! How each operating system treats mmapped weights under memory pressure — the part of
//! the LDA model that differs per platform (the paper's Cases 1–4) — as Halda sees it.
//!
//! The behaviours themselves live in OS memory plugins (`plugins/os-memory` holds Linux,
//! macOS with and without Metal, and Android; see `prima_abi::os`), so a new OS is
//! a new plugin. This module is the adapter: [`MemoryBehaviour`] asks a plugin's model the
//! questions Halda has, in Halda's types, and [`MemoryModels`] is where Halda gets one for
//! a device. The planner never matches on the OS itself.

use std::sync::Arc;

use serde::Serialize;

use crate::profile::{DeviceProfile, GpuKind};
use prima_abi::os::{DeviceMemory, OsGpu, OsMemoryModelBox, OverloadSet};
use prima_core::plugin::LoadedOsModels;

pub use prima_abi::os::{MemoryTerms, RamForm};

/// The paper's device sets: M1 (macOS without Metal, overloaded), M2 (macOS with Metal,
/// overloaded), M3 (Linux and Android, overloaded), M4 (enough RAM, or a slow disk).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum LdaSet {
    M1,
    M2,
    M3,
    M4,
}

impl LdaSet {
    pub fn name(self) -> &'static str {
        match self {
            LdaSet::M1 => "M1",
            LdaSet::M2 => "M2",
            LdaSet::M3 => "M3",
            LdaSet::M4 => "M4",
        }
    }
}

/// Where Halda gets a device's memory behaviour: the loaded OS memory plugins, or a test
/// double.
pub trait MemoryModels {
    /// The behaviour of `d`'s platform, or why there is none (the message names the OS
    /// and the plugins found).
    fn behaviour_for(&self, d: &DeviceProfile) -> Result<MemoryBehaviour, String>;
}

impl MemoryModels for LoadedOsModels {
    fn behaviour_for(&self, d: &DeviceProfile) -> Result<MemoryBehaviour, String> {
        let (model, _plugin) = self.model(d.os.name(), os_gpu(d.gpu))?;
        Ok(MemoryBehaviour::from_plugin(model))
    }
}

/// A device whose platform no OS memory plugin describes.
#[derive(Debug, thiserror::Error)]
#[error("device '{device}': {reason}")]
pub struct NoMemoryModel {
    pub device: String,
    pub reason: String,
}

/// One platform's reclamation and reload behaviour: a plugin's model behind Halda's types.
#[derive(Clone)]
pub struct MemoryBehaviour {
    name: String,
    model: Arc<OsMemoryModelBox>,
}

impl MemoryBehaviour {
    pub fn from_plugin(model: OsMemoryModelBox) -> MemoryBehaviour {
        MemoryBehaviour {
            name: model.name().into_string(),
            model: Arc::new(model),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The set a device of this platform is in when its RAM is overloaded.
    pub fn overload_set(&self) -> LdaSet {
        match self.model.overload_set() {
            OverloadSet::M1 => LdaSet::M1,
            OverloadSet::M2 => LdaSet::M2,
            OverloadSet::M3 => LdaSet::M3,
        }
    }

    /// s_m^{disk}: the read throughput mmap reloads see on this platform.
    pub fn disk_bytes_per_s(&self, d: &DeviceProfile) -> f64 {
        self.model.disk_bytes_per_s(&device_memory(d))
    }

    /// Memory the model may use before the OS evicts weight pages: d_m^{avail},
    /// d_{m,metal}^{avail}, or d_m^{avail} + d_m^{swapout}.
    pub fn budget_bytes(&self, d: &DeviceProfile) -> f64 {
        self.model.budget_bytes(&device_memory(d))
    }

    /// How RAM use grows with w_m and n_m.
    pub fn ram_form(&self, t: &MemoryTerms) -> RamForm {
        self.model.ram_form(t)
    }

    /// Bytes reloaded from disk per token when `l` layers (`l_gpu` of them on the GPU) run
    /// here with `budget` bytes of memory; 0 when everything stays resident.
    pub fn reload_bytes(&self, l: f64, l_gpu: f64, t: &MemoryTerms, budget: f64) -> f64 {
        self.model.reload_bytes(l, l_gpu, t, budget)
    }

    /// For an overloaded device: the objective coefficients (a_m, b_m) from α_m and β_m,
    /// and this device's share of κ.
    pub fn overloaded_coefficients(
        &self,
        alpha: f64,
        beta: f64,
        t: &MemoryTerms,
        s_disk: f64,
        budget: f64,
    ) -> (f64, f64, f64) {
        let c = self
            .model
            .overloaded_coefficients(alpha, beta, t, s_disk, budget);
        (c.a, c.b, c.kappa)
    }

    /// RAM use of a placement, by [`MemoryBehaviour::ram_form`].
    pub fn ram_bytes(&self, l: f64, l_gpu: f64, t: &MemoryTerms) -> f64 {
        self.ram_form(t).ram_bytes(l, l_gpu, t)
    }
}

fn os_gpu(gpu: GpuKind) -> OsGpu {
    match gpu {
        GpuKind::None => OsGpu::None,
        GpuKind::Cuda => OsGpu::Cuda,
        GpuKind::Metal => OsGpu::Metal,
    }
}

/// The figures of `d` a memory model may read.
pub fn device_memory(d: &DeviceProfile) -> DeviceMemory {
    DeviceMemory {
        gpu: os_gpu(d.gpu),
        ram_total_gib: d.ram_total_gib,
        ram_available_gib: d.ram_available_gib,
        swap_total_gib: d.swap_total_gib,
        swap_available_gib: d.swap_available_gib,
        swappable_gib: d.swappable_gib,
        gpu_available_gib: d.gpu_available_gib,
        disk_seq_gb_s: d.disk_seq_gb_s,
        disk_rand_gb_s: d.disk_rand_gb_s,
    }
}

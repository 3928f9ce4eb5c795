//! How each operating system treats mmapped weights under memory pressure — the part of
//! the LDA model that differs per platform (the paper's Cases 1–4).
//!
//! Each OS is one implementation of [`MemoryBehaviour`] in its own file; adding an OS is
//! one new file and one arm in [`behaviour_for`]. The planner never matches on the OS
//! itself.

mod android;
mod linux;
mod macos;

use serde::Serialize;

use crate::profile::{DeviceProfile, GpuKind, Os};

pub use android::Android;
pub use linux::Linux;
pub use macos::{MacosMetal, MacosNoMetal};

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

/// Model-side bytes one device's memory behaviour depends on.
#[derive(Debug, Clone, Copy)]
pub struct MemoryTerms {
    /// b: weight bytes of one layer.
    pub b: f64,
    /// b' = b + 2(h_k·e_k + h_v·e_v)·n_kv.
    pub b_prime: f64,
    /// (b_i/V + b_o)·𝕀_{m=1}: the input row and output layer, on the head only.
    pub io: f64,
    /// c^{cpu}.
    pub c_cpu: f64,
    /// c^{gpu}.
    pub c_gpu: f64,
}

impl MemoryTerms {
    /// b_m^{cio} = (b_i/V + b_o)·𝕀_{m=1} + c^{cpu}.
    pub fn b_cio(&self) -> f64 {
        self.io + self.c_cpu
    }
}

/// The linear form of a device's RAM use: `k·b'·(w·w_m + n·n_m) + b_cio + extra`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RamForm {
    pub w: f64,
    pub n: f64,
    pub extra: f64,
}

/// One platform's reclamation and reload behaviour.
pub trait MemoryBehaviour: Sync {
    fn name(&self) -> &'static str;

    /// The set a device of this platform is in when its RAM is overloaded.
    fn overload_set(&self) -> LdaSet;

    /// s_m^{disk}: the read throughput mmap reloads see on this platform.
    fn disk_bytes_per_s(&self, d: &DeviceProfile) -> f64;

    /// Memory the model may use before the OS evicts weight pages: d_m^{avail},
    /// d_{m,metal}^{avail}, or d_m^{avail} + d_m^{swapout}.
    fn budget_bytes(&self, d: &DeviceProfile) -> f64;

    /// How RAM use grows with w_m and n_m.
    fn ram_form(&self, t: &MemoryTerms) -> RamForm;

    /// Bytes reloaded from disk per token when `l` layers (`l_gpu` of them on the GPU) run
    /// here with `budget` bytes of memory; 0 when everything stays resident.
    fn reload_bytes(&self, l: f64, l_gpu: f64, t: &MemoryTerms, budget: f64) -> f64;

    /// For an overloaded device: the objective coefficients (a_m, b_m) from α_m and β_m,
    /// and this device's share of κ.
    fn overloaded_coefficients(
        &self,
        alpha: f64,
        beta: f64,
        t: &MemoryTerms,
        s_disk: f64,
        budget: f64,
    ) -> (f64, f64, f64);

    /// RAM use of a placement, by [`MemoryBehaviour::ram_form`].
    fn ram_bytes(&self, l: f64, l_gpu: f64, t: &MemoryTerms) -> f64 {
        let f = self.ram_form(t);
        t.b_prime * (f.w * l + f.n * l_gpu) + t.b_cio() + f.extra
    }
}

/// Linux, macOS without Metal and Android evict mmapped pages a few at a time, so only the
/// overflow is reloaded: `max(RAM use − budget, 0)` bytes per token.
fn incremental_reload(ram: f64, budget: f64) -> f64 {
    (ram - budget).max(0.0)
}

/// The coefficients of an incrementally reclaiming device (Cases 1 and 3):
/// a = α + f_w·b'/s, b = β + f_n·b'/s, κ share = (c^{cpu} − budget)/s.
fn incremental_coefficients(
    f: RamForm,
    alpha: f64,
    beta: f64,
    t: &MemoryTerms,
    s_disk: f64,
    budget: f64,
) -> (f64, f64, f64) {
    (
        alpha + f.w * t.b_prime / s_disk,
        beta + f.n * t.b_prime / s_disk,
        (t.c_cpu + f.extra - budget) / s_disk,
    )
}

/// The behaviour of a device's platform.
pub fn behaviour_for(d: &DeviceProfile) -> &'static dyn MemoryBehaviour {
    match (d.os, d.gpu) {
        (Os::Macos, GpuKind::Metal) => &MacosMetal,
        (Os::Macos, _) => &MacosNoMetal,
        (Os::Linux, _) => &Linux,
        (Os::Android, _) => &Android,
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{QuantRates, GB, GIB};

    fn device(os: Os, gpu: GpuKind) -> DeviceProfile {
        DeviceProfile {
            name: "d".into(),
            os,
            gpu,
            cpu_cores: 4,
            cpu_gflops: QuantRates::uniform(100.0),
            gpu_gflops: None,
            cpu_read_gb_s: 20.0,
            gpu_read_gb_s: None,
            memcpy_gb_s: 10.0,
            gpu_memcpy_gb_s: None,
            gpu_copy_ms: 0.0,
            ram_total_gib: 16.0,
            ram_available_gib: 4.0,
            swap_total_gib: 4.0,
            swap_available_gib: 2.0,
            swappable_gib: 1.0,
            gpu_available_gib: 6.0,
            disk_seq_gb_s: 2.0,
            disk_rand_gb_s: 0.5,
            link: None,
            relay: false,
        }
    }

    const TERMS: MemoryTerms = MemoryTerms {
        b: 0.5 * GIB,
        b_prime: 0.5 * GIB + 16.0 * 1024.0 * 1024.0,
        io: 0.6 * GIB,
        c_cpu: 0.1 * GIB,
        c_gpu: 0.05 * GIB,
    };

    #[test]
    fn each_platform_has_its_budget_disk_and_set() {
        let linux = device(Os::Linux, GpuKind::Cuda);
        let android = device(Os::Android, GpuKind::None);
        let mac = device(Os::Macos, GpuKind::None);
        let metal = device(Os::Macos, GpuKind::Metal);
        assert_eq!(behaviour_for(&linux).overload_set(), LdaSet::M3);
        assert_eq!(behaviour_for(&android).overload_set(), LdaSet::M3);
        assert_eq!(behaviour_for(&mac).overload_set(), LdaSet::M1);
        assert_eq!(behaviour_for(&metal).overload_set(), LdaSet::M2);
        // Linux reloads sequentially, macOS with page-sized random reads.
        assert_eq!(behaviour_for(&linux).disk_bytes_per_s(&linux), 2.0 * GB);
        assert_eq!(behaviour_for(&mac).disk_bytes_per_s(&mac), 0.5 * GB);
        // Android's budget includes what it can swap out: min(1, 2) GiB.
        assert_eq!(behaviour_for(&android).budget_bytes(&android), 5.0 * GIB);
        assert_eq!(behaviour_for(&metal).budget_bytes(&metal), 6.0 * GIB);
    }

    #[test]
    fn linux_reloads_only_the_overflow_of_cpu_layers() {
        let d = device(Os::Linux, GpuKind::Cuda);
        let b = behaviour_for(&d);
        let budget = b.budget_bytes(&d);
        // 10 layers, 6 of them on the GPU: 4 CPU layers fit in 4 GiB with buffers.
        assert_eq!(b.reload_bytes(10.0, 6.0, &TERMS, budget), 0.0);
        // 10 CPU layers do not: the overflow is reloaded.
        let ram = 10.0 * TERMS.b_prime + TERMS.io + TERMS.c_cpu;
        assert!((b.reload_bytes(10.0, 0.0, &TERMS, budget) - (ram - budget)).abs() < 1.0);
    }

    #[test]
    fn metal_reloads_everything_once_over_budget() {
        let d = device(Os::Macos, GpuKind::Metal);
        let b = behaviour_for(&d);
        let budget = b.budget_bytes(&d);
        assert_eq!(b.reload_bytes(8.0, 8.0, &TERMS, budget), 0.0);
        let over = b.reload_bytes(12.0, 12.0, &TERMS, budget);
        assert!((over - (12.0 * TERMS.b + TERMS.io)).abs() < 1.0);
    }

    /// The linear objective terms of an overloaded device price exactly the bytes its
    /// reload formula gives, per token (the identity the set iteration relies on).
    #[test]
    fn overloaded_coefficients_price_the_reload() {
        for (os, gpu) in [
            (Os::Linux, GpuKind::Cuda),
            (Os::Android, GpuKind::None),
            (Os::Macos, GpuKind::None),
            (Os::Macos, GpuKind::Metal),
        ] {
            let d = device(os, gpu);
            let b = behaviour_for(&d);
            let s = b.disk_bytes_per_s(&d);
            let budget = b.budget_bytes(&d);
            let (a, bb, share) = b.overloaded_coefficients(1.0, 2.0, &TERMS, s, budget);
            let (l, lg) = if gpu == GpuKind::None {
                (30.0, 0.0)
            } else {
                (30.0, 3.0)
            };
            let linear = (a - 1.0) * l + (bb - 2.0) * lg + share;
            // κ's head term carries the io bytes (b_i/V + b_o) of an overloaded head.
            let expected = (b.reload_bytes(l, lg, &TERMS, budget) - TERMS.io) / s;
            assert!(
                (linear - expected).abs() < 1e-9 * expected.abs().max(1.0),
                "{}: {linear} vs {expected}",
                b.name()
            );
        }
    }
}

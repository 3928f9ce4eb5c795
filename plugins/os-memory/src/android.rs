//! Android (Case 3): like Linux, but the OS first swaps out other apps' cold pages, so the
//! model gets d_m^{avail} + d_m^{swapout} before its own pages are evicted.
//!
//! d_m^{swapout} = min(overflow, min(d^{bytes_can_swap}, d^{swap_avail})); as a budget we
//! use its upper bound min(d^{bytes_can_swap}, d^{swap_avail}), which gives the same
//! reload volume: below it nothing is reloaded either way.

use abi_stable::std_types::RString;
use prima_abi::os::{
    DeviceMemory, MemoryTerms, OsMemoryModel, OverloadSet, OverloadedCoefficients, RamForm,
};
use prima_host::{GB, GIB};

use crate::{incremental_coefficients, incremental_reload};

pub struct Android;

impl OsMemoryModel for Android {
    fn name(&self) -> RString {
        RString::from("android")
    }

    fn overload_set(&self) -> OverloadSet {
        OverloadSet::M3
    }

    fn disk_bytes_per_s(&self, d: &DeviceMemory) -> f64 {
        d.disk_seq_gb_s * GB
    }

    fn budget_bytes(&self, d: &DeviceMemory) -> f64 {
        // d_m^{avail} + d_m^{swapout}
        let swapout = d.swappable_gib.min(d.swap_available_gib);
        (d.ram_available_gib + swapout) * GIB
    }

    fn ram_form(&self, _t: &MemoryTerms) -> RamForm {
        RamForm {
            w: 1.0,
            n: -1.0,
            extra: 0.0,
        }
    }

    fn reload_bytes(&self, l: f64, l_gpu: f64, t: &MemoryTerms, budget: f64) -> f64 {
        incremental_reload(self.ram_form(t).ram_bytes(l, l_gpu, t), budget)
    }

    fn overloaded_coefficients(
        &self,
        alpha: f64,
        beta: f64,
        t: &MemoryTerms,
        s_disk: f64,
        budget: f64,
    ) -> OverloadedCoefficients {
        incremental_coefficients(self.ram_form(t), alpha, beta, t, s_disk, budget)
    }
}

//! Windows (Case 3, with random-read reloads). A mapped view's pages are in the process's
//! working set; under memory pressure the memory manager trims working sets a few pages at
//! a time, oldest first, to the standby list, and only pages repurposed from there leave
//! memory. So, as on Linux, only the overflow is reloaded. But a hard fault on a mapped
//! file reads a small cluster of pages around it (page-fault clustering, tens of KiB), not
//! Linux's readahead window, so reloads run at the disk's random-read rate, as on macOS.
//! CUDA (WDDM) keeps the weights it holds in VRAM, so only CPU layers occupy RAM.
//! "Available" memory (`GlobalMemoryStatusEx`, free + zeroed + standby) is the budget.

use abi_stable::std_types::RString;
use prima_abi::os::{
    DeviceMemory, MemoryTerms, OsMemoryModel, OverloadSet, OverloadedCoefficients, RamForm,
};
use prima_host::GB;

use crate::Linux;

/// Linux's model (gradual reclaim, only the overflow reloaded, the available memory as
/// the budget), reloading at the random-read rate.
pub struct Windows;

impl OsMemoryModel for Windows {
    fn name(&self) -> RString {
        RString::from("windows")
    }

    fn disk_bytes_per_s(&self, d: &DeviceMemory) -> f64 {
        d.disk_rand_gb_s * GB
    }

    fn overload_set(&self) -> OverloadSet {
        Linux.overload_set()
    }

    fn budget_bytes(&self, d: &DeviceMemory) -> f64 {
        Linux.budget_bytes(d)
    }

    fn ram_form(&self, t: &MemoryTerms) -> RamForm {
        Linux.ram_form(t)
    }

    fn reload_bytes(&self, l: f64, l_gpu: f64, t: &MemoryTerms, budget: f64) -> f64 {
        Linux.reload_bytes(l, l_gpu, t, budget)
    }

    fn overloaded_coefficients(
        &self,
        alpha: f64,
        beta: f64,
        t: &MemoryTerms,
        s_disk: f64,
        budget: f64,
    ) -> OverloadedCoefficients {
        Linux.overloaded_coefficients(alpha, beta, t, s_disk, budget)
    }
}

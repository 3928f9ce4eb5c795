//! Linux (Case 3): the kernel reclaims mmapped pages gradually and mmap is advised for
//! sequential access, so reloads run at the disk's sequential read rate. CUDA locks the
//! weights it holds in VRAM, so only CPU layers occupy RAM.

use abi_stable::std_types::RString;
use prima_abi::os::{
    DeviceMemory, MemoryTerms, OsMemoryModel, OverloadSet, OverloadedCoefficients, RamForm,
};
use prima_host::{GB, GIB};

use crate::{incremental_coefficients, incremental_reload};

pub struct Linux;

impl OsMemoryModel for Linux {
    fn name(&self) -> RString {
        RString::from("linux")
    }

    fn overload_set(&self) -> OverloadSet {
        OverloadSet::M3
    }

    fn disk_bytes_per_s(&self, d: &DeviceMemory) -> f64 {
        d.disk_seq_gb_s * GB
    }

    fn budget_bytes(&self, d: &DeviceMemory) -> f64 {
        // d_m^{avail}
        d.ram_available_gib * GIB
    }

    fn ram_form(&self, _t: &MemoryTerms) -> RamForm {
        // (l_m − l_m^{gpu})·b' + b_cio
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
        // a = α + b'/s, b = β − b'/s (M3 column of the paper's a, b vectors)
        incremental_coefficients(self.ram_form(t), alpha, beta, t, s_disk, budget)
    }
}

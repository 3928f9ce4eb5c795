//! macOS, with and without Metal (Cases 1 and 2). Reloads on macOS are page-sized random
//! reads, so both use the disk's random-read rate.
//!
//! Without Metal (M1) pages are reclaimed gradually, as on Linux, but every layer lives
//! in RAM (there is no GPU). With Metal (M2) the weights sit in shared memory the OS keeps
//! until memory is exhausted; past that it drops them wholesale, so an overloaded device
//! reloads all of its weights, l_m·b (+ b_i/V + b_o on the head), every token.

use abi_stable::std_types::RString;
use prima_abi::os::{
    DeviceMemory, MemoryTerms, OsMemoryModel, OverloadSet, OverloadedCoefficients, RamForm,
};
use prima_host::{GB, GIB};

use crate::{incremental_coefficients, incremental_reload};

pub struct MacosNoMetal;

pub struct MacosMetal;

impl OsMemoryModel for MacosNoMetal {
    fn name(&self) -> RString {
        RString::from("macos")
    }

    fn overload_set(&self) -> OverloadSet {
        OverloadSet::M1
    }

    fn disk_bytes_per_s(&self, d: &DeviceMemory) -> f64 {
        d.disk_rand_gb_s * GB
    }

    fn budget_bytes(&self, d: &DeviceMemory) -> f64 {
        d.ram_available_gib * GIB
    }

    fn ram_form(&self, _t: &MemoryTerms) -> RamForm {
        // l_m·b' + b_cio (n_m = 0: no GPU)
        RamForm {
            w: 1.0,
            n: 0.0,
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
        // a = α + b'/s, b = 0 (M1)
        let c = incremental_coefficients(self.ram_form(t), alpha, beta, t, s_disk, budget);
        OverloadedCoefficients { b: 0.0, ..c }
    }
}

impl OsMemoryModel for MacosMetal {
    fn name(&self) -> RString {
        RString::from("macos+metal")
    }

    fn overload_set(&self) -> OverloadSet {
        OverloadSet::M2
    }

    fn disk_bytes_per_s(&self, d: &DeviceMemory) -> f64 {
        d.disk_rand_gb_s * GB
    }

    fn budget_bytes(&self, d: &DeviceMemory) -> f64 {
        // d_{m,metal}^{avail}: Metal's recommended working set (bounded by free memory).
        d.gpu_available_gib * GIB
    }

    fn ram_form(&self, t: &MemoryTerms) -> RamForm {
        // l_m·b' + b_cio + c^{gpu}: CPU and GPU layers share the unified memory.
        RamForm {
            w: 1.0,
            n: 0.0,
            extra: t.c_gpu,
        }
    }

    fn reload_bytes(&self, l: f64, l_gpu: f64, t: &MemoryTerms, budget: f64) -> f64 {
        if self.ram_form(t).ram_bytes(l, l_gpu, t) > budget {
            l * t.b + t.io
        } else {
            0.0
        }
    }

    fn overloaded_coefficients(
        &self,
        alpha: f64,
        beta: f64,
        t: &MemoryTerms,
        s_disk: f64,
        _budget: f64,
    ) -> OverloadedCoefficients {
        // a = α + b/s, b = β (M2); the head's b_i/V + b_o reload is in κ's head term.
        OverloadedCoefficients {
            a: alpha + t.b / s_disk,
            b: beta,
            kappa: 0.0,
        }
    }
}

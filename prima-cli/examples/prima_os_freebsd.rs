//! Test fixture (`tests/os_plugin.rs`): an OS memory plugin built apart from `prima` that
//! covers an OS the standard plugin does not, to show a new OS is picked up from the
//! plugin directory without rebuilding `prima`. Its model is a stand-in — Linux's Case 3
//! (gradual reclaim, sequential reloads of the overflow) under the name `freebsd` — not a
//! measured description of FreeBSD.

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RResult, RStr, RString, RVec};
use prima_abi::os::{
    DeviceMemory, MemoryTerms, OsGpu, OsMemoryModel, OsMemoryModelBox, OsMemoryModel_TO,
    OverloadSet, OverloadedCoefficients, RamForm,
};
use prima_cluster::profile::{GB, GIB};

prima_abi::export_os_memory_plugin!(name = "freebsd-test", covers = covers, model = model);

extern "C" fn covers() -> RVec<RString> {
    RVec::from(vec![RString::from("freebsd")])
}

extern "C" fn model(os: RStr<'_>, gpu: OsGpu) -> RResult<OsMemoryModelBox, RString> {
    match (os.as_str(), gpu) {
        (_, OsGpu::Metal) => RResult::RErr(RString::from("FreeBSD has no Metal")),
        ("freebsd", _) => RResult::ROk(OsMemoryModel_TO::from_value(FreeBSD, TD_Opaque)),
        (other, _) => RResult::RErr(RString::from(format!("covers freebsd, not '{other}'"))),
    }
}

struct FreeBSD;

impl OsMemoryModel for FreeBSD {
    fn name(&self) -> RString {
        RString::from("freebsd")
    }

    fn overload_set(&self) -> OverloadSet {
        OverloadSet::M3
    }

    fn disk_bytes_per_s(&self, d: &DeviceMemory) -> f64 {
        d.disk_seq_gb_s * GB
    }

    fn budget_bytes(&self, d: &DeviceMemory) -> f64 {
        d.ram_available_gib * GIB
    }

    fn ram_form(&self, _t: &MemoryTerms) -> RamForm {
        RamForm {
            w: 1.0,
            n: -1.0,
            extra: 0.0,
        }
    }

    fn reload_bytes(&self, l: f64, l_gpu: f64, t: &MemoryTerms, budget: f64) -> f64 {
        (self.ram_form(t).ram_bytes(l, l_gpu, t) - budget).max(0.0)
    }

    fn overloaded_coefficients(
        &self,
        alpha: f64,
        beta: f64,
        t: &MemoryTerms,
        s_disk: f64,
        budget: f64,
    ) -> OverloadedCoefficients {
        let f = self.ram_form(t);
        OverloadedCoefficients {
            a: alpha + f.w * t.b_prime / s_disk,
            b: beta + f.n * t.b_prime / s_disk,
            kappa: (t.c_cpu + f.extra - budget) / s_disk,
        }
    }
}

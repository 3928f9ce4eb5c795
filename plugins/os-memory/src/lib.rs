//! Prima's OS memory plugin: how Linux, macOS (with and without Metal), Android and Windows treat a
//! model's mmapped weights under memory pressure — the paper's Cases 1–3, the part of
//! Halda's LDA model that differs per platform (`prima_abi::os`).
//!
//! One file per OS, each an [`OsMemoryModel`]; [`model`] picks one for an OS and GPU. A
//! further OS ships as a plugin of its own, beside this one.

mod android;
mod linux;
mod macos;
mod windows;

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RResult, RStr, RString, RVec};
use prima_abi::os::{
    MemoryTerms, OsGpu, OsMemoryModelBox, OsMemoryModel_TO, OverloadedCoefficients, RamForm,
};

pub use android::Android;
pub use linux::Linux;
pub use macos::{MacosMetal, MacosNoMetal};
pub use windows::Windows;

prima_abi::export_os_memory_plugin!(name = "standard", covers = covers, model = model);

/// The OS names this plugin has models for.
pub const COVERS: [&str; 4] = ["linux", "macos", "android", "windows"];

extern "C" fn covers() -> RVec<RString> {
    COVERS.iter().map(|&os| RString::from(os)).collect()
}

/// The model of a device running `os` with `gpu`: macOS with Metal is Case 2, without it
/// Case 1; Linux, Android and Windows are Case 3 whatever their GPU (Windows has no Metal).
pub extern "C" fn model(os: RStr<'_>, gpu: OsGpu) -> RResult<OsMemoryModelBox, RString> {
    let boxed = |m| RResult::ROk(m);
    match (os.as_str(), gpu) {
        ("macos", OsGpu::Metal) => boxed(OsMemoryModel_TO::from_value(MacosMetal, TD_Opaque)),
        ("macos", _) => boxed(OsMemoryModel_TO::from_value(MacosNoMetal, TD_Opaque)),
        ("linux", _) => boxed(OsMemoryModel_TO::from_value(Linux, TD_Opaque)),
        ("android", _) => boxed(OsMemoryModel_TO::from_value(Android, TD_Opaque)),
        ("windows", OsGpu::Metal) => RResult::RErr(RString::from("Windows has no Metal")),
        ("windows", _) => boxed(OsMemoryModel_TO::from_value(Windows, TD_Opaque)),
        (other, _) => RResult::RErr(RString::from(format!(
            "this plugin covers {}, not '{other}'",
            COVERS.join(", ")
        ))),
    }
}

/// Linux, macOS without Metal, Android and Windows evict mmapped pages a few at a time, so only the
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
) -> OverloadedCoefficients {
    OverloadedCoefficients {
        a: alpha + f.w * t.b_prime / s_disk,
        b: beta + f.n * t.b_prime / s_disk,
        kappa: (t.c_cpu + f.extra - budget) / s_disk,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi_stable::std_types::RStr;
    use prima_cluster::halda::os::{device_memory, LdaSet, MemoryBehaviour};
    use prima_cluster::profile::{DeviceProfile, GpuKind, Os, QuantRates, GB, GIB};

    /// The behaviour Halda gets for `d`: this plugin's model behind the engine's adapter.
    fn behaviour_for(d: &DeviceProfile) -> MemoryBehaviour {
        match model(RStr::from_str(d.os.name()), device_memory(d).gpu) {
            RResult::ROk(m) => MemoryBehaviour::from_plugin(m),
            RResult::RErr(e) => panic!("{e}"),
        }
    }

    fn device(os: Os, gpu: GpuKind) -> DeviceProfile {
        DeviceProfile {
            name: "d".into(),
            os,
            gpu,
            cpu_cores: 4,
            cpu_gflops: QuantRates::uniform(100.0),
            cpu_quota_share: None,
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
        let windows = device(Os::named("windows"), GpuKind::Cuda);
        assert_eq!(behaviour_for(&linux).overload_set(), LdaSet::M3);
        assert_eq!(behaviour_for(&windows).overload_set(), LdaSet::M3);
        // Windows reloads a fault's small cluster of pages: the random-read rate.
        assert_eq!(behaviour_for(&windows).disk_bytes_per_s(&windows), 0.5 * GB);
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
            (Os::named("windows"), GpuKind::Cuda),
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

#[cfg(test)]
mod covering {
    use super::*;

    #[test]
    fn covers_four_oses_and_refuses_others_by_name() {
        let names: Vec<String> = covers().into_iter().map(RString::into_string).collect();
        assert_eq!(names, ["linux", "macos", "android", "windows"]);
        match model(RStr::from_str("freebsd"), OsGpu::None) {
            RResult::RErr(e) => assert!(e.contains("'freebsd'"), "{e}"),
            RResult::ROk(_) => panic!("freebsd is not covered here"),
        }
        assert!(model(RStr::from_str("windows"), OsGpu::Metal).is_err());
        let metal = model(RStr::from_str("macos"), OsGpu::Metal).unwrap();
        assert_eq!(metal.name().as_str(), "macos+metal");
    }
}

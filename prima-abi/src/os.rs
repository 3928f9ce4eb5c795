//! OS memory plugin ABI, version 1: how an operating system treats a model's mmapped
//! weights under memory pressure — the part of Halda's LDA model that differs per
//! platform (the paper's Cases 1–4).
//!
//! A plugin names the OSes it covers (`os = "linux"` in a device profile) and, for an OS
//! and a GPU kind, hands Halda an [`OsMemoryModel`]: which set (M1–M3) an overloaded
//! device is in, its memory budget, the disk rate its reloads see, how its RAM use grows
//! with w_m and n_m, and how many bytes it reloads per token. Halda asks nothing else, so
//! a new OS (Windows, HarmonyOS) is a new plugin, not a new `prima`.
//!
//! Every type derives `StableAbi`; [`OS_MEMORY_ABI_VERSION`] is read before any layout
//! check and must be bumped whenever anything in this file changes meaning.

// abi_stable's `sabi_trait` expands to impls inside a const block.
#![allow(non_local_definitions)]

use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    package_version_strings, sabi_trait,
    sabi_types::VersionStrings,
    std_types::{RBox, RResult, RStr, RString, RVec},
    StableAbi,
};

/// Version of the OS memory ABI defined in this file.
pub const OS_MEMORY_ABI_VERSION: u32 = 1;

/// The GPU a device runs its GPU layers on, as far as memory is concerned.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OsGpu {
    None = 0,
    /// Private VRAM, locked by the driver (never paged).
    Cuda = 1,
    /// Unified memory shared with the CPU.
    Metal = 2,
}

impl OsGpu {
    pub fn name(self) -> &'static str {
        match self {
            OsGpu::None => "none",
            OsGpu::Cuda => "cuda",
            OsGpu::Metal => "metal",
        }
    }
}

/// The device figures a memory model may read (units as in a device profile: GiB and
/// 10⁹ bytes per second).
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct DeviceMemory {
    pub gpu: OsGpu,
    pub ram_total_gib: f64,
    /// d_m^{avail}.
    pub ram_available_gib: f64,
    pub swap_total_gib: f64,
    /// d_m^{swap_avail}.
    pub swap_available_gib: f64,
    /// d_m^{bytes_can_swap}: other apps' memory the OS may swap out for the model.
    pub swappable_gib: f64,
    /// d_{m,cuda}^{avail} or d_{m,metal}^{avail}.
    pub gpu_available_gib: f64,
    pub disk_seq_gb_s: f64,
    pub disk_rand_gb_s: f64,
}

/// Model-side bytes one device's memory behaviour depends on.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
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
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct RamForm {
    pub w: f64,
    pub n: f64,
    pub extra: f64,
}

impl RamForm {
    /// RAM use of `l` layers, `l_gpu` of them on the GPU. Both sides of the ABI compute it
    /// here, so Halda and a plugin agree to the bit.
    pub fn ram_bytes(&self, l: f64, l_gpu: f64, t: &MemoryTerms) -> f64 {
        t.b_prime * (self.w * l + self.n * l_gpu) + t.b_cio() + self.extra
    }
}

/// The paper's set a device is in when its RAM is overloaded: M1 (reclaimed gradually, no
/// GPU layers in the objective), M2 (dropped wholesale: everything reloads), M3
/// (reclaimed gradually, GPU layers outside RAM). M4, not overloaded, is Halda's own.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverloadSet {
    M1 = 1,
    M2 = 2,
    M3 = 3,
}

/// An overloaded device's objective coefficients (a_m, b_m) and its share of κ.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct OverloadedCoefficients {
    pub a: f64,
    pub b: f64,
    pub kappa: f64,
}

/// One platform's reclamation and reload behaviour: what Halda asks of an OS.
#[sabi_trait]
pub trait OsMemoryModel: Send + Sync {
    /// Short name for plans and messages, e.g. `linux`, `macos+metal`.
    fn name(&self) -> RString;

    /// The set a device of this platform is in when its RAM is overloaded.
    fn overload_set(&self) -> OverloadSet;

    /// s_m^{disk}: the read throughput mmap reloads see on this platform, bytes/s.
    fn disk_bytes_per_s(&self, d: &DeviceMemory) -> f64;

    /// Memory the model may use before the OS evicts weight pages, bytes: d_m^{avail},
    /// d_{m,metal}^{avail}, or d_m^{avail} + d_m^{swapout}.
    fn budget_bytes(&self, d: &DeviceMemory) -> f64;

    /// How RAM use grows with w_m and n_m.
    fn ram_form(&self, t: &MemoryTerms) -> RamForm;

    /// Bytes reloaded from disk per token when `l` layers (`l_gpu` of them on the GPU) run
    /// here with `budget` bytes of memory; 0 when everything stays resident.
    fn reload_bytes(&self, l: f64, l_gpu: f64, t: &MemoryTerms, budget: f64) -> f64;

    /// For an overloaded device: a_m and b_m from α_m and β_m, and this device's share
    /// of κ, pricing exactly the bytes `reload_bytes` gives (less the head's io bytes,
    /// which κ's head term carries).
    #[sabi(last_prefix_field)]
    fn overloaded_coefficients(
        &self,
        alpha: f64,
        beta: f64,
        t: &MemoryTerms,
        s_disk: f64,
        budget: f64,
    ) -> OverloadedCoefficients;
}

/// An owned memory model behind the ABI.
pub type OsMemoryModelBox = OsMemoryModel_TO<'static, RBox<()>>;

/// The root module an OS memory plugin exports.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = OsMemoryPluginRef)))]
#[sabi(missing_field(panic))]
pub struct OsMemoryPlugin {
    /// The plugin's name, e.g. `standard`.
    pub name: extern "C" fn() -> RString,
    /// The plugin crate's own version.
    pub plugin_version: extern "C" fn() -> RString,
    /// The OS names it has models for, as device profiles write them (`linux`, …).
    pub covers: extern "C" fn() -> RVec<RString>,
    /// The model for a device running `os` with `gpu`; an `Err` says why there is none
    /// (an OS it does not cover, or a GPU that OS cannot have). Never panics.
    #[sabi(last_prefix_field)]
    pub model: extern "C" fn(os: RStr<'_>, gpu: OsGpu) -> RResult<OsMemoryModelBox, RString>,
}

impl RootModule for OsMemoryPluginRef {
    declare_root_module_statics! {OsMemoryPluginRef}
    const BASE_NAME: &'static str = "prima_os_memory";
    const NAME: &'static str = "prima_os_memory";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

/// Exports an OS memory plugin from a `cdylib` crate.
///
/// ```ignore
/// prima_abi::export_os_memory_plugin!(name = "standard", covers = my_covers, model = my_model);
/// ```
/// where `my_covers: extern "C" fn() -> RVec<RString>` and
/// `my_model: extern "C" fn(RStr<'_>, OsGpu) -> RResult<OsMemoryModelBox, RString>`.
#[macro_export]
macro_rules! export_os_memory_plugin {
    (name = $name:expr, covers = $covers:path, model = $model:path) => {
        /// Read by the loader with plain `libloading` before any `abi_stable` check.
        #[no_mangle]
        pub extern "C" fn prima_plugin_abi_version() -> u32 {
            $crate::os::OS_MEMORY_ABI_VERSION
        }

        /// Which kind of plugin this library is.
        #[no_mangle]
        pub extern "C" fn prima_plugin_kind() -> u32 {
            $crate::PluginKind::OsMemory as u32
        }

        extern "C" fn __prima_plugin_name() -> ::abi_stable::std_types::RString {
            ::abi_stable::std_types::RString::from($name)
        }

        extern "C" fn __prima_plugin_version() -> ::abi_stable::std_types::RString {
            ::abi_stable::std_types::RString::from(env!("CARGO_PKG_VERSION"))
        }

        #[::abi_stable::export_root_module]
        pub fn __prima_os_memory_root() -> $crate::os::OsMemoryPluginRef {
            use ::abi_stable::prefix_type::PrefixTypeTrait;
            $crate::os::OsMemoryPlugin {
                name: __prima_plugin_name,
                plugin_version: __prima_plugin_version,
                covers: $covers,
                model: $model,
            }
            .leak_into_prefix()
        }
    };
}

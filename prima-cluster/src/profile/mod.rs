//! Measuring this device: the figures Halda plans with and benchmarks report against.
//!
//! [`DeviceProfile`] is the record Halda reads (measured here by [`profile_device`], or
//! written by hand for a testbed). Each measurement is quick and touches nothing outside
//! the process: no scratch files, no page-cache drops — the disk is measured by reading
//! the model file itself with the page cache bypassed. Memory and cores are what this
//! process may use: inside a container or cgroup, its limits, not the host's figures
//! ([`device_memory`], [`device_cores`]). Link figures to the next node are the ring's to
//! fill in.

mod compute;
mod device;
mod disk;
mod gpu;
mod measure;
mod memory;
mod probe_bufs;

// What the device has (cores, memory, cgroup limits) is read by `prima-host`, which the
// plugins share; re-exported so that a profile is one import.
pub use compute::{cpu_throughput, memcpy_rate};
pub use device::{
    DeviceProfile, DeviceProfiles, GpuKind, LinkProfile, Os, ProfilesError, QuantClass, QuantRates,
    GB, GIB,
};
pub use disk::{disk_read_rates, DiskRates};
pub use gpu::{measure_gpu, GpuMeasured, GpuProbe};
pub use measure::{
    cache_dir, profile_device, profile_device_with_gpu, profile_with, with_budget, ProfileError,
    ProfileOptions, ProfileReport, PROFILE_DIR_ENV,
};
pub use memory::{memory_read_bandwidth, MemoryBandwidth};
pub use prima_host::{
    affinity_cpus, apply_memory_limit, cgroup, cpu_model, cpu_quota, device_cores, device_memory,
    device_memory_in, effective_cores, home_dir, hostname, meminfo, memory_cgroups, memory_limit,
    parse_cpu_max, parse_meminfo, CgroupSources, CgroupVersion, CpuQuota, DeviceCores,
    DeviceMemory, MemInfo, MemoryLimit,
};

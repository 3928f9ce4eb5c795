//! Measuring this device: the figures Halda plans with and benchmarks report against.
//!
//! [`DeviceProfile`] is the record Halda reads (measured here by [`profile_device`], or
//! written by hand for a testbed). Each measurement is quick and touches nothing outside
//! the process: no scratch files, no page-cache drops — the disk is measured by reading
//! the model file itself with the page cache bypassed. Memory and cores are what this
//! process may use: inside a container or cgroup, its limits, not the host's figures
//! ([`device_memory`], [`device_cores`]). Link figures to the next node are the ring's to
//! fill in.

mod cgroup;
mod compute;
mod device;
mod disk;
mod gpu;
mod limits;
mod measure;
mod memory;
mod system;

pub use cgroup::{
    cpu_quota, memory_limit, parse_cpu_max, CgroupSources, CgroupVersion, CpuQuota, MemoryLimit,
};
pub use compute::{cpu_throughput, memcpy_rate};
pub use device::{
    DeviceProfile, DeviceProfiles, GpuKind, LinkProfile, Os, ProfilesError, QuantClass, QuantRates,
    GB, GIB,
};
pub use disk::{disk_read_rates, DiskRates};
pub use gpu::{measure_gpu, GpuMeasured, GpuProbe};
pub use limits::{
    affinity_cpus, apply_memory_limit, device_cores, device_memory, device_memory_in,
    effective_cores, memory_cgroups, DeviceCores, DeviceMemory,
};
pub use measure::{
    cache_dir, profile_device, profile_device_with_gpu, ProfileError, ProfileOptions,
    ProfileReport, PROFILE_DIR_ENV,
};
pub use memory::{memory_read_bandwidth, MemoryBandwidth};
pub use system::{home_dir, hostname, meminfo, parse_meminfo, MemInfo};

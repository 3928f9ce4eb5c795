//! Measuring this device: the figures Halda plans with and benchmarks report against.
//!
//! [`DeviceProfile`] is the record Halda reads (measured here by [`profile_device`], or
//! written by hand for a testbed). Each measurement is quick and touches nothing outside
//! the process: no scratch files, no page-cache drops — the disk is measured by reading
//! the model file itself with the page cache bypassed. Link figures to the next node are
//! the ring's to fill in.

mod compute;
mod device;
mod disk;
mod measure;
mod memory;
mod system;

pub use compute::{cpu_throughput, memcpy_rate};
pub use device::{
    DeviceProfile, DeviceProfiles, GpuKind, LinkProfile, Os, ProfilesError, QuantClass, QuantRates,
    GB, GIB,
};
pub use disk::{disk_read_rates, DiskRates};
pub use measure::{
    cache_dir, profile_device, ProfileError, ProfileOptions, ProfileReport, PROFILE_DIR_ENV,
};
pub use memory::{memory_read_bandwidth, MemoryBandwidth};
pub use system::{hostname, meminfo, parse_meminfo, MemInfo};

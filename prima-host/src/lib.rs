//! What this device has and may use: its cores and memory as the OS and any cgroup
//! limits grant them to this process, its hostname and home directory.
//!
//! The engine, the planner and the plugins all read these figures, so they live in a
//! crate of their own that depends on nothing of Prima's. Each call only reads OS facts
//! (`/proc`, cgroup files, sysctl, the Windows APIs). Not here: measuring speed (the
//! cluster's `profile` module) or anything a plan decides.

pub mod cgroup;
mod limits;
mod system;

pub use cgroup::{
    cpu_quota, memory_limit, parse_cpu_max, CgroupSources, CgroupVersion, CpuQuota, MemoryLimit,
};
pub use limits::{
    affinity_cpus, apply_memory_limit, device_cores, device_memory, device_memory_in,
    effective_cores, memory_cgroups, DeviceCores, DeviceMemory,
};
pub use system::{cpu_model, home_dir, hostname, meminfo, parse_meminfo, MemInfo};

/// Bytes in a GiB, as an `f64` for the planner's arithmetic.
pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
/// Bytes in a (decimal) GB.
pub const GB: f64 = 1e9;

/// Parses "4096", "512M", "1.5G", "2GiB" (units are powers of 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size (try 512M, 2G or a byte count)"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "'{text}': unknown size unit '{other}' (use K, M, G or T)"
            ))
        }
    };
    Ok((value * scale as f64).round() as u64)
}

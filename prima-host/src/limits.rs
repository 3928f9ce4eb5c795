//! This device's memory and cores as this process may use them: the host's figures
//! (/proc/meminfo, the CPUs the scheduler lets it run on) lowered by its cgroups' limits.
//!
//! The rules, kept here and tested as such rather than left to whichever library call
//! happens to apply them:
//! - memory: total = min(MemTotal, limit); available = min(MemAvailable, limit −
//!   usage that cannot be reclaimed), over every cgroup up to the root;
//! - cores: min(CPUs in the affinity mask, which the cpuset narrows; ⌈quota ÷ period⌉).

use std::sync::OnceLock;

use serde::Serialize;

use crate::cgroup::{
    cpu_quota, memory_limit_over, CgroupDir, CgroupSources, CpuQuota, MemoryLimit,
};
use crate::system::{meminfo, MemInfo};
use crate::GIB;

/// Memory figures and where they came from.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceMemory {
    /// What this process may use: the host's figures, lowered by `cgroup`.
    pub effective: MemInfo,
    /// /proc/meminfo as it stands.
    pub host: MemInfo,
    /// The tightest cgroup limit, where one is lower than the host's memory.
    pub cgroup: Option<MemoryLimit>,
}

/// The host's memory figures lowered by a cgroup limit (swap is left to the host's
/// figures).
pub fn apply_memory_limit(host: MemInfo, limit: Option<&MemoryLimit>) -> MemInfo {
    let Some(limit) = limit else { return host };
    let gib = |bytes: u64| bytes as f64 / GIB;
    let total = host.total_gib.min(gib(limit.limit_bytes));
    MemInfo {
        total_gib: total,
        available_gib: host
            .available_gib
            .min(gib(limit.available_bytes))
            .min(total),
        ..host
    }
}

/// This device's memory: /proc/meminfo (an error where it cannot be read) lowered by the
/// cgroups in `chain`.
pub fn device_memory_in(chain: &[CgroupDir]) -> Result<DeviceMemory, String> {
    let host = meminfo()?;
    let cgroup = memory_limit_over(chain).filter(|l| (l.limit_bytes as f64 / GIB) < host.total_gib);
    Ok(DeviceMemory {
        effective: apply_memory_limit(host, cgroup.as_ref()),
        host,
        cgroup,
    })
}

/// This device's memory, its cgroups located afresh.
pub fn device_memory() -> Result<DeviceMemory, String> {
    device_memory_in(&CgroupSources::this_process().chain("memory"))
}

/// This process's memory cgroups, located once: the ring samples memory every pass and
/// a process does not change cgroups under a running node.
pub fn memory_cgroups() -> &'static [CgroupDir] {
    static CHAIN: OnceLock<Vec<CgroupDir>> = OnceLock::new();
    CHAIN.get_or_init(|| CgroupSources::this_process().chain("memory"))
}

/// Cores and where the count came from.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceCores {
    /// Threads worth running at once: [`effective_cores`].
    pub cores: usize,
    /// CPUs in this process's affinity mask (the cpuset's CPUs inside a cgroup).
    pub affinity_cpus: usize,
    /// The tightest CPU quota, where there is one.
    pub cgroup: Option<CpuQuota>,
}

impl DeviceCores {
    /// The share of its `cores` threads' full speed a CPU quota lets through over time:
    /// quota ÷ period ÷ cores, at most 1 (0.15 for 15 ms a 100 ms period on one thread).
    /// The compute probe runs in slices shorter than a period and keeps the fastest, so
    /// it sees the cores unthrottled; its figure is scaled by this.
    pub fn quota_share(&self) -> f64 {
        match &self.cgroup {
            Some(q) if q.period_us > 0 => (q.cores() / self.cores.max(1) as f64).clamp(0.01, 1.0),
            _ => 1.0,
        }
    }
}

/// min(affinity CPUs, ⌈quota ÷ period⌉), at least 1.
pub fn effective_cores(affinity_cpus: usize, quota: Option<&CpuQuota>) -> usize {
    let by_quota = quota.map_or(usize::MAX, CpuQuota::whole_cores);
    affinity_cpus.min(by_quota).max(1)
}

/// This device's cores: the affinity mask lowered by the cgroups' CPU quota.
pub fn device_cores() -> DeviceCores {
    let affinity_cpus = affinity_cpus();
    let cgroup = cpu_quota(&CgroupSources::this_process());
    DeviceCores {
        cores: effective_cores(affinity_cpus, cgroup.as_ref()),
        affinity_cpus,
        cgroup,
    }
}

/// CPUs this process may run on (`sched_getaffinity`), which is where a cpuset shows.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn affinity_cpus() -> usize {
    let mut set = std::mem::MaybeUninit::<libc::cpu_set_t>::zeroed();
    // SAFETY: sched_getaffinity writes at most `size_of::<cpu_set_t>()` bytes into the
    // zeroed set we own; pid 0 is this thread.
    let rc = unsafe {
        libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set.as_mut_ptr())
    };
    if rc != 0 {
        // More CPUs than a cpu_set_t holds (over 1024): std asks with a larger buffer.
        return fallback_parallelism();
    }
    // SAFETY: the set was zero-initialised and the call succeeded; CPU_COUNT only reads it.
    let n = unsafe { libc::CPU_COUNT(set.assume_init_ref()) };
    usize::try_from(n)
        .ok()
        .filter(|&n| n > 0)
        .unwrap_or_else(fallback_parallelism)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub fn affinity_cpus() -> usize {
    fallback_parallelism()
}

fn fallback_parallelism() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::CgroupVersion;

    const GIB_U: u64 = 1 << 30;

    fn host() -> MemInfo {
        MemInfo {
            total_gib: 16.0,
            available_gib: 10.0,
            swap_total_gib: 2.0,
            swap_free_gib: 1.0,
        }
    }

    fn limit(limit_bytes: u64, available_bytes: u64) -> MemoryLimit {
        MemoryLimit {
            version: CgroupVersion::V1,
            path: "/prima-dev1".into(),
            limit_bytes,
            available_bytes,
        }
    }

    #[test]
    fn a_limit_lowers_total_and_available() {
        let m = apply_memory_limit(host(), Some(&limit(GIB_U / 2, GIB_U / 4)));
        assert_eq!((m.total_gib, m.available_gib), (0.5, 0.25));
        assert_eq!((m.swap_total_gib, m.swap_free_gib), (2.0, 1.0));
    }

    #[test]
    fn the_host_still_caps_a_loose_limit() {
        // Room under the limit, but the host itself has only 10 GiB free.
        let m = apply_memory_limit(host(), Some(&limit(12 * GIB_U, 12 * GIB_U)));
        assert_eq!((m.total_gib, m.available_gib), (12.0, 10.0));
        assert_eq!(apply_memory_limit(host(), None), host());
    }

    #[test]
    fn cores_are_the_smaller_of_affinity_and_quota() {
        let quota = |quota_us| CpuQuota {
            version: CgroupVersion::V2,
            path: "/".into(),
            quota_us,
            period_us: 100_000,
        };
        assert_eq!(effective_cores(8, None), 8);
        assert_eq!(effective_cores(8, Some(&quota(50_000))), 1);
        assert_eq!(effective_cores(8, Some(&quota(250_000))), 3);
        assert_eq!(effective_cores(2, Some(&quota(800_000))), 2);
        let share = |quota_us, cores| {
            DeviceCores {
                cores,
                affinity_cpus: 2,
                cgroup: Some(quota(quota_us)),
            }
            .quota_share()
        };
        assert!((share(15_000, 1) - 0.15).abs() < 1e-9);
        assert!((share(150_000, 2) - 0.75).abs() < 1e-9);
        assert_eq!(share(800_000, 2), 1.0);
        assert_eq!(effective_cores(0, None), 1);
    }

    #[test]
    fn this_machine_is_read_without_error() {
        let cores = device_cores();
        assert!(cores.cores >= 1 && cores.cores <= cores.affinity_cpus);
        if cfg!(target_os = "linux") {
            let m = device_memory().expect("/proc/meminfo");
            assert!(m.effective.total_gib > 0.0 && m.effective.total_gib <= m.host.total_gib);
            assert!(m.effective.available_gib <= m.effective.total_gib);
            assert!(m.effective.available_gib <= m.host.available_gib);
            eprintln!(
                "this machine: {:?}, cgroup {:?}; {} cores of {} (quota {:?})",
                m.effective, m.cgroup, cores.cores, cores.affinity_cpus, cores.cgroup
            );
        }
    }
}

//! Profiling this device end to end: compute through the backend, memory, disk, OS
//! memory figures; and the cache that makes the second run near-instant.
//!
//! The throughputs are cached per device and model file under
//! `~/.cache/prima/profiles/` (or `$PRIMA_PROFILE_DIR`) and expire after a while; memory
//! figures change minute to minute and are read fresh every time, as are the cores and
//! memory limits of the cgroup the process runs in.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::compute::{cpu_throughput, memcpy_rate};
use super::device::{DeviceProfile, GpuKind, Os, QuantClass, QuantRates, GB, GIB};
use super::disk::disk_read_rates;
use super::gpu::{measure_gpu, GpuMeasured, GpuProbe};
use super::memory::memory_read_bandwidth;
use prima_abi::backend::BackendBox;
use prima_host::{cpu_model, hostname};
use prima_host::{device_cores, device_memory, DeviceCores, DeviceMemory};

/// Environment variable overriding the profile cache directory.
pub const PROFILE_DIR_ENV: &str = "PRIMA_PROFILE_DIR";

#[derive(Debug, Clone)]
pub struct ProfileOptions {
    /// Device name in the profile (default: the host name).
    pub name: Option<String>,
    /// A cached profile older than this is measured again.
    pub max_age: Duration,
    /// Measure even when a fresh cached profile exists.
    pub refresh: bool,
}

impl Default for ProfileOptions {
    fn default() -> Self {
        ProfileOptions {
            name: None,
            max_age: Duration::from_secs(24 * 3600),
            refresh: false,
        }
    }
}

/// What was measured (the cached part).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Measured {
    cpu_gflops: QuantRates,
    cpu_read_gb_s: f64,
    memcpy_gb_s: f64,
    disk_seq_gb_s: f64,
    disk_rand_gb_s: f64,
    disk_uncached: bool,
    measure_ms: f64,
    /// The GPU's figures, when a GPU backend was profiled (absent in older caches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gpu: Option<GpuMeasured>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CacheRecord {
    key: String,
    created_unix: u64,
    measured: Measured,
}

/// A profile and how it was obtained.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileReport {
    pub profile: DeviceProfile,
    /// Whether the throughputs came from the cache.
    pub cached: bool,
    /// Wall time of this profiling run.
    pub elapsed_ms: f64,
    /// Wall time of the measurement itself (from the cache: of the run that made it).
    pub measure_ms: f64,
    /// The file the disk was measured with, and whether the page cache was bypassed.
    pub disk_file: PathBuf,
    pub disk_uncached: bool,
    pub cache_file: Option<PathBuf>,
    /// Where `ram_*` came from: the host's figures and the cgroup limit that lowered them.
    pub memory: DeviceMemory,
    /// Where `cpu_cores` came from: the affinity mask and the cgroup's CPU quota.
    pub cores: DeviceCores,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("{path}: {source}")]
    Disk {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("measuring compute through the backend: {0}")]
    Compute(String),
    #[error("{0}")]
    Memory(String),
}

/// The profile cache directory.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os(PROFILE_DIR_ENV) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(crate::profile::home_dir()).join(".cache/prima/profiles"),
    }
}

/// FNV-1a: a stable hash for cache file names (std's hasher may change between releases).
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Profiles this device with `backend`, measuring the disk by reading `disk_file` (the
/// model) uncached.
pub fn profile_device(
    backend: &BackendBox,
    backend_name: &str,
    disk_file: &Path,
    opts: &ProfileOptions,
) -> Result<ProfileReport, ProfileError> {
    profile_device_with_gpu(backend, backend_name, None, disk_file, opts)
}

/// [`profile_device`] with a GPU backend beside `backend`: the profile's `gpu*` fields
/// from its own kernels and the memory its plugin reports, so Halda can give the device
/// GPU layers (n_m) within its VRAM.
pub fn profile_device_with_gpu(
    backend: &BackendBox,
    backend_name: &str,
    gpu: Option<GpuProbe<'_>>,
    disk_file: &Path,
    opts: &ProfileOptions,
) -> Result<ProfileReport, ProfileError> {
    let start = Instant::now();
    let disk_meta = std::fs::metadata(disk_file).map_err(|source| ProfileError::Disk {
        path: disk_file.to_path_buf(),
        source,
    })?;
    let mtime = disk_meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let host = hostname();
    let canonical = std::fs::canonicalize(disk_file).unwrap_or_else(|_| disk_file.to_path_buf());
    let gpu_name = gpu.map(|g| format!("+{}", g.name)).unwrap_or_default();
    let key = format!(
        "{host}|{}|{backend_name}{gpu_name}|{}|{}|{mtime}",
        cpu_model(),
        canonical.display(),
        disk_meta.len()
    );
    let cache_file = cache_dir().join(format!("{host}-{:016x}.json", fnv1a(&key)));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);

    let cached = if opts.refresh {
        None
    } else {
        std::fs::read_to_string(&cache_file)
            .ok()
            .and_then(|t| serde_json::from_str::<CacheRecord>(&t).ok())
            .filter(|r| {
                r.key == key && now.saturating_sub(r.created_unix) <= opts.max_age.as_secs()
            })
    };
    let (measured, from_cache) = match cached {
        Some(record) => (record.measured, true),
        None => {
            let mut m = measure(backend, disk_file)?;
            if let Some(gpu) = gpu {
                m.gpu = Some(measure_gpu(gpu.backend, 4096).map_err(ProfileError::Compute)?);
            }
            let record = CacheRecord {
                key: key.clone(),
                created_unix: now,
                measured: m.clone(),
            };
            // A cache that cannot be written only costs the next run its speed.
            if let Some(dir) = cache_file.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            if let Ok(text) = serde_json::to_string_pretty(&record) {
                if let Err(e) = std::fs::write(&cache_file, text) {
                    tracing::warn!("cannot cache the profile in {}: {e}", cache_file.display());
                }
            }
            (m, false)
        }
    };

    let memory = device_memory().map_err(ProfileError::Memory)?;
    let mem = memory.effective;
    let cores = device_cores();
    // Scaled here, not where measured: a cached figure meets today's quota.
    let mut cpu_gflops = measured.cpu_gflops;
    let share = cores.quota_share();
    for q in QuantClass::ALL {
        cpu_gflops.set(q, cpu_gflops.flops_per_s(q) / GB * share);
    }
    let os = Os::current();
    // A GPU whose figures were measured, with the memory its plugin reports now.
    let gpu_now = gpu.zip(measured.gpu.as_ref());
    let gpu_kind = match gpu_now {
        // Unified memory is what the profile calls Metal (macOS's wired-memory model);
        // elsewhere a GPU is planned as private VRAM.
        Some((g, _)) if g.memory.unified && os == Os::Macos => GpuKind::Metal,
        Some(_) => GpuKind::Cuda,
        None => GpuKind::None,
    };
    let gpu_available_gib = gpu_now.map_or(0.0, |(g, _)| {
        let free = g.memory.free_bytes as f64 / GIB;
        if g.memory.unified {
            free.min(mem.available_gib)
        } else {
            free
        }
    });
    let profile = DeviceProfile {
        name: opts.name.clone().unwrap_or(host),
        os,
        gpu: gpu_kind,
        cpu_cores: cores.cores as u32,
        cpu_gflops,
        cpu_quota_share: (share < 1.0).then_some(share),
        gpu_gflops: gpu_now.map(|(_, m)| m.gflops),
        cpu_read_gb_s: measured.cpu_read_gb_s,
        gpu_read_gb_s: gpu_now.map(|(_, m)| m.read_gb_s()),
        memcpy_gb_s: measured.memcpy_gb_s,
        gpu_memcpy_gb_s: None,
        gpu_copy_ms: gpu_now.map_or(0.0, |(_, m)| m.copy_ms),
        ram_total_gib: mem.total_gib,
        ram_available_gib: mem.available_gib.min(mem.total_gib),
        swap_total_gib: mem.swap_total_gib,
        swap_available_gib: mem.swap_free_gib,
        swappable_gib: 0.0,
        gpu_available_gib,
        disk_seq_gb_s: measured.disk_seq_gb_s,
        disk_rand_gb_s: measured.disk_rand_gb_s,
        link: None,
        relay: false,
    };
    Ok(ProfileReport {
        profile,
        cached: from_cache,
        elapsed_ms: start.elapsed().as_secs_f64() * 1e3,
        measure_ms: measured.measure_ms,
        disk_file: disk_file.to_path_buf(),
        disk_uncached: measured.disk_uncached,
        cache_file: Some(cache_file),
        memory,
        cores,
    })
}

/// The bandwidth probe's buffer: 128 MiB (far beyond the caches), but at most a quarter
/// of what the device may still use, so that profiling a small device (a phone's app
/// limit, a 100 MB cgroup) never pushes it out of memory. Below ~32 MiB the figure
/// partly measures the cache, which only matters on devices that hold few layers anyway.
fn bandwidth_buffer_bytes() -> usize {
    const FULL: usize = 128 << 20;
    const FLOOR: usize = 4 << 20;
    let available = device_memory()
        .map(|m| m.effective.available_gib * GIB)
        .unwrap_or(f64::INFINITY);
    let quarter = (available / 4.0).min(FULL as f64) as usize;
    quarter.clamp(FLOOR, FULL)
}

fn measure(backend: &BackendBox, disk_file: &Path) -> Result<Measured, ProfileError> {
    let start = Instant::now();
    let threads = device_cores().cores;
    let cpu_gflops =
        cpu_throughput(backend, Duration::from_millis(60)).map_err(ProfileError::Compute)?;
    let bandwidth = memory_read_bandwidth(bandwidth_buffer_bytes(), threads, 3);
    let memcpy = memcpy_rate(Duration::from_millis(40));
    let disk =
        disk_read_rates(disk_file, 512 << 20, Duration::from_millis(400)).map_err(|source| {
            ProfileError::Disk {
                path: disk_file.to_path_buf(),
                source,
            }
        })?;
    Ok(Measured {
        cpu_gflops,
        cpu_read_gb_s: bandwidth.bytes_per_s / GB,
        memcpy_gb_s: memcpy / GB,
        disk_seq_gb_s: disk.seq_bytes_per_s / GB,
        disk_rand_gb_s: disk.rand_bytes_per_s / GB,
        disk_uncached: disk.uncached,
        measure_ms: start.elapsed().as_secs_f64() * 1e3,
        gpu: None,
    })
}

/// Profiles this device with `backend` and, when `gpu` is a GPU's (its plugin reports GPU
/// memory), the GPU beside it: what `prima profile`, a node's profile answer and
/// `prima apply`'s head measure.
pub fn profile_with(
    backend: &prima_core::plugin::LoadedBackend,
    gpu: Option<&prima_core::plugin::LoadedBackend>,
    disk_file: &std::path::Path,
    opts: &ProfileOptions,
) -> Result<ProfileReport, ProfileError> {
    let probe = gpu.and_then(|g| {
        g.gpu_memory().map(|memory| GpuProbe {
            backend: &g.backend,
            name: &g.plugin_name,
            memory,
        })
    });
    profile_device_with_gpu(
        &backend.backend,
        &backend.plugin_name,
        probe,
        disk_file,
        opts,
    )
}
/// The profile of a device that may use only `budget` bytes of memory for weights: its
/// RAM, as the planner sees it, is the smaller of what it has and the budget.
pub fn with_budget(mut profile: DeviceProfile, budget: Option<u64>) -> DeviceProfile {
    if let Some(b) = budget {
        let gib = b as f64 / GIB;
        profile.ram_available_gib = profile.ram_available_gib.min(gib);
        profile.ram_total_gib = profile.ram_total_gib.min(gib);
    }
    profile
}

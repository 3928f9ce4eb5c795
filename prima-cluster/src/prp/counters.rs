//! Process-wide counters read around each window: major page faults (weights that had to
//! come from storage) and bytes read from storage, so the ring's timing can say how much of
//! a token's time went to the disk.

/// Per-pass measurements that stay cheap on the hot path: major faults around the compute
/// (one `getrusage` each), but the storage bytes and available memory (file reads under
/// /proc and the cgroup's files) only once per pass, and the memory at most every 50 ms.
pub struct PassMeter {
    /// /proc/self/io, opened once: each pass then costs one `pread`, not an open, a read
    /// and a close on the ring's critical path.
    io: Option<std::fs::File>,
    last_disk: u64,
    mem_sampled: Option<(std::time::Instant, u64)>,
}

impl Default for PassMeter {
    fn default() -> Self {
        PassMeter::new()
    }
}

impl PassMeter {
    pub fn new() -> PassMeter {
        let io = std::fs::File::open("/proc/self/io").ok();
        PassMeter {
            last_disk: disk_read_bytes(io.as_ref()),
            io,
            mem_sampled: None,
        }
    }

    /// Major page faults of this process so far.
    pub fn major_faults(&self) -> u64 {
        major_faults()
    }

    /// Storage bytes read since the previous call (the pass's compute, and the prefetch
    /// and release hinted after the previous pass's send), and the latest available-memory
    /// sample ([`mem_available_total`]).
    pub fn end_pass(&mut self) -> (u64, u64) {
        let disk = disk_read_bytes(self.io.as_ref());
        let delta = disk.saturating_sub(self.last_disk);
        self.last_disk = disk;
        let now = std::time::Instant::now();
        let mem = match self.mem_sampled {
            Some((at, v)) if now.duration_since(at) < std::time::Duration::from_millis(50) => v,
            _ => {
                let v = mem_available_total().map_or(0, |(a, _)| a);
                self.mem_sampled = Some((now, v));
                v
            }
        };
        (delta, mem)
    }
}

/// Windows counts hard and soft faults together, so it has no figure to give: 0.
#[cfg(not(unix))]
fn major_faults() -> u64 {
    0
}

#[cfg(unix)]
fn major_faults() -> u64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a whole rusage into the pointer we pass, which points to
    // enough zeroed memory for one; we read it only when the call succeeds.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return 0;
    }
    // SAFETY: getrusage returned 0, so it initialised the struct.
    let usage = unsafe { usage.assume_init() };
    usage.ru_majflt.max(0) as u64
}

/// `read_bytes` of /proc/self/io (0 where there is none, as off Linux and Android).
#[cfg(not(unix))]
fn disk_read_bytes(_io: Option<&std::fs::File>) -> u64 {
    0
}

#[cfg(unix)]
fn disk_read_bytes(io: Option<&std::fs::File>) -> u64 {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 512];
    let Some(n) = io.and_then(|f| f.read_at(&mut buf, 0).ok()) else {
        return 0;
    };
    let Ok(text) = std::str::from_utf8(&buf[..n]) else {
        return 0;
    };
    text.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Available and total memory in bytes as the device profiler reads them: /proc/meminfo's
/// `MemAvailable` and `MemTotal`, lowered by the process's cgroup limit, so memory pressure
/// inside a container is measured against the container's own limit (Linux and Android;
/// `None` elsewhere).
pub fn mem_available_total() -> Option<(u64, u64)> {
    let m = crate::profile::device_memory_in(crate::profile::memory_cgroups())
        .ok()?
        .effective;
    let bytes = |gib: f64| (gib * crate::profile::GIB) as u64;
    Some((bytes(m.available_gib), bytes(m.total_gib)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_meter_reads_and_never_goes_backwards() {
        let mut meter = PassMeter::new();
        let a = meter.major_faults();
        let _ = std::fs::read("/proc/self/status");
        assert!(meter.major_faults() >= a);
        let (_, mem) = meter.end_pass();
        if cfg!(target_os = "linux") {
            let (avail, total) = mem_available_total().expect("/proc/meminfo");
            assert!(avail > 0 && avail <= total, "{avail} of {total}");
            assert!(mem > 0);
        }
    }
}

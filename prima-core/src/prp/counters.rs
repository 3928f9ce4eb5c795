//! Process-wide counters read around each window: major page faults (weights that had to
//! come from storage) and bytes read from storage, so the ring's timing can say how much of
//! a token's time went to the disk.

/// A snapshot of the counters; subtract two to get what happened in between.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessCounters {
    pub major_faults: u64,
    /// `read_bytes` of `/proc/self/io`: bytes fetched from the storage layer (0 where the
    /// system does not report it).
    pub disk_read_bytes: u64,
}

impl ProcessCounters {
    pub fn now() -> ProcessCounters {
        ProcessCounters {
            major_faults: major_faults(),
            disk_read_bytes: disk_read_bytes(),
        }
    }

    /// What happened since `earlier`.
    pub fn since(&self, earlier: &ProcessCounters) -> ProcessCounters {
        ProcessCounters {
            major_faults: self.major_faults.saturating_sub(earlier.major_faults),
            disk_read_bytes: self.disk_read_bytes.saturating_sub(earlier.disk_read_bytes),
        }
    }
}

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

fn disk_read_bytes() -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/self/io") else {
        return 0;
    };
    text.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// `MemAvailable` and `MemTotal` from `/proc/meminfo`, in bytes (Linux; `None` elsewhere).
pub fn mem_available_total() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kb: u64 = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kb * 1024)
    };
    Some((field("MemAvailable:")?, field("MemTotal:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_read_and_never_go_backwards() {
        let a = ProcessCounters::now();
        let _ = std::fs::read("/proc/self/status");
        let b = ProcessCounters::now();
        assert!(b.major_faults >= a.major_faults);
        assert_eq!(a.since(&b).major_faults, 0, "saturates instead of wrapping");
        if cfg!(target_os = "linux") {
            let (avail, total) = mem_available_total().expect("/proc/meminfo");
            assert!(avail > 0 && avail <= total, "{avail} of {total}");
        }
    }
}

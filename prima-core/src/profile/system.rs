//! What the OS says about memory: MemTotal, MemAvailable (free plus reclaimable — not
//! MemFree), swap; and a stable name for this machine.

use std::path::Path;

use serde::Serialize;

use super::device::GIB;

/// Memory figures in GiB.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MemInfo {
    pub total_gib: f64,
    pub available_gib: f64,
    pub swap_total_gib: f64,
    pub swap_free_gib: f64,
}

/// Parses /proc/meminfo text (kB values).
pub fn parse_meminfo(text: &str) -> Result<MemInfo, String> {
    let field = |name: &str| -> Option<f64> {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            let kb: f64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            Some(kb * 1024.0 / GIB)
        })
    };
    let need = |name: &str| field(name).ok_or_else(|| format!("/proc/meminfo has no {name}"));
    Ok(MemInfo {
        total_gib: need("MemTotal")?,
        available_gib: need("MemAvailable")?,
        swap_total_gib: field("SwapTotal").unwrap_or(0.0),
        swap_free_gib: field("SwapFree").unwrap_or(0.0),
    })
}

/// The host's memory, from /proc/meminfo (see [`super::device_memory`] for what this
/// process may use of it).
pub fn meminfo() -> Result<MemInfo, String> {
    let path = Path::new("/proc/meminfo");
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "{}: {e} (memory figures are read from /proc/meminfo on Linux and Android only)",
            path.display()
        )
    })?;
    parse_meminfo(&text)
}

/// The host name, or "this-device".
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "this-device".into())
}

/// The CPU model string, for the profile cache key (a new CPU means a new profile).
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name") || l.starts_with("Hardware"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_available_not_free() {
        let text = "MemTotal:       16384000 kB\nMemFree:         1024000 kB\nMemAvailable:    8192000 kB\nSwapTotal:       2097152 kB\nSwapFree:        1048576 kB\n";
        let m = parse_meminfo(text).unwrap();
        assert!((m.total_gib - 16384000.0 * 1024.0 / GIB).abs() < 1e-9);
        assert!((m.available_gib - 8192000.0 * 1024.0 / GIB).abs() < 1e-9);
        assert!((m.swap_free_gib - 1.0).abs() < 1e-9);
    }

    #[test]
    fn names_a_missing_field() {
        let e = parse_meminfo("MemTotal: 1 kB\n").unwrap_err();
        assert!(e.contains("MemAvailable"), "{e}");
    }
}

//! What the OS says about memory: MemTotal, MemAvailable (free plus reclaimable — not
//! MemFree), swap; and a stable name for this machine. Linux and Android read /proc; macOS
//! and Windows ask their own calls for the same figures.

use serde::Serialize;

use crate::GIB;

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

/// The host's memory, from /proc/meminfo (see [`crate::device_memory`] for what this
/// process may use of it).
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn meminfo() -> Result<MemInfo, String> {
    let path = std::path::Path::new("/proc/meminfo");
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "{}: {e} (memory figures are read from /proc/meminfo on Linux and Android only)",
            path.display()
        )
    })?;
    parse_meminfo(&text)
}

/// The host's memory from the kernel's VM statistics: available is free plus inactive
/// pages (what psutil reports; the inactive ones are reclaimable), swap from
/// `vm.swapusage`. Type-checked only: never run here.
#[cfg(target_os = "macos")]
pub fn meminfo() -> Result<MemInfo, String> {
    use std::sync::OnceLock;
    let total = sysctl_value::<u64>("hw.memsize")?;
    let swap = sysctl_value::<libc::xsw_usage>("vm.swapusage").ok();
    // One send right to the host port for the process: each call would add a reference.
    static HOST: OnceLock<libc::host_t> = OnceLock::new();
    // SAFETY: mach_host_self has no preconditions. (libc points to the mach2 crate for
    // it; the call is the same.)
    #[allow(deprecated)]
    let host = *HOST.get_or_init(|| unsafe { libc::mach_host_self() });
    let mut stats = std::mem::MaybeUninit::<libc::vm_statistics64>::zeroed();
    let mut count = libc::HOST_VM_INFO64_COUNT;
    // SAFETY: the buffer holds `count` integers, the size host_statistics64 is told; it
    // writes at most that many and says how many in `count`.
    let rc = unsafe {
        libc::host_statistics64(
            host,
            libc::HOST_VM_INFO64,
            stats.as_mut_ptr().cast(),
            &mut count,
        )
    };
    if rc != libc::KERN_SUCCESS {
        return Err(format!("host_statistics64 failed ({rc})"));
    }
    // SAFETY: zero-initialised, then filled in by the kernel: every field is an integer.
    let stats = unsafe { stats.assume_init() };
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as f64;
    let pages = |n: u32| n as f64 * page / GIB;
    let bytes = |n: u64| n as f64 / GIB;
    Ok(MemInfo {
        total_gib: bytes(total),
        available_gib: pages(stats.free_count) + pages(stats.inactive_count),
        swap_total_gib: swap.map_or(0.0, |s| bytes(s.xsu_total)),
        swap_free_gib: swap.map_or(0.0, |s| bytes(s.xsu_avail)),
    })
}

/// A fixed-size value of `sysctlbyname`.
#[cfg(target_os = "macos")]
fn sysctl_value<T: Copy>(name: &str) -> Result<T, String> {
    let c_name = std::ffi::CString::new(name).map_err(|e| e.to_string())?;
    let mut value = std::mem::MaybeUninit::<T>::zeroed();
    let mut len = std::mem::size_of::<T>();
    // SAFETY: the name is NUL-terminated and the buffer holds `len` bytes, which sysctl
    // writes at most; newp is null (nothing is set).
    let rc = unsafe {
        libc::sysctlbyname(
            c_name.as_ptr(),
            value.as_mut_ptr().cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    if rc != 0 || len != std::mem::size_of::<T>() {
        return Err(format!(
            "sysctl {name}: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: sysctl filled all `size_of::<T>()` bytes of a plain integer struct.
    Ok(unsafe { value.assume_init() })
}

/// The host's memory from `GlobalMemoryStatusEx`: available is the physical memory that
/// can be used without paging anything out (free, zeroed and standby pages); Windows'
/// page file stands in for swap.
#[cfg(windows)]
pub fn meminfo() -> Result<MemInfo, String> {
    use windows_sys::Win32::System::SystemInformation::{GlobalMemoryStatusEx, MEMORYSTATUSEX};
    let mut status = MEMORYSTATUSEX {
        dwLength: std::mem::size_of::<MEMORYSTATUSEX>() as u32,
        ..Default::default()
    };
    // SAFETY: the struct is ours, its dwLength set as the call requires.
    if unsafe { GlobalMemoryStatusEx(&mut status) } == 0 {
        return Err(format!(
            "GlobalMemoryStatusEx: {}",
            std::io::Error::last_os_error()
        ));
    }
    let gib = |b: u64| b as f64 / GIB;
    // The page-file figures include physical memory (the "commit limit"): the rest is swap.
    Ok(MemInfo {
        total_gib: gib(status.ullTotalPhys),
        available_gib: gib(status.ullAvailPhys),
        swap_total_gib: gib(status.ullTotalPageFile.saturating_sub(status.ullTotalPhys)),
        swap_free_gib: gib(status.ullAvailPageFile.saturating_sub(status.ullAvailPhys)),
    })
}

#[cfg(not(any(
    target_os = "linux",
    target_os = "android",
    target_os = "macos",
    windows
)))]
pub fn meminfo() -> Result<MemInfo, String> {
    Err("memory figures are read on Linux, Android, macOS and Windows only".into())
}

/// The host name, or "this-device".
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .or_else(os_hostname)
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "this-device".into())
}

/// The name the OS gives where /proc and /etc/hostname have none (macOS).
#[cfg(unix)]
fn os_hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into our buffer.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

#[cfg(windows)]
fn os_hostname() -> Option<String> {
    std::env::var("COMPUTERNAME").ok()
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
        .or_else(os_cpu_model)
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The CPU model where there is no /proc/cpuinfo.
#[cfg(target_os = "macos")]
fn os_cpu_model() -> Option<String> {
    let out = std::process::Command::new("sysctl")
        .args(["-n", "machdep.cpu.brand_string"])
        .output()
        .ok()?;
    let model = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!model.is_empty()).then_some(model)
}

#[cfg(windows)]
fn os_cpu_model() -> Option<String> {
    std::env::var("PROCESSOR_IDENTIFIER").ok()
}

#[cfg(not(any(target_os = "macos", windows)))]
fn os_cpu_model() -> Option<String> {
    None
}

/// The user's home directory: `$HOME`, else `%USERPROFILE%` (Windows sets no HOME), else
/// empty (paths below it are then relative).
pub fn home_dir() -> std::ffi::OsString {
    std::env::var_os("HOME")
        .or_else(|| std::env::var_os("USERPROFILE"))
        .unwrap_or_default()
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

//! A local node recorded by an earlier `prima apply --keep-nodes`, found again by its
//! process id: whether that process is still our node, and stopping it. Each OS names its
//! processes differently, so this is the one place that knows how.

use std::time::{Duration, Instant};

/// Whether process `pid` still runs and is a `prima node` (a reused id is not).
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn is_node(pid: u32) -> bool {
    match std::fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(cmd) => looks_like_node(&String::from_utf8_lossy(&cmd)),
        Err(_) => false,
    }
}

/// Other Unixes (macOS) have no /proc: `ps` prints the command line.
#[cfg(all(unix, not(any(target_os = "linux", target_os = "android"))))]
pub fn is_node(pid: u32) -> bool {
    std::process::Command::new("ps")
        .args(["-o", "command=", "-p", &pid.to_string()])
        .output()
        .is_ok_and(|o| o.status.success() && looks_like_node(&String::from_utf8_lossy(&o.stdout)))
}

/// Windows keeps no command line another process can read without debugging rights:
/// the process must still run and be this same executable.
#[cfg(windows)]
pub fn is_node(pid: u32) -> bool {
    use windows_sys::Win32::Foundation::{CloseHandle, STILL_ACTIVE};
    use windows_sys::Win32::System::Threading::{
        GetExitCodeProcess, OpenProcess, QueryFullProcessImageNameW,
        PROCESS_QUERY_LIMITED_INFORMATION,
    };
    // SAFETY: OpenProcess takes a plain id and returns a handle or null.
    let handle = unsafe { OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, 0, pid) };
    if handle.is_null() {
        return false;
    }
    let mut code = 0u32;
    let mut name = [0u16; 1024];
    let mut len = name.len() as u32;
    // SAFETY: the handle is open; each call writes at most the sizes we pass (one u32; `len`
    // UTF-16 units into `name`, with `len` updated to what it wrote).
    let (running, named) = unsafe {
        (
            GetExitCodeProcess(handle, &mut code) != 0 && code == STILL_ACTIVE as u32,
            QueryFullProcessImageNameW(handle, 0, name.as_mut_ptr(), &mut len) != 0,
        )
    };
    // SAFETY: closes the handle opened above, once.
    unsafe { CloseHandle(handle) };
    let image = String::from_utf16_lossy(&name[..(len as usize).min(name.len())]);
    let ours = std::env::current_exe().is_ok_and(|exe| exe.to_string_lossy() == image);
    running && named && ours
}

#[cfg(unix)]
fn looks_like_node(command_line: &str) -> bool {
    command_line.contains("node") && command_line.contains("--listen")
}

/// Asks node `pid` to stop (SIGTERM; on Windows it is ended, having no such signal) and
/// waits up to five seconds for it to go. Does nothing when it is no longer our node.
pub fn stop(pid: u32) {
    if !is_node(pid) {
        return;
    }
    terminate(pid);
    let deadline = Instant::now() + Duration::from_secs(5);
    while is_node(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(unix)]
fn terminate(pid: u32) {
    // SAFETY: kill only sends a signal to a process id; the id is our node's, checked by
    // the caller just before.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGTERM);
    }
}

#[cfg(windows)]
fn terminate(pid: u32) {
    use windows_sys::Win32::Foundation::CloseHandle;
    use windows_sys::Win32::System::Threading::{OpenProcess, TerminateProcess, PROCESS_TERMINATE};
    // SAFETY: OpenProcess takes a plain id and returns a handle or null; the handle is
    // used once to end the process (our node, checked by the caller) and closed.
    unsafe {
        let handle = OpenProcess(PROCESS_TERMINATE, 0, pid);
        if !handle.is_null() {
            TerminateProcess(handle, 1);
            CloseHandle(handle);
        }
    }
}

//! Starting programs inside an emulated device, and stopping them.
//!
//! A program joins the device's cgroups by writing its own pid to each `cgroup.procs`
//! before it execs (so every thread and child it makes is charged there), enters the
//! device's network namespace with `nsenter` — not `ip netns exec`, which remounts /sys
//! and would hide the cgroup hierarchies the engine reads its limits from — and gets a
//! UTS namespace whose host name is the device's, so profiles and plans name it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A command that runs `argv` as device `device`: in the cgroups whose `cgroup.procs`
/// files are given and in namespace `ns`, with `env` set.
pub fn in_device(
    procs_files: &[PathBuf],
    ns: &str,
    device: &str,
    env: &[(&str, String)],
    argv: &[String],
) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(
            r#"while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@""#,
        )
        .arg("sh")
        .args(procs_files)
        .arg("--")
        .arg("nsenter")
        .arg(format!("--net=/run/netns/{ns}"))
        .args([
            "unshare",
            "--uts",
            "sh",
            "-c",
            r#"hostname "$0" && exec "$@""#,
        ])
        .arg(device);
    if !env.is_empty() {
        cmd.arg("env");
        cmd.args(env.iter().map(|(k, v)| format!("{k}={v}")));
    }
    cmd.args(argv);
    cmd
}

/// Starts `cmd` in its own process group (a Ctrl-C to `homelab up` leaves it running),
/// with stdout and stderr appended to `log`. A thread reaps it, so a stopped program never
/// lingers as a zombie of a long-lived caller.
pub fn spawn_detached(cmd: &mut Command, log: &Path) -> Result<i32> {
    use std::os::unix::process::CommandExt;
    let file = fs::File::options()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start `{}`", crate::shell::describe(cmd)))?;
    let pid = child.id() as i32;
    std::thread::spawn(move || child.wait());
    Ok(pid)
}

/// Waits until `log` has a line starting with `prefix` and returns the rest of it; fails
/// if `pid` exits first or `timeout` passes, quoting the log.
pub fn wait_for_line(log: &Path, prefix: &str, pid: i32, timeout: Duration) -> Result<String> {
    let start = Instant::now();
    loop {
        let text = fs::read_to_string(log).unwrap_or_default();
        if let Some(rest) = text.lines().find_map(|l| l.strip_prefix(prefix)) {
            return Ok(rest.to_string());
        }
        let tail = || {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(15)..].join("\n")
        };
        if !alive(pid) {
            bail!("it exited; last lines of {}:\n{}", log.display(), tail());
        }
        if start.elapsed() > timeout {
            bail!(
                "no '{prefix}' after {timeout:?}; last lines of {}:\n{}",
                log.display(),
                tail()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether `pid` runs (a zombie, dead but not yet reaped, does not).
pub fn alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S …": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Sends SIGTERM to each pid, waits up to `grace`, then SIGKILLs what remains.
pub fn stop(pids: &[i32], grace: Duration) {
    let signal = |pid: i32, sig: i32| {
        // SAFETY: kill has no memory arguments; the pids come from our own cgroups and
        // namespaces, and pid 0 / negative pids (groups) are filtered out.
        if pid > 0 {
            unsafe { libc::kill(pid, sig) };
        }
    };
    for &pid in pids {
        signal(pid, libc::SIGTERM);
    }
    let start = Instant::now();
    while pids.iter().any(|&p| alive(p)) && start.elapsed() < grace {
        std::thread::sleep(Duration::from_millis(50));
    }
    for &pid in pids.iter().filter(|&&p| alive(p)) {
        signal(pid, libc::SIGKILL);
    }
    let start = Instant::now();
    while pids.iter().any(|&p| alive(p)) && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

//! Asking the plugins about this machine's hardware in a child process.
//!
//! A GPU plugin's probe opens its drivers: on lavapipe that maps libLLVM (43 MiB), which a
//! library never unmaps. In a ring node that does not use the GPU those pages sat in its
//! memory limit beside the weights, and the budget counted them as read every token, so the
//! node streamed one more layer (8B on the home lab: 3.2 s a token against 2.4 s without
//! the plugin). So `prima` answers [`discover`] from a copy of itself run
//! for the question, and maps a GPU plugin only when it uses it. A driver that crashes
//! while probing then takes down the child, not `prima`.
//!
//! Executables that have not said they answer the question (tests, other tools) probe in
//! their own process, as before.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::library::{declarations_here, discover_here, plugin_dirs, PluginInfo};
use super::PluginKind;
use prima_abi::backend::GpuMemory;

/// The first argument that makes `prima` a hardware probe (not a user command).
pub const PROBE_ARG: &str = "__probe-plugins";

/// The executable that answers [`PROBE_ARG`], once the running program has said it does.
static PROBE_EXE: OnceLock<PathBuf> = OnceLock::new();

/// Says that this executable answers [`PROBE_ARG`] (with [`answer_probe`] first thing in
/// `main`), so hardware probes run in a copy of it.
pub fn probe_in_child_processes() {
    if let Ok(exe) = std::env::current_exe() {
        let _ = PROBE_EXE.set(exe);
    }
}

/// When this process was started as a hardware probe (`exe __probe-plugins DIR…`), lists
/// the plugins in those directories as JSON on stdout and returns the exit code; `None`
/// for a normal start.
pub fn answer_probe(args: &[std::ffi::OsString]) -> Option<u8> {
    if args.get(1).is_none_or(|a| a != PROBE_ARG) {
        return None;
    }
    let dirs: Vec<PathBuf> = args[2..].iter().map(PathBuf::from).collect();
    let found: Vec<ProbedPlugin> = discover_here(&dirs)
        .iter()
        .map(ProbedPlugin::from)
        .collect();
    match serde_json::to_string(&found) {
        Ok(json) => {
            println!("{json}");
            Some(0)
        }
        Err(e) => {
            eprintln!("{PROBE_ARG}: {e}");
            Some(1)
        }
    }
}

/// Lists every plugin library in the plugin directories, with what it declares.
pub fn discover() -> Vec<PluginInfo> {
    discover_in(&plugin_dirs())
}

/// Lists every plugin library in `dirs`, with what it declares and what each backend says
/// of this machine's hardware: asked in a child process when the program answers
/// [`PROBE_ARG`] (`prima` does), so this process maps no GPU driver it does not use.
pub fn discover_in(dirs: &[PathBuf]) -> Vec<PluginInfo> {
    let Some(exe) = PROBE_EXE.get() else {
        return discover_here(dirs);
    };
    match run_probe(exe, dirs) {
        Ok(found) => found,
        Err(why) => {
            // The plugins are still listed; those that would have probed hardware say why
            // they were not.
            let mut found = declarations_here(dirs);
            for p in &mut found {
                if p.kind == Some(PluginKind::Backend) && p.refused.is_none() {
                    p.unavailable = Some(format!("not probed: {why}"));
                }
            }
            found
        }
    }
}

fn run_probe(exe: &Path, dirs: &[PathBuf]) -> Result<Vec<PluginInfo>, String> {
    let out = Command::new(exe)
        .arg(PROBE_ARG)
        .args(dirs)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("starting {} {PROBE_ARG}: {e}", exe.display()))?;
    if !out.status.success() {
        return Err(format!("the hardware probe exited with {}", out.status));
    }
    let found: Vec<ProbedPlugin> = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("the hardware probe's answer: {e}"))?;
    Ok(found.into_iter().map(PluginInfo::from).collect())
}

/// [`PluginInfo`] as the probe writes it.
#[derive(Serialize, Deserialize)]
struct ProbedPlugin {
    path: PathBuf,
    kind: Option<u32>,
    abi_version: Option<u32>,
    name: Option<String>,
    version: Option<String>,
    refused: Option<String>,
    unavailable: Option<String>,
    /// (total bytes, free bytes, unified)
    gpu_memory: Option<(u64, u64, bool)>,
    covers: Vec<String>,
}

impl From<&PluginInfo> for ProbedPlugin {
    fn from(p: &PluginInfo) -> ProbedPlugin {
        ProbedPlugin {
            path: p.path.clone(),
            kind: p.kind.map(|k| k as u32),
            abi_version: p.abi_version,
            name: p.name.clone(),
            version: p.version.clone(),
            refused: p.refused.clone(),
            unavailable: p.unavailable.clone(),
            gpu_memory: p
                .gpu_memory
                .map(|m| (m.total_bytes, m.free_bytes, m.unified)),
            covers: p.covers.clone(),
        }
    }
}

impl From<ProbedPlugin> for PluginInfo {
    fn from(p: ProbedPlugin) -> PluginInfo {
        PluginInfo {
            path: p.path,
            kind: p.kind.and_then(PluginKind::from_id),
            abi_version: p.abi_version,
            name: p.name,
            version: p.version,
            refused: p.refused,
            unavailable: p.unavailable,
            gpu_memory: p
                .gpu_memory
                .map(|(total_bytes, free_bytes, unified)| GpuMemory {
                    total_bytes,
                    free_bytes,
                    unified,
                }),
            covers: p.covers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probed_plugin_reads_back_as_written() {
        let info = PluginInfo {
            path: PathBuf::from("/p/libprima_backend_metal.so"),
            kind: Some(PluginKind::Backend),
            abi_version: Some(5),
            name: Some("wgpu".into()),
            version: Some("0.1.0".into()),
            refused: None,
            unavailable: None,
            gpu_memory: Some(GpuMemory {
                total_bytes: 8 << 30,
                free_bytes: 6 << 30,
                unified: true,
            }),
            covers: vec![],
        };
        let json = serde_json::to_string(&vec![ProbedPlugin::from(&info)]).unwrap();
        let back: Vec<ProbedPlugin> = serde_json::from_str(&json).unwrap();
        let back = PluginInfo::from(back.into_iter().next().unwrap());
        assert_eq!(format!("{back:?}"), format!("{info:?}"));
    }

    #[test]
    fn a_normal_start_is_not_a_probe() {
        assert_eq!(answer_probe(&["prima".into(), "run".into()]), None);
        assert_eq!(answer_probe(&["prima".into()]), None);
    }
}

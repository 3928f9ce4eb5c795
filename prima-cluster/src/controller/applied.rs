//! What a cluster last ran, kept beside its nodes (`~/.cache/prima/apply/plans/`): the
//! plan `prima apply` launched (as [`Plan::to_json`] writes it), from which manifest and
//! when, and the TPOT its last prompt measured. `apply --dry-run` of an edited manifest
//! prints what changed against it ([`plan_changes`]); `prima status` shows it.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::local_nodes::{cache_dir, ClusterId};
use super::plan::Plan;
use crate::profile::DeviceProfile;

/// A cluster's last applied plan and its last measured speed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Applied {
    /// The cluster, as a person reads it ([`ClusterId::label`]).
    pub cluster: String,
    pub manifest: PathBuf,
    pub applied_unix: u64,
    /// The process that applied it (the head).
    pub pid: u32,
    /// [`Plan::to_json`].
    pub plan: serde_json::Value,
    /// Time per output token the last `--prompt` measured, ms, and when.
    pub measured_tpot_ms: Option<f64>,
    pub measured_unix: Option<u64>,
    /// The device profiles it was planned with (none for the manual scheduler).
    #[serde(default)]
    pub profiles: Vec<DeviceProfile>,
}

impl Applied {
    /// Whether the head that applied the plan still runs it (`prima apply` serving or
    /// `prima serve --manifest`); `None` where the OS does not tell (no /proc).
    pub fn head_running(&self) -> Option<bool> {
        if cfg!(any(target_os = "linux", target_os = "android")) {
            let cmd = std::fs::read(format!("/proc/{}/cmdline", self.pid)).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            Some(cmd.contains("prima") && (cmd.contains("apply") || cmd.contains("serve")))
        } else {
            None
        }
    }
}

fn plans_dir() -> PathBuf {
    cache_dir().join("plans")
}

fn applied_path(cluster: &ClusterId) -> PathBuf {
    plans_dir().join(format!("{}.json", cluster.key))
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The plan `cluster` last launched, if any (a file that does not parse counts as none).
pub fn last_applied(cluster: &ClusterId) -> Option<Applied> {
    serde_json::from_slice(&std::fs::read(applied_path(cluster)).ok()?).ok()
}

/// Every cluster's last applied plan, by cluster key.
pub fn applied_clusters() -> Vec<(String, Applied)> {
    let Ok(dir) = std::fs::read_dir(plans_dir()) else {
        return Vec::new();
    };
    let mut all: Vec<(String, Applied)> = dir
        .flatten()
        .filter_map(|e| {
            let path = e.path();
            let key = path.file_stem()?.to_string_lossy().into_owned();
            let applied = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
            Some((key, applied))
        })
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

fn write(cluster: &ClusterId, applied: &Applied) -> std::io::Result<()> {
    std::fs::create_dir_all(plans_dir())?;
    let json = serde_json::to_vec_pretty(applied).map_err(std::io::Error::other)?;
    std::fs::write(applied_path(cluster), json)
}

/// Records `plan` as the one `cluster` runs now (launched from `manifest`).
pub fn record_applied(cluster: &ClusterId, manifest: &Path, plan: &Plan) -> std::io::Result<()> {
    write(
        cluster,
        &Applied {
            cluster: cluster.label.clone(),
            manifest: std::fs::canonicalize(manifest).unwrap_or_else(|_| manifest.to_path_buf()),
            applied_unix: now_unix(),
            pid: std::process::id(),
            plan: plan.to_json(),
            measured_tpot_ms: None,
            measured_unix: None,
            profiles: plan.profiles.clone(),
        },
    )
}

/// Records the TPOT a prompt on `cluster`'s applied plan measured.
pub fn record_measured(cluster: &ClusterId, tpot_ms: f64) -> std::io::Result<()> {
    let Some(mut applied) = last_applied(cluster) else {
        return Ok(());
    };
    applied.measured_tpot_ms = Some(tpot_ms);
    applied.measured_unix = Some(now_unix());
    write(cluster, &applied)
}

/// What changed from the plan `old` (as [`Plan::to_json`] wrote it) to `new`, one line
/// each: devices added or removed (or now pruned), layers moved, k and the prediction.
/// Addresses are not compared (local nodes listen on a new port every run). Empty when
/// the plans are the same.
pub fn plan_changes(old: &serde_json::Value, new: &Plan) -> Vec<String> {
    let new = new.to_json();
    let mut changes = Vec::new();
    let ring = |plan: &serde_json::Value| -> Vec<(String, serde_json::Value)> {
        plan["devices"]
            .as_array()
            .map(|ds| {
                ds.iter()
                    .filter(|d| d["forwards"].is_null())
                    .map(|d| (d["name"].as_str().unwrap_or("?").to_string(), d.clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (before, after) = (ring(old), ring(&new));
    let find = |list: &[(String, serde_json::Value)], name: &str| {
        list.iter().find(|(n, _)| n == name).map(|(_, d)| d.clone())
    };
    let takes_part = |d: &serde_json::Value| d["pruned"].as_bool() == Some(false);
    let num = |d: &serde_json::Value, field: &str| d[field].as_u64().unwrap_or(0);
    for (name, d) in &after {
        match find(&before, name) {
            None if takes_part(d) => changes.push(format!(
                "added     {name}: {} layers, windows of {}",
                num(d, "layers"),
                num(d, "w")
            )),
            None => changes.push(format!("added     {name} (pruned)")),
            Some(was) if takes_part(&was) && !takes_part(d) => changes.push(format!(
                "pruned    {name} (had {} layers): {}",
                num(&was, "layers"),
                d["pruned_reason"].as_str().unwrap_or("no layers assigned")
            )),
            Some(was) if !takes_part(&was) && takes_part(d) => changes.push(format!(
                "back      {name}: {} layers, windows of {}",
                num(d, "layers"),
                num(d, "w")
            )),
            Some(was) => {
                let moved = [("layers", "layers"), ("w", "window"), ("n", "GPU layers")]
                    .iter()
                    .filter(|(field, _)| num(&was, field) != num(d, field))
                    .map(|(field, label)| {
                        format!("{label} {} → {}", num(&was, field), num(d, field))
                    })
                    .collect::<Vec<_>>();
                if !moved.is_empty() {
                    changes.push(format!("moved     {name}: {}", moved.join(", ")));
                }
            }
        }
    }
    for (name, was) in &before {
        if find(&after, name).is_none() {
            changes.push(format!(
                "removed   {name} (had {} layers)",
                num(was, "layers")
            ));
        }
    }
    if old["k"] != new["k"] {
        changes.push(format!("k         {} → {}", old["k"], new["k"]));
    }
    let tpot = |p: &serde_json::Value| p["predicted_tpot_ms"].as_f64();
    if let (Some(a), Some(b)) = (tpot(old), tpot(&new)) {
        if format!("{a:.1}") != format!("{b:.1}") {
            changes.push(format!("predicted TPOT {a:.1} → {b:.1} ms"));
        }
    }
    changes
}

/// A profile figure for a person: rates in bytes/s are large, memory in GiB small.
fn figure(x: f64) -> String {
    if x.abs() >= 1e4 {
        format!("{x:.2e}")
    } else {
        format!("{x:.3}")
    }
}

/// Why a plan may differ from the last applied one: each figure of a device's profile
/// (in both) that moved by more than 5 %, as `device field old → new`.
pub fn profile_changes(old: &[DeviceProfile], new: &[DeviceProfile]) -> Vec<String> {
    fn numbers(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, f64)>) {
        match v {
            serde_json::Value::Number(n) => {
                out.push((prefix.to_string(), n.as_f64().unwrap_or(0.0)))
            }
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    let name = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    numbers(&name, v, out);
                }
            }
            _ => {}
        }
    }
    let figures = |p: &DeviceProfile| {
        let mut out = Vec::new();
        numbers("", &serde_json::to_value(p).unwrap_or_default(), &mut out);
        out
    };
    let mut changes = Vec::new();
    for p in new {
        let Some(was) = old.iter().find(|o| o.name == p.name) else {
            continue;
        };
        let before = figures(was);
        for (field, now) in figures(p) {
            let Some((_, then)) = before.iter().find(|(f, _)| *f == field) else {
                continue;
            };
            if (now - then).abs() > 0.05 * then.abs().max(now.abs()) {
                changes.push(format!(
                    "{} {field} {} → {}",
                    p.name,
                    figure(*then),
                    figure(now)
                ));
            }
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::DevicePlan;
    use crate::prp::NextRoute;

    fn device(name: &str, w: usize, layers: usize) -> DevicePlan {
        DevicePlan {
            name: name.into(),
            addr: "127.0.0.1:1".into(),
            w,
            n: 0,
            layers,
            relay: false,
            pruned: (layers == 0).then(|| "no layers assigned".to_string()),
            absent: false,
            mem_budget: None,
            set: None,
            forwards: None,
            next_route: NextRoute::AsHead,
            hop_ms: None,
            predicted: None,
        }
    }

    fn plan(k: usize, devices: Vec<DevicePlan>) -> Plan {
        Plan {
            scheduler: "halda",
            k,
            predicted_tpot_ms: Some(10.0 * k as f64),
            solve_ms: 1.0,
            devices,
            output_on_last: false,
            alternatives: Vec::new(),
            profiles: Vec::new(),
        }
    }

    #[test]
    fn the_same_plan_has_no_changes() {
        let p = plan(2, vec![device("a", 5, 10), device("b", 10, 20)]);
        assert!(plan_changes(&p.to_json(), &p).is_empty());
    }

    #[test]
    fn devices_added_removed_pruned_and_layers_moved_are_named() {
        let old = plan(
            2,
            vec![device("a", 5, 10), device("b", 5, 10), device("c", 5, 10)],
        );
        let new = plan(
            3,
            vec![device("a", 4, 12), device("c", 0, 0), device("d", 6, 18)],
        );
        let changes = plan_changes(&old.to_json(), &new);
        assert_eq!(
            changes,
            vec![
                "moved     a: layers 10 → 12, window 5 → 4",
                "pruned    c (had 10 layers): no layers assigned",
                "added     d: 18 layers, windows of 6",
                "removed   b (had 10 layers)",
                "k         2 → 3",
                "predicted TPOT 20.0 → 30.0 ms",
            ]
        );
    }

    #[test]
    fn profile_figures_that_moved_are_named() {
        let text = r#"
[[device]]
name = "laptop"
os = "linux"
cpu_cores = 4
cpu_gflops = { q4_k = 100, q5_k = 100, q6_k = 100, q8_0 = 100, f16 = 100, f32 = 100 }
cpu_read_gb_s = 10.0
memcpy_gb_s = 10.0
ram_total_gib = 8.0
ram_available_gib = 4.0
disk_seq_gb_s = 1.0
disk_rand_gb_s = 1.0
"#;
        let old = crate::profile::DeviceProfiles::parse(Path::new("x.toml"), text)
            .unwrap()
            .device;
        let mut new = old.clone();
        assert!(profile_changes(&old, &new).is_empty());
        new[0].ram_available_gib = 2.0;
        new[0].cpu_read_gb_s = 10.1;
        assert_eq!(
            profile_changes(&old, &new),
            vec!["laptop ram_available_gib 4.000 → 2.000"]
        );
    }
}

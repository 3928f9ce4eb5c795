//! The plan `prima apply` launches: devices in ring order (the head first), each device's
//! window size w_m and GPU layers n_m, and which devices were pruned and why.

use std::time::Instant;

use anyhow::bail;
use prima_core::manifest::{LoadedManifest, Rounds, Scheduler};
use prima_core::model::Model;
use prima_core::prp::layer_counts;

/// One device's part of the plan.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DevicePlan {
    pub name: String,
    /// Where the head reaches it ("head" for the head itself).
    pub addr: String,
    /// Window size w_m and GPU layers n_m.
    pub w: usize,
    pub n: usize,
    /// Layers it runs per token, l_m.
    pub layers: usize,
    pub relay: bool,
    /// Why it takes no part, if it doesn't.
    pub pruned: Option<String>,
    pub mem_budget: Option<u64>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Plan {
    pub scheduler: &'static str,
    pub k: usize,
    pub predicted_tpot_ms: Option<f64>,
    pub solve_ms: f64,
    /// Every device, in ring order from the head; pruned ones included (and skipped by
    /// [`Plan::ring`]).
    pub devices: Vec<DevicePlan>,
}

impl Plan {
    /// The devices in the ring, head first.
    pub fn ring(&self) -> impl Iterator<Item = &DevicePlan> {
        self.devices.iter().filter(|d| d.pruned.is_none())
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "scheduler": self.scheduler,
            "k": self.k,
            "predicted_tpot_ms": self.predicted_tpot_ms,
            "solve_ms": self.solve_ms,
            "devices": self.devices.iter().map(|d| serde_json::json!({
                "name": d.name,
                "addr": d.addr,
                "w": d.w,
                "n": d.n,
                "layers": d.layers,
                "pruned": d.pruned.is_some(),
                "pruned_reason": d.pruned,
                "relay": d.relay,
            })).collect::<Vec<_>>(),
        })
    }

    pub fn print_table(&self) {
        let total: usize = self.devices.iter().map(|d| d.layers).sum::<usize>().max(1);
        eprintln!(
            "plan ({} scheduler, k = {}{}):",
            self.scheduler,
            self.k,
            self.predicted_tpot_ms
                .map(|t| format!(", predicted TPOT {t:.1} ms"))
                .unwrap_or_default()
        );
        eprintln!(
            "  {:<12} {:<22} {:>4} {:>4} {:>7} {:>7}  note",
            "device", "address", "w", "n", "layers", "share"
        );
        for d in &self.devices {
            let note = match (&d.pruned, d.relay) {
                (Some(why), _) => format!("pruned: {why}"),
                (None, true) => "relay only".to_string(),
                _ => String::new(),
            };
            eprintln!(
                "  {:<12} {:<22} {:>4} {:>4} {:>7} {:>6.0}%  {}",
                d.name,
                d.addr,
                d.w,
                d.n,
                d.layers,
                100.0 * d.layers as f64 / total as f64,
                note
            );
        }
    }
}

/// Plans the manifest's devices for `model`; `addr_of` gives the address of the nodes
/// this apply started.
pub fn plan(
    manifest: &LoadedManifest,
    model: &Model,
    head: usize,
    addr_of: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Plan> {
    let started = Instant::now();
    let m = &manifest.manifest;
    let n_devices = m.devices.len();
    // Ring order: the head, then the manifest's order after it, wrapping round.
    let order: Vec<usize> = (0..n_devices).map(|i| (head + i) % n_devices).collect();
    let n_layers = model.hparams().n_layers;
    let mut w: Vec<usize> = match m.policy.scheduler {
        Scheduler::Manual => {
            let given = m.policy.windows.as_deref().unwrap_or(&[]);
            order
                .iter()
                .map(|&i| given.get(i).copied().unwrap_or(0))
                .collect()
        }
        _ => proportional_windows(manifest, &order, n_layers),
    };
    for (pos, &i) in order.iter().enumerate() {
        if m.devices[i].relay_only {
            w[pos] = 0;
        }
    }
    if w[0] == 0 && w.iter().all(|&x| x == 0) {
        bail!(
            "{}: the plan gives no device any layer",
            manifest.path.display()
        );
    }
    let counts = layer_counts(n_layers, &w, &vec![0; w.len()])?;
    let k = n_layers.div_ceil(w.iter().sum::<usize>());
    let devices = order
        .iter()
        .enumerate()
        .map(|(pos, &i)| {
            let d = &m.devices[i];
            let addr = if pos == 0 {
                "head".to_string()
            } else {
                d.address
                    .clone()
                    .or_else(|| addr_of(&d.name))
                    .unwrap_or_default()
            };
            let pruned = (counts[pos].0 == 0 && !d.relay_only && pos != 0)
                .then(|| "no layers assigned".to_string());
            DevicePlan {
                name: d.name.clone(),
                addr,
                w: w[pos],
                n: 0,
                layers: counts[pos].0,
                relay: d.relay_only,
                pruned,
                mem_budget: d.mem_budget.map(|s| s.0),
            }
        })
        .collect();
    Ok(Plan {
        scheduler: match m.policy.scheduler {
            Scheduler::Halda => "halda",
            Scheduler::Mem => "mem",
            Scheduler::Perf => "perf",
            Scheduler::Manual => "manual",
        },
        k,
        predicted_tpot_ms: None,
        solve_ms: started.elapsed().as_secs_f64() * 1e3,
        devices,
    })
}

/// Windows in proportion to each device's memory budget (equal shares without budgets),
/// split over the manifest's fixed k (1 when auto).
fn proportional_windows(manifest: &LoadedManifest, order: &[usize], n_layers: usize) -> Vec<usize> {
    let m = &manifest.manifest;
    let k = match m.policy.k {
        Rounds::Fixed(k) => k,
        Rounds::Auto => 1,
    };
    let weight: Vec<f64> = order
        .iter()
        .map(|&i| {
            let d = &m.devices[i];
            if d.relay_only {
                0.0
            } else {
                d.mem_budget.map_or(1.0, |s| s.0 as f64)
            }
        })
        .collect();
    let total: f64 = weight.iter().sum::<f64>().max(f64::MIN_POSITIVE);
    let per_round = n_layers.div_ceil(k);
    // Largest remainder rounding, so the windows add up to exactly one round.
    let exact: Vec<f64> = weight
        .iter()
        .map(|x| x / total * per_round as f64)
        .collect();
    let mut w: Vec<usize> = exact.iter().map(|x| x.floor() as usize).collect();
    let mut left = per_round - w.iter().sum::<usize>();
    let mut by_fraction: Vec<usize> = (0..w.len()).collect();
    by_fraction
        .sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())));
    for i in by_fraction {
        if left == 0 {
            break;
        }
        if weight[i] > 0.0 {
            w[i] += 1;
            left -= 1;
        }
    }
    w
}

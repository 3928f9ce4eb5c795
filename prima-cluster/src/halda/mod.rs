//! Halda: decides, for every device, how many layers it takes per window (w_m), how many
//! of those run on its GPU (n_m), the number of rounds k, and which devices should not
//! take part at all — from the devices' profiles and the model's profile.
//!
//! - [`model_profile`]: the model profiler (per-layer FLOPs and bytes from GGUF metadata).
//! - [`os`]: per-platform memory behaviour, from the OS memory plugins (one model per OS).
//! - [`lda`]: the LDA model of the paper's appendix (α, β, ξ, κ, a, b, c, z, z^{gpu}) and
//!   the latency prediction every plan is scored with.
//! - [`ilp`]: the ILP for one k; [`iteration`]: the set iteration with calibration.
//! - [`baselines`]: MemSched and PerfSched, for the paper's ablations.
//!
//! This module does no I/O and knows no solver: it builds [`MilpProblem`]s and hands
//! them to a [`MilpSolver`] (in the binary, the `solver-highs` plugin), and it asks
//! [`MemoryModels`] (in the binary, the OS memory plugins) how each device's OS behaves.

pub mod baselines;
pub mod ilp;
pub mod iteration;
pub mod lda;
pub mod model_profile;
pub mod os;
pub mod synth;

use std::time::Instant;

use serde::Serialize;

pub use iteration::{HaldaError, HaldaSolution};
pub use lda::{Cost, Lda, OutputPolicy, PlanOptions, Prediction};
pub use model_profile::{ModelProfile, UNFORESEEN_ROUTING};
pub use os::{LdaSet, MemoryModels, NoMemoryModel};

use crate::profile::DeviceProfile;
use prima_abi::solver::{MilpProblem, MilpSolution};
use prima_core::plugin::LoadedSolver;

/// Anything that solves a generic MILP; the solver plugin, or a test double.
pub trait MilpSolver {
    fn solve(&self, problem: &MilpProblem) -> Result<MilpSolution, String>;
}

impl MilpSolver for LoadedSolver {
    fn solve(&self, problem: &MilpProblem) -> Result<MilpSolution, String> {
        LoadedSolver::solve(self, problem)
    }
}

/// Which partitioning rule produced a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Scheduler {
    /// The LDA model solved by set iteration over per-k ILPs, with device pruning.
    Halda,
    /// Layers in proportion to memory (exo; prima.cpp without Halda).
    Mem,
    /// Layers in proportion to compute, then memory fixes (Galaxy).
    Perf,
}

/// One device's part in a plan.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedDevice {
    pub name: String,
    /// w_m and n_m (0 for a pruned device).
    pub w: u32,
    pub n: u32,
    /// The set the device is in (none when pruned).
    pub set: Option<LdaSet>,
    pub pruned: bool,
    /// Pruned but kept in the ring as a hop, without layers.
    pub relay: bool,
    /// Why it was pruned.
    pub reason: Option<String>,
    /// What it does under the plan (absent when pruned).
    pub load: Option<lda::DeviceLoad>,
}

/// The predicted time per token split as the paper splits it, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct BreakdownMs {
    pub compute_ms: f64,
    pub memory_ms: f64,
    pub disk_ms: f64,
    pub network_ms: f64,
}

/// A layer-to-device assignment and its predicted time per token.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub scheduler: Scheduler,
    pub model: String,
    pub n_layers: u32,
    /// k: rounds per token (windows per device).
    pub k: u32,
    pub predicted_tpot_ms: f64,
    pub breakdown: BreakdownMs,
    pub solve_ms: f64,
    /// Set-assignment rounds and ILPs of the final Halda solve (0 for baselines).
    pub iterations: u32,
    pub ilps: u32,
    pub devices: Vec<PlannedDevice>,
    /// The device that runs the output layer: the head, or the one that runs the last
    /// layer (`policy.output = "auto"`).
    pub output_device: String,
    /// What the plan was chosen over: each other shape Halda predicted (the ring, a
    /// device alone with the head embedding and sampling, the head alone).
    pub alternatives: Vec<Alternative>,
}

/// A plan shape Halda weighed, and its predicted time per token.
#[derive(Debug, Clone, Serialize)]
pub struct Alternative {
    pub shape: String,
    pub predicted_tpot_ms: f64,
}

impl Plan {
    /// The devices that take layers.
    pub fn active(&self) -> impl Iterator<Item = &PlannedDevice> {
        self.devices.iter().filter(|d| !d.pruned)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("model {model} has {layers} layers, fewer than the {devices} devices")]
    TooFewLayers {
        model: String,
        layers: u32,
        devices: usize,
    },
    #[error("the halda scheduler needs a solver plugin")]
    NoSolver,
    #[error(transparent)]
    Halda(#[from] HaldaError),
    #[error(transparent)]
    NoMemoryModel(#[from] NoMemoryModel),
}

/// Plans `model` on `devices` (ring order, the first is the head) with `scheduler`, each
/// device's memory behaviour from `os`.
pub fn plan(
    model: &ModelProfile,
    devices: &[DeviceProfile],
    scheduler: Scheduler,
    solver: Option<&dyn MilpSolver>,
    os: &dyn MemoryModels,
    opts: &PlanOptions,
) -> Result<Plan, PlanError> {
    if (model.n_layers as usize) < devices.len() {
        return Err(PlanError::TooFewLayers {
            model: model.name.clone(),
            layers: model.n_layers,
            devices: devices.len(),
        });
    }
    let start = Instant::now();
    let all: Vec<&DeviceProfile> = devices.iter().collect();
    match scheduler {
        Scheduler::Halda => {
            let solver = solver.ok_or(PlanError::NoSolver)?;
            let (active, (solution, output_at), reasons) =
                halda_with_pruning(model, &all, solver, os, opts)?;
            let relays: Vec<&DeviceProfile> = pruned_relays(&all, &active);
            let act: Vec<&DeviceProfile> = active.iter().map(|&i| all[i]).collect();
            let lda = Lda::with_output_at(model, &act, &relays, os, opts, output_at)?;
            let prediction = lda.predict(&solution.w, &solution.n);
            let ring = prediction.total_s;
            let mut plan = assemble(
                model,
                &all,
                scheduler,
                &active,
                &solution.w,
                &solution.n,
                &solution.sets,
                solution.k,
                prediction,
                0.0,
                (solution.iterations, solution.ilps),
                &reasons,
                active[output_at],
            );
            // The ring that steps aside: one device with every layer while the head only
            // embeds and samples, or the head alone, when predicted faster.
            let shapes = alone_shapes(model, &all, os, opts)?;
            let ring_shape = format!("ring of {} ({} with layers)", all.len(), active.len());
            let mut alternatives = vec![Alternative {
                shape: ring_shape,
                predicted_tpot_ms: ring * 1e3,
            }];
            let mut best: Option<(f64, AloneShape)> = None;
            for shape in shapes {
                alternatives.push(Alternative {
                    shape: shape.describe(&all),
                    predicted_tpot_ms: shape.prediction.total_s * 1e3,
                });
                if shape.prediction.total_s < best.as_ref().map_or(ring, |b| b.0) {
                    best = Some((shape.prediction.total_s, shape));
                }
            }
            if let Some((_, shape)) = best {
                let why = format!(
                    "{}: {:.1} ms per token predicted, against the ring's {:.1} ms",
                    shape.describe(&all),
                    shape.prediction.total_s * 1e3,
                    ring * 1e3
                );
                let reasons: Vec<(usize, String)> = (0..all.len())
                    .filter(|i| !shape.active.contains(i))
                    .map(|i| (i, why.clone()))
                    .collect();
                plan = assemble(
                    model,
                    &all,
                    scheduler,
                    &shape.active,
                    &shape.w,
                    &shape.n,
                    &shape.sets,
                    1,
                    shape.prediction,
                    0.0,
                    (solution.iterations, solution.ilps),
                    &reasons,
                    shape.output,
                );
            }
            plan.alternatives = alternatives;
            plan.solve_ms = start.elapsed().as_secs_f64() * 1e3;
            Ok(plan)
        }
        Scheduler::Mem | Scheduler::Perf => {
            let lda = Lda::new(model, &all, &[], os, opts)?;
            let placement = if scheduler == Scheduler::Mem {
                baselines::mem_sched(&lda, &baselines::memory_weights(&all))
            } else {
                baselines::perf_sched(&lda)
            };
            let prediction = lda.predict(&placement.w, &placement.n);
            let wf: Vec<f64> = placement.w.iter().map(|&v| v as f64).collect();
            let nf: Vec<f64> = placement.n.iter().map(|&v| v as f64).collect();
            let sets = lda.assign_sets(&wf, &nf, &vec![false; all.len()]);
            let active: Vec<usize> = (0..all.len()).collect();
            let solve_ms = start.elapsed().as_secs_f64() * 1e3;
            Ok(assemble(
                model,
                &all,
                scheduler,
                &active,
                &placement.w,
                &placement.n,
                &sets,
                1,
                prediction,
                solve_ms,
                (0, 0),
                &[],
                0,
            ))
        }
    }
}

/// The pruned devices that stay in the ring as hops: relays, and the head, which always
/// embeds and samples.
fn pruned_relays<'a>(all: &[&'a DeviceProfile], active: &[usize]) -> Vec<&'a DeviceProfile> {
    all.iter()
        .enumerate()
        .filter(|(i, d)| (d.relay || *i == 0) && !active.contains(i))
        .map(|(_, d)| *d)
        .collect()
}

/// A plan with one device computing: every layer on device `active[last]`, the head (when
/// it is another) only embedding and sampling with no layers.
struct AloneShape {
    /// Indices into the full device list: the head and the device, or the head alone.
    active: Vec<usize>,
    w: Vec<u32>,
    n: Vec<u32>,
    sets: Vec<LdaSet>,
    /// The full list's index of the device that runs the output layer.
    output: usize,
    prediction: Prediction,
}

impl AloneShape {
    fn describe(&self, all: &[&DeviceProfile]) -> String {
        let device = &all[*self.active.last().unwrap_or(&0)].name;
        match self.active.len() {
            1 => format!("the head {device} alone"),
            _ => format!(
                "{device} alone with every layer{}, the head {} embedding and sampling",
                if self.output == 0 {
                    " (the output layer on the head)"
                } else {
                    " and the output layer"
                },
                all[0].name
            ),
        }
    }
}

/// T of a device alone with the output layer, the head a hop that embeds and samples:
/// the device computes each next step while the head samples (`prp/run_ahead.rs`), so
/// its own work and the round trip overlap, T = max(own, trip). Its own work is at its
/// CPU quota's sustained rate, not a turn's burst: it never idles to refill the quota.
fn run_ahead_tpot(lda: &Lda, p: &Prediction, cpu_layers: u32, gpu_layers: u32) -> f64 {
    let (Some(head), Some(dev)) = (p.devices.first(), p.devices.last()) else {
        return p.total_s;
    };
    let d = &lda.devices[lda.devices.len() - 1];
    let sustained =
        cpu_layers as f64 * d.cpu_layer_s + d.out_compute_s + gpu_layers as f64 * d.gpu_layer_s;
    let own = sustained.max(dev.cost.compute_s) + dev.cost.memory_s + dev.cost.disk_s;
    let trip = p.breakdown.network_s + head.cost.compute_s + head.cost.memory_s + head.cost.disk_s;
    own.max(trip)
}

/// The head alone, and each other device alone (GPU filled first) with the head as a
/// hop; each with its predicted time per token.
fn alone_shapes(
    model: &ModelProfile,
    all: &[&DeviceProfile],
    os: &dyn MemoryModels,
    opts: &PlanOptions,
) -> Result<Vec<AloneShape>, PlanError> {
    let layers = model.n_layers;
    let mut shapes = Vec::with_capacity(all.len());
    for m in 0..all.len() {
        let (active, w): (Vec<usize>, Vec<u32>) = if m == 0 {
            (vec![0], vec![layers])
        } else {
            (vec![0, m], vec![0, layers])
        };
        let act: Vec<&DeviceProfile> = active.iter().map(|&i| all[i]).collect();
        let relays: Vec<&DeviceProfile> = all
            .iter()
            .enumerate()
            .filter(|(i, d)| d.relay && !active.contains(i))
            .map(|(_, d)| *d)
            .collect();
        let output_at = match opts.output {
            OutputPolicy::Auto | OutputPolicy::Last => act.len() - 1,
            OutputPolicy::Head => 0,
        };
        let lda = Lda::with_output_at(model, &act, &relays, os, opts, output_at)?;
        let last = act.len() - 1;
        let mut n = vec![0; act.len()];
        n[last] = lda.gpu_cap(last, 1).min(layers);
        let wf: Vec<f64> = w.iter().map(|&v| v as f64).collect();
        let nf: Vec<f64> = n.iter().map(|&v| v as f64).collect();
        let sets = lda.assign_sets(&wf, &nf, &vec![false; act.len()]);
        let mut prediction = lda.predict(&w, &n);
        if m > 0 && output_at == last {
            prediction.total_s = run_ahead_tpot(&lda, &prediction, layers - n[last], n[last]);
        }
        shapes.push(AloneShape {
            output: active[output_at],
            active,
            w,
            n,
            sets,
            prediction,
        });
    }
    Ok(shapes)
}

/// What device selection settled on: the active devices (indices into the full list),
/// their solution with the index (among them) of the device that runs the output layer,
/// and why each removed device was removed.
type Selection = (Vec<usize>, (HaldaSolution, usize), Vec<(usize, String)>);

/// Device selection: devices left with a single layer per window are removed and the
/// problem solved again, for as long as removing them does not make T worse — a device
/// the solver keeps at w_m = 1 because the others lack memory is needed, not weak.
fn halda_with_pruning(
    model: &ModelProfile,
    all: &[&DeviceProfile],
    solver: &dyn MilpSolver,
    os: &dyn MemoryModels,
    opts: &PlanOptions,
) -> Result<Selection, PlanError> {
    // Under `output = "auto"` the output layer runs on the head or on the last device,
    // whichever gives the lower T; on the head when it has no layers only if asked to.
    let solve_on = |active: &[usize]| -> Result<(HaldaSolution, usize), PlanError> {
        let act: Vec<&DeviceProfile> = active.iter().map(|&i| all[i]).collect();
        let relays = pruned_relays(all, active);
        let last = act.len() - 1;
        let places: &[usize] = match opts.output {
            OutputPolicy::Auto if last > 0 && active[0] == 0 => &[0, last],
            OutputPolicy::Auto | OutputPolicy::Last => &[last],
            OutputPolicy::Head => &[0],
        };
        let mut best: Option<(HaldaSolution, usize)> = None;
        for &at in places {
            let lda = Lda::with_output_at(model, &act, &relays, os, opts, at)?;
            match iteration::solve_with_overlap(&lda, solver, opts) {
                Ok(s) if best.as_ref().is_none_or(|b| s.objective < b.0.objective) => {
                    best = Some((s, at));
                }
                Ok(_) => {}
                Err(e) if best.is_none() && at == *places.last().unwrap_or(&0) => {
                    return Err(e.into())
                }
                Err(_) => {}
            }
        }
        best.ok_or(PlanError::Halda(HaldaError::Infeasible))
    };
    let mut active: Vec<usize> = (0..all.len()).collect();
    let mut solution = solve_on(&active)?;
    let mut reasons = Vec::new();
    loop {
        let ones: Vec<usize> = (0..active.len())
            .filter(|&j| solution.0.w[j] == 1)
            .collect();
        if ones.is_empty() || active.len() == 1 {
            break;
        }
        // All single-layer devices at once, as the paper does; if that makes T worse (or
        // leaves nobody), each of them alone.
        let mut tries: Vec<Vec<usize>> = Vec::new();
        if ones.len() < active.len() {
            tries.push(ones.clone());
        }
        if ones.len() > 1 {
            tries.extend(ones.iter().map(|&j| vec![j]));
        }
        let mut accepted = None;
        for removed in tries {
            let keep: Vec<usize> = (0..active.len())
                .filter(|j| !removed.contains(j))
                .map(|j| active[j])
                .collect();
            match solve_on(&keep) {
                Ok(c) if c.0.objective <= solution.0.objective => {
                    accepted = Some((removed, keep, c));
                    break;
                }
                Ok(_) | Err(PlanError::Halda(HaldaError::Infeasible)) => continue,
                Err(e) => return Err(e),
            }
        }
        let Some((removed, keep, candidate)) = accepted else {
            break;
        };
        for &j in &removed {
            reasons.push((
                active[j],
                prune_note(
                    candidate.0.objective * 1e3,
                    solution.0.objective * 1e3,
                    removed.len(),
                ),
            ));
        }
        active = keep;
        solution = candidate;
    }
    Ok((active, solution, reasons))
}

/// Why a device with one layer per window was pruned: the ring was planned again
/// without it (and the `removed` − 1 others pruned with it), and the two predictions
/// compared.
fn prune_note(without_ms: f64, with_ms: f64, removed: usize) -> String {
    let without = match removed {
        1 => "without it".to_string(),
        n => format!("without the {n} devices given one layer"),
    };
    if (without_ms * 10.0).round() < (with_ms * 10.0).round() {
        format!(
            "it got one layer per window; the ring {without} is faster: \
             {without_ms:.1} ms per token, against {with_ms:.1} ms"
        )
    } else {
        format!(
            "it got one layer per window; the ring {without} is as fast \
             ({without_ms:.1} ms per token) with fewer hops"
        )
    }
}

#[allow(clippy::too_many_arguments)]
fn assemble(
    model: &ModelProfile,
    all: &[&DeviceProfile],
    scheduler: Scheduler,
    active: &[usize],
    w: &[u32],
    n: &[u32],
    sets: &[LdaSet],
    k: u32,
    prediction: Prediction,
    solve_ms: f64,
    (iterations, ilps): (u32, u32),
    reasons: &[(usize, String)],
    output: usize,
) -> Plan {
    let devices = all
        .iter()
        .enumerate()
        .map(|(i, d)| match active.iter().position(|&a| a == i) {
            Some(j) => PlannedDevice {
                name: d.name.clone(),
                w: w[j],
                n: n[j],
                set: Some(sets[j]),
                pruned: false,
                relay: false,
                reason: None,
                load: Some(prediction.devices[j].clone()),
            },
            None => PlannedDevice {
                name: d.name.clone(),
                w: 0,
                n: 0,
                set: None,
                pruned: true,
                relay: d.relay,
                reason: reasons
                    .iter()
                    .find(|(r, _)| *r == i)
                    .map(|(_, why)| why.clone()),
                load: None,
            },
        })
        .collect();
    let ms = |s: f64| s * 1e3;
    Plan {
        scheduler,
        model: model.name.clone(),
        n_layers: model.n_layers,
        k,
        predicted_tpot_ms: ms(prediction.total_s),
        breakdown: BreakdownMs {
            compute_ms: ms(prediction.breakdown.compute_s),
            memory_ms: ms(prediction.breakdown.memory_s),
            disk_ms: ms(prediction.breakdown.disk_s),
            network_ms: ms(prediction.breakdown.network_s),
        },
        solve_ms,
        iterations,
        ilps,
        devices,
        output_device: all[output].name.clone(),
        alternatives: Vec::new(),
    }
}

//! The layer-to-device assignment (LDA) model of the paper's appendix: per-device
//! coefficients α_m, β_m, ξ_m, the constant κ, the objective vectors a, b, c for a set
//! assignment M1–M4, the RAM bounds z and VRAM bounds z^{gpu}, and the latency model
//! itself ([`Lda::predict`]) that every scheduler's plan is scored with.

use serde::Serialize;

use super::model_profile::{ModelProfile, MoeProfile};
use super::os::{LdaSet, MemoryBehaviour, MemoryModels, MemoryTerms, NoMemoryModel};
use crate::profile::{DeviceProfile, GpuKind, QuantClass, GB, GIB};

/// Planning options.
#[derive(Debug, Clone, Copy)]
pub struct PlanOptions {
    /// n_{kv}: tokens of KV cache the plan provisions for, per slot.
    pub n_kv: f64,
    /// Slots (continuous batching's independent contexts): every device keeps a KV cache
    /// of n_{kv} tokens per slot for each of its layers, so a layer with its KV cache is
    /// b' = b + 2(h_k·e_k + h_v·e_v)·n_{kv}·slots. Compute stays one sequence's.
    pub n_slots: usize,
    /// s^{disk}_{threshold}: a disk slower than this (bytes/s) never takes reloads (M4).
    pub disk_threshold: f64,
    /// Time limit of one ILP solve, seconds.
    pub ilp_time_limit_s: f64,
    /// Solve the exact epigraph program instead of the paper's set iteration.
    pub exact: bool,
    /// Solve the ILP of every valid k, even those k = 1 provably dominates.
    pub every_k: bool,
    /// Where the output layer (final norm and output matrix) may run.
    pub output: OutputPolicy,
}

/// Where the output layer may run: a manifest's `policy.output`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum OutputPolicy {
    /// On the head, as the paper keeps it: no other device sees logits.
    Head,
    /// On the head or on the device that runs the last layer, whichever Halda predicts
    /// faster; the head still embeds the tokens and samples.
    #[default]
    Auto,
    /// On the device that runs the last layer.
    Last,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            n_kv: 4096.0,
            n_slots: 1,
            // The paper names the threshold but not its value. With the read-ahead thread a
            // disk streams behind the other devices' turns, so only a disk too slow to
            // keep up with a ring (an SD card, a spinning disk) is "slow"; the d1-d4 bed's
            // phone, at 150 MB/s (a tenth of its UFS, as the bed scales every disk), is not.
            disk_threshold: 0.1 * GB,
            ilp_time_limit_s: 1.0,
            exact: false,
            every_k: false,
            // The paper's placement unless a manifest says otherwise.
            output: OutputPolicy::Head,
        }
    }
}

/// One device's constants, derived from its profile and the model.
#[derive(Clone)]
pub struct DeviceTerms {
    pub name: String,
    pub behaviour: MemoryBehaviour,
    pub has_gpu: bool,
    pub head: bool,
    /// Runs the output layer (the head, or the last device of the ring).
    pub output: bool,
    /// Σ_q f^q / s^{cpu,q}: compute time of one layer on the CPU.
    pub cpu_layer_s: f64,
    /// The CPU quota's share of the cores (1 without one): `cpu_layer_s` is at the
    /// quota's sustained rate, a turn within the quota's period runs 1/share faster.
    pub quota_share: f64,
    /// Σ_q f^q / s^{gpu,q}.
    pub gpu_layer_s: f64,
    /// t_m^{kv_cpy,cpu}, t_m^{kv_cpy,gpu}.
    pub t_kv_cpu: f64,
    pub t_kv_gpu: f64,
    /// b'/𝒯_m^{cpu}, b'/𝒯_m^{gpu}: loading one layer (and its KV) into registers.
    pub load_cpu_s: f64,
    pub load_gpu_s: f64,
    /// (t^{ram-vram} + t^{vram-ram})(1 − 𝕀^{UMA}), per window.
    pub t_dev_copy: f64,
    /// t_m^{comm}: sending 4e bytes to the next device.
    pub t_comm: f64,
    /// α_m, β_m, ξ_m.
    pub alpha: f64,
    pub beta: f64,
    pub xi: f64,
    /// s_m^{disk} as this platform's reloads see it.
    pub s_disk: f64,
    /// What the linear cost terms (the ILPs' a_m, κ, and reload rows) divide a byte of
    /// overload by: s_m^{disk} for a dense model, where every byte left out of memory is
    /// read each token; s_m^{disk}·n/k for a mixture of experts, where the bytes left out
    /// are experts and a token reads k/n of them on average ([`MoeProfile::read_fraction`]).
    pub s_reload: f64,
    /// The memory budget before weights are evicted (d^{avail}, d^{avail}_{metal}, …).
    pub budget: f64,
    pub slow_disk: bool,
    pub mem: MemoryTerms,
    /// VRAM (or Metal working set) left for layers: d^{avail}_{gpu} − c^{gpu} (− b_o on a
    /// Metal head).
    pub gpu_layer_bytes: f64,
    /// The output layer, on the device that runs it: Σ_q f_out^q/s^{cpu,q}, and what of
    /// reading it, (b_i/V + b_o)/𝒯^{cpu}, that compute does not cover.
    pub out_compute_s: f64,
    pub out_load_s: f64,
    /// The head's lookup-table read, b_i/V.
    pub lookup_bytes: f64,
}

/// The model: the devices in ring order (the first is the head) and the model's costs.
#[derive(Clone)]
pub struct Lda {
    /// L.
    pub n_layers: u32,
    pub devices: Vec<DeviceTerms>,
    /// b': bytes of one layer with its KV cache.
    pub b_prime: f64,
    /// Σ t^{comm} of pruned devices kept as relays: paid once per window round.
    pub relay_hop_s: f64,
    /// A mixture of experts' layout and routing (`None`: a dense model).
    pub moe: Option<MoeProfile>,
    /// Which device runs the output layer: 0 (the head) or the last.
    pub output_at: usize,
}

/// Predicted time of one token on one device, split as the paper splits it.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Cost {
    pub compute_s: f64,
    pub memory_s: f64,
    pub disk_s: f64,
    pub network_s: f64,
}

impl Cost {
    pub fn total(&self) -> f64 {
        self.compute_s + self.memory_s + self.disk_s + self.network_s
    }

    fn add(&mut self, o: &Cost) {
        self.compute_s += o.compute_s;
        self.memory_s += o.memory_s;
        self.disk_s += o.disk_s;
        self.network_s += o.network_s;
    }
}

/// What one device does and uses under a placement.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceLoad {
    /// l_m and l_m^{gpu}: layers per token on this device, and of those on its GPU.
    pub l: u32,
    pub l_gpu: u32,
    /// 𝒲_m: windows per token.
    pub windows: u32,
    pub ram_bytes: f64,
    pub budget_bytes: f64,
    pub vram_bytes: f64,
    pub vram_capacity_bytes: f64,
    pub reload_bytes: f64,
    pub cost: Cost,
}

/// T = Σ_m (T^{comp} + T^{mem} + T^{disk} + T^{comm}), with each device's share — or,
/// when a device streams at k ≥ 2 rounds, its own cycle if that is longer (the breakdown
/// is then the sum's, and `total_s` above it).
#[derive(Debug, Clone, Serialize)]
pub struct Prediction {
    pub total_s: f64,
    pub breakdown: Cost,
    pub devices: Vec<DeviceLoad>,
}

/// The objective of one set assignment: T = k(aᵀw + bᵀn + eᵀc) + κ (+ relay hops).
#[derive(Debug, Clone)]
pub struct Objective {
    pub a: Vec<f64>,
    pub b: Vec<f64>,
    pub c: Vec<f64>,
    pub kappa: f64,
}

/// The CFS period a CPU quota is granted over (Linux's default `cpu.cfs_period_us`).
const QUOTA_PERIOD_S: f64 = 0.1;

/// Wall time of `sustained_s` of CPU work, timed at a quota's sustained rate, when it
/// runs as one turn of a ring device that idles in between: a quota grants `share` of
/// each period at the full rate, so a turn of at most share·P CPU time runs unthrottled;
/// a longer one is throttled for the rest of each period it spans. (The home lab's d4,
/// 0.15 of a core, ran its 3 layers in 8.5 ms a token: a core's speed, not 0.15 of it.)
fn quota_burst(sustained_s: f64, share: f64) -> f64 {
    if share >= 1.0 || sustained_s <= 0.0 {
        return sustained_s;
    }
    let busy = sustained_s * share;
    if busy <= share * QUOTA_PERIOD_S {
        busy
    } else {
        (busy / share - QUOTA_PERIOD_S * (1.0 - share)).max(busy)
    }
}

impl Lda {
    /// Derives every device's constants, its memory behaviour from `os` (the OS memory
    /// plugins). `relays` are pruned devices kept as ring hops.
    pub fn new(
        model: &ModelProfile,
        devices: &[&DeviceProfile],
        relays: &[&DeviceProfile],
        os: &dyn MemoryModels,
        opts: &PlanOptions,
    ) -> Result<Lda, NoMemoryModel> {
        Lda::with_output_at(model, devices, relays, os, opts, 0)
    }

    /// [`Lda::new`] with the output layer on device `output_at` (0, the head, or the
    /// last device, which runs the model's last layer).
    pub fn with_output_at(
        model: &ModelProfile,
        devices: &[&DeviceProfile],
        relays: &[&DeviceProfile],
        os: &dyn MemoryModels,
        opts: &PlanOptions,
        output_at: usize,
    ) -> Result<Lda, NoMemoryModel> {
        let output_at = output_at.min(devices.len().saturating_sub(1));
        // A device alone, with nobody to pass activations to.
        let alone = devices.len() == 1 && relays.is_empty();
        let n_kv = opts.n_kv;
        let b = model.layer_bytes;
        let slots = opts.n_slots.max(1) as f64;
        let b_prime = model.layer_bytes_with_kv(n_kv * slots);
        // What a token reads of a layer: b' for a dense model, the shared part and k
        // experts (and the cache) for a mixture of experts.
        let read_prime = model.layer_read_bytes_with_kv(n_kv * slots);
        let read_fraction = model.moe.as_ref().map(MoeProfile::read_fraction);
        let f = model.layer_flops(n_kv);
        let hidden_bytes = 4.0 * model.n_embd as f64;
        // t^{kv_cpy}: each slot's new token is written to its cache every step.
        let kv_token = model.kv_bytes_per_token * slots;
        let lookup = model.input_row_bytes();
        let comm = |d: &DeviceProfile| match &d.link {
            Some(link) if !alone => link.rtt_ms / 2000.0 + hidden_bytes / link.bytes_per_s,
            _ => 0.0,
        };
        let terms = devices
            .iter()
            .enumerate()
            .map(|(m, d)| {
                let head = m == 0;
                let output = m == output_at;
                let lookup_here = if head { lookup } else { 0.0 };
                let behaviour = os.behaviour_for(d).map_err(|reason| NoMemoryModel {
                    device: d.name.clone(),
                    reason,
                })?;
                let time = |rates: &crate::profile::QuantRates, flops: &[f64; 6]| -> f64 {
                    QuantClass::ALL
                        .iter()
                        .map(|&q| flops[q.index()] / rates.flops_per_s(q))
                        .sum()
                };
                let cpu_layer_s = time(&d.cpu_gflops, &f);
                let t_kv_cpu = kv_token / (d.memcpy_gb_s * GB);
                let load_cpu_s = read_prime / (d.cpu_read_gb_s * GB);
                let (gpu_layer_s, t_kv_gpu, load_gpu_s) = match (&d.gpu_gflops, d.gpu_read_gb_s) {
                    (Some(rates), Some(read)) if d.has_gpu() => (
                        time(rates, &f),
                        kv_token / (d.gpu_memcpy_gb_s.unwrap_or(read) * GB),
                        read_prime / (read * GB),
                    ),
                    _ => (0.0, 0.0, 0.0),
                };
                let t_dev_copy = if d.has_gpu() && !d.uma() {
                    2.0 * d.gpu_copy_ms / 1000.0
                } else {
                    0.0
                };
                let t_comm = comm(d);
                // The paper's α_m = Σ f/s^{cpu} + t^{kv_cpy,cpu} + b'/𝒯^{cpu} adds the
                // compute to the reading of the weights; but a layer's matmuls stream its
                // weights while they compute, so a layer costs the slower of the two
                // (measured: the 3B on one home-lab device, 305 ms a token where the sum
                // predicted 528 ms). α_m = max(Σ f/s^{cpu}, t^{kv_cpy,cpu} + b'/𝒯^{cpu}).
                let alpha = cpu_layer_s.max(t_kv_cpu + load_cpu_s);
                // β_m = max(Σ f/s^{gpu}, t^{kv_cpy,gpu} + b'/𝒯^{gpu}) − α_m
                let beta = if d.has_gpu() {
                    gpu_layer_s.max(t_kv_gpu + load_gpu_s) - alpha
                } else {
                    0.0
                };
                // ξ_m = (t^{ram-vram} + t^{vram-ram})(1 − 𝕀^{UMA}) + t^{comm}
                let xi = t_dev_copy + t_comm;
                let io = lookup_here + if output { model.output_bytes } else { 0.0 };
                let mem = MemoryTerms {
                    b,
                    b_prime,
                    io,
                    c_cpu: model.c_cpu,
                    c_gpu: model.c_gpu,
                };
                let s_disk = behaviour.disk_bytes_per_s(d);
                let s_reload = match read_fraction {
                    Some(f) if f > 0.0 => s_disk / f,
                    _ => s_disk,
                };
                let budget = behaviour.budget_bytes(d);
                let gpu_layer_bytes = match d.gpu {
                    GpuKind::None => 0.0,
                    GpuKind::Cuda => d.gpu_available_gib * GIB - model.c_gpu,
                    GpuKind::Metal => {
                        d.gpu_available_gib * GIB
                            - model.c_gpu
                            - if output { model.output_bytes } else { 0.0 }
                    }
                };
                let out_compute_s = if output {
                    time(&d.cpu_gflops, &model.output_flops)
                } else {
                    0.0
                };
                // Likewise the output head: only the reading its compute does not cover.
                let out_load_s = if output {
                    ((lookup_here + model.output_bytes) / (d.cpu_read_gb_s * GB) - out_compute_s)
                        .max(0.0)
                } else {
                    0.0
                };
                Ok(DeviceTerms {
                    name: d.name.clone(),
                    behaviour,
                    has_gpu: d.has_gpu(),
                    head,
                    output,
                    cpu_layer_s,
                    quota_share: d.cpu_quota_share.unwrap_or(1.0),
                    gpu_layer_s,
                    t_kv_cpu,
                    t_kv_gpu,
                    load_cpu_s,
                    load_gpu_s,
                    t_dev_copy,
                    t_comm,
                    alpha,
                    beta,
                    xi,
                    s_disk,
                    s_reload,
                    budget,
                    slow_disk: s_disk < opts.disk_threshold,
                    mem,
                    gpu_layer_bytes: gpu_layer_bytes.max(0.0),
                    out_compute_s,
                    out_load_s,
                    lookup_bytes: if head { lookup } else { 0.0 },
                })
            })
            .collect::<Result<Vec<_>, NoMemoryModel>>()?;
        Ok(Lda {
            n_layers: model.n_layers,
            devices: terms,
            b_prime,
            relay_hop_s: relays.iter().map(|d| comm(d)).sum(),
            moe: model.moe.clone(),
            output_at,
        })
    }

    pub fn len(&self) -> usize {
        self.devices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// 𝒦_L: the rounds k that divide L and leave every device at least one layer per
    /// window (W = L/k ≥ M).
    pub fn valid_ks(&self) -> Vec<u32> {
        let l = self.n_layers;
        let m = self.devices.len() as u32;
        (1..=l)
            .filter(|&k| l.is_multiple_of(k) && l / k >= m)
            .collect()
    }

    /// The layers device `m` can keep on its GPU at k rounds: ⌊W·z_m^{gpu}⌋, with
    /// z_m^{gpu} = (d^{avail}_{gpu} − c^{gpu} [− b_o])/(L·b').
    pub fn gpu_cap(&self, m: usize, k: u32) -> u32 {
        let d = &self.devices[m];
        if !d.has_gpu {
            return 0;
        }
        let w = (self.n_layers / k) as f64;
        let cap = (d.gpu_layer_bytes / (k as f64 * self.b_prime)).floor();
        cap.clamp(0.0, w) as u32
    }

    /// GPU layers at k = 1 (one window per device), as the baselines place them.
    pub fn gpu_cap_layers(&self, m: usize) -> u32 {
        self.gpu_cap(m, 1)
    }

    /// Whether device m has room for a layer beside its fixed needs (the head's output
    /// head, buffers): only then can its read-ahead stream a layer while it waits instead
    /// of evicting what it keeps (measured: the d1-d4 head, 83 MiB beside its 411 MiB
    /// output head, read 576 MB a token for 264 MB of layers).
    pub fn has_room_to_stream(&self, m: usize) -> bool {
        let d = &self.devices[m];
        let f = d.behaviour.ram_form(&d.mem);
        d.budget - d.mem.b_cio() - f.extra >= self.b_prime
    }

    /// W·z_m: the bound on the device's RAM form (f_w·w_m + f_n·n_m) at k rounds, above
    /// which it is overloaded: (budget − b^{cio}_m − extra)/(k·b').
    pub fn ram_bound(&self, m: usize, k: f64) -> f64 {
        let d = &self.devices[m];
        let f = d.behaviour.ram_form(&d.mem);
        (d.budget - d.mem.b_cio() - f.extra) / (k * self.b_prime)
    }

    /// Which set each device is in for a placement (w, n) at k = L/W rounds. A device
    /// with a slow disk, or forced by calibration (M4^{force}), is always in M4.
    pub fn assign_sets(&self, w: &[f64], n: &[f64], forced: &[bool]) -> Vec<LdaSet> {
        let total: f64 = w.iter().sum();
        let k = self.n_layers as f64 / total.max(1e-9);
        self.devices
            .iter()
            .enumerate()
            .map(|(m, d)| {
                if d.slow_disk || forced[m] {
                    return LdaSet::M4;
                }
                let ram = d.behaviour.ram_bytes(k * w[m], k * n[m], &d.mem);
                if ram > d.budget {
                    d.behaviour.overload_set()
                } else {
                    LdaSet::M4
                }
            })
            .collect()
    }

    /// The vectors a, b, c and the constant κ of the objective for a set assignment.
    pub fn objective(&self, sets: &[LdaSet]) -> Objective {
        let head = &self.devices[0];
        let out = &self.devices[self.output_at];
        // κ: the output layer, the head's input read and the output layer's reads from
        // disk.
        let mut kappa = out.out_compute_s + out.out_load_s + head.lookup_bytes / head.s_disk;
        if sets[self.output_at] != LdaSet::M4 {
            kappa += (out.mem.io - out.lookup_bytes) / out.s_disk; // b_o/s^{disk}
        }
        let mut a = Vec::with_capacity(sets.len());
        let mut b = Vec::with_capacity(sets.len());
        let mut c = Vec::with_capacity(sets.len());
        for (d, set) in self.devices.iter().zip(sets) {
            let (am, bm) = if *set == LdaSet::M4 {
                (d.alpha, d.beta)
            } else {
                let (am, bm, share) = d
                    .behaviour
                    .overloaded_coefficients(d.alpha, d.beta, &d.mem, d.s_reload, d.budget);
                kappa += share; // Σ_{M1∪M3} (c^{cpu} − d^{avail} − d^{swapout})/s^{disk}
                (am, bm)
            };
            a.push(am);
            b.push(if d.has_gpu { bm } else { 0.0 });
            c.push(d.xi);
        }
        Objective { a, b, c, kappa }
    }

    /// The latency model: T for any placement, including ones whose W does not divide L
    /// (the paper's l_m with R = L mod W) and ones that break the set constraints (the
    /// baselines' plans), with the per-OS reload volumes.
    pub fn predict(&self, w: &[u32], n: &[u32]) -> Prediction {
        self.predict_with(w, n, true)
    }

    /// The paper's T, every reload in the sum of turns: what its ILPs minimise.
    pub fn predict_paper(&self, w: &[u32], n: &[u32]) -> Prediction {
        self.predict_with(w, n, false)
    }

    /// A MoE device's reads per token for `overload` bytes beyond its budget over `l`
    /// layers: (shared bytes streamed whole, expected expert bytes read on misses).
    /// The bytes left out are the coldest experts first (k × expert bytes × (1 − hit
    /// rate) per layer), then shared parts.
    fn moe_reads(&self, moe: &MoeProfile, overload: f64, l: f64) -> (f64, f64) {
        if overload <= 0.0 || l <= 0.0 {
            return (overload.max(0.0), 0.0);
        }
        let experts = l * moe.layer_expert_bytes();
        let missing = overload.min(experts);
        (overload - missing, moe.miss_bytes(l, missing))
    }

    fn predict_with(&self, w: &[u32], n: &[u32], overlap: bool) -> Prediction {
        let l_total = self.n_layers;
        let big_w: u32 = w.iter().sum();
        let rounds = l_total / big_w.max(1);
        let r = l_total % big_w.max(1);
        let mut before = 0u32; // Σ_{j<m} min(w_j, R)
        let mut breakdown = Cost::default();
        let mut loads = Vec::with_capacity(w.len());
        let mut slowest_cycle = 0.0f64;
        for (m, d) in self.devices.iter().enumerate() {
            let rest = r.saturating_sub(before);
            let extra = w[m].min(rest);
            let l = rounds * w[m] + extra;
            let l_gpu = rounds * n[m] + n[m].min(rest);
            let windows = rounds + rest.min(1);
            before += w[m].min(r);
            let lc = (l - l_gpu) as f64;
            let lg = l_gpu as f64;
            let overload = d.behaviour.reload_bytes(l as f64, lg, &d.mem, d.budget);
            // A dense device reads all it cannot hold each token. A MoE device keeps each
            // layer's shared part and its hottest experts: only the shared bytes beyond
            // all its experts stream whole; of the experts left out, a token reads the
            // selected ones that miss, while its layer runs (not ahead, as layers are).
            let (reload, expert_reads) = match &self.moe {
                Some(moe) => self.moe_reads(moe, overload, l as f64),
                None => (overload, 0.0),
            };
            // With two or more rounds the read-ahead thread streams the excess while the
            // others compute (prima-core's Residency::plan): it leaves the sum of turns,
            // but the device's own cycle, its reads plus its compute, bounds T. The room
            // for one round's reads (at least a layer) is read as well.
            let hidden = overlap && windows >= 2 && reload > 0.0 && self.has_room_to_stream(m);
            let cpu_s = quota_burst(lc * d.cpu_layer_s + d.out_compute_s, d.quota_share);
            // The CPU layer's compute as it runs (for the reading its compute covers).
            let cpu_layer_s = match lc * d.cpu_layer_s + d.out_compute_s {
                full if full > 0.0 => d.cpu_layer_s * cpu_s / full,
                _ => d.cpu_layer_s,
            };
            let own = cpu_s + lg * d.gpu_layer_s;
            if hidden {
                let room = (reload / (windows - 1) as f64).max(self.b_prime);
                slowest_cycle = slowest_cycle.max((reload + room) / d.s_disk + own);
            }
            let cost = Cost {
                compute_s: own,
                // The reading of weights that their compute does not cover (α, β above).
                memory_s: lc * (d.t_kv_cpu + d.load_cpu_s - cpu_layer_s).max(0.0)
                    + lg * (d.t_kv_gpu + d.load_gpu_s - d.gpu_layer_s).max(0.0)
                    + windows as f64 * d.t_dev_copy
                    + d.out_load_s,
                disk_s: if hidden {
                    d.lookup_bytes
                } else {
                    reload.max(d.lookup_bytes)
                } / d.s_disk
                    + expert_reads / d.s_disk,
                network_s: windows as f64 * d.t_comm,
            };
            breakdown.add(&cost);
            loads.push(DeviceLoad {
                l,
                l_gpu,
                windows,
                ram_bytes: d.behaviour.ram_bytes(l as f64, lg, &d.mem),
                budget_bytes: d.budget,
                vram_bytes: if d.has_gpu {
                    lg * self.b_prime + d.mem.c_gpu
                } else {
                    0.0
                },
                vram_capacity_bytes: d.gpu_layer_bytes + if d.has_gpu { d.mem.c_gpu } else { 0.0 },
                reload_bytes: reload + expert_reads,
                cost,
            });
        }
        let round_trips = rounds + r.min(1);
        breakdown.network_s += round_trips as f64 * self.relay_hop_s;
        Prediction {
            total_s: breakdown.total().max(slowest_cycle),
            breakdown,
            devices: loads,
        }
    }
}

#[cfg(test)]
mod quota_tests {
    use super::quota_burst;

    #[test]
    fn a_turn_within_the_quota_runs_at_a_cores_speed_and_a_longer_one_is_throttled() {
        // 0.2 of a core: 20 ms a period at full speed.
        assert!((quota_burst(0.05, 0.2) - 0.01).abs() < 1e-12);
        assert!((quota_burst(0.1, 0.2) - 0.02).abs() < 1e-12);
        // 60 ms of CPU: 20 ms now, then throttled; 0.3 s sustained less the idle tail.
        assert!((quota_burst(0.3, 0.2) - 0.22).abs() < 1e-12);
        assert_eq!(quota_burst(0.3, 1.0), 0.3);
    }
}

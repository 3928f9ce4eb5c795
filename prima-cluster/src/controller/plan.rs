//! The plan a manifest launches: devices in ring order (the head first), each device's
//! window size w_m and GPU layers n_m, and which devices were pruned and why. Profiles
//! come from the manifest's fixture file, from profiles already collected, or are measured
//! (the head here, each node over the ring protocol); Halda (or the manifest's scheduler)
//! turns them into windows.

use std::time::Instant;

use super::links;
use crate::halda::{self, Cost, ModelProfile, PlanOptions};
use crate::manifest::routes;
use crate::manifest::{LoadedManifest, Rounds, Scheduler};
use crate::profile::{DeviceProfile, DeviceProfiles, ProfileOptions, GIB};
use crate::prp::head::request_profile_and_probe;
use crate::prp::key::LinkSecurity;
use crate::prp::probe::LinkProbe;
use crate::prp::{layer_counts, NextRoute, RingError};
use prima_abi::transport::TransportBox;
use prima_core::model::Model;
use prima_core::plugin::{load_os_models, load_solver, LoadedBackend};

use crate::profile::{profile_with, with_budget};
use crate::prp::budget::draft_memory;
use crate::prp::expert_use;

use super::ControllerError;

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
    /// It did not answer when the plan was made (`pruned` says why): the ring runs
    /// without it and plans it in when it answers.
    pub absent: bool,
    pub mem_budget: Option<u64>,
    /// Halda's set (M1–M4) for the device, when Halda planned.
    pub set: Option<&'static str>,
    /// A relay device: the networks it joins (`lan-a<->lan-b`). Not a ring device.
    pub forwards: Option<String>,
    /// How this node reaches the next ring device, where not as the head reaches it.
    #[serde(skip)]
    pub next_route: NextRoute,
    /// t_m^{comm} as planned: a hidden state's hop to the next device, ms (when the
    /// link was timed or given).
    pub hop_ms: Option<f64>,
    /// What the latency model predicts this device spends of each token (when a
    /// scheduler that models latency planned it).
    pub predicted: Option<Cost>,
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
    /// The device that runs the model's last layer also runs the output layer (Halda's
    /// choice under `policy.output = "auto"`, or `"last"`).
    pub output_on_last: bool,
    /// The plan shapes Halda weighed (the ring, a device alone, the head alone) and
    /// their predicted time per token.
    pub alternatives: Vec<crate::halda::Alternative>,
    /// The profiles planned with (none for the manual scheduler), so the ring can be
    /// planned again without asking the devices (`apply_failover.rs`).
    #[serde(skip)]
    pub profiles: Vec<DeviceProfile>,
}

impl Plan {
    /// The devices in the ring, head first.
    pub fn ring(&self) -> impl Iterator<Item = &DevicePlan> {
        self.devices
            .iter()
            .filter(|d| d.pruned.is_none() && d.forwards.is_none())
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "scheduler": self.scheduler,
            "k": self.k,
            "predicted_tpot_ms": self.predicted_tpot_ms,
            "solve_ms": self.solve_ms,
            "output_on_last": self.output_on_last,
            "alternatives": self.alternatives,
            "devices": self.devices.iter().map(|d| serde_json::json!({
                "name": d.name,
                "addr": d.addr,
                "w": d.w,
                "n": d.n,
                "layers": d.layers,
                "pruned": d.pruned.is_some(),
                "pruned_reason": d.pruned,
                "absent": d.absent,
                "hop_ms": d.hop_ms,
                "relay": d.relay,
                "forwards": d.forwards,
                "set": d.set,
                "predicted_ms": d.predicted.map(|c| serde_json::json!({
                    "compute": c.compute_s * 1e3,
                    "memory": c.memory_s * 1e3,
                    "disk": c.disk_s * 1e3,
                    "network": c.network_s * 1e3,
                })),
            })).collect::<Vec<_>>(),
            "profiles": self.profiles,
        })
    }

    /// The plan as a table for people: one line per device, named columns and a legend.
    pub fn table(&self) -> String {
        self.table_with(false)
    }

    /// [`Plan::table`]; `verbose` adds the paper's symbols (Halda's set, w_m, n_m, l_m).
    pub fn table_with(&self, verbose: bool) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let total: usize = self.devices.iter().map(|d| d.layers).sum::<usize>().max(1);
        writeln!(
            out,
            "plan ({} scheduler, k = {}{}):",
            self.scheduler,
            self.k,
            self.predicted_tpot_ms
                .map(|t| format!(", predicted TPOT {t:.1} ms"))
                .unwrap_or_default()
        )
        .unwrap();
        if self.alternatives.len() > 1 {
            let weighed: Vec<String> = self
                .alternatives
                .iter()
                .map(|a| format!("{} {:.1} ms", a.shape, a.predicted_tpot_ms))
                .collect();
            writeln!(out, "  weighed: {}", weighed.join("; ")).unwrap();
        }
        if self.output_on_last {
            writeln!(
                out,
                "  the output layer runs on the device with the last layer, which sends the head \
                 the top logits of each row"
            )
            .unwrap();
        }
        // Relayed addresses (`TARGET via RELAY`) are long: the column fits the longest.
        let width = self
            .devices
            .iter()
            .map(|d| d.addr.len())
            .max()
            .unwrap_or(0)
            .max(22);
        let names = self
            .devices
            .iter()
            .map(|d| d.name.len())
            .max()
            .unwrap_or(0)
            .max(12);
        // Non-verbose: whether a device's weights stay in memory (Halda's set M4) or are
        // read from disk again every token (M1–M3); verbose: the set itself.
        let set = |s: Option<&'static str>| match (verbose, s) {
            (true, s) => s.unwrap_or("-"),
            (false, Some("M4")) => "yes",
            (false, Some(_)) => "reloads",
            (false, None) => "-",
        };
        let (layers, window, gpu) = if verbose {
            ("layers l", "window w", "GPU n")
        } else {
            ("layers", "window", "GPU")
        };
        writeln!(
            out,
            "  {:<names$} {:<width$} {:>8} {:>8} {:>6} {:>8} {:>5} {:>7}  note",
            "device",
            "address",
            if verbose { "set" } else { "resident" },
            layers,
            "share",
            window,
            gpu,
            "hop ms"
        )
        .unwrap();
        for d in &self.devices {
            let note = match (&d.pruned, d.relay) {
                (Some(why), _) if d.absent => format!("absent: {why}"),
                (Some(why), _) => format!("pruned: {why}"),
                (None, _) if d.forwards.is_some() => {
                    format!("relay {}", d.forwards.as_deref().unwrap_or_default())
                }
                (None, true) => "relay only".to_string(),
                (None, false) if d.layers == 0 && d.addr == "head" && self.output_on_last => {
                    "the head: embeds the tokens and samples".to_string()
                }
                (None, false) if d.layers == 0 && d.addr == "head" => {
                    "the head: embeds the tokens, runs the output layer and samples".to_string()
                }
                _ => String::new(),
            };
            writeln!(
                out,
                "  {:<names$} {:<width$} {:>8} {:>8} {:>5.0}% {:>8} {:>5} {:>7}  {}",
                d.name,
                d.addr,
                set(d.set),
                d.layers,
                100.0 * d.layers as f64 / total as f64,
                d.w,
                d.n,
                match (d.hop_ms, &d.pruned) {
                    (Some(t), None) => format!("{t:.2}"),
                    _ => "-".to_string(),
                },
                note
            )
            .unwrap();
        }
        let k = self.k;
        writeln!(
            out,
            "  layers: the model's layers a device runs per token (share: of all), as k = {k} \
             windows of `window` layers, `GPU` of them on its GPU\n  resident: its layers stay \
             in memory (reloads: read from disk again every token); hop ms: handing the hidden \
             state on"
        )
        .unwrap();
        if verbose {
            writeln!(
                out,
                "  paper symbols: l = l_m, w = w_m, n = n_m, k rounds; set: Halda's M1–M3 \
                 (overloaded, reloads from disk: macOS, macOS with Metal, Linux/Android) or M4 \
                 (fits, or a slow disk)"
            )
            .unwrap();
        }
        out
    }
}

/// What planning needs besides the manifest: the head's model and backend, the transport
/// (to ask nodes for their profiles), and the addresses of the nodes apply started.
pub struct PlanInputs<'a> {
    pub manifest: &'a LoadedManifest,
    pub model: &'a Model,
    pub head: usize,
    /// The head's backend and the transport; absent when the manifest gives profiles.
    pub backend: Option<&'a LoadedBackend>,
    /// The head's GPU backend, profiled beside `backend` when there is one.
    pub gpu: Option<&'a LoadedBackend>,
    pub transport: Option<&'a TransportBox>,
    pub addr_of: &'a dyn Fn(&str) -> Option<String>,
    /// Profiles already collected (by device name): only the devices without one are
    /// measured.
    pub known: &'a [DeviceProfile],
    /// How the links to the nodes are protected (profiling connects to them too).
    pub security: &'a LinkSecurity,
    /// The manifest's draft model (`model.draft`), opened once by the caller: the head
    /// holds it beside its windows.
    pub draft: Option<&'a Model>,
}

/// A node that did not answer the profile request: its place in ring order and why.
type Absent = (usize, String);

/// Profiles every device in ring order: the head here, the nodes over the ring protocol
/// (each measures itself; results are cached on the device), timing the head's link to
/// each node on the way (beside each profile; none for profiles from a file or already
/// known). A node that cannot be reached is left out and reported, not an error: a device
/// that is off is the normal case at home, and the ring is planned with the others.
#[allow(clippy::type_complexity)]
fn collect_profiles(
    inputs: &PlanInputs<'_>,
    order: &[usize],
    reach: &[Option<String>],
) -> Result<(Vec<DeviceProfile>, Vec<Option<LinkProbe>>, Vec<Absent>), ControllerError> {
    let m = &inputs.manifest.manifest;
    if let Some(file) = &m.policy.profiles {
        let path = inputs.manifest.resolve(file);
        let fixtures = DeviceProfiles::load(&path)?;
        let profiles = order
            .iter()
            .map(|&i| {
                let d = &m.devices[i];
                let mut p = fixtures
                    .device
                    .iter()
                    .find(|p| p.name == d.name)
                    .cloned()
                    .ok_or_else(|| ControllerError::NoProfile {
                        path: path.clone(),
                        device: d.name.clone(),
                    })?;
                p.relay = p.relay || d.relay_only;
                Ok(p)
            })
            .collect::<Result<Vec<_>, ControllerError>>()?;
        let probes = vec![None; profiles.len()];
        return Ok((profiles, probes, Vec::new()));
    }
    let known = |i: usize| inputs.known.iter().find(|p| p.name == m.devices[i].name);
    // A probe the size of the hidden state a hop carries (4e bytes, as Halda's t^{comm}).
    let probe_bytes = 4 * inputs.model.hparams().n_embd;
    let mut profiles = Vec::with_capacity(order.len());
    let mut probes = Vec::with_capacity(order.len());
    let mut absent = Vec::new();
    for (pos, &i) in order.iter().enumerate() {
        let d = &m.devices[i];
        if let Some(p) = known(i) {
            profiles.push(p.clone());
            probes.push(None);
            continue;
        }
        let (profile, probe) = if pos == 0 {
            let Some(backend) = inputs.backend else {
                return Err(ControllerError::NoBackend);
            };
            let options = ProfileOptions {
                name: Some(d.name.clone()),
                ..ProfileOptions::default()
            };
            let report = profile_with(
                backend,
                inputs.gpu,
                &inputs.manifest.model_path(&d.name),
                &options,
            )
            .map_err(|source| ControllerError::Profiling {
                device: d.name.clone(),
                source,
            })?;
            (with_budget(report.profile, d.mem_budget.map(|s| s.0)), None)
        } else {
            let addr = reach[pos]
                .clone()
                .ok_or_else(|| ControllerError::NoAddress {
                    device: d.name.clone(),
                })?;
            let Some(transport) = inputs.transport else {
                return Err(ControllerError::NoBackend);
            };
            match request_profile_and_probe(transport, &addr, 120_000, inputs.security, probe_bytes)
            {
                Ok((value, probe)) => (
                    serde_json::from_value::<DeviceProfile>(value).map_err(|source| {
                        ControllerError::BadProfile {
                            device: d.name.clone(),
                            addr: addr.clone(),
                            source,
                        }
                    })?,
                    Some(probe),
                ),
                // No connection (off, asleep, not started): planned without it. A node
                // that answers and refuses (another key, a failed profile) is an error.
                Err(RingError::Transport(reason)) => {
                    absent.push((pos, reason));
                    continue;
                }
                Err(source) => {
                    return Err(ControllerError::Unreachable {
                        device: d.name.clone(),
                        addr: addr.clone(),
                        source: Box::new(source),
                    })
                }
            }
        };
        let mut profile = profile;
        profile.name = d.name.clone();
        profile.relay = d.relay_only;
        // `vram_budget`: the GPU memory Halda may fill (d_{m,gpu}^{avail}), at most.
        if let (Some(v), true) = (d.vram_budget, profile.has_gpu()) {
            profile.gpu_available_gib = profile.gpu_available_gib.min(v.0 as f64 / GIB);
        }
        profiles.push(profile);
        probes.push(probe);
    }
    Ok((profiles, probes, absent))
}

/// `manifest` less the devices named: what a ring without them is planned from. Manual
/// windows are given per manifest device, so they leave with their device.
pub fn without_devices(manifest: &LoadedManifest, names: &[String]) -> LoadedManifest {
    let mut left = manifest.clone();
    let m = &mut left.manifest;
    if let Some(windows) = &mut m.policy.windows {
        *windows = m
            .devices
            .iter()
            .enumerate()
            .filter(|(_, d)| !names.contains(&d.name))
            .map(|(i, _)| windows.get(i).copied().unwrap_or(0))
            .collect();
    }
    m.devices.retain(|d| !names.contains(&d.name));
    left
}

/// Plans the devices that answered, and lists the `absent` ones after them (pruned,
/// with why they did not answer), so the ring can plan them in when they do.
fn plan_without(
    inputs: &PlanInputs<'_>,
    order: &[usize],
    reach: &[Option<String>],
    profiles: Vec<DeviceProfile>,
    absent: Vec<Absent>,
) -> Result<Plan, ControllerError> {
    let m = &inputs.manifest.manifest;
    let names: Vec<String> = absent
        .iter()
        .map(|(pos, _)| m.devices[order[*pos]].name.clone())
        .collect();
    let left = without_devices(inputs.manifest, &names);
    let head = left.head_index()?;
    let mut planned = plan(&PlanInputs {
        manifest: &left,
        head,
        known: &profiles,
        ..*inputs
    })?;
    for ((pos, why), name) in absent.into_iter().zip(names) {
        let d = &m.devices[order[pos]];
        planned.devices.push(DevicePlan {
            name,
            addr: reach[pos].clone().unwrap_or_default(),
            w: 0,
            n: 0,
            layers: 0,
            relay: false,
            pruned: Some(why),
            absent: true,
            mem_budget: d.mem_budget.map(|s| s.0),
            set: None,
            predicted: None,
            forwards: None,
            next_route: NextRoute::AsHead,
            hop_ms: None,
        });
    }
    Ok(planned)
}

/// Plans the manifest's devices for the model.
pub fn plan(inputs: &PlanInputs<'_>) -> Result<Plan, ControllerError> {
    let started = Instant::now();
    let manifest = inputs.manifest;
    let m = &manifest.manifest;
    // Ring order: the head, then the manifest's order after it, wrapping round; across
    // networks, the head's network first (`routes.rs`). Relays are no ring devices.
    let order = routes::ring_order(m, inputs.head);
    let n_devices = order.len();
    let net = |i: usize| routes::network_of(m, inputs.head, &m.devices[i]);
    let home = net(inputs.head);
    // Each device's own address, and how the head reaches it.
    let own: Vec<Option<String>> = order
        .iter()
        .map(|&i| {
            let d = &m.devices[i];
            d.address.clone().or_else(|| (inputs.addr_of)(&d.name))
        })
        .collect();
    let reach: Vec<Option<String>> = order
        .iter()
        .zip(&own)
        .map(|(&i, a)| a.as_ref().map(|a| routes::reach(m, home, net(i), a).0))
        .collect();
    let n_layers = inputs.model.hparams().n_layers;
    let mut sets: Vec<Option<&'static str>> = vec![None; n_devices];
    let mut reasons: Vec<Option<String>> = vec![None; n_devices];
    let mut relays: Vec<bool> = order.iter().map(|&i| m.devices[i].relay_only).collect();
    let mut predicted = None;
    // The manual scheduler keeps the output layer on the head unless told "last".
    let mut output_on_last = m.policy.output == crate::halda::OutputPolicy::Last;
    let mut alternatives = Vec::new();
    let mut costs: Vec<Option<Cost>> = vec![None; n_devices];
    let mut gpu = vec![0usize; n_devices];
    let mut planned_with = Vec::new();
    let mut w: Vec<usize> = match m.policy.scheduler {
        Scheduler::Manual => {
            let given = m.policy.windows.as_deref().unwrap_or(&[]);
            order
                .iter()
                .map(|&i| given.get(i).copied().unwrap_or(0))
                .collect()
        }
        scheduler => {
            let (mut profiles, probes, absent) = collect_profiles(inputs, &order, &reach)?;
            // Timed links replace a profile's own (a live profile has none); with a device
            // absent, the ring of those that answered is timed.
            let timed = probes.iter().any(Option::is_some);
            for (p, link) in profiles.iter_mut().zip(links::ring_links(&probes)) {
                p.link = link.or(p.link);
            }
            if !absent.is_empty() {
                return plan_without(inputs, &order, &reach, profiles, absent);
            }
            planned_with = profiles.clone();
            // The head also holds the draft model (weights, a KV cache per slot): less
            // of its memory is left for the target's layers.
            if let (Some(draft), Some(head)) = (inputs.draft, profiles.first_mut()) {
                let bytes = draft_memory(draft, m.policy.ctx, m.policy.batch, m.server.parallel);
                let gib = bytes as f64 / GIB;
                head.ram_available_gib = (head.ram_available_gib - gib).max(0.0);
                head.ram_total_gib = (head.ram_total_gib - gib).max(0.0);
            }
            // A given link through a relay is two hops: twice the latency, half the rate
            // (timed links went through the relay already).
            for (pos, p) in profiles.iter_mut().enumerate() {
                let next = order[(pos + 1) % n_devices];
                if let (Some(link), true, false) =
                    (&mut p.link, net(order[pos]) != net(next), timed)
                {
                    link.rtt_ms *= 2.0;
                    link.bytes_per_s /= 2.0;
                }
            }
            let model_profile =
                with_learned_routing(ModelProfile::from_gguf(inputs.model.gguf())?, inputs.model);
            let which = match scheduler {
                Scheduler::Mem => halda::Scheduler::Mem,
                Scheduler::Perf => halda::Scheduler::Perf,
                _ => halda::Scheduler::Halda,
            };
            let solver = match which {
                halda::Scheduler::Halda => Some(load_solver(None)?),
                _ => None,
            };
            let options = PlanOptions {
                n_kv: m.policy.ctx as f64,
                // Every device keeps a KV cache per slot of its layers.
                n_slots: m.server.parallel,
                output: m.policy.output,
                ..PlanOptions::default()
            };
            let planned = halda::plan(
                &model_profile,
                &profiles,
                which,
                solver.as_ref().map(|s| s as &dyn halda::MilpSolver),
                &load_os_models(),
                &options,
            )?;
            predicted = Some(planned.predicted_tpot_ms);
            output_on_last = planned.output_device != profiles[0].name;
            alternatives = planned.alternatives.clone();
            let mut w = vec![0; n_devices];
            for (pos, d) in planned.devices.iter().enumerate() {
                w[pos] = d.w as usize;
                gpu[pos] = d.n as usize;
                sets[pos] = d.set.map(|s| s.name());
                reasons[pos] = d.reason.clone();
                relays[pos] = relays[pos] || d.relay;
                costs[pos] = d.load.as_ref().map(|l| l.cost);
            }
            rescale_to_k(&mut w, planned.k as usize, m.policy.k);
            w
        }
    };
    if m.policy.scheduler == Scheduler::Manual {
        let planned_k = n_layers.div_ceil(w.iter().sum::<usize>().max(1));
        rescale_to_k(&mut w, planned_k, m.policy.k);
    }
    for (pos, &i) in order.iter().enumerate() {
        if m.devices[i].relay_only {
            w[pos] = 0;
        }
    }
    if w.iter().all(|&x| x == 0) {
        return Err(ControllerError::NoLayers {
            manifest: manifest.path.clone(),
        });
    }
    // A device's own n_m (`gpu_layers`) in place of Halda's.
    for (pos, &i) in order.iter().enumerate() {
        if let Some(n) = m.devices[i].gpu_layers {
            gpu[pos] = n;
        }
    }
    let capped: Vec<usize> = gpu.iter().zip(&w).map(|(&g, &x)| g.min(x)).collect();
    let counts = layer_counts(n_layers, &w, &capped)?;
    let k = n_layers.div_ceil(w.iter().sum::<usize>());
    let hidden_bytes = 4.0 * inputs.model.hparams().n_embd as f64;
    let mut devices: Vec<DevicePlan> = order
        .iter()
        .enumerate()
        .map(|(pos, &i)| {
            let d = &m.devices[i];
            let addr = if pos == 0 {
                "head".to_string()
            } else {
                reach[pos].clone().unwrap_or_default()
            };
            let pruned = (counts[pos].0 == 0 && !relays[pos] && pos != 0).then(|| {
                reasons[pos]
                    .clone()
                    .unwrap_or_else(|| "no layers assigned".to_string())
            });
            DevicePlan {
                name: d.name.clone(),
                addr,
                w: w[pos],
                n: gpu[pos].min(w[pos]),
                layers: counts[pos].0,
                relay: relays[pos] && counts[pos].0 == 0,
                pruned,
                absent: false,
                mem_budget: d.mem_budget.map(|s| s.0),
                set: sets[pos],
                forwards: None,
                next_route: NextRoute::AsHead,
                hop_ms: planned_with
                    .get(pos)
                    .and_then(|p| p.link)
                    .map(|link| link.rtt_ms / 2.0 + 1e3 * hidden_bytes / link.bytes_per_s),
                predicted: costs[pos],
            }
        })
        .collect();
    let needed = route_ring(m, inputs.head, &order, &own, &mut devices);
    for (i, d) in m
        .devices
        .iter()
        .enumerate()
        .filter(|(_, d)| d.relay.is_some())
    {
        let legs: Vec<&str> = d.relay.iter().flatten().map(|(_, a)| a.as_str()).collect();
        devices.push(DevicePlan {
            name: d.name.clone(),
            addr: legs.join(", "),
            w: 0,
            n: 0,
            layers: 0,
            relay: true,
            pruned: (!needed.contains(&i)).then(|| "no route of the ring needs it".to_string()),
            absent: false,
            mem_budget: None,
            set: None,
            forwards: Some(routes::legs_label(d)),
            next_route: NextRoute::AsHead,
            hop_ms: None,
            predicted: None,
        });
    }
    Ok(Plan {
        scheduler: match m.policy.scheduler {
            Scheduler::Halda => "halda",
            Scheduler::Mem => "mem",
            Scheduler::Perf => "perf",
            Scheduler::Manual => "manual",
        },
        k,
        predicted_tpot_ms: predicted,
        solve_ms: started.elapsed().as_secs_f64() * 1e3,
        devices,
        output_on_last,
        alternatives,
        profiles: planned_with,
    })
}

/// Routes the ring's devices (the plan's first `order.len()` rows, pruned ones skipped):
/// each node's next hop where it is not how the head reaches that device, and the relays
/// the crossings use — ring links and the head's control channels. The relays needed.
fn route_ring(
    m: &crate::manifest::Manifest,
    head: usize,
    order: &[usize],
    own: &[Option<String>],
    devices: &mut [DevicePlan],
) -> Vec<usize> {
    let net = |i: usize| routes::network_of(m, head, &m.devices[i]);
    let home = net(head);
    let ring: Vec<usize> = (0..order.len())
        .filter(|&pos| devices[pos].pruned.is_none())
        .collect();
    let mut needed = Vec::new();
    for (j, &pos) in ring.iter().enumerate() {
        let (from, to_pos) = (order[pos], ring[(j + 1) % ring.len()]);
        let to = order[to_pos];
        for crossing in [(home, net(from)), (net(from), net(to))] {
            if let Some((relay, _)) = routes::relay_between(m, crossing.0, crossing.1)
                .filter(|_| crossing.0 != crossing.1)
            {
                if !needed.contains(&relay) {
                    needed.push(relay);
                }
            }
        }
        if pos == 0 || net(from) == net(to) {
            continue;
        }
        devices[pos].next_route = match (to_pos, &own[to_pos]) {
            (0, _) => match routes::relay_between(m, net(from), home) {
                Some((_, leg)) => NextRoute::HeadVia(leg.to_string()),
                None => NextRoute::AsHead,
            },
            (_, Some(addr)) => NextRoute::Addr(routes::reach(m, net(from), net(to), addr).0),
            (_, None) => NextRoute::AsHead,
        };
    }
    needed
}

/// Applies a fixed k from the manifest to windows planned for `planned_k` rounds: each
/// device keeps its share of layers, cut into k windows.
fn rescale_to_k(w: &mut [usize], planned_k: usize, wanted: Rounds) {
    let Rounds::Fixed(k) = wanted else { return };
    if k == planned_k || k == 0 {
        return;
    }
    for x in w.iter_mut().filter(|x| **x > 0) {
        *x = (*x * planned_k).div_ceil(k).max(1);
    }
}

/// A mixture of experts' routing as earlier runs counted it (`prp::expert_use`, the file
/// the expert caches save), so the plan prices each device's hot experts as its cache
/// will keep them; a layer no run has counted yet is taken as uniform. Without a file
/// (or for a dense model) the profile stays uniform.
fn with_learned_routing(profile: ModelProfile, model: &Model) -> ModelProfile {
    let Some(e) = model.experts() else {
        return profile;
    };
    let Some(counts) = expert_use::use_file(model)
        .and_then(|path| expert_use::load(&path, model.hparams().n_layers, e.n_expert))
    else {
        return profile;
    };
    let shares = counts
        .into_iter()
        .map(|layer| {
            if layer.iter().all(|&c| c == 0) {
                vec![1.0; layer.len()]
            } else {
                layer.into_iter().map(|c| c as f64).collect()
            }
        })
        .collect();
    profile.clone().with_routing(shares).unwrap_or(profile)
}

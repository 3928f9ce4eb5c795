//! `prima plan`: the layer-to-device assignment for a model on a set of device profiles,
//! by Halda or one of the paper's baselines.

use std::path::PathBuf;

use anyhow::Context;
use prima_cluster::halda::{self, ModelProfile, Plan, PlanOptions, Scheduler};
use prima_cluster::profile::{DeviceProfiles, GB};
use prima_core::plugin::{load_os_models, load_solver};
use serde::Serialize;

#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// GGUF model file (only its header is read; sparse files from `cargo xtask synth-model` work).
    #[arg(short = 'm', long)]
    pub model: PathBuf,
    /// Device profiles, TOML: `[[device]]` entries in ring order, the head first.
    #[arg(long, value_name = "PROFILES.toml")]
    pub devices: PathBuf,
    #[arg(long, value_enum, default_value = "halda")]
    pub scheduler: Scheduler,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// KV-cache tokens to provision for (n_kv).
    #[arg(long, default_value_t = 4096)]
    pub ctx: u32,
    /// Disks slower than this (GB/s) never take reloads (s^{disk}_{threshold}).
    #[arg(long, default_value_t = 0.1)]
    pub slow_disk_gb_s: f64,
    /// Solver plugin to use (default: the first one found).
    #[arg(long)]
    pub solver: Option<String>,
    /// Halda: solve the exact epigraph program (the global optimum of the LDA objective)
    /// instead of the paper's set iteration.
    #[arg(long)]
    pub exact: bool,
    /// Halda: solve the ILP of every valid k, also those k = 1 provably dominates.
    #[arg(long)]
    pub every_k: bool,
    /// Use only these devices of the profiles file (comma-separated names, e.g. D1,D2,D3,D4).
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    pub only: Vec<String>,
    /// Plan this many times and report the median solve time.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub repeat: u32,
    /// A mixture of experts' routing profile, JSON: per layer, one use count or share per
    /// expert (`[[…], …]` or `{"expert_use": [[…], …]}`). Default: uniform use.
    #[arg(long, value_name = "FILE.json")]
    pub expert_use: Option<PathBuf>,
    /// Where the output layer may run: auto (the head or the last device, whichever is
    /// predicted faster; a manifest's default), head, or last.
    #[arg(long, value_enum, default_value = "auto")]
    pub output: halda::OutputPolicy,
}

#[derive(Serialize)]
struct JsonDevice<'a> {
    name: &'a str,
    w: u32,
    n: u32,
    set: Option<&'static str>,
    pruned: bool,
    relay: bool,
}

#[derive(Serialize)]
struct JsonPlan<'a> {
    scheduler: Scheduler,
    model: &'a str,
    k: u32,
    predicted_tpot_ms: f64,
    breakdown_ms: halda::BreakdownMs,
    solve_ms: f64,
    output_device: &'a str,
    alternatives: &'a [halda::Alternative],
    devices: Vec<JsonDevice<'a>>,
}

pub fn run(args: PlanArgs) -> anyhow::Result<()> {
    let mut model = ModelProfile::open(&args.model)
        .with_context(|| format!("profiling the model {}", args.model.display()))?;
    if let Some(path) = &args.expert_use {
        let json =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        model = model
            .with_routing_json(&json)
            .with_context(|| format!("{}", path.display()))?;
    }
    let mut profiles = DeviceProfiles::load(&args.devices)?;
    if !args.only.is_empty() {
        if let Some(missing) = args
            .only
            .iter()
            .find(|n| !profiles.device.iter().any(|d| &d.name == *n))
        {
            anyhow::bail!("{}: no device named '{missing}'", args.devices.display());
        }
        profiles.device.retain(|d| args.only.contains(&d.name));
    }
    let opts = PlanOptions {
        n_kv: args.ctx as f64,
        disk_threshold: args.slow_disk_gb_s * GB,
        exact: args.exact,
        every_k: args.every_k,
        output: args.output,
        ..PlanOptions::default()
    };
    let solver = match args.scheduler {
        Scheduler::Halda => Some(load_solver(args.solver.as_deref())?),
        _ => None,
    };
    let solver_ref = solver.as_ref().map(|s| s as &dyn halda::MilpSolver);
    let os = load_os_models();
    let plan_once = || {
        halda::plan(
            &model,
            &profiles.device,
            args.scheduler,
            solver_ref,
            &os,
            &opts,
        )
    };
    let mut times = Vec::new();
    let mut plan = plan_once()?;
    times.push(plan.solve_ms);
    for _ in 1..args.repeat {
        let again = plan_once()?;
        times.push(again.solve_ms);
    }
    times.sort_by(f64::total_cmp);
    plan.solve_ms = times[times.len() / 2];
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json_plan(&plan))?);
    } else {
        print_table(&plan, &model, args.repeat);
    }
    Ok(())
}

fn json_plan(plan: &Plan) -> JsonPlan<'_> {
    JsonPlan {
        scheduler: plan.scheduler,
        model: &plan.model,
        k: plan.k,
        predicted_tpot_ms: plan.predicted_tpot_ms,
        breakdown_ms: plan.breakdown,
        solve_ms: plan.solve_ms,
        output_device: &plan.output_device,
        alternatives: &plan.alternatives,
        devices: plan
            .devices
            .iter()
            .map(|d| JsonDevice {
                name: &d.name,
                w: d.w,
                n: d.n,
                set: d.set.map(|s| s.name()),
                pruned: d.pruned,
                relay: d.relay,
            })
            .collect(),
    }
}

fn print_table(plan: &Plan, model: &ModelProfile, repeat: u32) {
    let gib = |b: f64| b / prima_cluster::profile::GIB;
    println!(
        "{} ({} layers, {:.1} GiB) — scheduler {:?}",
        plan.model,
        plan.n_layers,
        gib(model.total_bytes),
        plan.scheduler
    );
    println!(
        "{:<10} {:>4} {:>4} {:>4} {:>5} {:>17} {:>15}  note",
        "device", "w", "n", "set", "l", "RAM use/budget", "VRAM use/cap"
    );
    for d in &plan.devices {
        match &d.load {
            Some(load) => {
                let vram = if load.vram_capacity_bytes > 0.0 {
                    format!(
                        "{:.1}/{:.1} GiB",
                        gib(load.vram_bytes),
                        gib(load.vram_capacity_bytes)
                    )
                } else {
                    "-".into()
                };
                let note = if load.reload_bytes > 0.0 {
                    format!("reloads {:.2} GiB/token", gib(load.reload_bytes))
                } else {
                    String::new()
                };
                println!(
                    "{:<10} {:>4} {:>4} {:>4} {:>5} {:>17} {:>15}  {note}",
                    d.name,
                    d.w,
                    d.n,
                    d.set.map(|s| s.name()).unwrap_or("-"),
                    load.l,
                    format!(
                        "{:.1}/{:.1} GiB",
                        gib(load.ram_bytes),
                        gib(load.budget_bytes)
                    ),
                    vram
                );
            }
            None => println!(
                "{:<10} {:>4} {:>4} {:>4} {:>5} {:>17} {:>15}  {}{}",
                d.name,
                0,
                0,
                "-",
                0,
                "-",
                "-",
                if d.relay {
                    "relay (no layers); "
                } else {
                    "pruned; "
                },
                d.reason.as_deref().unwrap_or("")
            ),
        }
    }
    let b = &plan.breakdown;
    println!(
        "k = {}  predicted TPOT {:.1} ms (compute {:.1}, memory {:.1}, disk {:.1}, network {:.1})",
        plan.k, plan.predicted_tpot_ms, b.compute_ms, b.memory_ms, b.disk_ms, b.network_ms
    );
    println!("output layer on {}", plan.output_device);
    for a in &plan.alternatives {
        println!("weighed: {} — {:.1} ms", a.shape, a.predicted_tpot_ms);
    }
    if plan.scheduler == Scheduler::Halda {
        println!(
            "solved in {:.2} ms{} ({} set rounds, {} ILPs in the final solve)",
            plan.solve_ms,
            if repeat > 1 {
                format!(" (median of {repeat})")
            } else {
                String::new()
            },
            plan.iterations,
            plan.ilps
        );
    }
}

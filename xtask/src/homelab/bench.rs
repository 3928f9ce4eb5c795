//! `cargo xtask homelab bench`: issue 15's experiments on an emulated bed, one same-run
//! table per model, every figure measured in that run unless labelled a prediction.
//!
//! - `paper` (a, c, e): llama.cpp and Prima alone on the best device, the ring under
//!   Halda, MemSched, PerfSched, and Halda's plan pinned without prefetch / release.
//! - `rounds` (b): Halda's windows pinned and cut into k = 1, 2, 4, … rounds, with and
//!   without MRU release: TPOT, TTFT, and disk bytes per token per device.
//! - `links` (d): the bed brought up once per one-way link latency, the ring under Halda.
//!
//! For each model (and each latency) the bed is brought up (`homelab up --model`), every
//! row runs in turn inside its device with a timeout, and the bed is brought down again,
//! also when a row or the bring-up fails. Before each row every device's model copy is
//! dropped from the page cache (pages a running node maps stay) and the memory cgroups'
//! peak counters are reset, so rows start cold and their peaks are their own.
//!
//! Not for: timing assertions. `rows` says what each experiment runs, `parse` reads the
//! tools' output, `predict` evaluates Halda's model for a plan, `report` renders tables.

mod parse;
mod predict;
mod report;
mod rows;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use prima_cluster::halda::{ModelProfile, NoMemoryModel};
use prima_cluster::profile::{DeviceProfile, DeviceProfiles};
use prima_core::plugin::{load_os_models_from, LoadedOsModels};

use self::report::{DeviceMemory, RingDevice, RowResult, Status, Table};
use self::rows::{Experiment, Row, RowRun};
use super::cgroups::Hierarchies;
use super::state::{self, BedState, DeviceState};
use super::testbed::Testbed;
use super::Overrides;
use crate::layout::Layout;
use crate::llama_cpp::LlamaCpp;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Which experiment: paper (a: the comparison), rounds (b: PRP rounds), links (d).
    #[arg(long, value_enum, default_value = "paper")]
    experiment: Experiment,
    /// A testbed file, or a name under manifests/testbeds/homelab/ (default: d1-d4 for
    /// paper and links, homogeneous-4 for rounds).
    #[arg(long)]
    testbed: Option<String>,
    /// Models: 1b, 3b, 8b (the bench-llama-*-q4_k_m models), moe (the 6.5 GB
    /// bench-qwen3moe-11b-a1b-q4_k_m) or GGUF paths (default: 1b,3b for paper, 8b for
    /// rounds and links).
    #[arg(long, value_delimiter = ',')]
    models: Vec<String>,
    /// Tokens to generate per row.
    #[arg(long, default_value_t = 8)]
    tokens: usize,
    #[arg(long, default_value = "Once upon a time")]
    prompt: String,
    /// Rows to run, by key, in this order (default: all of the experiment's). paper:
    /// llama-alone, prima-alone, halda, mem, perf, no-prefetch, no-release; rounds: k1,
    /// k1-no-release, k2, …; links: halda-1ms, halda-5ms, halda-20ms.
    #[arg(long, value_delimiter = ',')]
    rows: Vec<String>,
    /// rounds: these k (default: 1, 2, 4, … while k ≤ ⌈layers / devices⌉).
    #[arg(long, value_delimiter = ',')]
    ks: Vec<usize>,
    /// rounds: cut Halda's plan into k rounds, or equal windows (the paper's ablation).
    #[arg(long, value_enum, default_value = "halda")]
    windows: rows::RoundsWindows,
    /// links: the one-way latencies every device's link is set to, one bed each.
    #[arg(long, value_delimiter = ',', default_value = "1,5,20")]
    latencies_ms: Vec<f64>,
    /// links: every device's upload rate, Mbit/s.
    #[arg(long, default_value_t = 300.0)]
    link_mbit: f64,
    /// A row still running after this many seconds is killed and reported as timed out.
    #[arg(long, default_value_t = 300)]
    row_timeout_s: u64,
    /// Use the `prima` already built instead of running cargo build first.
    #[arg(long)]
    no_build: bool,
}

/// The expert-use files (`prima_cluster::prp::expert_use`) as they were before a pass.
struct LearnedUse {
    dir: Option<PathBuf>,
    files: Vec<(PathBuf, Vec<u8>)>,
}

impl LearnedUse {
    fn take() -> LearnedUse {
        let dir = match std::env::var_os(prima_cluster::prp::expert_use::EXPERT_USE_DIR_ENV) {
            Some(d) if d == "off" => None,
            Some(d) => Some(PathBuf::from(d)),
            None => Some(
                PathBuf::from(prima_cluster::profile::home_dir()).join(".cache/prima/expert-use"),
            ),
        };
        let files = dir
            .as_ref()
            .and_then(|d| fs::read_dir(d).ok())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| Some((e.path(), fs::read(e.path()).ok()?)))
            .collect();
        LearnedUse { dir, files }
    }

    /// Puts the files back as taken; files written since are removed.
    fn restore(&self) {
        let Some(dir) = &self.dir else { return };
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            if !self.files.iter().any(|(p, _)| *p == e.path()) {
                let _ = fs::remove_file(e.path());
            }
        }
        for (path, bytes) in &self.files {
            let _ = fs::write(path, bytes);
        }
    }
}

const BEST_DEVICE_RULE: &str =
    "the device with the most memory; threads = its CPU quota rounded up";

/// One bring-up of the bed and the rows run on it.
struct Pass {
    /// links: every device's one-way latency on this bed.
    latency_ms: Option<f64>,
    rows: Vec<Row>,
}

pub fn run(layout: &Layout, args: &BenchArgs) -> Result<()> {
    let hierarchies = super::check_machine()?;
    let experiment = args.experiment;
    let testbed_arg = args
        .testbed
        .clone()
        .unwrap_or_else(|| experiment.default_testbed().to_string());
    let bed = Testbed::load(&super::testbed_path(layout, &testbed_arg))?;
    let best = bed
        .devices
        .iter()
        .max_by_key(|d| d.memory)
        .context("the testbed has no devices")?;
    let threads = (best.cpu.ceil() as u32).max(1);
    let models = if args.models.is_empty() {
        experiment
            .default_models()
            .iter()
            .map(|m| model_path(layout, m))
            .collect::<Result<Vec<_>>>()?
    } else {
        args.models
            .iter()
            .map(|m| model_path(layout, m))
            .collect::<Result<Vec<_>>>()?
    };
    // Every model's passes before anything is built, so a bad --rows fails at once.
    let passes = models
        .iter()
        .map(|m| passes_for(args, &bed, &best.name, m))
        .collect::<Result<Vec<_>>>()?;
    let bin = super::release_dir(layout, args.no_build)?;
    let llama = LlamaCpp::new(layout).bin("llama-completion");
    let out_dir = layout.workspace.join("target");
    fs::create_dir_all(&out_dir)?;
    let stem = experiment.output_stem();

    let mut tables = Vec::new();
    for (model, passes) in models.iter().zip(passes) {
        let model_name: String = model
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into();
        let mut table = Table {
            experiment,
            testbed: bed.name.clone(),
            model: model_name.clone(),
            model_bytes: fs::metadata(model).map(|m| m.len()).unwrap_or(0),
            tokens: args.tokens,
            prompt: args.prompt.clone(),
            best_device: (experiment == Experiment::Paper).then(|| best.name.clone()),
            best_device_rule: (experiment == Experiment::Paper).then(|| BEST_DEVICE_RULE.into()),
            notes: Vec::new(),
            rows: Vec::new(),
        };
        for pass in passes {
            eprintln!(
                "homelab bench: {} {model_name} on {}{}",
                experiment.key(),
                bed.name,
                pass.latency_ms
                    .map(|l| format!(", every link {l} ms one way, {} Mbit/s", args.link_mbit))
                    .unwrap_or_default()
            );
            // Someone else's bed is theirs: stop here, without the `down` below.
            let leftovers = super::what_exists(&hierarchies);
            if !leftovers.is_empty() {
                bail!(
                    "a home lab is already up ({}); bench brings its own up and down, so it \
                     leaves that one alone: run `cargo xtask homelab down` when it is free",
                    leftovers.join(", ")
                );
            }
            let overrides = Overrides {
                model: Some(model.clone()),
                latency_ms: pass.latency_ms,
                link_mbit: pass.latency_ms.map(|_| args.link_mbit),
            };
            let mut logs = out_dir
                .join("homelab-bench-logs")
                .join(experiment.key())
                .join(&model_name);
            if let Some(l) = pass.latency_ms {
                logs = logs.join(format!("{l}ms"));
            }
            let done_before = table.rows.len();
            let measured = super::up(layout, &testbed_arg, &overrides, true).and_then(|()| {
                let st = BedState::load(&state::root().join(&bed.name))?;
                fs::create_dir_all(&logs)?;
                let mut bench = Bench {
                    hierarchies: &hierarchies,
                    st: &st,
                    bed: &bed,
                    args,
                    prima: bin.join("prima"),
                    llama: &llama,
                    model,
                    best: &best.name,
                    threads,
                    logs,
                    halda_plan: None,
                    profiles: None,
                    model_profile: ModelProfile::open(model).ok(),
                    os_models: load_os_models_from(std::slice::from_ref(&bin)),
                };
                bench.prepare(&mut table.notes);
                // Every row starts from the same learned expert use: a row's own prompt
                // would otherwise teach the next row which experts it needs.
                let learned = LearnedUse::take();
                for row in &pass.rows {
                    learned.restore();
                    let mut r = bench.row(row);
                    r.latency_ms = pass.latency_ms;
                    r.link_mbit = pass.latency_ms.map(|_| args.link_mbit);
                    eprintln!(
                        "homelab bench: {}: {:?}, TTFT {:?} ms, TPOT {:?} ms",
                        r.row, r.status, r.ttft_ms, r.tpot_ms
                    );
                    table.rows.push(r);
                }
                Ok(())
            });
            // Always down, also after a failed `up` or row.
            let downed = super::down(Some(&bed.name));
            if let Err(e) = &measured {
                let why = format!("{e:#}");
                eprintln!("homelab bench: {model_name}: {why}");
                let ran = table.rows.len() - done_before;
                for row in pass.rows.iter().skip(ran) {
                    table.rows.push(skipped(row, &why));
                }
            }
            downed?;
        }
        tables.push(table);
        write_outputs(&out_dir, &stem, experiment, &tables)?;
    }
    print!("{}", report::markdown(&tables));
    eprintln!(
        "homelab bench: wrote {} and {} (each row's output: {})",
        out_dir.join(format!("{stem}.md")).display(),
        out_dir.join(format!("{stem}.json")).display(),
        out_dir
            .join("homelab-bench-logs")
            .join(experiment.key())
            .display()
    );
    Ok(())
}

/// What the experiment runs for `model`: its beds and their rows, `--rows` applied.
fn passes_for(args: &BenchArgs, bed: &Testbed, best: &str, model: &Path) -> Result<Vec<Pass>> {
    let experiment = args.experiment;
    Ok(match experiment {
        Experiment::Paper => vec![Pass {
            latency_ms: None,
            rows: rows::select(
                rows::PAPER_ROWS.map(|k| k.row(best)).to_vec(),
                &args.rows,
                experiment,
            )?,
        }],
        Experiment::Rounds => {
            let ks = if args.ks.is_empty() {
                rows::round_counts(super::layer_count(model)?, bed.devices.len())
            } else {
                args.ks.clone()
            };
            if ks.contains(&0) {
                bail!("--ks: k is at least 1");
            }
            vec![Pass {
                latency_ms: None,
                rows: rows::select(rows::rounds_rows(&ks, args.windows), &args.rows, experiment)?,
            }]
        }
        Experiment::Links => {
            let all: Vec<Row> = args
                .latencies_ms
                .iter()
                .map(|&l| rows::link_row(l, args.link_mbit))
                .collect();
            let picked = rows::select(all.clone(), &args.rows, experiment)?;
            args.latencies_ms
                .iter()
                .zip(all)
                .filter(|(_, row)| picked.contains(row))
                .map(|(&l, row)| Pass {
                    latency_ms: Some(l),
                    rows: vec![row],
                })
                .collect()
        }
    })
}

fn write_outputs(dir: &Path, stem: &str, experiment: Experiment, tables: &[Table]) -> Result<()> {
    let md = format!(
        "## Home-lab bench: {}\n\n{}\n\n{}",
        experiment.key(),
        report::preamble(experiment),
        report::markdown(tables)
    );
    fs::write(dir.join(format!("{stem}.md")), md)?;
    fs::write(
        dir.join(format!("{stem}.json")),
        serde_json::to_string_pretty(tables)? + "\n",
    )?;
    Ok(())
}

/// `1b`, `3b`, `8b` or a path.
fn model_path(layout: &Layout, name: &str) -> Result<PathBuf> {
    let path = match name {
        "1b" | "3b" | "8b" => layout
            .derived_models
            .join(format!("bench-llama-{name}-q4_k_m.gguf")),
        "moe" => layout
            .derived_models
            .join(format!("{}.gguf", crate::bench_models::BENCH_MOE_11B)),
        _ => PathBuf::from(name),
    };
    if !path.is_file() {
        match name {
            "1b" | "3b" | "8b" => bail!(
                "model {} is missing (`cargo xtask bench-models --only {name}` makes it)",
                path.display()
            ),
            "moe" => bail!(
                "model {} is missing (`cargo xtask bench-models --only moe-11b` makes it)",
                path.display()
            ),
            _ => bail!("model {} is missing", path.display()),
        }
    }
    Ok(path)
}

fn skipped(row: &Row, why: &str) -> RowResult {
    RowResult {
        row: row.key.clone(),
        what: row.what.clone(),
        timed_by: "–".into(),
        status: Status::Skipped(why.into()),
        ..RowResult::default()
    }
}

/// One bed that is up, and how to run rows on it.
struct Bench<'a> {
    hierarchies: &'a Hierarchies,
    st: &'a BedState,
    bed: &'a Testbed,
    args: &'a BenchArgs,
    prima: PathBuf,
    llama: &'a Path,
    model: &'a Path,
    best: &'a str,
    threads: u32,
    /// Where each row's stdout and stderr are kept (the bed's directory goes at `down`).
    logs: PathBuf,
    /// Halda's plan: planned before the rows (rounds), or the halda row's once it ran.
    halda_plan: Option<parse::Plan>,
    /// Each device's profile as it measures itself, in ring order (rounds and links):
    /// what [`predict`] evaluates Halda's model on.
    profiles: Option<Vec<DeviceProfile>>,
    model_profile: Option<ModelProfile>,
    /// The OS memory plugins beside `prima`, which Halda's model scores devices with.
    os_models: LoadedOsModels,
}

/// How one row ended, before its figures are read.
struct Finished {
    stdout: String,
    stderr: String,
    exit: Option<i32>,
    timed_out: bool,
    wall: Duration,
}

impl<'a> Bench<'a> {
    /// The devices in ring order: the head, then the nodes as the manifest lists them.
    fn ring_order(&self) -> Vec<&'a DeviceState> {
        self.st
            .devices
            .iter()
            .filter(|d| d.head)
            .chain(self.st.devices.iter().filter(|d| !d.head))
            .collect()
    }

    /// Before the rows: for rounds and links, every device's profile (Halda's model
    /// needs it); for rounds, Halda's plan from those profiles (a dry run), which the rows
    /// pin. What was found goes into the table's notes; what failed too.
    fn prepare(&mut self, notes: &mut Vec<String>) {
        if self.args.experiment == Experiment::Paper {
            return;
        }
        let profiles_file = match self.collect_profiles() {
            Ok((path, profiles)) => {
                self.profiles = Some(profiles);
                Some(path)
            }
            Err(e) => {
                let why = format!("{e:#}");
                eprintln!("homelab bench: profiles: {why}");
                notes.push(format!(
                    "No device profiles ({}), so no \"Halda's model\" figures.",
                    report_cell(&why)
                ));
                None
            }
        };
        if self.args.experiment != Experiment::Rounds {
            return;
        }
        match self.dry_run_plan(profiles_file.as_deref()) {
            Ok(plan) => {
                let shown =
                    |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "–".into());
                let names: Vec<&str> = self.ring_order().iter().map(|d| d.name.as_str()).collect();
                let w = rows::plan_windows(&names, &plan).ok();
                let model = |links| w.as_ref().and_then(|w| self.model_tpot(w, links));
                notes.push(format!(
                    "Halda's plan (`prima apply --dry-run` over the profiles the devices \
                     measured inside their limits): k = {}, {}; predicted TPOT {} ms (the \
                     bench's evaluation of the same model: {} ms; for the ring as it runs \
                     it, the head always in it, with the bed's links, which live profiles \
                     lack: {} ms). {}",
                    plan.k.map(|k| k.to_string()).unwrap_or_else(|| "?".into()),
                    plan.devices
                        .iter()
                        .map(|(d, w, l)| format!("{d} w {w} ({l} layers)"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    shown(plan.predicted_tpot_ms),
                    shown(model(false)),
                    shown(model(true)),
                    match self.args.windows {
                        rows::RoundsWindows::Halda => {
                            "The rows cut these windows into k rounds (w·k_plan/k, rounded up)."
                        }
                        rows::RoundsWindows::Equal => {
                            "The rows run equal windows instead (⌈L/(M·k)⌉ each, `--windows equal`)."
                        }
                    },
                ));
                self.halda_plan = Some(plan);
            }
            Err(e) => {
                let why = format!("{e:#}");
                eprintln!("homelab bench: Halda's plan: {why}");
                notes.push(format!(
                    "No Halda plan ({}): the rows run equal windows (⌈L/(M·k)⌉ each).",
                    report_cell(&why)
                ));
            }
        }
    }

    /// Every device's `prima profile --toml` inside its limits, in ring order, written
    /// to one profiles file (kept with the logs, and in the bed's directory for the dry run).
    fn collect_profiles(&self) -> Result<(PathBuf, Vec<DeviceProfile>)> {
        let mut all = Vec::new();
        for d in self.ring_order() {
            let mut argv = vec![
                self.prima.display().to_string(),
                "profile".into(),
                "--toml".into(),
                "--name".into(),
                d.name.clone(),
                "-m".into(),
                d.model_copy.display().to_string(),
            ];
            if let Some(t) = self
                .bed
                .devices
                .iter()
                .find(|b| b.name == d.name)
                .and_then(|b| b.threads)
            {
                argv.extend(["-t".into(), t.to_string()]);
            }
            let key = format!("profile-{}", d.name);
            let done = self.run_in(d, &key, &argv)?;
            if done.exit != Some(0) {
                bail!(
                    "device '{}': prima profile: exit {:?}: {}",
                    d.name,
                    done.exit,
                    last_line(&done.stderr)
                );
            }
            let parsed =
                DeviceProfiles::parse(&self.logs.join(format!("{key}.stdout")), &done.stdout)?;
            all.extend(parsed.device);
        }
        let file = DeviceProfiles {
            description: Some(format!(
                "{}: each device's `prima profile` inside its limits (homelab bench)",
                self.bed.name
            )),
            device: all.clone(),
        };
        let text = toml::to_string(&file)?;
        fs::write(self.logs.join("profiles.toml"), &text)?;
        let path = self.st.dir.join("bench-profiles.toml");
        fs::write(&path, &text)?;
        Ok((path, all))
    }

    /// Halda's plan for the bed, from `profiles` when there are some (else the devices
    /// are profiled live), without running the ring.
    fn dry_run_plan(&self, profiles: Option<&Path>) -> Result<parse::Plan> {
        let mut policy = "scheduler = \"halda\"\n".to_string();
        if let Some(p) = profiles {
            policy += &format!(
                "profiles = {}\n",
                toml::Value::String(p.display().to_string())
            );
        }
        let manifest = self.manifest_for("plan", &policy)?;
        let head = self.ring_order()[0];
        let argv = [
            self.prima.display().to_string(),
            "apply".into(),
            manifest.display().to_string(),
            "--dry-run".into(),
        ];
        let done = self.run_in(head, "plan", &argv)?;
        let plan = parse::prima_plan(&done.stderr);
        if done.exit != Some(0) || plan.devices.is_empty() {
            bail!(
                "prima apply --dry-run: exit {:?}: {}",
                done.exit,
                last_line(&done.stderr)
            );
        }
        Ok(plan)
    }

    /// Halda's model for `windows` (ring order) on the devices' profiles: as Halda scores
    /// a plan (`ring` false: the devices with a window, no links), or for the ring as it
    /// runs, with the bed's links (`ring` true).
    fn model_tpot(&self, windows: &[usize], ring: bool) -> Option<f64> {
        let model = self.model_profile.as_ref()?;
        let profiles = self.profiles.as_ref()?;
        let ctx = self.bed.ctx;
        if !ring {
            return self.no_model_is_said(predict::halda_tpot_ms(
                model,
                profiles,
                windows,
                ctx,
                &self.os_models,
            ));
        }
        let order = self.ring_order();
        let latency: Vec<f64> = order.iter().map(|d| d.latency_ms).collect();
        let mbit: Vec<Option<f64>> = order.iter().map(|d| d.link_mbit).collect();
        let links = predict::Links {
            latency_ms: &latency,
            link_mbit: &mbit,
        };
        self.no_model_is_said(predict::ring_tpot_ms(
            model,
            profiles,
            windows,
            ctx,
            Some(&links),
            &self.os_models,
        ))
    }

    /// A figure of Halda's model, or the reason there is none on stderr.
    fn no_model_is_said(&self, figure: Result<f64, NoMemoryModel>) -> Option<f64> {
        figure
            .map_err(|e| eprintln!("homelab bench: Halda's model: {e}"))
            .ok()
    }

    fn row(&mut self, row: &Row) -> RowResult {
        match self.try_row(row) {
            Ok(r) => r,
            Err(e) => skipped(row, &format!("{e:#}")),
        }
    }

    fn try_row(&mut self, row: &Row) -> Result<RowResult> {
        let head = self.ring_order()[0];
        let best = self.st.device(self.best).context("best device is gone")?;
        let threads = self.threads.to_string();
        let prompt = self.args.prompt.clone();
        let n = self.args.tokens.to_string();
        let ctx = self.bed.ctx.to_string();
        let copy = best.model_copy.display().to_string();
        let mut what = row.what.clone();
        // Halda's printed figure for the plan a pinned row runs unchanged.
        let mut pinned_prediction = None;
        // Halda's model for a plan Halda did not print a figure for.
        let mut model_tpot = None;
        // What both tools alone are given: the same prompt, length, threads and greedy
        // sampling, so their rows compare.
        let alone_args: Vec<String> = [
            "-m",
            &copy,
            "-p",
            &prompt,
            "-n",
            &n,
            "-t",
            &threads,
            "-c",
            &ctx,
            "--temp",
            "0",
            "--seed",
            "0",
            "--ignore-eos",
        ]
        .map(String::from)
        .to_vec();
        let (device, argv, timed_by, watched): (
            &DeviceState,
            Vec<String>,
            &str,
            Vec<&DeviceState>,
        ) = match &row.run {
            RowRun::LlamaAlone => {
                if !self.llama.is_file() {
                    bail!(
                        "{} is missing (cargo xtask reference builds it)",
                        self.llama.display()
                    );
                }
                let mut argv = vec![self.llama.display().to_string()];
                argv.extend(alone_args.iter().cloned());
                // --no-repack: as the paper ran it, weights stay in the mmap'd page cache.
                // By default llama.cpp's CPU backend repacks Q4_K weights into anonymous
                // memory (an 8B model: 1.7 GB of it on D3, OOM-killed in its 1750 MB).
                argv.extend(
                    [
                        "-no-cnv",
                        "--no-display-prompt",
                        "--no-warmup",
                        "--no-repack",
                    ]
                    .map(String::from),
                );
                (best, argv, "llama-completion", vec![best])
            }
            RowRun::PrimaAlone => {
                let mut argv = vec![self.prima.display().to_string(), "run".to_owned()];
                argv.extend(alone_args.iter().cloned());
                (best, argv, "prima run", vec![best])
            }
            RowRun::Ring(_) | RowRun::Pinned { .. } => {
                let policy = match &row.run {
                    RowRun::Ring(policy) => policy.clone(),
                    RowRun::Pinned { k, extra } => {
                        let names: Vec<&str> =
                            self.ring_order().iter().map(|d| d.name.as_str()).collect();
                        // Equal windows asked for: no plan is pinned at any k.
                        let plan = match (k, self.args.windows) {
                            (Some(_), rows::RoundsWindows::Equal) => None,
                            _ => self.halda_plan.as_ref(),
                        };
                        match (plan, k) {
                            (Some(plan), None) => {
                                pinned_prediction = Some(plan.predicted_tpot_ms);
                                what += " (Halda's plan, pinned)";
                                rows::pinned_policy(&rows::plan_windows(&names, plan)?, extra)
                            }
                            (Some(plan), Some(k)) => {
                                let w = rows::windows_at_k(
                                    &rows::plan_windows(&names, plan)?,
                                    plan.k.unwrap_or(1),
                                    *k,
                                );
                                model_tpot = self.model_tpot(&w, true);
                                rows::pinned_policy(&w, extra)
                            }
                            (None, None) => {
                                what += " (planned afresh)";
                                rows::afresh_policy(extra)
                            }
                            (None, Some(k)) => {
                                let w = rows::equal_windows(
                                    super::layer_count(self.model)?,
                                    names.len(),
                                    *k,
                                );
                                if self.args.windows == rows::RoundsWindows::Halda {
                                    what += " (equal windows: no Halda plan)";
                                }
                                model_tpot = self.model_tpot(&w, true);
                                rows::pinned_policy(&w, extra)
                            }
                        }
                    }
                    _ => unreachable!(),
                };
                let manifest = self.manifest_for(&row.key, &policy)?;
                let argv = [
                    &self.prima.display().to_string(),
                    "apply",
                    &manifest.display().to_string(),
                    "--prompt",
                    &prompt,
                    "-n",
                    &n,
                    "--temp",
                    "0",
                    "-v",
                ]
                .map(String::from)
                .to_vec();
                (head, argv, "prima apply", self.ring_order())
            }
        };

        for d in &self.st.devices {
            super::model_copy::drop_cached(&d.model_copy)?;
        }
        let before: Vec<u64> = watched.iter().map(|d| self.oom_kills(d)).collect();
        for d in &watched {
            // Writing to max_usage_in_bytes resets the peak to the current usage.
            let _ = fs::write(self.memory_file(d, "memory.max_usage_in_bytes"), "0");
        }
        let finished = self.run_in(device, &row.key, &argv)?;
        let memory = watched
            .iter()
            .zip(before)
            .map(|(d, before)| DeviceMemory {
                device: d.name.clone(),
                peak_bytes: self.read_u64(d, "memory.max_usage_in_bytes"),
                limit_bytes: self.read_u64(d, "memory.limit_in_bytes"),
                oom_kills: self.oom_kills(d).saturating_sub(before),
            })
            .collect();

        let timing = if row.run == RowRun::LlamaAlone {
            parse::llama_perf(&finished.stderr)
        } else {
            parse::prima_summary(&finished.stderr)
        }
        .unwrap_or_default();
        let plan = parse::prima_plan(&finished.stderr);
        let is_halda = matches!(&row.run, RowRun::Ring(p) if p.contains("\"halda\""));
        if is_halda && !plan.devices.is_empty() {
            self.halda_plan = Some(plan.clone());
            // The links experiment: the same model with the bed's links.
            if self.args.experiment == Experiment::Links {
                let names: Vec<&str> = self.ring_order().iter().map(|d| d.name.as_str()).collect();
                model_tpot = rows::plan_windows(&names, &plan)
                    .ok()
                    .and_then(|w| self.model_tpot(&w, true));
            }
        }
        let status = if finished.timed_out {
            Status::TimedOut
        } else if finished.exit == Some(0) && timing.tpot_ms.is_some() {
            Status::Ok
        } else {
            Status::Failed(format!(
                "exit {:?}: {}",
                finished.exit,
                last_line(&finished.stderr)
            ))
        };
        let generated = timing
            .generated
            .or_else(|| (!finished.stdout.is_empty()).then(|| self.count_tokens(&finished.stdout)));
        let ring = parse::ring_table(&finished.stderr)
            .into_iter()
            .map(|l| RingDevice {
                device: self.device_at(&l.addr),
                tokens: l.tokens,
                compute_ms: l.compute_ms,
                send_ms: l.send_ms,
                wait_ms: l.wait_ms,
                major_faults_per_token: l.major_faults,
                disk_mb_per_token: l.disk_mb,
                memory_pressure_pct: l.memory_pressure_pct,
            })
            .collect();
        Ok(RowResult {
            row: row.key.clone(),
            what,
            timed_by: timed_by.into(),
            devices: watched.iter().map(|d| d.name.clone()).collect(),
            ttft_ms: timing.ttft_ms,
            tpot_ms: timing.tpot_ms,
            // A pinned plan is manual to apply, which predicts nothing: Halda's own figure.
            predicted_tpot_ms: pinned_prediction.flatten().or(plan.predicted_tpot_ms),
            model_tpot_ms: model_tpot,
            generated,
            status,
            k: plan.k,
            windows: plan
                .devices
                .iter()
                .map(|(d, w, _)| (d.clone(), *w))
                .collect(),
            plan: plan.devices.into_iter().map(|(d, _, l)| (d, l)).collect(),
            ring,
            latency_ms: None,
            link_mbit: None,
            memory,
            wall_s: finished.wall.as_secs_f64(),
        })
    }

    /// The device name behind an address of the ring's device table (`head` or a node's).
    fn device_at(&self, addr: &str) -> String {
        let found = if addr == "head" {
            self.st.devices.iter().find(|d| d.head)
        } else {
            self.st
                .devices
                .iter()
                .find(|d| d.node.as_deref() == Some(addr))
        };
        found
            .map(|d| d.name.clone())
            .unwrap_or_else(|| addr.to_string())
    }

    /// The bed's generated manifest with these `[policy]` lines instead of its scheduler.
    fn manifest_for(&self, key: &str, policy: &str) -> Result<PathBuf> {
        let text = fs::read_to_string(&self.st.manifest)
            .with_context(|| format!("reading {}", self.st.manifest.display()))?;
        let halda = "scheduler = \"halda\"\n";
        if !text.contains(halda) {
            bail!("{} has no `{}`", self.st.manifest.display(), halda.trim());
        }
        let path = self.st.dir.join(format!("bench-{key}.toml"));
        fs::write(&path, text.replacen(halda, policy, 1))?;
        // Kept with the logs: the bed's directory goes at `down`.
        let _ = fs::copy(&path, self.logs.join(format!("{key}.toml")));
        Ok(path)
    }

    /// Runs `argv` inside `device`, killing its process group at the row timeout.
    fn run_in(&self, device: &DeviceState, key: &str, argv: &[String]) -> Result<Finished> {
        use std::os::unix::process::CommandExt;
        let out_path = self.logs.join(format!("{key}.stdout"));
        let err_path = self.logs.join(format!("{key}.stderr"));
        let mut cmd = super::device_command(self.hierarchies, self.st, device, argv);
        let start = Instant::now();
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(fs::File::create(&out_path)?)
            .stderr(fs::File::create(&err_path)?)
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start {}", argv[0]))?;
        let limit = Duration::from_secs(self.args.row_timeout_s);
        let mut timed_out = false;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if start.elapsed() > limit {
                timed_out = true;
                // SAFETY: kill takes integers only; the group is the child's own.
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                break child.wait()?;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let wall = start.elapsed();
        Ok(Finished {
            stdout: String::from_utf8_lossy(&fs::read(&out_path)?).into_owned(),
            stderr: String::from_utf8_lossy(&fs::read(&err_path)?).into_owned(),
            exit: status.code(),
            timed_out,
            wall,
        })
    }

    /// Tokens in the text a cut-off run printed, by the model's own tokenizer.
    fn count_tokens(&self, text: &str) -> usize {
        prima_core::gguf::GgufFile::open(self.model)
            .ok()
            .and_then(|g| prima_core::tokenizer::Tokenizer::from_gguf(&g).ok())
            .map(|t| t.encode(text, false, false).len())
            .unwrap_or(0)
    }

    fn memory_file(&self, d: &DeviceState, file: &str) -> PathBuf {
        self.hierarchies.group("memory", &d.name).join(file)
    }

    fn read_u64(&self, d: &DeviceState, file: &str) -> u64 {
        fs::read_to_string(self.memory_file(d, file))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// `oom_kill N` from memory.oom_control (kernels since 4.13).
    fn oom_kills(&self, d: &DeviceState) -> u64 {
        fs::read_to_string(self.memory_file(d, "memory.oom_control"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("oom_kill "))
                    .and_then(|n| n.trim().parse().ok())
            })
            .unwrap_or(0)
    }
}

/// The last non-empty line of a tool's stderr.
fn last_line(stderr: &str) -> &str {
    stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no output")
}

/// A reason short enough for a table note.
fn report_cell(text: &str) -> String {
    let one_line = text.lines().next().unwrap_or("");
    match one_line.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &one_line[..i]),
        None => one_line.to_string(),
    }
}

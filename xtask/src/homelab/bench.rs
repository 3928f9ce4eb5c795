//! `cargo xtask homelab bench`: the paper's comparison on an emulated bed, one same-run
//! table per model, every figure measured in that run.
//!
//! For each model the bed is brought up (`homelab up --model`), every row runs in turn
//! inside its device with a timeout, and the bed is brought down again, also when a row
//! or the bring-up fails. Before each row every device's model copy is dropped from the
//! page cache (pages a running node maps stay) and the memory cgroups' peak counters are
//! reset, so rows start cold and their peaks are their own.
//!
//! Not for: predicting anything (the only prediction shown is the plan's own, labelled),
//! or timing assertions. `parse` reads the tools' output, `report` renders the tables.

mod parse;
mod report;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use self::report::{DeviceMemory, ModelTable, RowResult, Status};
use super::cgroups::Hierarchies;
use super::state::{self, BedState, DeviceState};
use super::testbed::Testbed;
use crate::layout::Layout;
use crate::llama_cpp::LlamaCpp;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// A testbed file, or a name under manifests/testbeds/homelab/.
    #[arg(long, default_value = "d1-d4")]
    testbed: String,
    /// Models: 1b, 3b, 8b (the bench-llama-*-q4_k_m models) or GGUF paths.
    #[arg(long, value_delimiter = ',', default_value = "1b,3b")]
    models: Vec<String>,
    /// Tokens to generate per row.
    #[arg(long, default_value_t = 8)]
    tokens: usize,
    #[arg(long, default_value = "Once upon a time")]
    prompt: String,
    /// Rows to run, in this order (default: all).
    #[arg(long, value_delimiter = ',', value_enum)]
    rows: Vec<RowKind>,
    /// A row still running after this many seconds is killed and reported as timed out.
    #[arg(long, default_value_t = 300)]
    row_timeout_s: u64,
    /// Use the `prima` already built instead of running cargo build first.
    #[arg(long)]
    no_build: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RowKind {
    /// llama.cpp (`llama-completion`, mmap) alone on the best device.
    LlamaAlone,
    /// `prima run` alone on the best device.
    PrimaAlone,
    /// The ring as Halda plans it (`prima apply`).
    Halda,
    /// The ring as MemSched plans it (layers in proportion to memory).
    Mem,
    /// The ring as PerfSched plans it (layers in proportion to compute).
    Perf,
    /// Halda's ring without prefetching the next window.
    NoPrefetch,
    /// Halda's ring without releasing used windows (the kernel evicts).
    NoRelease,
}

const ALL_ROWS: [RowKind; 7] = [
    RowKind::LlamaAlone,
    RowKind::PrimaAlone,
    RowKind::Halda,
    RowKind::Mem,
    RowKind::Perf,
    RowKind::NoPrefetch,
    RowKind::NoRelease,
];

const BEST_DEVICE_RULE: &str =
    "the device with the most memory; threads = its CPU quota rounded up";

impl RowKind {
    fn key(self) -> &'static str {
        match self {
            RowKind::LlamaAlone => "llama-alone",
            RowKind::PrimaAlone => "prima-alone",
            RowKind::Halda => "halda",
            RowKind::Mem => "mem",
            RowKind::Perf => "perf",
            RowKind::NoPrefetch => "no-prefetch",
            RowKind::NoRelease => "no-release",
        }
    }

    fn what(self, best: &str) -> String {
        match self {
            RowKind::LlamaAlone => format!("llama.cpp alone on {best} (mmap)"),
            RowKind::PrimaAlone => format!("Prima alone on {best}"),
            RowKind::Halda => "Prima ring, Halda".into(),
            RowKind::Mem => "Prima ring, MemSched".into(),
            RowKind::Perf => "Prima ring, PerfSched".into(),
            RowKind::NoPrefetch => "Prima ring, Halda, prefetch off".into(),
            RowKind::NoRelease => "Prima ring, Halda, release none".into(),
        }
    }

    /// The `[policy]` lines of the generated manifest for a ring row.
    fn policy(self) -> Option<&'static str> {
        match self {
            RowKind::LlamaAlone | RowKind::PrimaAlone => None,
            RowKind::Halda => Some("scheduler = \"halda\"\n"),
            RowKind::Mem => Some("scheduler = \"mem\"\n"),
            RowKind::Perf => Some("scheduler = \"perf\"\n"),
            RowKind::NoPrefetch => Some("scheduler = \"halda\"\nprefetch = false\n"),
            RowKind::NoRelease => Some("scheduler = \"halda\"\nrelease = \"none\"\n"),
        }
    }
}

pub fn run(layout: &Layout, args: &BenchArgs) -> Result<()> {
    let hierarchies = super::check_machine()?;
    let testbed_file = super::testbed_path(layout, &args.testbed);
    let bed = Testbed::load(&testbed_file)?;
    let best = bed
        .devices
        .iter()
        .max_by_key(|d| d.memory)
        .context("the testbed has no devices")?;
    let threads = (best.cpu.ceil() as u32).max(1);
    let bin = super::release_dir(layout, args.no_build)?;
    let llama = LlamaCpp::new(layout).bin("llama-completion");
    let models = args
        .models
        .iter()
        .map(|m| model_path(layout, m))
        .collect::<Result<Vec<_>>>()?;
    let rows: Vec<RowKind> = if args.rows.is_empty() {
        ALL_ROWS.to_vec()
    } else {
        args.rows.clone()
    };
    let out_dir = layout.workspace.join("target");
    fs::create_dir_all(&out_dir)?;

    let mut tables = Vec::new();
    for model in &models {
        let mut table = ModelTable {
            testbed: bed.name.clone(),
            model: model
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into(),
            model_bytes: fs::metadata(model).map(|m| m.len()).unwrap_or(0),
            tokens: args.tokens,
            prompt: args.prompt.clone(),
            best_device: best.name.clone(),
            best_device_rule: BEST_DEVICE_RULE.into(),
            rows: Vec::new(),
        };
        eprintln!("homelab bench: {} on {}", table.model, bed.name);
        // Someone else's bed is theirs: stop here, without the `down` below.
        let leftovers = super::what_exists(&hierarchies);
        if !leftovers.is_empty() {
            bail!(
                "a home lab is already up ({}); bench brings its own up and down, so it \
                 leaves that one alone: run `cargo xtask homelab down` when it is free",
                leftovers.join(", ")
            );
        }
        let measured = super::up(layout, &args.testbed, Some(model), true).and_then(|()| {
            let st = BedState::load(&state::root().join(&bed.name))?;
            let mut bench = Bench {
                hierarchies: &hierarchies,
                st: &st,
                args,
                prima: bin.join("prima"),
                llama: &llama,
                model,
                best: &best.name,
                threads,
                ctx: bed.ctx,
                logs: out_dir.join("homelab-bench-logs").join(&table.model),
                halda_plan: None,
            };
            fs::create_dir_all(&bench.logs)?;
            for &row in &rows {
                let r = bench.row(row);
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
            eprintln!("homelab bench: {}: {why}", table.model);
            for &row in rows.iter().skip(table.rows.len()) {
                table.rows.push(skipped(row, &best.name, &why));
            }
        }
        tables.push(table);
        write_outputs(&out_dir, &tables)?;
        downed?;
    }
    print!("{}", report::markdown(&tables));
    eprintln!(
        "homelab bench: wrote {} and {} (each row's output: {})",
        out_dir.join("homelab-bench.md").display(),
        out_dir.join("homelab-bench.json").display(),
        out_dir.join("homelab-bench-logs").display()
    );
    Ok(())
}

fn write_outputs(dir: &Path, tables: &[ModelTable]) -> Result<()> {
    let md = format!(
        "## Home-lab bench\n\nTTFT/TPOT as printed by the tool named in \"timed by\" \
         (prima: its summary line; llama.cpp: llama_perf_context_print's prompt eval and \
         eval times); \"predicted\" is the plan's own figure. Peak memory is the cgroup's \
         memory.max_usage_in_bytes (page cache included) over the row.\n\n{}",
        report::markdown(tables)
    );
    fs::write(dir.join("homelab-bench.md"), md)?;
    fs::write(
        dir.join("homelab-bench.json"),
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
        _ => PathBuf::from(name),
    };
    if !path.is_file() {
        bail!(
            "model {} is missing (`cargo xtask bench-models --only {name}` makes the bench models)",
            path.display()
        );
    }
    Ok(path)
}

fn skipped(row: RowKind, best: &str, why: &str) -> RowResult {
    RowResult {
        row: row.key().into(),
        what: row.what(best),
        timed_by: "–".into(),
        devices: Vec::new(),
        ttft_ms: None,
        tpot_ms: None,
        predicted_tpot_ms: None,
        generated: None,
        status: Status::Skipped(why.into()),
        plan: Vec::new(),
        memory: Vec::new(),
        wall_s: 0.0,
    }
}

/// `[policy]` lines that run `plan` as it was (`scheduler = "manual"`, its windows in
/// the manifest's device `order` and its k), with the row's own prefetch/release lines.
fn pinned_policy(order: &[&str], plan: &parse::Plan, policy: &str) -> Result<String> {
    let windows = order
        .iter()
        .map(|name| {
            plan.devices
                .iter()
                .find(|(d, _, _)| d == name)
                .map(|(_, w, _)| w.to_string())
                .with_context(|| format!("the halda plan has no device {name}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut text = format!(
        "scheduler = \"manual\"\nwindows = [{}]\n",
        windows.join(", ")
    );
    if let Some(k) = plan.k {
        text += &format!("k = {k}\n");
    }
    text += &policy.replacen("scheduler = \"halda\"\n", "", 1);
    Ok(text)
}

/// One bed that is up, and how to run rows on it.
struct Bench<'a> {
    hierarchies: &'a Hierarchies,
    st: &'a BedState,
    args: &'a BenchArgs,
    prima: PathBuf,
    llama: &'a Path,
    model: &'a Path,
    best: &'a str,
    threads: u32,
    ctx: usize,
    /// Where each row's stdout and stderr are kept (the bed's directory goes at `down`).
    logs: PathBuf,
    /// The `halda` row's plan, once it ran: the ablation rows run it pinned.
    halda_plan: Option<parse::Plan>,
}

/// How one row ended, before its figures are read.
struct Finished {
    stdout: String,
    stderr: String,
    exit: Option<i32>,
    timed_out: bool,
    wall: Duration,
}

impl Bench<'_> {
    fn row(&mut self, row: RowKind) -> RowResult {
        match self.try_row(row) {
            Ok(r) => r,
            Err(e) => skipped(row, self.best, &format!("{e:#}")),
        }
    }

    fn try_row(&mut self, row: RowKind) -> Result<RowResult> {
        let head = self.st.devices.iter().find(|d| d.head).context("no head")?;
        let best = self.st.device(self.best).context("best device is gone")?;
        let threads = self.threads.to_string();
        let prompt = self.args.prompt.clone();
        let n = self.args.tokens.to_string();
        let ctx = self.ctx.to_string();
        let copy = best.model_copy.display().to_string();
        // Some(Halda's prediction) when the row runs the halda row's plan pinned.
        let mut pinned = None;
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
        ) = match row.policy() {
            None if row == RowKind::LlamaAlone => {
                if !self.llama.is_file() {
                    bail!(
                        "{} is missing (cargo xtask reference builds it)",
                        self.llama.display()
                    );
                }
                let mut argv = vec![self.llama.display().to_string()];
                argv.extend(alone_args.iter().cloned());
                argv.extend(["-no-cnv", "--no-display-prompt", "--no-warmup"].map(String::from));
                (best, argv, "llama-completion", vec![best])
            }
            None => {
                let mut argv = vec![self.prima.display().to_string(), "run".to_owned()];
                argv.extend(alone_args.iter().cloned());
                (best, argv, "prima run", vec![best])
            }
            Some(policy) => {
                let policy = match (row, &self.halda_plan) {
                    (RowKind::NoPrefetch | RowKind::NoRelease, Some(plan)) => {
                        pinned = Some(plan.predicted_tpot_ms);
                        // The generated manifest lists the head first, then the nodes.
                        let order: Vec<&str> = self
                            .st
                            .devices
                            .iter()
                            .filter(|d| d.head)
                            .chain(self.st.devices.iter().filter(|d| !d.head))
                            .map(|d| d.name.as_str())
                            .collect();
                        pinned_policy(&order, plan, policy)?
                    }
                    _ => policy.to_string(),
                };
                let manifest = self.manifest_for(row, &policy)?;
                let argv = [
                    &self.prima.display().to_string(),
                    "apply",
                    &manifest.display().to_string(),
                    "--prompt",
                    &prompt,
                    "-n",
                    &n,
                    "-v",
                ]
                .map(String::from)
                .to_vec();
                (head, argv, "prima apply", self.st.devices.iter().collect())
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
        let finished = self.run_in(device, row, &argv)?;
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

        let timing = if row == RowKind::LlamaAlone {
            parse::llama_perf(&finished.stderr)
        } else {
            parse::prima_summary(&finished.stderr)
        }
        .unwrap_or_default();
        let plan = parse::prima_plan(&finished.stderr);
        if row == RowKind::Halda && !plan.devices.is_empty() {
            self.halda_plan = Some(plan.clone());
        }
        let status = if finished.timed_out {
            Status::TimedOut
        } else if finished.exit == Some(0) && timing.tpot_ms.is_some() {
            Status::Ok
        } else {
            let last = finished
                .stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no output");
            Status::Failed(format!("exit {:?}: {last}", finished.exit))
        };
        let generated = timing
            .generated
            .or_else(|| (!finished.stdout.is_empty()).then(|| self.count_tokens(&finished.stdout)));
        let what = match pinned {
            Some(_) => format!("{} (the halda row's plan, pinned)", row.what(self.best)),
            None if matches!(row, RowKind::NoPrefetch | RowKind::NoRelease) => {
                format!("{} (planned afresh)", row.what(self.best))
            }
            None => row.what(self.best),
        };
        Ok(RowResult {
            row: row.key().into(),
            what,
            timed_by: timed_by.into(),
            devices: watched.iter().map(|d| d.name.clone()).collect(),
            ttft_ms: timing.ttft_ms,
            tpot_ms: timing.tpot_ms,
            // A pinned plan is manual to apply, which predicts nothing: Halda's own figure.
            predicted_tpot_ms: pinned.flatten().or(plan.predicted_tpot_ms),
            generated,
            status,
            plan: plan.devices.into_iter().map(|(d, _, l)| (d, l)).collect(),
            memory,
            wall_s: finished.wall.as_secs_f64(),
        })
    }

    /// The bed's generated manifest with this row's `[policy]`.
    fn manifest_for(&self, row: RowKind, policy: &str) -> Result<PathBuf> {
        let text = fs::read_to_string(&self.st.manifest)
            .with_context(|| format!("reading {}", self.st.manifest.display()))?;
        let halda = "scheduler = \"halda\"\n";
        if !text.contains(halda) {
            bail!("{} has no `{}`", self.st.manifest.display(), halda.trim());
        }
        let path = self.st.dir.join(format!("bench-{}.toml", row.key()));
        fs::write(&path, text.replacen(halda, policy, 1))?;
        Ok(path)
    }

    /// Runs `argv` inside `device`, killing its process group at the row timeout.
    fn run_in(&self, device: &DeviceState, row: RowKind, argv: &[String]) -> Result<Finished> {
        use std::os::unix::process::CommandExt;
        let out_path = self.logs.join(format!("{}.stdout", row.key()));
        let err_path = self.logs.join(format!("{}.stderr", row.key()));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_plan_keeps_windows_in_manifest_order() {
        let plan = parse::Plan {
            predicted_tpot_ms: Some(300.0),
            k: Some(2),
            devices: vec![
                ("d1".into(), 0, 0),
                ("d3".into(), 9, 18),
                ("d2".into(), 3, 6),
            ],
        };
        let policy = RowKind::NoRelease.policy().unwrap();
        let text = pinned_policy(&["d1", "d2", "d3"], &plan, policy).unwrap();
        let m: toml::Value = toml::from_str(&format!("[policy]\n{text}")).unwrap();
        assert_eq!(m["policy"]["scheduler"].as_str(), Some("manual"));
        assert_eq!(m["policy"]["windows"].as_array().unwrap().len(), 3);
        assert_eq!(m["policy"]["windows"][1].as_integer(), Some(3));
        assert_eq!(m["policy"]["k"].as_integer(), Some(2));
        assert_eq!(m["policy"]["release"].as_str(), Some("none"));
        assert!(pinned_policy(&["d4"], &plan, policy).is_err());
    }

    #[test]
    fn ring_rows_change_only_the_policy() {
        for row in ALL_ROWS {
            match row {
                RowKind::LlamaAlone | RowKind::PrimaAlone => assert!(row.policy().is_none()),
                _ => {
                    let p = row.policy().unwrap();
                    let m: toml::Value = toml::from_str(&format!("[policy]\n{p}")).unwrap();
                    assert!(m["policy"]["scheduler"].is_str(), "{p}");
                }
            }
        }
    }
}

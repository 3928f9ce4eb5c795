//! `cargo xtask soak`: the server under a long mixed load on a three-device loopback
//! ring, with a node killed and restarted in the middle (issue 18, part 4).
//!
//! Two `prima node`s at fixed addresses and a `prima apply` head (pinned profiles: a
//! ring of three) take N requests from C client threads: whole and streamed
//! completions and chat completions with random `max_tokens`, clients that drop a
//! stream, `/v1/cancel` calls, malformed bodies. When half the requests are done one
//! node is SIGKILLed; a tenth later it restarts at its address. Every answer is judged
//! against what its kind should get; the head's and nodes' memory, threads and file
//! descriptors are read from `/proc` after a warm-up and at the end. The report says
//! what happened; the exit status is non-zero if anything was unexpected.

mod cluster;
mod load;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};

use crate::layout::Layout;
use cluster::{Cluster, ProcStats};
use load::{Kind, Outcome, Plan, Record};

#[derive(Args)]
pub struct SoakArgs {
    /// Requests in the measured load (after a warm-up of 2 × concurrency).
    #[arg(long, default_value_t = 1000)]
    requests: usize,
    /// Client threads sending at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Each generation asks for 1..=this many tokens (drawn per request).
    #[arg(long, default_value_t = 24)]
    max_tokens: u64,
    /// Seeds the mix of requests, so a soak can be run again request for request.
    #[arg(long, default_value_t = 18)]
    seed: u64,
    /// Do not kill and restart a node.
    #[arg(long)]
    no_kill: bool,
    /// The `prima` binary to run (its plugins beside it); without it, `cargo build
    /// --release` and the target directory's.
    #[arg(long)]
    prima: Option<PathBuf>,
    /// The model; default: SmolLM2-135M-Instruct Q4_1 in models/.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Also write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Anonymous memory may grow this much from the warm-up to the end and still read as
/// flat: allocator caches and the metrics' histograms settle in the first requests,
/// a leak grows with the count.
const ANON_SLACK_KIB: u64 = 8 * 1024;

/// The node killed in the middle (0: laptop, the head's successor).
const VICTIM: usize = 0;

pub fn run(layout: &Layout, args: &SoakArgs) -> Result<u8> {
    if args.requests == 0 || args.concurrency == 0 {
        bail!("--requests and --concurrency must be at least 1");
    }
    let prima = match &args.prima {
        Some(p) => p.clone(),
        None => build(layout)?,
    };
    if !prima.exists() {
        bail!("{} is missing", prima.display());
    }
    let model = args.model.clone().unwrap_or_else(|| {
        layout
            .fetched_models()
            .join("SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    if !model.exists() {
        bail!(
            "{} is missing (run `cargo xtask fetch-models`)",
            model.display()
        );
    }
    let dir = std::env::temp_dir().join(format!("prima-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cluster = Cluster::start(&prima, &model, &dir)?;
    println!(
        "soak: a ring of three on loopback serving {}; logs in {}",
        cluster.url,
        dir.display()
    );
    let report = soak(&mut cluster, args);
    // Stop the processes before reading the verdict, so nothing outlives the soak.
    drop(cluster);
    let mut report = report?;
    report.failures.extend(panics_in_logs(&dir));
    print_report(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report.json)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if report.failures.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
        println!("soak: passed");
        Ok(0)
    } else {
        println!("soak: FAILED (logs kept in {})", dir.display());
        for f in &report.failures {
            println!("  - {f}");
        }
        Ok(1)
    }
}

/// A panic any process printed (one caught in a server task leaves no other trace).
fn panics_in_logs(dir: &std::path::Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return vec![format!("cannot read the logs in {}", dir.display())];
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "log") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains("panicked at")) {
            found.push(format!("{}: {line}", path.display()));
        }
    }
    found
}

/// `cargo build --release` of prima and the plugins it loads; the built binary.
fn build(layout: &Layout) -> Result<PathBuf> {
    crate::build_tools::ensure_for_cargo(layout)?;
    let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["build", "--release", "--workspace", "--exclude", "xtask"])
        .current_dir(&layout.workspace)
        .status()
        .context("cannot run cargo build")?;
    if !status.success() {
        bail!("cargo build failed");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| layout.workspace.join("target"));
    Ok(target.join("release").join("prima"))
}

struct Report {
    json: Value,
    failures: Vec<String>,
}

/// What happened to the victim node, as instants.
#[derive(Default)]
struct Disturbance {
    killed: Option<Instant>,
    /// Requests done when it was killed, and how many were in flight.
    killed_at_done: usize,
    restarted: Option<Instant>,
    readmitted: Option<Instant>,
    /// The restarted process after its warm-up.
    victim_start: Option<ProcStats>,
}

fn soak(cluster: &mut Cluster, args: &SoakArgs) -> Result<Report> {
    let url = cluster.url.clone();
    let mut failures = Vec::new();

    // Warm-up: the allocator, the caches and the metrics settle before the first sample.
    let warm = load::plan(
        2 * args.concurrency,
        args.max_tokens,
        args.seed ^ 0x5741_524d,
    );
    let warm_records = drive(&url, &warm, args.concurrency, |_| {});
    judge_all(&warm_records, &mut failures, "warm-up");
    let start = settle(cluster, None)?;

    let plans = load::plan(args.requests, args.max_tokens, args.seed);
    let began = Instant::now();
    let mut dist = Disturbance::default();
    let kill_at = args.requests / 2;
    let restart_at = kill_at + (args.requests / 10).max(args.concurrency);
    let mut victim_warm_from: Option<usize> = None;
    let mut step_error = None;
    // Every tenth of the load, each process's sample: a leak climbs with the count, a
    // one-time allocation (a re-plan's buffers) steps once and stays.
    let mut timeline: Vec<Value> = Vec::new();
    let records = drive(&url, &plans, args.concurrency, |done| {
        if done * 10 >= (timeline.len() + 1) * args.requests {
            let mut row = serde_json::Map::new();
            row.insert("done".into(), json!(done));
            for p in cluster.processes() {
                let sample = ProcStats::read(p.pid()).map_or(Value::Null, |s| s.json());
                row.insert(p.name.clone(), sample);
            }
            timeline.push(Value::Object(row));
        }
        if args.no_kill || step_error.is_some() {
            return;
        }
        if dist.killed.is_none() && done >= kill_at {
            cluster.kill_node(VICTIM);
            dist.killed = Some(Instant::now());
            dist.killed_at_done = done;
            println!(
                "soak: node '{}' killed after {done} requests",
                node_name(VICTIM)
            );
        } else if dist.killed.is_some() && dist.restarted.is_none() && done >= restart_at {
            if let Err(e) = cluster.restart_node(VICTIM) {
                step_error = Some(e);
                return;
            }
            dist.restarted = Some(Instant::now());
            println!(
                "soak: node '{}' restarted after {done} requests",
                node_name(VICTIM)
            );
        } else if dist.restarted.is_some() && dist.readmitted.is_none() {
            if metric(&url, BACK).unwrap_or(0.0) >= 1.0 {
                dist.readmitted = Some(Instant::now());
                victim_warm_from = Some(done);
                println!(
                    "soak: node '{}' planned in again after {done} requests",
                    node_name(VICTIM)
                );
            }
        } else if let Some(from) = victim_warm_from {
            if dist.victim_start.is_none() && done >= from + 2 * args.concurrency {
                dist.victim_start = ProcStats::read(cluster.nodes[VICTIM].0.pid()).ok();
            }
        }
    });
    let elapsed = began.elapsed();
    if let Some(e) = step_error {
        return Err(e.context("restarting the killed node"));
    }
    judge_all(&records, &mut failures, "load");

    if !args.no_kill {
        finish_readmission(cluster, &url, args, &mut dist, &mut failures)?;
    }
    for p in cluster.processes() {
        if !p.alive() {
            failures.push(format!("{} exited during the soak", p.name));
        }
    }
    // The baseline: each process after its warm-up (the restarted node's own).
    let baseline: Vec<ProcStats> = start
        .iter()
        .enumerate()
        .map(|(i, s)| match dist.victim_start {
            Some(v) if !args.no_kill && i == 1 + VICTIM => v,
            _ => *s,
        })
        .collect();
    let end = settle(cluster, Some(&baseline))?;
    let metrics_text = get(&format!("{url}/metrics")).unwrap_or_default();
    let metrics = ring_metrics(&metrics_text);
    if !args.no_kill {
        let lost = metric_in(&metrics_text, LOST);
        let back = metric_in(&metrics_text, BACK);
        if lost < 1.0 {
            failures.push(format!(
                "the head counted {lost} re-plans for a lost device, not ≥ 1"
            ));
        }
        if back < 1.0 {
            failures.push(format!(
                "the head counted {back} re-plans for a device back, not ≥ 1"
            ));
        }
    }
    let devices = metric_in(&metrics_text, "prima_ring_devices");
    if devices != 3.0 {
        failures.push(format!("the ring ends with {devices} devices, not 3"));
    }

    let procs = compare(cluster, &baseline, &end, &mut failures);
    let mut json = report_json(args, &records, elapsed, &dist, &metrics, procs);
    json["timeline"] = Value::Array(timeline);
    Ok(Report { json, failures })
}

const LOST: &str = "prima_ring_replans_total{cause=\"device_lost\"}";
const BACK: &str = "prima_ring_replans_total{cause=\"device_back\"}";

fn node_name(i: usize) -> &'static str {
    ["laptop", "tablet"][i]
}

/// Runs `plans` from `concurrency` threads; `between(done)` runs on this thread every
/// few milliseconds with the number of requests finished. The records, by index.
fn drive(
    url: &str,
    plans: &[Plan],
    concurrency: usize,
    mut between: impl FnMut(usize),
) -> Vec<Record> {
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let records = Mutex::new(Vec::with_capacity(plans.len()));
    std::thread::scope(|s| {
        for _ in 0..concurrency {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(plan) = plans.get(i) else { break };
                let record = load::run(url, i, plan);
                records.lock().expect("no panics").push(record);
                done.fetch_add(1, Ordering::Release);
            });
        }
        loop {
            let n = done.load(Ordering::Acquire);
            between(n);
            if n == plans.len() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let mut records = records.into_inner().expect("no panics");
    records.sort_by_key(|r| r.index);
    records
}

/// Whether `r`'s outcome is what its kind should get; `Err`: why not.
fn judge(r: &Record, cancels: &[(Instant, Instant)]) -> Result<(), String> {
    let under_cancel = || cancels.iter().any(|&(s, e)| s < r.ended && r.started < e);
    match (&r.outcome, r.kind) {
        (Outcome::Unexpected(why), _) => Err(why.clone()),
        (Outcome::Ok, Kind::Cancel) | (Outcome::Cancelled, Kind::Cancel) => Ok(()),
        (Outcome::Ok, Kind::Whole | Kind::ChatWhole | Kind::Stream | Kind::ChatStream)
        | (Outcome::Ok, Kind::UnknownFields | Kind::Disconnect)
        | (Outcome::Disconnected, Kind::Disconnect) => Ok(()),
        // `/v1/cancel` cancels whichever generation runs, not only its caller's.
        (Outcome::Cancelled, _) if under_cancel() => Ok(()),
        (Outcome::Refused(_), k) if is_malformed(k) => Ok(()),
        (Outcome::ClosedEarly, Kind::Oversized) => Ok(()),
        (o, k) => Err(format!("{} ended {o:?}", k.name())),
    }
}

fn is_malformed(k: Kind) -> bool {
    matches!(
        k,
        Kind::BadJson
            | Kind::WrongType
            | Kind::ZeroMaxTokens
            | Kind::TooLong
            | Kind::Oversized
            | Kind::UnknownEndpoint
    )
}

fn judge_all(records: &[Record], failures: &mut Vec<String>, phase: &str) {
    let cancels: Vec<(Instant, Instant)> = records
        .iter()
        .filter(|r| r.kind == Kind::Cancel)
        .map(|r| (r.started, r.ended))
        .collect();
    for r in records {
        if let Err(why) = judge(r, &cancels) {
            failures.push(format!(
                "{phase} request {} ({}): {why}",
                r.index,
                r.kind.name()
            ));
        }
    }
}

/// Where the load ended before the restarted node was planned in again (a short soak):
/// small requests until it is (bounded), then its warm-up.
fn finish_readmission(
    cluster: &mut Cluster,
    url: &str,
    args: &SoakArgs,
    dist: &mut Disturbance,
    failures: &mut Vec<String>,
) -> Result<()> {
    if dist.restarted.is_none() {
        cluster.restart_node(VICTIM)?;
        dist.restarted = Some(Instant::now());
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while dist.readmitted.is_none() {
        if metric(url, BACK).unwrap_or(0.0) >= 1.0 {
            dist.readmitted = Some(Instant::now());
            break;
        }
        if Instant::now() > deadline {
            failures.push("the restarted node was not planned in again within 120 s".into());
            return Ok(());
        }
        let warm = load::plan(1, 2, args.seed);
        let mut plan = warm[0].clone();
        plan.kind = Kind::Whole;
        let r = load::run(url, 0, &plan);
        judge_all(std::slice::from_ref(&r), failures, "readmission");
        std::thread::sleep(Duration::from_millis(250));
    }
    if dist.victim_start.is_none() {
        let warm = load::plan(
            2 * args.concurrency,
            args.max_tokens,
            args.seed ^ 0x4241_434b,
        );
        let records = drive(url, &warm, args.concurrency, |_| {});
        judge_all(&records, failures, "readmission warm-up");
        dist.victim_start = ProcStats::read(cluster.nodes[VICTIM].0.pid()).ok();
    }
    Ok(())
}

/// Samples every process once its threads and descriptors have stopped changing (the
/// server closes connections a moment after the client): two equal samples 250 ms
/// apart, or, given `like`, samples equal to it; bounded (30 s), the last sample then.
fn settle(cluster: &mut Cluster, like: Option<&[ProcStats]>) -> Result<Vec<ProcStats>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let read = |cluster: &mut Cluster| -> Result<Vec<ProcStats>> {
        cluster
            .processes()
            .iter()
            .map(|p| ProcStats::read(p.pid()))
            .collect()
    };
    let shape = |s: &[ProcStats]| {
        s.iter()
            .map(|p| (p.pid, p.threads, p.fds))
            .collect::<Vec<_>>()
    };
    let mut last = read(cluster)?;
    loop {
        std::thread::sleep(Duration::from_millis(250));
        let now = read(cluster)?;
        let steady = match like {
            // A restarted process is judged against its own warm-up, not the first's.
            Some(like) => now
                .iter()
                .zip(like)
                .all(|(n, l)| (n.threads, n.fds) == (l.threads, l.fds)),
            None => shape(&now) == shape(&last),
        };
        if steady || Instant::now() > deadline {
            return Ok(now);
        }
        last = now;
    }
}

/// Start vs end per process, failures for threads or descriptors that grew or memory
/// that did not stay flat.
fn compare(
    cluster: &mut Cluster,
    start: &[ProcStats],
    end: &[ProcStats],
    failures: &mut Vec<String>,
) -> Vec<Value> {
    let names: Vec<String> = cluster.processes().iter().map(|p| p.name.clone()).collect();
    let mut out = Vec::new();
    for ((name, s), e) in names.iter().zip(start).zip(end) {
        if s.pid != e.pid {
            failures.push(format!(
                "{name}: no sample of the restarted process after its warm-up"
            ));
            continue;
        }
        if e.threads > s.threads {
            failures.push(format!("{name}: threads {} → {}", s.threads, e.threads));
        }
        if e.fds > s.fds {
            failures.push(format!("{name}: file descriptors {} → {}", s.fds, e.fds));
        }
        let slack = (s.anon_kib / 10).max(ANON_SLACK_KIB);
        if e.anon_kib > s.anon_kib + slack {
            failures.push(format!(
                "{name}: anonymous memory {} → {} KiB (more than {slack} KiB of growth)",
                s.anon_kib, e.anon_kib
            ));
        }
        out.push(json!({"process": name, "start": s.json(), "end": e.json()}));
    }
    out
}

fn get(url: &str) -> Option<String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .max_idle_connections(0)
        .build()
        .into();
    agent.get(url).call().ok()?.body_mut().read_to_string().ok()
}

fn metric(url: &str, series: &str) -> Option<f64> {
    Some(metric_in(&get(&format!("{url}/metrics"))?, series))
}

/// The value of the Prometheus sample named exactly `series` (0 if absent).
fn metric_in(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series).then(|| value.parse::<f64>().ok())?
        })
        .unwrap_or(0.0)
}

/// The ring's counters, the generations by finish reason (dropped streams count as
/// cancelled) and the error counters from `/metrics` (no histogram buckets).
fn ring_metrics(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| {
            (l.starts_with("prima_ring_")
                || l.starts_with("prima_generations_total")
                || l.contains("errors_total"))
                && !l.contains("_bucket")
        })
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

fn median_ms(mut v: Vec<Duration>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort();
    Some(v[v.len() / 2].as_secs_f64() * 1e3)
}

fn report_json(
    args: &SoakArgs,
    records: &[Record],
    elapsed: Duration,
    dist: &Disturbance,
    metrics: &BTreeMap<String, f64>,
    procs: Vec<Value>,
) -> Value {
    let mut by_kind: BTreeMap<Kind, Vec<&Record>> = BTreeMap::new();
    for r in records {
        by_kind.entry(r.kind).or_default().push(r);
    }
    let cancels: Vec<(Instant, Instant)> = records
        .iter()
        .filter(|r| r.kind == Kind::Cancel)
        .map(|r| (r.started, r.ended))
        .collect();
    let kinds: Vec<Value> = by_kind
        .iter()
        .map(|(kind, rs)| {
            let mut outcomes: BTreeMap<&str, usize> = BTreeMap::new();
            for r in rs {
                *outcomes.entry(r.outcome.name()).or_default() += 1;
            }
            json!({
                "kind": kind.name(),
                "requests": rs.len(),
                "outcomes": outcomes,
                "unexpected": rs.iter().filter(|r| judge(r, &cancels).is_err()).count(),
                "median_ms": median_ms(rs.iter().map(|r| r.ended - r.started).collect()),
                "median_first_piece_ms": median_ms(rs.iter().filter_map(|r| r.first_piece).collect()),
            })
        })
        .collect();
    let unexpected = records
        .iter()
        .filter(|r| judge(r, &cancels).is_err())
        .count();
    // The requests that lived through the loss: started before the node was planned in
    // again, ended after it was killed.
    let across = dist.killed.map(|killed| {
        let until = dist.readmitted.unwrap_or_else(Instant::now);
        let spanning: Vec<&Record> = records
            .iter()
            .filter(|r| r.ended > killed && r.started < until)
            .collect();
        let in_flight = records
            .iter()
            .filter(|r| r.started <= killed && r.ended > killed)
            .count();
        let lost = spanning
            .iter()
            .filter(|r| judge(r, &cancels).is_err())
            .count();
        json!({
            "killed_after_requests": dist.killed_at_done,
            "in_flight_at_kill": in_flight,
            "requests_while_lost": spanning.len(),
            "lost": lost,
            "restart_after_kill_s": dist.restarted.map(|r| (r - killed).as_secs_f64()),
            "readmitted_after_restart_s": match (dist.restarted, dist.readmitted) {
                (Some(r), Some(a)) => Some((a - r).as_secs_f64()),
                _ => None,
            },
        })
    });
    let cancel_hits = records
        .iter()
        .filter(|r| r.cancel_hit == Some(true))
        .count();
    json!({
        "requests": records.len(),
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "seed": args.seed,
        "elapsed_s": elapsed.as_secs_f64(),
        "unexpected": unexpected,
        "cancel_calls": cancels.len(),
        "cancel_calls_that_cancelled": cancel_hits,
        "kinds": kinds,
        "node_restart": across,
        "metrics": metrics,
        "processes": procs,
    })
}

fn print_report(report: &Report) {
    let j = &report.json;
    println!(
        "\nsoak: {} requests at concurrency {} in {:.0} s (max_tokens 1..={}, seed {}): {} unexpected",
        j["requests"], j["concurrency"], j["elapsed_s"].as_f64().unwrap_or(0.0), j["max_tokens"], j["seed"], j["unexpected"]
    );
    println!(
        "{:<17} {:>5}  {:<44} {:>10} {:>12}",
        "kind", "n", "outcomes", "median ms", "1st piece ms"
    );
    let ms = |v: &Value| v.as_f64().map_or("-".to_string(), |x| format!("{x:.0}"));
    for k in j["kinds"].as_array().into_iter().flatten() {
        let outcomes = k["outcomes"]
            .as_object()
            .map(|o| {
                o.iter()
                    .map(|(n, c)| format!("{n} {c}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        println!(
            "{:<17} {:>5}  {:<44} {:>10} {:>12}",
            k["kind"].as_str().unwrap_or_default(),
            k["requests"].as_u64().unwrap_or(0),
            outcomes,
            ms(&k["median_ms"]),
            ms(&k["median_first_piece_ms"])
        );
    }
    println!(
        "/v1/cancel calls: {}, of which cancelled a generation: {}",
        j["cancel_calls"], j["cancel_calls_that_cancelled"]
    );
    if let Some(n) = j["node_restart"].as_object() {
        println!("node restart: {}", Value::Object(n.clone()));
    }
    println!("metrics:");
    for (name, v) in j["metrics"].as_object().into_iter().flatten() {
        println!("  {name} {v}");
    }
    println!("anonymous memory (KiB) every tenth of the load:");
    for name in ["head", "laptop", "tablet"] {
        let row: Vec<String> = j["timeline"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                t[name]["rss_anon_kib"]
                    .as_u64()
                    .map_or("-".into(), |v| v.to_string())
            })
            .collect();
        println!("  {name:<8} {}", row.join(" "));
    }
    println!(
        "{:<8} {:>22} {:>22} {:>10} {:>10}",
        "process", "RSS KiB start→end", "anon KiB start→end", "threads", "fds"
    );
    for p in j["processes"].as_array().into_iter().flatten() {
        let (s, e) = (&p["start"], &p["end"]);
        println!(
            "{:<8} {:>22} {:>22} {:>10} {:>10}",
            p["process"].as_str().unwrap_or_default(),
            format!("{}→{}", s["rss_kib"], e["rss_kib"]),
            format!("{}→{}", s["rss_anon_kib"], e["rss_anon_kib"]),
            format!("{}→{}", s["threads"], e["threads"]),
            format!("{}→{}", s["fds"], e["fds"]),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_plan_and_a_thousand_requests_draw_every_kind() {
        let a = load::plan(1000, 24, 18);
        let b = load::plan(1000, 24, 18);
        let kinds = |p: &[Plan]| p.iter().map(|p| (p.kind, p.max_tokens)).collect::<Vec<_>>();
        assert_eq!(kinds(&a), kinds(&b));
        assert!(a.iter().all(|p| (1..=24).contains(&p.max_tokens)));
        let drawn: std::collections::BTreeSet<Kind> = a.iter().map(|p| p.kind).collect();
        assert_eq!(drawn.len(), 13, "{drawn:?}");
    }

    fn record(kind: Kind, outcome: Outcome, started: Instant, ms: u64) -> Record {
        Record {
            index: 0,
            kind,
            outcome,
            started,
            ended: started + Duration::from_millis(ms),
            first_piece: None,
            cancel_hit: None,
        }
    }

    #[test]
    fn a_cancelled_generation_is_expected_only_while_a_cancel_call_was_in_flight() {
        let t = Instant::now();
        let cancels = [(
            t + Duration::from_millis(100),
            t + Duration::from_millis(200),
        )];
        let during = record(Kind::Whole, Outcome::Cancelled, t, 150);
        let before = record(Kind::Whole, Outcome::Cancelled, t, 50);
        assert!(judge(&during, &cancels).is_ok());
        assert!(judge(&before, &cancels).is_err());
        // A malformed request must be refused, a generation must not be.
        assert!(judge(&record(Kind::BadJson, Outcome::Ok, t, 1), &[]).is_err());
        assert!(judge(&record(Kind::BadJson, Outcome::Refused(400), t, 1), &[]).is_ok());
        assert!(judge(&record(Kind::Stream, Outcome::Refused(400), t, 1), &[]).is_err());
        assert!(judge(&record(Kind::Stream, Outcome::Disconnected, t, 1), &[]).is_err());
        assert!(judge(&record(Kind::Disconnect, Outcome::Disconnected, t, 1), &[]).is_ok());
    }
}

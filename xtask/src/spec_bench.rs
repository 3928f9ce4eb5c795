//! `cargo xtask spec-bench`: speculative decoding's figures (issue 19) on this machine.
//!
//! A 3-device loopback ring (the head and two `prima node`s, 10 layers each) whose three
//! data hops — head → node 1 → node 2 → head — each go through a forwarder here that adds
//! a fixed one-way latency (netem does not work on every machine; this is user space, as
//! the home lab's link router is). `prima run --ring` generates greedily from the same
//! prompt with and without `--draft`, alternating, and on one device without added
//! latency likewise; the report gives median TPOT, the draft's acceptance, and whether
//! the text with the draft is the text without it.
//!
//! Target: SmolLM2-135M converted to F16 (`cargo xtask test-models`); draft: the fetched
//! SmolLM2-135M Q4_1 — the same vocabulary.
//!
//! With `--concurrency 2,4`, also that many requests at once with and without the draft,
//! as the server serves them (`serving.rs`): aggregate tok/s and acceptance, on the same
//! ring and on one device.

mod serving;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::layout::Layout;

#[derive(clap::Args, Debug)]
pub struct SpecBenchArgs {
    /// Runs per configuration (medians are reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// One-way latency added to each hop of the ring, in milliseconds.
    #[arg(long, default_value_t = 5.0)]
    latency_ms: f64,
    /// Tokens generated per run.
    #[arg(short = 'n', long, default_value_t = 64)]
    n_predict: usize,
    /// Tokens drafted per round at most (`prima run --draft-max`).
    #[arg(long, default_value_t = 8)]
    draft_max: usize,
    /// `prima run --draft-p-min`.
    #[arg(long, default_value_t = 0.2)]
    draft_p_min: f32,
    /// Threads of every process.
    #[arg(short = 't', long, default_value_t = 1)]
    threads: u32,
    /// Target model (default: SmolLM2-135M F16 from `cargo xtask test-models`).
    #[arg(long)]
    target: Option<PathBuf>,
    /// Draft model (default: the fetched SmolLM2-135M Q4_1).
    #[arg(long)]
    draft: Option<PathBuf>,
    /// Concurrent requests to serve with and without the draft (each its own slot; every
    /// slot drafts); empty: none.
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    concurrency: Vec<usize>,
    /// Where to write the JSON report.
    #[arg(long, default_value = "target/spec-bench.json")]
    json: PathBuf,
}

const PROMPT: &str = "The history of the printing press begins in the fifteenth century, when";

pub fn run(layout: &Layout, args: &SpecBenchArgs) -> Result<()> {
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| layout.workspace.join("target"));
    let prima = target_dir.join("release").join("prima");
    if !prima.exists() {
        bail!(
            "{} is missing (cargo build --release --workspace)",
            prima.display()
        );
    }
    let target = args
        .target
        .clone()
        .unwrap_or_else(|| layout.derived_models.join("smollm2-135m-f16.gguf"));
    let draft = args.draft.clone().unwrap_or_else(|| {
        layout
            .workspace
            .join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    for m in [&target, &draft] {
        if !m.exists() {
            bail!(
                "{} is missing (cargo xtask fetch-models, test-models)",
                m.display()
            );
        }
    }
    let delay = Duration::from_secs_f64(args.latency_ms / 1e3);

    let nodes = [
        NodeProcess::start(&prima, &target, args.threads)?,
        NodeProcess::start(&prima, &target, args.threads)?,
    ];
    // The head's data listener, and a forwarder to each device: the head reaches node m
    // through forwarder m, so node 1's next hop (node 2, as the head reaches it) is
    // delayed too; node 2 reaches the head through forwarder 0.
    let head_port = free_port()?;
    let head_addr = format!("127.0.0.1:{head_port}");
    let to_node1 = DelayForwarder::start(&nodes[0].addr, delay)?;
    let to_node2 = DelayForwarder::start(&nodes[1].addr, delay)?;
    let to_head = DelayForwarder::start(&head_addr, delay)?;
    let ring = [
        "--ring".to_string(),
        format!("{to_node1},{to_node2}"),
        "--windows".into(),
        "10,10,10".into(),
        "--listen".into(),
        head_addr.clone(),
        // `=`: a value that starts with `-`.
        format!("--next-hop=-,{to_head}"),
        "--insecure".into(),
    ];
    let draft_flags = [
        "--draft".to_string(),
        draft.display().to_string(),
        "--draft-max".into(),
        args.draft_max.to_string(),
        "--draft-p-min".into(),
        args.draft_p_min.to_string(),
    ];

    let configs: [(&str, &[String], bool); 4] = [
        ("ring", &ring, false),
        ("ring + draft", &ring, true),
        ("one device", &[], false),
        ("one device + draft", &[], true),
    ];
    let mut runs: Vec<Vec<RunResult>> = vec![Vec::new(); configs.len()];
    for rep in 0..args.reps {
        for (i, (name, extra, with_draft)) in configs.iter().enumerate() {
            let mut cmd = Command::new(&prima);
            cmd.arg("run")
                .arg("-m")
                .arg(&target)
                .args(["-p", PROMPT, "--temp", "0", "--ignore-eos"])
                .args(["-n", &args.n_predict.to_string()])
                .args(["-t", &args.threads.to_string()])
                .args(extra.iter());
            if *with_draft {
                cmd.args(draft_flags.iter());
            }
            let r = RunResult::of(&mut cmd).with_context(|| format!("{name}, run {rep}"))?;
            eprintln!(
                "{name:<20} run {rep}: TPOT {:.2} ms{}",
                r.tpot_ms,
                r.acceptance
                    .map(|a| format!(", acceptance {:.1}%", a * 100.0))
                    .unwrap_or_default()
            );
            runs[i].push(r);
        }
    }
    let served = serve_concurrently(
        args,
        &target,
        &draft,
        &prima,
        &serving::RingAddrs {
            nodes: [to_node1.clone(), to_node2.clone()],
            head_listen: head_addr.clone(),
            to_head: to_head.clone(),
        },
    )?;
    drop(nodes);

    let mut report = Vec::new();
    println!(
        "\nspeculative decoding: target {}, draft {}, {} tokens greedy, {} runs each (medians), -t {}, draft-max {}, p-min {}",
        file_name(&target),
        file_name(&draft),
        args.n_predict,
        args.reps,
        args.threads,
        args.draft_max,
        args.draft_p_min
    );
    println!(
        "ring: 3 devices on loopback, {} ms added per hop\n",
        args.latency_ms
    );
    println!(
        "| configuration | TPOT ms | tok/s | acceptance | target evals | text = without draft |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | --- |");
    for (i, (name, _, with_draft)) in configs.iter().enumerate() {
        let tpot = median(runs[i].iter().map(|r| r.tpot_ms).collect());
        let baseline = &runs[i - usize::from(*with_draft)];
        let same = runs[i].iter().all(|r| r.text == baseline[0].text);
        let acceptance = runs[i].iter().filter_map(|r| r.acceptance).next();
        let evals = runs[i].iter().filter_map(|r| r.target_evals).next();
        println!(
            "| {name} | {tpot:.2} | {:.1} | {} | {} | {} |",
            1e3 / tpot,
            acceptance.map_or("—".into(), |a| format!("{:.1}%", a * 100.0)),
            evals.map_or("—".into(), |e| e.to_string()),
            if *with_draft {
                if same {
                    "identical"
                } else {
                    "DIFFERS"
                }
            } else {
                "—"
            }
        );
        report.push(serde_json::json!({
            "configuration": name,
            "tpot_ms_median": tpot,
            "tpot_ms": runs[i].iter().map(|r| r.tpot_ms).collect::<Vec<_>>(),
            "acceptance": acceptance,
            "target_evals": evals,
            "text_identical": same,
        }));
    }
    // Each repetition runs both configurations back to back, so the ratio within a
    // repetition is the fairest on a loaded machine; the median of those too.
    let speedup = |plain: usize, drafted: usize| {
        median(runs[plain].iter().map(|r| r.tpot_ms).collect())
            / median(runs[drafted].iter().map(|r| r.tpot_ms).collect())
    };
    let paired = |plain: usize, drafted: usize| {
        median(
            runs[plain]
                .iter()
                .zip(&runs[drafted])
                .map(|(p, d)| p.tpot_ms / d.tpot_ms)
                .collect(),
        )
    };
    println!(
        "\nTPOT without / with draft (ratio of medians; median of per-repetition ratios): ring {:.2}× ({:.2}×), one device {:.2}× ({:.2}×)",
        speedup(0, 1),
        paired(0, 1),
        speedup(2, 3),
        paired(2, 3)
    );
    let concurrent = report_concurrency(args, &served);
    let json = layout.workspace.join(&args.json);
    if let Some(dir) = json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(
        &json,
        serde_json::to_vec_pretty(&serde_json::json!({
            "latency_ms": args.latency_ms,
            "n_predict": args.n_predict,
            "threads": args.threads,
            "draft_max": args.draft_max,
            "draft_p_min": args.draft_p_min,
            "target": target,
            "draft": draft,
            "configurations": report,
            "concurrent": concurrent,
        }))?,
    )?;
    println!("report    {}", json.display());
    Ok(())
}

/// The serving configurations, in the order they run within a repetition.
const SERVED: [(&str, bool, bool); 4] = [
    ("ring", true, false),
    ("ring + draft", true, true),
    ("one device", false, false),
    ("one device + draft", false, true),
];

/// Every `--concurrency` count's [`SERVED`] configurations, each repetition running them
/// all back to back: `runs[c][config][rep]`.
fn serve_concurrently(
    args: &SpecBenchArgs,
    target: &Path,
    draft: &Path,
    prima: &Path,
    ring: &serving::RingAddrs,
) -> Result<Vec<Vec<Vec<serving::Served>>>> {
    if args.concurrency.is_empty() {
        return Ok(Vec::new());
    }
    let plugins = prima.parent().context("prima's directory")?;
    let bench = serving::Bench::open(target, draft, plugins, args.threads)?;
    let options = prima_core::speculative::DraftOptions {
        max: args.draft_max,
        p_min: args.draft_p_min,
    };
    let mut runs = Vec::new();
    for &c in &args.concurrency {
        let mut per_config: Vec<Vec<serving::Served>> =
            (0..SERVED.len()).map(|_| Vec::new()).collect();
        for rep in 0..args.reps {
            for (i, &(name, on_ring, with_draft)) in SERVED.iter().enumerate() {
                let served = bench
                    .serve(
                        c,
                        args.n_predict,
                        on_ring.then_some(ring),
                        with_draft.then_some(options),
                    )
                    .with_context(|| format!("{c} requests, {name}, run {rep}"))?;
                eprintln!(
                    "{c} requests, {name:<20} run {rep}: {:.1} tok/s{}",
                    served.tok_s(),
                    if with_draft {
                        format!(
                            ", acceptance {:.1}%",
                            100.0 * served.accepted as f64 / served.drafted.max(1) as f64
                        )
                    } else {
                        String::new()
                    }
                );
                per_config[i].push(served);
            }
        }
        runs.push(per_config);
    }
    Ok(runs)
}

/// Prints the concurrent runs' table and returns it as JSON.
fn report_concurrency(
    args: &SpecBenchArgs,
    runs: &[Vec<Vec<serving::Served>>],
) -> Vec<serde_json::Value> {
    if runs.is_empty() {
        return Vec::new();
    }
    println!(
        "
concurrent requests (each its own slot; with the draft every slot drafts and one batch verifies all), {} tokens each, medians of {}",
        args.n_predict, args.reps
    );
    println!("| requests | configuration | aggregate tok/s | × without draft (per-repetition median) | acceptance | text = without draft |");
    println!("| ---: | --- | ---: | ---: | ---: | --- |");
    let mut json = Vec::new();
    for (&c, per_config) in args.concurrency.iter().zip(runs) {
        for (i, &(name, _, with_draft)) in SERVED.iter().enumerate() {
            let runs = &per_config[i];
            let tok_s = median(runs.iter().map(serving::Served::tok_s).collect());
            let (ratio, same, acceptance) = if with_draft {
                let plain = &per_config[i - 1];
                let ratio = median(
                    runs.iter()
                        .zip(plain)
                        .map(|(d, p)| d.tok_s() / p.tok_s())
                        .collect(),
                );
                let same = runs.iter().all(|r| r.texts == plain[0].texts);
                let (a, d) = runs
                    .iter()
                    .fold((0, 0), |(a, d), r| (a + r.accepted, d + r.drafted));
                (Some(ratio), Some(same), Some(a as f64 / d.max(1) as f64))
            } else {
                (None, None, None)
            };
            println!(
                "| {c} | {name} | {tok_s:.1} | {} | {} | {} |",
                ratio.map_or("—".into(), |r| format!("{r:.2}×")),
                acceptance.map_or("—".into(), |a| format!("{:.1}%", a * 100.0)),
                match same {
                    Some(true) => "identical",
                    Some(false) => "DIFFERS",
                    None => "—",
                }
            );
            json.push(serde_json::json!({
                "requests": c,
                "configuration": name,
                "tok_s_median": tok_s,
                "tok_s": runs.iter().map(serving::Served::tok_s).collect::<Vec<_>>(),
                "ratio_to_without_draft": ratio,
                "acceptance": acceptance,
                "text_identical": same,
            }));
        }
    }
    json
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A port free now on loopback (bound, then released).
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// What one `prima run` printed.
#[derive(Debug, Clone)]
struct RunResult {
    text: String,
    tpot_ms: f64,
    acceptance: Option<f64>,
    target_evals: Option<usize>,
}

impl RunResult {
    fn of(cmd: &mut Command) -> Result<RunResult> {
        let out = cmd.output().context("cannot run prima")?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            bail!("prima run failed: {stderr}");
        }
        let number_after = |key: &str| -> Option<f64> {
            let rest = &stderr[stderr.find(key)? + key.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(rest.len());
            rest[..end].parse().ok()
        };
        let tpot_ms = number_after("TPOT ").context("no TPOT in prima's output")?;
        // "draft: accepted A/D drafted tokens (…) | E target evaluations"
        let acceptance = number_after("draft: accepted ").and_then(|a| {
            let drafted = number_after(&format!("draft: accepted {a}/"))?;
            Some(a / drafted.max(1.0))
        });
        let target_evals = stderr.find(" target evaluations").and_then(|end| {
            let start = stderr[..end].rfind("| ")? + 2;
            stderr[start..end].trim().parse().ok()
        });
        Ok(RunResult {
            text: String::from_utf8_lossy(&out.stdout).into_owned(),
            tpot_ms,
            acceptance,
            target_evals,
        })
    }
}

/// A `prima node` on a free loopback port, killed when dropped.
struct NodeProcess {
    child: Child,
    addr: String,
}

impl NodeProcess {
    fn start(prima: &Path, model: &Path, threads: u32) -> Result<NodeProcess> {
        let mut child = Command::new(prima)
            .args(["node", "--listen", "127.0.0.1:0", "--insecure"])
            .args(["-t", &threads.to_string(), "-m"])
            .arg(model)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot start prima node")?;
        let stderr = child.stderr.take().context("no stderr")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("node: listening on ") {
                    let _ = tx.send(rest.split(' ').next().unwrap_or_default().to_string());
                }
            }
        });
        let mut node = NodeProcess {
            child,
            addr: String::new(),
        };
        node.addr = rx
            .recv_timeout(Duration::from_secs(30))
            .context("the node did not print its address")?;
        Ok(node)
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Accepts on a loopback port and forwards each connection to `to`, every byte in each
/// direction delivered `delay` after it was read: a link with that one-way latency and
/// no bandwidth limit beyond loopback's.
struct DelayForwarder;

impl DelayForwarder {
    /// Starts forwarding on a thread of its own (for the life of the process); returns
    /// the address to connect to.
    fn start(to: &str, delay: Duration) -> Result<String> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?.to_string();
        let to = to.to_string();
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let Ok(server) = TcpStream::connect(&to) else {
                    continue;
                };
                for s in [&client, &server] {
                    let _ = s.set_nodelay(true);
                }
                let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                pipe(client, server, delay);
                pipe(server2, client2, delay);
            }
        });
        Ok(addr)
    }
}

/// Copies `from` to `to`, each chunk written `delay` after it was read (a reader thread
/// stamps chunks, a writer thread waits for each one's time): the delay does not
/// throttle a stream, it shifts it.
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        for (due, chunk) in rx {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

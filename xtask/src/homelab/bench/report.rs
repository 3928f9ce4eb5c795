//! The bench's results as data (serialized to JSON as they are) and as Markdown tables,
//! one per model and experiment, each experiment with the columns it is about.

use serde::Serialize;

use super::rows::Experiment;

/// One row of a table: one configuration, measured once.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RowResult {
    /// The row's key (`llama-alone`, `halda`, `k2-no-release`, `halda-5ms`, …).
    pub row: String,
    pub what: String,
    /// The program whose output the timing figures were read from.
    pub timed_by: String,
    /// The devices it ran on (the head first).
    pub devices: Vec<String>,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    /// Halda's (or the baseline scheduler's) predicted TPOT, from the printed plan; for a
    /// pinned plan, Halda's figure for the plan it pinned.
    pub predicted_tpot_ms: Option<f64>,
    /// Halda's latency model evaluated by the bench for the plan this row ran (a pinned
    /// plan at another k; the links experiment: with the bed's links, which live profiles
    /// do not measure). A prediction, never a measurement.
    pub model_tpot_ms: Option<f64>,
    /// Tokens generated: as reported, or re-tokenized from the text of a cut-off run.
    pub generated: Option<usize>,
    pub status: Status,
    /// Rounds per token of the plan the ring ran, as printed (ring rows only).
    pub k: Option<usize>,
    /// w_m per device in the plan the ring ran (ring rows only).
    pub windows: Vec<(String, usize)>,
    /// Layers per device in the plan the ring ran (ring rows only).
    pub plan: Vec<(String, usize)>,
    /// The ring's own per-device figures per generated token (`prima apply -v`).
    pub ring: Vec<RingDevice>,
    /// The links experiment: every device's one-way link latency and upload rate.
    pub latency_ms: Option<f64>,
    pub link_mbit: Option<f64>,
    pub memory: Vec<DeviceMemory>,
    pub wall_s: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "detail")]
pub enum Status {
    #[default]
    Ok,
    /// Killed at the row timeout; `generated` counts what it printed by then.
    TimedOut,
    /// Exited with an error; the last line of its stderr.
    Failed(String),
    /// Not run (the row could not be set up); why.
    Skipped(String),
}

/// A device's memory cgroup over one row.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceMemory {
    pub device: String,
    /// memory.max_usage_in_bytes (page cache included), reset before the row.
    pub peak_bytes: u64,
    pub limit_bytes: u64,
    /// OOM kills in the device's cgroup during the row (memory.oom_control's oom_kill).
    pub oom_kills: u64,
}

/// One ring device's means per generated token, as the ring measured them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RingDevice {
    pub device: String,
    pub tokens: usize,
    pub compute_ms: f64,
    pub send_ms: f64,
    pub wait_ms: f64,
    pub major_faults_per_token: f64,
    /// MB (10^6 bytes) read from storage per token (/proc/self/io).
    pub disk_mb_per_token: f64,
    /// The ring's own peak memory pressure on the device, percent.
    pub memory_pressure_pct: f64,
}

/// One table: one model on one bed (the links experiment: one bed per latency).
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    pub experiment: Experiment,
    pub testbed: String,
    pub model: String,
    pub model_bytes: u64,
    pub tokens: usize,
    pub prompt: String,
    /// The paper experiment: the device the single-device rows ran on, and why.
    pub best_device: Option<String>,
    pub best_device_rule: Option<String>,
    /// What the table's rows share (the plan they pin, the links), as sentences.
    pub notes: Vec<String>,
    pub rows: Vec<RowResult>,
}

/// The preamble of an experiment's Markdown file.
pub fn preamble(experiment: Experiment) -> &'static str {
    match experiment {
        Experiment::Paper => {
            "TTFT/TPOT as printed by the tool named in \"timed by\" (prima: its summary \
             line; llama.cpp: llama_perf_context_print's prompt eval and eval times); \
             \"predicted\" is the plan's own figure. Peak memory is the cgroup's \
             memory.max_usage_in_bytes (page cache included) over the row."
        }
        Experiment::Rounds => {
            "PRP rounds: Halda's windows pinned (`scheduler = \"manual\"`) and cut into k \
             rounds, each with MRU release and without. TTFT/TPOT from `prima apply`'s \
             summary line; disk MB and major faults per generated token from its `-v` \
             device table (/proc/self/io read_bytes and major faults of each device's \
             process); \"Halda's model\" is the bench evaluating Halda's latency model for \
             the ring that ran (the row's windows, the head always in the ring, the bed's \
             links added; it assumes prefetch and release) — a prediction. Peak memory is \
             the cgroup's memory.max_usage_in_bytes over the row."
        }
        Experiment::Links => {
            "Links: the bed brought up once per latency, every device's link at that one-way \
             latency (a hop between two devices waits for both) and upload rate; the ring \
             planned by Halda. TTFT/TPOT from `prima apply`'s summary line; \"predicted\" is \
             the plan's own figure (live profiles measure no link, so it has no link \
             term); \"Halda's model with these links\" is the bench evaluating the same \
             model for the ring that ran (the head always in it) with the bed's links \
             added — a prediction."
        }
    }
}

pub fn markdown(tables: &[Table]) -> String {
    let mut s = String::new();
    for t in tables {
        s += &format!(
            "### {} on {} ({:.2} GB), {} tokens from \"{}\"\n\n",
            t.model,
            t.testbed,
            t.model_bytes as f64 / 1e9,
            t.tokens,
            t.prompt
        );
        if let (Some(best), Some(rule)) = (&t.best_device, &t.best_device_rule) {
            s += &format!("Best single device: {best} ({rule}).\n\n");
        }
        for note in &t.notes {
            s += &format!("{note}\n\n");
        }
        let columns: &[(&str, &str)] = match t.experiment {
            Experiment::Paper => &[
                ("row", "---"),
                ("timed by", "---"),
                ("TTFT ms", "---:"),
                ("TPOT ms", "---:"),
                ("predicted TPOT ms", "---:"),
                ("tokens", "---:"),
                ("status", "---"),
                ("layers per device", "---"),
                ("peak memory / limit, MB (OOM kills)", "---"),
                ("memory pressure (the ring's own)", "---"),
                ("wall s", "---:"),
            ],
            Experiment::Rounds => &[
                ("row", "---"),
                ("k", "---:"),
                ("windows per device", "---"),
                ("TTFT ms", "---:"),
                ("TPOT ms", "---:"),
                ("Halda's model, TPOT ms", "---:"),
                ("disk MB read per token", "---"),
                ("major faults per token", "---"),
                ("tokens", "---:"),
                ("status", "---"),
                ("peak memory / limit, MB (OOM kills)", "---"),
                ("wall s", "---:"),
            ],
            Experiment::Links => &[
                ("row", "---"),
                ("one-way latency per link, ms", "---:"),
                ("TTFT ms", "---:"),
                ("TPOT ms", "---:"),
                ("predicted TPOT ms", "---:"),
                ("Halda's model with these links, TPOT ms", "---:"),
                ("layers per device", "---"),
                ("tokens", "---:"),
                ("status", "---"),
                ("peak memory / limit, MB (OOM kills)", "---"),
                ("wall s", "---:"),
            ],
        };
        s += &format!(
            "| {} |\n| {} |\n",
            columns.iter().map(|c| c.0).collect::<Vec<_>>().join(" | "),
            columns.iter().map(|c| c.1).collect::<Vec<_>>().join(" | ")
        );
        for r in &t.rows {
            let cells: Vec<String> = match t.experiment {
                Experiment::Paper => vec![
                    format!("{} — {}", r.row, r.what),
                    r.timed_by.clone(),
                    num(r.ttft_ms),
                    num(r.tpot_ms),
                    predicted(r),
                    tokens(r),
                    status(r),
                    per_device(&r.plan, |n| n.to_string()),
                    memory(r),
                    ring_cells(r, |d| format!("{:.1}%", d.memory_pressure_pct)),
                    format!("{:.0}", r.wall_s),
                ],
                Experiment::Rounds => vec![
                    format!("{} — {}", r.row, r.what),
                    r.k.map(|k| k.to_string()).unwrap_or_else(|| "–".into()),
                    per_device(&r.windows, |w| w.to_string()),
                    num(r.ttft_ms),
                    num(r.tpot_ms),
                    num(r.model_tpot_ms),
                    ring_cells(r, |d| format!("{:.2}", d.disk_mb_per_token)),
                    ring_cells(r, |d| format!("{:.0}", d.major_faults_per_token)),
                    tokens(r),
                    status(r),
                    memory(r),
                    format!("{:.0}", r.wall_s),
                ],
                Experiment::Links => vec![
                    format!("{} — {}", r.row, r.what),
                    num(r.latency_ms),
                    num(r.ttft_ms),
                    num(r.tpot_ms),
                    predicted(r),
                    num(r.model_tpot_ms),
                    per_device(&r.plan, |n| n.to_string()),
                    tokens(r),
                    status(r),
                    memory(r),
                    format!("{:.0}", r.wall_s),
                ],
            };
            s += &format!("| {} |\n", cells.join(" | "));
        }
        s += "\n";
    }
    s
}

fn predicted(r: &RowResult) -> String {
    match (r.predicted_tpot_ms, r.plan.is_empty()) {
        (Some(v), _) => format!("{v:.1}"),
        (None, true) => "–".into(),
        (None, false) => "not printed".into(),
    }
}

fn tokens(r: &RowResult) -> String {
    r.generated
        .map(|n| n.to_string())
        .unwrap_or_else(|| "–".into())
}

fn status(r: &RowResult) -> String {
    match &r.status {
        Status::Ok => "ok".to_string(),
        Status::TimedOut => "timed out".to_string(),
        Status::Failed(why) => format!("failed: {}", cell(why)),
        Status::Skipped(why) => format!("skipped: {}", cell(why)),
    }
}

/// `d1 6, d3 10`, or `–` when empty.
fn per_device<T>(items: &[(String, T)], show: impl Fn(&T) -> String) -> String {
    if items.is_empty() {
        return "–".into();
    }
    items
        .iter()
        .map(|(d, v)| format!("{d} {}", show(v)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn ring_cells(r: &RowResult, show: impl Fn(&RingDevice) -> String) -> String {
    if r.ring.is_empty() {
        return "–".into();
    }
    r.ring
        .iter()
        .map(|d| format!("{} {}", d.device, show(d)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn memory(r: &RowResult) -> String {
    r.memory
        .iter()
        .map(|m| {
            let oom = if m.oom_kills > 0 {
                format!(" (**{} OOM**)", m.oom_kills)
            } else {
                String::new()
            };
            format!(
                "{} {}/{}{oom}",
                m.device,
                m.peak_bytes >> 20,
                m.limit_bytes >> 20
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn num(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.1}")).unwrap_or_else(|| "–".into())
}

/// Text that cannot break a table row.
fn cell(text: &str) -> String {
    let one_line = text.lines().next().unwrap_or("").replace('|', "/");
    match one_line.char_indices().nth(120) {
        Some((i, _)) => format!("{}…", &one_line[..i]),
        None => one_line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, status: Status) -> RowResult {
        RowResult {
            row: name.into(),
            what: "Halda ring".into(),
            timed_by: "prima apply".into(),
            devices: vec!["d1".into(), "d3".into()],
            ttft_ms: Some(406.14),
            tpot_ms: Some(98.76),
            generated: Some(8),
            status,
            plan: vec![("d1".into(), 6), ("d3".into(), 10)],
            memory: vec![DeviceMemory {
                device: "d1".into(),
                peak_bytes: 300 << 20,
                limit_bytes: 430 << 20,
                oom_kills: 1,
            }],
            wall_s: 12.4,
            ..RowResult::default()
        }
    }

    fn table(experiment: Experiment, rows: Vec<RowResult>) -> Table {
        Table {
            experiment,
            testbed: "d1-d4".into(),
            model: "m.gguf".into(),
            model_bytes: 800_000_000,
            tokens: 8,
            prompt: "Hi".into(),
            best_device: (experiment == Experiment::Paper).then(|| "d3".into()),
            best_device_rule: (experiment == Experiment::Paper).then(|| "most memory".into()),
            notes: vec!["Halda's plan: k = 1.".into()],
            rows,
        }
    }

    /// The table lines of `md`: header, rule, then one per row, all with as many columns.
    fn table_lines(md: &str) -> Vec<&str> {
        let lines: Vec<&str> = md.lines().filter(|l| l.starts_with("| ")).collect();
        let cols = |l: &str| l.matches(" | ").count();
        assert!(lines.iter().all(|l| cols(l) == cols(lines[0])), "{md}");
        lines
    }

    #[test]
    fn renders_one_line_per_row_and_marks_what_is_missing() {
        let t = table(
            Experiment::Paper,
            vec![
                row("halda", Status::Ok),
                row("mem", Status::Failed("error: a | b\nmore".into())),
                row("perf", Status::TimedOut),
            ],
        );
        let md = markdown(std::slice::from_ref(&t));
        assert!(md.contains("Best single device: d3 (most memory)."));
        assert!(md.contains("Halda's plan: k = 1."));
        let lines = table_lines(&md);
        assert_eq!(lines.len(), 5, "{md}"); // header, rule, 3 rows
        assert!(lines[2].contains("| 406.1 | 98.8 | not printed | 8 | ok | d1 6, d3 10 |"));
        assert!(lines[2].contains("d1 300/430 (**1 OOM**)"));
        assert!(lines[3].contains("failed: error: a / b |"), "{}", lines[3]);
        assert!(lines[4].contains("timed out"));

        let json = serde_json::to_value([t]).unwrap();
        assert_eq!(json[0]["experiment"], "paper");
        assert_eq!(json[0]["rows"][1]["status"]["kind"], "failed");
        assert_eq!(json[0]["rows"][0]["memory"][0]["oom_kills"], 1);
    }

    #[test]
    fn the_rounds_table_shows_k_windows_and_disk_reads_per_device() {
        let mut r = row("k2-no-release", Status::Ok);
        r.k = Some(2);
        r.windows = vec![("c1".into(), 4), ("c2".into(), 4)];
        r.model_tpot_ms = Some(250.04);
        r.ring = vec![
            RingDevice {
                device: "c1".into(),
                tokens: 7,
                compute_ms: 10.0,
                send_ms: 0.1,
                wait_ms: 40.0,
                major_faults_per_token: 12.4,
                disk_mb_per_token: 0.051,
                memory_pressure_pct: 3.0,
            },
            RingDevice {
                device: "c2".into(),
                tokens: 7,
                compute_ms: 10.0,
                send_ms: 0.1,
                wait_ms: 40.0,
                major_faults_per_token: 301.0,
                disk_mb_per_token: 14.567,
                memory_pressure_pct: 12.0,
            },
        ];
        let mut failed = row("k4", Status::Skipped("no plan".into()));
        failed.plan.clear();
        failed.ttft_ms = None;
        let md = markdown(&[table(Experiment::Rounds, vec![r, failed])]);
        let lines = table_lines(&md);
        assert!(
            lines[0].contains("| k | windows per device |"),
            "{}",
            lines[0]
        );
        assert!(
            lines[2].contains(
                "| 2 | c1 4, c2 4 | 406.1 | 98.8 | 250.0 | c1 0.05, c2 14.57 | c1 12, c2 301 |"
            ),
            "{}",
            lines[2]
        );
        assert!(
            lines[3].contains("| – | – | – | 98.8 | – | – | – |"),
            "{}",
            lines[3]
        );
        assert!(lines[3].contains("skipped: no plan"));
    }

    #[test]
    fn the_links_table_shows_the_latency_and_both_predictions() {
        let mut r = row("halda-5ms", Status::Ok);
        r.latency_ms = Some(5.0);
        r.link_mbit = Some(300.0);
        r.predicted_tpot_ms = Some(120.0);
        r.model_tpot_ms = Some(160.0);
        let md = markdown(&[table(Experiment::Links, vec![r])]);
        let lines = table_lines(&md);
        assert!(
            lines[2].contains("| 5.0 | 406.1 | 98.8 | 120.0 | 160.0 | d1 6, d3 10 | 8 | ok |"),
            "{}",
            lines[2]
        );
        assert!(!md.contains("Best single device"));
        let json = serde_json::to_value(table(Experiment::Links, vec![])).unwrap();
        assert_eq!(json["experiment"], "links");
    }
}

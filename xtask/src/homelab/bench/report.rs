//! The bench's results as data (serialized to JSON as they are) and as Markdown tables,
//! one per model.

use serde::Serialize;

/// One row of a table: one configuration, measured once.
#[derive(Debug, Clone, Serialize)]
pub struct RowResult {
    /// The row's key (`llama-alone`, `halda`, …).
    pub row: String,
    pub what: String,
    /// The program whose output the timing figures were read from.
    pub timed_by: String,
    /// The devices it ran on (the head first).
    pub devices: Vec<String>,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    /// Halda's (or the baseline scheduler's) predicted TPOT, from the printed plan.
    pub predicted_tpot_ms: Option<f64>,
    /// Tokens generated: as reported, or re-tokenized from the text of a cut-off run.
    pub generated: Option<usize>,
    pub status: Status,
    /// Layers per device in the plan the ring ran (ring rows only).
    pub plan: Vec<(String, usize)>,
    pub memory: Vec<DeviceMemory>,
    pub wall_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "detail")]
pub enum Status {
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

/// One model's table.
#[derive(Debug, Clone, Serialize)]
pub struct ModelTable {
    pub testbed: String,
    pub model: String,
    pub model_bytes: u64,
    pub tokens: usize,
    pub prompt: String,
    pub best_device: String,
    pub best_device_rule: String,
    pub rows: Vec<RowResult>,
}

pub fn markdown(tables: &[ModelTable]) -> String {
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
        s += &format!(
            "Best single device: {} ({}).\n\n",
            t.best_device, t.best_device_rule
        );
        s += "| row | timed by | TTFT ms | TPOT ms | predicted TPOT ms | tokens | status | layers per device | peak memory / limit, MB (OOM kills) | wall s |\n";
        s += "| --- | --- | ---: | ---: | ---: | ---: | --- | --- | --- | ---: |\n";
        for r in &t.rows {
            let status = match &r.status {
                Status::Ok => "ok".to_string(),
                Status::TimedOut => "timed out".to_string(),
                Status::Failed(why) => format!("failed: {}", cell(why)),
                Status::Skipped(why) => format!("skipped: {}", cell(why)),
            };
            let plan = r
                .plan
                .iter()
                .map(|(d, n)| format!("{d} {n}"))
                .collect::<Vec<_>>()
                .join(", ");
            let memory = r
                .memory
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
                .join(", ");
            s += &format!(
                "| {} — {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} |\n",
                r.row,
                r.what,
                r.timed_by,
                num(r.ttft_ms),
                num(r.tpot_ms),
                match (r.predicted_tpot_ms, r.plan.is_empty()) {
                    (Some(v), _) => format!("{v:.1}"),
                    (None, true) => "–".into(),
                    (None, false) => "not printed".into(),
                },
                r.generated
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "–".into()),
                status,
                if plan.is_empty() { "–".into() } else { plan },
                memory,
                r.wall_s,
            );
        }
        s += "\n";
    }
    s
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
            predicted_tpot_ms: None,
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
        }
    }

    #[test]
    fn renders_one_line_per_row_and_marks_what_is_missing() {
        let t = ModelTable {
            testbed: "d1-d4".into(),
            model: "m.gguf".into(),
            model_bytes: 800_000_000,
            tokens: 8,
            prompt: "Hi".into(),
            best_device: "d3".into(),
            best_device_rule: "most memory".into(),
            rows: vec![
                row("halda", Status::Ok),
                row("mem", Status::Failed("error: a | b\nmore".into())),
                row("perf", Status::TimedOut),
            ],
        };
        let md = markdown(std::slice::from_ref(&t));
        let lines: Vec<&str> = md.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(lines.len(), 5, "{md}"); // header, rule, 3 rows
        assert!(lines[2].contains("| 406.1 | 98.8 | not printed | 8 | ok | d1 6, d3 10 |"));
        assert!(lines[2].contains("d1 300/430 (**1 OOM**)"));
        assert!(lines[3].contains("failed: error: a / b |"), "{}", lines[3]);
        assert!(lines[4].contains("timed out"));
        let cols = |l: &str| l.matches(" | ").count();
        assert!(lines.iter().all(|l| cols(l) == cols(lines[0])), "{md}");

        let json = serde_json::to_value([t]).unwrap();
        assert_eq!(json[0]["rows"][1]["status"]["kind"], "failed");
        assert_eq!(json[0]["rows"][0]["memory"][0]["oom_kills"], 1);
    }
}

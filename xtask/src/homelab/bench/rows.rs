//! What each experiment's rows run: the paper's comparison (a), the PRP rounds (b) and
//! the links (d), as data, and the windows and `[policy]` lines of pinned plans. Pure:
//! nothing here runs anything.

use anyhow::{bail, Context, Result};

use super::parse::Plan;

/// Which of issue 15's experiments a bench run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Experiment {
    /// (a) llama.cpp and Prima alone, the ring under Halda, MemSched, PerfSched, without
    /// prefetch, without release (d1-d4).
    Paper,
    /// (b) Halda's windows pinned at k = 1, 2, 4, … rounds, with and without MRU release
    /// (homogeneous-4).
    Rounds,
    /// (d) Halda's plan with every link at 1, 5 and 20 ms one-way latency (d1-d4).
    Links,
}

impl Experiment {
    pub fn key(self) -> &'static str {
        match self {
            Experiment::Paper => "paper",
            Experiment::Rounds => "rounds",
            Experiment::Links => "links",
        }
    }

    pub fn default_testbed(self) -> &'static str {
        match self {
            Experiment::Paper | Experiment::Links => "d1-d4",
            Experiment::Rounds => "homogeneous-4",
        }
    }

    pub fn default_models(self) -> &'static [&'static str] {
        match self {
            Experiment::Paper => &["1b", "3b"],
            Experiment::Rounds | Experiment::Links => &["8b"],
        }
    }

    /// Where the tables go, under target/: `homelab-bench` for the paper's, else
    /// `homelab-bench-<experiment>`.
    pub fn output_stem(self) -> String {
        match self {
            Experiment::Paper => "homelab-bench".into(),
            other => format!("homelab-bench-{}", other.key()),
        }
    }
}

/// The paper experiment's rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

pub const PAPER_ROWS: [RowKind; 7] = [
    RowKind::LlamaAlone,
    RowKind::PrimaAlone,
    RowKind::Halda,
    RowKind::Mem,
    RowKind::Perf,
    RowKind::NoPrefetch,
    RowKind::NoRelease,
];

const HALDA: &str = "scheduler = \"halda\"\n";
const NO_PREFETCH: &str = "prefetch = false\n";
const NO_RELEASE: &str = "release = \"none\"\n";

impl RowKind {
    pub fn key(self) -> &'static str {
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

    pub fn row(self, best: &str) -> Row {
        let (what, run) = match self {
            RowKind::LlamaAlone => (
                format!("llama.cpp alone on {best} (mmap)"),
                RowRun::LlamaAlone,
            ),
            RowKind::PrimaAlone => (format!("Prima alone on {best}"), RowRun::PrimaAlone),
            RowKind::Halda => ("Prima ring, Halda".into(), RowRun::Ring(HALDA.into())),
            RowKind::Mem => (
                "Prima ring, MemSched".into(),
                RowRun::Ring("scheduler = \"mem\"\n".into()),
            ),
            RowKind::Perf => (
                "Prima ring, PerfSched".into(),
                RowRun::Ring("scheduler = \"perf\"\n".into()),
            ),
            RowKind::NoPrefetch => (
                "Prima ring, Halda, prefetch off".into(),
                RowRun::Pinned {
                    k: None,
                    extra: NO_PREFETCH.into(),
                },
            ),
            RowKind::NoRelease => (
                "Prima ring, Halda, release none".into(),
                RowRun::Pinned {
                    k: None,
                    extra: NO_RELEASE.into(),
                },
            ),
        };
        Row {
            key: self.key().into(),
            what,
            run,
        }
    }
}

/// One row to run.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Names the row in the tables, in `--rows` and in the log files.
    pub key: String,
    pub what: String,
    pub run: RowRun,
}

#[derive(Clone, Debug, PartialEq)]
pub enum RowRun {
    LlamaAlone,
    PrimaAlone,
    /// `prima apply` with these `[policy]` lines in place of `scheduler = "halda"`.
    Ring(String),
    /// Halda's plan (the halda row's, or the one planned before the rows) pinned
    /// (`scheduler = "manual"`), its windows rescaled to `k` rounds when given, with
    /// `extra` policy lines.
    Pinned {
        k: Option<usize>,
        extra: String,
    },
}

/// Which windows the rounds experiment cuts into k rounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RoundsWindows {
    /// Halda's plan for the bed, each device keeping its share of layers.
    Halda,
    /// The same number of layers on every device (the paper's PRP ablation).
    Equal,
}

impl RoundsWindows {
    fn name(self) -> &'static str {
        match self {
            RoundsWindows::Halda => "Halda's windows",
            RoundsWindows::Equal => "equal windows",
        }
    }
}

/// The rounds experiment's rows: per k, with MRU release and without.
pub fn rounds_rows(ks: &[usize], windows: RoundsWindows) -> Vec<Row> {
    let name = windows.name();
    ks.iter()
        .flat_map(|&k| {
            [
                Row {
                    key: format!("k{k}"),
                    what: format!("{name} at k = {k}, release mru"),
                    run: RowRun::Pinned {
                        k: Some(k),
                        extra: String::new(),
                    },
                },
                Row {
                    key: format!("k{k}-no-release"),
                    what: format!("{name} at k = {k}, release none"),
                    run: RowRun::Pinned {
                        k: Some(k),
                        extra: NO_RELEASE.into(),
                    },
                },
            ]
        })
        .collect()
}

/// The links experiment's row at one latency.
pub fn link_row(latency_ms: f64, link_mbit: f64) -> Row {
    Row {
        key: format!("halda-{latency_ms}ms"),
        what: format!("Prima ring, Halda, every link {latency_ms} ms one way, {link_mbit} Mbit/s"),
        run: RowRun::Ring(HALDA.into()),
    }
}

/// k = 1, 2, 4, … while every device can still have a window of its own in each round
/// (k ≤ ⌈L / M⌉): 1, 2, 4, 8 for 32 layers on 4 devices, 1, 2, 4 for 28.
pub fn round_counts(n_layers: usize, n_devices: usize) -> Vec<usize> {
    let most = n_layers.div_ceil(n_devices.max(1));
    std::iter::successors(Some(1usize), |k| Some(k * 2))
        .take_while(|&k| k <= most.max(1))
        .collect()
}

/// Windows planned for `plan_k` rounds cut into `k` rounds as `prima apply` cuts them for
/// a fixed k: each device keeps its share of layers (w · plan_k / k, rounded up, at
/// least 1); a device without layers stays without.
pub fn windows_at_k(w: &[usize], plan_k: usize, k: usize) -> Vec<usize> {
    w.iter()
        .map(|&x| {
            if x == 0 || k == plan_k {
                x
            } else {
                (x * plan_k).div_ceil(k).max(1)
            }
        })
        .collect()
}

/// Equal windows for k rounds on `n_devices` devices (⌈L / (M·k)⌉ each).
pub fn equal_windows(n_layers: usize, n_devices: usize, k: usize) -> Vec<usize> {
    vec![n_layers.div_ceil(n_devices * k).max(1); n_devices]
}

/// The windows of `plan` in the manifest's device `order` (0 for a device the plan left out).
pub fn plan_windows(order: &[&str], plan: &Plan) -> Result<Vec<usize>> {
    if plan.devices.is_empty() {
        bail!("the plan lists no device");
    }
    order
        .iter()
        .map(|name| {
            plan.devices
                .iter()
                .find(|(d, _, _)| d == name)
                .map(|(_, w, _)| *w)
                .with_context(|| format!("the halda plan has no device {name}"))
        })
        .collect()
}

/// `[policy]` lines that run `windows` (in the manifest's device order) as they are:
/// `scheduler = "manual"`, k left to apply (⌈L / Σw⌉, so nothing is rescaled), and the
/// row's `extra` lines.
pub fn pinned_policy(windows: &[usize], extra: &str) -> String {
    let list: Vec<String> = windows.iter().map(|w| w.to_string()).collect();
    format!(
        "scheduler = \"manual\"\nwindows = [{}]\n{extra}",
        list.join(", ")
    )
}

/// The `[policy]` lines of a pinned row when there is no Halda plan to pin: Halda plans
/// afresh (paper rows) — the rounds rows use [`equal_windows`] instead.
pub fn afresh_policy(extra: &str) -> String {
    format!("{HALDA}{extra}")
}

/// Keeps the rows named in `wanted` (all when empty), in `wanted`'s order; an unknown
/// name is an error that lists the experiment's rows.
pub fn select(rows: Vec<Row>, wanted: &[String], experiment: Experiment) -> Result<Vec<Row>> {
    if wanted.is_empty() {
        return Ok(rows);
    }
    wanted
        .iter()
        .map(|name| {
            rows.iter()
                .find(|r| &r.key == name)
                .cloned()
                .with_context(|| {
                    format!(
                        "--rows: the {} experiment has no row '{name}' (its rows: {})",
                        experiment.key(),
                        rows.iter()
                            .map(|r| r.key.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(text: &str) -> toml::Value {
        let m: toml::Value = toml::from_str(&format!("[policy]\n{text}")).unwrap();
        m["policy"].clone()
    }

    #[test]
    fn a_pinned_plan_keeps_windows_in_manifest_order() {
        let plan = Plan {
            predicted_tpot_ms: Some(300.0),
            k: Some(2),
            devices: vec![
                ("d1".into(), 0, 0),
                ("d3".into(), 9, 18),
                ("d2".into(), 3, 6),
            ],
        };
        let w = plan_windows(&["d1", "d2", "d3"], &plan).unwrap();
        assert_eq!(w, vec![0, 3, 9]);
        assert!(plan_windows(&["d4"], &plan).is_err());
        let p = policy(&pinned_policy(&w, NO_RELEASE));
        assert_eq!(p["scheduler"].as_str(), Some("manual"));
        assert_eq!(p["windows"][1].as_integer(), Some(3));
        assert_eq!(p["release"].as_str(), Some("none"));
        assert!(p.get("k").is_none());
    }

    #[test]
    fn every_ring_row_has_a_policy_that_parses() {
        for kind in PAPER_ROWS {
            let row = kind.row("d3");
            match &row.run {
                RowRun::LlamaAlone | RowRun::PrimaAlone => {}
                RowRun::Ring(p) => assert!(policy(p)["scheduler"].is_str(), "{p}"),
                RowRun::Pinned { extra, .. } => {
                    assert_eq!(
                        policy(&afresh_policy(extra))["scheduler"].as_str(),
                        Some("halda")
                    );
                    assert_eq!(
                        policy(&pinned_policy(&[1, 2], extra))["windows"][1].as_integer(),
                        Some(2)
                    );
                }
            }
        }
    }

    #[test]
    fn rounds_go_up_in_powers_of_two_while_every_device_has_a_window() {
        assert_eq!(round_counts(32, 4), vec![1, 2, 4, 8]);
        assert_eq!(round_counts(30, 4), vec![1, 2, 4, 8]);
        assert_eq!(round_counts(28, 4), vec![1, 2, 4]);
        assert_eq!(round_counts(3, 4), vec![1]);
        let rows = rounds_rows(&[1, 2], RoundsWindows::Equal);
        let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["k1", "k1-no-release", "k2", "k2-no-release"]);
        assert_eq!(rows[3].what, "equal windows at k = 2, release none");
    }

    #[test]
    fn windows_at_k_keep_each_devices_share() {
        // 32 layers as Halda planned them at k = 1, cut into 2, 4, 8 rounds.
        let w = [8, 8, 8, 8];
        assert_eq!(windows_at_k(&w, 1, 2), vec![4, 4, 4, 4]);
        assert_eq!(windows_at_k(&w, 1, 8), vec![1, 1, 1, 1]);
        assert_eq!(windows_at_k(&[10, 8, 7, 7], 1, 4), vec![3, 2, 2, 2]);
        assert_eq!(windows_at_k(&[0, 12, 4], 2, 4), vec![0, 6, 2]);
        assert_eq!(windows_at_k(&w, 1, 1), w.to_vec());
        assert_eq!(equal_windows(30, 4, 2), vec![4; 4]);
        assert_eq!(equal_windows(30, 4, 8), vec![1; 4]);
    }

    #[test]
    fn rows_are_selected_by_key_in_the_order_asked() {
        let rows = PAPER_ROWS.map(|k| k.row("d3")).to_vec();
        let picked = select(
            rows.clone(),
            &["halda".into(), "prima-alone".into()],
            Experiment::Paper,
        )
        .unwrap();
        assert_eq!(picked[0].key, "halda");
        assert_eq!(picked[1].key, "prima-alone");
        assert_eq!(
            select(rows.clone(), &[], Experiment::Paper).unwrap().len(),
            7
        );
        let e = select(rows, &["k2".into()], Experiment::Paper)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no row 'k2'") && e.contains("llama-alone"),
            "{e}"
        );
        assert_eq!(link_row(5.0, 300.0).key, "halda-5ms");
    }
}

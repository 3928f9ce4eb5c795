//! Solve time of Halda (set iteration, ILPs by the HiGHS plugin, device pruning) for 4,
//! 8, 16 and 32 devices: medians printed for the record (`-- --nocapture`), not asserted
//! — timing depends on the machine. What is asserted is that every plan is valid.

mod halda_support;

use halda_support::{model, os_models, solver, testbed};
use std::cell::Cell;
use std::time::Instant;

use prima_abi::solver::{MilpProblem, MilpSolution};
use prima_cluster::halda::{self, MilpSolver, PlanOptions, Scheduler};
use prima_cluster::profile::DeviceProfile;

/// Counts the solver's calls and the time spent in them.
struct Timed<'a> {
    inner: &'a dyn MilpSolver,
    calls: Cell<u32>,
    seconds: Cell<f64>,
}

impl MilpSolver for Timed<'_> {
    fn solve(&self, problem: &MilpProblem) -> Result<MilpSolution, String> {
        let start = Instant::now();
        let r = self.inner.solve(problem);
        self.calls.set(self.calls.get() + 1);
        self.seconds
            .set(self.seconds.get() + start.elapsed().as_secs_f64());
        r
    }
}

/// `count` devices cycling through the ten-node testbed (renamed, so names stay unique).
fn pool(count: usize) -> Vec<DeviceProfile> {
    let base = testbed("ten-node");
    (0..count)
        .map(|i| {
            let mut d = base[i % base.len()].clone();
            d.name = format!("{}-{}", d.name, i);
            d
        })
        .collect()
}

#[test]
fn solve_time_for_4_to_32_devices() {
    let s = solver();
    let os = os_models();
    let modes = [
        ("paper", PlanOptions::default()),
        (
            "paper, every k",
            PlanOptions {
                every_k: true,
                ..PlanOptions::default()
            },
        ),
        (
            "exact",
            PlanOptions {
                exact: true,
                ..PlanOptions::default()
            },
        ),
    ];
    for (mode, opts) in modes {
        for tag in ["llama3-70b-q4_k", "qwen2.5-32b-q4_k"] {
            let m = model(tag);
            for count in [4usize, 8, 16, 32] {
                let devs = pool(count);
                let mut times = Vec::new();
                let mut last = None;
                let timed = Timed {
                    inner: &s,
                    calls: Cell::new(0),
                    seconds: Cell::new(0.0),
                };
                for _ in 0..9 {
                    let p =
                        halda::plan(&m, &devs, Scheduler::Halda, Some(&timed), &os, &opts).unwrap();
                    times.push(p.solve_ms);
                    last = Some(p);
                }
                times.sort_by(f64::total_cmp);
                let p = last.unwrap();
                let active = p.active().count();
                assert!(active >= 1 && active <= count);
                eprintln!(
                "{mode:<14} {tag:<17} {count:>2} devices: median {:>8.2} ms (min {:.2}, max {:.2}); k={} {} active, {} ILPs in the final solve, predicted {:.1} ms; {:.1} ILPs per plan, {:.3} ms each",
                times[times.len() / 2],
                times[0],
                times[times.len() - 1],
                p.k,
                active,
                p.ilps,
                p.predicted_tpot_ms,
                timed.calls.get() as f64 / 9.0,
                timed.seconds.get() * 1e3 / timed.calls.get() as f64
            );
            }
        }
    }
}

//! One standard ILP per valid k (the paper's "Transform into standard ILPs"): with k and
//! W = L/k fixed, the LDA objective and constraints are linear in w and n.
//!
//! ```text
//! min  k(aᵀw + bᵀn + eᵀc) + κ
//! s.t. w_m ∈ ℤ, 1 ≤ w_m ≤ W;  n_m ∈ ℤ, 0 ≤ n_m ≤ min(w_m, ⌊W·z_m^{gpu}⌋)
//!      eᵀw = W
//!      P_w·w' + P_n·n' + W·z ≤ 0        (RAM: M1–M3 overloaded, M4 not)
//! ```
//! The RAM rows are written per device as `f_w·w_m + f_n·n_m ≥ W·z_m` (overloaded sets)
//! or `≤ W·z_m` (M4), with (f_w, f_n) the platform's RAM form — the rows of P_w and P_n.

use super::lda::Lda;
use super::os::{LdaSet, MemoryBehaviour};
use crate::plugin::solver_abi::MilpProblem;

/// The RAM rows' left-hand sides (w_m, w_m − n_m) are integers, so the paper's strict
/// "overloaded" inequality x > W·z becomes x ≥ ⌊W·z⌋ + 1, and x ≤ W·z becomes x ≤ ⌊W·z⌋:
/// the same integer points, with bounds the solver does not have to branch on.
fn overloaded_lower(bound: f64) -> f64 {
    bound.floor() + 1.0
}

fn resident_upper(bound: f64) -> f64 {
    bound.floor()
}

/// The columns of the program: w_m is column m, n_m is column M + m.
pub fn build(lda: &Lda, sets: &[LdaSet], k: u32, time_limit_s: f64) -> MilpProblem {
    let m_count = lda.len();
    let big_w = (lda.n_layers / k) as f64;
    let kf = k as f64;
    let obj = lda.objective(sets);
    let mut p = MilpProblem {
        time_limit_s,
        ..MilpProblem::default()
    };
    for m in 0..m_count {
        p.add_column(1.0, big_w, kf * obj.a[m], true);
    }
    for m in 0..m_count {
        let cap = lda.gpu_cap(m, k) as f64;
        p.add_column(0.0, cap, kf * obj.b[m], true);
    }
    // k·eᵀc + κ, and the relays' hops once per round.
    p.offset = kf * obj.c.iter().sum::<f64>() + obj.kappa + kf * lda.relay_hop_s;
    // eᵀw = W
    let all_w: Vec<(u32, f64)> = (0..m_count as u32).map(|m| (m, 1.0)).collect();
    p.add_row(big_w, big_w, &all_w);
    for m in 0..m_count {
        let (wc, nc) = (m as u32, (m_count + m) as u32);
        if lda.gpu_cap(m, k) > 0 {
            // n_m ≤ w_m
            p.add_row(f64::NEG_INFINITY, 0.0, &[(nc, 1.0), (wc, -1.0)]);
        }
        let d = &lda.devices[m];
        let f = d.behaviour.ram_form(&d.mem);
        let bound = lda.ram_bound(m, kf); // W·z_m
        let mut terms = vec![(wc, f.w)];
        if f.n != 0.0 && lda.gpu_cap(m, k) > 0 {
            terms.push((nc, f.n));
        }
        if sets[m] == LdaSet::M4 {
            p.add_row(f64::NEG_INFINITY, resident_upper(bound), &terms);
        } else {
            p.add_row(overloaded_lower(bound), f64::INFINITY, &terms);
        }
    }
    p
}

/// The exact program for one k, with no set assignment: the reload volume of the
/// incremental platforms, max(RAM − budget, 0), is convex, so an epigraph variable
/// r_m ≥ (RAM − budget)/s, r_m ≥ 0 prices it exactly; Metal's all-or-nothing reload gets a
/// binary z_m (overloaded or not) with big-M rows; a slow disk keeps its RAM row. Its
/// optimum is the optimum of the LDA objective over every (w, n) at this k, which the
/// set iteration does not always reach (see `tests/halda_bruteforce.rs`).
///
/// Columns: w (0..M), n (M..2M), then per device its disk-time variable (seconds), then
/// the Metal binaries.
pub fn build_exact(lda: &Lda, k: u32, time_limit_s: f64) -> MilpProblem {
    let m_count = lda.len();
    let big_w = (lda.n_layers / k) as f64;
    let kf = k as f64;
    let mut p = MilpProblem {
        time_limit_s,
        ..MilpProblem::default()
    };
    for d in &lda.devices {
        p.add_column(1.0, big_w, kf * d.alpha, true);
    }
    for (m, d) in lda.devices.iter().enumerate() {
        p.add_column(0.0, lda.gpu_cap(m, k) as f64, kf * d.beta, true);
    }
    let head = &lda.devices[0];
    // κ without its disk terms, which the disk variables carry; k·eᵀξ; relay hops.
    p.offset = head.out_compute_s
        + head.out_load_s
        + kf * lda.devices.iter().map(|d| d.xi).sum::<f64>()
        + kf * lda.relay_hop_s;
    let all_w: Vec<(u32, f64)> = (0..m_count as u32).map(|m| (m, 1.0)).collect();
    p.add_row(big_w, big_w, &all_w);
    for (m, d) in lda.devices.iter().enumerate() {
        let (wc, nc) = (m as u32, (m_count + m) as u32);
        let cap = lda.gpu_cap(m, k);
        if cap > 0 {
            p.add_row(f64::NEG_INFINITY, 0.0, &[(nc, 1.0), (wc, -1.0)]);
        }
        let f = d.behaviour.ram_form(&d.mem);
        let bound = lda.ram_bound(m, kf);
        let mut ram_terms = vec![(wc, f.w)];
        if f.n != 0.0 && cap > 0 {
            ram_terms.push((nc, f.n));
        }
        // The head reads one embedding row from disk per token in every case.
        let lookup_s = d.lookup_bytes / d.s_disk;
        let disk = p.add_column(lookup_s, f64::INFINITY, 1.0, false);
        if d.slow_disk {
            p.add_row(f64::NEG_INFINITY, resident_upper(bound), &ram_terms);
            continue;
        }
        let scale = kf * lda.b_prime / d.s_disk; // seconds per layer of overflow
        let constant = (d.mem.b_cio() + f.extra - d.budget) / d.s_disk;
        if d.behaviour.overload_set() != LdaSet::M2 {
            // r ≥ (k·b'·(f_w·w + f_n·n) + b_cio + extra − budget)/s
            let mut terms = vec![(disk, 1.0), (wc, -f.w * scale)];
            if f.n != 0.0 && cap > 0 {
                terms.push((nc, -f.n * scale));
            }
            p.add_row(constant, f64::INFINITY, &terms);
        } else {
            metal_rows(&mut p, lda, d.behaviour, m, k, disk, bound);
        }
    }
    p
}

/// Metal (Case 2): z = 1 when RAM use exceeds the budget; then the whole window of
/// weights is reloaded: y ≥ (k·b·w + io)/s − Y·(1 − z).
fn metal_rows(
    p: &mut MilpProblem,
    lda: &Lda,
    behaviour: &dyn MemoryBehaviour,
    m: usize,
    k: u32,
    disk: u32,
    bound: f64,
) {
    let d = &lda.devices[m];
    let kf = k as f64;
    let big_w = (lda.n_layers / k) as f64;
    let wc = m as u32;
    let z = p.add_column(0.0, 1.0, 0.0, true);
    // w − U·z ≤ ⌊W·z_m⌋, with U large enough to free w entirely.
    let u = (big_w - resident_upper(bound)).max(0.0);
    let f = behaviour.ram_form(&d.mem);
    p.add_row(
        f64::NEG_INFINITY,
        resident_upper(bound),
        &[(wc, f.w), (z, -u)],
    );
    let per_layer = kf * d.mem.b / d.s_disk;
    let io = d.mem.io / d.s_disk;
    let y_max = per_layer * big_w + io;
    // y − per_layer·w − Y·z ≥ io − Y
    p.add_row(
        io - y_max,
        f64::INFINITY,
        &[(disk, 1.0), (wc, -per_layer), (z, -y_max)],
    );
}

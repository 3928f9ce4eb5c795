//! One standard ILP per valid k (the paper's "Transform into standard ILPs"): with k and
//! W = L/k fixed, the LDA objective and constraints are linear in w and n.
//!
//! ```text
//! min  k(aᵀw + bᵀn + eᵀc) + κ
//! s.t. w_m ∈ ℤ, 1 ≤ w_m ≤ W;  n_m ∈ ℤ, 0 ≤ n_m ≤ min(w_m, ⌊W·z_m^{gpu}⌋)
//!      eᵀw = W
//!      P_w·w' + P_n·n' + W·z ≤ 0        (RAM: M1–M3 overloaded, M4 not)
//! ```
//! The RAM constraint of device m reads `f_w·w_m + f_n·n_m > W·z_m` (overloaded sets) or
//! `≤ W·z_m` (M4), with (f_w, f_n) the platform's RAM form — the rows of P_w and P_n.
//!
//! The program is handed to the solver in the variables c_m = w_m − n_m (CPU layers) and
//! n_m: then n_m ≤ w_m is c_m ≥ 0, and the Linux/Android/macOS RAM constraints
//! ((w − n) or w with n = 0) are bounds on c_m. What remains is one equality and the
//! rows w_m ≥ 1 (and Metal's c + n ≤ W·z), a totally unimodular system whose LP optimum
//! is already integral — the solver answers at the root instead of branching.

use super::lda::Lda;
use super::os::LdaSet;
use prima_abi::solver::MilpProblem;

/// The RAM forms' values are integers, so the paper's strict "overloaded" inequality
/// x > W·z becomes x ≥ ⌊W·z⌋ + 1, and x ≤ W·z becomes x ≤ ⌊W·z⌋: the same integer points.
fn overloaded_lower(bound: f64) -> f64 {
    bound.floor() + 1.0
}

fn resident_upper(bound: f64) -> f64 {
    bound.floor()
}

/// (w, n) from a solution's values: c_m is column m, n_m column M + m.
pub fn placement(values: &[f64], m_count: usize) -> (Vec<u32>, Vec<u32>) {
    let int = |v: f64| v.round().max(0.0) as u32;
    let n: Vec<u32> = values[m_count..2 * m_count]
        .iter()
        .map(|&v| int(v))
        .collect();
    let w = values[..m_count]
        .iter()
        .zip(&n)
        .map(|(&c, &n)| int(c) + n)
        .collect();
    (w, n)
}

/// Adds the shared skeleton: columns c_m, n_m with objective k·a_m on w (a_m on c and
/// a_m + b_m on n), eᵀw = W, w_m ≥ 1. Returns each device's RAM-form terms in (c, n).
fn skeleton(p: &mut MilpProblem, lda: &Lda, k: u32, a: &[f64], b: &[f64]) -> Vec<(f64, f64)> {
    let m_count = lda.len();
    let big_w = (lda.n_layers / k) as f64;
    let kf = k as f64;
    for am in &a[..m_count] {
        p.add_column(0.0, big_w, kf * am, true);
    }
    for m in 0..m_count {
        let cap = lda.gpu_cap(m, k) as f64;
        p.add_column(0.0, cap, kf * (a[m] + b[m]), true);
    }
    // eᵀw = W
    let all: Vec<(u32, f64)> = (0..2 * m_count as u32).map(|j| (j, 1.0)).collect();
    p.add_row(big_w, big_w, &all);
    let mut forms = Vec::with_capacity(m_count);
    for (m, d) in lda.devices.iter().enumerate() {
        let (cc, nc) = (m as u32, (m_count + m) as u32);
        // w_m ≥ 1, but the head may run no layer at all: it still embeds the input and
        // runs the output head, and with a small memory that holds little more than the
        // output head, each layer it took would be read from its disk every token.
        let lowest = if m == 0 { 0.0 } else { 1.0 };
        if lda.gpu_cap(m, k) > 0 {
            p.add_row(lowest, f64::INFINITY, &[(cc, 1.0), (nc, 1.0)]);
        } else {
            p.columns[m].lower = lowest;
        }
        let f = d.behaviour.ram_form(&d.mem);
        // f_w·w + f_n·n = f_w·c + (f_w + f_n)·n
        let on_n = if lda.gpu_cap(m, k) > 0 {
            f.w + f.n
        } else {
            0.0
        };
        forms.push((f.w, on_n));
    }
    forms
}

/// Adds `lower ≤ f_c·c_m + f_n·n_m ≤ upper`, as a bound on c_m when n_m is absent (a
/// row when the bounds would cross, so the solver reports the program infeasible).
fn ram_constraint(
    p: &mut MilpProblem,
    m_count: usize,
    m: usize,
    form: (f64, f64),
    lower: f64,
    upper: f64,
) {
    let (fc, fn_) = form;
    let col = p.columns[m];
    let (lo, hi) = (col.lower.max(lower), col.upper.min(upper));
    if fn_ == 0.0 && fc == 1.0 && lo <= hi {
        p.columns[m].lower = lo;
        p.columns[m].upper = hi;
    } else {
        let mut terms = vec![(m as u32, fc)];
        if fn_ != 0.0 {
            terms.push(((m_count + m) as u32, fn_));
        }
        p.add_row(lower, upper, &terms);
    }
}

/// The ILP for fixed k and a set assignment. Columns: c (0..M), n (M..2M).
pub fn build(lda: &Lda, sets: &[LdaSet], k: u32, time_limit_s: f64) -> MilpProblem {
    let kf = k as f64;
    let obj = lda.objective(sets);
    let mut p = MilpProblem {
        time_limit_s,
        ..MilpProblem::default()
    };
    let forms = skeleton(&mut p, lda, k, &obj.a, &obj.b);
    // k·eᵀc + κ, and the relays' hops once per round.
    p.offset = kf * obj.c.iter().sum::<f64>() + obj.kappa + kf * lda.relay_hop_s;
    for (m, set) in sets.iter().enumerate() {
        let bound = lda.ram_bound(m, kf); // W·z_m
        if *set == LdaSet::M4 {
            ram_constraint(
                &mut p,
                forms.len(),
                m,
                forms[m],
                f64::NEG_INFINITY,
                resident_upper(bound),
            );
        } else {
            ram_constraint(
                &mut p,
                forms.len(),
                m,
                forms[m],
                overloaded_lower(bound),
                f64::INFINITY,
            );
        }
    }
    p
}

/// The exact program for one k, with no set assignment: the reload volume of the
/// incremental platforms, max(RAM − budget, 0), is convex, so an epigraph variable
/// r_m ≥ (RAM − budget)/s, r_m ≥ 0 prices it exactly; Metal's all-or-nothing reload gets a
/// binary z_m (overloaded or not) with big-M rows; a slow disk keeps its RAM constraint.
/// Its optimum is the optimum of the LDA objective over every (w, n) at this k, which the
/// set iteration does not always reach (see `tests/halda_bruteforce.rs`).
///
/// Columns: c (0..M), n (M..2M), then each device's disk time r_m (seconds), then the
/// Metal binaries.
pub fn build_exact(lda: &Lda, k: u32, time_limit_s: f64) -> MilpProblem {
    let m_count = lda.len();
    let big_w = (lda.n_layers / k) as f64;
    let kf = k as f64;
    let mut p = MilpProblem {
        time_limit_s,
        ..MilpProblem::default()
    };
    let alpha: Vec<f64> = lda.devices.iter().map(|d| d.alpha).collect();
    let beta: Vec<f64> = lda.devices.iter().map(|d| d.beta).collect();
    let forms = skeleton(&mut p, lda, k, &alpha, &beta);
    let out = &lda.devices[lda.output_at];
    // κ without its disk terms, which the r_m carry; k·eᵀξ; relay hops.
    p.offset = out.out_compute_s
        + out.out_load_s
        + kf * lda.devices.iter().map(|d| d.xi).sum::<f64>()
        + kf * lda.relay_hop_s;
    for (m, d) in lda.devices.iter().enumerate() {
        let (cc, nc) = (m as u32, (m_count + m) as u32);
        let bound = lda.ram_bound(m, kf);
        let form = forms[m];
        // The head reads one embedding row from disk per token in every case.
        let lookup_s = d.lookup_bytes / d.s_disk;
        let r = p.add_column(lookup_s, f64::INFINITY, 1.0, false);
        if d.slow_disk {
            ram_constraint(
                &mut p,
                m_count,
                m,
                form,
                f64::NEG_INFINITY,
                resident_upper(bound),
            );
            continue;
        }
        let f = d.behaviour.ram_form(&d.mem);
        if d.behaviour.overload_set() != LdaSet::M2 {
            // r ≥ (k·b'·(f_w·w + f_n·n) + b_cio + extra − budget)/s
            let scale = kf * lda.b_prime / d.s_reload;
            let constant = (d.mem.b_cio() + f.extra - d.budget) / d.s_reload;
            let mut terms = vec![(r, 1.0), (cc, -form.0 * scale)];
            if form.1 != 0.0 {
                terms.push((nc, -form.1 * scale));
            }
            p.add_row(constant, f64::INFINITY, &terms);
        } else {
            // Metal: z = 1 when RAM use exceeds the budget; then every weight of the
            // device is reloaded: r ≥ (k·b·w + io)/s − Y·(1 − z).
            let z = p.add_column(0.0, 1.0, 0.0, true);
            let upper = resident_upper(bound);
            let u = (big_w - upper).max(0.0);
            let mut terms = vec![(cc, form.0), (z, -u)];
            if form.1 != 0.0 {
                terms.push((nc, form.1));
            }
            p.add_row(f64::NEG_INFINITY, upper, &terms); // w ≤ ⌊W·z_m⌋ + U·z
            let per_layer = kf * d.mem.b / d.s_reload;
            let io = d.mem.io / d.s_disk;
            let y = per_layer * big_w + io;
            // r − per_layer·(c + n) − Y·z ≥ io − Y
            let mut terms = vec![(r, 1.0), (cc, -per_layer), (z, -y)];
            if lda.gpu_cap(m, k) > 0 {
                terms.push((nc, -per_layer));
            }
            p.add_row(io - y, f64::INFINITY, &terms);
        }
    }
    p
}

/// The exact program at k ≥ 2 rounds with the ring's prefetch ([`Lda::predict`]): a
/// device streams what its memory cannot hold while the others compute, so the disk is
/// off the sum of turns, and T is the larger of that sum and each streaming device's own
/// cycle, k/(k − 1) times its excess read from disk (the room for one round's reads is
/// streamed too) plus its own compute. Minimises the epigraph variable τ of that maximum.
///
/// `cutoff`: an upper bound on τ (seconds), the plan to beat with a margin: the program is
/// then infeasible at its root relaxation where no placement at k can come near it, which
/// HiGHS proves in a fraction of a full solve.
pub fn build_overlap(lda: &Lda, k: u32, time_limit_s: f64, cutoff: Option<f64>) -> MilpProblem {
    assert!(
        k >= 2,
        "the overlap program needs rounds to hide reads behind"
    );
    let mut p = build_exact(lda, k, time_limit_s);
    let m_count = lda.len();
    let kf = k as f64;
    // build_exact adds each device's r_m after c and n, followed by a Metal binary.
    let mut disk_columns = Vec::with_capacity(m_count);
    let mut next = 2 * m_count as u32;
    for d in &lda.devices {
        disk_columns.push(next);
        next += 1;
        if !d.slow_disk && d.behaviour.overload_set() == LdaSet::M2 {
            next += 1;
        }
    }
    let tau = p.add_column(0.0, f64::INFINITY, 1.0, false);
    // τ ≥ the sum of turns: every column's cost but the disk columns r_m, which are hidden.
    let mut terms = vec![(tau, 1.0)];
    for (j, col) in p.columns.iter().enumerate() {
        let j = j as u32;
        if j != tau && !disk_columns.contains(&j) && col.cost != 0.0 {
            terms.push((j, -col.cost));
        }
    }
    p.add_row(p.offset, f64::INFINITY, &terms);
    // τ ≥ k/(k − 1)·r_m + k·(α_m·c_m + (α_m + β_m)·n_m) for each device.
    for (m, d) in lda.devices.iter().enumerate() {
        if !lda.has_room_to_stream(m) && !d.slow_disk {
            // Its reads would evict what it keeps: it takes only what fits.
            let f = d.behaviour.ram_form(&d.mem);
            let form = (
                f.w,
                if lda.gpu_cap(m, k) > 0 {
                    f.w + f.n
                } else {
                    0.0
                },
            );
            let bound = resident_upper(lda.ram_bound(m, kf)).max(0.0);
            let mut row = vec![(m as u32, form.0)];
            if form.1 != 0.0 {
                row.push(((m_count + m) as u32, form.1));
            }
            p.add_row(f64::NEG_INFINITY, bound, &row);
        }
        let r = disk_columns[m];
        let mut terms = vec![(tau, 1.0), (r, -kf / (kf - 1.0)), (m as u32, -kf * d.alpha)];
        if lda.gpu_cap(m, k) > 0 {
            terms.push(((m_count + m) as u32, -kf * (d.alpha + d.beta)));
        }
        p.add_row(0.0, f64::INFINITY, &terms);
    }
    for (j, col) in p.columns.iter_mut().enumerate() {
        if j as u32 != tau {
            col.cost = 0.0;
        }
    }
    p.offset = 0.0;
    if let Some(bound) = cutoff {
        p.add_row(f64::NEG_INFINITY, bound, &[(tau, 1.0)]);
    }
    p
}

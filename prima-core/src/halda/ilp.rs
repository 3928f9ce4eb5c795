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
use super::os::LdaSet;
use crate::plugin::solver_abi::MilpProblem;

/// Margin that turns the paper's strict "overloaded" inequality into a closed one.
const STRICT: f64 = 1e-6;

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
            p.add_row(f64::NEG_INFINITY, bound, &terms);
        } else {
            p.add_row(bound + STRICT, f64::INFINITY, &terms);
        }
    }
    p
}

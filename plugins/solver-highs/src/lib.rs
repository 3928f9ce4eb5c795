//! Prima's solver plugin: solves the generic mixed-integer linear programs of
//! `prima_abi::solver` with HiGHS (through the `highs` crate).
//!
//! This crate only translates: ABI columns and rows become a HiGHS `RowProblem`, HiGHS'
//! model status becomes an ABI [`MilpStatus`]. What the programs mean (Halda's LDA model)
//! is built in the core.

use abi_stable::std_types::{RResult, RString, RVec};
use highs::{HighsModelStatus, RowProblem, Sense};
use prima_abi::solver::{MilpProblem, MilpSolution, MilpStatus};

prima_abi::export_solver_plugin!(name = "highs", solve = solve_ffi);

extern "C" fn solve_ffi(problem: &MilpProblem) -> RResult<MilpSolution, RString> {
    // A panic must not cross the C ABI; turn it into an error for the caller.
    match std::panic::catch_unwind(|| solve(problem)) {
        Ok(Ok(solution)) => RResult::ROk(solution),
        Ok(Err(e)) => RResult::RErr(RString::from(e)),
        Err(_) => RResult::RErr(RString::from("HiGHS panicked while solving")),
    }
}

/// Solves `problem` with HiGHS (single-threaded, quiet).
pub fn solve(problem: &MilpProblem) -> Result<MilpSolution, String> {
    problem.validate()?;
    let mut pb = RowProblem::default();
    let mut cols = Vec::with_capacity(problem.columns.len());
    for c in problem.columns.iter() {
        if c.integer {
            // HiGHS can return a fractional value at a fractional bound of an integer
            // column (seen: x ∈ [0, 2.5] integer → 2.5), so give it the integer bounds,
            // which admit exactly the same points.
            let (lower, upper) = ((c.lower - 1e-9).ceil(), (c.upper + 1e-9).floor());
            if lower > upper {
                return Ok(infeasible("an integer column has no integer in its bounds"));
            }
            cols.push(pb.add_integer_column(c.cost, lower..=upper));
        } else {
            cols.push(pb.add_column(c.cost, c.lower..=c.upper));
        }
    }
    for row in problem.rows.iter() {
        let terms: Vec<_> = row
            .terms
            .iter()
            .map(|t| (cols[t.column as usize], t.value))
            .collect();
        pb.add_row(row.lower..=row.upper, terms);
    }
    if problem.columns.is_empty() {
        return Ok(MilpSolution {
            status: MilpStatus::Optimal,
            has_solution: true,
            objective: problem.offset,
            values: RVec::new(),
            message: RString::from("empty problem"),
        });
    }
    let mut model = pb.optimise(Sense::Minimise);
    model.make_quiet();
    model.set_option("threads", 1);
    // HiGHS runs its feasibility-jump heuristic before the root LP; on Halda's programs
    // (tens of columns, LP optimum already integral) it costs ~6 ms of a ~0.2 ms solve
    // (measured on a 2-column ILP). Older HiGHS builds lack the option; that is fine.
    let _ = model.try_set_option("mip_heuristic_run_feasibility_jump", false);
    if problem.time_limit_s > 0.0 {
        model.set_option("time_limit", problem.time_limit_s);
    }
    let solved = model.try_solve().map_err(|e| format!("HiGHS: {e:?}"))?;
    let status = match solved.status() {
        HighsModelStatus::Optimal => MilpStatus::Optimal,
        HighsModelStatus::Infeasible => MilpStatus::Infeasible,
        HighsModelStatus::Unbounded | HighsModelStatus::UnboundedOrInfeasible => {
            MilpStatus::Unbounded
        }
        HighsModelStatus::ReachedTimeLimit
        | HighsModelStatus::ReachedIterationLimit
        | HighsModelStatus::ReachedSolutionLimit => MilpStatus::TimeLimit,
        _ => MilpStatus::Error,
    };
    let has_solution = matches!(status, MilpStatus::Optimal)
        || (status == MilpStatus::TimeLimit && solved.objective_value().is_finite());
    let values: RVec<f64> = if has_solution {
        solved.get_solution().columns().iter().copied().collect()
    } else {
        RVec::new()
    };
    // Never hand back a point that breaks integrality.
    if let Some((j, v)) = problem
        .columns
        .iter()
        .zip(values.iter())
        .enumerate()
        .find(|(_, (c, v))| c.integer && (*v - v.round()).abs() > 1e-6)
        .map(|(j, (_, v))| (j, *v))
    {
        return Err(format!("HiGHS returned {v} for integer column {j}"));
    }
    Ok(MilpSolution {
        status,
        has_solution,
        objective: solved.objective_value() + problem.offset,
        values,
        message: RString::from(format!("{:?}", solved.status())),
    })
}

fn infeasible(why: &str) -> MilpSolution {
    MilpSolution {
        status: MilpStatus::Infeasible,
        has_solution: false,
        objective: f64::INFINITY,
        values: RVec::new(),
        message: RString::from(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn solves_a_small_integer_program() {
        // min -x - 2y, x + y ≤ 3.5, y ≤ 2.5, integers ≥ 0 → y = 2, x = 1.
        let mut p = MilpProblem::default();
        let x = p.add_column(0.0, f64::INFINITY, -1.0, true);
        let y = p.add_column(0.0, 2.5, -2.0, true);
        p.add_row(f64::NEG_INFINITY, 3.5, &[(x, 1.0), (y, 1.0)]);
        p.offset = 10.0;
        let s = solve(&p).unwrap();
        assert_eq!(s.status, MilpStatus::Optimal);
        assert_eq!(s.values.as_slice(), &[1.0, 2.0]);
        assert!((s.objective - 5.0).abs() < 1e-9);
    }

    #[test]
    fn reports_infeasible() {
        let mut p = MilpProblem::default();
        let x = p.add_column(0.0, 10.0, 1.0, true);
        p.add_row(0.2, 0.8, &[(x, 1.0)]);
        let s = solve(&p).unwrap();
        assert_eq!(s.status, MilpStatus::Infeasible);
        assert!(!s.has_solution);
    }

    #[test]
    fn an_integer_column_without_integers_is_infeasible() {
        let mut p = MilpProblem::default();
        p.add_column(0.2, 0.8, 1.0, true);
        assert_eq!(solve(&p).unwrap().status, MilpStatus::Infeasible);
    }

    #[test]
    fn refuses_a_bad_column_index() {
        let mut p = MilpProblem::default();
        p.add_column(0.0, 1.0, 1.0, false);
        p.add_row(0.0, 1.0, &[(7, 1.0)]);
        assert!(solve(&p).unwrap_err().contains("column 7"));
    }
}

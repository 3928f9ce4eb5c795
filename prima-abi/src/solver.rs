//! Solver plugin ABI, version 1: a generic mixed-integer linear program, minimised.
//!
//! The core builds the programs (Halda's one ILP per valid k, see `prima_cluster::halda::ilp`);
//! a solver plugin only solves them, so a different solver is a different plugin and the
//! `prima` binary has no compile-time dependency on any of them.
//!
//! A program is `min Σ cost_j·x_j` subject to `lower_j ≤ x_j ≤ upper_j` (with `x_j`
//! integral where `integer`), and `lower_i ≤ Σ_j a_ij·x_j ≤ upper_i` for every row, whose
//! non-zero coefficients `a_ij` are listed sparsely. Infinite bounds are `±f64::INFINITY`.
//!
//! Every type derives `StableAbi`; [`SOLVER_ABI_VERSION`] is read before any layout check
//! and must be bumped whenever anything in this file changes meaning.

use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    package_version_strings,
    sabi_types::VersionStrings,
    std_types::{RResult, RString, RVec},
    StableAbi,
};

/// Version of the solver ABI defined in this file.
pub const SOLVER_ABI_VERSION: u32 = 1;

/// One decision variable.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct MilpColumn {
    pub lower: f64,
    pub upper: f64,
    /// Its coefficient in the objective.
    pub cost: f64,
    /// Whether the variable must take an integer value.
    pub integer: bool,
}

/// One non-zero coefficient of a row.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct MilpTerm {
    /// Index into [`MilpProblem::columns`].
    pub column: u32,
    pub value: f64,
}

/// One linear constraint `lower ≤ Σ terms ≤ upper`.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct MilpRow {
    pub lower: f64,
    pub upper: f64,
    pub terms: RVec<MilpTerm>,
}

/// A minimisation problem.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, Default, PartialEq)]
pub struct MilpProblem {
    pub columns: RVec<MilpColumn>,
    pub rows: RVec<MilpRow>,
    /// Constant added to the objective (reported back in [`MilpSolution::objective`]).
    pub offset: f64,
    /// Wall-clock limit for the solve in seconds; 0 means none.
    pub time_limit_s: f64,
}

/// How a solve ended.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MilpStatus {
    /// `values` is an optimal solution.
    Optimal = 0,
    /// No assignment satisfies the constraints.
    Infeasible = 1,
    /// The objective has no lower bound.
    Unbounded = 2,
    /// Stopped at the time limit; `values` holds the best feasible point if `has_solution`.
    TimeLimit = 3,
    /// The solver failed; `message` says why.
    Error = 4,
}

/// The answer to a [`MilpProblem`].
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct MilpSolution {
    pub status: MilpStatus,
    /// Whether `values` is a feasible point (always true when `Optimal`).
    pub has_solution: bool,
    /// Objective value including [`MilpProblem::offset`].
    pub objective: f64,
    /// One value per column.
    pub values: RVec<f64>,
    /// Free text from the solver, for people.
    pub message: RString,
}

impl MilpProblem {
    /// Adds a column and returns its index.
    pub fn add_column(&mut self, lower: f64, upper: f64, cost: f64, integer: bool) -> u32 {
        self.columns.push(MilpColumn {
            lower,
            upper,
            cost,
            integer,
        });
        (self.columns.len() - 1) as u32
    }

    /// Adds the row `lower ≤ Σ value·x_column ≤ upper`.
    pub fn add_row(&mut self, lower: f64, upper: f64, terms: &[(u32, f64)]) {
        self.rows.push(MilpRow {
            lower,
            upper,
            terms: terms
                .iter()
                .map(|&(column, value)| MilpTerm { column, value })
                .collect(),
        });
    }

    /// Checks indices and bounds, so a solver never sees an out-of-range column.
    pub fn validate(&self) -> Result<(), String> {
        let n = self.columns.len();
        for (j, c) in self.columns.iter().enumerate() {
            if c.lower.is_nan() || c.upper.is_nan() || c.lower > c.upper || !c.cost.is_finite() {
                return Err(format!(
                    "column {j}: bounds [{}, {}], cost {}",
                    c.lower, c.upper, c.cost
                ));
            }
        }
        for (i, r) in self.rows.iter().enumerate() {
            if r.lower.is_nan() || r.upper.is_nan() || r.lower > r.upper {
                return Err(format!("row {i}: bounds [{}, {}]", r.lower, r.upper));
            }
            if let Some(t) = r
                .terms
                .iter()
                .find(|t| t.column as usize >= n || !t.value.is_finite())
            {
                return Err(format!(
                    "row {i}: term on column {} = {} (of {n} columns)",
                    t.column, t.value
                ));
            }
        }
        Ok(())
    }
}

/// The root module a solver plugin exports.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = SolverPluginRef)))]
#[sabi(missing_field(panic))]
pub struct SolverPlugin {
    /// The plugin's name, e.g. `highs`.
    pub name: extern "C" fn() -> RString,
    /// The plugin crate's own version.
    pub plugin_version: extern "C" fn() -> RString,
    /// Solves one problem. An `Err` is a failure to run at all (bad input); infeasibility
    /// and limits are reported in [`MilpSolution::status`].
    #[sabi(last_prefix_field)]
    pub solve: extern "C" fn(&MilpProblem) -> RResult<MilpSolution, RString>,
}

impl RootModule for SolverPluginRef {
    declare_root_module_statics! {SolverPluginRef}
    const BASE_NAME: &'static str = "prima_solver";
    const NAME: &'static str = "prima_solver";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

/// Exports a solver plugin from a `cdylib` crate.
///
/// ```ignore
/// prima_abi::export_solver_plugin!(name = "highs", solve = my_solve_fn);
/// ```
/// where `my_solve_fn: extern "C" fn(&MilpProblem) -> RResult<MilpSolution, RString>`.
#[macro_export]
macro_rules! export_solver_plugin {
    (name = $name:expr, solve = $solve:path) => {
        /// Read by the loader with plain `libloading` before any `abi_stable` check.
        #[no_mangle]
        pub extern "C" fn prima_plugin_abi_version() -> u32 {
            $crate::solver::SOLVER_ABI_VERSION
        }

        /// Which kind of plugin this library is.
        #[no_mangle]
        pub extern "C" fn prima_plugin_kind() -> u32 {
            $crate::PluginKind::Solver as u32
        }

        extern "C" fn __prima_plugin_name() -> ::abi_stable::std_types::RString {
            ::abi_stable::std_types::RString::from($name)
        }

        extern "C" fn __prima_plugin_version() -> ::abi_stable::std_types::RString {
            ::abi_stable::std_types::RString::from(env!("CARGO_PKG_VERSION"))
        }

        #[::abi_stable::export_root_module]
        pub fn __prima_solver_root() -> $crate::solver::SolverPluginRef {
            use ::abi_stable::prefix_type::PrefixTypeTrait;
            $crate::solver::SolverPlugin {
                name: __prima_plugin_name,
                plugin_version: __prima_plugin_version,
                solve: $solve,
            }
            .leak_into_prefix()
        }
    };
}

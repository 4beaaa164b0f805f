//! Diagnosis, the one home of what makes detcheck more than a hash comparison: given a
//! divergence, name its element, its operator and its cause, and the setting that fixes it.
//!
//! - [`cause`]: the rules that decide a divergence's cause from the evidence a comparison
//!   holds ([`decide_cause`]; docs/causes.md), in a fixed order, most specific first;
//! - [`operator`]: the operator drill-down's analysis of two operator traces of one module
//!   ([`find_operator`], [`random_operator`]; docs/operators.md);
//! - `element`: the re-runs that capture a divergent record and name its first differing
//!   element, and the operator traces those re-runs make (`find`, `find_sharded`);
//! - `settings`: which of `--deterministic`'s settings makes a program's runs identical, by
//!   runs with fewer of them ([`SettingsFinding`]).
//!
//! What it finds is data of `crate::compare` ([`crate::compare::Cause`],
//! [`crate::compare::OperatorFinding`], [`crate::compare::ElementFinding`]), written into a
//! comparison's rows in one place (`Comparison::annotate`, by the divergence's key); the hint
//! table it reads for fixes is `crate::record::hints`, below every layer that names a setting
//! (the launch contract, the communicators' lint). It sits between `run` (its re-runs go
//! through a runner's closures, given by the check) and `check` (which decides when to
//! diagnose).
//!
//! Determinism: the rules and the analysis are pure functions of traces; every re-run is one
//! of the check's own launches (its seeded perturbations), so a finding is a function of the
//! program. Limits: each part's module doc.

pub mod cause;
pub(crate) mod element;
pub mod operator;
pub(crate) mod settings;
#[cfg(test)]
mod tests;

pub use cause::decide_cause;
pub use operator::{find_operator, random_operator};
pub use settings::SettingsFinding;

//! `detcheck env --check`: a lint of an environment for a stack, the causes users hit most.
//! It reads the variables a trace's environment snapshot captures (one list, in `crate::record`).
//!
//! [`lint_environment`] reads a set of variables (this process's, or any rank's) and reports
//! [`Finding`]s: variables that do not exist though people set them (`NCCL_DETERMINISTIC`, set by
//! verl and others for years, does nothing), pinning settings (`crate::record::hints`) left unset or
//! set to another value, algorithms whose reduction order cannot be controlled (NCCL's Tree,
//! NVLS, CollNet), and `PYTHONHASHSEED` unset for a Python job. [`differing_ranks`] names the
//! variables whose values differ between ranks (an `NCCL_ALGO` set on some nodes only).
//!
//! Determinism: findings are sorted (by kind, then variable), a pure function of the variables.

use crate::comm::pinning::pin_settings_for;
use crate::record::environment::is_captured_variable;
use crate::record::hints;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// What a finding is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// A variable that does not exist is set.
    Nonexistent,
    /// A pinning setting is not set.
    Unpinned,
    /// A pinning setting is set to another value.
    Differs,
    /// An algorithm whose reduction order cannot be controlled is allowed.
    Uncontrolled,
}

/// One problem of an environment, with what to do.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Finding {
    /// What it is about.
    pub kind: FindingKind,
    /// The variable.
    pub variable: String,
    /// Its value, when set.
    pub value: Option<String>,
    /// What to do.
    pub advice: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            FindingKind::Nonexistent => "does not exist",
            FindingKind::Unpinned => "is not set",
            FindingKind::Differs => "is set to another value",
            FindingKind::Uncontrolled => "allows an order detcheck cannot pin",
        };
        match &self.value {
            Some(v) => write!(f, "{}={v} {what}: {}", self.variable, self.advice),
            None => write!(f, "{} {what}: {}", self.variable, self.advice),
        }
    }
}

/// The findings of `vars` for `stacks` (`mpi` stands for every MPI stack; none: every stack).
///
/// # Errors
/// The name of a stack that is not known.
pub fn lint_environment(
    vars: &BTreeMap<String, String>,
    stacks: &[String],
) -> Result<Vec<Finding>, String> {
    let settings = pin_settings_for(stacks)?;
    let mut findings = Vec::new();
    for (name, meant) in hints::nonexistent().map(|h| (h.name, h.fix)) {
        if let Some(value) = vars.get(name) {
            findings.push(Finding {
                kind: FindingKind::Nonexistent,
                variable: name.to_owned(),
                value: Some(value.clone()),
                advice: meant.to_owned(),
            });
        }
    }
    for s in settings {
        let advice = format!("set {}={} ({})", s.name, s.value, s.why);
        match vars.get(s.name) {
            None => findings.push(Finding {
                kind: FindingKind::Unpinned,
                variable: s.name.to_owned(),
                value: None,
                advice,
            }),
            Some(v) if v != s.value => findings.push(Finding {
                kind: FindingKind::Differs,
                variable: s.name.to_owned(),
                value: Some(v.clone()),
                advice,
            }),
            Some(_) => {}
        }
    }
    let nccl = settings_cover(stacks, "nccl");
    if nccl {
        if let Some(algo) = vars.get("NCCL_ALGO") {
            let lower = algo.to_ascii_lowercase();
            for uncontrolled in ["tree", "nvls", "collnet", "pat"] {
                if lower
                    .split([',', ';', ' '])
                    .any(|a| a.trim() == uncontrolled)
                {
                    findings.push(Finding {
                        kind: FindingKind::Uncontrolled,
                        variable: "NCCL_ALGO".to_owned(),
                        value: Some(algo.clone()),
                        advice: format!(
                            "`{uncontrolled}` reduces in an order that follows the topology and \
                             the channel count; allow Ring only (NCCL_ALGO=Ring)"
                        ),
                    });
                }
            }
        }
    }
    findings.sort();
    findings.dedup();
    Ok(findings)
}

/// `true` when the stacks asked for include `stack` (no stacks: every stack).
fn settings_cover(stacks: &[String], stack: &str) -> bool {
    stacks.is_empty() || stacks.iter().any(|s| s == stack)
}

/// The variables that matter to the lint, as this process has them: those a trace's
/// environment snapshot captures (`crate::record`'s one list of them), and the variables that
/// do not exist.
#[must_use]
pub fn relevant_environment() -> BTreeMap<String, String> {
    std::env::vars()
        .filter(|(name, _)| {
            is_captured_variable(name) || hints::nonexistent().any(|h| h.name == name)
        })
        .collect()
}

/// The variables whose values differ between ranks' environments (`ranks[r]` is rank r's), with
/// each rank's value (`None`: unset), sorted by variable.
#[must_use]
pub fn differing_ranks(ranks: &[BTreeMap<String, String>]) -> Vec<(String, Vec<Option<String>>)> {
    let mut names: Vec<&String> = ranks.iter().flat_map(BTreeMap::keys).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|name| {
            let values: Vec<Option<String>> = ranks.iter().map(|r| r.get(name).cloned()).collect();
            let first = &values[0];
            values
                .iter()
                .any(|v| v != first)
                .then(|| (name.clone(), values))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_variable_that_does_not_exist_and_a_missing_algorithm_are_flagged() {
        let env = vars(&[("NCCL_DETERMINISTIC", "1"), ("NCCL_PROTO", "Simple")]);
        let findings = lint_environment(&env, &["nccl".to_owned()]).unwrap();
        let first = &findings[0];
        assert_eq!(
            (first.kind, first.variable.as_str()),
            (FindingKind::Nonexistent, "NCCL_DETERMINISTIC")
        );
        assert!(first
            .to_string()
            .starts_with("NCCL_DETERMINISTIC=1 does not exist: "));
        assert!(findings
            .iter()
            .any(|f| f.kind == FindingKind::Unpinned && f.variable == "NCCL_ALGO"));
        assert!(
            !findings.iter().any(|f| f.variable == "NCCL_PROTO"),
            "NCCL_PROTO is pinned: {findings:?}"
        );
    }

    #[test]
    fn tree_and_nvls_are_uncontrolled_and_a_pinned_stack_is_clean() {
        let mut env = vars(&[
            ("NCCL_ALGO", "Tree,Ring"),
            ("NCCL_PROTO", "Simple"),
            ("NCCL_MIN_NCHANNELS", "4"),
            ("NCCL_MAX_NCHANNELS", "4"),
            ("NCCL_NVLS_ENABLE", "0"),
            ("NCCL_COLLNET_ENABLE", "0"),
        ]);
        let findings = lint_environment(&env, &["nccl".to_owned()]).unwrap();
        assert!(findings
            .iter()
            .any(|f| f.kind == FindingKind::Uncontrolled && f.advice.starts_with("`tree`")));
        env.insert("NCCL_ALGO".into(), "Ring".into());
        assert_eq!(lint_environment(&env, &["nccl".to_owned()]).unwrap(), []);
        assert!(lint_environment(&env, &["cobol".to_owned()]).is_err());
    }

    #[test]
    fn ranks_that_differ_are_named() {
        let ranks = [
            vars(&[("NCCL_ALGO", "Ring"), ("OMP_NUM_THREADS", "4")]),
            vars(&[("NCCL_ALGO", "Ring"), ("OMP_NUM_THREADS", "4")]),
            vars(&[("OMP_NUM_THREADS", "4")]),
        ];
        assert_eq!(
            differing_ranks(&ranks),
            [(
                "NCCL_ALGO".to_owned(),
                vec![Some("Ring".to_owned()), Some("Ring".to_owned()), None]
            )]
        );
    }
}

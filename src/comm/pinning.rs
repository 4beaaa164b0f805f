//! The environment settings that pin reductions (and hashing) on each stack: `detcheck env`.
//!
//! Collective libraries pick their reduction algorithm at run time, from message size, topology
//! and tuning files, so the order of additions can change between runs and machines. Each stack
//! has a switch that pins it; the settings rows of the one hint table (`crate::record::hints`)
//! list them, with the value detcheck recommends, what it pins and where it is documented, and
//! [`pin_settings_for`] selects them by stack. It is msprobe's `seed_all` for the environment: set
//! them all, and the libraries stop choosing. `PinSetting::current` says whether this process
//! already has a setting, and with which value.
//!
//! Determinism: a pinned algorithm is deterministic for one world size and topology only; none of
//! these switches makes the bits independent of the number of ranks.
//!
//! Limits: the values are recommendations for the library versions named in each `reference`;
//! a library that ignores a variable does so silently (Open MPI prints nothing for a misspelled
//! MCA variable), so the `backends` and `repeat` checks remain the proof.

/// One environment variable that pins a stack's behaviour: a [`Subject::Setting`] row of the
/// one hint table (`crate::record::hints`), where its `why` says what it pins.
///
/// [`Subject::Setting`]: crate::record::hints::Subject::Setting
pub type PinSetting = Hint;

use crate::record::hints::{self, Hint};

/// The stacks whose settings `mpirun` runs apply (`--stack mpi`).
pub const MPI_STACKS: [&str; 3] = ["openmpi", "mpich", "intel-mpi"];

/// The settings of the named stacks (`mpi` names all of [`MPI_STACKS`]), in table order; every
/// setting when `stacks` is empty.
///
/// # Errors
/// The first name that is no stack.
pub fn pin_settings_for(stacks: &[String]) -> Result<Vec<&'static PinSetting>, String> {
    let known = |s: &str| s == "mpi" || hints::settings().any(|p| p.stack == s);
    if let Some(unknown) = stacks.iter().find(|s| !known(s)) {
        return Err(unknown.clone());
    }
    let wanted = |stack: &str| {
        stacks.is_empty()
            || stacks
                .iter()
                .any(|s| s == stack || (s == "mpi" && MPI_STACKS.contains(&stack)))
    };
    Ok(hints::settings().filter(|p| wanted(p.stack)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_select_their_settings_and_unknown_ones_are_named() {
        let mpi = pin_settings_for(&["mpi".into()]).unwrap();
        assert!(mpi.iter().all(|p| MPI_STACKS.contains(&p.stack)));
        assert_eq!(mpi.len(), 6);
        assert_eq!(
            pin_settings_for(&[]).unwrap().len(),
            hints::settings().count()
        );
        assert_eq!(
            pin_settings_for(&["nccl".into(), "cdua".into()]),
            Err("cdua".into())
        );
    }

    /// A trace's environment snapshot records every setting `detcheck env` names (the list is
    /// kept in `record/environment.rs`, a layer below this one).
    #[test]
    fn every_setting_is_in_a_traces_environment_snapshot() {
        for p in hints::settings() {
            assert!(
                crate::record::environment::is_captured_variable(p.name),
                "{} is not captured",
                p.name
            );
        }
    }
}

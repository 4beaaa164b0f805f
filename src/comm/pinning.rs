//! The environment settings that pin reductions (and hashing) on each stack: `detcheck env`.
//!
//! Collective libraries pick their reduction algorithm at run time, from message size, topology
//! and tuning files, so the order of additions can change between runs and machines. Each stack
//! has a switch that pins it; [`PIN_SETTINGS`] lists them, with the value detcheck recommends,
//! what it pins and where it is documented. It is msprobe's `seed_all` for the environment: set
//! them all, and the libraries stop choosing. [`PinSetting::current`] says whether this process
//! already has a setting, and with which value.
//!
//! Determinism: a pinned algorithm is deterministic for one world size and topology only; none of
//! these switches makes the bits independent of the number of ranks.
//!
//! Limits: the values are recommendations for the library versions named in each `reference`;
//! a library that ignores a variable does so silently (Open MPI prints nothing for a misspelled
//! MCA variable), so the `backends` and `repeat` checks remain the proof.

/// One environment variable that pins a stack's behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinSetting {
    /// The stack it applies to: `openmpi`, `mpich`, `intel-mpi`, `nccl`, `hccl`, `cuda`, `python`.
    pub stack: &'static str,
    /// The variable.
    pub name: &'static str,
    /// The value detcheck recommends.
    pub value: &'static str,
    /// What it pins.
    pub pins: &'static str,
    /// Where the variable is documented.
    pub reference: &'static str,
}

/// The stacks whose settings `mpirun` runs apply (`--stack mpi`).
pub const MPI_STACKS: [&str; 3] = ["openmpi", "mpich", "intel-mpi"];

/// Every setting, grouped by stack.
pub const PIN_SETTINGS: &[PinSetting] = &[
    PinSetting {
        stack: "openmpi",
        name: "OMPI_MCA_coll_tuned_use_dynamic_rules",
        value: "1",
        pins: "lets the forced algorithm below override coll_tuned's size-based choice",
        reference: "ompi_info --param coll tuned --level 9",
    },
    PinSetting {
        stack: "openmpi",
        name: "OMPI_MCA_coll_tuned_allreduce_algorithm",
        value: "4",
        pins: "MPI_Allreduce always uses the ring algorithm (4), whatever the message size",
        reference: "ompi_info --param coll tuned --level 9",
    },
    PinSetting {
        stack: "openmpi",
        name: "OMPI_MCA_coll",
        value: "^hcoll,ucc",
        pins: "keeps HCOLL and UCC, which take precedence over coll_tuned where installed, out",
        reference: "ompi_info --param coll all",
    },
    PinSetting {
        stack: "mpich",
        name: "MPIR_CVAR_DEVICE_COLLECTIVES",
        value: "none",
        pins: "the device (ch4) never overrides the MPIR-level algorithm chosen below",
        reference: "mpivars (MPICH 4)",
    },
    PinSetting {
        stack: "mpich",
        name: "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM",
        value: "recursive_doubling",
        pins: "MPI_Allreduce always uses recursive doubling, whatever the message size",
        reference: "mpivars (MPICH 4)",
    },
    PinSetting {
        stack: "intel-mpi",
        name: "I_MPI_CBWR",
        value: "1",
        pins: "conditional bitwise reproducibility of reductions for one rank count and \
               placement (2 also across CPU types, slower)",
        reference: "Intel MPI Library Developer Reference, I_MPI_CBWR",
    },
    PinSetting {
        stack: "nccl",
        name: "NCCL_ALGO",
        value: "Ring",
        pins: "allreduce always uses the ring algorithm (not Tree, CollNet or NVLS)",
        reference: "NCCL environment variables",
    },
    PinSetting {
        stack: "nccl",
        name: "NCCL_PROTO",
        value: "Simple",
        pins: "one protocol for every message size (LL and LL128 change the chunking)",
        reference: "NCCL environment variables",
    },
    PinSetting {
        stack: "nccl",
        name: "NCCL_MIN_NCHANNELS",
        value: "4",
        pins: "with NCCL_MAX_NCHANNELS, a fixed channel count, so a fixed split of the buffer",
        reference: "NCCL environment variables",
    },
    PinSetting {
        stack: "nccl",
        name: "NCCL_MAX_NCHANNELS",
        value: "4",
        pins: "with NCCL_MIN_NCHANNELS, a fixed channel count",
        reference: "NCCL environment variables",
    },
    PinSetting {
        stack: "nccl",
        name: "NCCL_NVLS_ENABLE",
        value: "0",
        pins: "no NVLink SHARP in-switch reductions",
        reference: "NCCL environment variables",
    },
    PinSetting {
        stack: "nccl",
        name: "NCCL_COLLNET_ENABLE",
        value: "0",
        pins: "no in-network (SHARP) reductions",
        reference: "NCCL environment variables",
    },
    PinSetting {
        stack: "hccl",
        name: "HCCL_DETERMINISTIC",
        value: "true",
        pins: "deterministic reduction order in HCCL collectives (Ascend)",
        reference: "msprobe seed_all; CANN HCCL environment variables",
    },
    PinSetting {
        stack: "cuda",
        name: "CUBLAS_WORKSPACE_CONFIG",
        value: ":4096:8",
        pins: "cuBLAS uses fixed workspaces, so its split-K reductions repeat",
        reference: "cuBLAS reproducibility; torch.use_deterministic_algorithms",
    },
    PinSetting {
        stack: "python",
        name: "PYTHONHASHSEED",
        value: "0",
        pins: "str/bytes hashes, so set and dict-of-set iteration orders repeat",
        reference: "Python command line and environment",
    },
];

impl PinSetting {
    /// This process's value of the variable, if it has one.
    #[must_use]
    pub fn current(&self) -> Option<String> {
        std::env::var(self.name).ok()
    }
}

/// The settings of the named stacks (`mpi` names all of [`MPI_STACKS`]), in table order; every
/// setting when `stacks` is empty.
///
/// # Errors
/// The first name that is no stack.
pub fn pin_settings_for(stacks: &[String]) -> Result<Vec<&'static PinSetting>, String> {
    let known = |s: &str| s == "mpi" || PIN_SETTINGS.iter().any(|p| p.stack == s);
    if let Some(unknown) = stacks.iter().find(|s| !known(s)) {
        return Err(unknown.clone());
    }
    let wanted = |stack: &str| {
        stacks.is_empty()
            || stacks
                .iter()
                .any(|s| s == stack || (s == "mpi" && MPI_STACKS.contains(&stack)))
    };
    Ok(PIN_SETTINGS.iter().filter(|p| wanted(p.stack)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_select_their_settings_and_unknown_ones_are_named() {
        let mpi = pin_settings_for(&["mpi".into()]).unwrap();
        assert!(mpi.iter().all(|p| MPI_STACKS.contains(&p.stack)));
        assert_eq!(mpi.len(), 6);
        assert_eq!(pin_settings_for(&[]).unwrap().len(), PIN_SETTINGS.len());
        assert_eq!(
            pin_settings_for(&["nccl".into(), "cdua".into()]),
            Err("cdua".into())
        );
    }

    /// A trace's environment snapshot records every setting `detcheck env` names (the list is
    /// kept in `record/environment.rs`, a layer below this one).
    #[test]
    fn every_setting_is_in_a_traces_environment_snapshot() {
        for p in PIN_SETTINGS {
            assert!(
                crate::record::environment::is_captured_variable(p.name),
                "{} is not captured",
                p.name
            );
        }
    }

    #[test]
    fn every_variable_is_listed_once() {
        let mut names: Vec<_> = PIN_SETTINGS.iter().map(|p| p.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), PIN_SETTINGS.len());
    }
}

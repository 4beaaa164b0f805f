//! The environment snapshot of a trace: what could change a run's bits besides its program and
//! inputs, as a sorted list of key → value entries.
//!
//! [`Environment::capture`] takes this process's snapshot: every variable that pins or steers a
//! reduction (the settings of `detcheck env`, every `NCCL_*`, `HCCL_*`, `CUBLAS_*`, `OMP_*` and
//! `MPIR_CVAR_*` variable, `PYTHONHASHSEED`), the detcheck version, the CPU kernel the multiversioned
//! reductions picked, the host name, and the MPI library as the launcher's environment names it.
//! Writers add what they know on top ([`Environment::set`]): the launcher, the scenario's
//! fingerprint, the exact MPI library version, a framework's versions. Variables are stored
//! under their own names (upper case); detcheck's entries under dotted lower-case keys
//! ([`keys`]), so the two never collide.
//!
//! Determinism: the entries are kept sorted by key (bytes), so a snapshot's encoding depends only
//! on its entries, never on the order they were set in or on the process's variable order.
//! A snapshot is data that describes a run, never compared as a record: two runs with different
//! snapshots can still hold identical records, and [`Environment::differences`] says how two
//! snapshots differ.
//!
//! Limits: a value longer than [`MAX_LEN`] bytes is cut (ending in `…`); which variables are
//! captured is the fixed list of [`is_captured_variable`], not every variable of the process
//! (those hold paths, ports and job ids that differ on every launch).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// The keys detcheck itself sets.
pub mod keys {
    /// The detcheck version that wrote the trace (`0.1.0`).
    pub const VERSION: &str = "detcheck.version";
    /// The reduction kernel picked at run time: `avx512`, `avx2` or `baseline`.
    pub const KERNEL: &str = "detcheck.kernel";
    /// The host name.
    pub const HOST: &str = "host.name";
    /// What launched the ranks: `threads`, `mpi`, or a `command` scenario's launcher
    /// (`processes`, `mpirun`, `torchrun`, `none`).
    pub const LAUNCHER: &str = "launcher";
    /// The MPI library and its version, when the process is an MPI rank.
    pub const MPI_LIBRARY: &str = "mpi.library";
    /// The scenario's fingerprint (md5 of its kind, reduction and params), when known.
    pub const FINGERPRINT: &str = "scenario.fingerprint";
    /// A launched program as `detcheck run` takes it (`--ranks 2 -- python3 train.py`): a fact
    /// of the run, never compared (`site:`).
    pub const PROGRAM: &str = "site:program";
}

/// The longest key or value, in bytes (a trace stores both lengths as 16-bit numbers).
pub const MAX_LEN: usize = u16::MAX as usize;

/// The prefixes of the variables a snapshot captures (every variable that starts with one):
/// NCCL's, HCCL's, cuBLAS's and OpenMP's settings, and MPICH's control variables.
const CAPTURED_PREFIXES: [&str; 5] = ["NCCL_", "HCCL_", "CUBLAS_", "OMP_", "MPIR_CVAR_"];

/// The variables a snapshot captures by name: `PYTHONHASHSEED` and the MPI settings of `detcheck
/// env` (`crate::comm::pinning`; a test there checks that every one of its settings is captured).
/// Not every `OMPI_MCA_*` variable: `mpirun` sets dozens that hold job ids, ports and paths.
const CAPTURED_NAMES: [&str; 5] = [
    "PYTHONHASHSEED",
    "OMPI_MCA_coll_tuned_use_dynamic_rules",
    "OMPI_MCA_coll_tuned_allreduce_algorithm",
    "OMPI_MCA_coll",
    "I_MPI_CBWR",
];

/// `true` when a snapshot records the variable `name` (when it is set).
#[must_use]
pub fn is_captured_variable(name: &str) -> bool {
    CAPTURED_NAMES.contains(&name) || CAPTURED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// A sorted key → value list describing where a trace was recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Environment {
    entries: BTreeMap<String, String>,
}

/// One key whose value differs between two snapshots (`None`: the key is absent there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryDifference<'a> {
    /// The key.
    pub key: &'a str,
    /// Its value in the first snapshot.
    pub left: Option<&'a str>,
    /// Its value in the second.
    pub right: Option<&'a str>,
}

impl Environment {
    /// An empty snapshot.
    #[must_use]
    pub fn new() -> Self {
        Environment::default()
    }

    /// This process's snapshot: the captured variables that are set, the detcheck version, the
    /// reduction kernel, the host name, and the MPI library named by the launcher's variables.
    #[must_use]
    pub fn capture() -> Self {
        let mut env = Environment::new();
        for (name, value) in std::env::vars_os() {
            let Some(name) = name.to_str() else {
                continue;
            };
            if is_captured_variable(name) {
                env.set(name, value.to_string_lossy());
            }
        }
        env.set(keys::VERSION, env!("CARGO_PKG_VERSION"));
        env.set(keys::KERNEL, crate::value::reduce::selected_kernel());
        if let Ok(host) = nix::unistd::gethostname() {
            env.set(keys::HOST, host.to_string_lossy());
        }
        if let Some(library) = mpi_library_from_launcher(|name| std::env::var(name).ok()) {
            env.set(keys::MPI_LIBRARY, library);
        }
        env
    }

    /// Sets `key` to `value`, replacing an earlier value. Keys and values longer than
    /// [`MAX_LEN`] bytes are cut at a character boundary, ending in `…`.
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.entries.insert(clip(key.into()), clip(value.into()));
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: &str) -> Option<String> {
        self.entries.remove(key)
    }

    /// The value of `key`.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries.get(key).map(String::as_str)
    }

    /// The entries, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The number of entries.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// `true` when the snapshot has no entry.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The keys whose values differ between `self` and `other`, sorted by key.
    #[must_use]
    pub fn differences<'a>(&'a self, other: &'a Environment) -> Vec<EntryDifference<'a>> {
        let mut keys: Vec<&str> = self
            .entries
            .keys()
            .chain(other.entries.keys())
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys.into_iter()
            .filter_map(|key| {
                let (left, right) = (self.get(key), other.get(key));
                (left != right).then_some(EntryDifference { key, left, right })
            })
            .collect()
    }
}

impl fmt::Display for Environment {
    /// One `key=value` line per entry, sorted.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (key, value) in self.iter() {
            writeln!(f, "{key}={value}")?;
        }
        Ok(())
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Environment {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut env = Environment::new();
        for (k, v) in iter {
            env.set(k, v);
        }
        env
    }
}

/// `text` cut to at most [`MAX_LEN`] bytes at a character boundary (ending in `…`).
fn clip(mut text: String) -> String {
    if text.len() > MAX_LEN {
        let mut end = MAX_LEN - '…'.len_utf8();
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// The MPI library a launcher's variables name: Open MPI's `mpirun` sets `OMPI_COMM_WORLD_SIZE`,
/// MPICH's and Intel MPI's Hydra `PMI_SIZE` (or `MPI_LOCALNRANKS`). Neither says its version; a
/// program linked with MPI (or detcheck's `mpirun` launcher) sets the exact one.
fn mpi_library_from_launcher(var: impl Fn(&str) -> Option<String>) -> Option<String> {
    if var("OMPI_COMM_WORLD_SIZE").is_some() {
        Some("Open MPI (from mpirun's environment; version not known)".to_owned())
    } else if var("I_MPI_ROOT").is_some() && var("PMI_SIZE").is_some() {
        Some("Intel MPI (from mpiexec's environment; version not known)".to_owned())
    } else if var("PMI_SIZE").is_some() || var("MPI_LOCALNRANKS").is_some() {
        Some("MPICH/Hydra (from mpiexec's environment; version not known)".to_owned())
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_sorted_whatever_the_order_they_were_set_in() {
        let a: Environment = [("b", "2"), ("NCCL_ALGO", "Ring"), ("a", "1")]
            .into_iter()
            .collect();
        let b: Environment = [("a", "1"), ("b", "2"), ("NCCL_ALGO", "Ring")]
            .into_iter()
            .collect();
        assert_eq!(a, b);
        let keys: Vec<&str> = a.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["NCCL_ALGO", "a", "b"]);
        assert_eq!(a.to_string(), "NCCL_ALGO=Ring\na=1\nb=2\n");
    }

    #[test]
    fn differences_name_changed_added_and_removed_keys() {
        let a: Environment = [("k", "1"), ("same", "x"), ("gone", "y")]
            .into_iter()
            .collect();
        let b: Environment = [("k", "2"), ("same", "x"), ("new", "z")]
            .into_iter()
            .collect();
        let d = a.differences(&b);
        let as_tuples: Vec<_> = d.iter().map(|d| (d.key, d.left, d.right)).collect();
        assert_eq!(
            as_tuples,
            [
                ("gone", Some("y"), None),
                ("k", Some("1"), Some("2")),
                ("new", None, Some("z"))
            ]
        );
        assert!(a.differences(&a).is_empty());
    }

    #[test]
    fn the_capture_holds_detcheck_entries_and_only_captured_variables() {
        let env = Environment::capture();
        assert_eq!(env.get(keys::VERSION), Some(env!("CARGO_PKG_VERSION")));
        assert_eq!(
            env.get(keys::KERNEL),
            Some(crate::value::reduce::selected_kernel())
        );
        assert!(env.get(keys::HOST).is_some());
        for (key, _) in env.iter() {
            assert!(
                is_captured_variable(key) || key.contains('.'),
                "{key} is neither a captured variable nor one of detcheck's keys"
            );
        }
        assert!(is_captured_variable("NCCL_ALGO"));
        assert!(is_captured_variable("OMP_NUM_THREADS"));
        assert!(is_captured_variable("PYTHONHASHSEED"));
        assert!(!is_captured_variable("PATH"));
        assert!(!is_captured_variable("OMPI_MCA_orte_hnp_uri"));
    }

    #[test]
    fn long_values_are_cut_at_a_character_boundary() {
        let mut env = Environment::new();
        env.set("k", "é".repeat(MAX_LEN));
        let v = env.get("k").unwrap();
        assert!(v.len() <= MAX_LEN && v.ends_with('…'), "{}", v.len());
    }

    #[test]
    fn the_mpi_library_comes_from_the_launchers_variables() {
        let from = |vars: &[(&str, &str)]| {
            let vars: Vec<(String, String)> = vars
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            mpi_library_from_launcher(|n| vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone()))
        };
        assert!(from(&[("OMPI_COMM_WORLD_SIZE", "4")])
            .unwrap()
            .starts_with("Open MPI"));
        assert!(from(&[("PMI_SIZE", "4")]).unwrap().starts_with("MPICH"));
        assert_eq!(from(&[("RANK", "0")]), None);
    }
}

//! MPI launchers: finding `mpirun`, telling Open MPI from MPICH's Hydra, and the flags and
//! settings a job of detcheck's needs.
//!
//! [`MpiLauncher::from_env`] takes the launcher named by `DETCHECK_MPIRUN` (default `mpirun`)
//! and reads its flavour from `--version`. [`MpiLauncher::command`] starts `-n N` processes with
//! the flavour's flags (Open MPI: `--oversubscribe`, and `--allow-run-as-root` as root) and the
//! MPI settings of `detcheck env --stack mpi` that the environment does not already set. The
//! harness uses it to re-launch a test binary (`DETCHECK_NP`), and the `command` kind's
//! `mpirun` launcher to start a user's program.
//!
//! Determinism: the flags and settings are a function of the flavour and the environment.
//! Limits: Open MPI and Hydra (MPICH, Intel MPI); not Slurm's `srun`.

use crate::comm::pinning::pin_settings_for;
use std::process::Command;

/// The variable that names the launcher (default `mpirun`).
pub const MPIRUN_VAR: &str = "DETCHECK_MPIRUN";

/// The MPI implementation behind a launcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// Open MPI's `mpirun`.
    OpenMpi,
    /// MPICH's Hydra `mpiexec`/`mpirun` (also Intel MPI's).
    Hydra,
}

impl Flavour {
    /// Reads the flavour from the output of `<launcher> --version`.
    #[must_use]
    pub fn from_version(text: &str) -> Option<Flavour> {
        if text.contains("Open MPI") || text.contains("OpenRTE") {
            Some(Flavour::OpenMpi)
        } else if text.contains("HYDRA") || text.contains("Intel(R) MPI") {
            Some(Flavour::Hydra)
        } else {
            None
        }
    }

    /// The MPI library named by `<launcher> --version`'s output, for a trace's environment
    /// snapshot: Open MPI's first line (`mpirun (Open MPI) 4.1.4`), Intel MPI's, or Hydra's
    /// version (`MPICH (Hydra) 4.0.2`).
    #[must_use]
    pub fn library(self, text: &str) -> String {
        let line = |needle: &str| {
            text.lines()
                .find(|l| l.contains(needle))
                .map(|l| l.trim().to_owned())
        };
        match self {
            Flavour::OpenMpi => line("Open MPI")
                .or_else(|| line("OpenRTE"))
                .unwrap_or_else(|| "Open MPI".to_owned()),
            Flavour::Hydra => line("Intel(R) MPI").unwrap_or_else(|| {
                let version = text
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("Version:"))
                    .map_or(String::new(), |v| format!(" {}", v.trim()));
                format!("MPICH (Hydra){version}")
            }),
        }
    }

    /// The flags a job of detcheck's adds for this flavour.
    #[must_use]
    pub fn flags(self, as_root: bool) -> Vec<&'static str> {
        match self {
            Flavour::OpenMpi if as_root => vec!["--oversubscribe", "--allow-run-as-root"],
            Flavour::OpenMpi => vec!["--oversubscribe"],
            Flavour::Hydra => Vec::new(),
        }
    }
}

/// Why no MPI launcher could be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LauncherError {
    /// The launcher could not be started.
    #[error(
        "cannot run `{program} --version` ({source}): install MPI (scripts/install-mpi.sh) or \
         name the launcher in {MPIRUN_VAR}"
    )]
    NotFound {
        /// The launcher.
        program: String,
        /// Why it did not start.
        source: std::io::Error,
    },
    /// `--version` named no flavour detcheck knows.
    #[error("`{program} --version` names neither Open MPI nor MPICH/Hydra: set {MPIRUN_VAR}")]
    UnknownFlavour {
        /// The launcher.
        program: String,
    },
}

/// An MPI launcher on this machine and its flavour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpiLauncher {
    /// The launcher's command (`mpirun`, `mpirun.mpich`, a path).
    pub program: String,
    /// Its flavour.
    pub flavour: Flavour,
    /// The MPI library its `--version` names ([`Flavour::library`]).
    pub library: String,
}

impl MpiLauncher {
    /// The launcher `DETCHECK_MPIRUN` names, or `mpirun`.
    ///
    /// # Errors
    /// [`LauncherError`] when it cannot be started or its flavour is unknown.
    pub fn from_env() -> Result<Self, LauncherError> {
        let program = std::env::var(MPIRUN_VAR).unwrap_or_else(|_| "mpirun".to_owned());
        Self::detect(&program)
    }

    /// The launcher `program`, its flavour read from `program --version`.
    ///
    /// # Errors
    /// [`LauncherError`] when it cannot be started or its flavour is unknown.
    pub fn detect(program: &str) -> Result<Self, LauncherError> {
        let output = Command::new(program)
            .arg("--version")
            .output()
            .map_err(|source| LauncherError::NotFound {
                program: program.to_owned(),
                source,
            })?;
        let text = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        let flavour =
            Flavour::from_version(&text).ok_or_else(|| LauncherError::UnknownFlavour {
                program: program.to_owned(),
            })?;
        Ok(MpiLauncher {
            program: program.to_owned(),
            flavour,
            library: flavour.library(&text),
        })
    }

    /// `<launcher> <flags> -n <processes>`, with the MPI pinning settings the environment does
    /// not already set; the caller adds the program and its arguments.
    #[must_use]
    pub fn command(&self, processes: usize) -> Command {
        let mut command = Command::new(&self.program);
        command
            .args(self.flavour.flags(is_root()))
            .arg("-n")
            .arg(processes.to_string());
        for setting in pin_settings_for(&["mpi".to_owned()]).unwrap_or_default() {
            if setting.current().is_none() {
                command.env(setting.name, setting.value);
            }
        }
        command
    }
}

/// `true` when this process runs as root (Open MPI refuses root without a flag).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            == Some("0")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flavours_are_read_from_version_text_and_pick_their_flags() {
        let open = "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/";
        let hydra = "HYDRA build details:\n    Version:    4.0.2";
        assert_eq!(Flavour::from_version(open), Some(Flavour::OpenMpi));
        assert_eq!(Flavour::from_version(hydra), Some(Flavour::Hydra));
        assert_eq!(Flavour::from_version("srun 23.02"), None);
        assert_eq!(Flavour::OpenMpi.library(open), "mpirun (Open MPI) 4.1.4");
        assert_eq!(Flavour::Hydra.library(hydra), "MPICH (Hydra) 4.0.2");
        assert_eq!(
            Flavour::OpenMpi.flags(true),
            ["--oversubscribe", "--allow-run-as-root"]
        );
        assert!(Flavour::Hydra.flags(true).is_empty());
    }

    #[test]
    fn a_missing_launcher_is_named() {
        let err = MpiLauncher::detect("/nonexistent/mpirun").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot run `/nonexistent/mpirun --version`"),
            "{err}"
        );
    }
}

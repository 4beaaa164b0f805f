//! Re-launching a test binary under `mpirun`, so that cargo can run MPI trials.
//!
//! A cargo `runner` would wrap every test binary; instead a harness binary started with
//! `DETCHECK_NP=N` (and not already under a launcher) starts `mpirun -n N <itself> <its
//! arguments>` and returns its exit code. The launcher is `DETCHECK_MPIRUN` (default `mpirun`);
//! its flavour, read from `--version`, decides the flags: Open MPI gets `--oversubscribe` (more
//! ranks than cores) and, as root, `--allow-run-as-root`; MPICH's Hydra needs neither. The MPI
//! settings of `detcheck env --stack mpi` are set in the child's environment unless already set.
//!
//! Errors are messages and exit code 2: `DETCHECK_NP` not a positive number, a binary built
//! without the `mpi` feature, a launcher that cannot be started.

use detcheck::check::launcher_rank;
use detcheck::comm::{pin_settings_for, MPI_SUPPORT};
use std::ffi::OsString;
use std::process::{Command, ExitCode};

/// The variable that asks for a re-launch: the number of MPI processes.
pub const NP_VAR: &str = "DETCHECK_NP";
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

    /// The flags the harness adds for this flavour.
    #[must_use]
    pub fn flags(self, as_root: bool) -> Vec<&'static str> {
        match self {
            Flavour::OpenMpi if as_root => vec!["--oversubscribe", "--allow-run-as-root"],
            Flavour::OpenMpi => vec!["--oversubscribe"],
            Flavour::Hydra => Vec::new(),
        }
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

/// Re-launches this binary under `mpirun` when `DETCHECK_NP` asks for it and no launcher started
/// this process; returns the exit code to return from `main`, or `None` to go on here.
#[must_use]
pub fn relaunch_if_asked() -> Option<ExitCode> {
    let np = std::env::var(NP_VAR).ok()?;
    if launcher_rank().is_some() {
        return None;
    }
    Some(match relaunch(&np) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    })
}

fn relaunch(np: &str) -> Result<ExitCode, String> {
    let processes: usize = np
        .parse()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{NP_VAR}={np}: expected a positive number of MPI processes"))?;
    if !MPI_SUPPORT {
        return Err(format!(
            "{NP_VAR}={np} asks for MPI ranks, but this test binary was built without MPI \
             support: run `cargo test --features mpi` (MPI itself: scripts/install-mpi.sh)"
        ));
    }
    let launcher = std::env::var(MPIRUN_VAR).unwrap_or_else(|_| "mpirun".to_owned());
    let version = Command::new(&launcher)
        .arg("--version")
        .output()
        .map_err(|e| {
            format!(
                "{NP_VAR}={np}: cannot run `{launcher} --version` ({e}): install MPI \
                 (scripts/install-mpi.sh) or name the launcher in {MPIRUN_VAR}"
            )
        })?;
    let text = String::from_utf8_lossy(&version.stdout).into_owned()
        + &String::from_utf8_lossy(&version.stderr);
    let flavour = Flavour::from_version(&text).ok_or_else(|| {
        format!("`{launcher} --version` names neither Open MPI nor MPICH/Hydra: set {MPIRUN_VAR}")
    })?;
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find this test binary to re-launch it: {e}"))?;
    let mut command = Command::new(&launcher);
    command
        .args(flavour.flags(is_root()))
        .arg("-n")
        .arg(processes.to_string())
        .arg(exe)
        .args(std::env::args_os().skip(1).collect::<Vec<OsString>>())
        .env_remove(NP_VAR);
    for setting in pin_settings_for(&["mpi".to_owned()]).expect("mpi is a stack") {
        if setting.current().is_none() {
            command.env(setting.name, setting.value);
        }
    }
    let status = command
        .status()
        .map_err(|e| format!("cannot start `{launcher}`: {e}"))?;
    Ok(ExitCode::from(
        status.code().map_or(1, |c| u8::try_from(c).unwrap_or(1)),
    ))
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
        assert_eq!(
            Flavour::OpenMpi.flags(true),
            ["--oversubscribe", "--allow-run-as-root"]
        );
        assert!(Flavour::Hydra.flags(true).is_empty());
    }
}

//! Re-launching a test binary under `mpirun`, so that cargo can run MPI trials.
//!
//! A cargo `runner` would wrap every test binary; instead a harness binary started with
//! `DETCHECK_NP=N` (and not already under a launcher) starts `mpirun -n N <itself> <its
//! arguments>` and returns its exit code. The launcher, its flags and the MPI settings come from
//! [`MpiLauncher`] (`DETCHECK_MPIRUN`, default `mpirun`; flavour from `--version`).
//!
//! Errors are messages and exit code 2: `DETCHECK_NP` not a positive number, a binary built
//! without the `mpi` feature, a launcher that cannot be started.

use detcheck::check::launcher_rank;
use detcheck::comm::{MpiLauncher, MPI_SUPPORT};
use std::ffi::OsString;
use std::process::ExitCode;

/// The variable that asks for a re-launch: the number of MPI processes.
pub const NP_VAR: &str = "DETCHECK_NP";
/// The variable that names the launcher (default `mpirun`).
pub use detcheck::comm::MPIRUN_VAR;

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
    let launcher = MpiLauncher::from_env().map_err(|e| format!("{NP_VAR}={np}: {e}"))?;
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find this test binary to re-launch it: {e}"))?;
    let mut command = launcher.command(processes);
    command
        .arg(exe)
        .args(std::env::args_os().skip(1).collect::<Vec<OsString>>())
        .env_remove(NP_VAR);
    let status = command
        .status()
        .map_err(|e| format!("cannot start `{}`: {e}", launcher.program))?;
    Ok(ExitCode::from(
        status.code().map_or(1, |c| u8::try_from(c).unwrap_or(1)),
    ))
}

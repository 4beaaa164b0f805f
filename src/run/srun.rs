//! The `srun` launcher's Slurm side: the command line of a job step, cancelling it, and Slurm's
//! words about a step that failed, turned into detcheck's.
//!
//! [`SrunStep`] is one launch: `srun --ntasks=N --job-name=NAME --kill-on-bad-exit=1 [--mpi=pmix]
//! [srun_args] PROGRAM`. Outside an allocation `srun` makes a job of one step; inside one
//! (`SLURM_JOB_ID` set) a step of that job. NAME is unique to the launch (`detcheck-PID-N`), so
//! [`SrunStep::cancel`] finds exactly its own job or step with `squeue` and ends it with
//! `scancel`: killing `srun` alone would leave a pending job queued, or a running step's tasks
//! running on their nodes. `--mpi=pmix` is added when the program is an MPI program
//! ([`is_mpi_program`]: its executable links an MPI library, or its Python script imports mpi4py)
//! and `srun_args` choose no `--mpi` of their own; otherwise the cluster's `MpiDefault` holds.
//!
//! [`SrunWords::read`] reads what `srun` and `slurmstepd` wrote on `srun`'s stderr: a step
//! Slurm cancelled (`*** STEP 4.0 ON vm CANCELLED AT ... DUE TO TIME LIMIT ***`), the tasks that
//! failed (`srun: error: vm: tasks 0-1: Terminated`), a step that could not start (`Unable to
//! allocate resources: ...`, an MPI plugin that does not exist, a program the node cannot
//! execute), and a job still queued (`job 5 queued and waiting for resources`). The runner
//! (`crate::run::process`) makes them exit 2 (cannot start) or exit 3 (failed, killed, or still
//! waiting at the timeout), with these words.
//!
//! Determinism: the command line is a function of the scenario and the launch; cancelling and
//! reading stderr touch no value. Limits: Slurm's English messages of 22.05 (and later, which
//! keep them); a step's tasks on other nodes are asked for nothing but their exit.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

/// The option of `srun` that picks its MPI plugin.
const MPI_OPTION: &str = "--mpi";
/// The start of the words of a program the node cannot execute.
const CANNOT_EXECUTE: &str = "the node cannot execute the program";
/// `DETCHECK_SHARED_DIR`: the folder under which the `srun` launcher makes each launch's
/// folder, seen by every node.
pub(crate) const SHARED_DIR_VAR: &str = "DETCHECK_SHARED_DIR";
/// How many bytes of an executable [`is_mpi_program`] reads, at most: the libraries an ELF
/// file needs are named in its dynamic string table, within its first mebibytes.
const MAX_PROGRAM_BYTES: u64 = 4 << 20;

/// One `srun` launch: its unique name and whether it is a step of the allocation detcheck runs
/// in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SrunStep {
    /// `--job-name`: unique to this launch.
    pub(crate) name: String,
    /// The allocation's job id when detcheck runs inside one (`SLURM_JOB_ID`).
    pub(crate) allocation: Option<String>,
}

impl SrunStep {
    /// A new launch, named after this process and a counter.
    pub(crate) fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        SrunStep {
            name: format!("detcheck-{}-{n}", std::process::id()),
            allocation: std::env::var("SLURM_JOB_ID")
                .ok()
                .filter(|id| !id.is_empty()),
        }
    }

    /// `srun` and its options, before the program.
    pub(crate) fn argv(&self, world_size: usize, srun_args: &[String], mpi: bool) -> Vec<String> {
        let mut argv = vec![
            "srun".to_owned(),
            format!("--ntasks={world_size}"),
            format!("--job-name={}", self.name),
            // One failed task ends the step: its peers would wait in a collective until the
            // timeout otherwise.
            "--kill-on-bad-exit=1".to_owned(),
        ];
        let own_mpi = srun_args
            .iter()
            .any(|a| a == MPI_OPTION || a.starts_with("--mpi="));
        if mpi && !own_mpi {
            argv.push("--mpi=pmix".to_owned());
        }
        argv.extend(srun_args.iter().cloned());
        argv
    }

    /// The job or step ids of this launch, as `squeue` shows them (none when it has ended or
    /// `squeue` cannot be asked).
    fn ids(&self) -> Vec<String> {
        let mut squeue = Command::new("squeue");
        squeue.args(["--noheader", "--format=%i"]);
        squeue.arg(format!("--name={}", self.name));
        if let Some(job) = &self.allocation {
            // A step of our allocation: never the allocation itself (`scancel --name` would
            // match the job, and end the batch script detcheck runs in).
            squeue.args(["--steps", &format!("--jobs={job}")]);
        }
        let Ok(out) = squeue.stderr(Stdio::null()).output() else {
            return Vec::new();
        };
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }

    /// Ends this launch's job or step, queued or running (`scancel` of its ids).
    pub(crate) fn cancel(&self) {
        let ids = self.ids();
        if ids.is_empty() {
            return;
        }
        let _ = Command::new("scancel")
            .arg("--quiet")
            .args(&ids)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    /// Why a job still waits, in Slurm's words (`squeue`'s reason: `Resources`, `Priority`,
    /// `PartitionConfig`, ...), when it still is in the queue.
    pub(crate) fn pending_reason(&self, job: &str) -> Option<String> {
        let out = Command::new("squeue")
            .args(["--noheader", "--format=%T %r", &format!("--jobs={job}")])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        (!text.is_empty()).then_some(text)
    }
}

/// Where the `srun` launcher makes its launch folders: `DETCHECK_SHARED_DIR`, else
/// `$XDG_CACHE_HOME/detcheck`, else `~/.cache/detcheck` (a home folder is on a filesystem every
/// node of a cluster sees), else the temporary folder.
pub(crate) fn shared_launch_root() -> PathBuf {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var(SHARED_DIR_VAR)
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("detcheck")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("detcheck")))
        .unwrap_or_else(std::env::temp_dir)
}

/// Whether `argv` starts an MPI program: its executable (found on `PATH`) names an MPI library
/// (`libmpi`, `libmpich`), or it is a Python interpreter whose script names `mpi4py`.
pub(crate) fn is_mpi_program(argv: &[String], cwd: Option<&Path>) -> bool {
    let Some(program) = argv.first() else {
        return false;
    };
    let Some(path) = find_program(program, cwd) else {
        return false;
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if name.starts_with("python") {
        let script = argv
            .iter()
            .skip(1)
            .find(|a| !a.starts_with('-') && a.ends_with(".py"));
        return script.is_some_and(|s| {
            let at = cwd.map_or_else(|| Path::new(s).to_path_buf(), |c| c.join(s));
            std::fs::read_to_string(at).is_ok_and(|text| text.contains("mpi4py"))
        });
    }
    let Ok(file) = std::fs::File::open(&path) else {
        return false;
    };
    let mut bytes = Vec::new();
    use std::io::Read as _;
    if file
        .take(MAX_PROGRAM_BYTES)
        .read_to_end(&mut bytes)
        .is_err()
    {
        return false;
    }
    // The dynamic string table's names are NUL-terminated: `libmpi.so.40`, `libmpich.so.12`.
    bytes
        .split(|&b| b == 0)
        .any(|name| name.starts_with(b"libmpi.so") || name.starts_with(b"libmpich"))
}

/// `program` as the shell finds it: a path (against `cwd`), or a name on `PATH`.
fn find_program(program: &str, cwd: Option<&Path>) -> Option<std::path::PathBuf> {
    if program.contains('/') {
        let path = cwd.map_or_else(|| Path::new(program).to_path_buf(), |c| c.join(program));
        return path.is_file().then_some(path);
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// What `srun`'s stderr says about a launch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SrunWords {
    /// Slurm cancelled the job or step: the text between `***` (`STEP 4.0 ON vm CANCELLED AT
    /// ... DUE TO TIME LIMIT`).
    pub(crate) cancelled: Option<String>,
    /// The ranks that failed, from `srun`'s list of tasks: `ranks 0-1: Terminated (node vm)`.
    pub(crate) failed_tasks: Vec<String>,
    /// Why the step could not start (`Unable to allocate resources: ...`, an MPI plugin or a
    /// program the node cannot run), in Slurm's words.
    pub(crate) cannot_start: Option<String>,
    /// The job that was queued and waiting for resources, and whether it got them.
    pub(crate) queued: Option<(String, bool)>,
    /// A task could not write a file (`Permission denied`, `Read-only file system`).
    pub(crate) cannot_write: bool,
}

impl SrunWords {
    /// The words of `srun`'s stderr `text`.
    pub(crate) fn read(text: &str) -> Self {
        let mut words = SrunWords::default();
        for line in text.lines().map(str::trim) {
            if let Some(inner) = line
                .split_once("***")
                .and_then(|(_, rest)| rest.rsplit_once("***"))
                .map(|(inner, _)| inner.trim())
            {
                if inner.contains("CANCELLED") {
                    words.cancelled.get_or_insert_with(|| inner.to_owned());
                }
            }
            if let Some(rest) = line.strip_prefix("srun: error: ") {
                if let Some(reason) = rest.strip_prefix("Unable to allocate resources: ") {
                    words
                        .cannot_start
                        .get_or_insert_with(|| format!("Slurm cannot allocate the step: {reason}"));
                } else if rest.starts_with("Invalid MPI type")
                    || rest.starts_with("cannot find mpi plugin")
                {
                    words.cannot_start.get_or_insert_with(|| rest.to_owned());
                } else if let Some((node, tasks)) = rest.split_once(": task") {
                    // `vm: tasks 0-1: Terminated`, `vm: task 1: Exited with exit code 3`: a
                    // task's number is its rank (SLURM_PROCID).
                    let (plural, tasks) = match tasks.strip_prefix('s') {
                        Some(tasks) => ("s", tasks),
                        None => ("", tasks),
                    };
                    words
                        .failed_tasks
                        .push(format!("rank{plural} {} (node {node})", tasks.trim()));
                }
            }
            if line.contains("execve():") {
                // `slurmstepd: error: execve(): nosuch: No such file or directory`
                let what = line.split_once("execve():").map_or(line, |(_, w)| w).trim();
                words
                    .cannot_start
                    .get_or_insert_with(|| format!("{CANNOT_EXECUTE}: {what}"));
            }
            if let Some(rest) = line.strip_prefix("srun: job ") {
                let job = rest
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                if rest.contains("queued and waiting for resources") {
                    words.queued = Some((job, false));
                } else if rest.contains("has been allocated resources") {
                    words.queued = Some((job, true));
                }
            }
            words.cannot_write |=
                line.contains("Permission denied") || line.contains("Read-only file system");
        }
        words
    }

    /// The field of the scenario to blame when the step cannot start: the program, when the
    /// node cannot execute it, else the launcher (its options, the cluster).
    pub(crate) fn field(&self) -> &'static str {
        match &self.cannot_start {
            Some(reason) if reason.starts_with(CANNOT_EXECUTE) => "params.command[0]",
            _ => "params.launcher",
        }
    }

    /// The ranks and Slurm's reason, after "the launcher (srun, pid P) exited with ...".
    pub(crate) fn describe(&self) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(cancelled) = &self.cancelled {
            parts.push(format!("Slurm cancelled it: {cancelled}"));
        }
        if !self.failed_tasks.is_empty() {
            parts.push(self.failed_tasks.join(", "));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_srun_with_the_launchs_options() {
        let step = SrunStep {
            name: "detcheck-1-0".to_owned(),
            allocation: None,
        };
        assert_eq!(
            step.argv(2, &[], true),
            [
                "srun",
                "--ntasks=2",
                "--job-name=detcheck-1-0",
                "--kill-on-bad-exit=1",
                "--mpi=pmix"
            ]
        );
        let own = step.argv(
            2,
            &["--mpi=pmi2".to_owned(), "-p".to_owned(), "gpu".to_owned()],
            true,
        );
        assert!(!own.contains(&"--mpi=pmix".to_owned()));
        assert!(own.ends_with(&["--mpi=pmi2".to_owned(), "-p".to_owned(), "gpu".to_owned()]));
        assert!(!step
            .argv(1, &[], false)
            .iter()
            .any(|a| a.starts_with("--mpi")));
    }

    #[test]
    fn slurms_words_name_the_tasks_and_the_reason() {
        let time_limit = "slurmstepd-vm: error: *** STEP 4.0 ON vm CANCELLED AT \
                          2026-11-26T22:10:48 DUE TO TIME LIMIT ***\n\
                          srun: Job step aborted: Waiting up to 4 seconds for job step to finish.\n\
                          srun: error: vm: tasks 0-1: Terminated\n";
        let words = SrunWords::read(time_limit);
        assert_eq!(
            words.describe().unwrap(),
            "Slurm cancelled it: STEP 4.0 ON vm CANCELLED AT 2026-11-26T22:10:48 DUE TO TIME \
             LIMIT; ranks 0-1: Terminated (node vm)"
        );
        let exit = SrunWords::read("srun: error: vm: task 1: Exited with exit code 3\n");
        assert_eq!(
            exit.failed_tasks,
            ["rank 1: Exited with exit code 3 (node vm)"]
        );
        let busy = SrunWords::read(
            "srun: Requested partition configuration not available now\n\
             srun: job 6 queued and waiting for resources\n\
             srun: error: Unable to allocate resources: Requested nodes are busy\n",
        );
        assert_eq!(
            busy.cannot_start.as_deref(),
            Some("Slurm cannot allocate the step: Requested nodes are busy")
        );
        assert_eq!(busy.queued, Some(("6".to_owned(), false)));
        let waiting = SrunWords::read("srun: job 7 queued and waiting for resources\n");
        assert_eq!(waiting.queued, Some(("7".to_owned(), false)));
        let mpi =
            SrunWords::read("srun: error: Invalid MPI type 'x', --mpi=list for acceptable types\n");
        assert!(mpi.cannot_start.unwrap().starts_with("Invalid MPI type"));
        let exec = SrunWords::read(
            "slurmstepd-vm: error: execve(): nosuch: No such file or directory\n\
             srun: error: vm: task 0: Exited with exit code 2\n",
        );
        assert_eq!(
            exec.cannot_start.as_deref(),
            Some("the node cannot execute the program: nosuch: No such file or directory")
        );
        assert!(SrunWords::read("touch: cannot touch 'x': Permission denied").cannot_write);
        assert_eq!(SrunWords::read("").describe(), None);
    }

    #[test]
    fn mpi_programs_are_told_by_their_libraries_or_mpi4py() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("uses_mpi"), b"\x7fELF\0libmpi.so.40\0").unwrap();
        std::fs::write(d.join("plain"), b"\x7fELF\0libc.so.6\0xlibmpi.so\0").unwrap();
        std::fs::write(d.join("a.py"), "from mpi4py import MPI\n").unwrap();
        std::fs::write(d.join("b.py"), "import torch\n").unwrap();
        let argv = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(is_mpi_program(&argv(&["./uses_mpi"]), Some(d)));
        assert!(!is_mpi_program(&argv(&["./plain"]), Some(d)));
        assert!(!is_mpi_program(&argv(&["./missing"]), Some(d)));
        assert!(!is_mpi_program(&argv(&["sh", "-c", "true"]), Some(d)));
        let python = find_program("python3", None);
        if python.is_some() {
            assert!(is_mpi_program(&argv(&["python3", "-u", "a.py"]), Some(d)));
            assert!(!is_mpi_program(&argv(&["python3", "b.py"]), Some(d)));
        }
    }
}

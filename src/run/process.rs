//! The runner of `command` scenarios: a user's program launched in fresh processes.
//!
//! [`ProcessRunner`] starts the program as its launcher says (`processes`: one child per rank;
//! `mpirun`, `torchrun`, `msrun`, `srun`: one launcher process; `none`: one process for every
//! rank), each launch with a fresh trace folder and the launch environment of `crate::launch`,
//! waits for every process with the scenario's timeout, and reads the trace files back into a
//! [`Trace`], which the checks compare as they compare a built-in kind's.
//!
//! What a launch varies, so that `repeat` catches what a program must not depend on:
//! `PYTHONHASHSEED` (a different value every launch, unless the scenario's `env` sets it: a
//! `set` or `dict` order bug is caught every time, not by luck), the order and stagger in which
//! ranks start (`DETCHECK_LAUNCH`: every launch rotates it, so messages arrive in another order),
//! and the trace folder's path. `MASTER_PORT` is drawn from the launch too (a re-run of one side,
//! which captures a record for the element, gets the port its side had when it is free), as are
//! `PYTHONHASHSEED` and the start order: a divergence that is a function of the launch recurs in
//! the re-run.
//!
//! At one rank, the `processes` launcher sets none of torch.distributed's variables
//! (`rank_failure::TORCH_RANK_VARIABLES`): the program runs as by hand. Every launch runs in a
//! private copy of the working directory (`crate::run::workdir`).
//!
//! The `srun` launcher (`crate::run::srun`) runs a Slurm job step whose tasks may be on other
//! nodes: its launch folder (trace folder and working-directory copy) is made where every node
//! sees it, under `DETCHECK_SHARED_DIR` (default `~/.cache/detcheck`, a home folder being shared
//! on clusters), and each task gets `MASTER_PORT` only: its rank, world and `MASTER_ADDR` are
//! Slurm's (`crate::launch::slurm`, set by the Python start-up hook). Its job or step is
//! cancelled (`scancel`) when the launch is killed, and Slurm's reason for a failure is the
//! error's.
//!
//! The `msrun` launcher (`crate::run::msrun`) runs MindSpore's launcher: its workers' ranks are
//! their `RANK_ID`s, their output goes to msrun's logs in the launch folder (read for the words
//! of a failure), and they are killed by their pid files (as torchrun's are), msrun starting each
//! in a session of its own.
//!
//! Failure: a process that exits non-zero or is killed, a launch that outlives its timeout, and a
//! rank that writes no trace or a broken one fail the run ([`RunError::ProgramFailed`], exit 3)
//! with the rank, the exit status and the rank's own traceback or stacks
//! (`crate::run::rank_failure`), else the tail of its stderr; an executable or launcher that
//! cannot be started is bad input ([`RunError::CannotLaunch`], exit 2). Every child leads its own
//! process group, and the whole group is killed on failure, timeout or drop: nothing is left
//! running.
//!
//! Invariant (nothing is left running): every launched process leads its own process group; a
//! failure, a timeout or an early return kills every group of the launch, then every rank its pid
//! files name (torchrun's agent and msrun start their workers in sessions of their own).
//!
//! Determinism: what a launch receives is a function of the request (spec, run, perturbation,
//! plan); only timing depends on the machine, and the run id of its trace files
//! (`DETCHECK_RUN_ID`), which is fresh for every launch so that two launches' files never pass
//! for one dump (`run::fresh_run_id`).

use crate::file::{load_trace, DumpMode};
use crate::launch::{
    all_settings, no_records_note, setting_names, settings_mask, shell_quote, InsideRequest,
    Launch, RankFiles, RecordMode, RecorderPlan,
};
use crate::record::hints::{self, Subject};
use crate::record::{RecordLevel, Trace};
use crate::run::msrun::MsrunJob;
use crate::run::rank_failure::{
    msrun_hint, stuck_ranks, wrong_path_hint, RankErrors, TORCH_RANK_VARIABLES,
};
use crate::run::srun::{is_mpi_program, shared_launch_root, SrunStep, SrunWords};
use crate::run::workdir::Workdir;
use crate::run::{fresh_run_id, RunError, RunRequest, Runner};
use crate::scenario::command::{substitute, CommandProgram, Launcher, TemplateValues};
use crate::scenario::{LoadedScenario, Program};
use crate::value::seed::{derive_stream, Stream};
use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The user stream that derives each launch's `PYTHONHASHSEED`.
const HASH_SEED_STREAM: u64 = 0x5059_4841_5348; // "PYHASH"
/// The user stream that derives each launch's `MASTER_PORT`.
const PORT_STREAM: u64 = 0x504f_5254; // "PORT"
/// The ports a launch draws from: above the well-known and registered ranges most services
/// use, below Linux's default ephemeral range (32768-60999), where the OS hands out ports.
const PORT_RANGE: (u16, u16) = (20_000, 32_000);
/// How many drawn ports a launch tries before it takes any free one.
const PORT_DRAWS: usize = 8;
/// How many bytes of a failed process's stderr (or of what a run that recorded nothing
/// printed) are shown, at most.
const STDERR_TAIL: u64 = 4096;
/// How many lines of it.
const STDERR_LINES: usize = 20;
/// How many bytes of the start and of the end of `srun`'s stderr are read for Slurm's words.
const SRUN_WORDS: u64 = 64 << 10;

/// Launches `command` scenarios (see the module doc).
pub(crate) struct ProcessRunner;

impl Runner for ProcessRunner {
    fn run(&self, scenario: &LoadedScenario, request: &RunRequest) -> Result<Trace, RunError> {
        let Program::Command(command) = &scenario.program else {
            return Err(RunError::CannotLaunch {
                scenario: request.name.clone(),
                field: "kind".to_owned(),
                message: "only a `command` scenario runs in its own processes".to_owned(),
            });
        };
        CommandLaunch::new(command, request)?.run()
    }

    fn is_mpi(&self) -> bool {
        false
    }
}

/// A folder of this process's, removed when dropped.
struct TempFolder(PathBuf);

impl TempFolder {
    /// A fresh folder `detcheck-WHAT-PID-N` in `parent`.
    fn new_in(parent: &Path, what: &str) -> std::io::Result<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = parent.join(format!("detcheck-{what}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Ok(TempFolder(dir))
    }
}

impl Drop for TempFolder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One launched process: the rank it is (when it is one rank), the child, its stderr file.
struct Process {
    rank: Option<usize>,
    /// What the process is when it is no single rank: `program` or `launcher`.
    label: &'static str,
    child: Child,
    stderr: PathBuf,
    status: Option<ExitStatus>,
    /// The Slurm job or step of an `srun` launcher, cancelled with the process.
    srun: Option<SrunStep>,
    /// The job of an `msrun` launcher, whose workers are killed with the process.
    msrun: Option<MsrunJob>,
}

impl Process {
    /// Kills the process's whole group (it leads it), then reaps it. The group is killed even
    /// when the process has ended: what it started and left running (a rank a launcher started,
    /// whose launcher failed first, waiting for it in `init_process_group`) must not outlive the
    /// launch. The kernel keeps a group's id from reuse while a member lives.
    fn kill(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            if self.status.is_none() {
                if let Some(step) = &self.srun {
                    // First the job or step: its tasks run under slurmstepd, not under srun.
                    step.cancel();
                }
            }
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if self.status.is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
    }

    fn who(&self) -> String {
        match self.rank {
            Some(rank) => format!("rank {rank} (pid {})", self.child.id()),
            None => format!("the {} (pid {})", self.label, self.child.id()),
        }
    }
}

/// Kills every process still running when a launch ends (a failure, a timeout, a panic), then
/// the ranks that the launch's pid files name (its trace folder and world size): torchrun's
/// agent and msrun start their workers in sessions of their own, outside the process groups
/// killed first (`rank_failure::kill_ranks`; a rank that ended normally removed its pid file).
struct Processes(Vec<Process>, PathBuf, u32);

impl Drop for Processes {
    fn drop(&mut self) {
        for p in &mut self.0 {
            p.kill();
        }
        crate::run::rank_failure::kill_ranks(&self.1, self.2);
    }
}

/// One launch of a command: what to start and where its files go.
struct CommandLaunch<'a> {
    command: &'a CommandProgram,
    request: &'a RunRequest,
    /// The launch's own folder: logs, and the trace folder unless the run dumps elsewhere.
    folder: TempFolder,
    trace_dir: PathBuf,
    world_size: usize,
    /// Where the processes run: the private copy of the working directory, or (`None`) the
    /// working directory itself.
    cwd: Option<PathBuf>,
}

impl<'a> CommandLaunch<'a> {
    fn new(command: &'a CommandProgram, request: &'a RunRequest) -> Result<Self, RunError> {
        // Where every rank can write: a folder all nodes see for a Slurm step.
        let parent = if command.launcher == Launcher::Srun {
            shared_launch_root()
        } else {
            std::env::temp_dir()
        };
        let folder = std::fs::create_dir_all(&parent)
            .and_then(|()| TempFolder::new_in(&parent, "launch"))
            .map_err(|e| RunError::ProgramFailed {
                scenario: request.name.clone(),
                run: request.run,
                message: format!(
                    "cannot create a folder for the launch in {}: {e}",
                    parent.display()
                ),
            })?;
        // Absolute: the program runs in another folder (`crate::run::workdir`).
        let trace_dir = match &request.dump {
            Some(target) => absolute(&target.dir),
            None => folder.0.join("trace"),
        };
        std::fs::create_dir_all(&trace_dir).map_err(|e| RunError::ProgramFailed {
            scenario: request.name.clone(),
            run: request.run,
            message: format!("cannot create {}: {e}", trace_dir.display()),
        })?;
        Ok(CommandLaunch {
            command,
            request,
            trace_dir,
            folder,
            world_size: request.spec.world_size,
            cwd: None,
        })
    }

    fn failed(&self, message: String) -> RunError {
        RunError::ProgramFailed {
            scenario: self.request.name.clone(),
            run: self.request.run,
            message,
        }
    }

    fn mode(&self) -> DumpMode {
        match (&self.request.dump, self.request.record_level) {
            (Some(target), _) => target.mode,
            (None, RecordLevel::Stats) => DumpMode::Stats,
            (None, _) => DumpMode::Md5,
        }
    }

    /// The template values of a process (`rank`: the `processes` launcher's rank).
    fn values(&self, rank: Option<usize>) -> TemplateValues {
        let plan = &self.request.plan;
        TemplateValues {
            seed: self.request.spec.seed,
            steps: self.request.spec.steps,
            world_size: self.world_size,
            rank,
            scenario_dir: self.command.scenario_dir.clone(),
            step: plan.stop_at,
            dir: plan
                .checkpoint_to
                .as_deref()
                .or(plan.resume_from.as_deref())
                .map(absolute),
            // The `batch_sizes` check's size; every other run is at the first.
            batch: plan
                .batch_size
                .or(self.request.spec.batch_sizes.first().copied()),
        }
    }

    /// The program's arguments for a process: the command, then the restart arguments this run
    /// asks for (stop and checkpoint, or resume).
    fn argv(&self, rank: Option<usize>) -> Vec<String> {
        let values = self.values(rank);
        let plan = &self.request.plan;
        let mut argv: Vec<String> = self
            .command
            .command
            .iter()
            .map(|a| substitute(a, &values))
            .collect();
        if let Some(restart) = &self.command.restart {
            if plan.checkpoint_to.is_some() {
                argv.extend(restart.stop.iter().map(|a| substitute(a, &values)));
            } else if plan.resume_from.is_some() {
                argv.extend(restart.resume.iter().map(|a| substitute(a, &values)));
            }
        }
        argv
    }

    /// The program as `detcheck run` takes it, shell-quoted: its flags and its command (the
    /// environment's `site:program`, which `compare --align` prints in its commands).
    fn as_run_takes_it(&self) -> String {
        let spec = &self.request.spec;
        let mut words = vec![
            format!("--ranks {}", self.world_size),
            format!("--steps {}", spec.steps),
            format!("--seed {}", spec.seed),
            format!("--launcher {}", self.command.launcher.name()),
        ];
        if !self.command.srun_args.is_empty() {
            let options = self.command.srun_args.join(" ");
            words.push(format!("--srun-args {}", shell_quote(&options)));
        }
        if self.command.deterministic {
            words.push("--deterministic".to_owned());
        }
        words.push("--".to_owned());
        let values = self.values(None);
        words.extend(
            self.command
                .command
                .iter()
                .map(|a| shell_quote(&substitute(a, &values))),
        );
        words.join(" ")
    }

    /// `PYTHONHASHSEED` of this launch: a different value for each run of a check.
    /// The mask of the deterministic settings this launch applies (`RecorderPlan`).
    fn deterministic_settings(&self) -> u32 {
        match (
            &self.command.deterministic,
            &self.command.deterministic_only,
        ) {
            (false, _) => 0,
            (true, None) => all_settings(),
            (true, Some(names)) => settings_mask(names.iter().map(String::as_str)).unwrap_or(0),
        }
    }

    fn hash_seed(&self) -> String {
        let (seed, launch) = self
            .request
            .perturbation
            .map_or((self.request.spec.seed, 0), |p| (p.seed, p.rotation as u64));
        derive_stream(seed, Stream::User(HASH_SEED_STREAM), launch, 0)
            .below(1 << 32)
            .to_string()
    }

    /// `MASTER_PORT` of this launch: a port drawn from the launch (the run's perturbation, as
    /// `PYTHONHASHSEED`, and the scenario), so a re-run of a side for its element gets the port
    /// its side had; the next draw when that one is taken, and any free port after
    /// [`PORT_DRAWS`] draws. The draw also depends on this process's id, so that two detcheck
    /// processes checking one scenario at once (CI jobs on one machine) draw different ports:
    /// a re-run is always made by the process that made the check.
    fn master_port(&self, fingerprint: &str) -> std::io::Result<u16> {
        let (seed, launch) = self
            .request
            .perturbation
            .map_or((self.request.spec.seed, 0), |p| (p.seed, p.rotation as u64));
        let scenario = u64::from_str_radix(fingerprint.get(..16).unwrap_or("0"), 16).unwrap_or(0);
        let mut draws = derive_stream(
            seed ^ scenario,
            Stream::User(PORT_STREAM),
            launch,
            u64::from(std::process::id()),
        );
        for _ in 0..PORT_DRAWS {
            let port = PORT_RANGE.0 + draws.below(u64::from(PORT_RANGE.1 - PORT_RANGE.0)) as u16;
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
        free_port()
    }

    /// Whether the launch runs its one process as its user runs it by hand: one rank of the
    /// `processes` launcher, which gets none of torch.distributed's variables
    /// ([`TORCH_RANK_VARIABLES`]).
    fn runs_as_by_hand(&self) -> bool {
        self.command.launcher == Launcher::Processes && self.world_size == 1
    }

    /// The words of a failed launch, after `who exited with status`: the ranks' own
    /// tracebacks (the root cause first) where their start-up hook left them, else the tail of
    /// the failed process's stderr; and, at one rank, the hint for a script written for
    /// torchrun.
    fn failure_words(&self, stderr: &Path, msrun: Option<&MsrunJob>) -> String {
        let errors = RankErrors::read(&self.trace_dir, self.world_size as u32);
        let mut words = match errors.describe() {
            Some(words) => format!(": {words}"),
            // msrun's workers write into its logs, not onto its stderr.
            None => msrun
                .and_then(MsrunJob::failed_worker_log)
                .unwrap_or_else(|| stderr_tail(stderr)),
        };
        if self.runs_as_by_hand() {
            let text = errors
                .0
                .first()
                .map_or_else(|| stderr_tail(stderr), |e| e.exception().to_owned());
            words.push_str(&wrong_path_hint(&text).unwrap_or_default());
        }
        if self.command.launcher == Launcher::Processes {
            let text = errors
                .0
                .first()
                .map_or_else(|| stderr_tail(stderr), |e| e.traceback().to_owned());
            words.push_str(&msrun_hint(&text).unwrap_or_default());
        }
        words
    }

    /// A process of this launch with nothing of a launcher's own (no variables, no `srun`
    /// step, no `msrun` job): [`Self::process`].
    fn plain_process(
        &self,
        argv: &[String],
        launch: &Launch,
        rank: Option<usize>,
        master_port: u16,
    ) -> Result<Process, RunError> {
        self.process(argv, launch, rank, master_port, &[], None, None)
    }

    /// A process of this launch: `argv` with the launch environment (and, with the
    /// `processes` launcher, its rank's; with the `msrun` launcher, its job's).
    #[allow(clippy::too_many_arguments)]
    fn process(
        &self,
        argv: &[String],
        launch: &Launch,
        rank: Option<usize>,
        master_port: u16,
        launcher_env: &[(String, String)],
        srun: Option<SrunStep>,
        msrun: Option<MsrunJob>,
    ) -> Result<Process, RunError> {
        let values = self.values(rank);
        let mut cmd = Command::new(&argv[0]);
        if let Some(cwd) = &self.cwd {
            cmd.current_dir(cwd).env("PWD", cwd);
        }
        for (name, value) in launcher_env {
            cmd.env(name, value);
        }
        cmd.args(&argv[1..])
            .stdin(Stdio::null())
            .process_group(0)
            .env_remove("DETCHECK_NP");
        for (name, value) in launch.to_env() {
            cmd.env(name, value);
        }
        if let Some((capture, dir)) = &self.request.capture {
            for (name, value) in capture.to_env(&absolute(dir)) {
                cmd.env(name, value);
            }
        }
        if let Some(inside) = &self.request.inside {
            let inside = InsideRequest {
                replay_from: inside.replay_from.as_deref().map(absolute),
            };
            for (name, value) in inside.to_env() {
                cmd.env(name, value);
            }
        }
        if self.runs_as_by_hand() {
            // `python train.py`, as its user runs it by hand: a script that picks DDP by the
            // presence of `RANK` takes its one-process path; one that creates a process group
            // anyway gets a world of one from the start-up hook (`detcheck._launch.single_rank`).
            for name in TORCH_RANK_VARIABLES {
                cmd.env_remove(name);
            }
        } else if self.command.launcher == Launcher::Srun {
            // Each task's rank, world and first node are Slurm's (`crate::launch::slurm`, set
            // by the Python start-up hook); the port is the launch's.
            for name in TORCH_RANK_VARIABLES {
                cmd.env_remove(name);
            }
            cmd.env("MASTER_PORT", master_port.to_string());
        } else {
            cmd.env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", master_port.to_string())
                .env("WORLD_SIZE", self.world_size.to_string());
            if let Some(rank) = rank {
                cmd.env("RANK", rank.to_string())
                    .env("LOCAL_RANK", rank.to_string())
                    .env("LOCAL_WORLD_SIZE", self.world_size.to_string());
            }
        }
        self.recorder_env(&mut cmd, &values);
        let tag = rank.map_or_else(|| "launcher".to_owned(), |r| format!("rank{r}"));
        let log = |stream: &str| -> Result<(File, PathBuf), RunError> {
            let path = self.output_path(&tag, stream);
            let file = File::create(&path)
                .map_err(|e| self.failed(format!("cannot create {}: {e}", path.display())))?;
            Ok((file, path))
        };
        let (stdout, _) = log("stdout")?;
        let (stderr, stderr_path) = log("stderr")?;
        cmd.stdout(stdout).stderr(stderr);
        let child = cmd.spawn().map_err(|e| {
            let field = if self.command.launcher == Launcher::Processes
                || self.command.launcher == Launcher::None
            {
                "params.command[0]".to_owned()
            } else {
                "params.launcher".to_owned()
            };
            let hint = if self.command.launcher == Launcher::Srun {
                " (the `srun` launcher needs Slurm's client on PATH: run detcheck on a \
                 cluster's login node or inside an allocation; on one machine, \
                 `bash scripts/slurm-local.sh start` installs and starts a one-node Slurm: \
                 docs/slurm.md)"
            } else if self.command.launcher == Launcher::Msrun {
                " (the `msrun` launcher runs `python SCRIPT` under that Python's MindSpore \
                 (`python -m mindspore.parallel.cluster.run`), anything else under the `msrun` \
                 on PATH: install MindSpore, `pip install mindspore`: docs/mindspore.md)"
            } else {
                ""
            };
            RunError::CannotLaunch {
                scenario: self.request.name.clone(),
                field,
                message: format!("cannot start `{}`: {e}{hint}", argv[0]),
            }
        })?;
        Ok(Process {
            rank,
            label: if self.command.launcher == Launcher::None {
                "program"
            } else {
                "launcher"
            },
            child,
            stderr: stderr_path,
            status: None,
            srun,
            msrun,
        })
    }

    /// What the program's recorder is asked (`RecorderPlan`: the steps, the deterministic
    /// settings, what it records; the `batch_sizes` drill-down's `DETCHECK_ROWS_INSIDE`), the
    /// hash seed, the settings' launch variables, then the scenario's own `params.env`.
    fn recorder_env(&self, cmd: &mut Command, values: &TemplateValues) {
        let plan = RecorderPlan {
            stop_after: self
                .command
                .stop_after_steps
                .then_some(self.request.spec.steps),
            deterministic: self.deterministic_settings(),
            record: if self.request.plan.batch_size.is_some() {
                // The `batch_sizes` check: each sample's rows, at step = the sample.
                RecordMode::Rows
            } else if self.request.unperturbed {
                RecordMode::EndState
            } else if self.request.dump.is_some() && self.request.inside.is_none() {
                // `run --dump`: the dump is read by `compare --align`, which needs each
                // module's input where code between modules made it.
                RecordMode::Flow
            } else {
                RecordMode::All
            },
        };
        for (name, value) in plan.to_env() {
            cmd.env(name, value);
        }
        if let Some(inside) = &self.request.plan.rows_inside {
            cmd.env(crate::launch::ROWS_INSIDE_VAR, inside);
        }
        let hash_seed_pinned = setting_names(plan.deterministic).contains(&"PYTHONHASHSEED");
        if !self.command.env.contains_key("PYTHONHASHSEED") && !hash_seed_pinned {
            cmd.env("PYTHONHASHSEED", self.hash_seed());
        }
        if self.command.deterministic {
            // The launch variables of `hints::deterministic()` asked for, unless the scenario
            // sets them.
            let asked = setting_names(plan.deterministic);
            for hint in hints::deterministic().filter(|h| h.subject == Subject::Setting) {
                if asked.contains(&hint.name) && !self.command.env.contains_key(hint.name) {
                    cmd.env(hint.name, hint.value);
                }
            }
        }
        for (name, value) in &self.command.env {
            cmd.env(name, substitute(value, values));
        }
    }

    /// Starts every process of the launch, in this launch's rank order.
    fn start(&self) -> Result<Processes, RunError> {
        let start_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        let rotation = self.request.perturbation.map_or(0, |p| p.rotation);
        let fingerprint = self.request.spec.fingerprint();
        let master_port = self
            .master_port(&fingerprint)
            .map_err(|e| self.failed(format!("no free port: {e}")))?;
        let launch = Launch {
            trace_dir: self.trace_dir.clone(),
            world_size: self.world_size as u32,
            rank: None,
            seed: self.request.spec.seed,
            steps: self.request.spec.steps,
            mode: self.mode(),
            // A perturbed run (a check's) staggers its ranks' starts; a plain run does not.
            start: self
                .request
                .perturbation
                .map(|_| (rotation as u32, start_ms)),
            run_id: Some(fresh_run_id(self.request, &fingerprint)),
            launcher: Some(self.command.launcher.name().to_owned()),
            fingerprint: Some(fingerprint),
            mpi_library: None,
            program: Some(self.as_run_takes_it()),
        };

        let mut processes = Processes(Vec::new(), self.trace_dir.clone(), self.world_size as u32);
        match self.command.launcher {
            Launcher::Processes => {
                self.start_ranks(&launch, rotation, master_port, &mut processes)?;
            }
            Launcher::None => {
                let argv = self.argv(None);
                processes
                    .0
                    .push(self.plain_process(&argv, &launch, None, master_port)?);
            }
            Launcher::Mpirun => processes.0.push(self.mpirun_process(launch, master_port)?),
            Launcher::Srun => processes.0.push(self.srun_process(&launch, master_port)?),
            Launcher::Msrun => processes.0.push(self.msrun_process(&launch, master_port)?),
            Launcher::Torchrun => processes
                .0
                .push(self.torchrun_process(&launch, master_port)?),
        }
        Ok(processes)
    }

    /// The `processes` launcher: one process per rank, started into `processes` in the launch's
    /// order rotated by `rotation`.
    fn start_ranks(
        &self,
        launch: &Launch,
        rotation: usize,
        master_port: u16,
        processes: &mut Processes,
    ) -> Result<(), RunError> {
        // Spawn in the launch's rotated order too: another start order every launch.
        for slot in 0..self.world_size {
            let rank = (slot + self.world_size - rotation % self.world_size) % self.world_size;
            let launch = Launch {
                rank: Some(rank as u32),
                ..launch.clone()
            };
            let argv = self.argv(Some(rank));
            processes
                .0
                .push(self.plain_process(&argv, &launch, Some(rank), master_port)?);
        }
        Ok(())
    }

    /// The `mpirun` launcher's process: the MPI library's launcher, its pinning settings, then
    /// the program.
    fn mpirun_process(&self, launch: Launch, master_port: u16) -> Result<Process, RunError> {
        let mpirun = crate::comm::MpiLauncher::from_env().map_err(|e| RunError::CannotLaunch {
            scenario: self.request.name.clone(),
            field: "params.launcher".to_owned(),
            message: e.to_string(),
        })?;
        let launch = Launch {
            mpi_library: Some(mpirun.library.clone()),
            ..launch
        };
        // The launcher's program, flags and MPI pinning settings, then the program.
        let mpirun = mpirun.command(self.world_size);
        let mut argv: Vec<String> = std::iter::once(mpirun.get_program())
            .chain(mpirun.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        argv.extend(self.argv(None));
        let pinned: Vec<(String, String)> = mpirun
            .get_envs()
            .filter_map(|(k, v)| {
                Some((
                    k.to_string_lossy().into_owned(),
                    v?.to_string_lossy().into_owned(),
                ))
            })
            .collect();
        self.process(&argv, &launch, None, master_port, &pinned, None, None)
    }

    /// The `srun` launcher's process: a job step of the allocation running the program.
    fn srun_process(&self, launch: &Launch, master_port: u16) -> Result<Process, RunError> {
        let step = SrunStep::new();
        let program = self.argv(None);
        let mpi = is_mpi_program(&program, self.cwd.as_deref());
        let mut argv = step.argv(self.world_size, &self.command.srun_args, mpi);
        argv.extend(program);
        self.process(&argv, launch, None, master_port, &[], Some(step), None)
    }

    /// The `msrun` launcher's process: MindSpore's launcher, after checking that its Python has
    /// MindSpore.
    fn msrun_process(&self, launch: &Launch, master_port: u16) -> Result<Process, RunError> {
        let job = MsrunJob::new(&self.folder.0, self.world_size);
        let msrun = job
            .command(
                &self.argv(None),
                master_port,
                self.command.timeout.as_secs(),
                &self.folder.0.join("msrun-bin"),
                is_python,
            )
            .map_err(|e| self.failed(format!("cannot prepare the msrun launch: {e}")))?;
        if let Some(python) = &msrun.python {
            self.check_mindspore(python)?;
        }
        self.process(
            &msrun.argv,
            launch,
            None,
            master_port,
            &msrun.env,
            None,
            Some(job),
        )
    }

    /// The `torchrun` launcher's process: torchrun on one node, the ranks on this machine.
    fn torchrun_process(&self, launch: &Launch, master_port: u16) -> Result<Process, RunError> {
        let program = self.argv(None);
        // `python train.py`: torchrun of that very Python (`python -m
        // torch.distributed.run`), so the ranks run in the program's environment;
        // anything else goes to the `torchrun` on PATH, which runs a script itself.
        let (mut argv, script) = match program.split_first() {
            Some((python, rest)) if is_python(python) => (
                vec![
                    python.clone(),
                    "-m".to_owned(),
                    "torch.distributed.run".to_owned(),
                ],
                rest.to_vec(),
            ),
            _ => (vec!["torchrun".to_owned()], program),
        };
        argv.extend([
            "--nnodes=1".to_owned(),
            format!("--nproc-per-node={}", self.world_size),
            "--master-addr=127.0.0.1".to_owned(),
            format!("--master-port={master_port}"),
        ]);
        argv.extend(script);
        self.plain_process(&argv, launch, None, master_port)
    }

    /// Whether `python` can import MindSpore, which the `msrun` launcher runs it under: bad
    /// input (exit 2, naming the launcher) when it cannot. Finds the module without importing
    /// it.
    fn check_mindspore(&self, python: &str) -> Result<(), RunError> {
        let found = Command::new(python)
            .args([
                "-c",
                "import importlib.util, sys; sys.exit(importlib.util.find_spec('mindspore') is None)",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .env_remove(crate::launch::TRACE_DIR_VAR)
            .status();
        let cannot = |field: &str, message: String| RunError::CannotLaunch {
            scenario: self.request.name.clone(),
            field: field.to_owned(),
            message,
        };
        match found {
            Ok(status) if status.success() => Ok(()),
            Ok(_) => Err(cannot(
                "params.launcher",
                format!(
                    "the `msrun` launcher runs MindSpore's msrun of the program's Python, and \
                     `{python}` has no `mindspore` module: install MindSpore there (`pip \
                     install mindspore`; docs/mindspore.md), or run a Python that has it"
                ),
            )),
            Err(e) => Err(cannot(
                "params.command[0]",
                format!("cannot start `{python}`: {e}"),
            )),
        }
    }

    /// Why ranks left no trace, as far as the launch can tell: the notes of the Python
    /// start-up hook (`rank{R}.no-records.txt`: Python ran, but nothing was recorded), or,
    /// where no rank has a trace or a note, that no Python with detcheck ran at all.
    fn why_no_trace(&self) -> String {
        let mut notes = String::new();
        let mut silent = 0;
        for rank in 0..self.world_size as u32 {
            if crate::file::trace_path(&self.trace_dir, rank).exists() {
                continue;
            }
            match std::fs::read_to_string(no_records_note(&self.trace_dir, rank)) {
                Ok(note) => {
                    let note = note.lines().next().unwrap_or_default().trim();
                    notes.push_str(&format!("\n    rank {rank}: {note}"));
                }
                Err(_) => silent += 1,
            }
        }
        if silent == self.world_size {
            return " (no rank wrote a trace, and detcheck's Python start-up hook ran in none: a \
                    program records itself with detcheck's TraceWriter into $DETCHECK_TRACE_DIR, \
                    or is a Python program that uses PyTorch, run by a Python that has the \
                    detcheck package installed, which records it without a change)"
                .to_owned();
        }
        if notes.is_empty() {
            return " (the program must write one trace file per rank into $DETCHECK_TRACE_DIR, \
                    with detcheck's TraceWriter)"
                .to_owned();
        }
        format!("; detcheck's Python start-up hook recorded nothing:{notes}")
    }

    /// What the first process printed last (the launcher's output, which carries its ranks',
    /// or rank 0's), for a run that exited 0 having recorded nothing: a program often says
    /// why it did not train ("Unable to locate sufficient 2 gpus ... Exiting."). Empty when it
    /// printed nothing.
    fn first_output(&self) -> String {
        let tag = ["launcher", "rank0"]
            .into_iter()
            .find(|tag| self.output_path(tag, "stdout").exists())
            .unwrap_or("rank0");
        let whose = if tag == "launcher" {
            "the launcher's"
        } else {
            "rank 0's"
        };
        ["stdout", "stderr"]
            .into_iter()
            .filter_map(|stream| {
                output_tail(&self.output_path(tag, stream), &format!("{whose} {stream}"))
            })
            .collect()
    }

    /// Where a process of the launch writes one output stream: `{tag}.{stream}` in the
    /// launch's folder (`tag`: `launcher` or `rank{R}`; `stream`: `stdout` or `stderr`).
    fn output_path(&self, tag: &str, stream: &str) -> PathBuf {
        self.folder.0.join(format!("{tag}.{stream}"))
    }

    /// Launches, waits, reads the traces. The processes run in a private copy of the working
    /// directory (`crate::run::workdir`), so that no launch sees another's files and the
    /// user's folder is not written; the user's files a launch changed anyway are named in
    /// every rank's environment (`detcheck.workdir`).
    fn run(mut self) -> Result<Trace, RunError> {
        // Not the system's temporary folder or the root: too large to mirror, and not a
        // project's folder. The mirror goes beside the launch's folder (for srun, where every
        // node sees it), and is kept for the next launch from the same folder.
        let parent = self.folder.0.parent().map(Path::to_path_buf);
        let workdir = std::env::current_dir()
            .ok()
            .filter(|dir| dir.parent().is_some() && *dir != std::env::temp_dir())
            .zip(parent)
            .and_then(|(dir, parent)| Workdir::lend(&dir, &parent).ok());
        self.cwd = workdir.as_ref().map(|w| w.path().to_path_buf());
        let mut trace = self.launch_and_wait()?;
        if let Some(words) = workdir.as_ref().and_then(|w| w.changed_originals()) {
            for rank in &mut trace.ranks {
                rank.environment
                    .get_or_insert_with(Default::default)
                    .set(super::WORKDIR_KEY, words.clone());
            }
        }
        Ok(trace)
    }

    /// Launches, waits, reads the traces.
    fn launch_and_wait(&self) -> Result<Trace, RunError> {
        let mut processes = self.start()?;
        let deadline = Instant::now() + self.command.timeout;
        let mut first_failure: Option<usize> = None;
        loop {
            let mut running = false;
            for (i, p) in processes.0.iter_mut().enumerate() {
                if p.status.is_some() {
                    continue;
                }
                match p.child.try_wait() {
                    Ok(Some(status)) => {
                        p.status = Some(status);
                        if !status.success() && first_failure.is_none() {
                            first_failure = Some(i);
                        }
                    }
                    Ok(None) => running = true,
                    Err(e) => return Err(self.failed(format!("cannot wait for {}: {e}", p.who()))),
                }
            }
            if let Some(i) = first_failure {
                for p in &mut processes.0 {
                    p.kill();
                }
                let p = &processes.0[i];
                let status = p.status.map_or_else(|| "?".to_owned(), describe_status);
                let mut slurm = String::new();
                if p.srun.is_some() {
                    let words = SrunWords::read(&head_and_tail(&p.stderr));
                    if let Some(reason) = &words.cannot_start {
                        return Err(RunError::CannotLaunch {
                            scenario: self.request.name.clone(),
                            field: words.field().to_owned(),
                            message: format!(
                                "srun cannot start the step: {reason}{}",
                                stderr_tail(&p.stderr)
                            ),
                        });
                    }
                    if let Some(described) = words.describe() {
                        slurm = format!(": {described}");
                    }
                    if words.cannot_write {
                        slurm.push_str(&self.shared_folder_hint());
                    }
                }
                return Err(self.failed(format!(
                    "{} exited with {status}{slurm}{}",
                    p.who(),
                    self.failure_words(&p.stderr, p.msrun.as_ref())
                )));
            }
            if !running {
                break;
            }
            if Instant::now() >= deadline {
                let still: Vec<String> = processes
                    .0
                    .iter()
                    .filter(|p| p.status.is_none())
                    .map(Process::who)
                    .collect();
                // The ranks' own stacks where their start-up hook can give them (asked before
                // anything is killed); else the tail of a running process's stderr.
                let waiting = processes
                    .0
                    .iter()
                    .filter(|p| p.status.is_none())
                    .find_map(|p| {
                        let step = p.srun.as_ref()?;
                        let words = SrunWords::read(&head_and_tail(&p.stderr));
                        match words.queued {
                            Some((job, false)) => Some(format!(
                                "; srun was still waiting for resources: Slurm job {job} {}",
                                step.pending_reason(&job).map_or_else(
                                    || "was queued".to_owned(),
                                    |r| format!("is {r} (state, reason)")
                                )
                            )),
                            _ => None,
                        }
                    });
                let words = match (
                    waiting,
                    stuck_ranks(&self.trace_dir, self.world_size as u32),
                ) {
                    (Some(waiting), _) => waiting,
                    (None, Some(ranks)) => format!("; {ranks}"),
                    (None, None) => processes
                        .0
                        .iter()
                        .find(|p| p.status.is_none())
                        .map(|p| stderr_tail(&p.stderr))
                        .unwrap_or_default(),
                };
                for p in &mut processes.0 {
                    p.kill();
                }
                return Err(self.failed(format!(
                    "{} still running after the timeout of {:?} (params.timeout_secs); killed{words}",
                    still.join(", "),
                    self.command.timeout
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(processes);
        let ranks = self.ranks_found();
        for rank in 0..ranks {
            // Read: a dump holds the traces and nothing else. A rank whose process started
            // its worker (`mp.spawn`) left a note that it recorded nothing; the worker's trace
            // is the rank's.
            let _ = std::fs::remove_file(RankFiles::new(&self.trace_dir, rank).started);
            if crate::file::trace_path(&self.trace_dir, rank).exists() {
                let _ = std::fs::remove_file(no_records_note(&self.trace_dir, rank));
            }
        }
        load_trace(&self.trace_dir, ranks).map_err(|e| {
            let shared = if self.command.launcher == Launcher::Srun {
                self.shared_folder_hint()
            } else {
                String::new()
            };
            self.failed(format!(
                "every process exited 0, but the traces cannot be read: {e}{}{shared}{}",
                self.why_no_trace(),
                self.first_output()
            ))
        })
    }

    /// The ranks the launch had: its world, or more where the program started ranks of its
    /// own (`torch.multiprocessing.spawn`, Lightning's `devices=N`), each of which the Python
    /// start-up hook recorded as the rank its process group gave it and marked
    /// (`RankFiles::started`; python/python/detcheck/_launch/startup.py); at most `MAX_WORLD_SIZE`.
    /// Trace files of ranks beyond the world that no such process wrote (copied from another
    /// dump) leave the world as launched, and its traces then fail to load.
    fn ranks_found(&self) -> u32 {
        let launched = self.world_size as u32;
        let most = crate::scenario::limits::MAX_WORLD_SIZE as u32;
        (launched..most)
            .find(|&r| !RankFiles::new(&self.trace_dir, r).started.exists())
            .unwrap_or(most)
    }

    /// What a Slurm step's ranks need of the trace folder, for an error where a rank did not
    /// write there.
    fn shared_folder_hint(&self) -> String {
        format!(
            "\n  hint: under srun every rank writes its trace into {} from its own node: that \
             folder must be on a filesystem every node sees, writable by the user the tasks run \
             as; set DETCHECK_SHARED_DIR to such a folder (docs/slurm.md)",
            self.trace_dir.display()
        )
    }
}

/// The first and last [`SRUN_WORDS`] bytes of `srun`'s stderr (its own messages come first,
/// when it waits, and last, when the step ends; the tasks' stderr is in between).
fn head_and_tail(path: &Path) -> String {
    let Ok(mut file) = File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let mut head = Vec::new();
    let _ = (&mut file).take(SRUN_WORDS).read_to_end(&mut head);
    let mut text = String::from_utf8_lossy(&head).into_owned();
    if len > SRUN_WORDS {
        let _ = file.seek(SeekFrom::Start(
            len.saturating_sub(SRUN_WORDS).max(SRUN_WORDS),
        ));
        let mut tail = Vec::new();
        let _ = file.read_to_end(&mut tail);
        text.push('\n');
        text.push_str(&String::from_utf8_lossy(&tail));
    }
    text
}

/// `path` made absolute against the working directory (as it is when that fails).
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Whether a program's first argument is a Python interpreter: `python`, `python3`,
/// `python3.11`, by any path.
fn is_python(program: &str) -> bool {
    let name = Path::new(program)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.strip_prefix("python")
        .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// A free TCP port on the loopback interface (taken and released: another process could take
/// it in between, which a launch then reports as a failure).
fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

fn describe_status(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("status {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        _ => status.to_string(),
    }
}

/// The last lines of a stderr file, indented, or that it is empty (nothing when it is missing).
fn stderr_tail(path: &Path) -> String {
    if !path.exists() {
        return String::new();
    }
    output_tail(path, "its stderr").unwrap_or_else(|| "; its stderr is empty".to_owned())
}

/// The last lines of a process's output file (`what` names it: "its stderr"), indented;
/// `None` when the file is missing or holds nothing but blank lines.
fn output_tail(path: &Path, what: &str) -> Option<String> {
    let mut file = File::open(path).ok()?;
    let len = file.metadata().map_or(0, |m| m.len());
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(STDERR_TAIL)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.trim_end().lines().collect();
    let tail = &lines[lines.len().saturating_sub(STDERR_LINES)..];
    if tail.iter().all(|line| line.trim().is_empty()) {
        return None;
    }
    let mut out = format!("; the end of {what}:");
    for line in tail {
        out.push_str("\n    ");
        out.push_str(line);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::is_python;

    #[test]
    fn python_interpreters_are_told_from_scripts() {
        for p in [
            "python",
            "python3",
            "python3.11",
            "/opt/venv/bin/python3",
            "./python",
        ] {
            assert!(is_python(p), "{p}");
        }
        for p in [
            "train.py",
            "torchrun",
            "pythonista",
            "/usr/bin/env",
            "python3-config",
            "",
        ] {
            assert!(!is_python(p), "{p}");
        }
    }
}

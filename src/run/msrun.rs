//! The `msrun` launcher's MindSpore side: msrun's command line, its workers' ends, and their
//! logs read into the words of a failed launch.
//!
//! [`MsrunJob`] is one launch: `msrun --worker_num=N --local_worker_num=N
//! --master_addr=127.0.0.1 --master_port=P --join=True --log_dir=LOGS --cluster_time_out=T
//! SCRIPT ARGS...`. msrun starts a scheduler (`MS_ROLE=MS_SCHED`) and N workers
//! (`MS_ROLE=MS_WORKER`, `RANK_ID` = the worker's rank: `crate::launch` reads it), each as
//! `python SCRIPT ARGS...`, with `python` looked up on `PATH`. For `python train.py`, detcheck runs
//! that very Python's msrun (`PYTHON -m mindspore.parallel.cluster.run`) and puts a `python` of
//! its own first on the workers' `PATH` (a shell script that runs the program's interpreter), so
//! the ranks run in the program's environment; anything else goes to the `msrun` on `PATH`.
//! `P` is the launch's `MASTER_PORT` (drawn per launch: `crate::run::process`), the scheduler's
//! port.
//!
//! msrun starts each worker in a session of its own (`setsid`), so killing msrun's process group
//! does not end them: `crate::run::rank_failure::kill_ranks` kills the ranks' processes by the pid
//! files their start-up hook left (`crate::launch::RankFiles`), each checked to be this launch's,
//! as it does torchrun's workers. msrun writes
//! each worker's output into `LOGS/worker_R.log` (and the scheduler's into `scheduler.log`), not
//! onto its own stderr; [`MsrunJob::failed_worker_log`] finds the rank whose log shows an error
//! and gives its end, MindSpore's own `[WARNING]`/`[INFO]` lines left out.
//!
//! Determinism: the command line is a function of the scenario and the launch; killing and
//! reading logs touch no value. Limits: one node (`--local_worker_num` = `--worker_num`); msrun's
//! log names of MindSpore 2.10 (`worker_R.log`, `scheduler.log`, its default
//! `--worker_log_name`).

use std::path::{Path, PathBuf};

/// How many lines of a worker's log are shown, at most.
const LOG_LINES: usize = 20;
/// How many bytes of the end of a worker's log are read, at most.
const LOG_TAIL: u64 = 64 << 10;
/// The module a Python runs as msrun (what the `msrun` script runs).
const MSRUN_MODULE: &str = "mindspore.parallel.cluster.run";

/// One `msrun` launch (module doc): its log folder, and the folder of its `python` shim.
#[derive(Debug, Clone)]
pub(crate) struct MsrunJob {
    /// `--log_dir`: msrun's logs, one per worker and the scheduler's.
    pub(crate) log_dir: PathBuf,
    world_size: usize,
}

/// What starts one `msrun` launch: its argument vector and the variables it adds.
pub(crate) struct MsrunCommand {
    pub(crate) argv: Vec<String>,
    /// `PATH` with the shim folder first, for a Python program.
    pub(crate) env: Vec<(String, String)>,
    /// The interpreter whose `mindspore` msrun needs (a Python program), to check first.
    pub(crate) python: Option<String>,
}

impl MsrunJob {
    /// The launch of `world_size` workers whose files go under `folder` (its own launch folder).
    pub(crate) fn new(folder: &Path, world_size: usize) -> Self {
        MsrunJob {
            log_dir: folder.join("msrun-logs"),
            world_size,
        }
    }

    /// The command line of `program` under msrun (module doc), with its scheduler on
    /// `master_port` and a cluster timeout of `timeout_secs`. For a Python program, writes the
    /// `python` shim into `shim_dir`.
    ///
    /// # Errors
    /// The shim cannot be written.
    pub(crate) fn command(
        &self,
        program: &[String],
        master_port: u16,
        timeout_secs: u64,
        shim_dir: &Path,
        is_python: impl Fn(&str) -> bool,
    ) -> std::io::Result<MsrunCommand> {
        let flags = [
            format!("--worker_num={}", self.world_size),
            format!("--local_worker_num={}", self.world_size),
            "--master_addr=127.0.0.1".to_owned(),
            format!("--master_port={master_port}"),
            "--join=True".to_owned(),
            format!("--log_dir={}", self.log_dir.display()),
            format!("--cluster_time_out={timeout_secs}"),
        ];
        match program.split_first() {
            Some((python, script)) if is_python(python) && !script.is_empty() => {
                let interpreter = resolve(python);
                std::fs::create_dir_all(shim_dir)?;
                write_shim(&shim_dir.join("python"), &interpreter)?;
                let path = std::env::var_os("PATH").unwrap_or_default();
                let mut paths = vec![shim_dir.to_path_buf()];
                paths.extend(std::env::split_paths(&path));
                let path = std::env::join_paths(paths)
                    .unwrap_or_else(|_| path.clone())
                    .to_string_lossy()
                    .into_owned();
                let mut argv = vec![
                    interpreter.display().to_string(),
                    "-m".to_owned(),
                    MSRUN_MODULE.to_owned(),
                ];
                argv.extend(flags);
                argv.extend(script.iter().cloned());
                Ok(MsrunCommand {
                    argv,
                    env: vec![("PATH".to_owned(), path)],
                    python: Some(interpreter.display().to_string()),
                })
            }
            _ => {
                let mut argv = vec!["msrun".to_owned()];
                argv.extend(flags);
                argv.extend(program.iter().cloned());
                Ok(MsrunCommand {
                    argv,
                    env: Vec::new(),
                    python: None,
                })
            }
        }
    }

    /// The end of the log of the first worker (by rank) whose log shows an error (a Python
    /// traceback, MindSpore's `[ERROR]` or `[CRITICAL]` lines), else of the scheduler's when it
    /// does: `; rank R's msrun log (PATH) ends:` and its last lines; `None` when no log shows one.
    pub(crate) fn failed_worker_log(&self) -> Option<String> {
        let logs = (0..self.world_size)
            .map(|r| (Some(r), self.log_dir.join(format!("worker_{r}.log"))))
            .chain(std::iter::once((None, self.log_dir.join("scheduler.log"))));
        for (rank, path) in logs {
            let text = tail_of(&path);
            if !shows_error(&text) {
                continue;
            }
            let who = rank.map_or_else(
                || "msrun's scheduler's log".to_owned(),
                |r| format!("rank {r}'s msrun log"),
            );
            let lines: Vec<&str> = text.lines().filter(|l| !is_chatter(l)).collect();
            let mut out = format!("; {who} ({}) ends:", path.display());
            for line in &lines[lines.len().saturating_sub(LOG_LINES)..] {
                out.push_str("\n    ");
                out.push_str(line);
            }
            return Some(out);
        }
        None
    }
}

/// `program` as an absolute path: as given when it names a folder, else found on `PATH` (as
/// given when it is not found: starting it then fails with the system's words).
fn resolve(program: &str) -> PathBuf {
    let given = Path::new(program);
    if program.contains('/') {
        return std::path::absolute(given).unwrap_or_else(|_| given.to_path_buf());
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| given.to_path_buf())
}

/// A `python` that runs `interpreter` (by its path, so a virtual environment stays one).
fn write_shim(path: &Path, interpreter: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let quoted = interpreter.display().to_string().replace('\'', r"'\''");
    std::fs::write(path, format!("#!/bin/sh\nexec '{quoted}' \"$@\"\n"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
}

/// The last [`LOG_TAIL`] bytes of a log, as text (empty when it cannot be read).
fn tail_of(path: &Path) -> String {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Whether a log's text shows an error: a Python traceback, or MindSpore's error lines.
fn shows_error(text: &str) -> bool {
    text.lines().any(|l| {
        l.starts_with("Traceback (most recent call last)")
            || l.starts_with("[ERROR]")
            || l.starts_with("[CRITICAL]")
    })
}

/// MindSpore's own log lines below an error (`[WARNING] ME(...)`, `[INFO]`, `[DEBUG]`), which
/// fill a worker's log and hide the program's words.
fn is_chatter(line: &str) -> bool {
    ["[WARNING]", "[INFO]", "[DEBUG]"]
        .iter()
        .any(|p| line.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("detcheck-msrun-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_python_program_runs_under_its_own_pythons_msrun_with_a_shim() {
        let dir = folder("argv");
        let job = MsrunJob::new(&dir, 2);
        let program = [
            "/opt/venv/bin/python3".to_owned(),
            "train.py".to_owned(),
            "--lr".to_owned(),
        ];
        let cmd = job
            .command(&program, 21234, 300, &dir.join("bin"), |p| {
                p.ends_with("python3")
            })
            .unwrap();
        assert_eq!(
            cmd.argv[..3],
            [
                "/opt/venv/bin/python3",
                "-m",
                "mindspore.parallel.cluster.run"
            ]
        );
        for flag in [
            "--worker_num=2",
            "--local_worker_num=2",
            "--master_port=21234",
            "--join=True",
            "--cluster_time_out=300",
        ] {
            assert!(
                cmd.argv.contains(&flag.to_owned()),
                "{flag}: {:?}",
                cmd.argv
            );
        }
        assert_eq!(cmd.argv[cmd.argv.len() - 2..], ["train.py", "--lr"]);
        let shim = std::fs::read_to_string(dir.join("bin/python")).unwrap();
        assert_eq!(shim, "#!/bin/sh\nexec '/opt/venv/bin/python3' \"$@\"\n");
        let (name, path) = &cmd.env[0];
        assert_eq!(name, "PATH");
        assert!(
            path.starts_with(&dir.join("bin").display().to_string()),
            "{path}"
        );
        assert_eq!(cmd.python.as_deref(), Some("/opt/venv/bin/python3"));

        let other = job
            .command(&["train.py".to_owned()], 1, 5, &dir.join("bin"), |_| false)
            .unwrap();
        assert_eq!(other.argv[0], "msrun");
        assert_eq!(other.argv.last().map(String::as_str), Some("train.py"));
        assert!(other.env.is_empty() && other.python.is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_failed_workers_log_is_found_and_mindsporess_chatter_left_out() {
        let dir = folder("logs");
        let job = MsrunJob::new(&dir, 2);
        std::fs::create_dir_all(&job.log_dir).unwrap();
        assert_eq!(job.failed_worker_log(), None, "no logs");
        std::fs::write(
            job.log_dir.join("worker_0.log"),
            "[WARNING] ME(1): fine\nepoch 0\n",
        )
        .unwrap();
        std::fs::write(
            job.log_dir.join("worker_1.log"),
            "[WARNING] ME(2): chatter\nTraceback (most recent call last):\n  File \"t.py\", \
             line 3\n[WARNING] DISTRIBUTED(2): more\nValueError: rank 1 broke\n",
        )
        .unwrap();
        let words = job.failed_worker_log().unwrap();
        assert!(words.starts_with("; rank 1's msrun log ("), "{words}");
        assert!(words.contains("ValueError: rank 1 broke"), "{words}");
        assert!(
            !words.contains("chatter") && !words.contains("more"),
            "{words}"
        );
        std::fs::write(job.log_dir.join("worker_1.log"), "fine\n").unwrap();
        std::fs::write(
            job.log_dir.join("scheduler.log"),
            "[ERROR] DISTRIBUTED: timed out\n",
        )
        .unwrap();
        let words = job.failed_worker_log().unwrap();
        assert!(
            words.contains("scheduler") && words.contains("timed out"),
            "{words}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

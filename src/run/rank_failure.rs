//! What the ranks of a failed or stuck launch left behind, read into the words of its error.
//!
//! A launcher (torchrun, mpirun) reports a failed rank in its own words ("exitcode: 1 ... To
//! enable traceback see ..."), and a launch past its timeout names only the launcher's process.
//! The Python start-up hook of every rank keeps files in the trace folder
//! ([`crate::launch::RankFiles`]): the traceback of an uncaught exception with the time it was
//! raised, the rank's process id, and its Python stacks when asked with `SIGUSR2`. From them:
//!
//! - [`RankErrors::read`]: the ranks that raised, the root cause first (the earliest to raise:
//!   a peer of a failed rank usually raises later, in the collective it was waiting in);
//! - [`stuck_ranks`]: at a timeout, the ranks whose processes still run, each asked for its
//!   stacks, with the innermost frames of its main thread (where it waits: a collective's call
//!   in the program, a lock, a read);
//! - [`kill_ranks`]: the ranks' processes that still run when a launch is killed, those a
//!   launcher started in sessions of their own among them (torchrun's agent, msrun), which
//!   killing the launcher's process group leaves running.
//!
//! Also [`wrong_path_hint`]: the words for a one-rank launch whose program wanted the variables
//! that only a multi-process launcher sets; and [`msrun_hint`]: for a MindSpore program whose
//! `init()` found no cluster (its ranks need `--launcher msrun`).
//!
//! Determinism: none of this touches a value; it reads files and the clock to bound a wait.
//! Limits: Python ranks with the detcheck package only; a rank killed by a signal (SIGKILL, the
//! OOM killer) leaves no traceback, and is named by its exit status where its launcher says it.

use crate::launch::{RankFiles, ERROR_FILE_MAGIC};
use std::path::Path;
use std::time::{Duration, Instant};

/// How many lines of a traceback or a stack the message shows, at most.
const LINES: usize = 24;
/// How long a stuck rank is given to write its stacks.
const STACKS_WAIT: Duration = Duration::from_millis(1500);

/// One rank's uncaught exception.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RankError {
    pub(crate) rank: u32,
    /// When it was raised (seconds since the Unix epoch, from the rank's clock).
    time: f64,
    /// The traceback, as Python printed it.
    traceback: String,
}

impl RankError {
    /// The traceback, as Python printed it.
    pub(crate) fn traceback(&self) -> &str {
        &self.traceback
    }

    /// The exception's own line (`ValueError: ...`): the traceback's last non-empty line.
    pub(crate) fn exception(&self) -> &str {
        self.traceback
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("(an empty traceback)")
    }
}

/// The ranks of a launch that raised, the root cause first.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RankErrors(pub(crate) Vec<RankError>);

impl RankErrors {
    /// The error files of ranks `0..world_size` in `trace_dir` (a file that cannot be read, or
    /// does not start with [`ERROR_FILE_MAGIC`], is left out).
    pub(crate) fn read(trace_dir: &Path, world_size: u32) -> Self {
        let mut errors: Vec<RankError> = (0..world_size)
            .filter_map(|rank| {
                let text = std::fs::read_to_string(RankFiles::new(trace_dir, rank).error).ok()?;
                let (header, traceback) = text.split_once('\n')?;
                let mut fields = header.split_whitespace();
                if fields.next() != Some(ERROR_FILE_MAGIC) {
                    return None;
                }
                let time = fields
                    .find_map(|f| f.strip_prefix("time="))
                    .and_then(|t| t.parse::<f64>().ok())
                    .filter(|t| t.is_finite())?;
                Some(RankError {
                    rank,
                    time,
                    traceback: traceback.to_owned(),
                })
            })
            .collect();
        errors.sort_by(|a, b| a.time.total_cmp(&b.time).then(a.rank.cmp(&b.rank)));
        RankErrors(errors)
    }

    /// The error's words: the root-cause rank's exception and traceback, then the other ranks
    /// that raised after it (one line each); `None` when no rank left a traceback.
    pub(crate) fn describe(&self) -> Option<String> {
        let (first, others) = self.0.split_first()?;
        let mut out = format!("rank {} raised {}", first.rank, first.exception());
        if !others.is_empty() {
            let ranks: Vec<String> = others.iter().map(|e| e.rank.to_string()).collect();
            out.push_str(&format!(
                " (the root cause: the first of {} ranks to raise; rank(s) {} raised after it)",
                self.0.len(),
                ranks.join(", ")
            ));
        }
        out.push_str(&format!("; rank {}'s traceback:", first.rank));
        push_tail(&mut out, &first.traceback);
        for other in others {
            out.push_str(&format!(
                "\n  rank {} raised {}",
                other.rank,
                other.exception()
            ));
        }
        Some(out)
    }
}

/// The last [`LINES`] lines of `text`, indented, after a newline each.
fn push_tail(out: &mut String, text: &str) {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() > LINES {
        out.push_str("\n    ...");
    }
    for line in &lines[lines.len().saturating_sub(LINES)..] {
        out.push_str("\n    ");
        out.push_str(line);
    }
}

/// The process id a rank's pid file names (`None`: no file, or not a positive number).
fn rank_pid(files: &RankFiles) -> Option<i32> {
    std::fs::read_to_string(&files.pid)
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
        .filter(|&p| p > 0)
}

/// Kills (`SIGKILL`) the ranks of `0..world_size` whose pid file names a process that still
/// runs with this launch's environment (`DETCHECK_TRACE_DIR`): a pid is reused once its process
/// is gone, and a rank that ended normally removed its pid file. torchrun's agent and msrun start
/// their workers in sessions of their own, so killing the launcher's process group (what
/// `crate::run::process` does first) does not end them; this does.
pub(crate) fn kill_ranks(trace_dir: &Path, world_size: u32) {
    let marker = format!("DETCHECK_TRACE_DIR={}", trace_dir.display());
    for rank in 0..world_size {
        let Some(pid) = rank_pid(&RankFiles::new(trace_dir, rank)) else {
            continue;
        };
        let ours = std::fs::read(format!("/proc/{pid}/environ"))
            .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == marker.as_bytes()));
        if ours {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// At a timeout: the ranks of `0..world_size` whose process (from its pid file) still runs,
/// each asked for its Python stacks (`SIGUSR2`), with where its main thread is; `None` when no
/// rank left a pid file (not a Python rank with the detcheck package).
pub(crate) fn stuck_ranks(trace_dir: &Path, world_size: u32) -> Option<String> {
    let mut stuck = Vec::new();
    let mut any_pid = false;
    for rank in 0..world_size {
        let files = RankFiles::new(trace_dir, rank);
        let Some(pid) = rank_pid(&files) else {
            continue;
        };
        any_pid = true;
        let pid = nix::unistd::Pid::from_raw(pid);
        if nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR2).is_ok() {
            stuck.push((rank, files.stacks));
        }
    }
    if !any_pid {
        return None;
    }
    if stuck.is_empty() {
        return Some("no rank's process is still running (the launcher is)".to_owned());
    }
    let deadline = Instant::now() + STACKS_WAIT;
    let mut out = format!(
        "rank(s) {} still running",
        stuck
            .iter()
            .map(|(r, _)| r.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (rank, path) in &stuck {
        let stacks = loop {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            if main_thread(&text).is_some() || Instant::now() >= deadline {
                break text;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        match main_thread(&stacks) {
            Some(frames) => {
                out.push_str(&format!(
                    "\n  rank {rank} is in (innermost first, from its Python stacks):"
                ));
                push_tail(&mut out, &frames);
            }
            None => out.push_str(&format!(
                "\n  rank {rank} did not answer for its stacks (stuck outside Python, or it \
                 replaced the SIGUSR2 handler)"
            )),
        }
    }
    Some(out)
}

/// The frames of the main thread in `faulthandler`'s dump (`Current thread` or `Thread`
/// blocks; the main thread's is the one with `<module>` at its bottom), at most [`LINES`]
/// innermost ones; `None` before the dump is complete.
fn main_thread(dump: &str) -> Option<String> {
    let mut blocks: Vec<Vec<&str>> = Vec::new();
    for line in dump.lines() {
        if line.starts_with("Thread ") || line.starts_with("Current thread ") {
            blocks.push(Vec::new());
        } else if let Some(block) = blocks.last_mut() {
            if !line.trim().is_empty() {
                block.push(line.trim());
            }
        }
    }
    let main = blocks
        .iter()
        .find(|b| b.last().is_some_and(|l| l.ends_with("in <module>")))?;
    Some(
        main.iter()
            .take(LINES)
            .copied()
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

/// torch.distributed's variables, which a one-rank launch of the `processes` launcher does not
/// set: the program runs as `python train.py` runs by hand.
pub(crate) const TORCH_RANK_VARIABLES: [&str; 6] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
];

/// The hint for a one-rank launch that failed because the program reads one of
/// [`TORCH_RANK_VARIABLES`] unconditionally (`os.environ["LOCAL_RANK"]`: a script written for
/// torchrun); `None` when `text` (its traceback or stderr) shows no such lookup.
pub(crate) fn wrong_path_hint(text: &str) -> Option<String> {
    let name = TORCH_RANK_VARIABLES.iter().find(|name| {
        text.contains(&format!("KeyError: '{name}'"))
            || text.contains(&format!("environment variable {name} expected"))
    })?;
    Some(format!(
        "\n  hint: at one rank, the `processes` launcher runs the program as `python train.py` \
         runs by hand, without {}; the program read `{name}`, so it is written for torchrun: \
         check it with `--launcher torchrun` (a program that creates a process group without \
         reading them gets a world of one)",
        TORCH_RANK_VARIABLES.join(", ")
    ))
}

/// What MindSpore 2.10 raises when `mindspore.communication.init()` runs in a process that no
/// launcher of MindSpore's started (no `MS_ROLE`: neither msrun nor its mpirun mode).
const MINDSPORE_NO_CLUSTER: &str = "call 'mindspore.communication.init()' without using 'mpirun'";

/// The hint for a launch whose program's `mindspore.communication.init()` found no MindSpore
/// cluster (`text`: a rank's traceback or stderr): its ranks need MindSpore's launcher, which
/// starts the scheduler they join; `None` when `text` shows no such failure.
pub(crate) fn msrun_hint(text: &str) -> Option<String> {
    text.contains(MINDSPORE_NO_CLUSTER).then(|| {
        "\n  hint: MindSpore's `init()` joins a cluster that its launcher starts (a scheduler, \
         MS_ROLE, MS_SCHED_PORT, RANK_ID), which the `processes` launcher does not: check it with \
         `--launcher msrun` (docs/mindspore.md)"
            .to_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn the_earliest_rank_to_raise_is_the_root_cause() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "rank0.error.txt",
            "detcheck-error rank=0 time=100.5\nTraceback (most recent call last):\n  File \"t.py\", line 3, in <module>\nRuntimeError: Connection closed by peer\n",
        );
        write(
            dir.path(),
            "rank1.error.txt",
            "detcheck-error rank=1 time=100.25\nTraceback (most recent call last):\n  File \"t.py\", line 9, in <module>\nValueError: bad batch\n\n",
        );
        write(dir.path(), "rank2.error.txt", "not ours\nValueError: x\n");
        write(
            dir.path(),
            "rank3.error.txt",
            "detcheck-error rank=3 time=NaN\nx\n",
        );
        let errors = RankErrors::read(dir.path(), 4);
        assert_eq!(errors.0.iter().map(|e| e.rank).collect::<Vec<_>>(), [1, 0]);
        let words = errors.describe().unwrap();
        assert!(
            words.starts_with("rank 1 raised ValueError: bad batch (the root cause: the first of 2 ranks to raise; rank(s) 0 raised after it); rank 1's traceback:"),
            "{words}"
        );
        assert!(
            words.contains("    File \"t.py\", line 9, in <module>"),
            "{words}"
        );
        assert!(
            words.ends_with("\n  rank 0 raised RuntimeError: Connection closed by peer"),
            "{words}"
        );
        assert_eq!(RankErrors::read(dir.path(), 1).0.len(), 1);
        assert!(RankErrors::default().describe().is_none());
    }

    #[test]
    fn the_main_threads_frames_are_found_in_a_faulthandler_dump() {
        let dump = "Thread 0x00007f0001 (most recent call first):\n  File \"/usr/lib/python3.11/threading.py\", line 324 in wait\n  File \"/usr/lib/python3.11/threading.py\", line 1002 in _bootstrap\n\nCurrent thread 0x00007f0002 (most recent call first):\n  File \"/x/torch/distributed/c10d.py\", line 2501 in all_reduce\n  File \"train.py\", line 40 in step\n  File \"train.py\", line 52 in <module>\n";
        let main = main_thread(dump).unwrap();
        assert_eq!(
            main,
            "File \"/x/torch/distributed/c10d.py\", line 2501 in all_reduce\nFile \"train.py\", line 40 in step\nFile \"train.py\", line 52 in <module>"
        );
        assert!(main_thread(
            "Current thread 0x1 (most recent call first):\n  File \"a.py\", line 1 in f\n"
        )
        .is_none());
        assert!(main_thread("").is_none());
    }

    #[test]
    fn only_the_ranks_of_this_launch_are_killed_by_their_pid_files() {
        let dir = tempfile::tempdir().unwrap();
        let sleeper = |trace_dir: &Path| {
            let mut child = std::process::Command::new("sh")
                // The shell stays (no `exec`): its environment is readable from "ready" on,
                // where an `exec` in progress can leave /proc/PID/environ empty for a moment.
                .args(["-c", "echo ready; while :; do sleep 1; done"])
                .env("DETCHECK_TRACE_DIR", trace_dir)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut ready = [0u8; 6];
            std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut ready).unwrap();
            child
        };
        // Rank 0: this launch's (its environment names the trace folder); rank 1: a pid of
        // another launch's process (a pid reused); rank 2: no process; rank 3: no pid file.
        let mut ours = sleeper(dir.path());
        let mut other = sleeper(&dir.path().join("elsewhere"));
        write(dir.path(), "rank0.pid", &format!("{}\n", ours.id()));
        write(dir.path(), "rank1.pid", &other.id().to_string());
        write(dir.path(), "rank2.pid", "999999999\n");
        kill_ranks(dir.path(), 4);
        let status = ours.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "{status:?}"
        );
        assert!(
            other.try_wait().unwrap().is_none(),
            "another launch's process was killed"
        );
        let _ = other.kill();
        let _ = other.wait();
    }

    #[test]
    fn a_stuck_rank_is_named_with_its_stacks_and_a_gone_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(stuck_ranks(dir.path(), 2), None);
        // A pid that is no process: nothing is stuck.
        write(dir.path(), "rank0.pid", "999999999\n");
        assert_eq!(
            stuck_ranks(dir.path(), 2).unwrap(),
            "no rank's process is still running (the launcher is)"
        );
        // A real process that writes its stacks when it gets SIGUSR2 (a shell's trap).
        let stacks = dir.path().join("rank1.stacks.txt");
        let script = format!(
            "trap 'printf \"Current thread 0x1 (most recent call first):\\n  File \\\"train.py\\\", line 7 in wait_for_peer\\n  File \\\"train.py\\\", line 9 in <module>\\n\" > {}' USR2; echo ready; while :; do sleep 0.05; done",
            stacks.display()
        );
        let mut child = std::process::Command::new("sh")
            .args(["-c", &script])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut ready = [0u8; 6];
        std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut ready).unwrap();
        write(dir.path(), "rank1.pid", &child.id().to_string());
        let words = stuck_ranks(dir.path(), 2).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert!(words.starts_with("rank(s) 1 still running"), "{words}");
        assert!(
            words.contains("rank 1 is in (innermost first, from its Python stacks):\n    File \"train.py\", line 7 in wait_for_peer"),
            "{words}"
        );
    }

    #[test]
    fn a_mindspore_script_without_its_cluster_gets_the_msrun_hint() {
        let text = "RuntimeError: Maybe you are trying to call 'mindspore.communication.init()' \
                    without using 'mpirun', which will make MindSpore load several environment \
                    variables";
        assert!(msrun_hint(text).unwrap().contains("--launcher msrun"));
        assert_eq!(msrun_hint("RuntimeError: something else"), None);
    }

    #[test]
    fn a_torchrun_script_at_one_rank_gets_the_launcher_hint() {
        let hint = wrong_path_hint("Traceback ...\nKeyError: 'LOCAL_RANK'\n").unwrap();
        assert!(hint.contains("--launcher torchrun"), "{hint}");
        assert!(hint.contains("the program read `LOCAL_RANK`"), "{hint}");
        assert!(wrong_path_hint("KeyError: 'lr'").is_none());
    }
}

//! The rank watcher: names an MPI rank whose process dies without a word under MPICH's Hydra.
//!
//! Why it exists: when a rank's process is killed (SIGKILL from the out-of-memory killer or
//! `kill -9`, a crash), Hydra's proxy kills every other rank with SIGKILL at once, before any of
//! them can speak, and reports one pid of its choosing, often not the dead rank's. It does so
//! for any child that ends on a signal, whatever `-disable-auto-cleanup` says (`pmip.c`'s
//! `waitpid` loop in MPICH 4.0.2 and its `main`), so no rank can name it; only a process outside
//! the rank that outlives it can.
//!
//! [`RankWatcher::start`] (called by the MPI job before `MPI_Init`) spawns one small `/bin/sh`
//! child per rank that holds a pipe from the rank on its stdin. When the rank ends normally it
//! writes `done` first ([`RankWatcher`]'s drop at the end of the job; [`leaving`] before an
//! `MPI_Abort` the rank has already explained). If the pipe ends without it, the rank's process
//! is gone: the watcher reads its wait status from `/proc/PID/stat` (field 52: the signal or exit
//! code), prints `detcheck: MPI rank R (pid P) was killed by signal 9 (SIGKILL …)` on the stderr
//! it shares with the rank (the launcher forwards it), and exits.
//!
//! Why only the first rank to die is named: the watcher stays in its rank's process group, and
//! Hydra kills each rank with `killpg`, so a rank killed by Hydra's clean-up dies together with
//! its watcher, silently. The first rank died alone (the OOM killer and `kill` take one process),
//! and Hydra cannot kill its group afterwards: the proxy finds a rank's group through the rank's
//! pid (`getpgid`), and learns of the death only by reaping the rank (on its next event, often
//! the watcher's own line), after which that pid leads nowhere. It cannot learn sooner from the
//! rank's PMI socket, stdout or stderr closing: the watcher holds copies of them (inherited).
//!
//! Invariant (a rank killed outright is named): by Open MPI's `mpirun`; under Hydra, which kills
//! every other rank at once, by the rank's watcher, a child in the rank's process group (so the
//! ranks Hydra kills die with their watchers, silently, and only the first death is named). A
//! watcher never outlives its rank: it exits on the rank's `done` or at the end of its pipe.
//!
//! Determinism: no effect on any result; the watcher only reads its pipe and `/proc`.
//!
//! Limits: Hydra's simple PMI wire only (`PMI_FD` or `PMI_PORT` in the environment), on Linux
//! (`/proc`); under Open MPI there is no watcher (`mpirun` names a killed rank itself). With
//! Hydra's `-pmi-port` the rank opens its PMI socket in `MPI_Init`, after the watcher started, so
//! the proxy kills the first rank's group (its watcher too) when that socket closes, before the
//! line is written: nobody is named, as before (measured: 6 jobs of 6). The default, `PMI_FD`, is
//! inherited and held. A rank
//! whose whole process group is killed (a signal to the group, Ctrl-C) is named by nobody, which
//! is right when the launcher did it. A watcher that cannot be spawned (no `/bin/sh`) is skipped.

use std::io::Write;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The watcher's program (`sh -c SCRIPT watcher RANK PID`): wait for `done` on stdin; on EOF
/// without it, name the rank and how its process ended.
const SCRIPT: &str = r#"rank=$1 pid=$2
while IFS= read -r line; do
  [ "$line" = done ] && exit 0
done
how="ended without finishing (its exit status was already collected)"
{ IFS= read -r stat < "/proc/$pid/stat"; } 2>/dev/null
set -- ${stat##*) }
if [ -n "${50}" ]; then
  sig=$((${50} & 127))
  case $sig in
    0) how="exited with code $(((${50} >> 8) & 255)) without finishing" ;;
    9) how="was killed by signal 9 (SIGKILL: the out-of-memory killer, or kill -9)" ;;
    6) how="was killed by signal 6 (SIGABRT)" ;;
    7) how="was killed by signal 7 (SIGBUS)" ;;
    11) how="was killed by signal 11 (SIGSEGV)" ;;
    *) how="was killed by signal $sig" ;;
  esac
fi
echo "detcheck: MPI rank $rank (pid $pid) $how, before it could say why; the launcher ends the job" >&2
"#;

/// The pipe to this process's watcher, while it has one: written once, by whoever ends first
/// (the job's end, or an abort).
static NOTICE: Mutex<Option<ChildStdin>> = Mutex::new(None);

/// Whether this process has spawned its watcher (see [`RankWatcher::spawn`]).
static SPAWNED: AtomicBool = AtomicBool::new(false);

/// This process's watcher (see the module's doc); dropping it tells the watcher the rank ends
/// normally and waits for it to exit.
#[derive(Debug)]
pub(crate) struct RankWatcher {
    child: Child,
}

impl RankWatcher {
    /// Spawns the watcher when Hydra's PMI launched this process as MPI rank `PMI_RANK`; `None`
    /// otherwise (Open MPI, no launcher) or when `/bin/sh` cannot be started.
    pub(crate) fn start() -> Option<RankWatcher> {
        if std::env::var_os("PMI_FD").is_none() && std::env::var_os("PMI_PORT").is_none() {
            return None;
        }
        let rank = std::env::var("PMI_RANK").ok()?;
        Self::spawn(&rank)
    }

    /// Spawns a watcher of this process, named MPI rank `rank` in its message; `None` if this
    /// process already has one. Once per process: a second watcher would take the first one's
    /// pipe, and the first would then name a live rank (a second `MPI_Init` fails anyway).
    fn spawn(rank: &str) -> Option<RankWatcher> {
        if SPAWNED.swap(true, Ordering::SeqCst) {
            return None;
        }
        let mut child = watcher_command(rank, std::process::id()).spawn().ok()?;
        let stdin = child.stdin.take()?;
        *NOTICE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(stdin);
        Some(RankWatcher { child })
    }
}

impl Drop for RankWatcher {
    fn drop(&mut self) {
        leaving();
        // It exits as soon as it reads `done` (or the end of the pipe): a short wait, and no
        // watcher outlives its rank.
        let _ = self.child.wait();
    }
}

/// The watcher of process `pid`, named MPI rank `rank`: its stdin is the pipe to write `done`
/// to, its stderr the caller's.
fn watcher_command(rank: &str, pid: u32) -> Command {
    let mut command = Command::new("/bin/sh");
    command
        .args(["-c", SCRIPT, "detcheck-watcher", rank, &pid.to_string()])
        .stdin(Stdio::piped());
    command
}

/// Tells this process's watcher, if any, that the rank ends on purpose (normally, or aborting
/// after it printed why), so it stays quiet. Only the first call writes.
pub(crate) fn leaving() {
    let mut notice = NOTICE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(mut pipe) = notice.take() {
        // A watcher that is already gone cannot be told; nothing else is at stake.
        let _ = pipe.write_all(b"done\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::PipeWriter;

    /// Starts a stand-in rank (`rank_argv`, holding the write end of its watcher's pipe as its
    /// stdout, as a rank holds it) and its watcher; `end` gets the rank and this process's copy
    /// of the write end (the rank's own `done` channel). Returns the watcher's exit success and
    /// stderr, and the rank's pid.
    fn watch(rank_argv: &[&str], end: impl FnOnce(&mut Child, PipeWriter)) -> (bool, String, u32) {
        let (reader, writer) = std::io::pipe().unwrap();
        let mut rank = Command::new(rank_argv[0])
            .args(&rank_argv[1..])
            .stdout(writer.try_clone().unwrap())
            .spawn()
            .unwrap();
        let watcher = watcher_command("2", rank.id())
            .stdin(reader)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        end(&mut rank, writer);
        // The rank stays unreaped until the watcher is done, as under Hydra's proxy.
        let output = watcher.wait_with_output().unwrap();
        let _ = rank.kill();
        let _ = rank.wait();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        (output.status.success(), stderr, rank.id())
    }

    #[test]
    fn a_rank_killed_with_sigkill_is_named_with_its_signal() {
        let (_, stderr, pid) = watch(&["sleep", "30"], |rank, writer| {
            drop(writer);
            rank.kill().unwrap();
        });
        assert_eq!(
            stderr,
            format!(
                "detcheck: MPI rank 2 (pid {pid}) was killed by signal 9 (SIGKILL: the \
                 out-of-memory killer, or kill -9), before it could say why; the launcher ends \
                 the job\n"
            )
        );
    }

    #[test]
    fn a_rank_that_exits_without_its_notice_is_named_with_its_code() {
        let (_, stderr, pid) = watch(&["sh", "-c", "exit 3"], |_, writer| drop(writer));
        assert!(
            stderr.starts_with(&format!(
                "detcheck: MPI rank 2 (pid {pid}) exited with code 3 without finishing"
            )),
            "{stderr}"
        );
    }

    #[test]
    fn a_process_gets_one_watcher() {
        let first = RankWatcher::spawn("0");
        assert!(first.is_some());
        assert!(RankWatcher::spawn("0").is_none());
        // Dropped: told `done`, reaped.
        drop(first);
        assert!(NOTICE.lock().unwrap().is_none());
    }

    #[test]
    fn a_rank_that_says_done_is_not_named() {
        let (success, stderr, _) = watch(&["sleep", "30"], |rank, mut writer| {
            writer.write_all(b"done\n").unwrap();
            drop(writer);
            rank.kill().unwrap();
        });
        assert!(success);
        assert_eq!(stderr, "");
    }
}

//! Folder locks: a dump folder or a checkpoint folder is written by one run at a time.
//!
//! [`FolderLock::claim`] creates the file `detcheck.lock` in the folder with an exclusive create
//! (`create_new`: `O_CREAT | O_EXCL`, atomic on local file systems and NFS v3 and later), before
//! anything else is written there, and writes into it who holds the folder ([`Holder`]: the
//! process id, the host, when, the command line). A second run that finds the file fails at
//! once with [`DumpError::Locked`], naming the folder and the holder. The lock is released (the
//! file removed) when the [`FolderLock`] is dropped: after a run that succeeded, one that failed,
//! and during a panic's unwinding; it removes the file only while it still holds this claim's
//! bytes, so it never removes another run's lock.
//!
//! A run killed outright (`SIGKILL`, a crash of the machine) leaves its lock behind. Such a lock
//! is *stale* when its holder ran on this host and no longer runs: no process has its pid, or
//! (where `/proc` tells) the process that has it started at another time than the holder did.
//! A stale lock is never taken over: the folder may hold the files the dead run left, and two
//! runs that both found the lock stale could both take it. The claim fails with
//! [`DumpError::StaleLock`], which says the holder is gone and which file to remove. A lock
//! held on another host (a shared file system) cannot be tested and counts as held.
//!
//! Invariant (one writer per folder): `run --dump` and `--checkpoint` folders, and the restart
//! check's, are claimed with an exclusive create of `detcheck.lock` before anything is written
//! there, by the one process that starts the run (under MPI the leader); a second writer is refused
//! naming the holder, a stale lock is explained, never taken over. A failed run removes only the
//! files of the folder it claimed empty of dumps, so never another run's.
//!
//! Determinism: the lock file holds a wall-clock time and a process id, which no deterministic
//! path reads; it is never part of a dump or a checkpoint (readers ignore it, and a finished run
//! has removed it).
//!
//! Limits: advisory: only detcheck's writers claim; a lock on a network file system without
//! exclusive create semantics (NFS v2) is not atomic.

use super::DumpError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::fs::OpenOptions;
use std::io::{ErrorKind, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The name of the lock file inside a claimed folder.
pub const LOCK_FILE: &str = "detcheck.lock";

/// The `format` field of every lock file.
const FORMAT: &str = "detcheck-lock";

/// The longest command line a lock file keeps (bytes, cut at a character boundary).
const MAX_COMMAND: usize = 400;

/// How long a claim waits for a lock file that another run has just created to get its
/// contents (they are written right after the exclusive create) before calling it unreadable.
const UNREADABLE_GRACE: Duration = Duration::from_secs(1);

/// Who holds a folder: the contents of its lock file (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Holder {
    /// Always `detcheck-lock`.
    pub format: String,
    /// What the folder is claimed for: `dump` or `checkpoint`.
    pub purpose: String,
    /// The holder's process id.
    pub pid: u32,
    /// The holder's host name.
    pub host: String,
    /// When the holder's process started, in clock ticks after boot (`/proc/PID/stat`, field
    /// 22), where the system tells it: a pid reused by another process is told apart by it.
    pub process_start: Option<u64>,
    /// When the folder was claimed (UTC, RFC 3339).
    pub since: String,
    /// The holder's command line.
    pub command: String,
    /// What makes this claim's bytes unique (nanoseconds since 1970 and a counter), so a lock
    /// removes only its own file.
    pub claim: String,
}

impl Holder {
    /// This process, claiming a folder for `purpose`.
    fn this_process(purpose: &str) -> Holder {
        static CLAIMS: AtomicU64 = AtomicU64::new(0);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let pid = std::process::id();
        let command: Vec<String> = std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        Holder {
            format: FORMAT.into(),
            purpose: purpose.into(),
            pid,
            host: host_name(),
            process_start: process_start(pid),
            since: rfc3339_utc(now.as_secs()),
            command: clip(command.join(" ")),
            claim: format!(
                "{}-{}",
                now.as_nanos(),
                CLAIMS.fetch_add(1, Ordering::Relaxed)
            ),
        }
    }

    /// `Some(true)` when the holder is known to be gone (it ran on this host and its process no
    /// longer runs), `Some(false)` when it runs, `None` when this host cannot tell.
    fn is_gone(&self) -> Option<bool> {
        if self.host != host_name() {
            return None;
        }
        // kill(0 or a negative pid) would test a process group: such a pid is no holder's.
        let raw = i32::try_from(self.pid).ok().filter(|&p| p > 0)?;
        match nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), None) {
            Err(nix::errno::Errno::ESRCH) => Some(true),
            // EPERM: a process of another user has the pid; it runs.
            Ok(()) | Err(nix::errno::Errno::EPERM) => {
                match (self.process_start, process_start(self.pid)) {
                    (Some(held), Some(now)) => Some(held != now),
                    _ => Some(false),
                }
            }
            Err(_) => None,
        }
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pid {} on host {}, since {}, for a {} (`{}`)",
            self.pid, self.host, self.since, self.purpose, self.command
        )
    }
}

/// A claimed folder: its lock file exists and holds this claim's [`Holder`] until the lock is
/// dropped.
#[derive(Debug)]
#[must_use = "the folder is released when the lock is dropped"]
pub struct FolderLock {
    file: PathBuf,
    bytes: Vec<u8>,
}

impl FolderLock {
    /// Claims `folder` (which must exist) for `purpose` (`dump` or `checkpoint`): creates its
    /// lock file exclusively and writes this process's [`Holder`] into it.
    ///
    /// # Errors
    /// [`DumpError::Locked`] when another run holds the folder (or its lock file cannot be
    /// read); [`DumpError::StaleLock`] when the run that held it is gone;
    /// [`DumpError::Io`] naming the lock file when it cannot be created or written.
    pub fn claim(folder: &Path, purpose: &str) -> Result<FolderLock, DumpError> {
        let file = folder.join(LOCK_FILE);
        let holder = Holder::this_process(purpose);
        let mut bytes = serde_json::to_vec_pretty(&holder).unwrap_or_default();
        bytes.push(b'\n');
        match OpenOptions::new().write(true).create_new(true).open(&file) {
            Ok(mut created) => {
                // From here on the file is ours: a failure removes it.
                let lock = FolderLock { file, bytes };
                created
                    .write_all(&lock.bytes)
                    .and_then(|()| created.sync_all())
                    .map_err(|e| DumpError::io("write", &lock.file, e))?;
                super::sync_parent(&lock.file);
                Ok(lock)
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(refusal(folder, &file)),
            Err(e) => Err(DumpError::io("create", &file, e)),
        }
    }

    /// The lock file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.file
    }
}

impl Drop for FolderLock {
    fn drop(&mut self) {
        // Only this claim's file: if it was removed by hand and another run claimed the folder
        // since, that run's lock stays.
        if super::read_input(&self.file).is_ok_and(|now| now == self.bytes) {
            let _ = std::fs::remove_file(&self.file);
        }
    }
}

/// Why `folder`, whose lock file `file` exists, cannot be claimed.
fn refusal(folder: &Path, file: &Path) -> DumpError {
    let locked = |holder: String| DumpError::Locked {
        folder: folder.to_owned(),
        lock: file.to_owned(),
        holder,
    };
    let Some(holder) = read_holder(file) else {
        return locked(format!(
            "a run whose lock file is unreadable (being written, damaged, or not detcheck's); \
             if no run uses the folder, remove {}",
            file.display()
        ));
    };
    match holder.is_gone() {
        Some(true) => DumpError::StaleLock {
            folder: folder.to_owned(),
            lock: file.to_owned(),
            holder: holder.to_string(),
        },
        Some(false) => locked(holder.to_string()),
        None => locked(format!(
            "{holder}; this host cannot tell whether it still runs: if it does not, remove {}",
            file.display()
        )),
    }
}

/// The holder a lock file names, waiting briefly for a file just created to be written;
/// `None` when it stays unreadable.
fn read_holder(file: &Path) -> Option<Holder> {
    let start = std::time::Instant::now();
    loop {
        // Through `read_input`: a FIFO put in its place must not block the claim.
        if let Ok(text) = super::read_input(file) {
            if let Ok(holder) = super::strict::from_slice::<Holder>(&text) {
                if holder.format == FORMAT {
                    return Some(holder);
                }
            }
        }
        if start.elapsed() >= UNREADABLE_GRACE {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// This host's name (empty when it cannot be read).
fn host_name() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// When process `pid` started, in clock ticks after boot (field 22 of `/proc/PID/stat`);
/// `None` where there is no `/proc` or no such process.
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 2, the command name, is in parentheses and may hold spaces: count after its end.
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Fields 3, 4, ... follow; the start time is field 22, the 20th of them.
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// `text` cut to [`MAX_COMMAND`] bytes at a character boundary.
fn clip(mut text: String) -> String {
    if text.len() > MAX_COMMAND {
        let mut end = MAX_COMMAND;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// `seconds` after 1970-01-01T00:00:00Z as `YYYY-MM-DDTHH:MM:SSZ`.
fn rfc3339_utc(seconds: u64) -> String {
    let days = seconds / 86_400;
    let rest = seconds % 86_400;
    // Days to a civil date (Howard Hinnant's algorithm), for days after 1970.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pid of a process that has exited (and been reaped): no process has it, for now.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    fn holder_text(pid: u32, host: &str) -> String {
        let mut holder = Holder::this_process("dump");
        holder.pid = pid;
        holder.host = host.into();
        holder.process_start = None;
        serde_json::to_string(&holder).unwrap()
    }

    #[test]
    fn a_claimed_folder_is_refused_naming_the_holder_until_the_lock_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let lock = FolderLock::claim(dir.path(), "dump").unwrap();
        let text = std::fs::read_to_string(lock.path()).unwrap();
        let holder: Holder = serde_json::from_str(&text).unwrap();
        assert_eq!(holder.pid, std::process::id());
        assert_eq!(holder.purpose, "dump");
        let error = FolderLock::claim(dir.path(), "checkpoint").unwrap_err();
        assert!(matches!(error, DumpError::Locked { .. }), "{error:?}");
        let message = error.to_string();
        assert!(
            message.starts_with(&format!("{}: in use by another run", dir.path().display()))
                && message.contains(&format!("pid {}", std::process::id()))
                && message.contains("for a dump"),
            "{message}"
        );
        drop(lock);
        assert!(!dir.path().join(LOCK_FILE).exists());
        let again = FolderLock::claim(dir.path(), "dump").unwrap();
        drop(again);
    }

    #[test]
    fn a_lock_whose_process_is_gone_is_stale_and_never_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(LOCK_FILE);
        let pid = dead_pid();
        let stale = holder_text(pid, &host_name());
        std::fs::write(&file, &stale).unwrap();
        let error = FolderLock::claim(dir.path(), "dump").unwrap_err();
        assert!(matches!(error, DumpError::StaleLock { .. }), "{error:?}");
        let message = error.to_string();
        assert!(
            message.contains(&format!("pid {pid}"))
                && message.contains("is gone")
                && message.contains(&file.display().to_string()),
            "{message}"
        );
        // Refused, not taken over: the file is still the dead run's.
        assert_eq!(std::fs::read_to_string(&file).unwrap(), stale);
    }

    #[test]
    fn a_reused_pid_is_told_apart_by_its_start_time() {
        // This process runs, but it did not start at tick 1: the holder is gone.
        let mut holder = Holder::this_process("dump");
        if holder.process_start.is_none() {
            return; // no /proc here
        }
        assert_eq!(holder.is_gone(), Some(false));
        holder.process_start = Some(1);
        assert_eq!(holder.is_gone(), Some(true));
    }

    #[test]
    fn a_lock_of_another_host_or_unreadable_counts_as_held() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(LOCK_FILE);
        std::fs::write(&file, holder_text(dead_pid(), "some-other-host")).unwrap();
        let message = FolderLock::claim(dir.path(), "dump")
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("in use by another run")
                && message.contains("cannot tell whether it still runs"),
            "{message}"
        );
        std::fs::write(&file, "").unwrap();
        let message = FolderLock::claim(dir.path(), "dump")
            .unwrap_err()
            .to_string();
        assert!(message.contains("lock file is unreadable"), "{message}");
        // A FIFO in its place is unreadable too, and does not block the claim.
        std::fs::remove_file(&file).unwrap();
        nix::unistd::mkfifo(&file, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let message = FolderLock::claim(dir.path(), "dump")
            .unwrap_err()
            .to_string();
        assert!(message.contains("lock file is unreadable"), "{message}");
        std::fs::remove_file(&file).unwrap();
        // pid 0 would test a process group: never a live holder.
        std::fs::write(&file, holder_text(0, &host_name())).unwrap();
        assert!(FolderLock::claim(dir.path(), "dump").is_err());
    }

    /// Issue 16: a holder written as an array of its fields is not read by position (it would
    /// name a gone process here, and be called stale): the lock file is unreadable.
    #[test]
    fn a_holder_given_as_an_array_is_unreadable() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(LOCK_FILE);
        let holder: Holder = serde_json::from_str(&holder_text(dead_pid(), &host_name())).unwrap();
        let array = serde_json::json!([
            holder.format,
            holder.purpose,
            holder.pid,
            holder.host,
            holder.process_start,
            holder.since,
            holder.command,
            holder.claim
        ]);
        std::fs::write(&file, array.to_string()).unwrap();
        let message = FolderLock::claim(dir.path(), "dump")
            .unwrap_err()
            .to_string();
        assert!(message.contains("lock file is unreadable"), "{message}");
    }

    #[test]
    fn a_lock_removes_only_its_own_file() {
        let dir = tempfile::tempdir().unwrap();
        let lock = FolderLock::claim(dir.path(), "dump").unwrap();
        // Removed by hand, and claimed by another run since.
        std::fs::remove_file(lock.path()).unwrap();
        let other = FolderLock::claim(dir.path(), "dump").unwrap();
        drop(lock);
        assert!(other.path().exists(), "the other run's lock must stay");
    }

    #[test]
    fn a_panic_releases_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().to_owned();
        let unwound = std::panic::catch_unwind(|| {
            let _lock = FolderLock::claim(&folder, "dump").unwrap();
            panic!("the run panicked while it held the folder");
        });
        assert!(unwound.is_err());
        assert!(!dir.path().join(LOCK_FILE).exists());
    }

    #[test]
    fn dates_are_rfc3339_utc() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_utc(1_795_374_663), "2026-11-22T19:11:03Z");
    }
}

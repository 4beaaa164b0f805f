//! Files: traces on disk (writing a rank's records to a dump folder, reading dumps back, reading
//! msprobe's dump folders), tensors as safetensors, the atomic write every file of detcheck
//! goes through, the open every input file goes through ([`open_input`]: regular files only, so
//! a FIFO or a device never blocks a read), and the lock that gives a folder one writer
//! ([`FolderLock`]).
//!
//! A *dump* is a folder with one trace file per rank, `rank{R}.dctrace`, in the compact binary
//! format of `docs/trace-format.md` (a versioned header, name and layout definitions, fixed-size
//! records, a footer with the counts). [`TraceWriter`] writes one rank's file as records arrive;
//! [`DumpMode`] chooses what each record holds, like msprobe's `summary_mode`: the md5 only, the
//! md5 and statistics, or the md5 and statistics plus the full tensors, which go to
//! `rank{R}/step{S}.safetensors` beside the trace, one file per rank and step.
//!
//! Guarantees: a file is written to a temporary name, fsynced and renamed, so a dump never holds a
//! half-written file under its final name; a file whose footer is missing or does not match its
//! contents (a truncated copy) is rejected when opened. The bytes of a dump are a pure function of
//! the records written: no clock, host or path is stored (a golden test pins them).
//!
//! Invariant (input is read only from regular files; `open_input`): a FIFO, device or folder given
//! as a scenario, trace, checkpoint, msprobe or curves file is refused before any read can block.
//!
//! Invariant (dump bytes are a pure function of the records, the snapshot and the run id): no clock
//! or path inside; the host, variables and versions are only in the sorted environment snapshot,
//! and the run id is what the writer's caller gives (detcheck's runners derive it from the run and
//! a nonce); safetensors files carry no (hash-ordered) metadata. Golden md5s pin the format
//! (version 1 and the current version, in `compare/tests.rs`).
//!
//! Limits: records must arrive in step order on each rank (a program records step 0, then step
//! 1, ...); the full-tensor mode keeps one step's tensors of a rank in memory before writing them.

pub(crate) mod format;
mod lock;
pub use lock::{FolderLock, Holder, LOCK_FILE};
mod msprobe;
pub(crate) mod reader;
pub(crate) mod source;
pub(crate) mod strict;
pub(crate) mod tensorfile;
mod writer;

pub(crate) use writer::CaptureTap;
#[cfg(test)]
pub(crate) use writer::{write_trace, write_trace_v2};
pub use writer::{Digested, EnvironmentHandle, TraceWriter};

pub(crate) use reader::{load_trace, open_dump, Dump};
pub(crate) use source::Batch;

use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// What a dump holds per record, as msprobe's `summary_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DumpMode {
    /// dtype, shape and the md5 of the canonical bytes.
    Md5,
    /// The md5 and the statistics (max, min, mean, L2 norm, NaN/±Inf counts).
    #[default]
    Stats,
    /// The md5, the statistics and the whole tensor (safetensors, one file per rank and step).
    Full,
}

impl DumpMode {
    /// The name used on the command line and in reports: `md5`, `stats` or `full`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            DumpMode::Md5 => "md5",
            DumpMode::Stats => "stats",
            DumpMode::Full => "full",
        }
    }

    /// `true` when records hold statistics.
    #[must_use]
    pub fn has_stats(self) -> bool {
        self != DumpMode::Md5
    }
}

impl fmt::Display for DumpMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DumpMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "md5" => Ok(DumpMode::Md5),
            "stats" => Ok(DumpMode::Stats),
            "full" => Ok(DumpMode::Full),
            other => Err(format!(
                "unknown dump mode `{other}`: expected md5, stats or full"
            )),
        }
    }
}

/// Why a dump could not be written or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DumpError {
    /// An I/O operation on a file failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done (`create`, `read`, `write`, `rename` ...).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file does not start with the trace magic.
    #[error("{}: not a detcheck trace (the file does not start with `DCTRACE`)", path.display())]
    BadMagic {
        /// The file.
        path: PathBuf,
    },
    /// The file's format version is not one this build reads.
    #[error(
        "{}: trace format version {found} is not supported (this detcheck reads versions 1 to {supported})",
        path.display()
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// The version in the file.
        found: u16,
        /// The version this build reads.
        supported: u16,
    },
    /// The file ends early or has no valid footer: it was not completely written or copied.
    #[error("{}: truncated or incomplete trace: {detail}", path.display())]
    Truncated {
        /// The file.
        path: PathBuf,
        /// What is missing.
        detail: String,
    },
    /// The file's contents are inconsistent.
    #[error("{}: corrupt trace at byte {offset}: {detail}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Where the problem was found.
        offset: u64,
        /// What is wrong.
        detail: String,
    },
    /// A dump folder is not usable as a whole (no traces, a rank missing, mixed world sizes).
    #[error("{}: {detail}", path.display())]
    Folder {
        /// The folder.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A field of a JSON input (msprobe's `dump.json`) is missing or invalid.
    #[error("{}: field `{field}`: {detail}", path.display())]
    Field {
        /// The file.
        path: PathBuf,
        /// The field, as a dotted path.
        field: String,
        /// What is wrong.
        detail: String,
    },
    /// A record came after a record of a later step.
    #[error(
        "record `{name}` of step {step} comes after step {last}: records must be written in step order"
    )]
    OutOfOrder {
        /// The record's name.
        name: String,
        /// Its step.
        step: u64,
        /// The step already written.
        last: u64,
    },
    /// A record that must be written with its tensor (full-tensor mode, or the record a re-run
    /// captures) was given without it (only its record, or only its digest).
    #[error(
        "`{name}` must be written with its tensor (full-tensor mode, or the record a re-run \
         captures), but only its record was given"
    )]
    MissingTensor {
        /// The record's name.
        name: String,
    },
    /// A sharded record's placement does not fit its tensor.
    #[error("cannot record `{name}` as a shard: {source}")]
    Placement {
        /// The record's name.
        name: String,
        /// What does not fit.
        source: crate::value::PlacementError,
    },
    /// A full-mode tensor file that the rank's trace lists is missing, has another size, or
    /// another md5 than the trace records.
    #[error("{}: {detail}", path.display())]
    ListedFile {
        /// The tensor file.
        path: PathBuf,
        /// What is wrong, and what the trace file records.
        detail: String,
    },
    /// A tensor file that a dump's record names (msprobe's `.pt` or `.npy`) cannot be read, or
    /// does not hold the tensor its record describes.
    #[error("{}: bad tensor file: {detail}", path.display())]
    TensorFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// Another run holds the folder (its lock file exists): a second writer is refused at once.
    #[error("{}: in use by another run: {holder} (lock file {}); wait for that run to end, or choose another folder", folder.display(), lock.display())]
    Locked {
        /// The folder.
        folder: PathBuf,
        /// Its lock file.
        lock: PathBuf,
        /// Who holds it ([`Holder`]), as text.
        holder: String,
    },
    /// The folder's lock file names a run that is gone (killed before it could release it).
    #[error(
        "{}: locked by a run that is gone: {holder}; it was killed before it released the \
         folder, and may have left partial files there: remove the folder, or only its lock file \
         {} to keep them",
        folder.display(),
        lock.display()
    )]
    StaleLock {
        /// The folder.
        folder: PathBuf,
        /// Its lock file.
        lock: PathBuf,
        /// Who held it ([`Holder`]), as text.
        holder: String,
    },
    /// Two records to compare carry digests of two kinds that differ for a tensor of their
    /// size (a trace of format version 2 against one of version 3, for a tensor over 4 KiB).
    #[error(
        "cannot compare `{name}` (step {step}, rank {rank}): A's records carry {left} digests and \
         B's {right}, which differ for a tensor over 4 KiB (trace format 2 wrote plain md5, \
         format 3 writes the md5 tree of docs/trace-format.md); record both runs with one \
         detcheck version"
    )]
    MixedDigests {
        /// The record's name.
        name: String,
        /// Its step.
        step: u64,
        /// Its rank.
        rank: u32,
        /// A's digest.
        left: crate::value::DigestKind,
        /// B's digest.
        right: crate::value::DigestKind,
    },
    /// The tensors of a step could not be encoded or decoded as safetensors.
    #[error("{}: safetensors: {detail}", path.display())]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
}

impl DumpError {
    pub(crate) fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        DumpError::Io {
            action,
            path: path.to_owned(),
            source,
        }
    }
}

/// What tells the trace files of one dump from another's: 16 bytes in every version 2 header.
///
/// The writer does not invent it: its caller gives it ([`TraceWriter::set_run_id`]).
/// detcheck's runners give the md5 of the scenario's name, seed, world size, the run's number,
/// and a nonce (the time the run started, in nanoseconds, this process's id and a counter), so
/// two runs never share one, while the bytes of a file stay a pure function of what the writer
/// is given (a test pins them). A program launched by detcheck gets it in `DETCHECK_RUN_ID`
/// (`crate::launch::Launch`). A writer given none writes zeros, [`RunId::UNKNOWN`]: such files
/// are told apart only by their world size, mode and format version. It is an identity, never
/// compared as data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct RunId(pub [u8; 16]);

impl RunId {
    /// No run id (zeros).
    pub const UNKNOWN: RunId = RunId([0; 16]);

    /// The run id of a description: the md5 of its UTF-8 bytes.
    #[must_use]
    pub fn of(description: &str) -> Self {
        RunId(crate::value::digest::Md5Digest::of_bytes(description.as_bytes()).0)
    }

    /// `true` for [`RunId::UNKNOWN`].
    #[must_use]
    pub fn is_unknown(&self) -> bool {
        *self == RunId::UNKNOWN
    }
}

impl fmt::Display for RunId {
    /// 32 lowercase hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl FromStr for RunId {
    type Err = String;
    /// 32 hex digits.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("`{s}` is not 32 hex digits");
        if s.len() != 32 || !s.is_ascii() {
            return Err(bad());
        }
        let mut id = [0u8; 16];
        for (i, b) in id.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(RunId(id))
    }
}

/// The trace file of `rank` in `dir`.
pub(crate) fn trace_path(dir: &Path, rank: u32) -> PathBuf {
    dir.join(format!("rank{rank}.dctrace"))
}

/// The tensor file of `rank` and `step` in `dir` (full-tensor mode).
pub(crate) fn tensor_path(dir: &Path, rank: u32, step: u64) -> PathBuf {
    dir.join(format!("rank{rank}"))
        .join(format!("step{step}.safetensors"))
}

/// The key of a record's tensor inside its step's safetensors file: seq, then name.
pub(crate) fn tensor_key(seq: u32, name: &str) -> String {
    format!("{seq:05}:{name}")
}

/// Writes `bytes` to `path` atomically: a temporary file beside it (`NAME.tmp`), fsync, rename,
/// fsync of the folder. A crash leaves either the old file or the new one, never half of one.
///
/// # Errors
/// [`DumpError::Io`] naming the file when it cannot be created, written or renamed (the
/// temporary file is then removed).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), DumpError> {
    let tmp = temp_path(path);
    let result = (|| {
        let mut file = std::fs::File::create(&tmp).map_err(|e| DumpError::io("create", &tmp, e))?;
        file.write_all(bytes)
            .map_err(|e| DumpError::io("write", &tmp, e))?;
        file.sync_all()
            .map_err(|e| DumpError::io("sync", &tmp, e))?;
        drop(file);
        std::fs::rename(&tmp, path).map_err(|e| DumpError::io("rename", path, e))?;
        sync_parent(path);
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Opens a file of the user's input (a scenario, a trace, a checkpoint, an msprobe or curves
/// file) for reading, refusing at once what is not a regular file: a FIFO (whose read blocks
/// until a writer comes), a device (`/dev/zero` never ends), a folder or a socket.
///
/// The file is opened non-blocking (a FIFO swapped in after the check still cannot block the
/// open) and its type checked again on the open file; for a regular file the flag changes
/// nothing.
///
/// # Errors
/// The open's error, or one of kind [`std::io::ErrorKind::InvalidInput`] saying what the path
/// is (`is a FIFO, not a regular file`); callers name the file.
pub fn open_input(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    input_file_check(path)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)?;
    not_regular(&file.metadata()?)?;
    Ok(file)
}

/// The whole of a file of the user's input, read through [`open_input`].
///
/// # Errors
/// As [`open_input`], and the read's error.
pub fn read_input(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    // No capacity from the file's length here: `File::read_to_end` sizes its buffer from the
    // metadata itself.
    let mut bytes = Vec::new();
    open_input(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// `Ok` when `path` is a regular file (following links); otherwise the error [`open_input`]
/// gives (`NotFound`, or what the path is).
pub(crate) fn input_file_check(path: &Path) -> std::io::Result<()> {
    not_regular(&std::fs::metadata(path)?)
}

/// An error when `metadata` is not a regular file's, saying what it is.
fn not_regular(metadata: &std::fs::Metadata) -> std::io::Result<()> {
    use std::os::unix::fs::FileTypeExt as _;
    let kind = metadata.file_type();
    let what = if kind.is_file() {
        return Ok(());
    } else if kind.is_dir() {
        "a folder"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "neither a file nor a folder"
    };
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("is {what}, not a regular file"),
    ))
}

/// The temporary name a file is written under before its rename.
pub(crate) fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Best effort: makes a rename durable (fsync of the folder; not possible on every platform).
pub(crate) fn sync_parent(path: &Path) {
    if let Some(parent) = path.parent() {
        let parent = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
        if let Ok(dir) = std::fs::File::open(parent) {
            let _ = dir.sync_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_that_is_not_a_regular_file_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("scenario.json");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        // With no writer, a blocking open of the FIFO would wait for ever: on a thread, so a
        // regression fails here instead of hanging the tests.
        let (sent, received) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || sent.send(read_input(&path).map(|_| ())));
        let error = received
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("reading a FIFO must not block")
            .unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
        assert_eq!(error.to_string(), "is a FIFO, not a regular file");
        let error = open_input(dir.path()).unwrap_err();
        assert_eq!(error.to_string(), "is a folder, not a regular file");
        let error = open_input(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(error.to_string(), "is a device, not a regular file");
        let file = dir.path().join("ok.json");
        std::fs::write(&file, b"{}").unwrap();
        assert_eq!(read_input(&file).unwrap(), b"{}");
        assert_eq!(
            open_input(&dir.path().join("missing")).unwrap_err().kind(),
            std::io::ErrorKind::NotFound
        );
    }
}

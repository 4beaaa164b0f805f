//! Files: traces on disk (writing a rank's records to a dump folder, reading dumps back, reading
//! msprobe's dump folders), tensors as safetensors, and the atomic write every file of detcheck
//! goes through.
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
//! Limits: records must arrive in step order on each rank (a program records step 0, then step
//! 1, ...); the full-tensor mode keeps one step's tensors of a rank in memory before writing them.

pub mod capture;
pub(crate) mod format;
pub mod launch;
pub use capture::Capture;
pub use launch::Launch;
mod msprobe;
pub(crate) mod reader;
pub(crate) mod source;
pub(crate) mod tensorfile;
mod writer;

#[cfg(test)]
pub(crate) use writer::{write_trace, write_trace_v2};
pub use writer::{EnvironmentHandle, TraceWriter};

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
    /// Full-tensor mode was asked to write a record without its tensor.
    #[error("full-tensor mode needs the tensor of `{name}`, but only its record was given")]
    MissingTensor {
        /// The record's name.
        name: String,
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
/// ([`Launch`]). A writer given none writes zeros, [`RunId::UNKNOWN`]: such files are told apart
/// only by their world size, mode and format version. It is an identity, never compared as
/// data.
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

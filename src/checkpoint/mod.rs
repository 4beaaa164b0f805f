//! Checkpoints for exact restart: everything a rank needs to continue a run bit for bit.
//!
//! A [`RankCheckpoint`] is one rank's state after `step` steps: tensors (parameters, optimizer
//! moments), the exact position of every random generator, the data loader's position and small
//! counters. [`save_checkpoint`] writes it as two files in a folder: `rank{R}-step{S}.safetensors` (the
//! tensors) and `rank{R}-step{S}.json` (the rest, versioned; see `docs/checkpoints.md`). The JSON
//! names the run that wrote it ([`CheckpointIdentity`]) and the md5 of the safetensors file.
//!
//! Atomicity: each file is written under a temporary name, synced and renamed; the JSON is
//! renamed last, and a checkpoint exists only when its JSON does. A crash mid-write leaves a
//! stray `.tmp` or a safetensors file without its JSON, which readers ignore: the previous
//! checkpoint stays intact and is the one found. A rank keeps its `KEEP` (2) newest checkpoints,
//! so ranks that crashed at different moments still share a complete one.
//!
//! Loading ([`load_checkpoint`]) checks the JSON's own checksum (version 2: the md5 of its bytes
//! before the `checksum` field, so any changed byte is caught), the format version, the identity
//! (seed, world size, rank, and the fingerprint of the scenario's kind and parameters) and the md5
//! of the tensors before trusting any byte; every failure is a [`CheckpointError`] naming the file
//! and what is wrong. Version 1 files (no checksum) are still read.
//!
//! Invariant (a checkpoint is complete or absent): tensors then JSON, each through a temporary
//! file, fsync and rename; a checkpoint exists only when its JSON does, and its JSON records the
//! md5 of its tensors, its format version and the identity of the run (seed, world size, rank,
//! scenario fingerprint), and ends with the md5 of its own bytes, all checked before a byte is
//! trusted. A rank keeps its two newest; ranks resume from the newest step all of them have.
//!
//! Determinism: the files are a pure function of the checkpoint (no clock, host or path inside;
//! maps are ordered), so two runs that agree write identical checkpoints.
//!
//! Limits: each rank writes its own files (a shared file system is not needed, but every rank
//! must find its own files again on resume); tensors are held in memory while written.

use crate::file::tensorfile;
use crate::value::seed::RankRng;
use crate::value::tensor::Tensor;
use md5::{Digest as _, Md5};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The version of the checkpoint JSON this build writes (it reads this one and version 1).
///
/// Version 2 ends with a `checksum` field: the md5 of the JSON's bytes before it, as written
/// (`docs/checkpoints.md`). Version 1 has none.
pub const CHECKPOINT_VERSION: u32 = 2;

/// The first version, still read.
const CHECKPOINT_VERSION_1: u32 = 1;

/// The `format` field of every checkpoint JSON.
const FORMAT: &str = "detcheck-checkpoint";

/// How many complete checkpoints a rank keeps in its folder (the newest ones).
pub(crate) const KEEP: usize = 2;

/// One rank's state after `step` steps.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankCheckpoint {
    /// Steps completed: the first step a resumed run executes.
    pub step: u64,
    /// Tensors by name (parameters, optimizer state).
    pub tensors: BTreeMap<String, Tensor>,
    /// Random generators by name, at their exact positions.
    pub generators: BTreeMap<String, RankRng>,
    /// Small integer state by name (optimizer steps taken, a data loader's epoch and batch).
    pub counters: BTreeMap<String, u64>,
}

impl RankCheckpoint {
    /// An empty checkpoint of the state after `step` steps.
    #[must_use]
    pub fn new(step: u64) -> Self {
        RankCheckpoint {
            step,
            ..RankCheckpoint::default()
        }
    }

    /// Takes tensor `name` out of the checkpoint, checking its shape.
    ///
    /// # Errors
    /// [`CheckpointError::Content`] when it is missing or has another shape.
    pub fn take_tensor(&mut self, name: &str, shape: &[usize]) -> Result<Tensor, CheckpointError> {
        let tensor = self
            .tensors
            .remove(name)
            .ok_or_else(|| CheckpointError::Content {
                what: format!("tensor `{name}`"),
                problem: "is missing".to_owned(),
            })?;
        if tensor.shape() != shape {
            return Err(CheckpointError::Content {
                what: format!("tensor `{name}`"),
                problem: format!("has shape {:?}, the run expects {shape:?}", tensor.shape()),
            });
        }
        Ok(tensor)
    }

    /// Takes generator `name` out of the checkpoint.
    ///
    /// # Errors
    /// [`CheckpointError::Content`] when it is missing.
    pub fn take_generator(&mut self, name: &str) -> Result<RankRng, CheckpointError> {
        self.generators
            .remove(name)
            .ok_or_else(|| CheckpointError::Content {
                what: format!("generator `{name}`"),
                problem: "is missing".to_owned(),
            })
    }

    /// Counter `name`.
    ///
    /// # Errors
    /// [`CheckpointError::Content`] when it is missing.
    pub fn counter(&self, name: &str) -> Result<u64, CheckpointError> {
        self.counters
            .get(name)
            .copied()
            .ok_or_else(|| CheckpointError::Content {
                what: format!("counter `{name}`"),
                problem: "is missing".to_owned(),
            })
    }
}

/// Which run wrote a checkpoint: a resumed run must be the same run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointIdentity {
    /// md5 of the scenario's kind, reduction and parameters (not its steps or checks).
    pub fingerprint: String,
    /// The run's seed.
    pub seed: u64,
    /// The number of ranks.
    pub world_size: usize,
    /// The rank that wrote the checkpoint.
    pub rank: usize,
}

/// Why a checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// A file operation failed.
    #[error("cannot {action} checkpoint file {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The folder holds no complete checkpoint of this rank.
    #[error("no complete checkpoint of rank {rank} in {}{}", dir.display(), wanted.map_or(String::new(), |s| format!(" at step {s}")))]
    NotFound {
        /// The folder.
        dir: PathBuf,
        /// The rank.
        rank: usize,
        /// The step looked for, if one.
        wanted: Option<u64>,
    },
    /// A file is not a valid checkpoint (bad JSON, wrong md5, unreadable tensors).
    #[error("checkpoint file {} is corrupt: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A checkpoint of another format version.
    #[error("checkpoint file {} has version {found}; this build reads versions 1 to {supported}", path.display())]
    Version {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// A checkpoint written by another run.
    #[error("checkpoint file {} was written by a run with {field} = {checkpoint}, but this run has {field} = {run}", path.display())]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// The field that differs (`seed`, `world_size`, `fingerprint`).
        field: &'static str,
        /// Its value in the checkpoint.
        checkpoint: String,
        /// Its value in this run.
        run: String,
    },
    /// A checkpoint that lacks what the program needs (a tensor, a generator, a shape).
    #[error("checkpoint {what} {problem}")]
    Content {
        /// The item.
        what: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl CheckpointError {
    fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        CheckpointError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The checkpoint JSON, as written.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    format: String,
    version: u32,
    identity: CheckpointIdentity,
    step: u64,
    tensors_file: String,
    tensors_md5: String,
    tensors: Vec<String>,
    generators: BTreeMap<String, RankRng>,
    counters: BTreeMap<String, u64>,
    /// Version 2: the md5 of the file's bytes before this field (see [`seal`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    checksum: Option<String>,
}

/// What follows the body of a version 2 JSON: the checksum field, then the closing brace.
const CHECKSUM_FIELD: &str = ",\n  \"checksum\": \"";

/// The bytes of a version 2 JSON: `body` (a pretty-printed object without the `checksum` field,
/// ending in `\n}`) with `"checksum": "<md5 of body without its last 2 bytes>"` added as its
/// last field.
fn seal(body: &[u8]) -> Vec<u8> {
    let open = &body[..body.len() - 2];
    let mut out = open.to_vec();
    out.extend_from_slice(CHECKSUM_FIELD.as_bytes());
    out.extend_from_slice(hex(&Md5::digest(open)).as_bytes());
    out.extend_from_slice(b"\"\n}");
    out
}

/// Checks the checksum of a version 2 JSON (as [`seal`] wrote it); why not, when it fails.
fn check_seal(text: &[u8]) -> Result<(), String> {
    let tail = CHECKSUM_FIELD.len() + 32 + 3;
    let Some(at) = text.len().checked_sub(tail) else {
        return Err("too short to end with its checksum".to_owned());
    };
    let (open, end) = text.split_at(at);
    if !end.starts_with(CHECKSUM_FIELD.as_bytes()) || !end.ends_with(b"\"\n}") {
        return Err("it does not end with its `checksum` field".to_owned());
    }
    let recorded = &end[CHECKSUM_FIELD.len()..CHECKSUM_FIELD.len() + 32];
    let md5 = hex(&Md5::digest(open));
    if md5.as_bytes() != recorded {
        return Err(format!(
            "its checksum does not match its bytes (their md5 is {md5}, the file records {})",
            String::from_utf8_lossy(recorded)
        ));
    }
    Ok(())
}

/// Only `format` and `version`: read first, so a future version is reported as such.
#[derive(Deserialize)]
struct VersionProbe {
    format: Option<String>,
    version: Option<u32>,
}

fn file_stem(rank: usize, step: u64) -> String {
    format!("rank{rank}-step{step}")
}

/// The JSON file of rank `rank`'s checkpoint at `step` in `dir`.
#[must_use]
pub(crate) fn checkpoint_path(dir: &Path, rank: usize, step: u64) -> PathBuf {
    dir.join(format!("{}.json", file_stem(rank, step)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes rank `identity.rank`'s checkpoint into `dir` (created if needed), atomically, then
/// removes that rank's checkpoints older than the two newest. Returns the JSON's path.
///
/// # Errors
/// [`CheckpointError::Io`] naming the file; on error no new checkpoint exists and the previous
/// ones are untouched.
pub fn save_checkpoint(
    dir: &Path,
    identity: &CheckpointIdentity,
    checkpoint: &RankCheckpoint,
) -> Result<PathBuf, CheckpointError> {
    std::fs::create_dir_all(dir).map_err(|e| CheckpointError::io("create folder", dir, e))?;
    let stem = file_stem(identity.rank, checkpoint.step);
    let tensors_path = dir.join(format!("{stem}.safetensors"));
    let entries: Vec<_> = checkpoint
        .tensors
        .iter()
        .map(|(name, t)| {
            let bytes = tensorfile::canonical_bytes(t);
            (name.clone(), t.dtype(), t.shape().to_vec(), bytes)
        })
        .collect();
    let bytes = tensorfile::encode(&entries).map_err(|reason| CheckpointError::Corrupt {
        path: tensors_path.clone(),
        reason,
    })?;
    let manifest = Manifest {
        format: FORMAT.to_owned(),
        version: CHECKPOINT_VERSION,
        identity: identity.clone(),
        step: checkpoint.step,
        tensors_file: format!("{stem}.safetensors"),
        tensors_md5: hex(&Md5::digest(&bytes)),
        tensors: checkpoint.tensors.keys().cloned().collect(),
        generators: checkpoint.generators.clone(),
        counters: checkpoint.counters.clone(),
        checksum: None,
    };
    let json = seal(&serde_json::to_vec_pretty(&manifest).expect("a manifest serializes"));
    let json_path = checkpoint_path(dir, identity.rank, checkpoint.step);
    write_atomically(&tensors_path, &bytes)?;
    write_atomically(&json_path, &json)?;
    for old in complete_steps(dir, identity.rank)?.into_iter().skip(KEEP) {
        let stem = file_stem(identity.rank, old);
        // The JSON goes first: without it the older checkpoint no longer exists.
        let _ = std::fs::remove_file(dir.join(format!("{stem}.json")));
        let _ = std::fs::remove_file(dir.join(format!("{stem}.safetensors")));
    }
    Ok(json_path)
}

/// Removes every checkpoint file of rank `rank` in `dir` (best effort), and the folder when it
/// is then empty.
pub(crate) fn remove_rank_files(dir: &Path, rank: usize) {
    let prefix = format!("rank{rank}-step");
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Writes `bytes` to `path` through a temporary file, synced, then renamed.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    crate::file::write_atomically(path, bytes).map_err(|e| match e {
        crate::file::DumpError::Io {
            action,
            path,
            source,
        } => CheckpointError::Io {
            action,
            path,
            source,
        },
        other => CheckpointError::Corrupt {
            path: path.to_path_buf(),
            reason: other.to_string(),
        },
    })
}

/// The steps of rank `rank`'s complete checkpoints in `dir` (those whose JSON exists), newest
/// first. A missing folder has none.
///
/// # Errors
/// [`CheckpointError::Io`] when the folder cannot be listed.
pub fn complete_steps(dir: &Path, rank: usize) -> Result<Vec<u64>, CheckpointError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(CheckpointError::io("list", dir, e)),
    };
    let prefix = format!("rank{rank}-step");
    let mut steps: Vec<u64> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            name.strip_prefix(&prefix)?
                .strip_suffix(".json")?
                .parse()
                .ok()
        })
        .collect();
    steps.sort_unstable_by(|a, b| b.cmp(a));
    Ok(steps)
}

/// Reads rank `identity.rank`'s checkpoint at `step` from `dir` (the newest when `step` is
/// `None`), checking its version, identity and tensors.
///
/// # Errors
/// [`CheckpointError`] naming the file and what is wrong with it.
pub fn load_checkpoint(
    dir: &Path,
    identity: &CheckpointIdentity,
    step: Option<u64>,
) -> Result<RankCheckpoint, CheckpointError> {
    let steps = complete_steps(dir, identity.rank)?;
    let found = match step {
        Some(s) => steps.contains(&s).then_some(s),
        None => steps.first().copied(),
    };
    let Some(step) = found else {
        return Err(CheckpointError::NotFound {
            dir: dir.to_path_buf(),
            rank: identity.rank,
            wanted: step,
        });
    };
    let json_path = checkpoint_path(dir, identity.rank, step);
    let text = crate::file::read_input(&json_path)
        .map_err(|e| CheckpointError::io("read", &json_path, e))?;
    let corrupt = |reason: String| CheckpointError::Corrupt {
        path: json_path.clone(),
        reason,
    };
    let probe: VersionProbe =
        crate::file::strict::from_slice(&text).map_err(|e| corrupt(e.into_inner().to_string()))?;
    if probe.format.as_deref() != Some(FORMAT) {
        return Err(corrupt(format!("field `format` is not \"{FORMAT}\"")));
    }
    let version = probe
        .version
        .ok_or_else(|| corrupt("field `version` is missing".to_owned()))?;
    match version {
        CHECKPOINT_VERSION => check_seal(&text).map_err(corrupt)?,
        CHECKPOINT_VERSION_1 => {}
        found => {
            // A newer version keeps the checksum at the end: when it holds, the file is of a
            // version this build does not read; when not, its version field may be damaged.
            check_seal(&text)
                .map_err(|why| corrupt(format!("it says version {found}, but {why}")))?;
            return Err(CheckpointError::Version {
                path: json_path,
                found,
                supported: CHECKPOINT_VERSION,
            });
        }
    }
    let manifest: Manifest = crate::file::strict::from_slice(&text)
        .map_err(|e| corrupt(format!("field `{}`: {}", e.path(), e.inner())))?;
    if version == CHECKPOINT_VERSION_1 && manifest.checksum.is_some() {
        return Err(corrupt(
            "it says version 1, which has no `checksum` field: its version is damaged".to_owned(),
        ));
    }
    if manifest.step != step {
        return Err(corrupt(format!(
            "field `step` is {}, but the file name says {step}",
            manifest.step
        )));
    }
    check_identity(&json_path, &manifest.identity, identity)?;

    let tensors_path = dir.join(&manifest.tensors_file);
    if manifest.tensors_file != format!("{}.safetensors", file_stem(identity.rank, step)) {
        return Err(corrupt(format!(
            "field `tensors_file` names {}, not this checkpoint's tensors",
            manifest.tensors_file
        )));
    }
    let bytes = crate::file::read_input(&tensors_path)
        .map_err(|e| CheckpointError::io("read", &tensors_path, e))?;
    let bad_tensors = |reason: String| CheckpointError::Corrupt {
        path: tensors_path.clone(),
        reason,
    };
    let md5 = hex(&Md5::digest(&bytes));
    if md5 != manifest.tensors_md5 {
        return Err(bad_tensors(format!(
            "its md5 is {md5}, but {} records {}",
            json_path.display(),
            manifest.tensors_md5
        )));
    }
    let file =
        safetensors::SafeTensors::deserialize(&bytes).map_err(|e| bad_tensors(e.to_string()))?;
    let mut tensors = BTreeMap::new();
    for name in manifest.tensors {
        let tensor = tensorfile::decode(&file, &name)
            .map_err(bad_tensors)?
            .ok_or_else(|| bad_tensors(format!("tensor `{name}` is missing")))?;
        tensors.insert(name, tensor);
    }
    Ok(RankCheckpoint {
        step,
        tensors,
        generators: manifest.generators,
        counters: manifest.counters,
    })
}

/// The step a run would resume from in `dir` (the newest step every rank has complete); `run` is
/// the identity of the run's checkpoints (its `rank` is ignored: every rank of its world size is
/// read), after reading and checking every rank's files as the resumed ranks will: a bad
/// checkpoint is reported before any rank starts.
///
/// # Errors
/// [`CheckpointError`] naming the first rank's file that is missing, corrupt or written by
/// another run.
pub fn resumable_step(run: &CheckpointIdentity, dir: &Path) -> Result<u64, CheckpointError> {
    let identity = |rank| CheckpointIdentity {
        rank,
        ..run.clone()
    };
    let mut common = u64::MAX;
    for rank in 0..run.world_size {
        let newest = complete_steps(dir, rank)?.first().copied();
        common = common.min(newest.ok_or_else(|| CheckpointError::NotFound {
            dir: dir.to_path_buf(),
            rank,
            wanted: None,
        })?);
    }
    for rank in 0..run.world_size {
        load_checkpoint(dir, &identity(rank), Some(common))?;
    }
    Ok(common)
}

fn check_identity(
    path: &Path,
    found: &CheckpointIdentity,
    run: &CheckpointIdentity,
) -> Result<(), CheckpointError> {
    let mismatch = |field, checkpoint: String, run: String| CheckpointError::Mismatch {
        path: path.to_path_buf(),
        field,
        checkpoint,
        run,
    };
    if found.world_size != run.world_size {
        return Err(mismatch(
            "world_size",
            found.world_size.to_string(),
            run.world_size.to_string(),
        ));
    }
    if found.rank != run.rank {
        return Err(mismatch(
            "rank",
            found.rank.to_string(),
            run.rank.to_string(),
        ));
    }
    if found.seed != run.seed {
        return Err(mismatch(
            "seed",
            found.seed.to_string(),
            run.seed.to_string(),
        ));
    }
    if found.fingerprint != run.fingerprint {
        return Err(mismatch(
            "fingerprint (kind, reduction, params)",
            found.fingerprint.clone(),
            run.fingerprint.clone(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::seed::{derive_stream, Stream};

    fn identity(rank: usize) -> CheckpointIdentity {
        CheckpointIdentity {
            fingerprint: "abc".to_owned(),
            seed: 7,
            world_size: 2,
            rank,
        }
    }

    fn checkpoint(step: u64) -> RankCheckpoint {
        let mut c = RankCheckpoint::new(step);
        let mut rng = derive_stream(1, Stream::Dropout, 0, 0);
        rng.next_u64();
        c.generators.insert("dropout".into(), rng);
        c.tensors.insert(
            "param".into(),
            Tensor::new(
                vec![2, 2],
                crate::value::tensor::TensorData::F32(vec![1.0, -0.0, 2.5, step as f32]),
            )
            .unwrap(),
        );
        c.counters.insert("optimizer_steps".into(), step);
        c
    }

    #[test]
    fn a_checkpoint_reads_back_exactly_and_only_the_newest_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        for step in 1..=4 {
            save_checkpoint(dir.path(), &identity(1), &checkpoint(step)).unwrap();
        }
        assert_eq!(complete_steps(dir.path(), 1).unwrap(), vec![4, 3]);
        let back = load_checkpoint(dir.path(), &identity(1), None).unwrap();
        assert_eq!(back, checkpoint(4));
        assert_eq!(
            load_checkpoint(dir.path(), &identity(1), Some(3)).unwrap(),
            checkpoint(3)
        );
        let err = load_checkpoint(dir.path(), &identity(1), Some(1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "no complete checkpoint of rank 1 in {} at step 1",
                dir.path().display()
            )
        );
        // The bytes are a pure function of the checkpoint.
        let other = tempfile::tempdir().unwrap();
        save_checkpoint(other.path(), &identity(1), &checkpoint(4)).unwrap();
        for ext in ["json", "safetensors"] {
            let name = format!("rank1-step4.{ext}");
            assert_eq!(
                std::fs::read(dir.path().join(&name)).unwrap(),
                std::fs::read(other.path().join(&name)).unwrap()
            );
        }
    }

    #[test]
    fn a_crash_mid_write_leaves_the_previous_checkpoint_intact() {
        let dir = tempfile::tempdir().unwrap();
        save_checkpoint(dir.path(), &identity(0), &checkpoint(2)).unwrap();
        // A crash after the tensors of step 4 were renamed and while its JSON was being
        // written: a safetensors file without its JSON, and a half-written temporary JSON.
        let bytes = std::fs::read(dir.path().join("rank0-step2.safetensors")).unwrap();
        std::fs::write(dir.path().join("rank0-step4.safetensors"), &bytes[..10]).unwrap();
        std::fs::write(
            dir.path().join("rank0-step4.json.tmp"),
            b"{\"format\": \"detch",
        )
        .unwrap();
        assert_eq!(
            load_checkpoint(dir.path(), &identity(0), None).unwrap(),
            checkpoint(2)
        );
        // The next save of step 4 replaces the debris.
        save_checkpoint(dir.path(), &identity(0), &checkpoint(4)).unwrap();
        assert_eq!(
            load_checkpoint(dir.path(), &identity(0), None).unwrap(),
            checkpoint(4)
        );
    }

    #[test]
    fn corrupt_and_mismatched_checkpoints_are_named_errors() {
        let dir = tempfile::tempdir().unwrap();
        let json = save_checkpoint(dir.path(), &identity(0), &checkpoint(3)).unwrap();
        let tensors = dir.path().join("rank0-step3.safetensors");
        let error = |id: &CheckpointIdentity| {
            load_checkpoint(dir.path(), id, None)
                .unwrap_err()
                .to_string()
        };

        let mut other = identity(0);
        other.seed = 8;
        let e = error(&other);
        assert!(
            e.contains("was written by a run with seed = 7, but this run has seed = 8"),
            "{e}"
        );
        other = identity(0);
        other.fingerprint = "xyz".into();
        assert!(error(&other).contains("fingerprint (kind, reduction, params) = abc"));
        other = identity(0);
        other.world_size = 4;
        assert!(error(&other).contains("world_size = 2, but this run has world_size = 4"));

        // A foreign checkpoint (written by a run with another seed) is named as such.
        let foreign = tempfile::tempdir().unwrap();
        let mut other_run = identity(0);
        other_run.seed = 9;
        save_checkpoint(foreign.path(), &other_run, &checkpoint(3)).unwrap();
        let e = load_checkpoint(foreign.path(), &identity(0), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("written by a run with seed = 9"), "{e}");

        // A flipped bit in the tensors.
        let good = std::fs::read(&tensors).unwrap();
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        std::fs::write(&tensors, &flipped).unwrap();
        let e = error(&identity(0));
        assert!(
            e.starts_with(&format!(
                "checkpoint file {} is corrupt: its md5 is",
                tensors.display()
            )),
            "{e}"
        );
        std::fs::write(&tensors, &good).unwrap();

        // A missing tensors file, a future version, a truncated JSON, an edited one, an unknown
        // field (the edits sealed again, as a writer of that content would).
        std::fs::remove_file(&tensors).unwrap();
        assert!(error(&identity(0)).starts_with("cannot read checkpoint file"));
        std::fs::write(&tensors, &good).unwrap();
        let text = std::fs::read_to_string(&json).unwrap();
        let resealed = |text: &str| {
            let body = &text[..text.find(CHECKSUM_FIELD).unwrap()];
            seal(format!("{body}\n}}").as_bytes())
        };
        let newer = text.replace("\"version\": 2", "\"version\": 9");
        std::fs::write(&json, resealed(&newer)).unwrap();
        assert!(error(&identity(0)).ends_with("has version 9; this build reads versions 1 to 2"));
        std::fs::write(&json, &newer).unwrap();
        assert!(error(&identity(0)).contains("is corrupt: it says version 9, but its checksum"));
        std::fs::write(&json, &text[..text.len() / 2]).unwrap();
        assert!(error(&identity(0)).contains("is corrupt: EOF while parsing"));
        std::fs::write(&json, text.replace("\"seed\": 7", "\"seed\": 8")).unwrap();
        assert!(error(&identity(0)).contains("is corrupt: its checksum does not match its bytes"));
        let extra = text.replace("\"step\": 3", "\"step\": 3, \"extra\": 1");
        std::fs::write(&json, resealed(&extra)).unwrap();
        assert!(error(&identity(0)).contains("unknown field `extra`"));
        std::fs::write(&json, &text).unwrap();

        // What the program expects but the checkpoint lacks.
        let mut c = load_checkpoint(dir.path(), &identity(0), None).unwrap();
        let e = c.take_tensor("param", &[4]).unwrap_err().to_string();
        assert_eq!(
            e,
            "checkpoint tensor `param` has shape [2, 2], the run expects [4]"
        );
        assert_eq!(
            c.take_generator("augment").unwrap_err().to_string(),
            "checkpoint generator `augment` is missing"
        );
    }

    /// Issue 16: a struct of the checkpoint JSON (the file, its identity, a generator's state)
    /// given as an array of its fields, sealed as a writer of that content would, is refused
    /// naming the field: never read by position.
    #[test]
    fn a_struct_of_the_json_given_as_an_array_is_refused_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let json = save_checkpoint(dir.path(), &identity(0), &checkpoint(3)).unwrap();
        let text = std::fs::read_to_string(&json).unwrap();
        let body = &text[..text.find(CHECKSUM_FIELD).unwrap()];
        let object: serde_json::Value = serde_json::from_str(&format!("{body}\n}}")).unwrap();
        let fields = |value: &serde_json::Value, names: &[&str]| {
            serde_json::Value::Array(names.iter().map(|n| value[n].clone()).collect())
        };
        let mut identity_array = object.clone();
        identity_array["identity"] = fields(
            &object["identity"],
            &["fingerprint", "seed", "world_size", "rank"],
        );
        let mut generator_array = object.clone();
        generator_array["generators"]["dropout"] = fields(&object["generators"]["dropout"], &["s"]);
        for (edited, field) in [
            (identity_array, "identity"),
            (generator_array, "generators.dropout"),
        ] {
            let sealed = seal(&serde_json::to_vec_pretty(&edited).unwrap());
            std::fs::write(&json, sealed).unwrap();
            let e = load_checkpoint(dir.path(), &identity(0), None)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!(
                    "field `{field}`: expected an object, got an array"
                )),
                "{e}"
            );
        }
        // The same file as objects reads back (the edit above is the only difference).
        std::fs::write(&json, seal(&serde_json::to_vec_pretty(&object).unwrap())).unwrap();
        load_checkpoint(dir.path(), &identity(0), None).unwrap();
    }

    /// Any one changed byte of a checkpoint's JSON is reported as that file's corruption (never
    /// read as other state, never as another version or run).
    #[test]
    fn every_single_byte_change_of_a_checkpoint_json_is_corruption_of_that_file() {
        let dir = tempfile::tempdir().unwrap();
        let json = save_checkpoint(dir.path(), &identity(1), &checkpoint(3)).unwrap();
        let good = std::fs::read(&json).unwrap();
        assert!(load_checkpoint(dir.path(), &identity(1), None).is_ok());
        let mut missed = Vec::new();
        for at in 0..good.len() {
            for mask in [0x01u8, 0x20, 0x80] {
                let mut bad = good.clone();
                bad[at] ^= mask;
                std::fs::write(&json, &bad).unwrap();
                match load_checkpoint(dir.path(), &identity(1), Some(3)) {
                    Err(CheckpointError::Corrupt { path, .. }) if path == json => {}
                    other => missed.push((at, mask, format!("{other:?}"))),
                }
            }
        }
        assert!(missed.is_empty(), "{missed:?}");
        // A version 1 file (no checksum) is still read.
        let text = String::from_utf8(good).unwrap();
        let body = &text[..text.find(CHECKSUM_FIELD).unwrap()];
        let v1 = format!("{body}\n}}").replace("\"version\": 2", "\"version\": 1");
        std::fs::write(&json, v1).unwrap();
        let c = load_checkpoint(dir.path(), &identity(1), Some(3)).unwrap();
        assert_eq!(c, checkpoint(3));
    }
}

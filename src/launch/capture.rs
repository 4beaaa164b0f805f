//! Capturing one record's tensor: how a re-run keeps the values of the record where two runs
//! diverged, without recording every tensor of every step.
//!
//! A [`Capture`] names one record of one rank: (rank, step, name, occurrence: the k-th record of
//! that name in the step, as the comparison engine pairs records). A run asked to capture it
//! writes that record's tensor, and only it, to `rank{R}.capture.safetensors` in a capture
//! folder: the rank body through its recorder's tap (`crate::run`), and a launched program
//! through [`TraceWriter`](crate::file::TraceWriter), whose `from_env` reads the capture from its
//! launch environment (`DETCHECK_CAPTURE`, `DETCHECK_CAPTURE_DIR`) and gives the writer a
//! `CaptureMatcher` (the file layer's `CaptureTap`). `read_capture` reads it back.
//!
//! Determinism: the file is a pure function of the tensor (safetensors without metadata),
//! written atomically.

use crate::file::{tensorfile, write_atomically, CaptureTap, DumpError};
use crate::value::tensor::{Tensor, TensorView};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `DETCHECK_CAPTURE`: `RANK:STEP:OCCURRENCE:NAME` (the name last: it may hold colons).
pub const CAPTURE_VAR: &str = "DETCHECK_CAPTURE";
/// `DETCHECK_CAPTURE_DIR`: where the captured tensor goes.
pub const CAPTURE_DIR_VAR: &str = "DETCHECK_CAPTURE_DIR";

/// One record of one rank whose tensor a run keeps.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Capture {
    /// The rank that records it.
    pub rank: u32,
    /// Its step.
    pub step: u64,
    /// Its name.
    pub name: String,
    /// Which record of that name in the step (0: the first).
    pub occurrence: u32,
}

impl Capture {
    /// The launch variables that ask a program for this capture into `dir`.
    #[must_use]
    pub fn to_env(&self, dir: &Path) -> Vec<(&'static str, String)> {
        vec![
            (
                CAPTURE_VAR,
                format!(
                    "{}:{}:{}:{}",
                    self.rank, self.step, self.occurrence, self.name
                ),
            ),
            (CAPTURE_DIR_VAR, dir.display().to_string()),
        ]
    }

    /// The capture a launched program is asked for, if any (`None` also for an unreadable
    /// value: a capture is a diagnosis aid, never a reason to fail a program).
    #[must_use]
    pub fn from_env() -> Option<(Capture, PathBuf)> {
        let value = std::env::var(CAPTURE_VAR).ok()?;
        let dir = PathBuf::from(std::env::var(CAPTURE_DIR_VAR).ok()?);
        let mut parts = value.splitn(4, ':');
        let capture = Capture {
            rank: parts.next()?.parse().ok()?,
            step: parts.next()?.parse().ok()?,
            occurrence: parts.next()?.parse().ok()?,
            name: parts.next()?.to_owned(),
        };
        Some((capture, dir))
    }
}

/// `DETCHECK_CAPTURE_OPS`: `full` asks the operator trace of a capture for every tensor (full
/// mode) and for the window's outputs (`detcheck run --inside`); unset, it holds statistics.
pub const CAPTURE_OPS_VAR: &str = "DETCHECK_CAPTURE_OPS";
/// `DETCHECK_REPLAY_INPUTS`: a folder holding another run's full operator trace of the same
/// window (`detcheck run --inside`): its window inputs replace this run's (`run --replay`).
pub const REPLAY_INPUTS_VAR: &str = "DETCHECK_REPLAY_INPUTS";

/// What `detcheck run --inside` asks of a capture's operator trace beyond the check's
/// drill-down: every tensor and the window's outputs, and, with `replay_from`, the module run on
/// the inputs another run's trace holds.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct InsideRequest {
    /// The folder of the other run's `--inside` trace whose window inputs this run uses.
    pub replay_from: Option<PathBuf>,
}

impl InsideRequest {
    /// The launch variables that ask a program for it.
    #[must_use]
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![(CAPTURE_OPS_VAR, "full".to_owned())];
        if let Some(from) = &self.replay_from {
            vars.push((REPLAY_INPUTS_VAR, from.display().to_string()));
        }
        vars
    }

    /// The request a launched program is given, if any.
    #[must_use]
    pub fn from_env() -> Option<InsideRequest> {
        (std::env::var(CAPTURE_OPS_VAR).ok()? == "full").then(|| InsideRequest {
            replay_from: std::env::var_os(REPLAY_INPUTS_VAR).map(PathBuf::from),
        })
    }
}

/// The window inputs (`window/in{j}`, by `j`) of step `step` of the operator trace in `dir`,
/// written by `detcheck run --inside` in full mode: what `run --replay` feeds the module.
///
/// # Errors
/// [`DumpError`] naming the folder or file when `dir` holds no finished trace of rank 0, the
/// step's tensor file is missing or unreadable, or it holds no window input.
pub fn read_window_inputs(dir: &Path, step: u64) -> Result<Vec<(u32, Tensor)>, DumpError> {
    if !crate::file::trace_path(dir, 0).is_file() {
        return Err(DumpError::Folder {
            path: dir.to_owned(),
            detail: "holds no operator trace (`detcheck run --dump DIR --inside NAME` writes \
                     one)"
                .to_owned(),
        });
    }
    let path = dir.join("rank0").join(format!("step{step}.safetensors"));
    let bytes = crate::file::read_input(&path).map_err(|e| DumpError::io("read", &path, e))?;
    let file =
        safetensors::SafeTensors::deserialize(&bytes).map_err(|e| DumpError::Safetensors {
            path: path.clone(),
            detail: e.to_string(),
        })?;
    let mut inputs = Vec::new();
    for key in file.names() {
        let Some(j) = key
            .split_once(':')
            .and_then(|(_, name)| name.strip_prefix("window/in"))
            .and_then(|j| j.parse::<u32>().ok())
        else {
            continue;
        };
        let tensor = tensorfile::decode(&file, key).map_err(|detail| DumpError::Safetensors {
            path: path.clone(),
            detail,
        })?;
        inputs.extend(tensor.map(|t| (j, t)));
    }
    if inputs.is_empty() {
        return Err(DumpError::Safetensors {
            path,
            detail: "holds no window input (`window/in{j}`): not a forward window's trace"
                .to_owned(),
        });
    }
    inputs.sort_by_key(|(j, _)| *j);
    Ok(inputs)
}

/// Finds a capture's record among a rank's records as they are recorded.
#[derive(Debug, Clone)]
pub(crate) struct CaptureMatcher {
    capture: Capture,
    dir: PathBuf,
    /// Records of the captured name seen per step.
    seen: BTreeMap<u64, u32>,
    done: bool,
}

impl CaptureMatcher {
    /// A matcher of `capture` for rank `rank`: `None` when the capture is another rank's.
    pub(crate) fn for_rank(capture: &Capture, dir: &Path, rank: u32) -> Option<Self> {
        (capture.rank == rank).then(|| CaptureMatcher {
            capture: capture.clone(),
            dir: dir.to_owned(),
            seen: BTreeMap::new(),
            done: false,
        })
    }

    /// Sees the record (`step`, `name`), with its tensor unless its digest was computed
    /// elsewhere (`None`); writes the tensor when it is the captured one.
    ///
    /// # Errors
    /// [`DumpError`] when the capture file cannot be written;
    /// [`DumpError::MissingTensor`] when the captured record comes without its tensor.
    pub(crate) fn see(
        &mut self,
        step: u64,
        name: &str,
        view: Option<TensorView<'_>>,
    ) -> Result<(), DumpError> {
        if !self.wants(step, name) {
            return Ok(());
        }
        let k = self.seen.entry(step).or_insert(0);
        let matched = *k == self.capture.occurrence;
        *k += 1;
        if matched {
            self.done = true;
            let view = view.ok_or_else(|| DumpError::MissingTensor { name: name.into() })?;
            write_capture(&self.dir, self.capture.rank, view)?;
        }
        Ok(())
    }

    /// `true` while a record (`step`, `name`) may be the captured one: its tensor must come
    /// with it.
    pub(crate) fn wants(&self, step: u64, name: &str) -> bool {
        !self.done && step == self.capture.step && name == self.capture.name
    }
}

impl CaptureTap for CaptureMatcher {
    fn wants(&self, step: u64, name: &str) -> bool {
        CaptureMatcher::wants(self, step, name)
    }

    fn see(
        &mut self,
        step: u64,
        name: &str,
        view: Option<TensorView<'_>>,
    ) -> Result<(), DumpError> {
        CaptureMatcher::see(self, step, name, view)
    }
}

/// The capture file of `rank` in `dir`.
pub(crate) fn capture_path(dir: &Path, rank: u32) -> PathBuf {
    dir.join(format!("rank{rank}.capture.safetensors"))
}

/// Writes `view` as rank `rank`'s captured tensor.
fn write_capture(dir: &Path, rank: u32, view: TensorView<'_>) -> Result<(), DumpError> {
    std::fs::create_dir_all(dir).map_err(|e| DumpError::io("create folder", dir, e))?;
    let path = capture_path(dir, rank);
    let bytes = tensorfile::encode(&[(
        "captured".to_owned(),
        view.dtype(),
        view.shape().to_vec(),
        view.bytes().to_vec(),
    )])
    .map_err(|detail| DumpError::Safetensors {
        path: path.clone(),
        detail,
    })?;
    write_atomically(&path, &bytes)
}

/// Rank `rank`'s captured tensor in `dir`, or `None` when the run wrote none (the record did
/// not occur in that run).
///
/// # Errors
/// [`DumpError`] naming the file when it exists but cannot be read or decoded.
pub(crate) fn read_capture(dir: &Path, rank: u32) -> Result<Option<Tensor>, DumpError> {
    let path = capture_path(dir, rank);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(DumpError::io("read", &path, e)),
    };
    let file =
        safetensors::SafeTensors::deserialize(&bytes).map_err(|e| DumpError::Safetensors {
            path: path.clone(),
            detail: e.to_string(),
        })?;
    tensorfile::decode(&file, "captured").map_err(|detail| DumpError::Safetensors { path, detail })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kth_record_of_a_name_is_captured_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let capture = Capture {
            rank: 1,
            step: 2,
            name: "a:b".to_owned(),
            occurrence: 1,
        };
        assert!(CaptureMatcher::for_rank(&capture, dir.path(), 0).is_none());
        let mut m = CaptureMatcher::for_rank(&capture, dir.path(), 1).unwrap();
        for (step, value) in [(1u64, 1.0f32), (2, 2.0), (2, 3.0), (2, 4.0)] {
            Tensor::from_vec(vec![value, -value])
                .with_view(|v| m.see(step, "a:b", Some(v)))
                .unwrap();
        }
        let t = read_capture(dir.path(), 1).unwrap().unwrap();
        assert_eq!(t, Tensor::from_vec(vec![3.0f32, -3.0]));
        assert_eq!(read_capture(dir.path(), 0).unwrap(), None);
    }

    #[test]
    fn window_inputs_are_read_by_index_from_a_finished_trace_only() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_window_inputs(dir.path(), 0).unwrap_err().to_string();
        assert!(err.contains("holds no operator trace"), "{err}");
        let mut w = crate::file::TraceWriter::create(dir.path(), 0, 1, crate::file::DumpMode::Full)
            .unwrap();
        for (name, v) in [
            ("window/in1", 2.0f32),
            ("op/0000/m/aten.neg.default/out0", 3.0),
        ] {
            w.record(0, name, &Tensor::from_vec(vec![v])).unwrap();
        }
        w.record(0, "window/in0", &Tensor::from_vec(vec![1.0f64, 5.0]))
            .unwrap();
        w.finish().unwrap();
        let inputs = read_window_inputs(dir.path(), 0).unwrap();
        assert_eq!(
            inputs,
            vec![
                (0, Tensor::from_vec(vec![1.0f64, 5.0])),
                (1, Tensor::from_vec(vec![2.0f32]))
            ]
        );
        let err = read_window_inputs(dir.path(), 1).unwrap_err().to_string();
        assert!(err.contains("step1.safetensors"), "{err}");
    }

    #[test]
    fn the_environment_round_trips_names_with_colons() {
        let capture = Capture {
            rank: 3,
            step: 9,
            name: "fwd/x:y".to_owned(),
            occurrence: 2,
        };
        let vars = capture.to_env(Path::new("/c"));
        assert_eq!(vars[0].1, "3:9:2:fwd/x:y");
    }
}

//! Capturing one record's tensor: how a re-run keeps the values of the record where two runs
//! diverged, without recording every tensor of every step.
//!
//! A [`Capture`] names one record of one rank: (rank, step, name, occurrence: the k-th record of
//! that name in the step, as the comparison engine pairs records). A run asked to capture it
//! writes that record's tensor, and only it, to `rank{R}.capture.safetensors` in a capture
//! folder: the rank body through its recorder's tap (`crate::run`), and a launched program
//! through [`TraceWriter`](crate::file::TraceWriter), which reads the capture from its launch
//! environment (`DETCHECK_CAPTURE`, `DETCHECK_CAPTURE_DIR`). `read_capture` reads it back.
//!
//! Determinism: the file is a pure function of the tensor (safetensors without metadata),
//! written atomically.

use crate::file::{tensorfile, write_atomically, DumpError};
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

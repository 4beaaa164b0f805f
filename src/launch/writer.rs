//! The trace writer of a rank detcheck launched: [`TraceWriter::from_env`] and
//! [`TraceWriter::from_env_for_rank`] read the launch contract ([`Launch`]) and the capture a
//! re-run asks for ([`Capture`]), and build a `crate::file::TraceWriter` in the launch's trace
//! folder and mode. They are here, above `crate::file`, so the trace format never depends on the
//! launch contract; the writer keeps its path (`detcheck::file::TraceWriter::from_env`).
//!
//! Determinism: the writer gets only what the launch gives (its folder, mode, run id and
//! snapshot entries); waiting for the rank's start slot moves timing, never a value.

use super::capture::{Capture, CaptureMatcher};
use super::Launch;
use crate::file::{CaptureTap, DumpError, TraceWriter};
use crate::record::environment::keys;
use std::path::PathBuf;

impl TraceWriter {
    /// The writer of this process's rank when detcheck launched it (a `command` scenario), in
    /// the launch's trace folder and mode; `Ok(None)` when detcheck did not launch it, so the
    /// program runs unchanged outside detcheck. It first waits for the rank's start slot
    /// ([`Launch::wait_for_start`]).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), detcheck::file::DumpError> {
    /// let mut writer = detcheck::file::TraceWriter::from_env()?;
    /// for step in 0..3 {
    ///     let loss = detcheck::Tensor::scalar(1.0f32 / (step + 1) as f32);
    ///     if let Some(w) = writer.as_mut() {
    ///         w.record_replicated(step, "loss", &loss)?;
    ///     }
    /// }
    /// if let Some(w) = writer {
    ///     w.finish()?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`DumpError::Field`] naming a variable that cannot be read, or no rank at all (the
    /// `none` launcher: use [`TraceWriter::from_env_for_rank`]); [`DumpError::Io`] when the
    /// file cannot be created.
    pub fn from_env() -> Result<Option<TraceWriter>, DumpError> {
        let Some(launch) = Launch::from_env()? else {
            return Ok(None);
        };
        let Some(rank) = launch.rank else {
            return Err(DumpError::Field {
                path: PathBuf::from("(environment)"),
                field: "DETCHECK_RANK".to_owned(),
                detail: "no launcher gave this process a rank (DETCHECK_RANK, RANK or an MPI \
                         launcher's); with the `none` launcher, one process writes every rank: \
                         use TraceWriter::from_env_for_rank"
                    .to_owned(),
            });
        };
        launch.wait_for_start(rank);
        Self::create(&launch.trace_dir, rank, launch.world_size, launch.mode)
            .and_then(|w| w.with_capture_from_env(rank).with_launch(&launch))
            .map(Some)
    }

    /// The writer of rank `rank` of the launch, for a program that writes every rank's trace
    /// itself (the `none` launcher); `Ok(None)` when detcheck did not launch it.
    ///
    /// # Errors
    /// As [`TraceWriter::from_env`], and [`DumpError::Folder`] when `rank` is not below the
    /// launch's world size.
    pub fn from_env_for_rank(rank: u32) -> Result<Option<TraceWriter>, DumpError> {
        let Some(launch) = Launch::from_env()? else {
            return Ok(None);
        };
        Self::create(&launch.trace_dir, rank, launch.world_size, launch.mode)
            .and_then(|w| w.with_capture_from_env(rank).with_launch(&launch))
            .map(Some)
    }

    /// Takes the run id and the environment entries the launch gives.
    ///
    /// # Errors
    /// None in practice: [`TraceWriter::set_environment`] refuses only an empty key.
    fn with_launch(mut self, launch: &Launch) -> Result<Self, DumpError> {
        if let Some(id) = launch.run_id {
            self.set_run_id(id);
        }
        for (key, value) in [
            (keys::LAUNCHER, &launch.launcher),
            (keys::FINGERPRINT, &launch.fingerprint),
            (keys::MPI_LIBRARY, &launch.mpi_library),
            (keys::PROGRAM, &launch.program),
        ] {
            if let Some(value) = value {
                self.set_environment(key, value.as_str())?;
            }
        }
        Ok(self)
    }

    /// Adds the capture the launch asks for, when it is rank `rank`'s (this writer's).
    fn with_capture_from_env(mut self, rank: u32) -> Self {
        if let Some((capture, dir)) = Capture::from_env() {
            self.set_capture(
                CaptureMatcher::for_rank(&capture, &dir, rank)
                    .map(|m| Box::new(m) as Box<dyn CaptureTap>),
            );
        }
        self
    }
}

//! Writing one rank's trace file (and, in full mode, its tensors), and dumping a scenario's run.
//!
//! [`TraceWriter`] is the public way in: built with `create`, fed with `record` (tensors),
//! `record_view` (views of buffers held elsewhere, read in place) or `write_record` (records a
//! `Recorder` made), closed with `finish`. [`dump_scenario`] runs a
//! scenario on thread ranks with a writer per rank, attached to each rank's recorder.
//!
//! Determinism: the bytes written are a pure function of the records, in the order given; ids are
//! assigned in order of first use. Limits: names up to 65535 bytes, up to 65535 dimensions.

use crate::file::format::{self, Digest, Entry, Footer, Header};
use crate::file::launch::Launch;
use crate::file::tensorfile;
use crate::file::{tensor_key, tensor_path, trace_path, write_atomically, DumpError, DumpMode};
use crate::record::Record;
#[cfg(test)]
use crate::record::Trace;
use crate::value::tensor::{DType, Tensor, TensorView};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};

/// Writes the trace file of one rank, record by record, as `docs/trace-format.md` describes.
///
/// Records must come in step order; within a step, [`TraceWriter::record`] numbers them in call
/// order (as [`Recorder`](crate::record::Recorder) does). Nothing is visible under the final name until
/// [`TraceWriter::finish`] has written the footer, synced the file and renamed it; a writer dropped
/// without `finish` removes its temporary file.
///
/// ```no_run
/// # fn main() -> Result<(), detcheck::file::DumpError> {
/// use detcheck::file::{DumpMode, TraceWriter};
/// use detcheck::Tensor;
/// let mut writer = TraceWriter::create("dump".as_ref(), 0, 1, DumpMode::Stats)?;
/// for step in 0..3 {
///     let loss = Tensor::scalar(1.0f32 / (step + 1) as f32);
///     writer.record_replicated(step, "loss", &loss)?;
/// }
/// writer.finish()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TraceWriter {
    dir: PathBuf,
    path: PathBuf,
    tmp: PathBuf,
    rank: u32,
    mode: DumpMode,
    out: Option<BufWriter<File>>,
    names: HashMap<String, u32>,
    layouts: HashMap<(DType, Vec<usize>), u32>,
    num_records: u64,
    offset: u64,
    /// The (step, seq) of the last record written.
    last: Option<(u64, u32)>,
    /// The tensors of the step being written (full mode).
    pending: Vec<(String, DType, Vec<usize>, Vec<u8>)>,
    scratch: Vec<u8>,
}

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
        Self::create(&launch.trace_dir, rank, launch.world_size, launch.mode).map(Some)
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
        Self::create(&launch.trace_dir, rank, launch.world_size, launch.mode).map(Some)
    }

    /// Starts the trace of `rank` (of `world_size`) in `dir`, creating the folder if needed.
    ///
    /// # Errors
    /// [`DumpError::Io`] when the folder or the temporary file cannot be created;
    /// [`DumpError::Folder`] when `rank` is not below `world_size`.
    pub fn create(
        dir: &Path,
        rank: u32,
        world_size: u32,
        mode: DumpMode,
    ) -> Result<Self, DumpError> {
        if rank >= world_size {
            return Err(DumpError::Folder {
                path: dir.to_owned(),
                detail: format!("rank {rank} does not fit world size {world_size}"),
            });
        }
        std::fs::create_dir_all(dir).map_err(|e| DumpError::io("create folder", dir, e))?;
        let path = trace_path(dir, rank);
        let tmp = super::temp_path(&path);
        let file = File::create(&tmp).map_err(|e| DumpError::io("create", &tmp, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let header = format::encode_header(&Header {
            mode,
            rank,
            world_size,
        });
        out.write_all(&header)
            .map_err(|e| DumpError::io("write", &tmp, e))?;
        Ok(TraceWriter {
            dir: dir.to_owned(),
            path,
            tmp,
            rank,
            mode,
            out: Some(out),
            names: HashMap::new(),
            layouts: HashMap::new(),
            num_records: 0,
            offset: format::HEADER_LEN as u64,
            last: None,
            pending: Vec::new(),
            scratch: Vec::with_capacity(256),
        })
    }

    /// The final path of the trace file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The number of records written so far.
    #[must_use]
    pub fn num_records(&self) -> u64 {
        self.num_records
    }

    /// Records `tensor` as `name` at `step`: its md5, and its statistics unless the mode is md5.
    ///
    /// # Errors
    /// [`DumpError::OutOfOrder`] for a step before the last one written; [`DumpError::Io`].
    pub fn record(&mut self, step: u64, name: &str, tensor: &Tensor) -> Result<(), DumpError> {
        self.record_tensor(step, name, tensor, false)
    }

    /// Records a tensor that every rank must hold with identical bits.
    ///
    /// # Errors
    /// As [`TraceWriter::record`].
    pub fn record_replicated(
        &mut self,
        step: u64,
        name: &str,
        tensor: &Tensor,
    ) -> Result<(), DumpError> {
        self.record_tensor(step, name, tensor, true)
    }

    /// Records a view as `name` at `step`, reading its bytes in place (in full mode they are
    /// copied as they are into the step's safetensors file): the same record and file bytes as
    /// [`TraceWriter::record`] writes for a tensor of the same dtype, shape and values.
    ///
    /// # Errors
    /// As [`TraceWriter::record`].
    pub fn record_view(
        &mut self,
        step: u64,
        name: &str,
        view: TensorView<'_>,
    ) -> Result<(), DumpError> {
        self.record_any(step, name, view, false)
    }

    /// Records a view that every rank must hold with identical bits.
    ///
    /// # Errors
    /// As [`TraceWriter::record`].
    pub fn record_replicated_view(
        &mut self,
        step: u64,
        name: &str,
        view: TensorView<'_>,
    ) -> Result<(), DumpError> {
        self.record_any(step, name, view, true)
    }

    fn record_tensor(
        &mut self,
        step: u64,
        name: &str,
        tensor: &Tensor,
        replicated: bool,
    ) -> Result<(), DumpError> {
        tensor.with_view(|view| self.record_any(step, name, view, replicated))
    }

    fn record_any(
        &mut self,
        step: u64,
        name: &str,
        view: TensorView<'_>,
        replicated: bool,
    ) -> Result<(), DumpError> {
        let seq = match self.last {
            Some((last_step, last_seq)) if last_step == step => last_seq + 1,
            _ => 0,
        };
        let record = Record::of_view(
            self.rank,
            step,
            seq,
            name,
            replicated,
            view,
            self.mode.has_stats(),
        );
        self.write_record_view(&record, Some(view))
    }

    /// Writes a record made elsewhere (by a [`Recorder`](crate::record::Recorder)), with its tensor in full mode.
    ///
    /// Its `rank` field is not checked; the file's rank is the writer's.
    ///
    /// # Errors
    /// [`DumpError::OutOfOrder`] when (step, seq) does not follow the last record;
    /// [`DumpError::MissingTensor`] in full mode without a tensor; [`DumpError::Io`].
    pub fn write_record(
        &mut self,
        record: &Record,
        tensor: Option<&Tensor>,
    ) -> Result<(), DumpError> {
        match tensor {
            Some(tensor) => tensor.with_view(|view| self.write_record_view(record, Some(view))),
            None => self.write_record_view(record, None),
        }
    }

    /// Writes a record made elsewhere, with a view of its tensor in full mode (its bytes are
    /// written as they are).
    ///
    /// # Errors
    /// As [`TraceWriter::write_record`].
    pub fn write_record_view(
        &mut self,
        record: &Record,
        view: Option<TensorView<'_>>,
    ) -> Result<(), DumpError> {
        if let Some(last) = self.last {
            if (record.step, record.seq) <= last {
                return Err(DumpError::OutOfOrder {
                    name: record.name.clone(),
                    step: record.step,
                    last: last.0,
                });
            }
            if record.step != last.0 {
                self.flush_tensors(last.0)?;
            }
        }
        if self.mode == DumpMode::Full {
            let view = view.ok_or_else(|| DumpError::MissingTensor {
                name: record.name.clone(),
            })?;
            self.pending.push((
                tensor_key(record.seq, &record.name),
                view.dtype(),
                view.shape().to_vec(),
                view.bytes().to_vec(),
            ));
        }
        self.scratch.clear();
        let name = match self.names.get(&record.name) {
            Some(&id) => id,
            None => {
                let id = self.names.len() as u32;
                format::encode_name(&mut self.scratch, id, &record.name);
                self.names.insert(record.name.clone(), id);
                id
            }
        };
        let layout_key = (record.dtype, record.shape.clone());
        let layout = match self.layouts.get(&layout_key) {
            Some(&id) => id,
            None => {
                let id = self.layouts.len() as u32;
                format::encode_layout(&mut self.scratch, id, record.dtype, &record.shape);
                self.layouts.insert(layout_key, id);
                id
            }
        };
        let entry = Entry {
            step: record.step,
            seq: record.seq,
            name,
            layout,
            replicated: record.replicated,
            digest: Digest::md5(record.md5.0),
        };
        let stats = self.mode.has_stats().then_some(&record.stats);
        format::encode_record(&mut self.scratch, &entry, stats);
        self.write_scratch()?;
        self.num_records += 1;
        self.last = Some((record.step, record.seq));
        Ok(())
    }

    fn write_scratch(&mut self) -> Result<(), DumpError> {
        let out = self.out.as_mut().expect("not finished");
        out.write_all(&self.scratch)
            .map_err(|e| DumpError::io("write", &self.tmp, e))?;
        self.offset += self.scratch.len() as u64;
        Ok(())
    }

    /// Writes the pending tensors of `step` to their safetensors file.
    fn flush_tensors(&mut self, step: u64) -> Result<(), DumpError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let path = tensor_path(&self.dir, self.rank, step);
        let pending = std::mem::take(&mut self.pending);
        let bytes = tensorfile::encode(&pending).map_err(|detail| DumpError::Safetensors {
            path: path.clone(),
            detail,
        })?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| DumpError::io("create folder", parent, e))?;
        }
        write_atomically(&path, &bytes)
    }

    /// Writes the footer, syncs the file and renames it to its final name.
    ///
    /// # Errors
    /// [`DumpError::Io`] when writing, syncing or renaming fails.
    pub fn finish(mut self) -> Result<PathBuf, DumpError> {
        if let Some((step, _)) = self.last {
            self.flush_tensors(step)?;
        }
        let footer = format::encode_footer(&Footer {
            num_records: self.num_records,
            num_names: self.names.len() as u32,
            num_layouts: self.layouts.len() as u32,
            offset: self.offset,
        });
        let mut out = self.out.take().expect("finished once");
        let tmp = self.tmp.clone();
        out.write_all(&footer)
            .map_err(|e| DumpError::io("write", &tmp, e))?;
        let file = out
            .into_inner()
            .map_err(|e| DumpError::io("write", &tmp, e.into_error()))?;
        file.sync_all()
            .map_err(|e| DumpError::io("sync", &tmp, e))?;
        drop(file);
        std::fs::rename(&tmp, &self.path).map_err(|e| DumpError::io("rename", &self.path, e))?;
        super::sync_parent(&self.path);
        Ok(self.path.clone())
    }
}

impl Drop for TraceWriter {
    fn drop(&mut self) {
        if self.out.take().is_some() {
            // Not finished: leave nothing that could be mistaken for a trace.
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes a whole in-memory trace (md5 or stats mode: records hold no tensors) to `dir`.
#[cfg(test)]
pub(crate) fn write_trace(dir: &Path, trace: &Trace, mode: DumpMode) -> Result<(), DumpError> {
    for rank in &trace.ranks {
        let mut w = TraceWriter::create(dir, rank.rank, trace.world_size() as u32, mode)?;
        for r in &rank.records {
            w.write_record(r, None)?;
        }
        w.finish()?;
    }
    Ok(())
}

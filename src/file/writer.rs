//! Writing one rank's trace file (and, in full mode, its tensors), and dumping a scenario's run.
//!
//! [`TraceWriter`] is the public way in: built with `create`, fed with `record` (tensors),
//! `record_view` (views of buffers held elsewhere, read in place) or `write_record` (records a
//! `Recorder` made), closed with `finish`. [`dump_scenario`] runs a
//! scenario on thread ranks with a writer per rank, attached to each rank's recorder. A launched
//! program's writer (`TraceWriter::from_env`, `from_env_for_rank`) is built by the layer above,
//! `crate::launch`, which reads the launch contract and gives the writer its capture
//! ([`CaptureTap`]): this file never reads the launch environment.
//!
//! Invariant (a dump file is complete or absent): temp file, fsync, rename, fsync of the folder; a
//! reader checks the footer (end magic, offset, counts) before trusting any record, so a truncated
//! or appended file is an error, never a shorter trace.
//!
//! Determinism: the bytes written are a pure function of the records, in the order given, the
//! environment snapshot and the run id; ids are assigned in order of first use. Limits: names up
//! to 65535 bytes, up to 65535 dimensions.

use crate::file::format::{self, Digest, Entry, Footer, Header, TensorFile};
use crate::file::tensorfile;
use crate::file::{
    tensor_key, tensor_path, trace_path, write_atomically, DumpError, DumpMode, RunId,
};
#[cfg(test)]
use crate::record::Trace;
use crate::record::{Environment, Record};
use crate::value::digest::{Md5Digest, Stats};
use crate::value::position::{Placement, PositionDigest, Shard};
use crate::value::tensor::{DType, Tensor, TensorView};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A record whose digest was computed elsewhere (a GPU kernel, another process): what
/// [`TraceWriter::record_digested`] writes instead of reading a tensor's bytes. The digest must be
/// the tree digest of the tensor's canonical bytes ([`crate::value::tree_digest`]; the Python
/// package's Triton kernel computes it on a GPU).
#[derive(Debug, Clone, Copy)]
pub struct Digested<'a> {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: &'a [usize],
    /// The tree digest of the canonical bytes.
    pub digest: Md5Digest,
    /// Statistics, where they were computed (written in stats mode).
    pub stats: Option<Stats>,
    /// `true` when every rank must hold identical bits for it.
    pub replicated: bool,
}

/// What keeps the tensor of the one record a re-run captures (`DETCHECK_CAPTURE`): the writer
/// shows it every record before writing it. The launch layer gives it (`crate::launch`'s
/// `CaptureMatcher`, through `TraceWriter::from_env`); the file layer only feeds it.
pub(crate) trait CaptureTap: std::fmt::Debug + Send + Sync {
    /// `true` while a record (`step`, `name`) may be the captured one: its tensor must come
    /// with it.
    fn wants(&self, step: u64, name: &str) -> bool;

    /// Sees the record (`step`, `name`), with its tensor unless its digest was computed
    /// elsewhere (`None`); keeps the tensor when it is the captured one.
    ///
    /// # Errors
    /// [`DumpError`] when the capture cannot be kept; [`DumpError::MissingTensor`] when the
    /// captured record comes without its tensor.
    fn see(&mut self, step: u64, name: &str, view: Option<TensorView<'_>>)
        -> Result<(), DumpError>;
}

/// Writes the trace file of one rank, record by record, as `docs/trace-format.md` describes.
///
/// Records must come in step order; within a step, [`TraceWriter::record`] numbers them in call
/// order (as [`Recorder`](crate::record::Recorder) does). Nothing is visible under the final name until
/// [`TraceWriter::finish`] has written the footer, synced the file and renamed it; a writer dropped
/// without `finish` removes its temporary file.
///
/// The file (format version 2) carries an environment snapshot, [`Environment::capture`] when the
/// writer is created, to which [`TraceWriter::set_environment`] adds entries, and the run id its
/// caller gives ([`TraceWriter::set_run_id`]); both may be set at any time before `finish`.
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
    /// The entries not yet written: the block being filled (version 2), or one record's entries
    /// (version 1).
    scratch: Vec<u8>,
    /// The record whose tensor a re-run keeps (`DETCHECK_CAPTURE`), when it is this rank's.
    capture: Option<Box<dyn CaptureTap>>,
    world_size: u32,
    /// The format version written: 2, or 1 for tests of the version 1 reader.
    version: u16,
    /// Blocks written, and the records of the block being filled (version 2).
    num_blocks: u32,
    block_records: u32,
    /// Shared with the [`EnvironmentHandle`]s given out.
    environment: EnvironmentHandle,
    run_id: RunId,
    /// The safetensors files written (full mode), listed in the trace with their md5.
    tensor_files: Vec<TensorFile>,
}

impl TraceWriter {
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
        Self::create_version(dir, rank, world_size, mode, format::VERSION)
    }

    /// [`TraceWriter::create`] for a format version: 2, or 1 (no blocks, checksums, snapshot or
    /// run id) for tests of the version 1 reader.
    pub(crate) fn create_version(
        dir: &Path,
        rank: u32,
        world_size: u32,
        mode: DumpMode,
        version: u16,
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
        // Written again by `finish`, with the run id set by then.
        let header = format::encode_header(&Header {
            version,
            mode,
            rank,
            world_size,
            run_id: RunId::UNKNOWN,
            digest: format::digest_of_version(version),
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
            offset: header.len() as u64,
            last: None,
            pending: Vec::new(),
            scratch: Vec::with_capacity(256),
            capture: None,
            world_size,
            version,
            num_blocks: 0,
            block_records: 0,
            environment: EnvironmentHandle(Arc::new(Mutex::new(Environment::capture()))),
            run_id: RunId::UNKNOWN,
            tensor_files: Vec::new(),
        })
    }

    /// Sets `key` to `value` in the file's environment snapshot (replacing an earlier value of
    /// `key`): what the recorder knows that could change bits, such as a framework's version
    /// (`torch.version`). Callable at any time before [`TraceWriter::finish`]; the snapshot is
    /// stored sorted by key, so the order of calls does not matter. Keys and values longer than
    /// [`MAX_LEN`](crate::record::environment::MAX_LEN) bytes are cut.
    ///
    /// # Errors
    /// [`DumpError::Field`] for an empty key.
    pub fn set_environment(&mut self, key: &str, value: &str) -> Result<(), DumpError> {
        self.environment.set(key, value)
    }

    /// The environment snapshot as it would be written now: [`Environment::capture`] of the
    /// process that created the writer, and the entries set since.
    #[must_use]
    pub fn environment(&self) -> Environment {
        self.environment.lock().clone()
    }

    /// A handle that sets entries of this writer's snapshot, for code that no longer holds the
    /// writer (one moved to a thread of its own, as the Python package's is).
    #[must_use]
    pub fn environment_handle(&self) -> EnvironmentHandle {
        self.environment.clone()
    }

    /// Replaces the whole snapshot (tests pin the bytes of a file with a fixed one).
    #[cfg(test)]
    pub(crate) fn replace_environment(&mut self, environment: Environment) {
        *self.environment.lock() = environment;
    }

    /// Sets the run id written in the header: what tells this dump's files from another
    /// dump's (see [`RunId`]). Callable at any time before [`TraceWriter::finish`].
    pub fn set_run_id(&mut self, run_id: RunId) {
        self.run_id = run_id;
    }

    /// Gives the writer the capture a re-run asks for, when it is this writer's rank's
    /// (`crate::launch` does, from the launch environment).
    pub(crate) fn set_capture(&mut self, capture: Option<Box<dyn CaptureTap>>) {
        self.capture = capture;
    }

    /// The run id the header will hold.
    #[must_use]
    pub fn run_id(&self) -> RunId {
        self.run_id
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

    /// Records `tensor` as this rank's shard of a larger tensor (FSDP, tensor parallel): the
    /// record of [`TraceWriter::record`], followed by the shard's placement and the position
    /// digest of its elements (`value/position.rs`), which the `world_sizes` check adds up over
    /// the ranks to compare the global tensor across world sizes. Never replicated.
    ///
    /// # Errors
    /// As [`TraceWriter::record`]; [`DumpError::Placement`] when `placement` does not fit the
    /// tensor's shape.
    pub fn record_sharded(
        &mut self,
        step: u64,
        name: &str,
        tensor: &Tensor,
        placement: &Placement,
    ) -> Result<(), DumpError> {
        tensor.with_view(|view| self.record_sharded_view(step, name, view, placement))
    }

    /// [`TraceWriter::record_sharded`] for a view, read in place.
    ///
    /// # Errors
    /// As [`TraceWriter::record_sharded`].
    pub fn record_sharded_view(
        &mut self,
        step: u64,
        name: &str,
        view: TensorView<'_>,
        placement: &Placement,
    ) -> Result<(), DumpError> {
        let digest =
            PositionDigest::of_shard(view, placement).map_err(|source| DumpError::Placement {
                name: name.to_owned(),
                source,
            })?;
        let seq = match self.last {
            Some((last_step, last_seq)) if last_step == step => last_seq + 1,
            _ => 0,
        };
        let mut record = Record::of_view(
            (self.rank, step, seq),
            name,
            false,
            view,
            self.mode.has_stats(),
        );
        record.shard = Some(Shard {
            placement: placement.clone(),
            digest,
        });
        self.write_record_view(&record, Some(view))
    }

    /// Records a tensor whose digest (and statistics) were computed elsewhere, on a GPU for
    /// instance ([`Digested`]): no bytes are read or written. `stats` are written in stats mode
    /// (empty when `None`).
    ///
    /// # Errors
    /// As [`TraceWriter::record`]; [`DumpError::MissingTensor`] in full mode, or for the record
    /// a re-run captures ([`TraceWriter::needs_tensor`] says which records must come with
    /// their tensor).
    pub fn record_digested(
        &mut self,
        step: u64,
        name: &str,
        digested: &Digested<'_>,
    ) -> Result<(), DumpError> {
        let seq = match self.last {
            Some((last_step, last_seq)) if last_step == step => last_seq + 1,
            _ => 0,
        };
        let record = Record {
            rank: self.rank,
            step,
            seq,
            name: name.to_owned(),
            replicated: digested.replicated,
            dtype: digested.dtype,
            shape: digested.shape.to_vec(),
            md5: digested.digest,
            stats: if self.mode.has_stats() {
                digested.stats.unwrap_or_default()
            } else {
                Stats::default()
            },
            shard: None,
        };
        self.write_record_view(&record, None)
    }

    /// `true` when the record (`step`, `name`) must be given with its tensor: in full mode, and
    /// for a record the re-run's capture may want. A caller that computes digests elsewhere
    /// copies only those tensors.
    #[must_use]
    pub fn needs_tensor(&self, step: u64, name: &str) -> bool {
        self.mode == DumpMode::Full || self.capture.as_ref().is_some_and(|m| m.wants(step, name))
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
            (self.rank, step, seq),
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
        if let Some(shard) = &record.shard {
            shard
                .placement
                .check(&record.shape)
                .map_err(|source| DumpError::Placement {
                    name: record.name.clone(),
                    source,
                })?;
            if self.version < format::VERSION {
                return Err(DumpError::Placement {
                    name: record.name.clone(),
                    source: crate::value::PlacementError::Unsupported,
                });
            }
        }
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
        if let Some(matcher) = self.capture.as_mut() {
            matcher.see(record.step, &record.name, view)?;
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
            digest: Digest::current(record.md5.0),
        };
        let stats = self.mode.has_stats().then_some(&record.stats);
        format::encode_record(&mut self.scratch, &entry, stats);
        if let Some(shard) = &record.shard {
            // Right after its record, in the same block (checked before anything was written).
            format::encode_shard(&mut self.scratch, shard);
        }
        self.num_records += 1;
        self.block_records += 1;
        self.last = Some((record.step, record.seq));
        if self.version == format::VERSION_1 || self.scratch.len() >= format::BLOCK_TARGET {
            self.flush_block()?;
        }
        Ok(())
    }

    /// Writes the entries not yet written: as a block `B` with its checksum (version 2), or as
    /// they are (version 1).
    fn flush_block(&mut self) -> Result<(), DumpError> {
        if self.scratch.is_empty() {
            return Ok(());
        }
        let out = self.out.as_mut().expect("not finished");
        let write = |out: &mut BufWriter<File>, bytes: &[u8]| {
            out.write_all(bytes)
                .map_err(|e| DumpError::io("write", &self.tmp, e))
        };
        if self.version != format::VERSION_1 {
            let framing =
                format::encode_section(format::TAG_BLOCK, self.block_records, &self.scratch);
            write(out, &framing)?;
            self.offset += framing.len() as u64;
            self.num_blocks += 1;
        }
        write(out, &self.scratch)?;
        self.offset += self.scratch.len() as u64;
        self.scratch.clear();
        self.block_records = 0;
        Ok(())
    }

    /// Writes a section (`V` or `T`) of `count` items; returns its offset.
    fn write_section(&mut self, tag: u8, count: u32, payload: &[u8]) -> Result<u64, DumpError> {
        let at = self.offset;
        let framing = format::encode_section(tag, count, payload);
        let out = self.out.as_mut().expect("not finished");
        out.write_all(&framing)
            .and_then(|()| out.write_all(payload))
            .map_err(|e| DumpError::io("write", &self.tmp, e))?;
        self.offset += (framing.len() + payload.len()) as u64;
        Ok(at)
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
        write_atomically(&path, &bytes)?;
        self.tensor_files.push(TensorFile {
            step,
            len: bytes.len() as u64,
            md5: Md5Digest::of_bytes(&bytes),
        });
        Ok(())
    }

    /// Writes the last block, the environment and tensor-file sections and the footer, then the
    /// header with its run id; syncs the file and renames it to its final name.
    ///
    /// # Errors
    /// [`DumpError::Io`] when writing, syncing or renaming fails (the temporary file is then
    /// removed).
    pub fn finish(mut self) -> Result<PathBuf, DumpError> {
        let result = self.finish_file();
        if result.is_err() {
            self.out = None;
            let _ = std::fs::remove_file(&self.tmp);
        }
        result
    }

    fn finish_file(&mut self) -> Result<PathBuf, DumpError> {
        if let Some((step, _)) = self.last {
            self.flush_tensors(step)?;
        }
        self.flush_block()?;
        let mut footer = Footer {
            num_records: self.num_records,
            num_names: self.names.len() as u32,
            num_layouts: self.layouts.len() as u32,
            offset: 0,
            num_blocks: self.num_blocks,
            environment: 0,
            tensor_files: 0,
        };
        let footer = if self.version == format::VERSION_1 {
            footer.offset = self.offset;
            format::encode_footer_v1(&footer).to_vec()
        } else {
            let snapshot = self.environment();
            let env = format::encode_environment(&snapshot);
            let count = snapshot.len() as u32;
            footer.environment = self.write_section(format::TAG_ENVIRONMENT, count, &env)?;
            let files = format::encode_tensor_files(&self.tensor_files);
            let count = self.tensor_files.len() as u32;
            footer.tensor_files = self.write_section(format::TAG_TENSOR_FILES, count, &files)?;
            footer.offset = self.offset;
            format::encode_footer(&footer).to_vec()
        };
        let header = format::encode_header(&Header {
            version: self.version,
            mode: self.mode,
            rank: self.rank,
            world_size: self.world_size,
            run_id: self.run_id,
            digest: format::digest_of_version(self.version),
        });
        let tmp = &self.tmp;
        let mut out = self.out.take().expect("finished once");
        out.write_all(&footer)
            .and_then(|()| out.seek(SeekFrom::Start(0)))
            .and_then(|_| out.write_all(&header))
            .map_err(|e| DumpError::io("write", tmp, e))?;
        let file = out
            .into_inner()
            .map_err(|e| DumpError::io("write", tmp, e.into_error()))?;
        file.sync_all().map_err(|e| DumpError::io("sync", tmp, e))?;
        drop(file);
        std::fs::rename(&self.tmp, &self.path)
            .map_err(|e| DumpError::io("rename", &self.path, e))?;
        super::sync_parent(&self.path);
        Ok(self.path.clone())
    }
}

/// Sets entries of a [`TraceWriter`]'s environment snapshot from anywhere
/// ([`TraceWriter::environment_handle`]); what is set before the writer's `finish` is written.
#[derive(Debug, Clone)]
pub struct EnvironmentHandle(Arc<Mutex<Environment>>);

impl EnvironmentHandle {
    /// As [`TraceWriter::set_environment`].
    ///
    /// # Errors
    /// [`DumpError::Field`] for an empty key.
    pub fn set(&self, key: &str, value: &str) -> Result<(), DumpError> {
        if key.is_empty() {
            return Err(DumpError::Field {
                path: PathBuf::from("(environment)"),
                field: "environment".to_owned(),
                detail: "a key must not be empty".to_owned(),
            });
        }
        self.lock().set(key, value);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Environment> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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

/// Writes a whole in-memory trace (md5 or stats mode: records hold no tensors) to `dir`, in format
/// version 1 (the version 1 golden bytes and the reader's tests of version 1 files use it;
/// `write_trace_v2` writes the current version).
#[cfg(test)]
pub(crate) fn write_trace(dir: &Path, trace: &Trace, mode: DumpMode) -> Result<(), DumpError> {
    for rank in &trace.ranks {
        let mut w = TraceWriter::create_version(
            dir,
            rank.rank,
            trace.world_size() as u32,
            mode,
            format::VERSION_1,
        )?;
        for r in &rank.records {
            w.write_record(r, None)?;
        }
        w.finish()?;
    }
    Ok(())
}

/// Writes a whole in-memory trace in the current format version, with the snapshot `environment`
/// (instead of this process's) and `run_id` in every rank's file.
#[cfg(test)]
pub(crate) fn write_trace_v2(
    dir: &Path,
    trace: &Trace,
    mode: DumpMode,
    environment: &Environment,
    run_id: RunId,
) -> Result<(), DumpError> {
    for rank in &trace.ranks {
        let mut w = TraceWriter::create(dir, rank.rank, trace.world_size() as u32, mode)?;
        w.replace_environment(environment.clone());
        w.set_run_id(run_id);
        for r in &rank.records {
            w.write_record(r, None)?;
        }
        w.finish()?;
    }
    Ok(())
}

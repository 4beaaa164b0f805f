//! Reading msprobe dump folders as [`RankSource`]s: statistics, md5 and tensor modes, levels L0,
//! L1 and mix, the layouts `step{N}/rank{M}/` and `step{N}/proc{PID}/`.
//!
//! msprobe (mindstudio-probe, Ascend's precision tool for PyTorch and MindSpore) writes one
//! `dump.json` per step and process: `step{N}/rank{M}/dump.json` when torch.distributed knows the
//! rank, `step{N}/proc{PID}/dump.json` for a process without one (26.2 on a single process). Its
//! `data` object maps each API or module call (`Functional.conv2d.0.forward`,
//! `Module.conv1.Conv2d.forward.0`, `Module.fc.Linear.parameters_grad.0`) to its `input_args`,
//! `input_kwargs`, `input`, `output` and `parameters`; each tensor there has `type`, `dtype`,
//! `shape`, `Max`, `Min`, `Mean`, `Norm`, and in md5 mode `md5` (msprobe's checksum: the CRC-32 of
//! the tensor's bytes, in hex), in tensor mode `data_name` (its file in `dump_tensor_data/`).
//!
//! Each tensor becomes one record, named and ordered as msprobe's compare names and lists them:
//! `Functional.conv2d.0.forward.input.0`, `....input.<kwarg>`, `....output.0`,
//! `Module.fc.Linear.forward.0.parameters.weight`, `Module.fc.Linear.parameters_grad.0.weight`
//! (no list index there, as msprobe); calls in file order (the call order, so "first" means what
//! it means to msprobe), and within a call the inputs, outputs, then parameters.
//!
//! Reading is streaming ([`scan`]): `dump.json` is read in chunks and only the fields above are
//! kept, so memory is the records of a step (two: a thread per rank reads step N+1 while step N
//! is compared, and reads both sides of a comparison at once), not the file. Python's `NaN`,
//! `Infinity` and `-Infinity` are accepted (msprobe writes them); anything after the JSON
//! document, or any syntax error, is an error naming the file, the field and the byte.
//!
//! Tensor mode: a record's `data_name` is looked up in `dump_tensor_data/` beside `dump.json` (or
//! beside it), never at the absolute `dump_data_dir` of the machine that dumped. PyTorch's files
//! are `.pt` ([`pt`]), MindSpore's `.npy` ([`npy`]). Such a record without an `md5` gets
//! msprobe's md5-mode checksum computed from its file (the CRC-32 of its bytes, read from the
//! `.pt`'s zip directory), so tensor dumps are compared bitwise, and with md5-mode dumps; and
//! [`RankSource::tensor`] gives the engine the elements for its metrics (cosine, errors).
//!
//! Ranks: `rank{M}` is rank M (a bare `rank` is 0, as msprobe writes on a single card). A step's
//! `proc{PID}` folders are ranks 0, 1, ... in increasing process id, so pairing with another
//! dump is deterministic (a process started later usually has the larger id); the dump's
//! description says which folder became which rank. A step holding both kinds is an error.
//!
//! Limits: non-tensor arguments (ints, dtypes, process groups) are skipped; a record whose tensor
//! file is missing is compared on its statistics; `.npy` files of bf16 tensors hold float32 (as
//! msprobe converts them), so their checksum differs from an md5-mode dump's of the same tensor.

mod npy;
mod pt;
mod scan;

use crate::file::format::{Digest, Entry};
use crate::file::source::{Batch, Layout, RankSource};
use crate::file::DumpError;
use crate::value::digest::{ExactF64, Stats};
use crate::value::tensor::{DType, Tensor, TensorView};
use scan::{Next, Scalar, ScanError, Scanner, MAX_DEPTH};
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// An msprobe dump folder: its steps and ranks.
#[derive(Debug)]
pub(crate) struct MsprobeDump {
    dir: PathBuf,
    /// (step, rank) -> dump.json, in (step, rank) order.
    files: BTreeMap<(u64, u32), PathBuf>,
    world_size: u32,
    /// How `proc{PID}` folders became ranks, for the description (empty when there are none).
    procs: String,
}

/// A folder inside `step{N}/`.
enum Folder {
    Rank(u32),
    Proc(u64),
}

/// Parses `step12`, `rank3`, `proc4242` (and a bare `rank`, which msprobe writes on a single card).
fn numbered(name: &str, prefix: &str) -> Option<u64> {
    let rest = name.strip_prefix(prefix)?;
    if rest.is_empty() && prefix == "rank" {
        return Some(0);
    }
    if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest.parse().ok()
}

fn folder_kind(name: &str) -> Option<Folder> {
    if let Some(r) = numbered(name, "rank") {
        return u32::try_from(r).ok().map(Folder::Rank);
    }
    numbered(name, "proc").map(Folder::Proc)
}

fn sorted_dir(dir: &Path) -> Result<Vec<(String, PathBuf)>, DumpError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| DumpError::io("read folder", dir, e))? {
        let entry = entry.map_err(|e| DumpError::io("read folder", dir, e))?;
        if entry.path().is_dir() {
            out.push((
                entry.file_name().to_string_lossy().into_owned(),
                entry.path(),
            ));
        }
    }
    out.sort();
    Ok(out)
}

impl MsprobeDump {
    pub(crate) fn open(dir: &Path) -> Result<Self, DumpError> {
        let mut files = BTreeMap::new();
        // The proc folders of each step, in rank order, to describe the mapping.
        let mut proc_steps: Vec<(u64, Vec<u64>)> = Vec::new();
        for (step_name, step_dir) in sorted_dir(dir)? {
            let Some(step) = numbered(&step_name, "step") else {
                continue;
            };
            let (mut ranks, mut procs) = (Vec::new(), Vec::new());
            for (name, path) in sorted_dir(&step_dir)? {
                match folder_kind(&name) {
                    Some(Folder::Rank(r)) => ranks.push((r, path)),
                    Some(Folder::Proc(pid)) => procs.push((pid, path)),
                    None => {}
                }
            }
            if !ranks.is_empty() && !procs.is_empty() {
                return Err(DumpError::Folder {
                    path: step_dir,
                    detail: "holds both rank<M>/ and proc<PID>/ folders: which process is which \
                             rank is unknown (keep the dump of one run only)"
                        .into(),
                });
            }
            procs.sort_by_key(|&(pid, _)| pid);
            if !procs.is_empty() {
                proc_steps.push((step, procs.iter().map(|&(pid, _)| pid).collect()));
            }
            let procs = procs.into_iter().enumerate().map(|(i, (_, path))| {
                let rank = u32::try_from(i).unwrap_or(u32::MAX);
                (rank, path)
            });
            for (rank, rank_dir) in ranks.into_iter().chain(procs) {
                let json = rank_dir.join("dump.json");
                match super::input_file_check(&json) {
                    Ok(()) => {}
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(DumpError::io("read", &json, e))
                    }
                    Err(_) => {
                        return Err(DumpError::Folder {
                            path: rank_dir,
                            detail: "has no dump.json".into(),
                        })
                    }
                }
                if let Some(other) = files.insert((step, rank), json) {
                    return Err(DumpError::Folder {
                        path: step_dir.clone(),
                        detail: format!(
                            "holds rank {rank} twice ({} and {})",
                            other.display(),
                            rank_dir.display()
                        ),
                    });
                }
            }
        }
        let world_size = files
            .keys()
            .map(|&(_, r)| r.saturating_add(1))
            .max()
            .ok_or_else(|| DumpError::Folder {
                path: dir.to_owned(),
                detail: "holds step<N>/ folders but no step<N>/rank<M>/dump.json or \
                         step<N>/proc<PID>/dump.json"
                    .into(),
            })?;
        Ok(MsprobeDump {
            dir: dir.to_owned(),
            files,
            world_size,
            procs: describe_procs(&proc_steps),
        })
    }

    pub(crate) fn world_size(&self) -> u32 {
        self.world_size
    }

    pub(crate) fn describe(&self) -> String {
        format!("msprobe dump at {}{}", self.dir.display(), self.procs)
    }

    /// A rank's steps; a thread starts reading them at once.
    pub(crate) fn open_rank(&self, rank: u32) -> MsprobeRank {
        MsprobeRank::new(
            self.files
                .iter()
                .filter(|((_, r), _)| *r == rank)
                .map(|(&(step, _), path)| (step, path.clone()))
                .collect(),
        )
    }
}

/// `; proc812 -> rank 0, proc813 -> rank 1 (ranks by increasing process id)`, or `""`.
fn describe_procs(steps: &[(u64, Vec<u64>)]) -> String {
    let Some((_, first)) = steps.first() else {
        return String::new();
    };
    let list = |pids: &[u64]| {
        let shown: Vec<String> = pids
            .iter()
            .take(4)
            .enumerate()
            .map(|(r, pid)| format!("proc{pid} -> rank {r}"))
            .collect();
        let more = if pids.len() > 4 { ", ..." } else { "" };
        format!("{}{more}", shown.join(", "))
    };
    if steps.iter().all(|(_, pids)| pids == first) {
        format!("; {} (ranks by increasing process id)", list(first))
    } else {
        format!(
            "; proc<PID> folders are ranks by increasing process id within each step \
             (step {}: {})",
            steps[0].0,
            list(first)
        )
    }
}

/// FxHash (rustc's hasher): the tables below are looked up once per record, where SipHash
/// cost a seventh of the reading time. Only lookups: nothing iterates these maps.
#[derive(Default, Clone, Copy)]
struct Fx(u64);

impl std::hash::Hasher for Fx {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        // The last 0-7 bytes, little-endian, and their count (a loop: memcpy is a call here).
        let rest = chunks.remainder();
        let tail = rest
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
        self.write_u64(tail ^ ((rest.len() as u64) << 59));
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_u8(&mut self, x: u8) {
        self.write_u64(u64::from(x));
    }

    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
}

type FxMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<Fx>>;

fn fx_hash(name: &[u8]) -> u64 {
    use std::hash::Hasher as _;
    let mut h = Fx::default();
    h.write(name);
    h.finish()
}

/// A rank's name and layout tables as the reader builds them (ids are indices, stable across
/// steps). Names are kept in one buffer (the rank source keeps them as `String`s); what a step
/// added is handed over with the step.
#[derive(Default)]
struct Tables {
    /// Every name, end to end; `ends[id]` is where name `id` ends.
    name_bytes: Vec<u8>,
    ends: Vec<usize>,
    /// The hash of a name -> its id; `collisions` holds the names whose hash an earlier name has.
    name_ids: FxMap<u64, u32>,
    collisions: HashMap<Vec<u8>, u32>,
    /// (dtype as written, shape) -> layout id.
    layout_ids: FxMap<(Vec<u8>, Vec<u64>), u32>,
    layouts: Vec<Layout>,
    /// Names and layouts added since the last step was handed over.
    new_names: Vec<String>,
    new_layouts: Vec<Layout>,
}

/// Text the scanner checked as UTF-8 (so the lossy conversion is never needed).
fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec())
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

impl Tables {
    fn name(&self, id: u32) -> &[u8] {
        let id = id as usize;
        let start = if id == 0 { 0 } else { self.ends[id - 1] };
        &self.name_bytes[start..self.ends[id]]
    }

    fn name_id(&mut self, name: &[u8]) -> u32 {
        let hash = fx_hash(name);
        match self.name_ids.get(&hash) {
            Some(&id) if self.name(id) == name => return id,
            Some(_) => {
                if let Some(&id) = self.collisions.get(name) {
                    return id;
                }
                let id = self.add_name(name);
                self.collisions.insert(name.to_vec(), id);
                return id;
            }
            None => {}
        }
        let id = self.add_name(name);
        self.name_ids.insert(hash, id);
        id
    }

    fn add_name(&mut self, name: &[u8]) -> u32 {
        let id = self.ends.len() as u32;
        self.name_bytes.extend_from_slice(name);
        self.ends.push(self.name_bytes.len());
        self.new_names.push(text(name));
        id
    }

    /// The id of (dtype, shape); `dtype` and `shape` are lent and given back unchanged.
    fn layout_id(&mut self, dtype: &mut Vec<u8>, shape: &mut Vec<u64>) -> u32 {
        let key = (std::mem::take(dtype), std::mem::take(shape));
        let id = match self.layout_ids.get(&key) {
            Some(&id) => id,
            None => {
                let id = self.layouts.len() as u32;
                let full = text(&key.0);
                let short = full.rsplit('.').next().unwrap_or(&full).to_owned();
                let layout = Layout {
                    dtype: short,
                    shape: key.1.clone(),
                };
                self.layouts.push(layout.clone());
                self.new_layouts.push(layout);
                self.layout_ids.insert(key.clone(), id);
                id
            }
        };
        (*dtype, *shape) = key;
        id
    }
}

/// One step of a rank, read: its records, and what the tables gained.
struct Step {
    step: u64,
    /// The folder of its dump.json.
    dir: PathBuf,
    batch: Batch,
    /// Its records' tensor files (`data_name`), by seq.
    tensor_files: Vec<Option<Box<str>>>,
    new_names: Vec<String>,
    new_layouts: Vec<Layout>,
}

/// What the reader thread sends: a step, the end, or why it stopped.
enum Message {
    Step(Step),
    End,
    Failed(DumpError),
}

/// Reads a rank's dump.json files in step order.
struct StepReader {
    files: std::vec::IntoIter<(u64, PathBuf)>,
    tables: Tables,
    walk: Buffers,
    /// Set when the rank source is dropped: the reader stops at its next call.
    stop: Arc<AtomicBool>,
}

impl StepReader {
    /// The next step, `None` after the last (or once stopped).
    fn read_next(&mut self) -> Option<Result<Step, DumpError>> {
        let (step, path) = self.files.next()?;
        if self.stop.load(Ordering::Relaxed) {
            return None;
        }
        Some(self.read(step, &path))
    }

    fn read(&mut self, step: u64, path: &Path) -> Result<Step, DumpError> {
        let dir = path.parent().map(Path::to_owned).unwrap_or_default();
        let file = super::open_input(path).map_err(|e| DumpError::io("read", path, e))?;
        let (mut batch, mut tensor_files) = (Batch::default(), Vec::new());
        let mut walk = Walk {
            sc: Scanner::new(file),
            tables: &mut self.tables,
            b: &mut self.walk,
            out: &mut batch,
            tensor_files: &mut tensor_files,
            step,
            order: 0,
            stop: &self.stop,
        };
        walk.document()
            .map_err(|e| e.into_dump_error(path, &walk.b.field))?;
        // Tensor mode: the checksum msprobe's md5 mode would have written, from each file.
        for (seq, name) in tensor_files.iter().enumerate() {
            let Some(name) = name.as_deref() else {
                continue;
            };
            let entry = &mut batch.entries[seq];
            if !entry.digest.is_none() {
                continue;
            }
            let Some(file) = tensor_path(&dir, name) else {
                continue;
            };
            let layout = &self.tables.layouts[entry.layout as usize];
            if let Some(crc) = checksum(&file, is_bf16(layout))? {
                let mut bytes = [0u8; 16];
                bytes[..4].copy_from_slice(&crc.to_be_bytes());
                entry.digest = Digest::checksum(bytes, 4);
            }
        }
        Ok(Step {
            step,
            dir,
            batch,
            tensor_files,
            new_names: std::mem::take(&mut self.tables.new_names),
            new_layouts: std::mem::take(&mut self.tables.new_layouts),
        })
    }

    /// The reader thread's body: every step, then the end; stops early on an error, or when the
    /// rank source is gone.
    fn run(mut self, to: std::sync::mpsc::SyncSender<Message>) {
        loop {
            let message = match self.read_next() {
                Some(Ok(step)) => Message::Step(step),
                Some(Err(e)) => Message::Failed(e),
                None => Message::End,
            };
            let last = !matches!(message, Message::Step(_));
            if to.send(message).is_err() || last {
                return;
            }
        }
    }
}

/// Where a rank's steps come from: a reader thread, or (when no thread could be started) the
/// reader itself, called in turn.
enum Steps {
    Thread(std::sync::mpsc::Receiver<Message>),
    Inline(Box<StepReader>),
}

/// One rank of an msprobe dump: one `dump.json` per step, read ahead by a thread of its own (so
/// the two sides of a comparison are read at once, and step N+1 while step N is compared).
/// Determinism: the thread reads the same files in the same order, whenever it runs.
pub(crate) struct MsprobeRank {
    steps: Steps,
    stop: Arc<AtomicBool>,
    done: bool,
    names: Vec<String>,
    layouts: Vec<Layout>,
    /// The step read last, its folder, and its records' tensor files (`data_name`, by seq).
    step: Option<u64>,
    step_dir: PathBuf,
    tensor_files: Vec<Option<Box<str>>>,
}

impl MsprobeRank {
    fn new(files: Vec<(u64, PathBuf)>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let reader = |files: Vec<(u64, PathBuf)>| StepReader {
            files: files.into_iter(),
            tables: Tables::default(),
            walk: Buffers::default(),
            stop: Arc::clone(&stop),
        };
        // One step ahead at most: the thread holds step N+1 while step N is compared.
        let (to, from) = std::sync::mpsc::sync_channel(0);
        let thread = reader(files.clone());
        let spawned = std::thread::Builder::new()
            .name("msprobe-reader".into())
            .spawn(move || thread.run(to));
        let steps = match spawned {
            Ok(_) => Steps::Thread(from),
            // No thread (a resource limit): the same reading, done in turn by the caller.
            Err(_) => Steps::Inline(Box::new(reader(files))),
        };
        MsprobeRank {
            steps,
            stop,
            done: false,
            names: Vec::new(),
            layouts: Vec::new(),
            step: None,
            step_dir: PathBuf::new(),
            tensor_files: Vec::new(),
        }
    }

    /// A record's tensor file in the current step.
    fn tensor_path(&self, name: &str) -> Option<PathBuf> {
        tensor_path(&self.step_dir, name)
    }
}

impl Drop for MsprobeRank {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A record's tensor file: in `dump_tensor_data/` beside dump.json, or beside it.
fn tensor_path(dir: &Path, name: &str) -> Option<PathBuf> {
    [dir.join("dump_tensor_data").join(name), dir.join(name)]
        .into_iter()
        .find(|p| p.is_file())
}

impl RankSource for MsprobeRank {
    fn next_step(&mut self, out: &mut Batch) -> Result<Option<u64>, DumpError> {
        out.clear();
        self.tensor_files.clear();
        if self.done {
            return Ok(None);
        }
        let message = match &mut self.steps {
            Steps::Thread(from) => from.recv().unwrap_or_else(|_| {
                Message::Failed(DumpError::Folder {
                    path: self.step_dir.clone(),
                    detail: "the thread reading msprobe's dump.json files stopped unexpectedly"
                        .into(),
                })
            }),
            Steps::Inline(reader) => match reader.read_next() {
                Some(Ok(step)) => Message::Step(step),
                Some(Err(e)) => Message::Failed(e),
                None => Message::End,
            },
        };
        match message {
            Message::Step(step) => {
                self.names.extend(step.new_names);
                self.layouts.extend(step.new_layouts);
                *out = step.batch;
                self.tensor_files = step.tensor_files;
                self.step = Some(step.step);
                self.step_dir = step.dir;
                Ok(Some(step.step))
            }
            Message::End => {
                self.done = true;
                Ok(None)
            }
            Message::Failed(e) => {
                self.done = true;
                Err(e)
            }
        }
    }

    fn names(&self) -> &[String] {
        &self.names
    }

    fn layouts(&self) -> &[Layout] {
        &self.layouts
    }

    fn tensor(&mut self, entry: &Entry) -> Result<Option<Tensor>, DumpError> {
        if self.step != Some(entry.step) {
            return Ok(None);
        }
        let Some(Some(name)) = self.tensor_files.get(entry.seq as usize) else {
            return Ok(None);
        };
        let Some(path) = self.tensor_path(name) else {
            return Ok(None);
        };
        let layout = &self.layouts[entry.layout as usize];
        let bad = |detail: String| DumpError::TensorFile {
            path: path.clone(),
            detail,
        };
        let elements = read_elements(&path, is_bf16(layout))?
            .ok_or_else(|| bad("not a tensor file detcheck reads (.pt or .npy)".into()))?;
        if elements.shape.len() != layout.shape.len()
            || elements
                .shape
                .iter()
                .zip(&layout.shape)
                .any(|(&a, &b)| a as u64 != b)
        {
            return Err(bad(format!(
                "holds a tensor of shape {:?}, but dump.json gives {:?} for `{}`",
                elements.shape, layout.shape, self.names[entry.name as usize]
            )));
        }
        TensorView::new(elements.dtype, &elements.shape, &elements.bytes)
            .map(|v| Some(v.to_tensor()))
            .map_err(|e| bad(e.to_string()))
    }
}

fn is_bf16(layout: &Layout) -> bool {
    layout.dtype.eq_ignore_ascii_case("bfloat16")
}

/// A tensor file's elements: row-major, little-endian bytes.
#[derive(Debug)]
struct Elements {
    dtype: DType,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

fn extension(path: &Path) -> Option<&str> {
    path.extension().and_then(|e| e.to_str())
}

/// The elements of a `.pt` or `.npy` file (`None` for another kind of file).
fn read_elements(path: &Path, bf16: bool) -> Result<Option<Elements>, DumpError> {
    let bad = |detail: String| DumpError::TensorFile {
        path: path.to_owned(),
        detail,
    };
    match extension(path) {
        Some("pt") => pt::Archive::open(path)
            .and_then(|mut a| a.elements())
            .map(Some)
            .map_err(bad),
        Some("npy") => {
            let bytes = super::read_input(path).map_err(|e| DumpError::io("read", path, e))?;
            npy::read(&bytes, bf16).map(Some).map_err(bad)
        }
        _ => Ok(None),
    }
}

/// msprobe's md5-mode checksum (CRC-32 of the bytes) of a tensor file's tensor.
fn checksum(path: &Path, bf16: bool) -> Result<Option<u32>, DumpError> {
    if extension(path) == Some("pt") {
        return pt::Archive::open(path)
            .and_then(|mut a| a.checksum())
            .map(Some)
            .map_err(|detail| DumpError::TensorFile {
                path: path.to_owned(),
                detail,
            });
    }
    Ok(read_elements(path, bf16)?.map(|e| crc32fast::hash(&e.bytes)))
}

/// `inf`, `-inf`, `nan` (any case) and numbers written as strings.
fn parse_special(s: &str) -> Option<f64> {
    match s.trim().to_ascii_lowercase().as_str() {
        "nan" => Some(f64::NAN),
        "inf" | "+inf" | "infinity" => Some(f64::INFINITY),
        "-inf" | "-infinity" => Some(f64::NEG_INFINITY),
        other => other.parse().ok(),
    }
}

fn parse_hex(hex: &[u8]) -> Option<Digest> {
    if hex.is_empty() || hex.len() > 32 || !hex.len().is_multiple_of(2) {
        return None;
    }
    let digit = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut bytes = [0u8; 16];
    for (i, byte) in bytes.iter_mut().take(hex.len() / 2).enumerate() {
        *byte = digit(hex[2 * i])? << 4 | digit(hex[2 * i + 1])?;
    }
    Some(Digest::checksum(bytes, (hex.len() / 2) as u8))
}

/// What an object's field held, for the fields a tensor needs.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
enum Seen {
    #[default]
    Absent,
    Null,
    /// A string (its text in the leaf) or, for statistics, a number.
    Value,
    /// Another kind of value: which, for the error.
    Other(&'static str),
}

/// The fields of one object that make it a tensor (reused per nesting depth).
#[derive(Default)]
struct Leaf {
    kind: Seen,
    kind_text: Vec<u8>,
    dtype: Seen,
    dtype_text: Vec<u8>,
    shape: Seen,
    dims: Vec<u64>,
    md5: Seen,
    md5_text: Vec<u8>,
    data_name: Seen,
    data_name_text: Vec<u8>,
    /// Max, Min, Mean, Norm.
    stats: [(Seen, f64); 4],
    /// A statistic written as a string that is not a number.
    bad_stat: Option<String>,
    /// `class_type` is `torch.distributed.P2POp` (its `tensor` field is its tensor).
    p2p: bool,
}

impl Leaf {
    fn clear(&mut self) {
        self.kind = Seen::Absent;
        self.dtype = Seen::Absent;
        self.shape = Seen::Absent;
        self.dims.clear();
        self.md5 = Seen::Absent;
        self.data_name = Seen::Absent;
        self.stats = [(Seen::Absent, 0.0); 4];
        self.bad_stat = None;
        self.p2p = false;
    }
}

/// A tensor of the call being read.
struct Pending {
    /// inputs (0-2), outputs (3), parameters (4): msprobe's order within a call.
    order: u8,
    /// Its name: a range of `Buffers::arena`.
    name: (usize, usize),
    layout: u32,
    stats: Stats,
    digest: Digest,
    data_name: Option<Box<str>>,
}

/// The reader's buffers, kept across steps so a step allocates little. Text is kept as bytes
/// the scanner checked as UTF-8.
#[derive(Default)]
struct Buffers {
    /// The record name being built (`Functional.add.0.forward.input.0`).
    name: Vec<u8>,
    /// The JSON path being read (`data.Functional.add.0.forward.input_args.0`), for errors.
    field: Vec<u8>,
    leaves: Vec<Leaf>,
    pending: Vec<Pending>,
    arena: Vec<u8>,
}

/// A key of an object, as far as tensors are concerned.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    Type,
    Dtype,
    Shape,
    Stat(usize),
    Md5,
    DataName,
    ClassType,
    Other,
}

fn classify(key: &[u8]) -> Key {
    match key {
        b"type" => Key::Type,
        b"dtype" => Key::Dtype,
        b"shape" => Key::Shape,
        b"Max" => Key::Stat(0),
        b"Min" => Key::Stat(1),
        b"Mean" => Key::Stat(2),
        b"Norm" => Key::Stat(3),
        b"md5" => Key::Md5,
        b"data_name" => Key::DataName,
        b"class_type" => Key::ClassType,
        _ => Key::Other,
    }
}

/// Why a dump.json could not be read.
enum WalkError {
    Scan(ScanError),
    /// A field holds a value msprobe never writes there: the JSON path and what is wrong.
    Field(String, String),
}

impl From<ScanError> for WalkError {
    fn from(e: ScanError) -> Self {
        WalkError::Scan(e)
    }
}

impl WalkError {
    fn into_dump_error(self, path: &Path, field: &[u8]) -> DumpError {
        match self {
            WalkError::Scan(ScanError::Io(e)) => DumpError::io("read", path, e),
            WalkError::Scan(ScanError::Syntax { offset, detail }) => DumpError::Field {
                path: path.to_owned(),
                field: if field.is_empty() {
                    "(top level)".into()
                } else {
                    text(field)
                },
                detail: format!("{detail} (at byte {offset})"),
            },
            WalkError::Field(field, detail) => DumpError::Field {
                path: path.to_owned(),
                field,
                detail,
            },
        }
    }
}

fn push_index(s: &mut Vec<u8>, i: usize) {
    s.push(b'.');
    if i < 10 {
        s.push(b'0' + i as u8);
    } else {
        s.extend_from_slice(i.to_string().as_bytes());
    }
}

fn is_params_grad(op: &[u8]) -> bool {
    let mut parts = op.rsplit(|&b| b == b'.');
    let (last, second) = (parts.next(), parts.next());
    last == Some(b"parameters_grad") || second == Some(b"parameters_grad")
}

/// Reading one dump.json into a batch.
struct Walk<'a, R> {
    sc: Scanner<R>,
    tables: &'a mut Tables,
    b: &'a mut Buffers,
    out: &'a mut Batch,
    tensor_files: &'a mut Vec<Option<Box<str>>>,
    step: u64,
    /// The order of the part of the call being read (see [`Pending::order`]).
    order: u8,
    /// Set when nobody waits for this step any more.
    stop: &'a AtomicBool,
}

impl<R: Read> Walk<'_, R> {
    fn field_error(&self, detail: impl Into<String>) -> WalkError {
        WalkError::Field(text(&self.b.field), detail.into())
    }

    /// The whole file: `{..., "data": {calls}, ...}` and nothing after it.
    fn document(&mut self) -> Result<(), WalkError> {
        self.b.field.clear();
        self.sc.begin_object()?;
        let mut first = true;
        let mut seen_data = false;
        while let Some(key) = self.sc.next_key(&mut first)? {
            self.b.field.clear();
            self.b.field.extend_from_slice(key);
            if key != b"data" {
                self.sc.skip_value(1)?;
                continue;
            }
            if seen_data {
                return Err(self.field_error("appears twice in the document"));
            }
            seen_data = true;
            if self.sc.next_kind("the document")? != Next::Object {
                return Err(self.field_error("expected an object of calls"));
            }
            self.calls()?;
        }
        self.b.field.clear();
        self.sc.finish()?;
        if !seen_data {
            return Err(WalkError::Field(
                "data".into(),
                "missing: dump.json has no `data` object".into(),
            ));
        }
        Ok(())
    }

    /// `{"Functional.add.0.forward": {...}, ...}`.
    fn calls(&mut self) -> Result<(), WalkError> {
        self.sc.begin_object()?;
        let mut first = true;
        while let Some(op) = self.sc.next_key(&mut first)? {
            if self.stop.load(Ordering::Relaxed) {
                return Err(WalkError::Field(String::new(), "stopped".into()));
            }
            let b = &mut *self.b;
            b.name.clear();
            b.name.extend_from_slice(op);
            b.field.clear();
            b.field.extend_from_slice(b"data.");
            b.field.extend_from_slice(op);
            b.pending.clear();
            b.arena.clear();
            let params_grad = is_params_grad(&b.name);
            if self.sc.next_kind("a call")? != Next::Object {
                return Err(self.field_error("expected an object of inputs and outputs"));
            }
            self.call(params_grad)?;
            self.emit()?;
        }
        Ok(())
    }

    /// One call's object: its parts, walked for tensors.
    fn call(&mut self, params_grad: bool) -> Result<(), WalkError> {
        self.sc.begin_object()?;
        let mut first = true;
        let (name_len, field_len) = (self.b.name.len(), self.b.field.len());
        while let Some(part) = self.sc.next_key(&mut first)? {
            let b = &mut *self.b;
            b.field.push(b'.');
            b.field.extend_from_slice(part);
            b.name.push(b'.');
            if params_grad {
                // `parameters_grad`: {"weight": [T], "bias": [T]}, named `<op>.weight`.
                self.order = 0;
                b.name.extend_from_slice(part);
            } else {
                let (order, role): (u8, &[u8]) = match part {
                    b"input_args" => (0, b"input"),
                    b"input_kwargs" => (1, b"input"),
                    b"input" => (2, b"input"),
                    b"output" => (3, b"output"),
                    b"parameters" => (4, b"parameters"),
                    _ => (u8::MAX, b""),
                };
                b.name.extend_from_slice(role);
                if order == u8::MAX {
                    // Not compared by msprobe (`is_recompute` ...).
                    self.sc.skip_value(3)?;
                    self.b.name.truncate(name_len);
                    self.b.field.truncate(field_len);
                    continue;
                }
                self.order = order;
            }
            self.value(3, !params_grad)?;
            self.b.name.truncate(name_len);
            self.b.field.truncate(field_len);
        }
        Ok(())
    }

    /// Any value inside a call; tensors found become pending records. `index` says whether list
    /// items add their index to the name.
    fn value(&mut self, depth: usize, index: bool) -> Result<(), WalkError> {
        match self.sc.next_kind("a call")? {
            Next::Object => self.object(depth, index),
            Next::Array => self.array(depth, index, None),
            Next::String | Next::Other => {
                self.sc.scalar()?;
                Ok(())
            }
        }
    }

    fn array(
        &mut self,
        depth: usize,
        index: bool,
        dims_of: Option<usize>,
    ) -> Result<(), WalkError> {
        if depth > MAX_DEPTH {
            return Err(self.field_error(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        self.sc.begin_array()?;
        let (name_len, field_len) = (self.b.name.len(), self.b.field.len());
        let mut first = true;
        let mut i = 0;
        while self.sc.next_element(&mut first)? {
            push_index(&mut self.b.field, i);
            match self.sc.next_kind("an array")? {
                Next::Object | Next::Array => {
                    if index {
                        push_index(&mut self.b.name, i);
                    }
                    if let Some(d) = dims_of {
                        self.b.leaves[d].shape = Seen::Other("an array holding objects or arrays");
                    }
                    self.value(depth + 1, index)?;
                    self.b.name.truncate(name_len);
                }
                Next::String | Next::Other => {
                    let v = self.sc.scalar()?;
                    if let Some(d) = dims_of {
                        match (v, self.sc.last_as_u64()) {
                            (Scalar::Number(_), Some(dim)) => self.b.leaves[d].dims.push(dim),
                            _ => {
                                self.b.leaves[d].shape =
                                    Seen::Other("an array holding something other than integers");
                            }
                        }
                    }
                }
            }
            self.b.field.truncate(field_len);
            i += 1;
        }
        Ok(())
    }

    fn object(&mut self, depth: usize, index: bool) -> Result<(), WalkError> {
        if depth > MAX_DEPTH {
            return Err(self.field_error(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        self.sc.begin_object()?;
        if self.b.leaves.len() <= depth {
            self.b.leaves.resize_with(depth + 1, Leaf::default);
        }
        self.b.leaves[depth].clear();
        let children = self.b.pending.len();
        let (name_len, field_len) = (self.b.name.len(), self.b.field.len());
        let mut first = true;
        while let Some(key) = self.sc.next_key(&mut first)? {
            let k = classify(key);
            let b = &mut *self.b;
            b.field.push(b'.');
            b.field.extend_from_slice(key);
            let next = self.sc.next_kind("an object")?;
            if matches!(next, Next::Object | Next::Array) {
                // Only a container's contents need the name (a scalar's key is no record).
                let b = &mut *self.b;
                b.name.push(b'.');
                b.name.extend_from_slice(&b.field[field_len + 1..]);
            }
            match next {
                Next::Array if k == Key::Shape => {
                    self.b.leaves[depth].shape = Seen::Value;
                    self.array(depth + 1, index, Some(depth))?;
                }
                Next::Object | Next::Array => {
                    if k != Key::Other {
                        self.set_other(depth, k, "an object or array");
                    }
                    self.value(depth + 1, index)?;
                }
                Next::String | Next::Other => {
                    let v = self.sc.scalar()?;
                    self.scalar_field(depth, k, v);
                }
            }
            self.b.name.truncate(name_len);
            self.b.field.truncate(field_len);
        }
        let leaf = &self.b.leaves[depth];
        if leaf.kind == Seen::Value {
            // A leaf (msprobe: an object whose `type` is a string): its contents are not walked.
            self.b.pending.truncate(children);
            if leaf.kind_text.ends_with(b"Tensor") {
                self.tensor(depth)?;
            }
        } else if leaf.p2p && self.b.pending.len() == children + 1 {
            // A P2POp: msprobe names its tensor after the op itself.
            let b = &mut *self.b;
            let start = b.arena.len();
            b.arena.extend_from_slice(&b.name);
            b.pending[children].name = (start, b.arena.len());
        }
        Ok(())
    }

    fn set_other(&mut self, depth: usize, k: Key, what: &'static str) {
        let leaf = &mut self.b.leaves[depth];
        let seen = Seen::Other(what);
        match k {
            Key::Type => leaf.kind = seen,
            Key::Dtype => leaf.dtype = seen,
            Key::Shape => leaf.shape = seen,
            Key::Stat(i) => leaf.stats[i].0 = seen,
            Key::Md5 => leaf.md5 = seen,
            Key::DataName => leaf.data_name = seen,
            Key::ClassType | Key::Other => {}
        }
    }

    fn scalar_field(&mut self, depth: usize, k: Key, v: Scalar) {
        if k == Key::Other {
            return;
        }
        let what = match v {
            Scalar::Null => "null",
            Scalar::Bool(_) => "a boolean",
            Scalar::Number(_) => "a number",
            Scalar::String => "a string",
        };
        let value: &[u8] = if v == Scalar::String {
            self.sc.text()
        } else {
            b""
        };
        let leaf = &mut self.b.leaves[depth];
        let string = |seen: &mut Seen, out: &mut Vec<u8>| match v {
            Scalar::String => {
                *seen = Seen::Value;
                out.clear();
                out.extend_from_slice(value);
            }
            Scalar::Null => *seen = Seen::Null,
            _ => *seen = Seen::Other(what),
        };
        match k {
            Key::Type => string(&mut leaf.kind, &mut leaf.kind_text),
            Key::Dtype => string(&mut leaf.dtype, &mut leaf.dtype_text),
            Key::Md5 => string(&mut leaf.md5, &mut leaf.md5_text),
            Key::DataName => string(&mut leaf.data_name, &mut leaf.data_name_text),
            Key::Shape => leaf.shape = Seen::Other(what),
            Key::Stat(i) => {
                leaf.stats[i] = match v {
                    Scalar::Number(x) => (Seen::Value, x),
                    Scalar::Null => (Seen::Null, 0.0),
                    Scalar::String => match std::str::from_utf8(value).ok().and_then(parse_special)
                    {
                        Some(x) => (Seen::Value, x),
                        None => {
                            leaf.bad_stat = Some(format!("\"{}\"", text(value)));
                            (Seen::Other("a string"), 0.0)
                        }
                    },
                    Scalar::Bool(_) => (Seen::Other(what), 0.0),
                };
            }
            Key::ClassType => leaf.p2p = value == b"torch.distributed.P2POp",
            Key::Other => {}
        }
    }

    /// The object at `depth` is a tensor: checks its fields and adds it to the call's records.
    fn tensor(&mut self, depth: usize) -> Result<(), WalkError> {
        let b = &mut *self.b;
        let leaf = &mut b.leaves[depth];
        let field = &b.field;
        let err =
            |key: &str, detail: String| WalkError::Field(format!("{}.{key}", text(field)), detail);
        let got = |seen: Seen| match seen {
            Seen::Absent => "nothing".to_owned(),
            Seen::Null => "null".to_owned(),
            Seen::Other(what) => what.to_owned(),
            Seen::Value => "a value".to_owned(),
        };
        if leaf.dtype != Seen::Value {
            return Err(err(
                "dtype",
                format!(
                    "expected a string such as \"torch.float32\", got {}",
                    got(leaf.dtype)
                ),
            ));
        }
        if leaf.shape != Seen::Value {
            return Err(err(
                "shape",
                format!(
                    "expected an array of non-negative integers, got {}",
                    got(leaf.shape)
                ),
            ));
        }
        let mut stat = [None; 4];
        for (i, key) in ["Max", "Min", "Mean", "Norm"].iter().enumerate() {
            stat[i] = match leaf.stats[i] {
                (Seen::Value, x) => Some(ExactF64(x)),
                (Seen::Absent | Seen::Null, _) => None,
                (Seen::Other(what), _) => {
                    let got = leaf.bad_stat.clone().unwrap_or_else(|| what.to_owned());
                    return Err(err(key, format!("expected a number, got {got}")));
                }
            };
        }
        let digest = match leaf.md5 {
            Seen::Absent | Seen::Null => Digest::NONE,
            Seen::Value => parse_hex(&leaf.md5_text).ok_or_else(|| {
                err(
                    "md5",
                    format!(
                        "expected up to 32 hex digits, got \"{}\"",
                        text(&leaf.md5_text)
                    ),
                )
            })?,
            other => {
                return Err(err(
                    "md5",
                    format!("expected a hex string, got {}", got(other)),
                ))
            }
        };
        let data_name = match leaf.data_name {
            Seen::Absent | Seen::Null => None,
            Seen::Value => {
                let n = text(&leaf.data_name_text);
                // A file name inside the dump, never a path out of it.
                if n.is_empty() || n == "-1" {
                    None
                } else if n.contains(['/', '\\']) || n.starts_with('.') {
                    return Err(err(
                        "data_name",
                        format!("expected a file name, got \"{n}\""),
                    ));
                } else {
                    Some(n.into_boxed_str())
                }
            }
            other => {
                return Err(err(
                    "data_name",
                    format!("expected a file name, got {}", got(other)),
                ))
            }
        };
        let layout = self.tables.layout_id(&mut leaf.dtype_text, &mut leaf.dims);
        let start = b.arena.len();
        b.arena.extend_from_slice(&b.name);
        b.pending.push(Pending {
            order: self.order,
            name: (start, b.arena.len()),
            layout,
            stats: Stats {
                max: stat[0],
                min: stat[1],
                mean: stat[2],
                norm: stat[3],
                ..Stats::default()
            },
            digest,
            data_name,
        });
        Ok(())
    }

    /// Adds the call's records to the batch, inputs before outputs before parameters.
    fn emit(&mut self) -> Result<(), WalkError> {
        let b = &mut *self.b;
        if !b.pending.is_sorted_by_key(|p| p.order) {
            b.pending.sort_by_key(|p| p.order);
        }
        for p in b.pending.drain(..) {
            let name = &b.arena[p.name.0..p.name.1];
            let seq = u32::try_from(self.out.entries.len()).map_err(|_| {
                WalkError::Field(text(&b.field), "more than 2^32 records in a step".into())
            })?;
            let entry = Entry {
                step: self.step,
                seq,
                name: self.tables.name_id(name),
                layout: p.layout,
                replicated: false,
                digest: p.digest,
            };
            self.out.push(entry, Some(p.stats));
            if let Some(file) = p.data_name {
                let seq = seq as usize;
                if self.tensor_files.len() <= seq {
                    self.tensor_files.resize(seq + 1, None);
                }
                self.tensor_files[seq] = Some(file);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads a dump.json text as one step; the records' names, or the error's field and detail.
    fn read(text: &str) -> Result<(Vec<String>, Batch, Tables), (String, String)> {
        read_from(text.as_bytes())
    }

    use scan::Slow;

    fn read_from(src: impl Read) -> Result<(Vec<String>, Batch, Tables), (String, String)> {
        let (mut tables, mut b, mut out, mut files) = (
            Tables::default(),
            Buffers::default(),
            Batch::default(),
            Vec::new(),
        );
        let stop = AtomicBool::new(false);
        let mut walk = Walk {
            sc: Scanner::new(src),
            tables: &mut tables,
            b: &mut b,
            out: &mut out,
            tensor_files: &mut files,
            step: 3,
            order: 0,
            stop: &stop,
        };
        match walk
            .document()
            .map_err(|e| e.into_dump_error(Path::new("d.json"), &walk.b.field))
        {
            Ok(()) => {}
            Err(DumpError::Field { field, detail, .. }) => return Err((field, detail)),
            Err(other) => return Err((String::new(), other.to_string())),
        }
        let names = out
            .entries
            .iter()
            .map(|e| tables.new_names[e.name as usize].clone())
            .collect();
        Ok((names, out, tables))
    }

    const T32: &str = r#"{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2]}"#;

    #[test]
    fn records_are_named_and_ordered_as_msprobe_compares_them() {
        let doc = format!(
            r#"{{"task": "statistics", "data": {{
                "Tensor.zz.0.forward": {{"output": [{{"type": "torch.Tensor", "dtype": "torch.float16",
                    "shape": [2], "Max": "inf", "Min": 1, "Mean": null, "Norm": 2.5, "md5": "0a1b2c3d"}}],
                    "input_args": [{T32}]}},
                "Functional.aa.0.forward": {{
                    "input_kwargs": {{"w": {T32}, "dtype": {{"type": "torch.dtype", "value": "torch.float32"}}}},
                    "input_args": [{{"type": "int", "value": 3}}, [{T32}, null]],
                    "is_recompute": false}},
                "Module.fc.Linear.forward.0": {{"input_args": [], "output": [{T32}],
                    "parameters": {{"weight": {T32}, "bias": {T32}}}}},
                "Module.fc.Linear.parameters_grad.0": {{"bias": [{T32}], "weight": [{T32}]}},
                "Distributed.isend.0.forward": {{"input_args": [{{"class_type": "torch.distributed.P2POp",
                    "op": "isend", "peer": 1, "tensor": {T32}}}]}},
                "Functional.nested.0.forward": {{"input_args": [{{"type": "torch.Tensor", "dtype": "torch.int64",
                    "shape": [], "inner": [{T32}]}}]}}
            }}}}"#
        );
        let (names, batch, tables) = read(&doc).unwrap();
        assert_eq!(
            names,
            [
                "Tensor.zz.0.forward.input.0",
                "Tensor.zz.0.forward.output.0",
                "Functional.aa.0.forward.input.1.0",
                "Functional.aa.0.forward.input.w",
                "Module.fc.Linear.forward.0.output.0",
                "Module.fc.Linear.forward.0.parameters.weight",
                "Module.fc.Linear.forward.0.parameters.bias",
                "Module.fc.Linear.parameters_grad.0.bias",
                "Module.fc.Linear.parameters_grad.0.weight",
                "Distributed.isend.0.forward.input.0",
                "Functional.nested.0.forward.input.0",
            ]
        );
        let e = &batch.entries[1];
        assert_eq!((e.step, e.seq), (3, 1));
        assert_eq!(e.digest.hex(), "0a1b2c3d");
        let s = batch.stats(1).unwrap();
        assert_eq!(s.max, Some(ExactF64(f64::INFINITY)));
        assert_eq!(s.min, Some(ExactF64(1.0)));
        assert_eq!(s.mean, None);
        assert_eq!(tables.layouts[e.layout as usize].describe(), "float16[2]");
        assert_eq!(
            tables.layouts[batch.entries[10].layout as usize].describe(),
            "int64[]"
        );
        assert!(batch.entries[0].digest.is_none());
    }

    #[test]
    fn a_real_dump_reads_the_same_in_chunks_of_any_size() {
        let dir =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/msprobe/stats_L0/step0");
        let proc = std::fs::read_dir(&dir)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let text = std::fs::read(proc.join("dump.json")).unwrap();
        let summary = |(names, batch, tables): (Vec<String>, Batch, Tables)| {
            names
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    let e = &batch.entries[i];
                    let layout = tables.layouts[e.layout as usize].describe();
                    format!("{n} {layout} {:?}", batch.stats(i))
                })
                .collect::<Vec<_>>()
        };
        let whole = summary(read_from(text.as_slice()).unwrap());
        assert_eq!(whole.len(), 11);
        assert!(
            whole[9].starts_with("Module.0.Linear.parameters_grad.0.bias float32[2]"),
            "{}",
            whole[9]
        );
        for chunk in [1, 2, 3, 7, 64] {
            assert_eq!(
                summary(read_from(Slow(&text, chunk)).unwrap()),
                whole,
                "chunk {chunk}"
            );
        }
    }

    /// A step as read: its number, its records' names and digests.
    type StepSummary = (u64, Vec<String>, Vec<String>);

    /// Every step of rank 0, or the first error.
    fn steps(mut rank: MsprobeRank) -> Result<Vec<StepSummary>, String> {
        let mut out = Vec::new();
        let mut batch = Batch::default();
        while let Some(step) = rank.next_step(&mut batch).map_err(|e| e.to_string())? {
            let names = batch
                .entries
                .iter()
                .map(|e| rank.names()[e.name as usize].clone());
            let digests = batch.entries.iter().map(|e| e.digest.hex());
            out.push((step, names.collect(), digests.collect()));
        }
        assert!(rank.next_step(&mut batch).unwrap().is_none());
        Ok(out)
    }

    #[test]
    fn the_reader_thread_and_inline_reading_give_the_same_steps_and_errors() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/msprobe");
        let dump = MsprobeDump::open(&fixtures.join("md5_L1")).unwrap();
        let inline = |dump: &MsprobeDump| {
            let mut rank = MsprobeRank::new(Vec::new());
            let files = dump
                .files
                .iter()
                .map(|(&(s, _), p)| (s, p.clone()))
                .collect();
            rank.steps = Steps::Inline(Box::new(StepReader {
                files: Vec::into_iter(files),
                tables: Tables::default(),
                walk: Buffers::default(),
                stop: Arc::clone(&rank.stop),
            }));
            rank
        };
        let threaded = steps(dump.open_rank(0)).unwrap();
        assert_eq!(threaded.len(), 2);
        assert_eq!(threaded[1].0, 1);
        assert_eq!(threaded[1].1[4], "Functional.relu.0.forward.input.0");
        assert_eq!(steps(inline(&dump)).unwrap(), threaded);
        // A damaged second step: the first is read, then the error, then nothing.
        let dir = tempfile::tempdir().unwrap();
        for step in ["step0", "step1"] {
            let from = std::fs::read_dir(fixtures.join("md5_L1").join(step))
                .unwrap()
                .next()
                .unwrap()
                .unwrap()
                .path();
            let to = dir.path().join(step).join("proc7");
            std::fs::create_dir_all(&to).unwrap();
            std::fs::copy(from.join("dump.json"), to.join("dump.json")).unwrap();
        }
        std::fs::write(dir.path().join("step1/proc7/dump.json"), "{\"data\": {}} x").unwrap();
        let dump = MsprobeDump::open(dir.path()).unwrap();
        for mut rank in [dump.open_rank(0), inline(&dump)] {
            let mut batch = Batch::default();
            assert_eq!(rank.next_step(&mut batch).unwrap(), Some(0));
            let err = rank.next_step(&mut batch).unwrap_err().to_string();
            assert!(err.contains("after the end of the JSON document"), "{err}");
            assert!(rank.next_step(&mut batch).unwrap().is_none());
        }
    }

    #[test]
    fn python_literals_are_numbers() {
        let doc = r#"{"data": {"F.a.0.forward": {"output": [{"type": "torch.Tensor", "dtype": "torch.float32",
            "shape": [3], "Max": NaN, "Min": -Infinity, "Mean": NaN, "Norm": Infinity}]}}}"#;
        let (_, batch, _) = read(doc).unwrap();
        let s = batch.stats(0).unwrap();
        assert!(s.max.unwrap().0.is_nan());
        assert_eq!(s.min, Some(ExactF64(f64::NEG_INFINITY)));
        assert_eq!(s.norm, Some(ExactF64(f64::INFINITY)));
    }

    #[test]
    fn bad_fields_and_bad_json_name_the_field() {
        let tensor = |extra: &str| {
            format!(
                r#"{{"data": {{"F.a.0.forward": {{"output": [{{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [1]{extra}}}]}}}}}}"#
            )
        };
        let cases: Vec<(String, &str, &str)> = vec![
            (
                tensor(r#", "Max": "big""#),
                "data.F.a.0.forward.output.0.Max",
                "expected a number, got \"big\"",
            ),
            (
                tensor(r#", "Min": true"#),
                "data.F.a.0.forward.output.0.Min",
                "got a boolean",
            ),
            (
                tensor(r#", "md5": "xyz""#),
                "data.F.a.0.forward.output.0.md5",
                "hex digits",
            ),
            (
                tensor(r#", "data_name": "../../etc/passwd""#),
                "data.F.a.0.forward.output.0.data_name",
                "file name",
            ),
            (
                tensor(r#", "shape": [1, -2]"#),
                "data.F.a.0.forward.output.0.shape",
                "non-negative integers",
            ),
            (
                tensor("").replace("\"dtype\": \"torch.float32\", ", ""),
                "data.F.a.0.forward.output.0.dtype",
                "got nothing",
            ),
            (
                tensor("") + " trailing",
                "(top level)",
                "after the end of the JSON document",
            ),
            (
                tensor("")[..60].to_owned(),
                "data.F.a.0.forward.output.0.type",
                "the file ends inside a string",
            ),
            (
                tensor("").replace("\"shape\": [1]", "\"shape\": [1,]"),
                "data.F.a.0.forward.output.0.shape.1",
                "expected a value",
            ),
            (r#"{"task": "statistics"}"#.into(), "data", "missing"),
            (
                r#"{"data": []}"#.into(),
                "data",
                "expected an object of calls",
            ),
            (
                r#"{"data": {"F.a.0.forward": 3}}"#.into(),
                "data.F.a.0.forward",
                "expected an object",
            ),
        ];
        for (doc, field, detail) in cases {
            let (f, d) = read(&doc).map(|_| ()).unwrap_err();
            assert_eq!(f, field, "{doc}: {d}");
            assert!(d.contains(detail), "{doc}: {d}");
        }
    }

    #[test]
    fn names_whose_hashes_collide_keep_their_own_ids() {
        let mut t = Tables::default();
        assert_eq!(t.name_id(b"a"), 0);
        // Pretend "b" hashes as "a" does.
        let id = t.name_ids.remove(&fx_hash(b"a")).unwrap();
        t.name_ids.insert(fx_hash(b"b"), id);
        assert_eq!(t.name_id(b"b"), 1);
        assert_eq!(t.name_id(b"b"), 1);
        assert_eq!(t.new_names, ["a", "b"]);
        assert_eq!((t.name(0), t.name(1)), (&b"a"[..], &b"b"[..]));
    }

    #[test]
    fn proc_folders_are_ranks_by_process_id() {
        assert_eq!(numbered("proc12", "proc"), Some(12));
        assert_eq!(numbered("proc", "proc"), None);
        assert_eq!(numbered("rank", "rank"), Some(0));
        assert_eq!(numbered("rank+1", "rank"), None);
        assert_eq!(
            describe_procs(&[(0, vec![9, 100]), (1, vec![9, 100])]),
            "; proc9 -> rank 0, proc100 -> rank 1 (ranks by increasing process id)"
        );
        assert!(describe_procs(&[(0, vec![9]), (1, vec![10])]).contains("within each step"));
    }
}

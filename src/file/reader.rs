//! Reading dumps back: a folder of trace files, an msprobe dump folder, or an in-memory trace,
//! each seen as one stream of steps per rank.
//!
//! [`open_dump`] recognises the folder and checks that its files belong together; a [`Dump`]
//! opens one [`RankSource`] per rank; a source fills a [`Batch`] with the records of one step at a
//! time. [`TraceReader`] checks a file's footer before its first record and its counts after the
//! last, and rejects any entry that breaks the format, naming the file and byte offset.
//! Limits: one step of one rank is held in memory at a time (all of a step's records).

use crate::file::format::{self, Entry, Footer, Header, HeaderError};
use crate::file::msprobe::MsprobeDump;
use crate::file::source::{Batch, Layout, RankSource};
use crate::file::tensorfile;
use crate::file::{tensor_key, tensor_path, trace_path, DumpError, DumpMode};
use crate::record::{RankTrace, Record, Trace};
use crate::value::digest::{Md5Digest, Stats};
use crate::value::tensor::{DType, Tensor};
use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};

/// One side of a comparison: where it came from and how to read each rank.
#[derive(Debug)]
pub(crate) enum Dump {
    /// A folder of detcheck trace files.
    Traces {
        dir: PathBuf,
        world_size: u32,
        mode: DumpMode,
    },
    /// An msprobe dump folder.
    Msprobe(MsprobeDump),
}

impl Dump {
    pub(crate) fn world_size(&self) -> u32 {
        match self {
            Dump::Traces { world_size, .. } => *world_size,
            Dump::Msprobe(m) => m.world_size(),
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Dump::Traces { mode, .. } => format!("detcheck trace, {mode} mode"),
            Dump::Msprobe(m) => m.describe(),
        }
    }

    pub(crate) fn has_stats(&self) -> bool {
        match self {
            Dump::Traces { mode, .. } => mode.has_stats(),
            Dump::Msprobe(_) => true,
        }
    }

    pub(crate) fn open_rank(&self, rank: u32) -> Result<Box<dyn RankSource>, DumpError> {
        match self {
            Dump::Traces { dir, mode, .. } => {
                let reader = TraceReader::open(&trace_path(dir, rank))?;
                Ok(Box::new(TraceSource {
                    reader,
                    tensors: (*mode == DumpMode::Full).then(|| TensorFiles {
                        dir: dir.clone(),
                        rank,
                        loaded: None,
                    }),
                }))
            }
            Dump::Msprobe(m) => Ok(Box::new(m.open_rank(rank))),
        }
    }
}

/// Opens a dump folder: detcheck traces (`rank*.dctrace`) or an msprobe dump (`step*/rank*/` or
/// `step*/proc*/`).
pub(crate) fn open_dump(dir: &Path) -> Result<Dump, DumpError> {
    let entries = std::fs::read_dir(dir).map_err(|e| DumpError::io("read folder", dir, e))?;
    let mut ranks = Vec::new();
    let mut has_steps = false;
    for entry in entries {
        let entry = entry.map_err(|e| DumpError::io("read folder", dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(rank) = name
            .strip_prefix("rank")
            .and_then(|n| n.strip_suffix(".dctrace"))
        {
            let rank: u32 = rank.parse().map_err(|_| DumpError::Folder {
                path: dir.to_owned(),
                detail: format!("`{name}` is not named rank<N>.dctrace"),
            })?;
            ranks.push(rank);
        } else if name.starts_with("step") && entry.path().is_dir() {
            has_steps = true;
        }
    }
    if ranks.is_empty() {
        if has_steps {
            return Ok(Dump::Msprobe(MsprobeDump::open(dir)?));
        }
        return Err(DumpError::Folder {
            path: dir.to_owned(),
            detail: "holds no dump: no rank<N>.dctrace files and no msprobe step<N>/ folders"
                .into(),
        });
    }
    ranks.sort_unstable();
    // Every file's header must agree on the world size and mode, and every rank be present.
    let first = read_header(&trace_path(dir, ranks[0]))?;
    let world_size = first.world_size;
    for rank in 0..world_size {
        if ranks.binary_search(&rank).is_err() {
            return Err(DumpError::Folder {
                path: dir.to_owned(),
                detail: format!(
                    "rank{rank}.dctrace is missing (the traces say the world has {world_size} ranks)"
                ),
            });
        }
    }
    for &rank in &ranks {
        let path = trace_path(dir, rank);
        let h = read_header(&path)?;
        if h.world_size != world_size || h.mode != first.mode || h.rank != rank {
            return Err(DumpError::Folder {
                path: dir.to_owned(),
                detail: format!(
                    "{} says rank {} of {} in {} mode, but rank{}.dctrace says rank {} of {} in {} mode: \
                     files of different dumps are mixed",
                    path.display(), h.rank, h.world_size, h.mode, ranks[0], first.rank, world_size, first.mode
                ),
            });
        }
    }
    Ok(Dump::Traces {
        dir: dir.to_owned(),
        world_size,
        mode: first.mode,
    })
}

fn read_header(path: &Path) -> Result<Header, DumpError> {
    let mut file = File::open(path).map_err(|e| DumpError::io("open", path, e))?;
    let mut bytes = [0u8; format::HEADER_LEN];
    read_exact_or_truncated(&mut file, &mut bytes, path, "the header")?;
    decode_header(&bytes, path)
}

fn decode_header(bytes: &[u8; format::HEADER_LEN], path: &Path) -> Result<Header, DumpError> {
    format::decode_header(bytes).map_err(|e| match e {
        HeaderError::Magic => DumpError::BadMagic {
            path: path.to_owned(),
        },
        HeaderError::Version(found) => DumpError::Version {
            path: path.to_owned(),
            found,
            supported: format::VERSION,
        },
        HeaderError::Field(detail) => DumpError::Corrupt {
            path: path.to_owned(),
            offset: 0,
            detail: format!("header: {detail}"),
        },
    })
}

fn read_exact_or_truncated(
    file: &mut File,
    buf: &mut [u8],
    path: &Path,
    what: &str,
) -> Result<(), DumpError> {
    file.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            DumpError::Truncated {
                path: path.to_owned(),
                detail: format!("the file ends inside {what}"),
            }
        } else {
            DumpError::io("read", path, e)
        }
    })
}

/// Streams the records of one trace file. The footer is checked when the file is opened, so a
/// truncated file is rejected before any record is compared.
pub(crate) struct TraceReader {
    path: PathBuf,
    file: File,
    footer: Footer,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// File offset of `buf[end]`.
    file_pos: u64,
    names: Vec<String>,
    layouts: Vec<Layout>,
    num_records: u64,
    last: Option<(u64, u32)>,
    peeked: Option<(Entry, Option<Stats>)>,
    record_len: usize,
}

const READ_BUFFER: usize = 1 << 20;

impl TraceReader {
    pub(crate) fn open(path: &Path) -> Result<Self, DumpError> {
        let mut file = File::open(path).map_err(|e| DumpError::io("open", path, e))?;
        let len = file
            .metadata()
            .map_err(|e| DumpError::io("read", path, e))?
            .len();
        let mut head = [0u8; format::HEADER_LEN];
        read_exact_or_truncated(&mut file, &mut head, path, "the header")?;
        let header = decode_header(&head, path)?;
        let truncated = |detail: String| DumpError::Truncated {
            path: path.to_owned(),
            detail,
        };
        if len < (format::HEADER_LEN + format::FOOTER_LEN) as u64 {
            return Err(truncated(format!(
                "{len} bytes is too short to hold a header and a footer"
            )));
        }
        let footer_at = len - format::FOOTER_LEN as u64;
        file.seek(SeekFrom::Start(footer_at))
            .map_err(|e| DumpError::io("read", path, e))?;
        let mut tail = [0u8; format::FOOTER_LEN];
        read_exact_or_truncated(&mut file, &mut tail, path, "the footer")?;
        let footer = format::decode_footer(&tail).ok_or_else(|| {
            truncated("no footer at the end: the file was not completely written".into())
        })?;
        if footer.offset != footer_at {
            return Err(truncated(format!(
                "the footer says it starts at byte {}, but it is at byte {footer_at}",
                footer.offset
            )));
        }
        file.seek(SeekFrom::Start(format::HEADER_LEN as u64))
            .map_err(|e| DumpError::io("read", path, e))?;
        Ok(TraceReader {
            path: path.to_owned(),
            file,
            record_len: format::record_len(header.mode),
            footer,
            buf: vec![0; READ_BUFFER],
            pos: 0,
            end: 0,
            file_pos: format::HEADER_LEN as u64,
            names: Vec::new(),
            layouts: Vec::new(),
            num_records: 0,
            last: None,
            peeked: None,
        })
    }

    /// File offset of the next unread byte.
    fn offset(&self) -> u64 {
        self.file_pos - (self.end - self.pos) as u64
    }

    fn corrupt(&self, detail: String) -> DumpError {
        DumpError::Corrupt {
            path: self.path.clone(),
            offset: self.offset(),
            detail,
        }
    }

    /// Makes `need` bytes available at `buf[pos..]`, reading no further than the footer.
    fn fill(&mut self, need: usize) -> Result<(), DumpError> {
        if self.end - self.pos >= need {
            return Ok(());
        }
        self.buf.copy_within(self.pos..self.end, 0);
        self.end -= self.pos;
        self.pos = 0;
        if need > self.buf.len() {
            self.buf.resize(need, 0);
        }
        while self.end < need {
            let left_in_data = self.footer.offset - self.file_pos;
            if left_in_data == 0 {
                return Err(self.corrupt("an entry runs into the footer".into()));
            }
            let want = (self.buf.len() - self.end).min(left_in_data as usize);
            let n = self
                .file
                .read(&mut self.buf[self.end..self.end + want])
                .map_err(|e| DumpError::io("read", &self.path, e))?;
            if n == 0 {
                return Err(DumpError::Truncated {
                    path: self.path.clone(),
                    detail: "the file became shorter while it was read".into(),
                });
            }
            self.end += n;
            self.file_pos += n as u64;
        }
        Ok(())
    }

    /// Reads the next record into `batch`, handling the definitions before it; `false` after
    /// the last one.
    fn next_into(&mut self, batch: &mut Batch) -> Result<bool, DumpError> {
        loop {
            if self.pos == self.end && self.file_pos == self.footer.offset {
                return self.check_counts().map(|()| false);
            }
            self.fill(1)?;
            match self.buf[self.pos] {
                format::TAG_RECORD => {
                    self.fill(self.record_len)?;
                    self.take_record(batch)?;
                    return Ok(true);
                }
                format::TAG_NAME => {
                    self.fill(format::DEF_LEN)?;
                    let b = &self.buf[self.pos..];
                    let (len, id) = (format::u16_at(b, 2) as usize, format::u32_at(b, 4));
                    self.check_id(id, self.names.len(), "name")?;
                    self.fill(format::DEF_LEN + len)?;
                    let bytes =
                        &self.buf[self.pos + format::DEF_LEN..self.pos + format::DEF_LEN + len];
                    let name = std::str::from_utf8(bytes)
                        .map_err(|_| self.corrupt(format!("name {id} is not UTF-8")))?
                        .to_owned();
                    self.names.push(name);
                    self.pos += format::DEF_LEN + len;
                }
                format::TAG_LAYOUT => {
                    self.fill(format::DEF_LEN)?;
                    let b = &self.buf[self.pos..];
                    let (code, ndim, id) =
                        (b[1], format::u16_at(b, 2) as usize, format::u32_at(b, 4));
                    self.check_id(id, self.layouts.len(), "layout")?;
                    let dtype = format::dtype_from_code(code).ok_or_else(|| {
                        self.corrupt(format!("layout {id} has unknown dtype code {code}"))
                    })?;
                    self.fill(format::DEF_LEN + 8 * ndim)?;
                    let b = &self.buf[self.pos + format::DEF_LEN..];
                    let shape = (0..ndim).map(|i| format::u64_at(b, 8 * i)).collect();
                    self.layouts.push(Layout {
                        dtype: dtype.name().to_owned(),
                        shape,
                    });
                    self.pos += format::DEF_LEN + 8 * ndim;
                }
                tag => {
                    return Err(self.corrupt(format!("unknown entry tag 0x{tag:02x}")));
                }
            }
        }
    }

    /// Decodes and checks the record at `buf[pos..]`, which must be complete, into `batch`.
    #[inline]
    fn take_record(&mut self, batch: &mut Batch) -> Result<(), DumpError> {
        let bytes = &self.buf[self.pos..self.pos + self.record_len];
        let e = format::decode_record(bytes);
        if e.name as usize >= self.names.len() || e.layout as usize >= self.layouts.len() {
            return Err(self.corrupt(format!(
                "record points to name {} or layout {} before its definition",
                e.name, e.layout
            )));
        }
        if self.last.is_some_and(|last| (e.step, e.seq) <= last) {
            return Err(self.corrupt(format!(
                "record step {} seq {} is not after the previous one: records must be in (step, seq) order",
                e.step, e.seq
            )));
        }
        let stats = (self.record_len > format::RECORD_LEN_MD5).then(|| format::decode_stats(bytes));
        self.pos += self.record_len;
        self.last = Some((e.step, e.seq));
        self.num_records += 1;
        batch.push(e, stats);
        Ok(())
    }

    fn check_id(&self, id: u32, expected: usize, what: &str) -> Result<(), DumpError> {
        if id as usize != expected {
            return Err(self.corrupt(format!(
                "{what} definition {id} where {expected} was expected"
            )));
        }
        Ok(())
    }

    fn check_counts(&self) -> Result<(), DumpError> {
        let f = &self.footer;
        if f.num_records != self.num_records
            || f.num_names as usize != self.names.len()
            || f.num_layouts as usize != self.layouts.len()
        {
            return Err(self.corrupt(format!(
                "the footer counts {} records, {} names, {} layouts, but the file holds {}, {}, {}",
                f.num_records,
                f.num_names,
                f.num_layouts,
                self.num_records,
                self.names.len(),
                self.layouts.len()
            )));
        }
        Ok(())
    }

    pub(crate) fn names(&self) -> &[String] {
        &self.names
    }

    pub(crate) fn layouts(&self) -> &[Layout] {
        &self.layouts
    }

    /// Reads the records of the next step into `out`.
    pub(crate) fn next_step(&mut self, out: &mut Batch) -> Result<Option<u64>, DumpError> {
        out.clear();
        match self.peeked.take() {
            Some((e, s)) => out.push(e, s),
            None => {
                if !self.next_into(out)? {
                    return Ok(None);
                }
            }
        }
        let step = out.entries[0].step;
        loop {
            // The common case, a whole record in the buffer, without the general entry loop.
            let whole = self.end - self.pos >= self.record_len;
            if whole && self.buf[self.pos] == format::TAG_RECORD {
                self.take_record(out)?;
            } else if !self.next_into(out)? {
                break;
            }
            if out.entries.last().is_some_and(|e| e.step != step) {
                self.peeked = out.pop();
                break;
            }
        }
        Ok(Some(step))
    }
}

/// The safetensors files of one rank, one step loaded at a time.
struct TensorFiles {
    dir: PathBuf,
    rank: u32,
    loaded: Option<(u64, Vec<u8>)>,
}

impl TensorFiles {
    fn tensor(&mut self, step: u64, key: &str) -> Result<Option<Tensor>, DumpError> {
        let path = tensor_path(&self.dir, self.rank, step);
        if self.loaded.as_ref().is_none_or(|(s, _)| *s != step) {
            let bytes = match std::fs::read(&path) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(DumpError::io("read", &path, e)),
            };
            self.loaded = Some((step, bytes));
        }
        let bytes = &self.loaded.as_ref().expect("loaded").1;
        let bad = |detail: String| DumpError::Safetensors {
            path: path.clone(),
            detail,
        };
        let file = safetensors::SafeTensors::deserialize(bytes).map_err(|e| bad(e.to_string()))?;
        tensorfile::decode(&file, key).map_err(bad)
    }
}

/// A detcheck trace file as a [`RankSource`].
struct TraceSource {
    reader: TraceReader,
    tensors: Option<TensorFiles>,
}

impl RankSource for TraceSource {
    fn next_step(&mut self, out: &mut Batch) -> Result<Option<u64>, DumpError> {
        self.reader.next_step(out)
    }
    fn names(&self) -> &[String] {
        self.reader.names()
    }
    fn layouts(&self) -> &[Layout] {
        self.reader.layouts()
    }
    fn tensor(&mut self, entry: &Entry) -> Result<Option<Tensor>, DumpError> {
        let Some(files) = self.tensors.as_mut() else {
            return Ok(None);
        };
        let key = tensor_key(entry.seq, &self.reader.names()[entry.name as usize]);
        files.tensor(entry.step, &key)
    }
}

/// Reads a whole dump of detcheck trace files into memory: every record of every rank, as a
/// run in this process would have recorded them (records of an md5-mode dump have empty
/// statistics). The dump must hold `world_size` ranks.
///
/// # Errors
/// [`DumpError`] naming the file when a trace is missing, truncated or corrupt, names a dtype
/// this build does not know, or the dump holds another number of ranks.
pub(crate) fn load_trace(dir: &Path, world_size: u32) -> Result<Trace, DumpError> {
    let dump = open_dump(dir)?;
    if dump.world_size() != world_size {
        return Err(DumpError::Folder {
            path: dir.to_owned(),
            detail: format!(
                "the trace files are of a world of {} ranks, but the run has {world_size}",
                dump.world_size()
            ),
        });
    }
    let mut ranks = Vec::with_capacity(world_size as usize);
    for rank in 0..world_size {
        let mut source = dump.open_rank(rank)?;
        let mut batch = Batch::default();
        let mut records = Vec::new();
        while source.next_step(&mut batch)?.is_some() {
            for (i, entry) in batch.entries.iter().enumerate() {
                let layout = &source.layouts()[entry.layout as usize];
                let dtype: DType =
                    serde_json::from_value(serde_json::Value::String(layout.dtype.clone()))
                        .map_err(|_| DumpError::Corrupt {
                            path: trace_path(dir, rank),
                            offset: 0,
                            detail: format!("dtype `{}` is not one this build knows", layout.dtype),
                        })?;
                let shape = layout
                    .shape
                    .iter()
                    .map(|&d| usize::try_from(d))
                    .collect::<Result<Vec<usize>, _>>()
                    .map_err(|_| DumpError::Corrupt {
                        path: trace_path(dir, rank),
                        offset: 0,
                        detail: "a dimension does not fit this machine's memory".to_owned(),
                    })?;
                records.push(Record {
                    rank,
                    step: entry.step,
                    seq: entry.seq,
                    name: source.names()[entry.name as usize].clone(),
                    replicated: entry.replicated,
                    dtype,
                    shape,
                    md5: Md5Digest(entry.digest.bytes),
                    stats: batch.stats(i).copied().unwrap_or_default(),
                });
            }
        }
        ranks.push(RankTrace { rank, records });
    }
    Ok(Trace { ranks })
}

//! Reading dumps back: a folder of trace files, an msprobe dump folder, or an in-memory trace,
//! each seen as one stream of steps per rank.
//!
//! [`open_dump`] recognises the folder and checks that its files belong together (one world
//! size, mode, format version and run id); a [`Dump`] opens one [`RankSource`] per rank; a
//! source fills a [`Batch`] with the records of one step at a time. [`TraceReader`] checks a
//! file's header and footer (and, in version 2, their checksums, the environment and the
//! tensor-file sections) before its first record, each block's checksum before its entries, and
//! its counts after the last; it rejects any entry that breaks the format, naming the file and
//! byte offset. In a full dump of version 2, every tensor file the trace lists must exist with
//! its size, and its md5 is checked when the source reaches its step (whether or not a tensor of
//! it is asked for, so a damaged tensor file of an identical step is an error, never
//! "identical"), and again when a tensor of it is read. A reader that reads every tensor
//! (`compare --align`, [`TensorReads::Every`]) has each file loaded once instead, and checked
//! tensor by tensor against the records' digests (SIMD lanes, not one md5 stream); one that
//! reads none (loss curves) has the files left alone.
//!
//! Invariant (a damaged byte is an error, never data; the bytes are `file/format.rs`'s): every byte
//! of a file of version 2 or later is under a CRC-32 (header, each block of entries, the
//! environment and tensor-file sections, footer), checked before the bytes are used, so any one
//! changed byte is reported with the file and an offset (a test flips every byte of a file);
//! full-mode tensor files are listed with their size and md5, checked when the dump is opened
//! (size) and when a reader reaches their step (md5, whether or not a tensor of it is used; a
//! reader of every tensor, `compare --align`, checks instead that the file holds exactly the step's
//! tensors, each with its record's digest, and a reader of none, the loss curves, leaves the files
//! alone: `file::source::TensorReads`; a test changes every byte of one under `--align`). Files of
//! one dump share a run id; a folder that mixes two dumps is rejected.
//!
//! Limits: one step of one rank is held in memory at a time (all of a step's records).

use crate::file::format::{self, Entry, Footer, FooterError, Header, HeaderError, TensorFile};
use crate::file::msprobe::MsprobeDump;
use crate::file::source::{Batch, Layout, RankSource, TensorReads};
use crate::file::tensorfile;
use crate::file::{tensor_key, tensor_path, trace_path, DumpError, DumpMode};
use crate::record::{Environment, RankTrace, Record, Trace};
use crate::value::digest::{Md5Digest, Stats};
use crate::value::md5tree::{tree_digest_of_many, DigestKind};
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
        /// The files' format version.
        version: u16,
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

    /// Why the dump's ranks hold no environment snapshot, when they hold none.
    pub(crate) fn no_environment(&self) -> Option<&'static str> {
        match self {
            Dump::Traces { version, .. } if *version == format::VERSION_1 => {
                Some("its files are of trace format version 1, which has no environment snapshot")
            }
            Dump::Traces { .. } => None,
            Dump::Msprobe(_) => Some("msprobe dumps have no environment snapshot"),
        }
    }

    pub(crate) fn open_rank(&self, rank: u32) -> Result<Box<dyn RankSource>, DumpError> {
        match self {
            Dump::Traces { dir, mode, .. } => {
                let reader = TraceReader::open(&trace_path(dir, rank))?;
                let tensors = if *mode == DumpMode::Full {
                    Some(TensorFiles::open(dir, rank, &reader)?)
                } else {
                    None
                };
                Ok(Box::new(TraceSource { reader, tensors }))
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
    // Every file's header must agree on the world size, mode, version and run id, and every
    // rank be present.
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
    let describe = |h: &Header| {
        let id = if h.version == format::VERSION_1 {
            String::new()
        } else {
            format!(", run id {}", h.run_id)
        };
        format!(
            "rank {} of {} in {} mode (format version {}{id})",
            h.rank, h.world_size, h.mode, h.version
        )
    };
    for &rank in &ranks {
        let path = trace_path(dir, rank);
        let h = read_header(&path)?;
        let same = h.world_size == world_size
            && h.mode == first.mode
            && h.version == first.version
            && h.run_id == first.run_id;
        if !same || h.rank != rank {
            return Err(DumpError::Folder {
                path: dir.to_owned(),
                detail: format!(
                    "{} says {}, but rank{}.dctrace says {}: files of different dumps are mixed",
                    path.display(),
                    describe(&h),
                    ranks[0],
                    describe(&first)
                ),
            });
        }
    }
    Ok(Dump::Traces {
        dir: dir.to_owned(),
        world_size,
        mode: first.mode,
        version: first.version,
    })
}

/// Reads and checks the header of a trace file.
fn read_header(path: &Path) -> Result<Header, DumpError> {
    let mut file = super::open_input(path).map_err(|e| DumpError::io("open", path, e))?;
    read_header_from(&mut file, path)
}

/// Reads and checks the header at the start of `file` (up to 64 bytes: fewer for a shorter file).
fn read_header_from(file: &mut File, path: &Path) -> Result<Header, DumpError> {
    let mut bytes = [0u8; format::HEADER_LEN];
    let mut len = 0;
    while len < bytes.len() {
        match file.read(&mut bytes[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(DumpError::io("read", path, e)),
        }
    }
    format::decode_header(&bytes[..len]).map_err(|e| match e {
        HeaderError::Magic => DumpError::BadMagic {
            path: path.to_owned(),
        },
        HeaderError::Version(found) => DumpError::Version {
            path: path.to_owned(),
            found,
            supported: format::VERSION,
        },
        HeaderError::Short => DumpError::Truncated {
            path: path.to_owned(),
            detail: "the file ends inside the header".into(),
        },
        HeaderError::Damaged { offset, detail } => DumpError::Corrupt {
            path: path.to_owned(),
            offset,
            detail,
        },
    })
}

/// Reads `len` bytes at `offset` of `file`.
fn read_at(file: &mut File, path: &Path, offset: u64, len: usize) -> Result<Vec<u8>, DumpError> {
    let mut buf = vec![0u8; len];
    file.seek(SeekFrom::Start(offset))
        .and_then(|_| file.read_exact(&mut buf))
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                DumpError::Truncated {
                    path: path.to_owned(),
                    detail: "the file became shorter while it was read".into(),
                }
            } else {
                DumpError::io("read", path, e)
            }
        })?;
    Ok(buf)
}

/// Streams the records of one trace file. The header and footer (and in version 2 the
/// environment and tensor-file sections) are checked when the file is opened, so a truncated or
/// damaged file is rejected before any record is compared; each block's checksum is checked
/// before its first entry is read.
pub(crate) struct TraceReader {
    path: PathBuf,
    file: File,
    footer: Footer,
    version: u16,
    /// The digest the file's records carry (its header's).
    digest: DigestKind,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// File offset of `buf[end]`.
    file_pos: u64,
    /// File offset where the entries end: the footer (version 1) or the environment section.
    data_end: u64,
    /// Bytes of entries left in the current block (version 1: in the whole file).
    block_left: u64,
    /// Version 2: the offset of the current block, and its records (counted, and as framed).
    block_at: u64,
    block_records: u32,
    block_count: u32,
    num_blocks: u32,
    names: Vec<String>,
    layouts: Vec<Layout>,
    num_records: u64,
    last: Option<(u64, u32)>,
    peeked: Option<(Entry, Option<Stats>)>,
    /// The last entry read was a record of this block (a shard entry `P` may follow it).
    after_record: bool,
    record_len: usize,
    /// Version 2: the snapshot and the listed tensor files.
    environment: Option<Environment>,
    tensor_files: Vec<TensorFile>,
}

const READ_BUFFER: usize = 1 << 20;

impl TraceReader {
    pub(crate) fn open(path: &Path) -> Result<Self, DumpError> {
        let mut file = super::open_input(path).map_err(|e| DumpError::io("open", path, e))?;
        let len = file
            .metadata()
            .map_err(|e| DumpError::io("read", path, e))?
            .len();
        let header = read_header_from(&mut file, path)?;
        let (header_len, footer_len) = (
            format::header_len(header.version),
            format::footer_len(header.version),
        );
        let truncated = |detail: String| DumpError::Truncated {
            path: path.to_owned(),
            detail,
        };
        let corrupt = |offset: u64, detail: String| DumpError::Corrupt {
            path: path.to_owned(),
            offset,
            detail,
        };
        if len < (header_len + footer_len) as u64 {
            return Err(truncated(format!(
                "{len} bytes is too short to hold a header and a footer"
            )));
        }
        let footer_at = len - footer_len as u64;
        let tail = read_at(&mut file, path, footer_at, footer_len)?;
        let footer = if header.version == format::VERSION_1 {
            format::decode_footer_v1(&tail).ok_or_else(|| {
                truncated("no footer at the end: the file was not completely written".into())
            })?
        } else {
            format::decode_footer(&tail).map_err(|e| match e {
                FooterError::Missing => {
                    truncated("no footer at the end: the file was not completely written".into())
                }
                FooterError::Damaged { offset, detail } => corrupt(footer_at + offset, detail),
            })?
        };
        if footer.offset != footer_at {
            return Err(truncated(format!(
                "the footer says it starts at byte {}, but it is at byte {footer_at}",
                footer.offset
            )));
        }
        let (mut environment, mut tensor_files, mut data_end) = (None, Vec::new(), footer_at);
        if header.version != format::VERSION_1 {
            let (env_at, files_at) = (footer.environment, footer.tensor_files);
            // Offsets from the file: added without overflow (a crafted footer may hold any).
            let section = format::SECTION_LEN as u64;
            let fits = header_len as u64 <= env_at
                && env_at
                    .checked_add(section)
                    .is_some_and(|end| end <= files_at)
                && files_at
                    .checked_add(section)
                    .is_some_and(|end| end <= footer_at);
            if !fits {
                return Err(corrupt(
                    footer_at,
                    format!(
                        "the footer places the environment at byte {env_at} and the tensor files \
                         at byte {files_at}, outside the file's entries"
                    ),
                ));
            }
            let bytes = read_section(&mut file, path, env_at, files_at, format::TAG_ENVIRONMENT)?;
            let count = format::u32_at(&bytes, 8);
            let payload = &bytes[format::SECTION_LEN..];
            environment = Some(
                format::decode_environment(payload, count).map_err(|(at, why)| {
                    corrupt(env_at + (format::SECTION_LEN + at) as u64, why)
                })?,
            );
            let bytes = read_section(
                &mut file,
                path,
                files_at,
                footer_at,
                format::TAG_TENSOR_FILES,
            )?;
            let count = format::u32_at(&bytes, 8);
            tensor_files = format::decode_tensor_files(&bytes[format::SECTION_LEN..], count)
                .map_err(|(at, why)| corrupt(files_at + (format::SECTION_LEN + at) as u64, why))?;
            data_end = env_at;
        }
        file.seek(SeekFrom::Start(header_len as u64))
            .map_err(|e| DumpError::io("read", path, e))?;
        let block_left = if header.version == format::VERSION_1 {
            data_end - header_len as u64
        } else {
            0
        };
        Ok(TraceReader {
            path: path.to_owned(),
            file,
            record_len: format::record_len(header.mode),
            footer,
            version: header.version,
            digest: header.digest,
            buf: vec![0; READ_BUFFER],
            pos: 0,
            end: 0,
            file_pos: header_len as u64,
            data_end,
            block_left,
            block_at: 0,
            block_records: 0,
            block_count: 0,
            num_blocks: 0,
            names: Vec::new(),
            layouts: Vec::new(),
            num_records: 0,
            last: None,
            peeked: None,
            after_record: false,
            environment,
            tensor_files,
        })
    }

    /// File offset of the next unread byte.
    fn offset(&self) -> u64 {
        self.file_pos - (self.end - self.pos) as u64
    }

    fn corrupt(&self, detail: String) -> DumpError {
        self.corrupt_at(self.offset(), detail)
    }

    fn corrupt_at(&self, offset: u64, detail: String) -> DumpError {
        DumpError::Corrupt {
            path: self.path.clone(),
            offset,
            detail,
        }
    }

    /// Makes `need` bytes available at `buf[pos..]`, reading no further than the entries' end.
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
            let left_in_data = self.data_end - self.file_pos;
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

    /// Checks that an entry of `len` bytes fits in what is left of its block.
    fn check_fits(&self, len: usize) -> Result<(), DumpError> {
        if (len as u64) <= self.block_left {
            return Ok(());
        }
        Err(self.corrupt(if self.version == format::VERSION_1 {
            "an entry runs into the footer".into()
        } else {
            format!(
                "an entry runs past the end of the block at byte {}",
                self.block_at
            )
        }))
    }

    /// Version 2: ends the current block (its record count must match its framing) and starts
    /// the next one, checking its checksum; `false` at the end of the entries.
    fn next_block(&mut self) -> Result<bool, DumpError> {
        if self.num_blocks > 0 && self.block_records != self.block_count {
            return Err(self.corrupt_at(
                self.block_at,
                format!(
                    "the block says it holds {} records, but it holds {}",
                    self.block_count, self.block_records
                ),
            ));
        }
        if self.offset() == self.data_end {
            return Ok(false);
        }
        let at = self.offset();
        if self.data_end - at < format::SECTION_LEN as u64 {
            return Err(self.corrupt(format!(
                "{} bytes before the environment section are too few for a block",
                self.data_end - at
            )));
        }
        self.fill(format::SECTION_LEN)?;
        let framing = &self.buf[self.pos..self.pos + format::SECTION_LEN];
        let section = format::decode_section(framing).filter(|s| s.tag == format::TAG_BLOCK);
        let Some(section) = section else {
            return Err(self.corrupt(format!(
                "expected a block (tag 0x42), found tag 0x{:02x} or reserved bytes that are not 0",
                framing[0]
            )));
        };
        let len = u64::from(section.len);
        if len > self.data_end - at - format::SECTION_LEN as u64 {
            return Err(self.corrupt(format!(
                "the block says it holds {len} bytes, which runs past the environment section \
                 at byte {}",
                self.data_end
            )));
        }
        self.fill(format::SECTION_LEN + len as usize)?;
        let framing = &self.buf[self.pos..self.pos + format::SECTION_LEN];
        let payload = &self.buf
            [self.pos + format::SECTION_LEN..self.pos + format::SECTION_LEN + len as usize];
        if !format::section_checksum_holds(framing, payload) {
            return Err(self.corrupt(format!(
                "the checksum of the block of {len} bytes at byte {at} does not match its bytes"
            )));
        }
        self.pos += format::SECTION_LEN;
        self.block_at = at;
        self.block_left = len;
        self.block_records = 0;
        self.after_record = false;
        self.block_count = section.count;
        self.num_blocks += 1;
        Ok(true)
    }

    /// Reads the next record into `batch`, handling the definitions (and blocks) before it;
    /// `false` after the last one.
    fn next_into(&mut self, batch: &mut Batch) -> Result<bool, DumpError> {
        loop {
            if self.block_left == 0 {
                if self.version == format::VERSION_1 || !self.next_block()? {
                    return self.check_counts().map(|()| false);
                }
                continue;
            }
            self.fill(1)?;
            let tag = self.buf[self.pos];
            let after_record = std::mem::replace(&mut self.after_record, false);
            match tag {
                format::TAG_SHARD if self.version >= format::VERSION => {
                    self.take_shard(batch, after_record)?;
                }
                format::TAG_RECORD => {
                    self.check_fits(self.record_len)?;
                    self.fill(self.record_len)?;
                    self.take_record(batch)?;
                    return Ok(true);
                }
                format::TAG_NAME => {
                    self.check_fits(format::DEF_LEN)?;
                    self.fill(format::DEF_LEN)?;
                    let b = &self.buf[self.pos..];
                    let (len, id) = (format::u16_at(b, 2) as usize, format::u32_at(b, 4));
                    self.check_id(id, self.names.len(), "name")?;
                    self.check_fits(format::DEF_LEN + len)?;
                    self.fill(format::DEF_LEN + len)?;
                    let bytes =
                        &self.buf[self.pos + format::DEF_LEN..self.pos + format::DEF_LEN + len];
                    let name = std::str::from_utf8(bytes)
                        .map_err(|_| self.corrupt(format!("name {id} is not UTF-8")))?
                        .to_owned();
                    self.names.push(name);
                    self.pos += format::DEF_LEN + len;
                    self.block_left -= (format::DEF_LEN + len) as u64;
                }
                format::TAG_LAYOUT => {
                    self.check_fits(format::DEF_LEN)?;
                    self.fill(format::DEF_LEN)?;
                    let b = &self.buf[self.pos..];
                    let (code, ndim, id) =
                        (b[1], format::u16_at(b, 2) as usize, format::u32_at(b, 4));
                    self.check_id(id, self.layouts.len(), "layout")?;
                    let dtype = format::dtype_from_code(code).ok_or_else(|| {
                        self.corrupt(format!("layout {id} has unknown dtype code {code}"))
                    })?;
                    self.check_fits(format::DEF_LEN + 8 * ndim)?;
                    self.fill(format::DEF_LEN + 8 * ndim)?;
                    let b = &self.buf[self.pos + format::DEF_LEN..];
                    let shape = (0..ndim).map(|i| format::u64_at(b, 8 * i)).collect();
                    self.layouts.push(Layout {
                        dtype: dtype.name().to_owned(),
                        shape,
                    });
                    self.pos += format::DEF_LEN + 8 * ndim;
                    self.block_left -= (format::DEF_LEN + 8 * ndim) as u64;
                }
                tag => {
                    return Err(self.corrupt(format!("unknown entry tag 0x{tag:02x}")));
                }
            }
        }
    }

    /// Decodes and checks the record at `buf[pos..]`, which must be complete and within its
    /// block, into `batch`.
    #[inline]
    fn take_record(&mut self, batch: &mut Batch) -> Result<(), DumpError> {
        let bytes = &self.buf[self.pos..self.pos + self.record_len];
        let e = format::decode_record(bytes, self.digest);
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
        self.block_left -= self.record_len as u64;
        self.block_records += 1;
        self.last = Some((e.step, e.seq));
        self.num_records += 1;
        batch.push(e, stats);
        self.after_record = true;
        Ok(())
    }

    /// Decodes and checks the shard entry `P` at `buf[pos..]` and gives it to the batch's last
    /// record, which it must directly follow (`after_record`).
    fn take_shard(&mut self, batch: &mut Batch, after_record: bool) -> Result<(), DumpError> {
        let record = batch.entries.last().filter(|_| after_record).copied();
        let Some(record) = record else {
            return Err(self.corrupt(
                "a shard entry (tag 0x50) must directly follow the record it describes".into(),
            ));
        };
        self.check_fits(format::SHARD_LEN)?;
        self.fill(format::SHARD_LEN)?;
        let ndim = format::shard_ndim(&self.buf[self.pos..]).map_err(|e| self.corrupt(e))?;
        let len = format::SHARD_LEN + 24 * ndim;
        self.check_fits(len)?;
        self.fill(len)?;
        let shard = format::decode_shard(&self.buf[self.pos..], ndim);
        let local: Vec<usize> = self.layouts[record.layout as usize]
            .shape
            .iter()
            .map(|&d| usize::try_from(d).unwrap_or(usize::MAX))
            .collect();
        if let Err(e) = shard.placement.check(&local) {
            return Err(self.corrupt(format!(
                "the shard entry of record step {} seq {} does not fit its record: {e}",
                record.step, record.seq
            )));
        }
        self.pos += len;
        self.block_left -= len as u64;
        batch.set_shard(shard);
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
            || f.num_blocks != self.num_blocks
        {
            return Err(self.corrupt(format!(
                "the footer counts {} records, {} names, {} layouts, {} blocks, but the file holds \
                 {}, {}, {}, {}",
                f.num_records,
                f.num_names,
                f.num_layouts,
                f.num_blocks,
                self.num_records,
                self.names.len(),
                self.layouts.len(),
                self.num_blocks
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

    /// The environment snapshot (version 2).
    pub(crate) fn environment(&self) -> Option<&Environment> {
        self.environment.as_ref()
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
            // The common case, a whole record in the buffer and its block, without the general
            // entry loop.
            let whole =
                self.end - self.pos >= self.record_len && self.block_left >= self.record_len as u64;
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

/// Reads the section of `tag` at `[at, end)` of a version 2 file and checks its framing and
/// checksum; returns its bytes (framing, then payload).
fn read_section(
    file: &mut File,
    path: &Path,
    at: u64,
    end: u64,
    tag: u8,
) -> Result<Vec<u8>, DumpError> {
    let corrupt = |detail: String| DumpError::Corrupt {
        path: path.to_owned(),
        offset: at,
        detail,
    };
    let len = usize::try_from(end - at).map_err(|_| corrupt("a section is too large".into()))?;
    let bytes = read_at(file, path, at, len)?;
    let what = if tag == format::TAG_ENVIRONMENT {
        "environment"
    } else {
        "tensor-file"
    };
    let section = format::decode_section(&bytes).filter(|s| s.tag == tag);
    let Some(section) = section else {
        return Err(corrupt(format!(
            "expected the {what} section (tag 0x{tag:02x}), found tag 0x{:02x} or reserved bytes \
             that are not 0",
            bytes[0]
        )));
    };
    if section.len as usize != len - format::SECTION_LEN {
        return Err(corrupt(format!(
            "the {what} section says it holds {} bytes, but the footer gives it {}",
            section.len,
            len - format::SECTION_LEN
        )));
    }
    if !format::section_checksum_holds(&bytes, &bytes[format::SECTION_LEN..]) {
        return Err(corrupt(format!(
            "the checksum of the {what} section does not match its bytes"
        )));
    }
    Ok(bytes)
}

/// The safetensors files of one rank, one step loaded at a time.
struct TensorFiles {
    dir: PathBuf,
    rank: u32,
    loaded: Option<(u64, Vec<u8>)>,
    /// What the reader will read ([`RankSource::will_read`]). With [`TensorReads::Every`] each
    /// step's file is loaded when the source reaches the step, rather than hashed there and
    /// read again for its tensors, and its md5 is not computed: it must hold exactly its
    /// step's tensors, each with its record's digest (4 KiB chunks side by side in SIMD lanes,
    /// several times faster than one md5 stream), and its listed length.
    reads: TensorReads,
    /// Version 2: the files the trace lists, with their sizes and md5s (checked when opened and
    /// when read); `None` for version 1, whose missing files only mean no metrics.
    listed: Option<Vec<TensorFile>>,
    /// The trace file, named when a tensor file does not match it.
    trace: PathBuf,
}

impl TensorFiles {
    /// The tensor files of `rank`: in version 2, every file the trace lists must exist with the
    /// size it lists.
    fn open(dir: &Path, rank: u32, reader: &TraceReader) -> Result<Self, DumpError> {
        let listed = (reader.version != format::VERSION_1).then(|| reader.tensor_files.clone());
        let trace = reader.path.clone();
        for file in listed.iter().flatten() {
            let path = tensor_path(dir, rank, file.step);
            let bad = |detail: String| DumpError::ListedFile {
                path: path.clone(),
                detail,
            };
            match std::fs::metadata(&path) {
                Ok(meta) if meta.len() == file.len => {}
                Ok(meta) => {
                    return Err(bad(format!(
                        "{} bytes, but {} lists it with {} bytes: the tensor file is truncated \
                         or was replaced",
                        meta.len(),
                        trace.display(),
                        file.len
                    )))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(bad(format!(
                        "missing, but {} lists it ({} bytes, md5 {})",
                        trace.display(),
                        file.len,
                        file.md5
                    )))
                }
                Err(e) => return Err(DumpError::io("read", &path, e)),
            }
        }
        Ok(TensorFiles {
            dir: dir.to_owned(),
            rank,
            loaded: None,
            reads: TensorReads::Some,
            listed,
            trace,
        })
    }

    /// The file the trace lists for `step` (version 2): `Err(())` when it lists none (the step has
    /// no tensors), `Ok(None)` for version 1, which lists no files.
    fn listed_file(&self, step: u64) -> Result<Option<TensorFile>, ()> {
        match &self.listed {
            Some(files) => match files.binary_search_by_key(&step, |f| f.step) {
                Ok(i) => Ok(Some(files[i])),
                Err(_) => Err(()),
            },
            None => Ok(None),
        }
    }

    /// The error of a listed tensor file that cannot be opened or read.
    fn read_error(&self, path: PathBuf, e: std::io::Error) -> DumpError {
        if e.kind() == std::io::ErrorKind::NotFound {
            DumpError::ListedFile {
                path,
                detail: format!("missing, but {} lists it", self.trace.display()),
            }
        } else {
            DumpError::io("read", &path, e)
        }
    }

    /// An error when a tensor file's md5 and length are not the ones the trace lists.
    fn check_listed(
        &self,
        path: &Path,
        file: TensorFile,
        md5: Md5Digest,
        len: u64,
    ) -> Result<(), DumpError> {
        if md5 == file.md5 && len == file.len {
            return Ok(());
        }
        Err(DumpError::ListedFile {
            path: path.to_owned(),
            detail: format!(
                "corrupt: its md5 is {md5} ({len} bytes), but {} records {} ({} bytes)",
                self.trace.display(),
                file.md5,
                file.len
            ),
        })
    }

    /// The bytes of `step`'s tensor file, checked against the trace's list (version 2); `None`
    /// when the step has no file.
    fn read_step(&self, step: u64) -> Result<Option<Vec<u8>>, DumpError> {
        let path = tensor_path(&self.dir, self.rank, step);
        let Ok(listed) = self.listed_file(step) else {
            return Ok(None);
        };
        let bytes = match super::read_input(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && listed.is_none() => {
                return Ok(None)
            }
            Err(e) => return Err(self.read_error(path, e)),
        };
        if let Some(file) = listed {
            // Reading every tensor, each is checked against its record (`check_tensors`).
            let md5 = if self.reads == TensorReads::Every {
                file.md5
            } else {
                Md5Digest::of_bytes(&bytes)
            };
            self.check_listed(&path, file, md5, bytes.len() as u64)?;
        }
        Ok(Some(bytes))
    }

    /// Checks `step`'s tensor file (version 2: its md5) when the source reaches the step, so a
    /// damaged file is an error even when no tensor of it is read. The file is hashed in chunks,
    /// not kept: a compare reads tensors only for the rows it reports, and memory stays flat.
    fn check_step(&self, step: u64) -> Result<(), DumpError> {
        let Ok(Some(file)) = self.listed_file(step) else {
            return Ok(());
        };
        if self.loaded.as_ref().is_some_and(|(s, _)| *s == step) {
            return Ok(());
        }
        let path = tensor_path(&self.dir, self.rank, step);
        let (md5, len) = super::open_input(&path)
            .and_then(Md5Digest::of_reader)
            .map_err(|e| self.read_error(path.clone(), e))?;
        self.check_listed(&path, file, md5, len)
    }

    /// Reads and checks `step`'s file into memory unless it is there already; `false` when
    /// the step has no file.
    fn load_step(&mut self, step: u64) -> Result<bool, DumpError> {
        if self.loaded.as_ref().is_none_or(|(s, _)| *s != step) {
            let Some(bytes) = self.read_step(step)? else {
                return Ok(false);
            };
            self.loaded = Some((step, bytes));
        }
        Ok(true)
    }

    /// On reaching `step` (its records `entries`): its file checked (hashed in chunks),
    /// loaded and its tensors checked, or left alone, as the reader will read its tensors
    /// ([`TensorReads`]).
    fn reach_step(
        &mut self,
        step: u64,
        entries: &[Entry],
        names: &[String],
    ) -> Result<(), DumpError> {
        match self.reads {
            TensorReads::Some => self.check_step(step),
            TensorReads::Every => {
                if self.load_step(step)? {
                    self.check_tensors(step, entries, names)?;
                }
                Ok(())
            }
            TensorReads::None => Ok(()),
        }
    }

    fn tensor(&mut self, step: u64, key: &str) -> Result<Option<Tensor>, DumpError> {
        let path = tensor_path(&self.dir, self.rank, step);
        if !self.load_step(step)? {
            return Ok(None);
        }
        let bytes = &self.loaded.as_ref().expect("loaded").1;
        let bad = |detail: String| DumpError::Safetensors {
            path: path.clone(),
            detail,
        };
        let file = safetensors::SafeTensors::deserialize(bytes).map_err(|e| bad(e.to_string()))?;
        tensorfile::decode(&file, key).map_err(bad)
    }

    /// With [`TensorReads::Every`], on loading a listed step file: it must hold exactly the
    /// tensors of the step's records (`entries`), each with its record's digest (computed side
    /// by side in SIMD lanes: the file's md5, one stream, is not computed then).
    fn check_tensors(
        &self,
        step: u64,
        entries: &[Entry],
        names: &[String],
    ) -> Result<(), DumpError> {
        let (Ok(Some(_)), Some((_, bytes))) = (self.listed_file(step), &self.loaded) else {
            return Ok(());
        };
        let path = tensor_path(&self.dir, self.rank, step);
        let corrupt = |detail: String| DumpError::ListedFile {
            path: path.clone(),
            detail: format!("corrupt: {detail}, as {} records", self.trace.display()),
        };
        let file =
            safetensors::SafeTensors::deserialize(bytes).map_err(|e| DumpError::Safetensors {
                path: path.clone(),
                detail: e.to_string(),
            })?;
        if file.len() != entries.len() {
            return Err(corrupt(format!(
                "it holds {} tensors, not the step's {}",
                file.len(),
                entries.len()
            )));
        }
        let mut data = Vec::with_capacity(entries.len());
        for e in entries {
            let key = tensor_key(e.seq, &names[e.name as usize]);
            match file.tensor(&key) {
                Ok(view) => data.push(view.data()),
                Err(_) => return Err(corrupt(format!("it holds no tensor `{key}`"))),
            }
        }
        let tree = tree_digest_of_many(&data);
        for ((e, bytes), tree) in entries.iter().zip(&data).zip(tree) {
            let found = match e.digest.kind {
                DigestKind::Md5Tree4k => tree,
                DigestKind::Md5 => Md5Digest::of_bytes(bytes),
            };
            if e.digest.len == 16 && found.0 != e.digest.bytes {
                let key = tensor_key(e.seq, &names[e.name as usize]);
                return Err(corrupt(format!(
                    "its tensor `{key}` has the digest {found}, not {}",
                    e.digest.hex()
                )));
            }
        }
        Ok(())
    }
}

/// A detcheck trace file as a [`RankSource`].
struct TraceSource {
    reader: TraceReader,
    tensors: Option<TensorFiles>,
}

impl RankSource for TraceSource {
    fn next_step(&mut self, out: &mut Batch) -> Result<Option<u64>, DumpError> {
        let step = self.reader.next_step(out)?;
        if let (Some(step), Some(files)) = (step, &mut self.tensors) {
            files.reach_step(step, &out.entries, self.reader.names())?;
        }
        Ok(step)
    }
    fn names(&self) -> &[String] {
        self.reader.names()
    }
    fn layouts(&self) -> &[Layout] {
        self.reader.layouts()
    }
    fn environment(&self) -> Option<&Environment> {
        self.reader.environment()
    }
    fn tensor(&mut self, entry: &Entry) -> Result<Option<Tensor>, DumpError> {
        let Some(files) = self.tensors.as_mut() else {
            return Ok(None);
        };
        let key = tensor_key(entry.seq, &self.reader.names()[entry.name as usize]);
        files.tensor(entry.step, &key)
    }
    fn will_read(&mut self, reads: TensorReads) {
        if let Some(files) = self.tensors.as_mut() {
            files.reads = reads;
        }
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
        let mut digest = DigestKind::CURRENT;
        while source.next_step(&mut batch)?.is_some() {
            for (i, entry) in batch.entries.iter().enumerate() {
                digest = entry.digest.kind;
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
                    shard: batch.shard(i).cloned(),
                });
            }
        }
        ranks.push(RankTrace {
            rank,
            records,
            environment: source.environment().cloned(),
            digest,
        });
    }
    Ok(Trace { ranks })
}

//! The byte layout of a trace file (versions 1 to 3), as documented in `docs/trace-format.md`.
//!
//! Everything is little-endian. Version 3 (written by default) is version 2's layout with one
//! more header field, the digest its records carry (byte 28: 2 for the tree digest of
//! `value/md5tree.rs`; versions 1 and 2 carry plain md5). Version 2 is a 64-byte header with the run
//! id and a CRC-32 of itself; blocks `B` of entries (name definitions `N`, layout definitions
//! `L`, records `R`), each with the CRC-32 of its framing and its entries; an environment section
//! `V` (the sorted snapshot); a tensor-file section `T` (full mode: the md5 of each step's
//! safetensors file); and a 64-byte footer `E` with the counts, the sections' offsets and a
//! CRC-32 of itself. Version 1 (still read; written only by tests) is a 32-byte header, the same
//! entries without blocks, and a 40-byte footer, with no checksum. Records are fixed-size: 40
//! bytes in md5 mode, 104 bytes with statistics. This module only encodes and decodes bytes;
//! files are handled by the writer and the reader.
//!
//! Checksums are CRC-32 (ISO-HDLC: zlib's and Python's `zlib.crc32`), which detects every change
//! of up to 32 consecutive bits, so any one damaged byte of a version 2 file is caught.
//!
//! Dtype codes 1-4 (f32, f64, i64, u8) are the first ones; 5-8 (f16, bf16, i32, bool) and 9-15
//! (i8, i16, u16, f8e4m3fn, f8e5m2, c64, c128) were added later within version 1: every older
//! file stays valid, and only a file that uses a new dtype needs a reader that knows its code (an
//! older one rejects it as an unknown dtype code).

use crate::file::{DumpMode, RunId};
use crate::record::Environment;
use crate::value::digest::{ExactF64, Md5Digest, Stats};
use crate::value::md5tree::DigestKind;
use crate::value::position::{Placement, PositionDigest, Shard};
use crate::value::tensor::DType;

/// The first 8 bytes of every trace file.
pub(crate) const MAGIC: [u8; 8] = *b"DCTRACE\0";
/// The last 8 bytes of every complete trace file.
pub(crate) const END_MAGIC: [u8; 8] = *b"DCTREND\0";
/// The format version this build writes.
pub(crate) const VERSION: u16 = 3;
/// The version before the digest field (plain md5 digests), still read.
pub(crate) const VERSION_2: u16 = 2;
/// The first version, still read.
pub(crate) const VERSION_1: u16 = 1;
/// Bytes of a version 1 header.
pub(crate) const HEADER_LEN_V1: usize = 32;
/// Bytes of a version 2 header.
pub(crate) const HEADER_LEN: usize = 64;
/// Bytes of a version 1 footer.
pub(crate) const FOOTER_LEN_V1: usize = 40;
/// Bytes of a version 2 footer.
pub(crate) const FOOTER_LEN: usize = 64;
/// Bytes of a section's framing (blocks `B`, the environment `V`, the tensor files `T`).
pub(crate) const SECTION_LEN: usize = 16;
/// A block is closed once its entries reach this many bytes (after the record that crossed it).
pub(crate) const BLOCK_TARGET: usize = 64 << 10;
/// Bytes of an entry of the tensor-file section.
pub(crate) const TENSOR_FILE_LEN: usize = 32;
/// The checksum code of the header: CRC-32 (ISO-HDLC).
pub(crate) const CHECKSUM_CRC32: u8 = 1;
/// Bytes of a record without statistics.
pub(crate) const RECORD_LEN_MD5: usize = 40;
/// Bytes of a record with statistics.
pub(crate) const RECORD_LEN_STATS: usize = 104;
/// Bytes before the payload of a name or layout definition.
pub(crate) const DEF_LEN: usize = 8;

pub(crate) const TAG_NAME: u8 = b'N';
pub(crate) const TAG_LAYOUT: u8 = b'L';
pub(crate) const TAG_RECORD: u8 = b'R';
pub(crate) const TAG_END: u8 = b'E';
pub(crate) const TAG_BLOCK: u8 = b'B';
pub(crate) const TAG_ENVIRONMENT: u8 = b'V';
pub(crate) const TAG_TENSOR_FILES: u8 = b'T';
/// A sharded record's placement and position digest, right after its record (added within
/// version 3: an older reader rejects the tag, never misreads it).
pub(crate) const TAG_SHARD: u8 = b'P';
/// Bytes of a shard entry before its dimensions (then 24 bytes per dimension).
pub(crate) const SHARD_LEN: usize = 24;

/// Record flag: the tensor is replicated on every rank.
pub(crate) const FLAG_REPLICATED: u8 = 1;

/// The CRC-32 of the concatenation of `parts`.
pub(crate) fn crc32(parts: &[&[u8]]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize()
}

/// The record size of a mode.
pub(crate) fn record_len(mode: DumpMode) -> usize {
    if mode.has_stats() {
        RECORD_LEN_STATS
    } else {
        RECORD_LEN_MD5
    }
}

/// The header size of a version.
pub(crate) fn header_len(version: u16) -> usize {
    if version == VERSION_1 {
        HEADER_LEN_V1
    } else {
        HEADER_LEN
    }
}

/// The footer size of a version.
pub(crate) fn footer_len(version: u16) -> usize {
    if version == VERSION_1 {
        FOOTER_LEN_V1
    } else {
        FOOTER_LEN
    }
}

pub(crate) fn mode_code(mode: DumpMode) -> u8 {
    match mode {
        DumpMode::Md5 => 1,
        DumpMode::Stats => 2,
        DumpMode::Full => 3,
    }
}

pub(crate) fn mode_from_code(code: u8) -> Option<DumpMode> {
    match code {
        1 => Some(DumpMode::Md5),
        2 => Some(DumpMode::Stats),
        3 => Some(DumpMode::Full),
        _ => None,
    }
}

pub(crate) fn dtype_code(dtype: DType) -> u8 {
    match dtype {
        DType::F32 => 1,
        DType::F64 => 2,
        DType::I64 => 3,
        DType::U8 => 4,
        DType::F16 => 5,
        DType::BF16 => 6,
        DType::I32 => 7,
        DType::Bool => 8,
        DType::I8 => 9,
        DType::I16 => 10,
        DType::U16 => 11,
        DType::F8E4M3 => 12,
        DType::F8E5M2 => 13,
        DType::C64 => 14,
        DType::C128 => 15,
    }
}

pub(crate) fn dtype_from_code(code: u8) -> Option<DType> {
    match code {
        1 => Some(DType::F32),
        2 => Some(DType::F64),
        3 => Some(DType::I64),
        4 => Some(DType::U8),
        5 => Some(DType::F16),
        6 => Some(DType::BF16),
        7 => Some(DType::I32),
        8 => Some(DType::Bool),
        9 => Some(DType::I8),
        10 => Some(DType::I16),
        11 => Some(DType::U16),
        12 => Some(DType::F8E4M3),
        13 => Some(DType::F8E5M2),
        14 => Some(DType::C64),
        15 => Some(DType::C128),
        _ => None,
    }
}

/// The header's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    /// 1 or 2.
    pub(crate) version: u16,
    pub(crate) mode: DumpMode,
    pub(crate) rank: u32,
    pub(crate) world_size: u32,
    /// Zero in version 1 (which has none).
    pub(crate) run_id: RunId,
    /// The digest the records carry: plain md5 before version 3.
    pub(crate) digest: DigestKind,
}

/// The digest a writer of `version` gives its records: this build's from version 3 on (older
/// versions are written only by tests, of records up to one chunk, where the kinds agree).
pub(crate) fn digest_of_version(version: u16) -> DigestKind {
    if version >= VERSION {
        DigestKind::CURRENT
    } else {
        DigestKind::Md5
    }
}

/// The header's code of a digest kind (byte 28 from version 3 on).
fn digest_code(kind: DigestKind) -> u8 {
    match kind {
        DigestKind::Md5 => 1,
        DigestKind::Md5Tree4k => 2,
    }
}

fn digest_from_code(code: u8) -> Option<DigestKind> {
    match code {
        1 => Some(DigestKind::Md5),
        2 => Some(DigestKind::Md5Tree4k),
        _ => None,
    }
}

/// Why a header could not be decoded.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HeaderError {
    /// Not a trace at all.
    Magic,
    /// A version this build does not read, in a header whose checksum holds.
    Version(u16),
    /// Fewer bytes than the header needs.
    Short,
    /// Damaged bytes (a checksum that does not hold, a field out of range), at `offset`.
    Damaged { offset: u64, detail: String },
}

/// The bytes of a header: 32 in version 1, 64 in version 2.
pub(crate) fn encode_header(h: &Header) -> Vec<u8> {
    let mut out = vec![0u8; header_len(h.version)];
    out[0..8].copy_from_slice(&MAGIC);
    out[8..10].copy_from_slice(&h.version.to_le_bytes());
    out[10] = mode_code(h.mode);
    out[12..16].copy_from_slice(&h.rank.to_le_bytes());
    out[16..20].copy_from_slice(&h.world_size.to_le_bytes());
    out[20..24].copy_from_slice(&(record_len(h.mode) as u32).to_le_bytes());
    if h.version != VERSION_1 {
        out[11] = CHECKSUM_CRC32;
        out[24..28].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        out[32..48].copy_from_slice(&h.run_id.0);
        if h.version >= VERSION {
            out[28] = digest_code(h.digest);
        }
        let crc = crc32(&[&out[..60]]);
        out[60..64].copy_from_slice(&crc.to_le_bytes());
    }
    out
}

/// `true` when the version 2 header checksum of `b` (64 bytes or more) holds.
fn header_checksum_holds(b: &[u8]) -> bool {
    crc32(&[&b[..60]]) == u32_at(b, 60)
}

/// The index of the first byte where `a` and `b` differ.
fn first_difference(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(0)
}

/// Decodes a header from the first bytes of a file (up to 64; fewer when the file is shorter).
pub(crate) fn decode_header(b: &[u8]) -> Result<Header, HeaderError> {
    if b.len() < 10 {
        return Err(HeaderError::Short);
    }
    if b[0..8] != MAGIC {
        // A version 2 header damaged in its magic only: its checksum holds with the magic
        // restored. Anything else is not a trace.
        if b.len() >= HEADER_LEN {
            let mut restored = b[..HEADER_LEN].to_vec();
            restored[..8].copy_from_slice(&MAGIC);
            if header_checksum_holds(&restored) {
                return Err(HeaderError::Damaged {
                    offset: first_difference(&b[..8], &MAGIC) as u64,
                    detail: "the magic `DCTRACE` is damaged".into(),
                });
            }
        }
        return Err(HeaderError::Magic);
    }
    let version = u16_at(b, 8);
    let damaged = |offset: u64, detail: String| Err(HeaderError::Damaged { offset, detail });
    match version {
        VERSION_1 => {
            if b.len() < HEADER_LEN_V1 {
                return Err(HeaderError::Short);
            }
            // A version 1 writer wrote zeros here; a version 2 header read as version 1 (its
            // version byte damaged) has its checksum code and header size here.
            if let Some(at) = [11usize, 24, 25, 26, 27, 28, 29, 30, 31]
                .into_iter()
                .find(|&i| b[i] != 0)
            {
                return damaged(at as u64, "header: a reserved byte is not 0".into());
            }
        }
        VERSION_2 | VERSION => {
            if b.len() < HEADER_LEN {
                return Err(HeaderError::Short);
            }
            if !header_checksum_holds(b) {
                return damaged(0, "the header's checksum does not match its bytes".into());
            }
            if b[11] != CHECKSUM_CRC32 {
                return damaged(11, format!("header: unknown checksum code {}", b[11]));
            }
            if u32_at(b, 24) as usize != HEADER_LEN {
                return damaged(24, format!("header: header size {}", u32_at(b, 24)));
            }
        }
        other => {
            // A newer version keeps the header's checksum where version 2 has it: when it
            // holds, the file is of a version this build does not know; when it does not,
            // the version bytes themselves are damaged.
            if b.len() >= HEADER_LEN && header_checksum_holds(b) {
                return Err(HeaderError::Version(other));
            }
            return damaged(
                8,
                format!("the header says version {other}, but its checksum does not match"),
            );
        }
    }
    let mode = match mode_from_code(b[10]) {
        Some(mode) => mode,
        None => return damaged(10, format!("header: unknown mode code {}", b[10])),
    };
    let (rank, world_size, rec_len) = (u32_at(b, 12), u32_at(b, 16), u32_at(b, 20));
    if world_size == 0 || rank >= world_size {
        return damaged(
            12,
            format!("header: rank {rank} does not fit world size {world_size}"),
        );
    }
    if rec_len as usize != record_len(mode) {
        return damaged(
            20,
            format!("header: record size {rec_len} does not match mode {mode}"),
        );
    }
    let mut run_id = RunId::UNKNOWN;
    if version != VERSION_1 {
        run_id.0.copy_from_slice(&b[32..48]);
    }
    let digest = if version >= VERSION {
        match digest_from_code(b[28]) {
            Some(kind) => kind,
            None => return damaged(28, format!("header: unknown digest code {}", b[28])),
        }
    } else {
        DigestKind::Md5
    };
    Ok(Header {
        version,
        mode,
        rank,
        world_size,
        run_id,
        digest,
    })
}

/// The footer's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Footer {
    pub(crate) num_records: u64,
    pub(crate) num_names: u32,
    pub(crate) num_layouts: u32,
    /// The byte offset of the footer itself: the length of the file before it.
    pub(crate) offset: u64,
    /// Version 2: the number of blocks.
    pub(crate) num_blocks: u32,
    /// Version 2: the offset of the environment section (where the blocks end).
    pub(crate) environment: u64,
    /// Version 2: the offset of the tensor-file section.
    pub(crate) tensor_files: u64,
}

/// Encodes a version 1 footer (40 bytes).
pub(crate) fn encode_footer_v1(f: &Footer) -> [u8; FOOTER_LEN_V1] {
    let mut out = [0u8; FOOTER_LEN_V1];
    out[0] = TAG_END;
    out[8..16].copy_from_slice(&f.num_records.to_le_bytes());
    out[16..20].copy_from_slice(&f.num_names.to_le_bytes());
    out[20..24].copy_from_slice(&f.num_layouts.to_le_bytes());
    out[24..32].copy_from_slice(&f.offset.to_le_bytes());
    out[32..40].copy_from_slice(&END_MAGIC);
    out
}

/// Decodes a version 1 footer; `None` when the tag or the end magic is wrong.
pub(crate) fn decode_footer_v1(b: &[u8]) -> Option<Footer> {
    if b[0] != TAG_END || b[32..40] != END_MAGIC {
        return None;
    }
    Some(Footer {
        num_records: u64_at(b, 8),
        num_names: u32_at(b, 16),
        num_layouts: u32_at(b, 20),
        offset: u64_at(b, 24),
        num_blocks: 0,
        environment: 0,
        tensor_files: 0,
    })
}

/// The checksum of a version 2 footer: bytes 0..52 and the end magic.
fn footer_checksum(b: &[u8]) -> u32 {
    crc32(&[&b[..52], &b[56..64]])
}

/// Encodes a version 2 footer (64 bytes).
pub(crate) fn encode_footer(f: &Footer) -> [u8; FOOTER_LEN] {
    let mut out = [0u8; FOOTER_LEN];
    out[0] = TAG_END;
    out[4..8].copy_from_slice(&f.num_blocks.to_le_bytes());
    out[8..16].copy_from_slice(&f.num_records.to_le_bytes());
    out[16..20].copy_from_slice(&f.num_names.to_le_bytes());
    out[20..24].copy_from_slice(&f.num_layouts.to_le_bytes());
    out[24..32].copy_from_slice(&f.offset.to_le_bytes());
    out[32..40].copy_from_slice(&f.environment.to_le_bytes());
    out[40..48].copy_from_slice(&f.tensor_files.to_le_bytes());
    out[56..64].copy_from_slice(&END_MAGIC);
    let crc = footer_checksum(&out);
    out[52..56].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Why a version 2 footer could not be decoded.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FooterError {
    /// No footer at all: the file was cut short (or has bytes appended).
    Missing,
    /// A footer with damaged bytes, at `offset` within it.
    Damaged { offset: u64, detail: String },
}

/// Decodes a version 2 footer (the last 64 bytes of a file).
pub(crate) fn decode_footer(b: &[u8]) -> Result<Footer, FooterError> {
    let holds = footer_checksum(b) == u32_at(b, 52);
    if b[56..64] != END_MAGIC {
        // Damage in the end magic only (the checksum holds with it restored) is corruption;
        // anything else is a file that does not end with a footer.
        let mut restored = b[..FOOTER_LEN].to_vec();
        restored[56..64].copy_from_slice(&END_MAGIC);
        if footer_checksum(&restored) == u32_at(b, 52) {
            return Err(FooterError::Damaged {
                offset: 56 + first_difference(&b[56..64], &END_MAGIC) as u64,
                detail: "the end magic `DCTREND` is damaged".into(),
            });
        }
        return Err(FooterError::Missing);
    }
    if !holds {
        return Err(FooterError::Damaged {
            offset: 0,
            detail: "the footer's checksum does not match its bytes".into(),
        });
    }
    if b[0] != TAG_END || b[1..4] != [0, 0, 0] || b[48..52] != [0; 4] {
        return Err(FooterError::Damaged {
            offset: 0,
            detail: "the footer's tag or reserved bytes are wrong".into(),
        });
    }
    Ok(Footer {
        num_blocks: u32_at(b, 4),
        num_records: u64_at(b, 8),
        num_names: u32_at(b, 16),
        num_layouts: u32_at(b, 20),
        offset: u64_at(b, 24),
        environment: u64_at(b, 32),
        tensor_files: u64_at(b, 40),
    })
}

/// The framing of a section: its tag, the bytes of its payload, a count and the CRC-32 of the
/// framing's first 12 bytes and the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Section {
    pub(crate) tag: u8,
    pub(crate) len: u32,
    pub(crate) count: u32,
    pub(crate) crc: u32,
}

/// The 16 bytes framing `payload` as a section of `tag` holding `count` items.
pub(crate) fn encode_section(tag: u8, count: u32, payload: &[u8]) -> [u8; SECTION_LEN] {
    let mut out = [0u8; SECTION_LEN];
    out[0] = tag;
    out[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    out[8..12].copy_from_slice(&count.to_le_bytes());
    let crc = crc32(&[&out[..12], payload]);
    out[12..16].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes a section's framing (16 bytes); the reserved bytes must be 0.
pub(crate) fn decode_section(b: &[u8]) -> Option<Section> {
    (b[1..4] == [0, 0, 0]).then(|| Section {
        tag: b[0],
        len: u32_at(b, 4),
        count: u32_at(b, 8),
        crc: u32_at(b, 12),
    })
}

/// `true` when `payload` is the one `framing` (its 16 bytes) was written for.
pub(crate) fn section_checksum_holds(framing: &[u8], payload: &[u8]) -> bool {
    crc32(&[&framing[..12], payload]) == u32_at(framing, 12)
}

/// The payload of the environment section: per entry the key's and the value's lengths (u16
/// each), the key and the value (UTF-8), sorted by key.
pub(crate) fn encode_environment(env: &Environment) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in env.iter() {
        out.extend_from_slice(&(key.len() as u16).to_le_bytes());
        out.extend_from_slice(&(value.len() as u16).to_le_bytes());
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// Decodes the environment payload of `count` entries; `Err((offset in the payload, why))`.
pub(crate) fn decode_environment(b: &[u8], count: u32) -> Result<Environment, (usize, String)> {
    let mut env = Environment::new();
    let mut pos = 0;
    let mut last: Option<&str> = None;
    for i in 0..count {
        if b.len() - pos < 4 {
            return Err((pos, format!("entry {i} runs past the section")));
        }
        let (klen, vlen) = (usize::from(u16_at(b, pos)), usize::from(u16_at(b, pos + 2)));
        if b.len() - pos - 4 < klen + vlen {
            return Err((pos, format!("entry {i} runs past the section")));
        }
        let text = |at: usize, len: usize| {
            std::str::from_utf8(&b[at..at + len])
                .map_err(|_| (at, format!("entry {i} is not UTF-8")))
        };
        let key = text(pos + 4, klen)?;
        let value = text(pos + 4 + klen, vlen)?;
        if key.is_empty() || last.is_some_and(|l| l >= key) {
            return Err((pos, format!("entry {i} (`{key}`) is empty or out of order")));
        }
        env.set(key, value);
        last = Some(key);
        pos += 4 + klen + vlen;
    }
    if pos != b.len() {
        return Err((pos, "bytes after the last entry".into()));
    }
    Ok(env)
}

/// A full-mode tensor file as its rank's trace lists it: the step, its size and its md5.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TensorFile {
    pub(crate) step: u64,
    pub(crate) len: u64,
    pub(crate) md5: Md5Digest,
}

/// The payload of the tensor-file section: 32 bytes per file, in step order.
pub(crate) fn encode_tensor_files(files: &[TensorFile]) -> Vec<u8> {
    let mut out = Vec::with_capacity(files.len() * TENSOR_FILE_LEN);
    for f in files {
        out.extend_from_slice(&f.step.to_le_bytes());
        out.extend_from_slice(&f.len.to_le_bytes());
        out.extend_from_slice(&f.md5.0);
    }
    out
}

/// Decodes the tensor-file payload of `count` files; `Err((offset in the payload, why))`.
pub(crate) fn decode_tensor_files(
    b: &[u8],
    count: u32,
) -> Result<Vec<TensorFile>, (usize, String)> {
    if b.len() != count as usize * TENSOR_FILE_LEN {
        return Err((
            0,
            format!("{} bytes cannot hold {count} tensor files", b.len()),
        ));
    }
    let mut files: Vec<TensorFile> = Vec::with_capacity(count as usize);
    for (i, chunk) in b.chunks_exact(TENSOR_FILE_LEN).enumerate() {
        let mut md5 = [0u8; 16];
        md5.copy_from_slice(&chunk[16..32]);
        let file = TensorFile {
            step: u64_at(chunk, 0),
            len: u64_at(chunk, 8),
            md5: Md5Digest(md5),
        };
        if files.last().is_some_and(|l| l.step >= file.step) {
            return Err((
                i * TENSOR_FILE_LEN,
                format!("tensor file {i} is out of step order"),
            ));
        }
        files.push(file);
    }
    Ok(files)
}

/// Appends a name definition.
pub(crate) fn encode_name(out: &mut Vec<u8>, id: u32, name: &str) {
    out.push(TAG_NAME);
    out.push(0);
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(name.as_bytes());
}

/// Appends a layout definition.
pub(crate) fn encode_layout(out: &mut Vec<u8>, id: u32, dtype: DType, shape: &[usize]) {
    out.push(TAG_LAYOUT);
    out.push(dtype_code(dtype));
    out.extend_from_slice(&(shape.len() as u16).to_le_bytes());
    out.extend_from_slice(&id.to_le_bytes());
    for &d in shape {
        out.extend_from_slice(&(d as u64).to_le_bytes());
    }
}

/// The fields of a record entry, with ids into the file's name and layout tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) step: u64,
    pub(crate) seq: u32,
    /// Index into the name table of its source.
    pub(crate) name: u32,
    /// Index into the layout table of its source.
    pub(crate) layout: u32,
    pub(crate) replicated: bool,
    pub(crate) digest: Digest,
}

/// A content digest: 16 bytes of md5 (plain, or the tree digest: `kind`), or fewer for other
/// tools' checksums (msprobe's CRC-32). An empty digest means the source holds none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Digest {
    pub(crate) bytes: [u8; 16],
    pub(crate) len: u8,
    /// Which md5 the 16 bytes are (plain md5 for a checksum).
    pub(crate) kind: DigestKind,
}

impl Digest {
    pub(crate) const NONE: Digest = Digest {
        bytes: [0; 16],
        len: 0,
        kind: DigestKind::Md5,
    };

    /// A digest of `kind`.
    pub(crate) fn of_kind(kind: DigestKind, bytes: [u8; 16]) -> Self {
        Digest {
            bytes,
            len: 16,
            kind,
        }
    }

    /// A record digest of this build ([`DigestKind::CURRENT`]).
    pub(crate) fn current(bytes: [u8; 16]) -> Self {
        Digest::of_kind(DigestKind::CURRENT, bytes)
    }

    /// A checksum of `len` bytes (another tool's).
    pub(crate) fn checksum(bytes: [u8; 16], len: u8) -> Self {
        Digest {
            bytes,
            len,
            kind: DigestKind::Md5,
        }
    }

    pub(crate) fn is_none(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn hex(&self) -> String {
        self.bytes[..usize::from(self.len)]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// Appends a record, with its statistics in stats mode (`Some`).
pub(crate) fn encode_record(out: &mut Vec<u8>, e: &Entry, stats: Option<&Stats>) {
    out.push(TAG_RECORD);
    out.push(if e.replicated { FLAG_REPLICATED } else { 0 });
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&e.name.to_le_bytes());
    out.extend_from_slice(&e.step.to_le_bytes());
    out.extend_from_slice(&e.seq.to_le_bytes());
    out.extend_from_slice(&e.layout.to_le_bytes());
    out.extend_from_slice(&e.digest.bytes);
    if let Some(s) = stats {
        let fields = [s.max, s.min, s.mean, s.norm];
        let mask = fields
            .iter()
            .enumerate()
            .fold(0u8, |m, (i, f)| m | (u8::from(f.is_some()) << i));
        out.push(mask);
        out.extend_from_slice(&[0; 7]);
        for f in fields {
            out.extend_from_slice(&f.map_or(0, |x| x.0.to_bits()).to_le_bytes());
        }
        for count in [s.nan, s.pos_inf, s.neg_inf] {
            out.extend_from_slice(&count.to_le_bytes());
        }
    }
}

/// Decodes the common part of a record (its first 40 bytes, from its tag), whose file's header
/// says its digests are of `kind`.
/// Appends the `P` entry of a shard: tag, reserved, ndim, reserved, the position digest, then
/// the global shape, the offsets and the extents (u64 each).
pub(crate) fn encode_shard(out: &mut Vec<u8>, shard: &Shard) {
    let p = &shard.placement;
    out.push(TAG_SHARD);
    out.push(0);
    out.extend_from_slice(&(p.global_shape.len() as u16).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&shard.digest.to_bytes());
    for dims in [&p.global_shape, &p.offset, &p.extent] {
        for &d in dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
    }
}

/// The dimensions of the `P` entry at `b` (its first [`SHARD_LEN`] bytes), or why its reserved
/// bytes are damaged.
pub(crate) fn shard_ndim(b: &[u8]) -> Result<usize, String> {
    if b[1] != 0 || b[4..8] != [0; 4] {
        return Err("a shard entry's reserved bytes are not 0".into());
    }
    Ok(usize::from(u16_at(b, 2)))
}

/// Decodes a whole `P` entry of `ndim` dimensions (not yet checked against its record).
pub(crate) fn decode_shard(b: &[u8], ndim: usize) -> Shard {
    let mut digest = [0u8; 16];
    digest.copy_from_slice(&b[8..24]);
    let dims = |k: usize| -> Vec<u64> {
        (0..ndim)
            .map(|i| u64_at(b, SHARD_LEN + 8 * (k * ndim + i)))
            .collect()
    };
    Shard {
        placement: Placement {
            global_shape: dims(0),
            offset: dims(1),
            extent: dims(2),
        },
        digest: PositionDigest::from_bytes(digest),
    }
}

#[inline]
pub(crate) fn decode_record(b: &[u8], kind: DigestKind) -> Entry {
    let mut md5 = [0u8; 16];
    md5.copy_from_slice(&b[24..40]);
    Entry {
        step: u64_at(b, 8),
        seq: u32_at(b, 16),
        name: u32_at(b, 4),
        layout: u32_at(b, 20),
        replicated: b[1] & FLAG_REPLICATED != 0,
        digest: Digest::of_kind(kind, md5),
    }
}

/// Decodes the statistics of a 104-byte record.
#[inline]
pub(crate) fn decode_stats(b: &[u8]) -> Stats {
    let mask = b[40];
    let field =
        |i: usize| (mask & (1 << i) != 0).then(|| ExactF64(f64::from_bits(u64_at(b, 48 + 8 * i))));
    Stats {
        max: field(0),
        min: field(1),
        mean: field(2),
        norm: field(3),
        nan: u64_at(b, 80),
        pos_inf: u64_at(b, 88),
        neg_inf: u64_at(b, 96),
    }
}

pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_reject_bad_bytes() {
        let v1 = Header {
            version: VERSION_1,
            mode: DumpMode::Stats,
            rank: 2,
            world_size: 4,
            run_id: RunId::UNKNOWN,
            digest: DigestKind::Md5,
        };
        let bytes = encode_header(&v1);
        assert_eq!(bytes.len(), HEADER_LEN_V1);
        assert_eq!(&bytes[..12], b"DCTRACE\0\x01\x00\x02\x00");
        assert_eq!(decode_header(&bytes), Ok(v1));
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert_eq!(decode_header(&bad), Err(HeaderError::Magic));
        let mut bad = bytes.clone();
        bad[12] = 7;
        assert!(matches!(
            decode_header(&bad),
            Err(HeaderError::Damaged { offset: 12, .. })
        ));
        let mut bad = bytes;
        bad[28] = 1;
        assert!(matches!(
            decode_header(&bad),
            Err(HeaderError::Damaged { offset: 28, .. })
        ));

        let v2 = Header {
            version: VERSION_2,
            run_id: RunId([7; 16]),
            ..v1
        };
        let bytes = encode_header(&v2);
        assert_eq!(bytes.len(), HEADER_LEN);
        assert_eq!(&bytes[..12], b"DCTRACE\0\x02\x00\x02\x01");
        assert_eq!(decode_header(&bytes), Ok(v2));
        // Version 3: version 2's layout and the digest's code in byte 28.
        let v3 = Header {
            version: VERSION,
            digest: DigestKind::Md5Tree4k,
            ..v2
        };
        let bytes = encode_header(&v3);
        assert_eq!((&bytes[8..10], bytes[28]), (&[3, 0][..], 2));
        assert_eq!(decode_header(&bytes), Ok(v3));
        let mut unknown = bytes.clone();
        unknown[28] = 9;
        let crc = crc32(&[&unknown[..60]]);
        unknown[60..64].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            decode_header(&unknown),
            Err(HeaderError::Damaged { offset: 28, .. })
        ));
        assert_eq!(decode_header(&bytes[..40]), Err(HeaderError::Short));
        // Every damaged byte is reported as damage, never as another version or not a trace.
        for at in 0..HEADER_LEN {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert!(
                matches!(decode_header(&bad), Err(HeaderError::Damaged { .. })),
                "byte {at}: {:?}",
                decode_header(&bad)
            );
        }
        // A newer version with an intact header is a version this build does not read.
        let mut newer = bytes;
        newer[8] = 4;
        let crc = crc32(&[&newer[..60]]);
        newer[60..64].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_header(&newer), Err(HeaderError::Version(4)));
    }

    #[test]
    fn footers_and_sections_round_trip_and_name_damage() {
        let f = Footer {
            num_records: 5,
            num_names: 2,
            num_layouts: 1,
            offset: 1234,
            num_blocks: 3,
            environment: 1000,
            tensor_files: 1100,
        };
        let bytes = encode_footer(&f);
        assert_eq!(decode_footer(&bytes), Ok(f));
        for at in 0..FOOTER_LEN {
            let mut bad = bytes;
            bad[at] ^= 1;
            assert!(
                matches!(decode_footer(&bad), Err(FooterError::Damaged { .. })),
                "byte {at}"
            );
        }
        assert_eq!(decode_footer(&[0; FOOTER_LEN]), Err(FooterError::Missing));

        let env: Environment = [("NCCL_ALGO", "Ring"), ("launcher", "threads")]
            .into_iter()
            .collect();
        let payload = encode_environment(&env);
        let framing = encode_section(TAG_ENVIRONMENT, 2, &payload);
        let section = decode_section(&framing).unwrap();
        assert_eq!(
            (section.tag, section.len, section.count),
            (b'V', 4 + 13 + 4 + 15, 2)
        );
        assert!(section_checksum_holds(&framing, &payload));
        assert_eq!(decode_environment(&payload, 2), Ok(env));
        assert!(decode_environment(&payload, 1).is_err());
        assert!(decode_environment(&payload, 3).is_err());

        let files = [
            TensorFile {
                step: 0,
                len: 100,
                md5: Md5Digest([1; 16]),
            },
            TensorFile {
                step: 2,
                len: 120,
                md5: Md5Digest([2; 16]),
            },
        ];
        let payload = encode_tensor_files(&files);
        assert_eq!(decode_tensor_files(&payload, 2).unwrap(), files);
        let reversed = encode_tensor_files(&[files[1], files[0]]);
        assert!(decode_tensor_files(&reversed, 2).is_err());
    }

    #[test]
    fn records_round_trip_with_and_without_stats() {
        let e = Entry {
            step: 7,
            seq: 3,
            name: 1,
            layout: 2,
            replicated: true,
            digest: Digest::current([9; 16]),
        };
        let s = Stats {
            max: Some(ExactF64(f64::INFINITY)),
            min: None,
            mean: Some(ExactF64(f64::NAN)),
            norm: Some(ExactF64(-0.0)),
            nan: 1,
            pos_inf: 2,
            neg_inf: 3,
        };
        let mut out = Vec::new();
        encode_record(&mut out, &e, Some(&s));
        assert_eq!(out.len(), RECORD_LEN_STATS);
        assert_eq!(decode_record(&out, DigestKind::CURRENT), e);
        assert_eq!(decode_stats(&out), s);
        out.clear();
        encode_record(&mut out, &e, None);
        assert_eq!(out.len(), RECORD_LEN_MD5);
        assert_eq!(decode_record(&out, DigestKind::CURRENT), e);
    }

    #[test]
    fn dtype_codes_are_fixed_and_round_trip() {
        let codes: Vec<(DType, u8)> = DType::ALL.iter().map(|&d| (d, dtype_code(d))).collect();
        assert_eq!(
            codes,
            [
                (DType::F32, 1),
                (DType::F64, 2),
                (DType::I64, 3),
                (DType::U8, 4),
                (DType::F16, 5),
                (DType::BF16, 6),
                (DType::I32, 7),
                (DType::Bool, 8),
                (DType::I8, 9),
                (DType::I16, 10),
                (DType::U16, 11),
                (DType::F8E4M3, 12),
                (DType::F8E5M2, 13),
                (DType::C64, 14),
                (DType::C128, 15),
            ]
        );
        for (dtype, code) in codes {
            assert_eq!(dtype_from_code(code), Some(dtype));
        }
        assert_eq!(dtype_from_code(0), None);
        assert_eq!(dtype_from_code(16), None);
        assert_eq!(dtype_from_code(255), None);
    }

    #[test]
    fn a_version_1_footer_needs_its_end_magic() {
        let f = Footer {
            num_records: 5,
            num_names: 2,
            num_layouts: 1,
            offset: 1234,
            num_blocks: 0,
            environment: 0,
            tensor_files: 0,
        };
        let bytes = encode_footer_v1(&f);
        assert_eq!(decode_footer_v1(&bytes), Some(f));
        let mut bad = bytes;
        bad[39] = 1;
        assert_eq!(decode_footer_v1(&bad), None);
    }
}

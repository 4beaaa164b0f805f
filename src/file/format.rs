//! The byte layout of a trace file (version 1), as documented in `docs/trace-format.md`.
//!
//! Everything is little-endian. A file is a 32-byte header, a sequence of entries (name
//! definitions `N`, layout definitions `L`, records `R`), and a 40-byte footer `E`. Records are
//! fixed-size: 40 bytes in md5 mode, 104 bytes with statistics. This module only encodes and
//! decodes bytes; files are handled by the writer and the reader.
//!
//! Dtype codes 1-4 (f32, f64, i64, u8) are the first ones; 5-8 (f16, bf16, i32, bool) were added
//! later within version 1: every older file stays valid, and only a file that uses a new dtype
//! needs a reader that knows its code (an older one rejects it as an unknown dtype code).

use crate::file::DumpMode;
use crate::value::digest::{ExactF64, Stats};
use crate::value::tensor::DType;

/// The first 8 bytes of every trace file.
pub(crate) const MAGIC: [u8; 8] = *b"DCTRACE\0";
/// The last 8 bytes of every complete trace file.
pub(crate) const END_MAGIC: [u8; 8] = *b"DCTREND\0";
/// The format version this build writes and reads.
pub(crate) const VERSION: u16 = 1;
/// Bytes of the header.
pub(crate) const HEADER_LEN: usize = 32;
/// Bytes of the footer.
pub(crate) const FOOTER_LEN: usize = 40;
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

/// Record flag: the tensor is replicated on every rank.
pub(crate) const FLAG_REPLICATED: u8 = 1;

/// The record size of a mode.
pub(crate) fn record_len(mode: DumpMode) -> usize {
    if mode.has_stats() {
        RECORD_LEN_STATS
    } else {
        RECORD_LEN_MD5
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
        _ => None,
    }
}

/// The header's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) mode: DumpMode,
    pub(crate) rank: u32,
    pub(crate) world_size: u32,
}

/// Why a header could not be decoded.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HeaderError {
    Magic,
    Version(u16),
    Field(String),
}

pub(crate) fn encode_header(h: &Header) -> [u8; HEADER_LEN] {
    let mut out = [0u8; HEADER_LEN];
    out[0..8].copy_from_slice(&MAGIC);
    out[8..10].copy_from_slice(&VERSION.to_le_bytes());
    out[10] = mode_code(h.mode);
    out[12..16].copy_from_slice(&h.rank.to_le_bytes());
    out[16..20].copy_from_slice(&h.world_size.to_le_bytes());
    out[20..24].copy_from_slice(&(record_len(h.mode) as u32).to_le_bytes());
    out
}

pub(crate) fn decode_header(b: &[u8; HEADER_LEN]) -> Result<Header, HeaderError> {
    if b[0..8] != MAGIC {
        return Err(HeaderError::Magic);
    }
    let version = u16_at(b, 8);
    if version != VERSION {
        return Err(HeaderError::Version(version));
    }
    let mode = mode_from_code(b[10])
        .ok_or_else(|| HeaderError::Field(format!("unknown mode code {}", b[10])))?;
    let (rank, world_size, rec_len) = (u32_at(b, 12), u32_at(b, 16), u32_at(b, 20));
    if world_size == 0 || rank >= world_size {
        return Err(HeaderError::Field(format!(
            "rank {rank} does not fit world size {world_size}"
        )));
    }
    if rec_len as usize != record_len(mode) {
        return Err(HeaderError::Field(format!(
            "record size {rec_len} does not match mode {mode}"
        )));
    }
    Ok(Header {
        mode,
        rank,
        world_size,
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
}

pub(crate) fn encode_footer(f: &Footer) -> [u8; FOOTER_LEN] {
    let mut out = [0u8; FOOTER_LEN];
    out[0] = TAG_END;
    out[8..16].copy_from_slice(&f.num_records.to_le_bytes());
    out[16..20].copy_from_slice(&f.num_names.to_le_bytes());
    out[20..24].copy_from_slice(&f.num_layouts.to_le_bytes());
    out[24..32].copy_from_slice(&f.offset.to_le_bytes());
    out[32..40].copy_from_slice(&END_MAGIC);
    out
}

/// Decodes a footer; `None` when the tag or the end magic is wrong.
pub(crate) fn decode_footer(b: &[u8; FOOTER_LEN]) -> Option<Footer> {
    if b[0] != TAG_END || b[32..40] != END_MAGIC {
        return None;
    }
    Some(Footer {
        num_records: u64_at(b, 8),
        num_names: u32_at(b, 16),
        num_layouts: u32_at(b, 20),
        offset: u64_at(b, 24),
    })
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

/// A content digest: 16 bytes of md5, or fewer for other tools' checksums (msprobe's CRC-32).
/// An empty digest means the source holds none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Digest {
    pub(crate) bytes: [u8; 16],
    pub(crate) len: u8,
}

impl Digest {
    pub(crate) const NONE: Digest = Digest {
        bytes: [0; 16],
        len: 0,
    };

    pub(crate) fn md5(bytes: [u8; 16]) -> Self {
        Digest { bytes, len: 16 }
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

/// Decodes the common part of a record (its first 40 bytes, from its tag).
#[inline]
pub(crate) fn decode_record(b: &[u8]) -> Entry {
    let mut md5 = [0u8; 16];
    md5.copy_from_slice(&b[24..40]);
    Entry {
        step: u64_at(b, 8),
        seq: u32_at(b, 16),
        name: u32_at(b, 4),
        layout: u32_at(b, 20),
        replicated: b[1] & FLAG_REPLICATED != 0,
        digest: Digest::md5(md5),
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
    fn header_round_trips_and_rejects_bad_bytes() {
        let h = Header {
            mode: DumpMode::Stats,
            rank: 2,
            world_size: 4,
        };
        let bytes = encode_header(&h);
        assert_eq!(&bytes[..12], b"DCTRACE\0\x01\x00\x02\x00");
        assert_eq!(decode_header(&bytes), Ok(h));
        let mut bad = bytes;
        bad[0] = b'X';
        assert_eq!(decode_header(&bad), Err(HeaderError::Magic));
        let mut bad = bytes;
        bad[8] = 9;
        assert_eq!(decode_header(&bad), Err(HeaderError::Version(9)));
        let mut bad = bytes;
        bad[12] = 7;
        assert!(matches!(decode_header(&bad), Err(HeaderError::Field(_))));
    }

    #[test]
    fn records_round_trip_with_and_without_stats() {
        let e = Entry {
            step: 7,
            seq: 3,
            name: 1,
            layout: 2,
            replicated: true,
            digest: Digest::md5([9; 16]),
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
        assert_eq!(decode_record(&out), e);
        assert_eq!(decode_stats(&out), s);
        out.clear();
        encode_record(&mut out, &e, None);
        assert_eq!(out.len(), RECORD_LEN_MD5);
        assert_eq!(decode_record(&out), e);
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
            ]
        );
        for (dtype, code) in codes {
            assert_eq!(dtype_from_code(code), Some(dtype));
        }
        assert_eq!(dtype_from_code(0), None);
        assert_eq!(dtype_from_code(9), None);
    }

    #[test]
    fn footer_needs_its_end_magic() {
        let f = Footer {
            num_records: 5,
            num_names: 2,
            num_layouts: 1,
            offset: 1234,
        };
        let bytes = encode_footer(&f);
        assert_eq!(decode_footer(&bytes), Some(f));
        let mut bad = bytes;
        bad[39] = 1;
        assert_eq!(decode_footer(&bad), None);
    }
}
